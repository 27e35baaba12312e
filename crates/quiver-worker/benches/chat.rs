//! Chat benchmark (issue #4): the latency the worker adds to a chat
//! completion when a caller enables MCP with 20 servers × 50 tools, against
//! calling the same upstream directly, measured in the same run.
//!
//! Everything is real and talks over loopback: 20 testkit MCP servers over
//! streamable HTTP (`ExampleServer::example().with_generated_tools(50)`, records
//! with `allowed_tools = ["generated_*"]`, so exactly 50 tools each), an
//! in-process registry on SQLite, an in-process worker synced to it and warm
//! (tool lists cached, as in steady state), and the testkit's scripted
//! OpenAI-compatible upstream answering every request at once with a short
//! text, without parsing or keeping the body (zero latency).
//!
//! Routes, in alternating rounds so load changes hit all alike:
//! - **direct**: the caller's body posted to the upstream itself;
//! - **worker, mcp off**: the same body through the worker (pass-through);
//! - **worker, mcp on**: the body with `"mcp": {"enabled": true}` through the
//!   worker: catalog of 1000 tools, injection, one upstream request whose
//!   body carries the 1000 tool definitions, the answer with the `mcp`
//!   extension;
//! - **layer: catalog**: `Catalog::build` for the caller's task alone, in
//!   steady state (tool lists and evaluations cached, no I/O).
//!
//! Goal: p50 added by the worker with MCP on ≤ 1 ms.
//!
//! `cargo bench -p quiver-worker --bench chat`. Sizes (defaults in brackets):
//! `QUIVER_BENCH_SERVERS` [20], `QUIVER_BENCH_TOOLS` [50],
//! `QUIVER_BENCH_CALLS` [2000] requests per route, `QUIVER_BENCH_ROUNDS` [8],
//! `QUIVER_BENCH_WARMUP` [100].

use std::sync::Arc;
use std::time::{Duration, Instant};

use quiver_model::policy::CompiledTaskPolicy;
use quiver_testkit::bench::{Samples, env_usize, ms};
use quiver_worker::catalog::{Catalog, CatalogCache, Listing};
use serde_json::{Value, json};

#[path = "support/chat_stack.rs"]
mod chat_stack;
#[path = "support/route.rs"]
mod route;
#[path = "support/stack.rs"]
mod stack;

use chat_stack::ChatStack;
use route::Route;
use stack::{BenchResult, CALLER_TOKEN};

const ANSWER: &str = "The answer is 42.";

#[derive(Clone, Copy)]
struct Config {
    servers: usize,
    tools: usize,
    calls: usize,
    rounds: usize,
    warmup: usize,
}

impl Config {
    fn from_env() -> Config {
        Config {
            servers: env_usize("QUIVER_BENCH_SERVERS", 20),
            tools: env_usize("QUIVER_BENCH_TOOLS", 50),
            calls: env_usize("QUIVER_BENCH_CALLS", 2000),
            rounds: env_usize("QUIVER_BENCH_ROUNDS", 8).max(1),
            warmup: env_usize("QUIVER_BENCH_WARMUP", 100),
        }
    }
}

fn caller_body(mcp: bool) -> Vec<u8> {
    let mut body = json!({
        "model": "bench-model",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is six times seven?"},
        ],
        "temperature": 0.2,
    });
    if mcp {
        body["mcp"] = json!({"enabled": true});
    }
    serde_json::to_vec(&body).unwrap_or_default()
}

fn main() -> BenchResult<()> {
    let config = Config::from_env();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(config))
}

