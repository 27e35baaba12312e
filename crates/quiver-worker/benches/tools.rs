//! Worker benchmark (issue #3): what the worker's pooled MCP connections and
//! its tool API cost, each against a baseline measured in the same run.
//!
//! Everything is real: an MCP server over stdio and over streamable HTTP, an
//! in-process registry (`Registry::start` over SQLite in a temp file) holding
//! one record per transport (`allowed_tools = ["*"]`, `max_concurrency` = the
//! number of concurrent callers), and an in-process worker (`Worker::start` +
//! `Worker::run`) synced to it and called over loopback HTTP with a caller
//! token. Every call is the server's `echo` tool with a short text, and every
//! answer is checked. The callers, the worker (with the registry) and the
//! HTTP MCP server run as if they were three processes: two tokio runtimes
//! with named threads here, and the server on a third runtime or in a child
//! process, so the CPU each one uses per call can be reported.
//!
//! `QUIVER_BENCH_SERVER` chooses the MCP server; the phases are the same:
//!
//! - `testkit` (default): the native `quiver-testkit-mcp` binary over stdio
//!   (`echo {text}`), and the testkit's `ExampleServer` over streamable HTTP.
//! - `everything`: the reference server `@modelcontextprotocol/server-everything`
//!   (version [`EVERYTHING_VERSION`], `echo {message}`, answers `Echo: …`),
//!   run as `node <dist/index.js> stdio` and `node <dist/index.js>
//!   streamableHttp` (one process on a free port, given in `PORT`). The
//!   package is installed with npm into `target/bench-npm` on the first run
//!   (`QUIVER_BENCH_NPM_PREFIX` overrides the directory, `QUIVER_BENCH_NODE`
//!   the `node` binary, which is otherwise found in `PATH`).
//!
//! 1. **Pooled call vs spawn-per-call** (stdio). Baseline: for every call,
//!    spawn the server with rmcp's `TokioChildProcess` from the stdio record
//!    (the same program, arguments and environment as the worker's pool
//!    uses), `initialize`, call `echo`, close (stdin closed, child reaped):
//!    what a system without a pool does. Quiver: the same call through the
//!    worker's `McpPool` on its warm connection to the same server. For
//!    reference: the same through the worker's HTTP tool API, and a direct
//!    rmcp client on its own warm child. Goal: pooled ≥ 100× faster.
//! 2. **Worker tool API vs a direct rmcp client** (streamable HTTP, one warm
//!    server). Baseline: an rmcp client (`StreamableHttpClientTransport`,
//!    `max_concurrent_requests` = the number of concurrent callers) calling
//!    `echo` sequentially and from `QUIVER_BENCH_CONCURRENCY` concurrent
//!    callers. Quiver: `POST /v1/mcp/tools/call` with the injected name, over
//!    one shared keep-alive reqwest client, measured the same way. Goals: p50
//!    latency ratio (worker / direct) ≤ 1.25×; throughput ratio at 64
//!    concurrent callers (worker / direct) ≥ 0.7×. To locate the overhead,
//!    the sequential phase also times the layers in between: the pool alone
//!    (`McpPool::call_tool`), the worker's call path without HTTP
//!    (`quiver_worker::call::ToolRunner::call`), its catalog alone (`Catalog::build`
//!    and `resolve`, no I/O) and an HTTP round trip to the worker that does
//!    nothing (`GET /healthz`).
//!
//! The routes of one comparison run in alternating rounds, so a change in the
//! machine's load hits all of them alike.
//!
//! With `testkit`, the HTTP MCP server runs in this process with
//! `TCP_NODELAY` on its sockets, like
//! `quiver_testkit::mcp_server::serve_streamable_http`.
//! `QUIVER_BENCH_HTTP_SERVER=binary` uses `quiver-testkit-mcp --transport
//! streamable-http` instead, and `=in-process-nagle` leaves Nagle's algorithm
//! on, which makes every call about 40 ms late for the direct client and the
//! worker alike (rmcp writes the SSE answer in parts, and the part with the
//! result waits for the client's delayed ACK). The CPU of a server in a
//! child process (the binary, or node) is read from
//! `/proc/<pid>/task/*/schedstat`.
//!
//! With `testkit`, build the server binary first, in the profile `cargo
//! bench` uses: `cargo build --release -p quiver-testkit && cargo bench -p
//! quiver-worker --bench tools` (`QUIVER_BENCH_MCP_BIN` overrides the
//! binary's path). With `everything`: `QUIVER_BENCH_SERVER=everything cargo
//! bench -p quiver-worker --bench tools` (needs `node` and `npm`).
//! Sizes come from environment variables (defaults in brackets):
//! `QUIVER_BENCH_SPAWNS` [200] spawn-per-call samples, `QUIVER_BENCH_CALLS`
//! [4000] sequential calls per route, `QUIVER_BENCH_CONCURRENCY` [64]
//! concurrent callers, `QUIVER_BENCH_CONCURRENT_CALLS` [12800] calls per
//! concurrent phase, `QUIVER_BENCH_ROUNDS` [8] alternating rounds,
//! `QUIVER_BENCH_WARMUP` [200] untimed calls per route.

