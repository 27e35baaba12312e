//! Hostile peers at the listeners (issue #10, items 1 and 7), against real
//! `quiver registry` and `quiver worker` processes:
//!
//! - thousands of half-open connections (a request head that never ends, an
//!   HTTP/2 preface cut short) against a small connection cap and a low
//!   descriptor limit: health, an authorised tool listing and a gRPC call
//!   still answer within 1 s, the listeners shed (counted in metrics), and
//!   the memory the connections held is given back once they close;
//! - a silent connection is closed by the header-read timeout, an idle
//!   keep-alive one by the idle timeout, on every listener;
//! - the official Python `grpcio-reflection` client (which speaks only
//!   `grpc.reflection.v1alpha`) lists the registry's services and resolves
//!   `quiver.registry.v1.McpRegistryService`.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use quiver_proto::v1 as pb;
use serde_json::Value;
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::harness::{RegistryProcess, WorkerProcess, eventually, metric_sum};
use crate::worker::{ADMIN, CALLER, WORKER};

/// The connection cap of every listener in the flood test.
const CAP: usize = 200;
/// The descriptor limit the flooded processes run with (soft and hard):
/// without a cap, a few thousand connections exhaust it.
const FD_LIMIT: u64 = 1024;
/// Half-open connections sent to the worker's HTTP listener.
const WORKER_FLOOD: usize = 3000;
/// Half-open connections sent to each of the registry's listeners.
const REGISTRY_FLOOD: usize = 1000;
/// What a connected client may take to be answered while the flood is held.
const ANSWER_WITHIN: Duration = Duration::from_secs(1);
/// How long one flood connection may take to connect and send its bytes.
const CONNECT_WAIT: Duration = Duration::from_secs(2);
/// Growth of resident memory, after the flood closed, counted as "back
/// near baseline".
const RSS_SLACK_KB: u64 = 8 * 1024;
/// How long the memory may take to get back near baseline once the
/// connections closed: jemalloc's `dirty_decay_ms` (1 s) and a margin.
const MEMORY_RETURN_WITHIN: Duration = Duration::from_secs(4);

/// An HTTP/1 request head that never ends (no blank line).
const HALF_HEAD: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: x\r\n";
/// The first half of the HTTP/2 connection preface.
const HALF_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n";

/// A SQLite registry started with `extra` flags, and its directory.
async fn registry(extra: &[&str]) -> (RegistryProcess, TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let db_url = format!("sqlite://{}", dir.path().join("quiver.db").display());
    let mut args = vec![
        "--database-url",
        db_url.as_str(),
        "--admin-token",
        ADMIN,
        "--worker-token",
        WORKER,
    ];
    args.extend_from_slice(extra);
    (RegistryProcess::start(&args).await, dir)
}

/// The socket address of an `http://host:port` URL.
fn addr_of(url: &str) -> SocketAddr {
    url.strip_prefix("http://")
        .and_then(|addr| addr.parse().ok())
        .unwrap_or_else(|| panic!("not an http://ip:port url: {url}"))
}

/// Lowers the descriptor limit (soft and hard) of a running process.
fn limit_descriptors(pid: nix::unistd::Pid, limit: u64) {
    let status = std::process::Command::new("prlimit")
        .args([
            "--pid",
            &pid.to_string(),
            &format!("--nofile={limit}:{limit}"),
        ])
        .status()
        .expect("run prlimit (util-linux)");
    assert!(status.success(), "prlimit --pid {pid}: {status}");
}

/// Makes room in this test process for the flood's client sockets.
fn raise_own_descriptor_limit(needed: u64) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    assert!(
        hard >= needed,
        "the flood needs {needed} descriptors in the test process; hard limit is {hard}"
    );
    if soft < needed {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).expect("setrlimit");
    }
}

/// Resident memory of `pid`, in KiB.
fn rss_kib(pid: nix::unistd::Pid) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS line")
}

/// Opens `count` connections to `addr` at once, each sending `bytes` and
/// then nothing; returns the ones that connected within [`CONNECT_WAIT`].
async fn half_open(addr: SocketAddr, count: usize, bytes: &'static [u8]) -> Vec<TcpStream> {
    let mut connecting = JoinSet::new();
    for _ in 0..count {
        connecting.spawn(async move {
            tokio::time::timeout(CONNECT_WAIT, async {
                let mut stream = TcpStream::connect(addr).await.ok()?;
                stream.write_all(bytes).await.ok()?;
                Some(stream)
            })
            .await
            .ok()
            .flatten()
        });
    }
    let mut open = Vec::with_capacity(count);
    while let Some(joined) = connecting.join_next().await {
        open.extend(joined.expect("connect task"));
    }
    open
}

/// Runs `request` on a new connection and fails the test unless it
/// succeeds within [`ANSWER_WITHIN`]; returns how long it took.
async fn answered<F, Fut>(what: &str, request: F) -> Duration
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let started = Instant::now();
    match tokio::time::timeout(ANSWER_WITHIN, request()).await {
        Ok(Ok(())) => started.elapsed(),
        Ok(Err(err)) => panic!("{what} failed during the flood: {err}"),
        Err(_) => panic!("{what} not answered within {ANSWER_WITHIN:?} during the flood"),
    }
}

