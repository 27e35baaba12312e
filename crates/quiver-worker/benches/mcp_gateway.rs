//! Gateway benchmark (issue #12): `tools/call` through a worker's
//! `/mcp/{server_id}` against a direct rmcp client of the same warm server,
//! both measured in the same run.
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
//! - **Gateway:** the same kind of rmcp client to the worker's
//!   `/mcp/<id>` with the caller's bearer token: one MCP session each, the
//!   worker calling the server on its pooled connection.
//!
//! Sequential: `QUIVER_BENCH_CALLS` [3000] calls per route in
//! `QUIVER_BENCH_ROUNDS` [6] alternating rounds after
//! `QUIVER_BENCH_WARMUP` [200] untimed calls; p50/p90/p99 and the p50 the
//! gateway adds (goal ≤ 0.15 ms). Concurrent: `QUIVER_BENCH_CONCURRENCY`
//! [64] clients, each its own MCP session (what many agents sharing a
//! gateway look like), `QUIVER_BENCH_CONCURRENT_CALLS` [12800] calls per
//! round over all of them; throughput gateway / direct (goal ≥ 0.8×).
//!
//! Run: `cargo bench -p quiver-worker --bench mcp_gateway`.

use std::time::{Duration, Instant};

use quiver_model::{HttpConfig, McpServerSpec, Transport};
use quiver_testkit::bench::{Samples, env_usize, ms};
use quiver_testkit::mcp_server::{TestServer, spawn_streamable_http};
use rmcp::model::{CallToolRequestParams, JsonObject};
use rmcp::service::{Peer, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};

#[path = "support/stack.rs"]
mod stack;
use stack::{BenchResult, CALLER_TOKEN, Stack};

const SERVER_ID: &str = "bench-http";
const WAIT: Duration = Duration::from_secs(30);

/// An rmcp client of `url`, with `token` as its bearer credential.
async fn client(
    url: &str,
    token: Option<&str>,
    concurrency: usize,
) -> BenchResult<RunningService<RoleClient, ()>> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_owned());
    config.max_concurrent_requests = concurrency.max(1);
    if let Some(token) = token {
        config = config.auth_header(token.to_owned());
    }
    let transport = StreamableHttpClientTransport::with_client(reqwest::Client::new(), config);
    Ok(tokio::time::timeout(WAIT, ().serve(transport)).await??)
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

    let server = spawn_streamable_http(TestServer::full()).await?;
    let mut spec = McpServerSpec::new(SERVER_ID, Transport::StreamableHttp);
    spec.http = Some(HttpConfig {
        url: server.url().to_owned(),
        ..HttpConfig::default()
    });
    spec.allowed_tools = vec!["*".into()];
    spec.budgets.max_concurrency = u32::try_from(concurrency)?;
    let stack = Stack::start(vec![spec], None).await?;
    let gateway_url = format!("{}/mcp/{SERVER_ID}", stack.worker_url);

    let direct = client(server.url(), None, 1).await?;
    let gateway = client(&gateway_url, Some(CALLER_TOKEN), 1).await?;
    let http = reqwest::Client::new();
    let api_url = format!("{}/v1/mcp/tools/call", stack.worker_url);
    let injected = quiver_model::naming::injected_name(SERVER_ID, "echo")?;
    for route in [&direct, &gateway] {
        sequential(route.peer(), warmup).await?;
    }
    sequential_api(&http, &api_url, &injected, warmup).await?;
    let (mut direct_samples, mut gateway_samples, mut api_samples) =
        (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        direct_samples.extend(sequential(direct.peer(), calls / rounds).await?);
        gateway_samples.extend(sequential(gateway.peer(), calls / rounds).await?);
        api_samples.extend(sequential_api(&http, &api_url, &injected, calls / rounds).await?);
    }
    let (direct_samples, gateway_samples, api_samples) = (
        Samples::new(direct_samples),
        Samples::new(gateway_samples),
        Samples::new(api_samples),
    );

    let mut direct_clients = Vec::with_capacity(concurrency);
    let mut gateway_clients = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        direct_clients.push(client(server.url(), None, 1).await?);
        gateway_clients.push(client(&gateway_url, Some(CALLER_TOKEN), 1).await?);
    }
    let direct_peers: Vec<_> = direct_clients.iter().map(|c| c.peer().clone()).collect();
    let gateway_peers: Vec<_> = gateway_clients.iter().map(|c| c.peer().clone()).collect();
    concurrent(&direct_peers, concurrency * 4).await?;
    concurrent(&gateway_peers, concurrency * 4).await?;
    let (mut direct_rps, mut gateway_rps) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        direct_rps.push(concurrent(&direct_peers, concurrent_calls / rounds).await?);
        gateway_rps.push(concurrent(&gateway_peers, concurrent_calls / rounds).await?);
    }
    let total = |rps: &[f64]| rps.iter().sum::<f64>() / rps.len() as f64;
    let (direct_rps, gateway_rps) = (total(&direct_rps), total(&gateway_rps));

    let added = ms(gateway_samples.p50()) - ms(direct_samples.p50());
    let ratio = gateway_rps / direct_rps;
    println!(
        "tools/call `echo`, testkit server over streamable HTTP; {calls} sequential calls per route in {rounds} alternating rounds, {concurrency} clients × {concurrent_calls} calls per route concurrently"
    );
    println!("| route | p50 ms | p90 ms | p99 ms | calls/s at {concurrency} clients |");
    println!("|---|---:|---:|---:|---:|");
    for (name, samples, rps) in [
        (
            "direct rmcp client → server",
            &direct_samples,
            Some(direct_rps),
        ),
        (
            "rmcp client → worker /mcp/{id} → server",
            &gateway_samples,
            Some(gateway_rps),
        ),
        (
            "reference: HTTP JSON → worker /v1/mcp/tools/call → server",
            &api_samples,
            None,
        ),
    ] {
        println!(
            "| {name} | {:.3} | {:.3} | {:.3} | {} |",
            ms(samples.p50()),
            ms(samples.percentile(0.9)),
            ms(samples.p99()),
            rps.map_or_else(|| "—".to_owned(), |rps: f64| format!("{rps:.0}"))
        );
    }
    println!(
        "of the added p50: the MCP edge (gateway − tool API) {:.3} ms; the worker's hop to the server and its call path (tool API − direct) {:.3} ms",
        ms(gateway_samples.p50()) - ms(api_samples.p50()),
        ms(api_samples.p50()) - ms(direct_samples.p50())
    );
    let verdict = |ok: bool| if ok { "PASS" } else { "FAIL" };
    println!(
        "added p50: {added:.3} ms (goal ≤ 0.150 ms: {}); throughput gateway / direct: {ratio:.2}× (goal ≥ 0.80×: {})",
        verdict(added <= 0.150),
        verdict(ratio >= 0.8)
    );
    drop((direct, gateway, direct_clients, gateway_clients));
    stack.stop().await;
    server.shutdown().await?;
    Ok(())
}