use quiver_testkit::bench::{Samples, env_usize, ms};
use quiver_testkit::bench_servers::{
    EVERYTHING_PACKAGE, EVERYTHING_VERSION, everything_entry, node_binary, server_binary,
};
use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::serve::ListenerExt;
use quiver_mcp::launch::{Launch, StdioLaunch, process_env};
use quiver_mcp::{CallToolResult, McpPool};
use quiver_model::policy::CompiledTaskPolicy;
use quiver_model::{HttpConfig, McpServerSpec, StdioConfig, StoredServer, Transport};
use quiver_sync::SnapshotHandle;
use quiver_testkit::mcp_server::{ExampleServer, Profile};
use quiver_worker::DEFAULT_CATALOG_WAIT;
use quiver_worker::approval::ApprovalFlow;
use quiver_worker::audit::AuditOptions;
use quiver_worker::auth::Task;
use quiver_worker::call::{Call, CallContext, Lookup, ToolRunner};
use quiver_worker::catalog::Catalog;
use rmcp::model::{CallToolRequestParams, JsonObject};
use rmcp::service::{Peer, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

#[path = "support/stack.rs"]
mod stack;

use stack::{BenchResult, CALLER_TOKEN, Stack};

const STDIO_ID: &str = "bench-stdio";
const HTTP_ID: &str = "bench-http";
const ECHO_TEXT: &str = "hello from the quiver benchmark";
/// Bound on anything that should be quick.
const WAIT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------- config

#[derive(Debug, Clone, Copy)]
struct Config {
    spawns: usize,
    calls: usize,
    concurrency: usize,
    concurrent_calls: usize,
    rounds: usize,
    warmup: usize,
    server: ServerChoice,
    http_server: ServerKind,
}

/// The MCP server under test (`QUIVER_BENCH_SERVER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ServerChoice {
    /// `quiver-testkit-mcp` and the testkit's `ExampleServer`.
    Testkit,
    /// `@modelcontextprotocol/server-everything` on node.
    Everything,
}

/// Where the streamable-HTTP server of the API comparison runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ServerKind {
    /// The testkit server in this process, on its own runtime.
    InProcess {
        /// `TCP_NODELAY` on the server's sockets.
        nodelay: bool,
    },
    /// The `quiver-testkit-mcp` binary.
    Binary,
    /// `node <server-everything> streamableHttp`.
    Everything,
}

impl ServerKind {
    fn describe(self) -> &'static str {
        match self {
            ServerKind::InProcess { nodelay: true } => "in-process, TCP_NODELAY",
            ServerKind::InProcess { nodelay: false } => "in-process, Nagle on",
            ServerKind::Binary => "quiver-testkit-mcp binary",
            ServerKind::Everything => "node server-everything streamableHttp",
        }
    }
}

impl Config {
    fn from_env() -> Self {
        let server = match std::env::var("QUIVER_BENCH_SERVER").as_deref() {
            Ok("testkit") | Err(_) => ServerChoice::Testkit,
            Ok("everything") => ServerChoice::Everything,
            Ok(other) => {
                panic!("QUIVER_BENCH_SERVER must be testkit or everything, got {other:?}")
            }
        };
        let http_server = match (server, std::env::var("QUIVER_BENCH_HTTP_SERVER").as_deref()) {
            (ServerChoice::Everything, Err(_)) => ServerKind::Everything,
            (ServerChoice::Everything, Ok(other)) => panic!(
                "QUIVER_BENCH_HTTP_SERVER applies to QUIVER_BENCH_SERVER=testkit only, got {other:?}"
            ),
            (ServerChoice::Testkit, Ok("in-process") | Err(_)) => {
                ServerKind::InProcess { nodelay: true }
            }
            (ServerChoice::Testkit, Ok("in-process-nagle")) => {
                ServerKind::InProcess { nodelay: false }
            }
            (ServerChoice::Testkit, Ok("binary")) => ServerKind::Binary,
            (ServerChoice::Testkit, Ok(other)) => panic!(
                "QUIVER_BENCH_HTTP_SERVER must be in-process, in-process-nagle or binary, got {other:?}"
            ),
        };
        Config {
            spawns: env_usize("QUIVER_BENCH_SPAWNS", 200).max(1),
            calls: env_usize("QUIVER_BENCH_CALLS", 4000).max(1),
            concurrency: env_usize("QUIVER_BENCH_CONCURRENCY", 64).max(1),
            concurrent_calls: env_usize("QUIVER_BENCH_CONCURRENT_CALLS", 12800).max(1),
            rounds: env_usize("QUIVER_BENCH_ROUNDS", 8).max(1),
            warmup: env_usize("QUIVER_BENCH_WARMUP", 200),
            server,
            http_server,
        }
    }
}

/// The `echo` call every route makes, and the answer it must get.
#[derive(Debug, Clone, Copy)]
struct Echo {
    /// Argument that carries the text.
    argument: &'static str,
    /// The answer is this prefix followed by [`ECHO_TEXT`].
    reply_prefix: &'static str,
}

impl Echo {
    const TOOL: &'static str = "echo";

    fn arguments(self) -> JsonObject {
        let mut arguments = JsonObject::new();
        arguments.insert(self.argument.to_owned(), Value::from(ECHO_TEXT));
        arguments
    }

    fn request(self) -> CallToolRequestParams {
        CallToolRequestParams::new(Self::TOOL).with_arguments(self.arguments())
    }

    /// The JSON body of `POST /v1/mcp/tools/call` for the injected name.
    fn api_body(self, injected: &str) -> BenchResult<Arc<Vec<u8>>> {
        Ok(Arc::new(serde_json::to_vec(
            &json!({"name": injected, "arguments": self.arguments()}),
        )?))
    }

    fn check(self, is_error: Option<bool>, text: Option<&str>) -> BenchResult<()> {
        let echoed = text.and_then(|text| text.strip_prefix(self.reply_prefix));
        if is_error == Some(true) || echoed != Some(ECHO_TEXT) {
            return Err(
                format!("unexpected echo result: is_error={is_error:?}, text={text:?}").into(),
            );
        }
        Ok(())
    }

    fn check_result(self, result: &CallToolResult) -> BenchResult<()> {
        self.check(
            result.is_error,
            result
                .content
                .first()
                .and_then(|c| c.as_text())
                .map(|t| t.text.as_str()),
        )
    }
}

/// The MCP server under test: how to start it and how to call it.
struct Subject {
    /// For the summary line: name and versions.
    about: String,
    echo: Echo,
    /// Program of the stdio record and of the HTTP server process.
    program: PathBuf,
    /// Arguments of the stdio record.
    stdio_args: Vec<String>,
    /// Arguments of the streamable-HTTP server process, when it is one.
    http_args: Vec<String>,
}

