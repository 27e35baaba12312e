//! Worker → HTTP upstream benchmark (issue #23): what the worker's own path
//! to a streamable-HTTP server adds to a `tools/call`, for servers of both
//! protocol eras, against a raw keep-alive HTTP client calling the same
//! server directly, all measured in the same run.
//!
//! Upstreams, all over streamable HTTP on loopback:
//! - **server-everything** (`@modelcontextprotocol/server-everything`, the
//!   TypeScript SDK, on node): a 2025-11-25 session; its `echo` tool. Found
//!   as in the `tools` benchmark (`QUIVER_BENCH_NPM_PREFIX`,
//!   `QUIVER_BENCH_NODE`; `scripts/test.sh` installs it into
//!   `target/npm-servers`).
//! - **scenario server, 2025-11-25** (`quiver_testkit::scenario_server`,
//!   served in this process like `quiver-testkit-scenarios --listen`, with
//!   `TCP_NODELAY`): a session; its `test_simple_text` tool.
//! - **scenario server, 2026-07-28**: the same server, every request
//!   standing alone (`server/discover`, no session).
//!
//! Routes per upstream (every answer is checked):
//! - **raw → upstream** (the baseline): a reqwest client (keep-alive, one
//!   connection) posting JSON-RPC itself: the session's headers, or a
//!   2026-07-28 request's `_meta` and headers; an SSE answer is read whole.
//! - **rmcp client → upstream**: rmcp's `StreamableHttpClientTransport`,
//!   the client library the worker's pool uses.
//! - **pool in-process**: `McpPool::call_tool` of the running worker, its
//!   path without the HTTP edge.
//! - **raw → worker → upstream**: the same raw client posting the worker's
//!   JSON tool API, `POST /v1/mcp/tools/call` (what issue #23 measures).
//!
//! `QUIVER_BENCH_CALLS` [2000] calls per route in `QUIVER_BENCH_ROUNDS` [4]
//! alternating rounds after `QUIVER_BENCH_WARMUP` [200] untimed calls, one
//! at a time; p50/p90/p99 per route and, per upstream, the p50 each route
//! adds over raw direct. Goal: the worker route adds ≤ 0.15 ms.
//!
//! Run from the workspace root (the prefix must be absolute: benches run in
//! their crate's directory): `QUIVER_BENCH_NPM_PREFIX=$PWD/target/npm-servers
//! CARGO_TARGET_DIR=target/bench cargo bench -p quiver-worker --bench http_upstream`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::serve::ListenerExt as _;
use quiver_model::{HttpConfig, McpServerSpec, Protocol, StoredServer, Transport};
use quiver_testkit::bench::{Samples, env_usize, ms};
use quiver_testkit::bench_servers::{everything_entry, node_binary};
use quiver_testkit::mcp_server::no_delay;
use quiver_testkit::scenario_server::{Revisions, ScenarioServer};
use rmcp::RoleClient;
use rmcp::model::{CallToolRequestParams, JsonObject};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

#[path = "support/clients.rs"]
mod clients;
#[path = "support/stack.rs"]
mod stack;
use clients::{Era, RawMcp, rmcp_client, tool_api_call};
use stack::{BenchResult, CALLER_TOKEN, Stack};

/// Bound on starting a server and on a handshake.
const WAIT: Duration = Duration::from_secs(30);
/// The goal of issue #23: p50 the worker adds over raw direct.
const GOAL_MS: f64 = 0.15;

/// One upstream server and the call every route makes to it.
struct Upstream {
    name: &'static str,
    server_id: &'static str,
    url: String,
    era: Era,
    tool: &'static str,
    /// The call's arguments for call number `i`, and the text the answer
    /// must carry.
    call: fn(usize) -> (JsonObject, String),
}

fn everything_echo(i: usize) -> (JsonObject, String) {
    let message = format!("call {i}");
    let mut arguments = JsonObject::new();
    arguments.insert("message".into(), message.clone().into());
    (arguments, format!("Echo: {message}"))
}

fn scenario_text(_: usize) -> (JsonObject, String) {
    (
        JsonObject::new(),
        "This is a simple text response for testing.".to_owned(),
    )
}

/// The first text content of a `tools/call` result, if it is not an error.
fn answer_text(result: &Value) -> Option<&str> {
    if result["isError"] == true {
        return None;
    }
    result["content"][0]["text"].as_str()
}