/// `GET url` on a connection of its own (optionally with a bearer token);
/// succeeds on 200.
async fn get_ok(url: String, token: Option<&str>) -> Result<(), String> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .map_err(|err| err.to_string())?;
    let mut request = client.get(&url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request
        .send()
        .await
        .map_err(|err| format!("{url}: {err}"))?;
    let status = response.status();
    response.bytes().await.map_err(|err| err.to_string())?;
    match status {
        reqwest::StatusCode::OK => Ok(()),
        status => Err(format!("{url}: {status}")),
    }
}

/// `ListMcpServers` on a new gRPC channel with the worker token.
async fn list_servers(grpc_url: String) -> Result<(), String> {
    let channel = tonic::transport::Channel::from_shared(grpc_url)
        .map_err(|err| err.to_string())?
        .connect()
        .await
        .map_err(|err| format!("connect: {err}"))?;
    quiver_proto::credentials::Credentials::new(Some(WORKER), None)
        .map_err(|err| err.to_string())?
        .client(channel)
        .list_mcp_servers(pb::ListMcpServersRequest {})
        .await
        .map(drop)
        .map_err(|status| format!("ListMcpServers: {status}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_flood_is_shed_while_health_and_calls_answer_and_memory_returns() {
    raise_own_descriptor_limit((WORKER_FLOOD + 2 * REGISTRY_FLOOD + 256) as u64);
    let cap = CAP.to_string();
    let listener_flags = ["--max-connections", cap.as_str()];
    let (registry, _dir) = registry(&listener_flags).await;
    let worker = WorkerProcess::start(&registry.grpc_url(), WORKER, CALLER, &listener_flags).await;
    limit_descriptors(registry.pid(), FD_LIMIT);
    limit_descriptors(worker.pid(), FD_LIMIT);

    let worker_url = worker.url();
    let registry_http = registry.http_url();
    let grpc_url = registry.grpc_url();
    let checks = || async {
        [
            answered("worker GET /healthz", || {
                get_ok(format!("{worker_url}/healthz"), None)
            })
            .await,
            answered("worker GET /v1/mcp/tools (caller token)", || {
                get_ok(format!("{worker_url}/v1/mcp/tools"), Some(CALLER))
            })
            .await,
            answered("registry GET /healthz", || {
                get_ok(format!("{registry_http}/healthz"), None)
            })
            .await,
            answered("registry ListMcpServers (gRPC)", || {
                list_servers(grpc_url.clone())
            })
            .await,
        ]
    };
    // Warm both processes up (allocator arenas, lazy statics) before the
    // baseline is taken.
    for _ in 0..5 {
        checks().await;
    }
    let baseline = (rss_kib(worker.pid()), rss_kib(registry.pid()));

    let started = Instant::now();
    let (to_worker, to_registry_http, to_registry_grpc) = tokio::join!(
        half_open(addr_of(&worker.url()), WORKER_FLOOD, HALF_HEAD),
        half_open(addr_of(&registry.http_url()), REGISTRY_FLOOD, HALF_HEAD),
        half_open(registry.grpc_addr(), REGISTRY_FLOOD, HALF_PREFACE),
    );
    eprintln!(
        "flood: {} + {} + {} half-open connections in {:?}",
        to_worker.len(),
        to_registry_http.len(),
        to_registry_grpc.len(),
        started.elapsed()
    );
    let mut slowest = [Duration::ZERO; 4];
    for _ in 0..3 {
        for (slowest, took) in slowest.iter_mut().zip(checks().await) {
            *slowest = (*slowest).max(took);
        }
    }
    let during = (rss_kib(worker.pid()), rss_kib(registry.pid()));
    eprintln!(
        "slowest answers during the flood (worker healthz, worker tools, registry healthz, registry grpc): {slowest:?}"
    );

    let worker_metrics = format!("{worker_url}/metrics");
    let registry_metrics = format!("{registry_http}/metrics");
    for (url, listener) in [
        (&worker_metrics, "worker_http"),
        (&registry_metrics, "registry_http"),
        (&registry_metrics, "registry_grpc"),
    ] {
        let listener_label = format!(r#"listener="{listener}""#);
        let evicted = metric_sum(
            url,
            "http_connections_shed_total",
            &[&listener_label, r#"reason="evicted""#],
        )
        .await;
        let open = metric_sum(url, "http_connections_open", &[&listener_label]).await;
        eprintln!("{listener}: {evicted} evicted, {open} open");
        assert!(evicted > 0.0, "{listener}: no connection was shed");
        assert!(
            open <= CAP as f64,
            "{listener}: {open} connections open over the cap of {CAP}"
        );
    }

    drop((to_worker, to_registry_http, to_registry_grpc));
    for (url, listener) in [
        (&worker_metrics, "worker_http"),
        (&registry_metrics, "registry_http"),
        (&registry_metrics, "registry_grpc"),
    ] {
        let listener_label = format!(r#"listener="{listener}""#);
        eventually(
            Duration::from_secs(5),
            &format!("{listener} connections closed"),
            || async {
                let open = metric_sum(url, "http_connections_open", &[&listener_label]).await;
                (open <= 2.0).then_some(())
            },
        )
        .await;
    }
    // The binary's allocator (jemalloc, background threads) gives freed
    // pages back to the OS over its decay time (`dirty_decay_ms`, 1 s, set
    // in .cargo/config.toml).
    let closed = Instant::now();
    let mut after = (0, 0);
    let returned = tokio::time::timeout(MEMORY_RETURN_WITHIN, async {
        loop {
            after = (rss_kib(worker.pid()), rss_kib(registry.pid()));
            if after.0 <= baseline.0 + RSS_SLACK_KB && after.1 <= baseline.1 + RSS_SLACK_KB {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    eprintln!(
        "RSS KiB (worker, registry): before {baseline:?}, during {during:?}, after {after:?} ({:.1?} after the connections closed)",
        closed.elapsed()
    );
    assert!(
        returned.is_ok(),
        "memory not given back within {MEMORY_RETURN_WITHIN:?}: before {baseline:?} KiB, during {during:?}, after {after:?}"
    );
}

/// Reads from `stream` until the peer closes it; how long that took (fails
/// the test after `limit`).
async fn closed_within(what: &str, stream: &mut TcpStream, limit: Duration) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "{what}: still open after {limit:?}");
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_idle_connections_are_closed_on_every_listener() {
    let timeouts = [
        "--header-read-timeout-ms",
        "500",
        "--connection-idle-timeout-ms",
        "1000",
    ];
    let (registry, _dir) = registry(&timeouts).await;
    let worker = WorkerProcess::start(&registry.grpc_url(), WORKER, CALLER, &timeouts).await;
    let limit = Duration::from_secs(3);

    let mut silent_worker = TcpStream::connect(addr_of(&worker.url())).await.unwrap();
    let mut half_head = TcpStream::connect(addr_of(&registry.http_url()))
        .await
        .unwrap();
    half_head.write_all(HALF_HEAD).await.unwrap();
    let mut no_preface = TcpStream::connect(registry.grpc_addr()).await.unwrap();
    let mut idle = TcpStream::connect(addr_of(&worker.url())).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = [0u8; 12];
    idle.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200");

    let (silent, half, preface, idle) = tokio::join!(
        closed_within(
            "worker: connection sending nothing",
            &mut silent_worker,
            limit
        ),
        closed_within("registry http: unfinished head", &mut half_head, limit),
        closed_within("registry grpc: no HTTP/2 preface", &mut no_preface, limit),
        closed_within("worker: idle keep-alive connection", &mut idle, limit),
    );
    eprintln!(
        "closed after: silent {silent:?}, half head {half:?}, no preface {preface:?}, idle {idle:?}"
    );
    assert!(
        idle >= Duration::from_millis(900),
        "idle connection closed early: {idle:?}"
    );
}

/// The interpreter of the Python venv with `grpcio-reflection`; fails the
/// test when it is not set up.
fn reflection_python() -> String {
    let python = std::env::var("QUIVER_TEST_PYTHON").unwrap_or_default();
    assert!(
        !python.is_empty() && Path::new(&python).is_file(),
        "QUIVER_TEST_PYTHON={python:?} must name a python with grpcio-reflection installed; \
         run the suite with scripts/test.sh (it creates target/pyenv), or export \
         QUIVER_TEST_PYTHON=$PWD/target/pyenv/bin/python"
    );
    python
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_grpc_reflection_resolves_the_registry_service() {
    let python = reflection_python();
    let (registry, _dir) = registry(&[]).await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/e2e/reflection_client.py");
    let mut command = tokio::process::Command::new(python);
    command
        .arg(&script)
        .arg(registry.grpc_addr().to_string())
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .env_remove("grpc_proxy")
        .env("no_grpc_proxy", "*")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(30), command.output())
        .await
        .expect("reflection client finished within 30 s")
        .expect("run the reflection client");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "python reflection client failed ({}):\n{}\n{stdout}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    let services: Vec<&str> = report["services"]
        .as_array()
        .expect("services")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for service in [
        "quiver.registry.v1.McpRegistryService",
        "grpc.health.v1.Health",
    ] {
        assert!(
            services.contains(&service),
            "{service} not listed: {services:?}"
        );
    }
    let methods: Vec<&str> = report["methods"]
        .as_array()
        .expect("methods")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for method in ["ListMcpServers", "WatchMcpServers", "UpsertMcpServer"] {
        assert!(
            methods.contains(&method),
            "{method} not resolved: {methods:?}"
        );
    }
    assert_eq!(
        report["list_request_fields"], 0,
        "ListMcpServersRequest is resolved as an empty message: {report}"
    );
}