impl Subject {
    fn new(config: &Config) -> BenchResult<Self> {
        match config.server {
            ServerChoice::Testkit => Ok(Subject {
                about: "quiver-testkit-mcp".into(),
                echo: Echo {
                    argument: "text",
                    reply_prefix: "",
                },
                program: server_binary()?,
                stdio_args: vec!["--transport".into(), "stdio".into()],
                http_args: vec![
                    "--transport".into(),
                    "streamable-http".into(),
                    "--listen".into(),
                    "127.0.0.1:0".into(),
                ],
            }),
            ServerChoice::Everything => {
                let node = node_binary()?;
                let node_version = std::process::Command::new(&node)
                    .arg("--version")
                    .output()?
                    .stdout;
                let (entry, sdk) = everything_entry()?;
                let entry = entry.display().to_string();
                Ok(Subject {
                    about: format!(
                        "{EVERYTHING_PACKAGE}@{EVERYTHING_VERSION} (@modelcontextprotocol/sdk {sdk}) on node {}",
                        String::from_utf8_lossy(&node_version).trim()
                    ),
                    echo: Echo {
                        argument: "message",
                        reply_prefix: "Echo: ",
                    },
                    program: node,
                    stdio_args: vec![entry.clone(), "stdio".into()],
                    http_args: vec![entry, "streamableHttp".into()],
                })
            }
        }
    }
}

// ---------------------------------------------------------------- statistics

/// Thread-name prefixes of the runtimes, and the CPU groups they form.
const CLIENT_THREADS: &str = "bench-client";
const WORKER_THREADS: &str = "quiver-worker";
const SERVER_THREADS: &str = "mcp-server";

/// CPU time used so far by this process's threads, by group: the benchmark's
/// callers (`client`), the registry and worker (`worker`), the MCP server
/// (`server`: the in-process server's threads, or every thread of a server
/// in a child process) and anything else. From `/proc/<pid>/task/*/schedstat`
/// (nanoseconds on CPU); empty where that is not available.
#[derive(Debug, Clone, Copy, Default)]
struct Cpu {
    client: Duration,
    worker: Duration,
    server: Duration,
    other: Duration,
}

/// Each live thread of a process: its name and the CPU time it has used.
fn threads_cpu(process: &str) -> Vec<(String, Duration)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{process}/task")) else {
        return Vec::new();
    };
    let mut threads = Vec::new();
    for task in tasks.flatten() {
        let path = task.path();
        let (Ok(comm), Ok(schedstat)) = (
            std::fs::read_to_string(path.join("comm")),
            std::fs::read_to_string(path.join("schedstat")),
        ) else {
            continue;
        };
        let Some(ns) = schedstat
            .split_whitespace()
            .next()
            .and_then(|ns| ns.parse().ok())
        else {
            continue;
        };
        threads.push((comm.trim().to_owned(), Duration::from_nanos(ns)));
    }
    threads
}

impl Cpu {
    /// `server_pid`: the MCP server's process when it is not this one.
    fn now(server_pid: Option<u32>) -> Cpu {
        let mut cpu = Cpu::default();
        for (comm, used) in threads_cpu("self") {
            if comm.starts_with(CLIENT_THREADS) {
                cpu.client += used;
            } else if comm.starts_with(WORKER_THREADS) {
                cpu.worker += used;
            } else if comm.starts_with(SERVER_THREADS) {
                cpu.server += used;
            } else {
                cpu.other += used;
            }
        }
        if let Some(pid) = server_pid {
            for (_, used) in threads_cpu(&pid.to_string()) {
                cpu.server += used;
            }
        }
        cpu
    }

    fn since(self, earlier: Cpu) -> Cpu {
        Cpu {
            client: self.client.saturating_sub(earlier.client),
            worker: self.worker.saturating_sub(earlier.worker),
            server: self.server.saturating_sub(earlier.server),
            other: self.other.saturating_sub(earlier.other),
        }
    }

    fn add(&mut self, other: Cpu) {
        self.client += other.client;
        self.worker += other.worker;
        self.server += other.server;
        self.other += other.other;
    }

    fn total(self) -> Duration {
        self.client + self.worker + self.server + self.other
    }
}

/// Samples gathered over several rounds, with the time and CPU they took.
#[derive(Default)]
struct Gathered {
    latencies: Vec<Duration>,
    ops: usize,
    elapsed: Duration,
    cpu: Cpu,
}

impl Gathered {
    fn add(&mut self, latencies: Vec<Duration>, elapsed: Duration) {
        self.ops += latencies.len();
        self.latencies.extend(latencies);
        self.elapsed += elapsed;
    }

    /// CPU per operation, by group, in microseconds.
    fn cpu_per_op(&self) -> (f64, f64, f64, f64, f64) {
        let per = |d: Duration| d.as_secs_f64() * 1e6 / self.ops.max(1) as f64;
        let cpu = self.cpu;
        (
            per(cpu.client),
            per(cpu.worker),
            per(cpu.server),
            per(cpu.other),
            per(cpu.total()),
        )
    }

    fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }

    fn samples(self) -> Samples {
        Samples::new(self.latencies)
    }
}

// ---------------------------------------------------------------- report

struct Row {
    metric: String,
    value: String,
    baseline: String,
    ratio: String,
    goal: String,
}

#[derive(Default)]
struct Report {
    rows: Vec<Row>,
}

impl Report {
    fn add(&mut self, metric: impl Into<String>, value: String, baseline: String, ratio: String) {
        self.rows.push(Row {
            metric: metric.into(),
            value,
            baseline,
            ratio,
            goal: String::new(),
        });
    }

