//! Servers that misbehave while calls are in flight (issue #10.5, #10.6,
//! #10.12), with real `quiver` processes and the peers of
//! `tests/e2e/peers/` run by `QUIVER_TEST_PYTHON` (the official Python SDK
//! `mcp` 2.x, or plain JSON-RPC where no SDK would misbehave so):
//!
//! - `max_concurrency` holds as the server sees it while calls time out,
//!   against a server that honours cancellation (SDK) and one that keeps
//!   working and answers anyway;
//! - a server flooding log notifications and garbage lines leaves the
//!   worker's log small and the worker responsive;
//! - a stdio server's `setsid` grandchild ends with the worker.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{
    ADMIN, Admin, CALLER, WORKER, WorkerProcess, eventually, injected, metric_sum, peer,
    quiver_command, registry, sqlite,
};
use crate::openai_sdk::sdk_python;

/// A stdio record of `command args` allowing every tool, with `budgets`.
fn record(server_id: &str, command: &str, args: &[&str], budgets: Value) -> Value {
    json!({
        "server_id": server_id,
        "transport": "stdio",
        "stdio": {"command": command, "args": args},
        "allowed_tools": ["*"],
        "budgets": budgets,
    })
}

/// The most calls any process of a peer worked on at once (each process
/// writes `<max> <now>` to `<dir>/<pid>`), and how many processes ran.
fn peer_concurrency(dir: &Path) -> (u64, usize) {
    let mut max = 0;
    let mut processes = 0;
    for entry in std::fs::read_dir(dir).expect("stats dir") {
        let path = entry.expect("stats entry").path();
        if path.extension().is_some() {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let seen: u64 = text
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        max = max.max(seen);
        processes += 1;
    }
    (max, processes)
}

/// Callers per server in the concurrency test.
const CALLERS: usize = 30;
/// How long they keep calling.
const HAMMER: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_concurrency_holds_as_the_server_sees_it_when_calls_time_out() {
    let python = sdk_python();
    let (_db, db_url) = sqlite();
    let registry = registry(&db_url, None).await;
    let stats = tempfile::tempdir().expect("stats dir");
    let budgets = json!({"max_concurrency": 3, "tool_timeout_ms": 300});
    let servers = [
        ("honouring", "cancel_honouring.py"),
        ("ignoring", "cancel_ignoring.py"),
    ];
    let admin = Admin::new(&registry, ADMIN);
    for (server_id, script) in servers {
        let dir = stats.path().join(server_id);
        std::fs::create_dir(&dir).expect("stats dir");
        let args = [peer(script), dir.display().to_string()];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        admin
            .upsert(record(server_id, &python, &args, budgets.clone()))
            .await;
    }
    let worker = WorkerProcess::start(&registry.grpc_url(), WORKER, CALLER, &[] as &[&str]).await;
    eventually(Duration::from_secs(15), "both peers listed", || async {
        (worker.tools().await.len() == 2).then_some(())
    })
    .await;

    // Every caller calls 2 s of work in a 300 ms budget, again and again.
    let started = Instant::now();
    let callers = servers.iter().flat_map(|(server_id, _)| {
        let worker = &worker;
        (0..CALLERS).map(move |_| async move {
            let mut codes = Vec::new();
            while started.elapsed() < HAMMER {
                let (_, body) = worker
                    .call(&injected(server_id, "work"), json!({"seconds": 2}))
                    .await;
                codes.push(body["error"]["code"].as_str().unwrap_or("ok").to_owned());
            }
            (*server_id, codes)
        })
    });
    let outcomes = futures::future::join_all(callers).await;
    // Abandoned calls end within 2 s of work (or cancel_grace) after the last.
    tokio::time::sleep(Duration::from_millis(2500)).await;

    for (server_id, _) in servers {
        let codes: Vec<&String> = outcomes
            .iter()
            .filter(|(id, _)| *id == server_id)
            .flat_map(|(_, codes)| codes)
            .collect();
        let timeouts = codes.iter().filter(|c| c.as_str() == "mcp_timeout").count();
        let (max, processes) = peer_concurrency(&stats.path().join(server_id));
        let recycled = metric_sum(
            &format!("{}/metrics", worker.url()),
            "mcp_connection_recycled_total",
            &[&format!("server_id=\"{server_id}\"")],
        )
        .await;
        eprintln!(
            "{server_id}: {} calls by {CALLERS} callers in {HAMMER:?} ({timeouts} mcp_timeout), \
             server saw at most {max} at once (max_concurrency 3), {processes} process(es), \
             {recycled} recycle(s)",
            codes.len()
        );
        assert!(timeouts >= 3, "{server_id}: calls time out: {codes:?}");
        assert!(
            codes
                .iter()
                .all(|c| ["mcp_timeout", "mcp_unavailable"].contains(&c.as_str())),
            "{server_id}: {codes:?}"
        );
        assert!(
            max <= 3,
            "{server_id}: the server worked on {max} calls at once"
        );
        if server_id == "honouring" {
            // It never answers a cancelled call: its connection is recycled.
            assert!(recycled >= 1.0, "honouring: {recycled} recycles");
        }
        // The server serves again (a recycled one once it has restarted:
        // connecting counts against the 300 ms budget, so the first call
        // may time out while the SDK starts).
        eventually(Duration::from_secs(10), "server serves again", || async {
            let (status, _) = worker
                .call(&injected(server_id, "work"), json!({"seconds": 0.01}))
                .await;
            (status == StatusCode::OK).then_some(())
        })
        .await;
    }
}

/// A `quiver worker` whose log (stderr) goes to a file, to measure it.
struct LoggedWorker {
    child: Child,
    url: String,
    log: PathBuf,
}

impl LoggedWorker {
    async fn start(registry_url: &str, log: PathBuf) -> LoggedWorker {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("free port")
            .port();
        let listen = format!("127.0.0.1:{port}");
        let child = quiver_command()
            .args(["worker", "--registry", registry_url, "--token", WORKER])
            .args(["--caller-token", CALLER, "--http-listen", &listen])
            .args(["--log-format", "json"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn quiver worker");
        let worker = LoggedWorker {
            child,
            url: format!("http://{listen}"),
            log,
        };
        eventually(Duration::from_secs(15), "worker ready", || async {
            let ready = reqwest::get(format!("{}/readyz", worker.url)).await.ok()?;
            (ready.status() == StatusCode::OK).then_some(())
        })
        .await;
        worker
    }

    fn log_bytes(&self) -> u64 {
        std::fs::metadata(&self.log).map_or(0, |m| m.len())
    }

    /// `POST /v1/mcp/tools/call`: status, body and how long it took.
    async fn call(&self, name: &str) -> (StatusCode, Value, Duration) {
        let started = Instant::now();
        let response = reqwest::Client::new()
            .post(format!("{}/v1/mcp/tools/call", self.url))
            .bearer_auth(CALLER)
            .json(&json!({"name": name, "arguments": {}}))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .expect("tool call");
        let status = response.status();
        let body = response.json().await.unwrap_or(Value::Null);
        (status, body, started.elapsed())
    }
}

impl Drop for LoggedWorker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How long the flood peer floods.
const FLOOD_SECONDS: u64 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_and_garbage_flood_leaves_the_worker_log_small_and_the_worker_responsive() {
    let python = sdk_python();
    let (db, db_url) = sqlite();
    let registry = registry(&db_url, None).await;
    let flood = peer("flood.py");
    let seconds = FLOOD_SECONDS.to_string();
    Admin::new(&registry, ADMIN)
        .upsert(record(
            "flood",
            &python,
            &[&flood, &seconds],
            json!({"tool_timeout_ms": 5000}),
        ))
        .await;
    let worker = LoggedWorker::start(&registry.grpc_url(), db.path().join("worker.log")).await;
    let before = worker.log_bytes();

    // The first call connects (and starts the flood); then a call every 200 ms.
    let ping = injected("flood", "ping_tool");
    let started = Instant::now();
    let mut latencies = Vec::new();
    while started.elapsed() < Duration::from_secs(FLOOD_SECONDS) {
        let (status, body, took) = worker.call(&ping).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["content"][0]["text"], "pong", "{body}");
        latencies.push(took);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log_growth = worker.log_bytes() - before;
    let messages = metric_sum(
        &format!("{}/metrics", worker.url),
        "mcp_server_log_messages_total",
        &["server_id=\"flood\"", "level=\"warning\""],
    )
    .await;
    latencies.sort();
    let slowest = latencies.last().copied().unwrap_or_default();
    let median = latencies[latencies.len() / 2];
    eprintln!(
        "{FLOOD_SECONDS} s of notifications/message + garbage lines: {messages} log \
         notifications counted, worker log grew {log_growth} bytes, {} pings, median {median:?}, \
         slowest {slowest:?}",
        latencies.len()
    );
    assert!(
        messages >= 10_000.0,
        "the peer flooded: {messages} messages counted"
    );
    assert!(
        log_growth < 100_000,
        "worker log grew {log_growth} bytes during the flood"
    );
    // The first call includes starting the peer.
    assert!(
        median < Duration::from_millis(500),
        "pings answered during the flood: median {median:?}"
    );
}

/// A stdio server (the flood peer's plain JSON-RPC core, quiet) started by
/// `sh`, which first starts two `setsid` sleepers: one stays the server's
/// child, one is double-forked away from it. Their pids go to `<dir>/child`
/// and `<dir>/detached`.
fn server_with_setsid_sleepers(dir: &Path, python: &str) -> Value {
    let script = format!(
        "setsid sleep 300 & echo $! > {dir}/child; \
         (setsid sleep 301 & echo $! > {dir}/detached); exec {python} {flood} 0",
        dir = dir.display(),
        flood = peer("flood.py"),
    );
    record("sleepers", "sh", &["-c", &script], json!({}))
}

fn sleeper_pids(dir: &Path) -> Vec<i32> {
    ["child", "detached"]
        .iter()
        .map(|name| {
            std::fs::read_to_string(dir.join(name))
                .unwrap_or_else(|err| panic!("{name}: {err}"))
                .trim()
                .parse()
                .expect("pid")
        })
        .collect()
}

/// Whether `pid` is gone (no process, or a zombie).
fn gone(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setsid_grandchildren_end_when_the_worker_shuts_down() {
    let python = sdk_python();
    let (db, db_url) = sqlite();
    let registry = registry(&db_url, None).await;
    Admin::new(&registry, ADMIN)
        .upsert(server_with_setsid_sleepers(db.path(), &python))
        .await;
    let mut worker =
        WorkerProcess::start(&registry.grpc_url(), WORKER, CALLER, &[] as &[&str]).await;
    let (status, body) = worker
        .call(&injected("sleepers", "ping_tool"), json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let sleepers = sleeper_pids(db.path());
    assert!(sleepers.iter().all(|&pid| !gone(pid)), "sleepers run");

    let (exit, took) = worker.terminate(Duration::from_secs(15)).await;
    eprintln!("worker exited {exit} {took:?} after SIGTERM; sleepers {sleepers:?}");
    let left: Vec<i32> = sleepers.iter().copied().filter(|&pid| !gone(pid)).collect();
    for &pid in &left {
        // Not to leave them behind when the assertion fails.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    assert!(
        left.is_empty(),
        "setsid sleepers outlived the worker: {left:?}"
    );
}
