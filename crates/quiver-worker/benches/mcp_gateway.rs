//! Gateway benchmark (issues #12, #23): `tools/call` through a worker's
//! `/mcp/{server_id}`, by a client of each protocol era, against a direct
//! rmcp client of the same warm server, all measured in the same run.
//!
//! Everything is real and in this process: the testkit's MCP server over
//! streamable HTTP (`TCP_NODELAY`, like `quiver_testkit::mcp_server`), an
//! in-process registry (SQLite) with one record for it
//! (`max_concurrency` = the concurrent clients), and a worker synced to it
//! (`benches/support/stack.rs`). Every call is the server's `echo` tool and
//! every answer is checked.
//!
//! - **Baseline:** an rmcp client (`StreamableHttpClientTransport`) to the
//!   server's `/mcp`.
//! - **Gateway, 2025-11-25:** the same kind of rmcp client to the worker's
//!   `/mcp/<id>` with the caller's bearer token: one MCP session each, the
//!   worker calling the server on its pooled connection.
//! - **Gateway, 2026-07-28:** an rmcp client in its `server/discover`
//!   lifecycle: no session, every request standing alone.
//! - **Reference:** the worker's own JSON tool API, the same worker hop
//!   without MCP at the edge.
//!
//! Sequential: `QUIVER_BENCH_CALLS` [3000] calls per route in
//! `QUIVER_BENCH_ROUNDS` [6] alternating rounds after
//! `QUIVER_BENCH_WARMUP` [200] untimed calls; p50/p90/p99 and, per era, the
//! p50 the gateway adds over direct against what the tool API adds (goal:
//! ≤ 1.2×). Concurrent: `QUIVER_BENCH_CONCURRENCY` [64] clients per route
//! (each its own MCP session on 2025-11-25: what many agents sharing a
//! gateway look like), `QUIVER_BENCH_CONCURRENT_CALLS` [12800] calls per
//! round over all of them; throughput gateway / direct (goal ≥ 0.6×).
//!
//! Run: `cargo bench -p quiver-worker --bench mcp_gateway`.

use std::time::{Duration, Instant};

use quiver_model::{HttpConfig, McpServerSpec, Transport};
use quiver_testkit::bench::{Samples, env_usize, ms};
use quiver_testkit::mcp_server::{ExampleServer, spawn_streamable_http};
use rmcp::RoleClient;
use rmcp::model::{CallToolRequestParams, JsonObject, ProtocolVersion};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, Peer, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

#[path = "support/stack.rs"]
mod stack;
use stack::{BenchResult, CALLER_TOKEN, Stack};

const SERVER_ID: &str = "bench-http";
const WAIT: Duration = Duration::from_secs(30);

/// An rmcp client of `url`, with `token` as its bearer credential, in the
/// lifecycle of `era`.
async fn client(
    url: &str,
    token: Option<&str>,
    era: Era,
) -> BenchResult<RunningService<RoleClient, ()>> {
    // Each client calls one at a time (one POST in flight).
    let mut config =
        StreamableHttpClientTransportConfig::with_uri(url.to_owned()).max_concurrent_requests(1);
    if let Some(token) = token {
        config = config.auth_header(token.to_owned());
    }
    let transport = StreamableHttpClientTransport::with_client(reqwest::Client::new(), config);
    let lifecycle = match era {
        Era::Session => ClientLifecycleMode::Initialize,
        Era::Stateless => ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
    };
    Ok(tokio::time::timeout(WAIT, ().serve_with_lifecycle(transport, lifecycle)).await??)
}

/// The protocol era a client speaks.
#[derive(Debug, Clone, Copy)]
enum Era {
    /// 2025-11-25: `initialize`, a session.
    Session,
    /// 2026-07-28: `server/discover`, no session.
    Stateless,
}

/// One MCP route of the run: its clients and what they measured.
struct Route {
    name: &'static str,
    url: String,
    token: Option<&'static str>,
    era: Era,
    samples: Vec<Duration>,
    rps: Vec<f64>,
}