/// How a route reaches its upstream.
enum Caller {
    RawDirect(RawMcp),
    Rmcp(RunningService<RoleClient, ()>),
    Pool(Arc<StoredServer>),
    RawWorker {
        http: reqwest::Client,
        url: String,
        tool: String,
    },
}

/// One route of the run: its caller and what it measured.
struct Route {
    name: &'static str,
    upstream: usize,
    caller: Caller,
    samples: Vec<Duration>,
}

impl Route {
    /// One call, timed until its result is a JSON value on every route (the
    /// raw routes parse the body into one, the others convert rmcp's typed
    /// result); its answer checked.
    async fn call(
        &mut self,
        upstream: &Upstream,
        stack: &Stack,
        i: usize,
    ) -> BenchResult<Duration> {
        let (arguments, expected) = (upstream.call)(i);
        let started = Instant::now();
        let result = match &mut self.caller {
            Caller::RawDirect(raw) => raw.call(upstream.tool, arguments).await?,
            Caller::Rmcp(running) => {
                let mut params = CallToolRequestParams::new(upstream.tool);
                params.arguments = Some(arguments);
                serde_json::to_value(running.peer().call_tool(params).await?)?
            }
            // From a task of the runtime, as the worker's handlers call it
            // (the benchmark itself runs on the thread that blocks on it).
            Caller::Pool(server) => {
                let (pool, server, tool) = (stack.pool.clone(), server.clone(), upstream.tool);
                let called =
                    tokio::spawn(
                        async move { pool.call_tool(&server, tool, Some(arguments)).await },
                    );
                serde_json::to_value(called.await??.result)?
            }
            Caller::RawWorker { http, url, tool } => {
                tool_api_call(http, url, tool, arguments).await?
            }
        };
        let took = started.elapsed();
        if answer_text(&result) != Some(expected.as_str()) {
            return Err(format!("{}: unexpected answer {result}", self.name).into());
        }
        Ok(took)
    }
}

/// One `GET` of `url` with the caller's token, its answer read: what an
/// HTTP exchange with the worker costs by itself (the floor of any route
/// through it); its time.
async fn exchange(http: &reqwest::Client, url: &str) -> BenchResult<Duration> {
    let started = Instant::now();
    http.get(url)
        .bearer_auth(CALLER_TOKEN)
        .send()
        .await?
        .error_for_status()?
        .bytes()
        .await?;
    Ok(started.elapsed())
}

/// The scenario server over streamable HTTP in this process, as
/// `quiver-testkit-scenarios --listen` serves it, plus `TCP_NODELAY`; its
/// `/mcp` URL.
async fn spawn_scenarios(shutdown: CancellationToken) -> BenchResult<String> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let server = ScenarioServer::new(Revisions::AllKnown);
    let service: StreamableHttpService<ScenarioServer, LocalSessionManager> =
        StreamableHttpService::new(
            move || Ok(server.clone()),
            Arc::new(LocalSessionManager::default()),
            StreamableHttpServerConfig::default().with_cancellation_token(shutdown.child_token()),
        );
    let router = axum::Router::new().nest_service("/mcp", service);
    tokio::spawn(
        axum::serve(listener.tap_io(no_delay), router)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .into_future(),
    );
    Ok(format!("http://{addr}/mcp"))
}

/// server-everything's streamable HTTP transport on a free port; killed on
/// drop.
struct Everything {
    /// Held for its `kill_on_drop`.
    _child: tokio::process::Child,
    url: String,
}