async fn run(config: Config) -> BenchResult<()> {
    let started = Instant::now();
    let setup = ChatStack::start(config.servers, config.tools, ANSWER).await?;
    let stack = &setup.stack;
    let worker_url = stack.worker_url.clone();
    let snapshot = stack.snapshot.clone();
    let pool = stack.pool.clone();
    let expected_tools = config.servers * config.tools;
    let policy = Arc::new(CompiledTaskPolicy::unrestricted());
    let cache = CatalogCache::default();
    let offered = Catalog::build(
        &snapshot.current(),
        Listing {
            pool: &pool,
            principal: None,
            wait: None,
        },
        &cache,
        &policy,
        None,
        None,
    )
    .await
    .len();
    if offered != expected_tools {
        return Err(format!("worker offers {offered} tools, expected {expected_tools}").into());
    }

    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let direct = Route {
        client: client.clone(),
        url: format!("{}/chat/completions", setup.upstream.base_url()),
        bearer: None,
        answer: ANSWER,
        body: caller_body(false),
    };
    let pass_through = Route {
        client: client.clone(),
        url: format!("{worker_url}/v1/chat/completions"),
        bearer: Some(CALLER_TOKEN),
        answer: ANSWER,
        body: caller_body(false),
    };
    let with_mcp = Route {
        client,
        url: format!("{worker_url}/v1/chat/completions"),
        bearer: Some(CALLER_TOKEN),
        answer: ANSWER,
        body: caller_body(true),
    };
    // What the worker sends upstream with MCP on, posted directly: the part
    // of the added latency that is the upstream reading 1000 tool definitions.
    let listed: Vec<Value> = reqwest::Client::new()
        .get(format!("{worker_url}/v1/mcp/tools"))
        .bearer_auth(CALLER_TOKEN)
        .send()
        .await?
        .json()
        .await?;
    let mut big_body: Value = serde_json::from_slice(&caller_body(false))?;
    big_body["tools"] = listed
        .iter()
        .map(|tool| {
            json!({"type": "function", "function": {
                "name": tool["name"],
                "description": tool["description"],
                "parameters": tool["input_schema"],
            }})
        })
        .collect();
    let direct_big = Route {
        client: direct.client.clone(),
        url: direct.url.clone(),
        bearer: None,
        answer: ANSWER,
        body: serde_json::to_vec(&big_body)?,
    };
    let routes = [&direct, &pass_through, &with_mcp, &direct_big];
    for route in routes {
        for _ in 0..config.warmup {
            route.call().await?;
        }
    }
    let per_round = config.calls.div_ceil(config.rounds);
    let mut samples: [Vec<Duration>; 5] = Default::default();
    for _ in 0..config.rounds {
        for (i, route) in routes.iter().enumerate() {
            for _ in 0..per_round {
                let t = Instant::now();
                route.call().await?;
                samples[i].push(t.elapsed());
            }
        }
        for _ in 0..per_round {
            let t = Instant::now();
            let catalog = Catalog::build(
                &snapshot.current(),
                Listing {
                    pool: &pool,
                    principal: None,
                    wait: None,
                },
                &cache,
                &policy,
                None,
                None,
            )
            .await;
            samples[4].push(t.elapsed());
            if catalog.len() != expected_tools {
                return Err("catalog changed during the run".into());
            }
        }
    }
    let big_body_len = direct_big.body.len();
    let [direct, pass_through, with_mcp, direct_big_samples, catalog] = samples.map(Samples::new);

    println!(
        "\nchat benchmark: {} servers × {} tools = {expected_tools} tools injected; {} requests per route in {} rounds (after {} warm-up)\n",
        config.servers,
        config.tools,
        per_round * config.rounds,
        config.rounds,
        config.warmup
    );
    println!("| route | p50 | p99 | mean | added p50 vs direct | added p99 vs direct | goal |");
    println!("|---|---:|---:|---:|---:|---:|---|");
    let row = |name: &str, s: &Samples, goal: &str| {
        let added50 = ms(s.p50()) - ms(direct.p50());
        let added99 = ms(s.p99()) - ms(direct.p99());
        println!(
            "| {name} | {:.3} ms | {:.3} ms | {:.3} ms | {added50:+.3} ms | {added99:+.3} ms | {goal} |",
            ms(s.p50()),
            ms(s.p99()),
            ms(s.mean()),
        );
    };
    row("direct to the upstream (baseline)", &direct, "");
    row("worker, mcp off (pass-through)", &pass_through, "");
    let added = ms(with_mcp.p50()) - ms(direct.p50());
    let verdict = if added <= 1.0 { "MET" } else { "MISSED" };
    row(
        &format!("worker, mcp on, {expected_tools} tools"),
        &with_mcp,
        &format!("added p50 ≤ 1 ms: {verdict}"),
    );
    row(
        &format!(
            "direct with the worker's body ({expected_tools} tools, {} KiB)",
            big_body_len / 1024
        ),
        &direct_big_samples,
        "",
    );
    println!(
        "| layer: Catalog::build, {expected_tools} tools (cached, no I/O) | {:.3} ms | {:.3} ms | {:.3} ms | — | — | |",
        ms(catalog.p50()),
        ms(catalog.p99()),
        ms(catalog.mean()),
    );
    println!(
        "\nratio worker mcp on / direct, p50: {:.2}×; run took {:.1} s",
        ms(with_mcp.p50()) / ms(direct.p50()),
        started.elapsed().as_secs_f64()
    );

    setup.stop().await;
    Ok(())
}