/// One `echo` call; its answer checked.
async fn echo(peer: &Peer<RoleClient>, text: &str) -> BenchResult<()> {
    let mut arguments = JsonObject::new();
    arguments.insert("text".into(), text.into());
    let mut params = CallToolRequestParams::new("echo");
    params.arguments = Some(arguments);
    let result = peer.call_tool(params).await?;
    let answer = result
        .content
        .first()
        .and_then(|c| c.as_text())
        .map(|t| t.text.as_str());
    if answer != Some(text) || result.is_error == Some(true) {
        return Err(format!("unexpected answer {result:?}").into());
    }
    Ok(())
}

/// `calls` sequential calls; their latencies.
async fn sequential(peer: &Peer<RoleClient>, calls: usize) -> BenchResult<Vec<Duration>> {
    let mut samples = Vec::with_capacity(calls);
    for i in 0..calls {
        let started = Instant::now();
        echo(peer, &format!("call {i}")).await?;
        samples.push(started.elapsed());
    }
    Ok(samples)
}

/// `calls` sequential calls through the worker's own tool API (JSON over
/// HTTP, no MCP at the edge): what the gateway's MCP edge is compared to.
async fn sequential_api(
    http: &reqwest::Client,
    url: &str,
    name: &str,
    calls: usize,
) -> BenchResult<Vec<Duration>> {
    let mut samples = Vec::with_capacity(calls);
    for i in 0..calls {
        let text = format!("call {i}");
        let started = Instant::now();
        let answer: serde_json::Value = http
            .post(url)
            .bearer_auth(CALLER_TOKEN)
            .json(&serde_json::json!({"name": name, "arguments": {"text": text}}))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        samples.push(started.elapsed());
        if answer["content"][0]["text"] != text.as_str() {
            return Err(format!("unexpected answer {answer}").into());
        }
    }
    Ok(samples)
}

