//! Per-session isolation benchmark (issue #13), on the worker's MCP pool
//! with real stdio servers, baselines in the same run:
//!
//! 1. **Warm call, `per_session` vs `shared`.** The same server program under
//!    two records, one `isolation = "per_session"`, one `shared`; after one
//!    untimed call each (the session's connection exists), `echo` calls in
//!    alternating rounds. Goal: the per-session call adds ≤ 0.05 ms p50.
//! 2. **Session start-up.** The first call of a new session: a process
//!    spawned, `initialize`, the call. For the native testkit server and for
//!    the reference server `@modelcontextprotocol/server-everything` (Node,
//!    installed with npm into `target/bench-npm` on first use; skipped with a
//!    note when no `node` is found). Sessions are ended between samples.
//!
//! Build the testkit server of the benchmark's profile first: `cargo build
//! --release -p quiver-testkit && cargo bench -p quiver-mcp --bench
//! sessions`. Sizes: `QUIVER_BENCH_CALLS` [4000] warm calls per route,
//! `QUIVER_BENCH_ROUNDS` [8], `QUIVER_BENCH_STARTS` [30] new sessions per
//! server.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quiver_mcp::leases::{SessionKey, SessionKind};
use quiver_mcp::{CallOptions, McpPool, PoolOptions};
use quiver_model::{Isolation, McpServerSpec, StdioConfig, StoredServer, Transport};
use quiver_testkit::bench::{Samples, env_usize, ms};
use quiver_testkit::bench_servers::{BenchError, everything_entry, node_binary, server_binary};
use serde_json::Value;

fn record(
    server_id: &str,
    command: &str,
    args: &[String],
    isolation: Isolation,
) -> Arc<StoredServer> {
    let mut spec = McpServerSpec::new(server_id, Transport::Stdio);
    spec.stdio = Some(StdioConfig {
        command: command.to_owned(),
        args: args.to_vec(),
        ..StdioConfig::default()
    });
    spec.allowed_tools = vec!["*".into()];
    spec.isolation = isolation;
    Arc::new(StoredServer::created(spec, 1, "bench"))
}

fn session_key(id: &str) -> SessionKey {
    SessionKey {
        caller: "token:bench".into(),
        task: "bench".into(),
        kind: SessionKind::Api,
        session_id: id.to_owned(),
    }
}

fn session(id: &str) -> CallOptions {
    CallOptions {
        session: Some(session_key(id)),
        ..CallOptions::default()
    }
}

/// One `echo` call (argument `argument`), its answer checked.
async fn echo(
    pool: &McpPool,
    server: &Arc<StoredServer>,
    argument: &str,
    options: CallOptions,
) -> Result<(), BenchError> {
    let mut arguments = serde_json::Map::new();
    arguments.insert(argument.to_owned(), Value::String("hi".into()));
    let outcome = pool
        .call_tool_with(server, "echo", Some(arguments), Instant::now(), options)
        .await?;
    if outcome.result.is_error == Some(true) {
        return Err(format!("echo failed: {:?}", outcome.result).into());
    }
    Ok(())
}

fn main() -> Result<(), BenchError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

async fn run() -> Result<(), BenchError> {
    let calls = env_usize("QUIVER_BENCH_CALLS", 4000);
    let rounds = env_usize("QUIVER_BENCH_ROUNDS", 8).max(1);
    let starts = env_usize("QUIVER_BENCH_STARTS", 30).max(1);
    let pool = McpPool::new(PoolOptions {
        max_child_processes: 256,
        ..PoolOptions::default()
    });
    let testkit = server_binary()?.display().to_string();
    let stdio_args = vec!["--transport".to_owned(), "stdio".to_owned()];

    // 1. Warm calls.
    let shared = record("shared", &testkit, &stdio_args, Isolation::Shared);
    let isolated = record("isolated", &testkit, &stdio_args, Isolation::PerSession);
    echo(&pool, &shared, "text", CallOptions::default()).await?;
    echo(&pool, &isolated, "text", session("warm")).await?;
    let (mut shared_samples, mut isolated_samples) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        for (server, options, samples) in [
            (&shared, CallOptions::default(), &mut shared_samples),
            (&isolated, session("warm"), &mut isolated_samples),
        ] {
            for _ in 0..calls / rounds {
                let started = Instant::now();
                echo(&pool, server, "text", options.clone()).await?;
                samples.push(started.elapsed());
            }
        }
    }
    let (shared_samples, isolated_samples) =
        (Samples::new(shared_samples), Samples::new(isolated_samples));
    let added = ms(isolated_samples.p50()) - ms(shared_samples.p50());

    // 2. Session start-up.
    let mut subjects: Vec<(String, Arc<StoredServer>, &str)> = vec![(
        "quiver-testkit-mcp (native)".into(),
        record(
            "startup-testkit",
            &testkit,
            &stdio_args,
            Isolation::PerSession,
        ),
        "text",
    )];
    let mut skipped = None;
    match node_binary().and_then(|node| Ok((node, everything_entry()?))) {
        Ok((node, (entry, sdk))) => subjects.push((
            format!("server-everything (node, @modelcontextprotocol/sdk {sdk})"),
            record(
                "startup-everything",
                &node.display().to_string(),
                &[entry.display().to_string(), "stdio".into()],
                Isolation::PerSession,
            ),
            "message",
        )),
        Err(err) => skipped = Some(err.to_string()),
    }
    let mut startup = BTreeMap::new();
    for (name, server, argument) in &subjects {
        let mut samples = Vec::with_capacity(starts);
        for i in 0..starts {
            let id = format!("start-{i}");
            let started = Instant::now();
            echo(&pool, server, argument, session(&id)).await?;
            samples.push(started.elapsed());
            pool.end_session(&session_key(&id));
            // Let the ended process go before the next start.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        startup.insert(name.clone(), Samples::new(samples));
    }

    println!("warm echo calls over stdio, {calls} per route in {rounds} alternating rounds");
    println!("| route | p50 ms | p90 ms | p99 ms |");
    println!("|---|---:|---:|---:|");
    for (name, samples) in [
        ("shared connection", &shared_samples),
        ("per-session connection", &isolated_samples),
    ] {
        println!(
            "| {name} | {:.3} | {:.3} | {:.3} |",
            ms(samples.p50()),
            ms(samples.percentile(0.9)),
            ms(samples.p99())
        );
    }
    println!(
        "added p50 per_session − shared: {added:.3} ms (goal ≤ 0.050 ms: {})",
        if added <= 0.050 { "PASS" } else { "FAIL" }
    );
    println!("\nsession start-up (spawn + initialize + first call), {starts} sessions each");
    println!("| server | p50 ms | p90 ms | max ms |");
    println!("|---|---:|---:|---:|");
    for (name, samples) in &startup {
        println!(
            "| {name} | {:.1} | {:.1} | {:.1} |",
            ms(samples.p50()),
            ms(samples.percentile(0.9)),
            ms(samples.max())
        );
    }
    if let Some(reason) = skipped {
        println!("server-everything not measured: {reason}");
    }
    pool.shutdown().await;
    Ok(())
}