    /// A latency row; the ratio is `value / baseline`.
    fn latency(
        &mut self,
        metric: impl Into<String>,
        value: Duration,
        baseline_name: &str,
        baseline: Duration,
    ) -> f64 {
        let ratio = value.as_secs_f64() / baseline.as_secs_f64();
        self.add(
            metric,
            format!("{:.3} ms", ms(value)),
            format!("{baseline_name}: {:.3} ms", ms(baseline)),
            format!("{ratio:.2}×"),
        );
        ratio
    }

    /// A speed-up row; the ratio is `baseline / value` (how many times faster).
    fn speedup(
        &mut self,
        metric: impl Into<String>,
        value: Duration,
        baseline_name: &str,
        baseline: Duration,
    ) -> f64 {
        let ratio = baseline.as_secs_f64() / value.as_secs_f64();
        self.add(
            metric,
            format!("{:.3} ms", ms(value)),
            format!("{baseline_name}: {:.3} ms", ms(baseline)),
            format!("{ratio:.0}× faster"),
        );
        ratio
    }

    /// A throughput row; the ratio is `value / baseline`.
    fn throughput(
        &mut self,
        metric: impl Into<String>,
        value: f64,
        baseline_name: &str,
        baseline: f64,
    ) -> f64 {
        let ratio = value / baseline;
        self.add(
            metric,
            format!("{value:.0} ops/s"),
            format!("{baseline_name}: {baseline:.0} ops/s"),
            format!("{ratio:.2}×"),
        );
        ratio
    }

    /// Marks the last row with a goal and whether it is met.
    fn goal(&mut self, goal: &str, met: bool) {
        if let Some(row) = self.rows.last_mut() {
            row.goal = format!("{goal}: {}", if met { "met" } else { "MISSED" });
        }
    }

    fn print(&self) {
        println!("| metric | value | baseline (same run) | ratio | goal |");
        println!("|---|---:|---|---:|---|");
        for row in &self.rows {
            println!(
                "| {} | {} | {} | {} | {} |",
                row.metric, row.value, row.baseline, row.ratio, row.goal
            );
        }
    }
}

// ---------------------------------------------------------------- set-up

/// The streamable-HTTP MCP server of the API comparison; stopped when
/// dropped.
enum HttpServer {
    /// The testkit server on its own runtime and threads in this process
    /// (like a separate process, but with `TCP_NODELAY` chosen here).
    InProcess {
        url: String,
        shutdown: CancellationToken,
        thread: Option<std::thread::JoinHandle<()>>,
    },
    /// A child process: `quiver-testkit-mcp --transport streamable-http`
    /// or `node <server-everything> streamableHttp` (killed when dropped).
    Child {
        url: String,
        child: tokio::process::Child,
    },
}

impl HttpServer {
    fn url(&self) -> &str {
        match self {
            HttpServer::InProcess { url, .. } | HttpServer::Child { url, .. } => url,
        }
    }

    /// The server's process when it is not this one.
    fn pid(&self) -> Option<u32> {
        match self {
            HttpServer::InProcess { .. } => None,
            HttpServer::Child { child, .. } => child.id(),
        }
    }

    async fn start(kind: ServerKind, subject: &Subject) -> BenchResult<Self> {
        match kind {
            ServerKind::InProcess { nodelay } => HttpServer::in_process(nodelay),
            ServerKind::Binary => HttpServer::binary(subject).await,
            ServerKind::Everything => HttpServer::node(subject).await,
        }
    }

    /// Stops the server and, for a child process, kills and reaps it.
    async fn stop(mut self) {
        if let HttpServer::Child { child, .. } = &mut self
            && let Err(err) = child.kill().await
        {
            eprintln!("cannot kill the HTTP MCP server: {err}");
        }
    }

