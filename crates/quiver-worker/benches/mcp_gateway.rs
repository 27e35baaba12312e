//! Gateway benchmark (issues #12, #23): `tools/call` through a worker's
//! `/mcp/{server_id}`, by a client of each protocol era, against a direct
//! client of the same warm server, all measured in the same run.
//!
//! Everything is real and in this process: the testkit's MCP server over
//! streamable HTTP (`TCP_NODELAY`, like `quiver_testkit::mcp_server`), an
//! in-process registry (SQLite) with one record for it
//! (`max_concurrency` = the concurrent clients), and a worker synced to it
//! (`benches/support/stack.rs`). Every call is the server's `echo` tool and
//! every answer is checked.
//!
//! Each route is measured with two kinds of client, and what a route adds
//! is always taken over the direct route of the *same* kind, so that a
//! client's own cost never counts as the hop's. The one exception is a
//! protocol's own: a 2026-07-28 client's baseline is its kind's session
//! call, as the worker reaches the server in a session either way, so
//! what its route adds includes writing `_meta` and three headers into
//! every request (the raw client's, ~7k instructions a call more than
//! the session's, counted with callgrind: BENCHMARKS.md, stop 44):
//!
//! - **rmcp clients** (`StreamableHttpClientTransport`, what agents built
//!   on rmcp use): direct to the server's `/mcp` (a session, as the worker
//!   keeps one); to the worker's `/mcp/<id>` with the caller's bearer token
//!   in a session (2025-11-25) and in the `server/discover` lifecycle
//!   (2026-07-28: no session, every request standing alone).
//! - **raw clients** (`benches/support/clients.rs`: reqwest posting
//!   JSON-RPC itself): the same three routes, and the reference, the
//!   worker's own JSON tool API (`POST /v1/mcp/tools/call`): the same
//!   worker hop without MCP at the edge; and the floor, a raw session
//!   through the bare hop (`benches/support/bare_proxy.rs`: one more HTTP
//!   server and client passing bytes on, nothing else), the least any
//!   route through a worker can cost on this machine. Every raw client's
//!   request is bounded by the same wait, the tool API's included.
//!
//! Goals of issue #23: the p50 the gateway adds over direct ≤ 1.2× what the
//! tool API adds (the cost of the extra hop itself), and throughput at
//! `QUIVER_BENCH_CONCURRENCY` clients ≥ 0.6× direct.
//!
//! Sequential: `QUIVER_BENCH_CALLS` [3000] calls per route in
//! `QUIVER_BENCH_ROUNDS` [6] alternating rounds after
//! `QUIVER_BENCH_WARMUP` [200] untimed calls; p50/p90/p99. Concurrent:
//! `QUIVER_BENCH_CONCURRENCY` [64] clients per route (each its own session
//! where the route has sessions: what many agents sharing a gateway look
//! like), `QUIVER_BENCH_CONCURRENT_CALLS` [12800] calls per round over all
//! of them; calls/s. `QUIVER_BENCH_ROUTES` (comma-separated parts of
//! route names) runs only the routes it names, to profile one.
//!
//! Run: `cargo bench -p quiver-worker --bench mcp_gateway`.

use std::time::{Duration, Instant};

use quiver_model::{HttpConfig, McpServerSpec, Transport};
use quiver_testkit::bench::{Samples, env_usize, ms};
use quiver_testkit::mcp_server::{ExampleServer, spawn_streamable_http};
use rmcp::RoleClient;
use rmcp::model::{CallToolRequestParams, JsonObject};
use rmcp::service::RunningService;
use serde_json::Value;

#[path = "support/bare_proxy.rs"]
mod bare_proxy;
#[path = "support/clients.rs"]
mod clients;
#[path = "support/stack.rs"]
mod stack;
use bare_proxy::BareProxy;
use clients::{Era, RawMcp, rmcp_client, tool_api_call};
use stack::{BenchResult, CALLER_TOKEN, Stack};

const SERVER_ID: &str = "bench-http";

/// How a route's clients reach the server.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// An rmcp client of the era.
    Rmcp(Era),
    /// A raw client of the era.
    Raw(Era),
    /// A raw client of the worker's JSON tool API.
    ToolApi,
}

/// Where a route goes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Target {
    /// The server itself.
    Direct,
    /// The bare hop (`benches/support/bare_proxy.rs`) in front of it.
    BareHop,
    /// The worker.
    Worker,
}

/// One client of a route.
enum Caller {
    Rmcp(RunningService<RoleClient, ()>),
    Raw(RawMcp),
    ToolApi { http: reqwest::Client, url: String },
}