/// `calls` calls spread over `clients`, each calling in a loop; calls/s.
async fn concurrent(clients: &[Peer<RoleClient>], calls: usize) -> BenchResult<f64> {
    let per_client = calls / clients.len();
    let started = Instant::now();
    let tasks: Vec<_> = clients
        .iter()
        .cloned()
        .map(|peer| {
            tokio::spawn(async move {
                for i in 0..per_client {
                    echo(&peer, &format!("c{i}")).await?;
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok((per_client * clients.len()) as f64 / started.elapsed().as_secs_f64())
}

fn main() -> BenchResult<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

async fn run() -> BenchResult<()> {
    let calls = env_usize("QUIVER_BENCH_CALLS", 3000);
    let rounds = env_usize("QUIVER_BENCH_ROUNDS", 6).max(1);
    let warmup = env_usize("QUIVER_BENCH_WARMUP", 200);
    let concurrency = env_usize("QUIVER_BENCH_CONCURRENCY", 64).max(1);
    let concurrent_calls = env_usize("QUIVER_BENCH_CONCURRENT_CALLS", 12_800);

    let server = spawn_streamable_http(ExampleServer::full()).await?;
    let mut spec = McpServerSpec::new(SERVER_ID, Transport::StreamableHttp);
    spec.http = Some(HttpConfig {
        url: server.url().to_owned(),
        ..HttpConfig::default()
    });
    spec.allowed_tools = vec!["*".into()];
    spec.budgets.max_concurrency = u32::try_from(concurrency)?;
    let stack = Stack::start(vec![spec], None).await?;
    let gateway_url = format!("{}/mcp/{SERVER_ID}", stack.worker_url);
    let route = |name, url: &str, token, era| Route {
        name,
        url: url.to_owned(),
        token,
        era,
        samples: Vec::new(),
        rps: Vec::new(),
    };
    let mut routes = [
        route(
            "direct rmcp client → server",
            server.url(),
            None,
            Era::Session,
        ),
        route(
            "2025-11-25 rmcp client (session) → worker /mcp/{id} → server",
            &gateway_url,
            Some(CALLER_TOKEN),
            Era::Session,
        ),
        route(
            "2026-07-28 rmcp client (no session) → worker /mcp/{id} → server",
            &gateway_url,
            Some(CALLER_TOKEN),
            Era::Stateless,
        ),
    ];

    let mut sequential_clients = Vec::new();
    for route in &routes {
        let running = client(&route.url, route.token, route.era).await?;
        sequential(running.peer(), warmup).await?;
        sequential_clients.push(running);
    }
    let http = reqwest::Client::new();
    let api_url = format!("{}/v1/mcp/tools/call", stack.worker_url);
    let injected = quiver_model::naming::injected_name(SERVER_ID, "echo")?;
    sequential_api(&http, &api_url, &injected, warmup).await?;
    let mut api_samples = Vec::new();
    for _ in 0..rounds {
        for (route, running) in routes.iter_mut().zip(&sequential_clients) {
            route
                .samples
                .extend(sequential(running.peer(), calls / rounds).await?);
        }
        api_samples.extend(sequential_api(&http, &api_url, &injected, calls / rounds).await?);
    }
    let api_samples = Samples::new(api_samples);

    let mut concurrent_clients = Vec::new();
    for route in &routes {
        let mut clients = Vec::with_capacity(concurrency);
        for _ in 0..concurrency {
            clients.push(client(&route.url, route.token, route.era).await?);
        }
        let peers: Vec<_> = clients.iter().map(|c| c.peer().clone()).collect();
        concurrent(&peers, concurrency * 4).await?;
        concurrent_clients.push((clients, peers));
    }
    for _ in 0..rounds {
        for (route, (_, peers)) in routes.iter_mut().zip(&concurrent_clients) {
            route
                .rps
                .push(concurrent(peers, concurrent_calls / rounds).await?);
        }
    }

    println!(
        "tools/call `echo`, testkit server over streamable HTTP; {calls} sequential calls per route in {rounds} alternating rounds, {concurrency} clients × {concurrent_calls} calls per route concurrently"
    );
    println!("| route | p50 ms | p90 ms | p99 ms | calls/s at {concurrency} clients |");
    println!("|---|---:|---:|---:|---:|");
    let mut measured = Vec::new();
    for route in &routes {
        let samples = Samples::new(route.samples.clone());
        let rps = route.rps.iter().sum::<f64>() / route.rps.len() as f64;
        println!(
            "| {} | {:.3} | {:.3} | {:.3} | {rps:.0} |",
            route.name,
            ms(samples.p50()),
            ms(samples.percentile(0.9)),
            ms(samples.p99()),
        );
        measured.push((samples, rps));
    }
    println!(
        "| reference: HTTP JSON → worker /v1/mcp/tools/call → server | {:.3} | {:.3} | {:.3} | — |",
        ms(api_samples.p50()),
        ms(api_samples.percentile(0.9)),
        ms(api_samples.p99()),
    );
    let (direct, direct_rps) = &measured[0];
    let api_added = ms(api_samples.p50()) - ms(direct.p50());
    let verdict = |ok: bool| if ok { "PASS" } else { "FAIL" };
    for (route, (samples, rps)) in routes.iter().zip(&measured).skip(1) {
        let added = ms(samples.p50()) - ms(direct.p50());
        let added_ratio = added / api_added;
        let throughput = rps / direct_rps;
        println!(
            "{}: added p50 {added:.3} ms = {added_ratio:.2}× the tool API's added {api_added:.3} ms (goal ≤ 1.20×: {}); throughput / direct {throughput:.2}× (goal ≥ 0.60×: {})",
            route.name,
            verdict(added_ratio <= 1.2),
            verdict(throughput >= 0.6)
        );
    }
    drop((sequential_clients, concurrent_clients));
    stack.stop().await;
    server.shutdown().await?;
    Ok(())
}