    /// Serves [`ExampleServer`] like `quiver_testkit::mcp_server::serve_streamable_http`
    /// does, on a runtime of its own (one worker thread per core, as the
    /// binary has), optionally with `TCP_NODELAY` on its sockets.
    fn in_process(nodelay: bool) -> BenchResult<Self> {
        let shutdown = CancellationToken::new();
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = shutdown.clone();
        let thread = std::thread::Builder::new()
            .name(SERVER_THREADS.into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_multi_thread()
                    .thread_name(SERVER_THREADS)
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(err) => {
                        let _ = tx.send(Err(err.to_string()));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::bind(("127.0.0.1", 0)).await {
                        Ok(listener) => listener,
                        Err(err) => {
                            let _ = tx.send(Err(err.to_string()));
                            return;
                        }
                    };
                    let addr = listener.local_addr().map_err(|err| err.to_string());
                    let _ = tx.send(addr.map(|addr| format!("http://{addr}/mcp")));
                    let server = ExampleServer::new(Profile::Full);
                    let config = StreamableHttpServerConfig::default()
                        .disable_allowed_hosts()
                        .with_cancellation_token(stop.child_token());
                    let service: StreamableHttpService<ExampleServer, LocalSessionManager> =
                        StreamableHttpService::new(
                            move || Ok(server.clone()),
                            Arc::new(LocalSessionManager::default()),
                            config,
                        );
                    let router = axum::Router::new().nest_service("/mcp", service);
                    let listener = listener.tap_io(move |tcp| {
                        if nodelay {
                            let _ = tcp.set_nodelay(true);
                        }
                    });
                    let served = axum::serve(listener, router)
                        .with_graceful_shutdown(stop.cancelled_owned())
                        .await;
                    if let Err(err) = served {
                        eprintln!("mcp server stopped with an error: {err}");
                    }
                });
            })?;
        let url = rx.recv_timeout(WAIT)??;
        Ok(HttpServer::InProcess {
            url,
            shutdown,
            thread: Some(thread),
        })
    }

    /// `quiver-testkit-mcp --transport streamable-http --listen
    /// 127.0.0.1:0`, which announces its address on its first stdout line.
    async fn binary(subject: &Subject) -> BenchResult<Self> {
        let mut child = tokio::process::Command::new(&subject.program)
            .args(&subject.http_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let line = tokio::time::timeout(WAIT, lines.next_line())
            .await??
            .ok_or("the HTTP server exited before announcing its address")?;
        let announced: Value = serde_json::from_str(&line)?;
        let url = announced["listening"]
            .as_str()
            .ok_or_else(|| format!("unexpected first line from the HTTP server: {line}"))?
            .to_owned();
        Ok(HttpServer::Child { url, child })
    }

    /// `node <server-everything> streamableHttp` on a free port (`PORT`);
    /// ready once the port accepts connections. It logs every request to
    /// stdout, which goes to /dev/null.
    async fn node(subject: &Subject) -> BenchResult<Self> {
        let port = std::net::TcpListener::bind(("127.0.0.1", 0))?
            .local_addr()?
            .port();
        let mut child = tokio::process::Command::new(&subject.program)
            .args(&subject.http_args)
            .env("PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = child.try_wait()? {
                return Err(format!("the node HTTP server exited: {status}").into());
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("the node HTTP server did not accept on port {port}").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(HttpServer::Child {
            url: format!("http://127.0.0.1:{port}/mcp"),
            child,
        })
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        if let HttpServer::InProcess {
            shutdown, thread, ..
        } = self
        {
            shutdown.cancel();
            if let Some(thread) = thread.take() {
                let _ = thread.join();
            }
        }
    }
}

fn stdio_spec(subject: &Subject, max_concurrency: u32) -> McpServerSpec {
    let mut spec = McpServerSpec::new(STDIO_ID, Transport::Stdio);
    spec.stdio = Some(StdioConfig {
        command: subject.program.display().to_string(),
        args: subject.stdio_args.clone(),
        ..Default::default()
    });
    spec.allowed_tools = vec!["*".into()];
    spec.budgets.max_concurrency = max_concurrency;
    spec
}

fn http_spec(url: &str, max_concurrency: u32) -> McpServerSpec {
    let mut spec = McpServerSpec::new(HTTP_ID, Transport::StreamableHttp);
    spec.http = Some(HttpConfig {
        url: url.to_owned(),
        headers: BTreeMap::new(),
        auth_ref: None,
    });
    spec.allowed_tools = vec!["*".into()];
    spec.budgets.max_concurrency = max_concurrency;
    spec
}

// ---------------------------------------------------------------- one call per path

/// One way of calling `echo`; cheap to clone into concurrent callers.
#[derive(Clone)]
enum Route {
    /// A direct rmcp client on its own warm connection.
    Direct(Peer<RoleClient>, Echo),
    /// `McpPool::call_tool` of the worker's pool.
    Pool(McpPool, Arc<StoredServer>, Echo),
    /// `quiver_worker::call::ToolRunner::call`: catalog, policy, argument
    /// schema check and pool, no HTTP.
    CallTool(SnapshotHandle, ToolRunner, Task, String, Echo),
    /// `Catalog::build` for the name's candidate servers and `resolve`: the
    /// per-call policy work alone (tool lists come from the pool's cache).
    Catalog(SnapshotHandle, ToolRunner, Task, String),
    /// `POST /v1/mcp/tools/call` on the worker.
    WorkerApi(reqwest::Client, reqwest::Url, Arc<Vec<u8>>, Echo),
    /// `GET /healthz` on the worker: an HTTP round trip that does nothing.
    Healthz(reqwest::Client, reqwest::Url),
}

impl Route {
    async fn call(&self) -> BenchResult<()> {
        match self {
            Route::Direct(peer, echo) => echo.check_result(&peer.call_tool(echo.request()).await?),
            Route::Pool(pool, server, echo) => {
                let outcome = pool
                    .call_tool(server, Echo::TOOL, Some(echo.arguments()))
                    .await?;
                echo.check_result(&outcome.result)
            }
            Route::CallTool(snapshot, runner, task, name, echo) => {
                let snapshot = snapshot.current();
                let call = Call {
                    name,
                    arguments: Some(Value::Object(echo.arguments())),
                    lookup: Lookup::Injected {
                        snapshot: &snapshot,
                        session: None,
                    },
                    approval: ApprovalFlow::Refuse,
                };
                let done = runner.call(task, &CallContext::default(), call).await?;
                echo.check_result(&done.outcome.result)
            }
            Route::Catalog(snapshot, runner, task, name) => {
                let candidates = Catalog::candidate_servers(name);
                let catalog = runner
                    .catalog(&snapshot.current(), task, None, None, Some(&candidates))
                    .await;
                if catalog.resolve(name).is_none() {
                    return Err(format!("{name} does not resolve").into());
                }
                Ok(())
            }
            Route::WorkerApi(client, url, body, echo) => {
                let response = client
                    .post(url.clone())
                    .bearer_auth(CALLER_TOKEN)
                    .header("content-type", "application/json")
                    .body(body.as_ref().clone())
                    .send()
                    .await?;
                let status = response.status();
                let bytes = response.bytes().await?;
                if !status.is_success() {
                    return Err(format!(
                        "worker answered {status}: {}",
                        String::from_utf8_lossy(&bytes)
                    )
                    .into());
                }
                // Parsed as a caller would.
                let body: Value = serde_json::from_slice(&bytes)?;
                echo.check(
                    body["is_error"].as_bool(),
                    body["content"][0]["text"].as_str(),
                )
            }
            Route::Healthz(client, url) => {
                let response = client.get(url.clone()).send().await?;
                let status = response.status();
                response.bytes().await?;
                if !status.is_success() {
                    return Err(format!("/healthz answered {status}").into());
                }
                Ok(())
            }
        }
    }
}

/// `count` sequential calls; per-call latencies and the wall time.
async fn sequential(path: &Route, count: usize) -> BenchResult<(Vec<Duration>, Duration)> {
    let mut latencies = Vec::with_capacity(count);
    let started = Instant::now();
    for _ in 0..count {
        let t0 = Instant::now();
        path.call().await?;
        latencies.push(t0.elapsed());
    }
    Ok((latencies, started.elapsed()))
}

/// `count` calls spread over `callers` concurrent callers.
async fn concurrent(
    path: &Route,
    callers: usize,
    count: usize,
) -> BenchResult<(Vec<Duration>, Duration)> {
    let per_caller = count.div_ceil(callers);
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for _ in 0..callers {
        let path = path.clone();
        tasks.spawn(async move { sequential(&path, per_caller).await });
    }
    let mut latencies = Vec::with_capacity(per_caller * callers);
    while let Some(joined) = tasks.join_next().await {
        latencies.extend(joined??.0);
    }
    Ok((latencies, started.elapsed()))
}

/// Runs every path's phase in `rounds` alternating rounds of `count /
/// rounds` operations and gathers each path's samples (`server_pid`: the MCP
/// server's process, when it is a child, for the CPU accounting).
async fn alternate<'a, F, Fut>(
    routes: &'a [(&'static str, Route)],
    server_pid: Option<u32>,
    rounds: usize,
    count: usize,
    phase: F,
) -> BenchResult<Vec<Gathered>>
where
    F: Fn(&'a Route, usize) -> Fut,
    Fut: Future<Output = BenchResult<(Vec<Duration>, Duration)>>,
{
    let mut gathered: Vec<Gathered> = routes.iter().map(|_| Gathered::default()).collect();
    let per_round = count.div_ceil(rounds);
    for _ in 0..rounds {
        for ((_, path), gathered) in routes.iter().zip(&mut gathered) {
            let before = Cpu::now(server_pid);
            let (latencies, elapsed) = phase(path, per_round).await?;
            gathered.cpu.add(Cpu::now(server_pid).since(before));
            gathered.add(latencies, elapsed);
        }
    }
    Ok(gathered)
}

// ---------------------------------------------------------------- 1. spawn per call

/// The command the worker's pool runs for a stdio record: the same program,
/// arguments, working directory and (minimal) environment.
fn stdio_command(launch: &StdioLaunch) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(&launch.command);
    command.args(&launch.args).env_clear().envs(&launch.env);
    if let Some(cwd) = &launch.cwd {
        command.current_dir(cwd);
    }
    command
}