impl Caller {
    /// One `echo` call; its answer checked.
    async fn echo(&mut self, text: &str) -> BenchResult<()> {
        let mut arguments = JsonObject::new();
        arguments.insert("text".into(), text.into());
        let result: Value = match self {
            Caller::Rmcp(running) => {
                let mut params = CallToolRequestParams::new("echo");
                params.arguments = Some(arguments);
                let result = running.peer().call_tool(params).await?;
                match result.content.first().and_then(|c| c.as_text()) {
                    Some(answer) if answer.text == text && result.is_error != Some(true) => {
                        return Ok(());
                    }
                    _ => return Err(format!("unexpected answer {result:?}").into()),
                }
            }
            Caller::Raw(raw) => raw.call("echo", arguments).await?,
            Caller::ToolApi { http, url } => {
                let name = quiver_model::naming::injected_name(SERVER_ID, "echo")?;
                tool_api_call(http, url, &name, arguments).await?
            }
        };
        if result["content"][0]["text"] != text || result["isError"] == true {
            return Err(format!("unexpected answer {result}").into());
        }
        Ok(())
    }
}

/// One route of the run: how to make its clients and what they measured.
struct Route {
    name: &'static str,
    kind: Kind,
    target: Target,
    url: String,
    samples: Vec<Duration>,
    rps: Vec<f64>,
}

impl Route {
    /// A new client of the route.
    async fn client(&self) -> BenchResult<Caller> {
        let token = (self.target == Target::Worker).then_some(CALLER_TOKEN);
        Ok(match self.kind {
            Kind::Rmcp(era) => Caller::Rmcp(rmcp_client(&self.url, era, token).await?),
            Kind::Raw(era) => Caller::Raw(RawMcp::connect(&self.url, era, token).await?),
            Kind::ToolApi => Caller::ToolApi {
                http: reqwest::Client::new(),
                url: self.url.clone(),
            },
        })
    }

    /// Whether `other` is this route's direct baseline: the direct route of
    /// the same kind of client (the tool API's is the raw one).
    fn baseline_of(&self, other: &Route) -> bool {
        other.target == Target::Direct
            && match self.kind {
                Kind::Rmcp(_) => matches!(other.kind, Kind::Rmcp(_)),
                Kind::Raw(_) | Kind::ToolApi => matches!(other.kind, Kind::Raw(_)),
            }
    }
}

/// `calls` sequential calls; their latencies.
async fn sequential(caller: &mut Caller, calls: usize) -> BenchResult<Vec<Duration>> {
    let mut samples = Vec::with_capacity(calls);
    for i in 0..calls {
        let started = Instant::now();
        caller.echo(&format!("call {i}")).await?;
        samples.push(started.elapsed());
    }
    Ok(samples)
}