impl Everything {
    async fn start() -> BenchResult<Everything> {
        let (entry, sdk) = everything_entry()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = tokio::process::Command::new(node_binary()?)
            .arg(entry)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let started = Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            if started.elapsed() > WAIT {
                return Err("server-everything did not listen in time".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        eprintln!("server-everything {sdk} SDK on port {port}");
        Ok(Everything {
            _child: child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        })
    }
}

fn main() -> BenchResult<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

async fn run() -> BenchResult<()> {
    let calls = env_usize("QUIVER_BENCH_CALLS", 2000);
    let rounds = env_usize("QUIVER_BENCH_ROUNDS", 4).max(1);
    let warmup = env_usize("QUIVER_BENCH_WARMUP", 200);

    let shutdown = CancellationToken::new();
    let everything = Everything::start().await?;
    let scenarios = spawn_scenarios(shutdown.clone()).await?;
    let upstreams = [
        Upstream {
            name: "server-everything (2025-11-25 session)",
            server_id: "everything",
            url: everything.url.clone(),
            era: Era::Session,
            tool: "echo",
            call: everything_echo,
        },
        Upstream {
            name: "scenario server (2025-11-25 session)",
            server_id: "scenarios-2025",
            url: scenarios.clone(),
            era: Era::Session,
            tool: "test_simple_text",
            call: scenario_text,
        },
        Upstream {
            name: "scenario server (2026-07-28, no session)",
            server_id: "scenarios-2026",
            url: scenarios,
            era: Era::Stateless,
            tool: "test_simple_text",
            call: scenario_text,
        },
    ];
    let specs = upstreams
        .iter()
        .map(|upstream| {
            let mut spec = McpServerSpec::new(upstream.server_id, Transport::StreamableHttp);
            spec.http = Some(HttpConfig {
                url: upstream.url.clone(),
                ..HttpConfig::default()
            });
            spec.protocol = match upstream.era {
                Era::Session => Protocol::V2025_11_25,
                Era::Stateless => Protocol::V2026_07_28,
            };
            spec.allowed_tools = vec!["*".into()];
            spec
        })
        .collect();
    let stack = Stack::start(specs, None).await?;
    let tool_api = format!("{}/v1/mcp/tools/call", stack.worker_url);

    let mut routes = Vec::new();
    for (index, upstream) in upstreams.iter().enumerate() {
        let route = |name, caller| Route {
            name,
            upstream: index,
            caller,
            samples: Vec::new(),
        };
        routes.push(route(
            "raw → upstream",
            Caller::RawDirect(RawMcp::connect(&upstream.url, upstream.era, None).await?),
        ));
        routes.push(route(
            "rmcp client → upstream",
            Caller::Rmcp(rmcp_client(&upstream.url, upstream.era, None).await?),
        ));
        routes.push(route(
            "pool in-process → upstream",
            Caller::Pool(stack.server(upstream.server_id)?),
        ));
        routes.push(route(
            "raw → worker /v1/mcp/tools/call → upstream",
            Caller::RawWorker {
                http: reqwest::Client::new(),
                url: tool_api.clone(),
                tool: quiver_model::naming::injected_name(upstream.server_id, upstream.tool)?,
            },
        ));
    }
    for route in &mut routes {
        for i in 0..warmup {
            route.call(&upstreams[route.upstream], &stack, i).await?;
        }
    }
    let floor_http = reqwest::Client::new();
    let whoami = format!("{}/v1/whoami", stack.worker_url);
    for _ in 0..warmup {
        exchange(&floor_http, &whoami).await?;
    }
    let mut floor = Vec::new();
    for _ in 0..rounds {
        for route in &mut routes {
            for i in 0..calls / rounds {
                let took = route.call(&upstreams[route.upstream], &stack, i).await?;
                route.samples.push(took);
            }
        }
        for _ in 0..calls / rounds {
            floor.push(exchange(&floor_http, &whoami).await?);
        }
    }
    let floor = ms(Samples::new(floor).p50());

    println!(
        "tools/call, {calls} sequential calls per route in {rounds} alternating rounds (load average at end: {})",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .next()
            .unwrap_or("?")
    );
    println!("| upstream | route | p50 ms | p90 ms | p99 ms | added p50 over raw direct ms |");
    println!("|---|---|---:|---:|---:|---:|");
    let mut verdicts = Vec::new();
    for (index, upstream) in upstreams.iter().enumerate() {
        let mut direct = None;
        for route in routes.iter().filter(|route| route.upstream == index) {
            let samples = Samples::new(route.samples.clone());
            let p50 = ms(samples.p50());
            let base = *direct.get_or_insert(p50);
            println!(
                "| {} | {} | {p50:.3} | {:.3} | {:.3} | {:+.3} |",
                upstream.name,
                route.name,
                ms(samples.percentile(0.9)),
                ms(samples.p99()),
                p50 - base,
            );
            if matches!(route.caller, Caller::RawWorker { .. }) {
                verdicts.push((upstream.name, p50 - base));
            }
        }
    }
    println!(
        "floor: raw → worker GET /v1/whoami (one authenticated HTTP exchange with the worker, nothing behind it) p50 {floor:.3} ms"
    );
    for (name, added) in verdicts {
        let met = if added <= GOAL_MS { "met" } else { "NOT met" };
        println!(
            "goal {name}: worker adds {added:.3} ms p50 over raw direct (≤ {GOAL_MS:.2} ms) {met}; less the floor, the worker's own work: {:.3} ms",
            added - floor
        );
    }
    drop(routes);
    stack.stop().await;
    shutdown.cancel();
    drop(everything);
    Ok(())
}