/// One call the way a pool-less system makes it: spawn, initialize, call,
/// close. Returns the time to the result and the time to a reaped child.
async fn spawn_per_call(launch: &StdioLaunch, echo: Echo) -> BenchResult<(Duration, Duration)> {
    let t0 = Instant::now();
    let (transport, _stderr) = TokioChildProcess::builder(stdio_command(launch))
        .stderr(Stdio::null())
        .spawn()?;
    let service: RunningService<RoleClient, ()> = ().serve(transport).await?;
    let result = service.peer().call_tool(echo.request()).await?;
    let answered = t0.elapsed();
    echo.check_result(&result)?;
    service.cancel().await?;
    Ok((answered, t0.elapsed()))
}

async fn bench_spawn(
    config: Config,
    echo: Echo,
    stack: &Stack,
    report: &mut Report,
) -> BenchResult<()> {
    let server = stack.server(STDIO_ID)?;
    // Spawned exactly as the pool spawns the record's server.
    let Launch::Stdio(launch) = quiver_mcp::launch::launch(&server.spec, &process_env())? else {
        return Err(format!("{STDIO_ID} is not a stdio record").into());
    };
    let http = reqwest::Client::new();
    let injected = quiver_model::naming::injected_name(STDIO_ID, Echo::TOOL)?;
    let body = echo.api_body(&injected)?;
    let pooled = Route::Pool(stack.pool.clone(), server, echo);
    // A direct rmcp client on its own warm child: the stdio round trip alone.
    let (transport, _stderr) = TokioChildProcess::builder(stdio_command(&launch))
        .stderr(Stdio::null())
        .spawn()?;
    let direct_service: RunningService<RoleClient, ()> =
        tokio::time::timeout(WAIT, ().serve(transport)).await??;
    let direct = Route::Direct(direct_service.peer().clone(), echo);
    let api = Route::WorkerApi(
        http,
        reqwest::Url::parse(&format!("{}/v1/mcp/tools/call", stack.worker_url))?,
        body,
        echo,
    );

    eprintln!("[1] warm-up");
    for _ in 0..config.warmup.min(10) {
        spawn_per_call(&launch, echo).await?;
    }
    sequential(&pooled, config.warmup).await?;
    sequential(&api, config.warmup).await?;
    sequential(&direct, config.warmup).await?;

    eprintln!(
        "[1] spawn-per-call ×{} vs pooled ×{}",
        config.spawns, config.calls
    );
    let mut answered = Vec::with_capacity(config.spawns);
    let mut closed = Vec::with_capacity(config.spawns);
    let mut pool = Gathered::default();
    let mut worker = Gathered::default();
    let mut raw = Gathered::default();
    let spawns_per_round = config.spawns.div_ceil(config.rounds);
    let calls_per_round = config.calls.div_ceil(config.rounds);
    for _ in 0..config.rounds {
        for _ in 0..spawns_per_round {
            let (a, c) = spawn_per_call(&launch, echo).await?;
            answered.push(a);
            closed.push(c);
        }
        let (latencies, elapsed) = sequential(&pooled, calls_per_round).await?;
        pool.add(latencies, elapsed);
        let (latencies, elapsed) = sequential(&api, calls_per_round).await?;
        worker.add(latencies, elapsed);
        let (latencies, elapsed) = sequential(&direct, calls_per_round).await?;
        raw.add(latencies, elapsed);
    }
    direct_service.cancel().await?;
    let answered = Samples::new(answered);
    let closed = Samples::new(closed);
    let pool = pool.samples();
    let worker = worker.samples();
    let raw = raw.samples();

    let ratio = report.speedup(
        "stdio: pooled call (McpPool) p50",
        pool.p50(),
        "spawn+init+call+close p50",
        closed.p50(),
    );
    report.goal("≥ 100×", ratio >= 100.0);
    let ratio = report.speedup(
        "stdio: pooled call (McpPool) mean",
        pool.mean(),
        "spawn+init+call+close mean",
        closed.mean(),
    );
    report.goal("≥ 100×", ratio >= 100.0);
    let ratio = report.speedup(
        "stdio: pooled call (McpPool) p50",
        pool.p50(),
        "spawn+init+call, to the result, p50",
        answered.p50(),
    );
    report.goal("≥ 100×", ratio >= 100.0);
    report.speedup(
        "stdio: worker tool API (HTTP) p50",
        worker.p50(),
        "spawn+init+call+close p50",
        closed.p50(),
    );
    report.speedup(
        "stdio: worker tool API (HTTP) mean",
        worker.mean(),
        "spawn+init+call+close mean",
        closed.mean(),
    );
    report.latency(
        "stdio: pooled call (McpPool) p50",
        pool.p50(),
        "direct rmcp stdio client, warm, p50",
        raw.p50(),
    );
    report.latency(
        "stdio: pooled call (McpPool) p99",
        pool.p99(),
        "spawn+init+call+close p99",
        closed.p99(),
    );
    Ok(())
}

