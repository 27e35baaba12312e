//! The pool against the real test MCP server (`quiver-testkit-mcp`, build it
//! first: `cargo build -p quiver-testkit`) as a stdio child, started through
//! `sh` so that each test can see the processes it starts: single-flight
//! connect, restart backoff, idle close, call slots held past a timeout,
//! the end of everything a server started, and the records of a registry
//! restored from a backup.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quiver_mcp::{HealthState, JsonObject, McpPool, PoolOptions};
use quiver_model::{ErrorCode, McpServerSpec, StdioConfig, StoredServer, Transport};
use quiver_testkit::mcp_server::testkit_mcp_bin;
use serde_json::json;

/// A stdio record running `script` with `sh -c` in `dir` (`$SERVER` is the
/// test MCP server), with the given budgets.
fn record(
    id: &str,
    dir: &Path,
    script: &str,
    max_concurrency: u32,
    tool_timeout_ms: u64,
) -> Arc<StoredServer> {
    let mut spec = McpServerSpec::new(id, Transport::Stdio);
    spec.stdio = Some(StdioConfig {
        command: "sh".into(),
        args: vec!["-c".into(), script.into()],
        env: BTreeMap::from([("SERVER".to_owned(), testkit_mcp_bin().display().to_string())]),
        cwd: Some(dir.display().to_string()),
        ..Default::default()
    });
    spec.allowed_tools = vec!["*".into()];
    spec.budgets.max_concurrency = max_concurrency;
    spec.budgets.tool_timeout_ms = tool_timeout_ms;
    Arc::new(StoredServer::created(spec, 1, "test"))
}

/// Appends the shell's pid to `starts` (a new line per start), then becomes
/// the server (`exec` keeps the pid).
const COUNTED_SERVER: &str = "echo $$ >> starts; exec \"$SERVER\"";

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn arguments(value: serde_json::Value) -> Option<JsonObject> {
    value.as_object().cloned()
}

fn text(outcome: &quiver_mcp::CallOutcome) -> String {
    outcome.result.content[0]
        .as_text()
        .expect("text content")
        .text
        .clone()
}

/// Whether `pid` is gone: no process, or a zombie (its parent is not us).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