/// `calls` calls spread over `clients`, each calling in a loop; calls/s and
/// the clients back.
async fn concurrent(clients: Vec<Caller>, calls: usize) -> BenchResult<(f64, Vec<Caller>)> {
    let per_client = calls / clients.len();
    let count = clients.len();
    let started = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut caller| {
            tokio::spawn(async move {
                for i in 0..per_client {
                    caller.echo(&format!("c{i}")).await?;
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(caller)
            })
        })
        .collect();
    let mut clients = Vec::with_capacity(count);
    for task in tasks {
        clients.push(task.await??);
    }
    let rps = (per_client * count) as f64 / started.elapsed().as_secs_f64();
    Ok((rps, clients))
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
    let proxy = BareProxy::spawn(server.url()).await?;
    let gateway_url = format!("{}/mcp/{SERVER_ID}", stack.worker_url);
    let api_url = format!("{}/v1/mcp/tools/call", stack.worker_url);
    let route = |name, kind, target, url: &str| Route {
        name,
        kind,
        target,
        url: url.to_owned(),
        samples: Vec::new(),
        rps: Vec::new(),
    };
    use {Era::*, Kind::*, Target::*};
    let routes = [
        route("rmcp client → server", Rmcp(Session), Direct, server.url()),
        route(
            "2025-11-25 rmcp client (session) → worker /mcp/{id} → server",
            Rmcp(Session),
            Worker,
            &gateway_url,
        ),
        route(
            "2026-07-28 rmcp client (no session) → worker /mcp/{id} → server",
            Rmcp(Stateless),
            Worker,
            &gateway_url,
        ),
        route("raw client → server", Raw(Session), Direct, server.url()),
        route(
            "floor: raw client → bare proxy → server",
            Raw(Session),
            BareHop,
            &proxy.url,
        ),
        route(
            "2025-11-25 raw client (session) → worker /mcp/{id} → server",
            Raw(Session),
            Worker,
            &gateway_url,
        ),
        route(
            "2026-07-28 raw client (no session) → worker /mcp/{id} → server",
            Raw(Stateless),
            Worker,
            &gateway_url,
        ),
        route(
            "reference: raw JSON → worker /v1/mcp/tools/call → server",
            ToolApi,
            Worker,
            &api_url,
        ),
    ];
    let named = std::env::var("QUIVER_BENCH_ROUTES").unwrap_or_default();
    let mut routes: Vec<Route> = routes
        .into_iter()
        .filter(|route| {
            named.is_empty()
                || named
                    .split(',')
                    .any(|part| route.name.contains(part.trim()))
        })
        .collect();
    if routes.is_empty() {
        return Err(format!("QUIVER_BENCH_ROUTES={named:?} names no route").into());
    }

    let mut sequential_clients = Vec::new();
    for route in &routes {
        let mut caller = route.client().await?;
        sequential(&mut caller, warmup).await?;
        sequential_clients.push(caller);
    }
    for _ in 0..rounds {
        for (route, caller) in routes.iter_mut().zip(&mut sequential_clients) {
            route
                .samples
                .extend(sequential(caller, calls / rounds).await?);
        }
    }
    drop(sequential_clients);

    let mut concurrent_clients = Vec::new();
    for route in &routes {
        let mut clients = Vec::with_capacity(concurrency);
        for _ in 0..concurrency {
            clients.push(route.client().await?);
        }
        let (_, clients) = concurrent(clients, concurrency * 4).await?;
        concurrent_clients.push(Some(clients));
    }
    for _ in 0..rounds {
        for (route, clients) in routes.iter_mut().zip(&mut concurrent_clients) {
            let (rps, back) = concurrent(
                clients.take().unwrap_or_default(),
                concurrent_calls / rounds,
            )
            .await?;
            route.rps.push(rps);
            *clients = Some(back);
        }
    }
    drop(concurrent_clients);

    println!(
        "tools/call `echo`, testkit server over streamable HTTP; {calls} sequential calls per route in {rounds} alternating rounds, {concurrency} clients × {concurrent_calls} calls per route concurrently (load average at end: {})",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .next()
            .unwrap_or("?")
    );
    println!("| route | p50 ms | p90 ms | p99 ms | calls/s at {concurrency} clients |");
    println!("|---|---:|---:|---:|---:|");
    let measured: Vec<(f64, f64)> = routes
        .iter()
        .map(|route| {
            let samples = Samples::new(route.samples.clone());
            let rps = route.rps.iter().sum::<f64>() / route.rps.len() as f64;
            println!(
                "| {} | {:.3} | {:.3} | {:.3} | {rps:.0} |",
                route.name,
                ms(samples.p50()),
                ms(samples.percentile(0.9)),
                ms(samples.p99()),
            );
            (ms(samples.p50()), rps)
        })
        .collect();
    // What a worker route adds over its own kind's direct route.
    let added = |index: usize| {
        let baseline = routes
            .iter()
            .position(|other| routes[index].baseline_of(other))
            .unwrap_or(index);
        (
            measured[index].0 - measured[baseline].0,
            measured[index].1 / measured[baseline].1,
        )
    };
    // The ratios need the tool API's route (absent when profiling others).
    if let Some(api) = routes.iter().position(|route| route.kind == ToolApi) {
        let (api_added, api_throughput) = added(api);
        let verdict = |ok: bool| if ok { "PASS" } else { "FAIL" };
        // The bare hop: the least any route through a worker costs here.
        let floor = routes
            .iter()
            .position(|route| route.target == BareHop)
            .map(added);
        let of_floor = |throughput: f64| {
            floor.map_or(String::new(), |(_, floor_throughput)| {
                format!(", {:.2}× the bare hop's", throughput / floor_throughput)
            })
        };
        if let Some((floor_added, floor_throughput)) = floor {
            println!(
                "bare hop: added p50 {floor_added:.3} ms over the raw client's direct call = {:.2}× the tool API's; throughput / direct {floor_throughput:.2}× (the most a route through one more HTTP server and client keeps on this machine)",
                floor_added / api_added
            );
        }
        println!(
            "tool API: added p50 {api_added:.3} ms over the raw client's direct call; throughput / direct {api_throughput:.2}×{}",
            of_floor(api_throughput)
        );
        for (index, route) in routes.iter().enumerate() {
            if route.target != Worker || route.kind == ToolApi {
                continue;
            }
            let (added, throughput) = added(index);
            let added_ratio = added / api_added;
            println!(
                "{}: added p50 {added:.3} ms over the same client's direct call = {added_ratio:.2}× the tool API's (goal ≤ 1.20×: {}); throughput / direct {throughput:.2}× (goal ≥ 0.60×: {}{})",
                route.name,
                verdict(added_ratio <= 1.2),
                verdict(throughput >= 0.6),
                of_floor(throughput)
            );
        }
    }
    stack.stop().await;
    server.shutdown().await?;
    Ok(())
}