// ---------------------------------------------------------------- 2. worker API vs direct

async fn bench_api(
    config: Config,
    echo: Echo,
    stack: &Stack,
    http_server: &HttpServer,
    report: &mut Report,
) -> BenchResult<()> {
    let server = stack.server(HTTP_ID)?;
    let injected = quiver_model::naming::injected_name(HTTP_ID, Echo::TOOL)?;

    // The worker lists the tool under its injected name.
    let http = reqwest::Client::new();
    let listed: Value = http
        .get(format!(
            "{}/v1/mcp/tools?server_ids={HTTP_ID}",
            stack.worker_url
        ))
        .bearer_auth(CALLER_TOKEN)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    if !listed
        .as_array()
        .is_some_and(|tools| tools.iter().any(|t| t["name"] == injected.as_str()))
    {
        return Err(format!("GET /v1/mcp/tools does not list {injected}: {listed}").into());
    }

    // Baseline: a direct rmcp client with room for every concurrent caller.
    let mut transport_config =
        StreamableHttpClientTransportConfig::with_uri(http_server.url().to_owned());
    transport_config.max_concurrent_requests = config.concurrency;
    let transport =
        StreamableHttpClientTransport::with_client(reqwest::Client::new(), transport_config);
    let direct_service: RunningService<RoleClient, ()> =
        tokio::time::timeout(WAIT, ().serve(transport)).await??;

    let body = echo.api_body(&injected)?;
    let task = Task {
        name: "default".into(),
        policy: Arc::new(CompiledTaskPolicy::unrestricted()),
    };
    let direct = Route::Direct(direct_service.peer().clone(), echo);
    let api = Route::WorkerApi(
        http.clone(),
        reqwest::Url::parse(&format!("{}/v1/mcp/tools/call", stack.worker_url))?,
        body,
        echo,
    );
    let pool = Route::Pool(stack.pool.clone(), server, echo);
    let catalog = Route::Catalog(
        stack.snapshot.clone(),
        ToolRunner::new(
            stack.pool.clone(),
            AuditOptions::default(),
            DEFAULT_CATALOG_WAIT,
        ),
        task.clone(),
        injected.clone(),
    );
    let call_path = Route::CallTool(
        stack.snapshot.clone(),
        ToolRunner::new(
            stack.pool.clone(),
            AuditOptions::default(),
            DEFAULT_CATALOG_WAIT,
        ),
        task,
        injected,
        echo,
    );
    let healthz = Route::Healthz(
        http,
        reqwest::Url::parse(&format!("{}/healthz", stack.worker_url))?,
    );

    eprintln!("[2] warm-up");
    for path in [&direct, &api, &pool, &catalog, &call_path, &healthz] {
        sequential(path, config.warmup).await?;
        concurrent(
            path,
            config.concurrency,
            config.warmup.max(config.concurrency),
        )
        .await?;
    }

    eprintln!("[2] sequential, {} calls per route", config.calls);
    let routes = [
        ("direct", direct.clone()),
        ("worker", api.clone()),
        ("pool", pool),
        ("catalog", catalog),
        ("call_path", call_path),
        ("healthz", healthz),
    ];
    let server_pid = http_server.pid();
    let seq = alternate(&routes, server_pid, config.rounds, config.calls, sequential).await?;
    let [s_direct, s_api, s_pool, s_catalog, s_call, s_healthz] =
        <[Gathered; 6]>::try_from(seq).map_err(|_| "one result per path")?;

    let callers = config.concurrency;
    eprintln!(
        "[2] {callers} concurrent callers, {} calls per route",
        config.concurrent_calls
    );
    let routes = [("direct", direct), ("worker", api)];
    let conc = alternate(
        &routes,
        server_pid,
        config.rounds,
        config.concurrent_calls,
        |path, n| concurrent(path, callers, n),
    )
    .await?;
    let [c_direct, c_api] = <[Gathered; 2]>::try_from(conc).map_err(|_| "one result per path")?;

    let (seq_direct_rate, seq_api_rate) = (s_direct.ops_per_sec(), s_api.ops_per_sec());
    let (c_direct_rate, c_api_rate) = (c_direct.ops_per_sec(), c_api.ops_per_sec());
    let s_cpu = (s_api.cpu_per_op(), s_direct.cpu_per_op());
    let c_cpu = (c_api.cpu_per_op(), c_direct.cpu_per_op());
    let [s_direct, s_api, s_pool, s_catalog, s_call, s_healthz] =
        [s_direct, s_api, s_pool, s_catalog, s_call, s_healthz].map(Gathered::samples);
    let [c_direct, c_api] = [c_direct, c_api].map(Gathered::samples);

    let ratio = report.latency(
        "http: worker tool API p50, 1 caller",
        s_api.p50(),
        "direct rmcp p50",
        s_direct.p50(),
    );
    report.goal("≤ 1.25×", ratio <= 1.25);
    report.latency(
        "http: worker tool API mean, 1 caller",
        s_api.mean(),
        "direct rmcp mean",
        s_direct.mean(),
    );
    report.latency(
        "http: worker tool API p99, 1 caller",
        s_api.p99(),
        "direct rmcp p99",
        s_direct.p99(),
    );
    report.throughput(
        "http: worker tool API throughput, 1 caller",
        seq_api_rate,
        "direct rmcp",
        seq_direct_rate,
    );
    let ratio = report.throughput(
        format!("http: worker tool API throughput, {callers} callers"),
        c_api_rate,
        &format!("direct rmcp, {callers} callers"),
        c_direct_rate,
    );
    report.goal("≥ 0.7×", ratio >= 0.7);
    report.latency(
        format!("http: worker tool API p50, {callers} callers"),
        c_api.p50(),
        &format!("direct rmcp p50, {callers} callers"),
        c_direct.p50(),
    );
    report.latency(
        format!("http: worker tool API p99, {callers} callers"),
        c_api.p99(),
        &format!("direct rmcp p99, {callers} callers"),
        c_direct.p99(),
    );
    type PerOp = (f64, f64, f64, f64, f64);
    let cpu_row = |report: &mut Report, label: String, (worker, direct): (PerOp, PerOp)| {
        let (wc, ww, ws, wo, wt) = worker;
        let (dc, _, ds, do_, dt) = direct;
        report.add(
            label,
            format!("{wt:.0} µs (callers {wc:.0}, worker {ww:.0}, server {ws:.0}, other {wo:.0})"),
            format!("direct: {dt:.0} µs (callers {dc:.0}, server {ds:.0}, other {do_:.0})"),
            format!("{:.2}×", wt / dt),
        );
    };
    cpu_row(report, "CPU per call, 1 caller".into(), s_cpu);
    cpu_row(report, format!("CPU per call, {callers} callers"), c_cpu);
    // Where the worker's time goes (1 caller, p50).
    report.latency(
        "layer: McpPool::call_tool p50",
        s_pool.p50(),
        "direct rmcp p50",
        s_direct.p50(),
    );
    report.latency(
        "layer: ToolRunner::call (catalog, policy, schema, pool) p50",
        s_call.p50(),
        "direct rmcp p50",
        s_direct.p50(),
    );
    report.latency(
        "layer: Catalog::build + resolve p50 (no I/O)",
        s_catalog.p50(),
        "direct rmcp p50",
        s_direct.p50(),
    );
    report.latency(
        "layer: worker GET /healthz p50 (HTTP hop alone)",
        s_healthz.p50(),
        "direct rmcp p50",
        s_direct.p50(),
    );
    let overhead = s_api.p50().saturating_sub(s_direct.p50());
    let hop_and_call = s_call.p50() + s_healthz.p50();
    report.add(
        "worker API p50 − direct p50",
        format!("{:.3} ms", ms(overhead)),
        format!(
            "pool {:.3} ms + call path above the pool {:.3} ms (catalog {:.3} ms) + HTTP hop {:.3} ms + rest {:.3} ms",
            ms(s_pool.p50().saturating_sub(s_direct.p50())),
            ms(s_call.p50().saturating_sub(s_pool.p50())),
            ms(s_catalog.p50()),
            ms(s_healthz.p50()),
            ms(s_api.p50().saturating_sub(hop_and_call)),
        ),
        "—".into(),
    );

    direct_service.cancel().await?;
    Ok(())
}