async fn eventually(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < within, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_first_calls_share_one_connect() {
    let dir = tempfile::tempdir().unwrap();
    let server = record("single-flight", dir.path(), COUNTED_SERVER, 32, 10_000);
    let pool = McpPool::new(PoolOptions::default());
    let calls = (0..20).map(|_| pool.call_tool(&server, "counter", None));
    let counted: BTreeSet<u64> = futures::future::join_all(calls)
        .await
        .into_iter()
        .map(|outcome| text(&outcome.expect("counter call")).parse().unwrap())
        .collect();
    let starts = lines(&dir.path().join("starts"));
    eprintln!(
        "20 concurrent first calls: {} process(es) started",
        starts.len()
    );
    assert_eq!(starts.len(), 1, "one process for all: {starts:?}");
    // One process counted every call: 1..=20, each once.
    assert_eq!(counted, (1..=20).collect());
    assert_eq!(pool.child_processes(), 1);
    assert_eq!(pool.health()[0].reconnects, 0);
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_command_costs_one_fast_error_per_call_and_backed_off_restarts() {
    let dir = tempfile::tempdir().unwrap();
    // Records each start (in ms) and exits before `initialize`.
    let failing = "echo $(date +%s%3N) >> starts; echo broken >&2; exit 3";
    let server = record("backoff", dir.path(), failing, 4, 10_000);
    let backoff_min = Duration::from_millis(200);
    let pool = McpPool::new(PoolOptions {
        restart_backoff_min: backoff_min,
        restart_backoff_max: Duration::from_secs(1),
        ..PoolOptions::default()
    });
    let started = Instant::now();
    let mut calls = 0;
    let mut slowest_backed_off = Duration::ZERO;
    while started.elapsed() < Duration::from_secs(2) {
        let call = Instant::now();
        let err = pool.call_tool(&server, "echo", None).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::McpUnavailable, "{err}");
        if err.to_string().contains("restarting after failures") {
            slowest_backed_off = slowest_backed_off.max(call.elapsed());
        }
        calls += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let starts: Vec<u64> = lines(&dir.path().join("starts"))
        .iter()
        .map(|line| line.parse().unwrap())
        .collect();
    let gaps: Vec<u64> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    eprintln!(
        "{calls} calls in 2 s: {} starts, gaps {gaps:?} ms, slowest backed-off call {slowest_backed_off:?}",
        starts.len()
    );
    assert!(calls >= 50, "calls fail fast: only {calls} in 2 s");
    assert!(
        (2..=6).contains(&starts.len()),
        "restarts are backed off: {} starts",
        starts.len()
    );
    assert!(
        gaps.iter()
            .all(|&gap| gap + 20 >= backoff_min.as_millis() as u64),
        "starts at least restart_backoff_min apart: {gaps:?}"
    );
    // Backed off, a call fails at once instead of waiting for the restart:
    // well under the backoff (half of it, so a loaded host passes while a
    // call that waited the backoff out does not).
    assert!(
        slowest_backed_off < backoff_min / 2,
        "a backed-off call waited {slowest_backed_off:?}"
    );
    let health = &pool.health()[0];
    assert_eq!(health.state, HealthState::Down);
    assert!(
        health
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("broken")),
        "the stderr of the failed start is in the error: {:?}",
        health.last_error
    );
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed_and_reaped_and_the_next_call_reconnects() {
    let dir = tempfile::tempdir().unwrap();
    let server = record("idle", dir.path(), COUNTED_SERVER, 4, 10_000);
    let pool = McpPool::new(PoolOptions {
        idle_timeout: Some(Duration::from_millis(300)),
        ..PoolOptions::default()
    });
    pool.call_tool(&server, "echo", arguments(json!({"text": "a"})))
        .await
        .unwrap();
    let pid = pool.health()[0].pid.expect("stdio pid");
    let pid = i32::try_from(pid).unwrap();
    assert!(!gone(pid));
    let closed = Instant::now();
    eventually(Duration::from_secs(3), "idle connection closed", || {
        pool.health()[0].pid.is_none() && pool.child_processes() == 0
    })
    .await;
    // Reaped by the pool, not left a zombie.
    assert!(
        std::fs::metadata(format!("/proc/{pid}")).is_err(),
        "server process {pid} reaped"
    );
    eprintln!(
        "idle_timeout 300 ms: closed and reaped after {:?}",
        closed.elapsed()
    );
    assert_eq!(pool.health()[0].state, HealthState::Idle);
    pool.call_tool(&server, "echo", arguments(json!({"text": "b"})))
        .await
        .unwrap();
    let health = &pool.health()[0];
    assert_ne!(health.pid, Some(pid as u32));
    assert_eq!(health.reconnects, 1);
    assert_eq!(lines(&dir.path().join("starts")).len(), 2);
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_call_keeps_its_slot_until_the_grace_then_the_connection_is_recycled() {
    let dir = tempfile::tempdir().unwrap();
    let timeout_ms = 1000;
    let grace = Duration::from_millis(300);
    let server = record("grace", dir.path(), COUNTED_SERVER, 2, timeout_ms);
    let pool = McpPool::new(PoolOptions {
        cancel_grace: grace,
        ..PoolOptions::default()
    });
    let sleep = |ms: u64| {
        let pool = pool.clone();
        let server = server.clone();
        async move {
            let started = Instant::now();
            let outcome = pool
                .call_tool(&server, "sleep", arguments(json!({"ms": ms})))
                .await;
            (outcome, started.elapsed())
        }
    };
    pool.call_tool(&server, "echo", arguments(json!({"text": "warm"})))
        .await
        .unwrap();
    let first_pid = pool.health()[0].pid.unwrap();

    // A: 10 s of work in a 1 s budget. B: starts 800 ms later on the same
    // connection, still running when A's grace passes (at ~1.3 s).
    let a = tokio::spawn(sleep(10_000));
    tokio::time::sleep(Duration::from_millis(800)).await;
    let b = tokio::spawn(sleep(10_000));
    let (a, a_took) = a.await.unwrap();
    let a = a.unwrap_err();
    assert_eq!(a.code(), ErrorCode::McpTimeout, "{a}");
    assert!(
        a_took < Duration::from_millis(timeout_ms) + Duration::from_millis(200),
        "the caller gets mcp_timeout at tool_timeout_ms, not after the grace: {a_took:?}"
    );
    // With A cancelled but not answered (rmcp servers drop the answer of a
    // cancelled call), the server may still be at it: A's slot stays taken
    // until the grace passes and the connection is recycled, which ends B.
    let c = pool
        .call_tool(&server, "echo", arguments(json!({"text": "c"})))
        .await
        .unwrap();
    let (b, b_took) = b.await.unwrap();
    let b = b.unwrap_err();
    eprintln!(
        "A: {a} after {a_took:?}; C waited {:?} for A's slot; B, in flight on the \
         recycled connection: {b} after {b_took:?}",
        c.duration
    );
    assert!(
        c.duration >= grace - Duration::from_millis(50),
        "C waits for A's slot until the grace passes: {:?}",
        c.duration
    );
    assert_eq!(b.code(), ErrorCode::McpUnavailable, "{b}");
    assert!(
        b.to_string().contains("recycled") && b.to_string().contains("cancel_grace"),
        "{b}"
    );
    assert!(
        gone(i32::try_from(first_pid).unwrap()),
        "recycled server ended"
    );
    assert_ne!(
        pool.health()[0].pid,
        Some(first_pid),
        "C ran on a new connection"
    );

    assert_eq!(lines(&dir.path().join("starts")).len(), 2);
    pool.shutdown().await;
}

/// A server that starts two `setsid` sleepers before becoming the MCP
/// server: one stays its child, one is double-forked (its parent, a
/// subshell, exits at once, so it is reparented away from the server).
const SERVER_WITH_SETSID_SLEEPERS: &str = "setsid sleep 300 & echo $! > child; \
     (setsid sleep 301 & echo $! > detached); exec \"$SERVER\"";

fn sleepers(dir: &Path) -> Vec<i32> {
    ["child", "detached"]
        .iter()
        .map(|name| {
            lines(&dir.join(name))
                .first()
                .unwrap_or_else(|| panic!("{name} pid written"))
                .parse()
                .unwrap()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setsid_descendants_end_with_their_server_on_removal_and_on_shutdown() {
    let removed_dir = tempfile::tempdir().unwrap();
    let shutdown_dir = tempfile::tempdir().unwrap();
    let removed = record(
        "removed",
        removed_dir.path(),
        SERVER_WITH_SETSID_SLEEPERS,
        4,
        10_000,
    );
    let kept = record(
        "kept",
        shutdown_dir.path(),
        SERVER_WITH_SETSID_SLEEPERS,
        4,
        10_000,
    );
    let pool = McpPool::new(PoolOptions::default());
    for server in [&removed, &kept] {
        pool.call_tool(server, "echo", arguments(json!({"text": "x"})))
            .await
            .unwrap();
    }
    let removed_sleepers = sleepers(removed_dir.path());
    let kept_sleepers = sleepers(shutdown_dir.path());
    assert!(
        removed_sleepers
            .iter()
            .chain(&kept_sleepers)
            .all(|&pid| !gone(pid))
    );

    // The record is deleted: only its server's sleepers go.
    let servers = BTreeMap::from([("kept".to_owned(), kept.clone())]);
    pool.apply_snapshot(&servers);
    eventually(
        Duration::from_secs(5),
        "sleepers of the removed server gone",
        || removed_sleepers.iter().all(|&pid| gone(pid)),
    )
    .await;
    assert!(
        kept_sleepers.iter().all(|&pid| !gone(pid)),
        "others untouched"
    );

    // The worker shuts down: every server's sleepers go.
    pool.shutdown().await;
    eventually(
        Duration::from_secs(5),
        "sleepers gone after shutdown",
        || kept_sleepers.iter().all(|&pid| gone(pid)),
    )
    .await;
    eprintln!(
        "setsid sleepers {removed_sleepers:?} (removal) and {kept_sleepers:?} (shutdown) ended"
    );
}

/// `server` at `revision`, with `change` applied to its record.
fn at_revision(
    server: &Arc<StoredServer>,
    revision: u64,
    change: impl FnOnce(&mut McpServerSpec),
) -> Arc<StoredServer> {
    let mut server = StoredServer::clone(server);
    server.revision = revision;
    change(&mut server.spec);
    Arc::new(server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_registry_s_older_records_replace_newer_ones_and_stay() {
    let dir = tempfile::tempdir().unwrap();
    let started_as = |name: &str| format!("echo $$ >> {name}; exec \"$SERVER\"");
    let before_restore = at_revision(
        &record("kit", dir.path(), &started_as("before"), 4, 10_000),
        10,
        |_| {},
    );
    let pool = McpPool::new(PoolOptions::default());
    let echo = |text: &str| arguments(json!({"text": text}));
    pool.call_tool(&before_restore, "echo", echo("a"))
        .await
        .unwrap();
    let first: i32 = lines(&dir.path().join("before"))[0].parse().unwrap();

    // The registry is restored from a backup: the worker adopts its state,
    // where the record is at revision 3 and starts differently.
    let restored = at_revision(
        &record("kit", dir.path(), &started_as("restored"), 4, 10_000),
        3,
        |_| {},
    );
    let snapshot =
        |server: &Arc<StoredServer>| BTreeMap::from([("kit".to_owned(), server.clone())]);
    pool.apply_snapshot(&snapshot(&restored));
    let outcome = pool.call_tool(&restored, "echo", echo("b")).await.unwrap();
    assert_eq!(text(&outcome), "b");
    assert_eq!(
        lines(&dir.path().join("restored")).len(),
        1,
        "the restored record's server serves"
    );
    eventually(Duration::from_secs(5), "the old server ended", || {
        gone(first)
    })
    .await;

    // A call holding the record it resolved before the restore does not
    // bring the old one back.
    let outcome = pool
        .call_tool(&before_restore, "echo", echo("c"))
        .await
        .unwrap();
    assert_eq!(text(&outcome), "c");
    assert_eq!(lines(&dir.path().join("before")).len(), 1);
    assert_eq!(lines(&dir.path().join("restored")).len(), 1);

    // A change of budgets at a revision still below 10 is taken in place,
    // on the same connection.
    let tighter = at_revision(&restored, 4, |spec| {
        spec.budgets.max_tool_output_bytes = 10;
    });
    pool.apply_snapshot(&snapshot(&tighter));
    let outcome = pool
        .call_tool(&before_restore, "echo", echo(&"x".repeat(100)))
        .await
        .unwrap();
    assert!(
        outcome.output.truncated(),
        "the snapshot's budget applies: {outcome:?}"
    );
    assert_eq!(lines(&dir.path().join("restored")).len(), 1);
    pool.shutdown().await;
}