fn main() -> BenchResult<()> {
    let config = Config::from_env();
    let subject = Subject::new(&config)?;
    // Callers, worker (with the registry) and the in-process MCP server each
    // get a runtime of their own, as they would be separate processes; their
    // threads are named so the CPU each one uses can be told apart.
    let worker_runtime = tokio::runtime::Builder::new_multi_thread()
        .thread_name(WORKER_THREADS)
        .enable_all()
        .build()?;
    let client_runtime = tokio::runtime::Builder::new_multi_thread()
        .thread_name(CLIENT_THREADS)
        .enable_all()
        .build()?;
    let started = Instant::now();
    let mut report = Report::default();
    let http_server = client_runtime.block_on(HttpServer::start(config.http_server, &subject))?;
    let max_concurrency = config.concurrency.max(64) as u32;
    let stack = worker_runtime.block_on(Stack::start(
        vec![
            stdio_spec(&subject, max_concurrency),
            http_spec(http_server.url(), max_concurrency),
        ],
        None,
    ));
    let stack = match stack {
        Ok(stack) => stack,
        Err(err) => {
            client_runtime.block_on(http_server.stop());
            return Err(err);
        }
    };
    let outcome = client_runtime.block_on(async {
        bench_spawn(config, subject.echo, &stack, &mut report).await?;
        bench_api(config, subject.echo, &stack, &http_server, &mut report).await
    });
    // Stopped on failure too: no server process outlives the benchmark.
    worker_runtime.block_on(stack.stop());
    client_runtime.block_on(http_server.stop());
    outcome?;
    println!(
        "\nquiver worker benchmark against {}: {} spawn-per-call samples, {} sequential calls per route, {} concurrent callers × {} calls, {} rounds, {} warm-up calls; HTTP server {}; {} cores; {:.1} s",
        subject.about,
        config.spawns,
        config.calls,
        config.concurrency,
        config.concurrent_calls,
        config.rounds,
        config.warmup,
        config.http_server.describe(),
        std::thread::available_parallelism().map_or(0, usize::from),
        started.elapsed().as_secs_f64(),
    );
    println!();
    report.print();
    Ok(())
}
