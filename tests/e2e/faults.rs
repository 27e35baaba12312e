//! Fault suite (issue #6): real processes, bounded in time, loopback only.
//!
//! Each test injects one kind of fault into a running stack and checks the
//! promised outcome, then prints its figures (`eprintln!`, shown by nextest
//! on failure) and writes them to `target/reliability/faults-<name>.txt`
//! (overwritten by every run, marked PASSED or FAILED), from which
//! `RELIABILITY.md` records them.
//!
//! - `registry_sigkill_with_workers_serving`: SIGKILL of the registry during
//!   concurrent writes while a worker serves calls.
//! - `private_postgres_restart_under_write_load`: a private PostgreSQL
//!   cluster (never the shared one) restarted under registry write load.
//! - `mcp_child_sigkill_mid_call_x100`: the stdio child killed 100 times with
//!   calls in flight.
//! - `hung_server_and_output_flood`: a tool that never answers, and a 100 MB
//!   answer to one call, with the worker's memory measured.
//! - `server_hung_at_start`: a stdio server that never answers `initialize`.
//! - `five_hundred_calls_at_max_concurrency_4`: 500 concurrent calls on a
//!   server limited to 4.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use quiver_proto::v1 as pb;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::harness::{
    Admin, Client, WorkerProcess, WriteLoad, eventually, metric_sum, proc_stat, processes,
    quiver_bin, sqlite, stdio_spec, upsert, upserted_revision,
};
use crate::stack::Stack;
use crate::worker::{ADMIN, CALLER, WORKER, injected, registry, stdio_record};

// ---------------------------------------------------------------------------
// Figures

/// Figures of one scenario: printed as they come and written, when the test
/// ends (pass or fail), to `target/reliability/faults-<name>.txt`.
struct Figures {
    name: &'static str,
    started: Instant,
    lines: Vec<String>,
}

impl Figures {
    fn new(name: &'static str) -> Figures {
        Figures {
            name,
            started: Instant::now(),
            lines: Vec::new(),
        }
    }

    fn note(&mut self, line: impl Into<String>) {
        let line = line.into();
        eprintln!("[faults::{}] {line}", self.name);
        self.lines.push(line);
    }

    /// `<target dir>/reliability` (the `quiver` binary is `<target>/<profile>/quiver`).
    fn dir() -> PathBuf {
        Path::new(quiver_bin())
            .parent()
            .and_then(Path::parent)
            .expect("target dir of the quiver binary")
            .join("reliability")
    }
}

impl Drop for Figures {
    fn drop(&mut self) {
        let outcome = if std::thread::panicking() {
            "FAILED"
        } else {
            "PASSED"
        };
        let elapsed = self.started.elapsed();
        eprintln!("[faults::{}] {outcome} in {elapsed:.1?}", self.name);
        let dir = Figures::dir();
        let mut text = format!(
            "# faults::{} — {outcome} in {elapsed:.1?}\n# cargo nextest run -p quiver --test e2e faults\n",
            self.name
        );
        for line in &self.lines {
            text.push_str(line);
            text.push('\n');
        }
        let written = std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(dir.join(format!("faults-{}.txt", self.name)), text));
        if let Err(err) = written {
            eprintln!("warning: cannot write figures to {}: {err}", dir.display());
        }
    }
}

// ---------------------------------------------------------------------------
// Helpers

/// A stdio record of the test server with `budgets`.
fn budgeted(server_id: &str, allowed: &[&str], budgets: Value) -> Value {
    let mut record = stdio_record(server_id, allowed);
    record["budgets"] = budgets;
    record
}

/// `stats` of the test server behind `server_id`.
async fn stats(worker: &WorkerProcess, server_id: &str) -> Value {
    let text = worker
        .call_text(&injected(server_id, "stats"), json!({}))
        .await;
    serde_json::from_str(&text).unwrap_or_else(|err| panic!("stats is JSON ({err}): {text}"))
}

/// Pid of the live stdio child of `server_id`, if any.
async fn child_pid(worker: &WorkerProcess, server_id: &str) -> Option<i32> {
    let server = worker.server(server_id).await?;
    server["pid"].as_i64().map(|pid| pid as i32)
}

/// `VmRSS` and `VmHWM` of `pid`, in KiB.
fn memory_kib(pid: i32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Children of `parent` that are zombies.
fn zombies_of(parent: i32) -> Vec<i32> {
    processes()
        .into_iter()
        .filter(|p| p.ppid == parent && p.state == 'Z')
        .map(|p| p.pid)
        .collect()
}

/// Percentile (0..=100) of sorted durations.
fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[(sorted.len() - 1) * p / 100]
}

/// A record that no worker connects to (disabled), distinct per id.
fn disabled_spec(server_id: &str) -> pb::McpServerSpec {
    let mut spec = stdio_spec(server_id, "v1");
    spec.enabled = Some(false);
    spec
}

/// Every acknowledged write is present at its acknowledged revision.
async fn assert_acknowledged_intact(client: &mut Client, acknowledged: &BTreeMap<String, u64>) {
    for (id, revision) in acknowledged {
        let server = client
            .get_mcp_server(pb::GetMcpServerRequest {
                server_id: id.clone(),
            })
            .await
            .unwrap_or_else(|status| {
                panic!("acknowledged {id} (revision {revision}) lost: {status}")
            })
            .into_inner()
            .server
            .expect("record");
        assert_eq!(
            server.revision, *revision,
            "{id} must keep its acknowledged revision"
        );
    }
}

// ---------------------------------------------------------------------------
// 1. Registry SIGKILL during writes, worker serving calls

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_sigkill_with_workers_serving() {
    let mut figures = Figures::new("registry_sigkill");
    let mut stack = Stack::builder().postgres().start().await;
    let head = stack.admin.upsert(stdio_record("steady", &["echo"])).await;
    stack.synced(head).await;
    let echo = injected("steady", "echo");
    assert_eq!(
        stack.worker.call_text(&echo, json!({"text": "warm"})).await,
        "warm"
    );

    // Callers: the worker serves echo calls for the whole test.
    let stop = Arc::new(AtomicBool::new(false));
    let failures: Arc<Mutex<Vec<String>>> = Arc::default();
    let served = Arc::new(AtomicU64::new(0));
    let served_while_down = Arc::new(AtomicU64::new(0));
    let registry_down = Arc::new(AtomicBool::new(false));
    let mut callers = Vec::new();
    for c in 0..2 {
        let (worker, stop, failures, served, served_while_down, registry_down, echo) = (
            stack.worker.clone(),
            stop.clone(),
            failures.clone(),
            served.clone(),
            served_while_down.clone(),
            registry_down.clone(),
            echo.clone(),
        );
        callers.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let text = format!("c{c}-{i}");
                let (status, body) = worker.call(&echo, json!({"text": text})).await;
                if status == StatusCode::OK && body["content"][0]["text"] == text {
                    served.fetch_add(1, Ordering::SeqCst);
                    if registry_down.load(Ordering::SeqCst) {
                        served_while_down.fetch_add(1, Ordering::SeqCst);
                    }
                } else {
                    failures.lock().unwrap().push(format!("{status} {body}"));
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }

    // Writers: distinct disabled records (the worker never connects to them).
    let load = WriteLoad::start(&stack.registry, ADMIN, 4, "w", disabled_spec).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    stack.registry.kill_hard();
    let killed = Instant::now();
    registry_down.store(true, Ordering::SeqCst);
    let (attempted, acknowledged) = load.join_after_crash().await;
    assert!(!acknowledged.is_empty(), "no write acknowledged in 400 ms");

    // The outage: the worker notices and keeps serving from its snapshot.
    let worker = stack.worker.clone();
    eventually(Duration::from_secs(5), "worker degraded", || async {
        let (_, ready) = worker.readyz().await;
        (ready["degraded"] == true).then_some(())
    })
    .await;
    let degraded_after = killed.elapsed();
    tokio::time::sleep(Duration::from_millis(1000).saturating_sub(killed.elapsed())).await;

    // Back on the same database and port.
    stack.restart_registry().await;
    let restarted = Instant::now();
    let outage = killed.elapsed();
    registry_down.store(false, Ordering::SeqCst);
    let mut client = stack.registry.client(Some(ADMIN)).await;
    let head = client
        .list_mcp_servers(pb::ListMcpServersRequest {})
        .await
        .expect("list after restart")
        .into_inner()
        .revision;
    stack.worker.synced(head, Duration::from_secs(5)).await;
    let resync = restarted.elapsed();
    // And a change made now reaches it.
    let next = stack.admin.upsert(disabled_json("after-restart")).await;
    let written = Instant::now();
    stack.worker.synced(next, Duration::from_secs(5)).await;
    let propagation = written.elapsed();

    stop.store(true, Ordering::SeqCst);
    for caller in callers {
        caller.await.expect("caller task");
    }
    assert_acknowledged_intact(&mut client, &acknowledged).await;
    let max_acked = acknowledged.values().copied().max().unwrap_or(0);
    assert!(
        head >= max_acked,
        "head {head} behind acknowledged {max_acked}"
    );
    let failures = failures.lock().unwrap().clone();
    let served = served.load(Ordering::SeqCst);
    let served_while_down = served_while_down.load(Ordering::SeqCst);
    figures.note(format!(
        "writes: {attempted} attempted, {} acknowledged (max revision {max_acked}), 0 lost; head after restart {head}",
        acknowledged.len()
    ));
    figures.note(format!(
        "worker calls: {served} served ({served_while_down} while the registry was down), {} failed",
        failures.len()
    ));
    figures.note(format!(
        "worker degraded {degraded_after:.2?} after SIGKILL; outage {outage:.2?}; resync to head {resync:.2?} after the registry listened again; next change visible after {propagation:.2?}"
    ));
    assert!(
        failures.is_empty(),
        "{} calls failed during the outage, e.g. {:?}",
        failures.len(),
        failures.first()
    );
    assert!(
        served_while_down > 0,
        "no call was made while the registry was down"
    );
    assert!(resync <= Duration::from_secs(5), "resync took {resync:?}");
}

/// `disabled_spec` as an admin REST record.
fn disabled_json(server_id: &str) -> Value {
    let mut record = stdio_record(server_id, &["*"]);
    record["enabled"] = json!(false);
    record
}

// ---------------------------------------------------------------------------
// 2. PostgreSQL restarted under load (a private cluster)

/// A private PostgreSQL cluster in a temporary directory, on a free
/// loopback port; stopped (immediately) on drop.
struct PrivatePostgres {
    dir: TempDir,
    bin: PathBuf,
    port: u16,
    /// Run the server binaries as this user (PostgreSQL refuses root).
    run_as: Option<&'static str>,
}

impl PrivatePostgres {
    /// Sets up and starts the cluster, or explains why it cannot.
    fn start() -> Result<PrivatePostgres, String> {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .map_err(|err| format!("no /usr/lib/postgresql: {err}"))?
            .filter_map(|entry| Some(entry.ok()?.path().join("bin")))
            .filter(|bin| bin.join("initdb").is_file() && bin.join("pg_ctl").is_file())
            .max()
            .ok_or("no initdb/pg_ctl under /usr/lib/postgresql/*/bin")?;
        let run_as = effective_uid_is_root().then_some("postgres");
        let dir = tempfile::tempdir().map_err(|err| err.to_string())?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map_err(|err| err.to_string())?
            .port();
        let cluster = PrivatePostgres {
            dir,
            bin,
            port,
            run_as,
        };
        if let Some(user) = run_as {
            cluster.run(
                Command::new("chown")
                    .args(["-R", user])
                    .arg(cluster.dir.path()),
                "chown",
            )?;
        }
        let data = cluster.data();
        cluster.run(
            cluster
                .pg("initdb")
                .args([
                    "-A",
                    "trust",
                    "-U",
                    "postgres",
                    "--no-sync",
                    "-E",
                    "UTF8",
                    "-D",
                ])
                .arg(&data),
            "initdb",
        )?;
        cluster.pg_ctl_start()?;
        Ok(cluster)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// A command for the server binary `name`, as `run_as` when set.
    fn pg(&self, name: &str) -> Command {
        let program = self.bin.join(name);
        match self.run_as {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.args(["-u", user, "--"]).arg(program);
                command
            }
            None => Command::new(program),
        }
    }

    fn run(&self, command: &mut Command, what: &str) -> Result<(), String> {
        let output = command
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|err| format!("{what}: {err}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{what}: {}\n{}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    }

    fn pg_ctl_start(&self) -> Result<(), String> {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c max_connections=50",
            self.port,
            self.dir.path().display()
        );
        self.run(
            self.pg("pg_ctl")
                .args(["-w", "-t", "30", "-D"])
                .arg(self.data())
                .args(["-l"])
                .arg(self.dir.path().join("postgres.log"))
                .args(["-o", &options, "start"]),
            "pg_ctl start",
        )
    }

    /// `pg_ctl stop -m immediate`: every backend dies at once, like a crash
    /// (crash recovery runs at the next start).
    fn stop_immediate(&self) -> Result<(), String> {
        self.run(
            self.pg("pg_ctl")
                .args(["-w", "-t", "30", "-m", "immediate", "-D"])
                .arg(self.data())
                .arg("stop"),
            "pg_ctl stop",
        )
    }
}

/// Whether this process runs as root (second field of `Uid:` in
/// `/proc/self/status`).
fn effective_uid_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|line| line.starts_with("Uid:"))?;
            Some(line.split_whitespace().nth(2)? == "0")
        })
        .unwrap_or(false)
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self.stop_immediate();
    }
}

/// Outcome of one registry write under the PostgreSQL restart.
#[derive(Debug)]
enum WriteOutcome {
    Acked(String, u64),
    Failed(tonic::Code, String),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_postgres_restart_under_write_load() {
    let mut figures = Figures::new("postgres_restart");
    let cluster = match PrivatePostgres::start() {
        Ok(cluster) => cluster,
        Err(why) => panic!("cannot run a private PostgreSQL cluster: {why}"),
    };
    let url = cluster.url();
    let mut registry = registry(&url, None).await;

    // Writers record every outcome with its latency, and keep going.
    let stop = Arc::new(AtomicBool::new(false));
    let outcomes: Arc<Mutex<Vec<(Instant, Duration, WriteOutcome)>>> = Arc::default();
    let mut writers = Vec::new();
    for w in 0..4 {
        let mut client = registry.client(Some(ADMIN)).await;
        let (stop, outcomes) = (stop.clone(), outcomes.clone());
        writers.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let id = format!("w{w}-{i}");
                i += 1;
                let started = Instant::now();
                let outcome = match tokio::time::timeout(
                    Duration::from_secs(20),
                    upsert(&mut client, disabled_spec(&id)),
                )
                .await
                {
                    Ok(Ok(response)) => WriteOutcome::Acked(id, upserted_revision(&response)),
                    Ok(Err(status)) => {
                        WriteOutcome::Failed(status.code(), status.message().to_owned())
                    }
                    Err(_) => {
                        WriteOutcome::Failed(tonic::Code::DeadlineExceeded, "hung 20 s".into())
                    }
                };
                let failed = matches!(outcome, WriteOutcome::Failed(..));
                outcomes
                    .lock()
                    .unwrap()
                    .push((started, started.elapsed(), outcome));
                tokio::time::sleep(Duration::from_millis(if failed { 50 } else { 5 })).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stopping = Instant::now();
    cluster.stop_immediate().expect("stop PostgreSQL");
    let stopped = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cluster.pg_ctl_start().expect("start PostgreSQL again");
    let back = Instant::now();
    // Recovery: the first write that starts after PostgreSQL is back and succeeds.
    let recovered = eventually(
        Duration::from_secs(15),
        "a write acknowledged after the restart",
        || {
            let outcomes = outcomes.clone();
            async move {
                outcomes
                    .lock()
                    .unwrap()
                    .iter()
                    .find_map(|(started, took, outcome)| {
                        (*started >= back && matches!(outcome, WriteOutcome::Acked(..)))
                            .then(|| (*started + *took).duration_since(back))
                    })
            }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    for writer in writers {
        tokio::time::timeout(Duration::from_secs(25), writer)
            .await
            .expect("writers stop")
            .expect("writer task");
    }
    assert!(
        registry.is_running(),
        "the registry exited; log:\n{}",
        registry.log_tail()
    );

    let outcomes = std::mem::take(&mut *outcomes.lock().unwrap());
    let mut acknowledged = BTreeMap::new();
    let mut failed_codes: BTreeMap<String, usize> = BTreeMap::new();
    let mut failed_latencies = Vec::new();
    let mut sample_failure = None;
    let mut acked_during = 0;
    let mut acked_max = Duration::ZERO;
    for (started, took, outcome) in &outcomes {
        match outcome {
            WriteOutcome::Acked(id, revision) => {
                acknowledged.insert(id.clone(), *revision);
                acked_max = acked_max.max(*took);
                if *started + *took > stopping && *started < back {
                    acked_during += 1;
                }
            }
            WriteOutcome::Failed(code, message) => {
                *failed_codes.entry(format!("{code:?}")).or_default() += 1;
                failed_latencies.push(*took);
                sample_failure.get_or_insert_with(|| format!("{code:?}: {message}"));
            }
        }
    }
    failed_latencies.sort();
    let mut client = registry.client(Some(ADMIN)).await;
    assert_acknowledged_intact(&mut client, &acknowledged).await;
    let after = upsert(&mut client, disabled_spec("after-restart"))
        .await
        .expect("write after recovery");
    let max_acked = acknowledged.values().copied().max().unwrap_or(0);
    figures.note(format!(
        "writes: {} attempted, {} acknowledged (max revision {max_acked}, {acked_during} waited through the outage, slowest ack {acked_max:.2?}), 0 lost; next write revision {}",
        outcomes.len(),
        acknowledged.len(),
        upserted_revision(&after)
    ));
    figures.note(format!(
        "failed writes by code: {failed_codes:?}; latency p50 {:.2?} max {:.2?}; e.g. {}",
        percentile(&failed_latencies, 50),
        failed_latencies.last().copied().unwrap_or_default(),
        sample_failure.as_deref().unwrap_or("none")
    ));
    figures.note(format!(
        "PostgreSQL stop -m immediate took {:.2?}, down {:.2?}, start took {:.2?}; first write acknowledged {recovered:.2?} after it was back",
        stopped.duration_since(stopping),
        back.duration_since(stopped),
        back.duration_since(stopped) - Duration::from_millis(1500),
    ));
    let unclean: Vec<&String> = failed_codes
        .keys()
        .filter(|code| code.as_str() != "Unavailable")
        .collect();
    assert!(
        unclean.is_empty(),
        "writes must fail with UNAVAILABLE only: {failed_codes:?} (e.g. {sample_failure:?})"
    );
    assert!(
        failed_latencies.last().copied().unwrap_or_default() < Duration::from_secs(10),
        "a failed write took {:?}",
        failed_latencies.last()
    );
    assert!(
        recovered < Duration::from_secs(10),
        "recovery took {recovered:?}"
    );
    drop(registry);
    drop(cluster);
}

// ---------------------------------------------------------------------------
// 3. MCP child SIGKILLed ×100 mid-call

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_child_sigkill_mid_call_x100() {
    const ROUNDS: usize = 100;
    const IN_FLIGHT: u64 = 2;
    let mut figures = Figures::new("mcp_child_kill");
    let stack = Stack::builder().start().await;
    let head = stack
        .admin
        .upsert(budgeted(
            "victim",
            &["sleep", "echo", "stats"],
            json!({"tool_timeout_ms": 15000}),
        ))
        .await;
    stack.synced(head).await;
    let worker = &*stack.worker;
    let worker_pid = worker.pid().as_raw();
    let (sleep, echo) = (injected("victim", "sleep"), injected("victim", "echo"));
    assert_eq!(worker.call_text(&echo, json!({"text": "up"})).await, "up");

    let started = Instant::now();
    let mut killed = Vec::new();
    let mut answer_after_kill = Vec::new();
    let mut first_call_ok = 0;
    for round in 0..ROUNDS {
        let calls = futures::future::join_all((0..IN_FLIGHT).map(|_| async {
            let (status, body) = worker.call(&sleep, json!({"ms": 60000})).await;
            (status, body, Instant::now())
        }));
        let killer = async {
            // Both sleeps are running in the child: kill it under them.
            eventually(Duration::from_secs(10), "sleeps in flight", || async {
                (stats(worker, "victim").await["inflight_now"] == IN_FLIGHT).then_some(())
            })
            .await;
            let pid = child_pid(worker, "victim").await.expect("victim pid");
            let stat = proc_stat(pid).expect("victim is running");
            signal::kill(Pid::from_raw(pid), Signal::SIGKILL).expect("SIGKILL victim");
            (stat, Instant::now())
        };
        let (results, (stat, at)) = tokio::join!(calls, killer);
        for (status, body, answered) in results {
            assert_eq!(
                (status, &body["error"]["code"]),
                (StatusCode::SERVICE_UNAVAILABLE, &json!("mcp_unavailable")),
                "round {round}: {body}"
            );
            answer_after_kill.push(answered.saturating_duration_since(at));
        }
        killed.push(stat);
        // The next call is served by a new process.
        let (status, body) = worker.call(&echo, json!({"text": "again"})).await;
        if status == StatusCode::OK && body["content"][0]["text"] == "again" {
            first_call_ok += 1;
        } else {
            eventually(
                Duration::from_secs(5),
                "a call after the kill succeeds",
                || async {
                    let (status, _) = worker.call(&echo, json!({"text": "again"})).await;
                    (status == StatusCode::OK).then_some(())
                },
            )
            .await;
        }
        let new_pid = child_pid(worker, "victim").await.expect("new victim pid");
        assert_ne!(new_pid, stat.pid, "round {round}: the same process serves");
    }
    let elapsed = started.elapsed();

    // Every killed child was reaped; no zombie is left under the worker.
    let gone = |stat: &crate::harness::ProcStat| {
        proc_stat(stat.pid).is_none_or(|now| now.start_time != stat.start_time)
    };
    eventually(Duration::from_secs(5), "killed children reaped", || async {
        (killed.iter().all(gone) && zombies_of(worker_pid).is_empty()).then_some(())
    })
    .await;
    let children = processes()
        .into_iter()
        .filter(|p| p.ppid == worker_pid)
        .count();
    answer_after_kill.sort();
    let server = worker.server("victim").await.expect("victim listed");
    figures.note(format!(
        "{ROUNDS} SIGKILLs with {IN_FLIGHT} sleep calls in flight each: {} calls answered mcp_unavailable, \
         after the kill p50 {:.1?} p99 {:.1?} max {:.1?}",
        answer_after_kill.len(),
        percentile(&answer_after_kill, 50),
        percentile(&answer_after_kill, 99),
        answer_after_kill.last().copied().unwrap_or_default()
    ));
    figures.note(format!(
        "first call after each kill succeeded {first_call_ok}/{ROUNDS} times; reconnects {}; \
         zombies 0; children of the worker at the end {children}; {elapsed:.1?} in all",
        server["reconnects"]
    ));
    assert_eq!(first_call_ok, ROUNDS, "a call right after a kill failed");
}

// ---------------------------------------------------------------------------
// 4. Hung server and 100 MB output flood

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_server_and_output_flood() {
    const FLOOD_BYTES: u64 = 100_000_000;
    const RSS_BOUND_KIB: u64 = 300 * 1024;
    const HUNG_CALLS: u64 = 8;
    let mut figures = Figures::new("hung_and_flood");
    let stack = Stack::builder().start().await;
    stack
        .admin
        .upsert(budgeted(
            "hung",
            &["sleep", "stats"],
            // One slot more than the hung calls take: while their slots stay
            // held (cancel_grace), `stats` can still see the server.
            json!({"tool_timeout_ms": 1000, "max_concurrency": HUNG_CALLS + 1}),
        ))
        .await;
    stack.admin.upsert(stdio_record("steady", &["echo"])).await;
    stack
        .admin
        .upsert(budgeted(
            "trunc",
            &["big_output"],
            json!({"max_tool_output_bytes": 1_000_000}),
        ))
        .await;
    let head = stack
        .admin
        .upsert(budgeted(
            "flood",
            &["big_output"],
            json!({"tool_timeout_ms": 5000, "max_tool_output_bytes": 1_000_000}),
        ))
        .await;
    stack.synced(head).await;
    let worker = &*stack.worker;
    let pid = worker.pid().as_raw();
    let echo = injected("steady", "echo");
    assert_eq!(worker.call_text(&echo, json!({"text": "up"})).await, "up");
    let big = injected("flood", "big_output");
    let trunc = injected("trunc", "big_output");
    // A long fill unit: the debug-built server then builds 100 MB quickly.
    let fill = "x".repeat(1000);
    assert_eq!(
        worker
            .call_text(&big, json!({"bytes": 4, "char": "x"}))
            .await,
        "xxxx"
    );

    // Hung: 8 calls that never answer in time, the worker answering others meanwhile.
    let hung = injected("hung", "sleep");
    assert_eq!(stats(worker, "hung").await["calls"], 0);
    let hung_pid = child_pid(worker, "hung").await.expect("hung pid");
    let hung_process = proc_stat(hung_pid).expect("hung server is running");
    let hung_calls = futures::future::join_all((0..HUNG_CALLS).map(|_| async {
        let started = Instant::now();
        let (status, body) = worker.call(&hung, json!({"ms": 600_000})).await;
        (status, body, started.elapsed())
    }));
    let meanwhile = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut latencies = Vec::new();
        for i in 0..5 {
            let started = Instant::now();
            assert_eq!(
                worker
                    .call_text(&echo, json!({"text": format!("{i}")}))
                    .await,
                format!("{i}")
            );
            let (status, _) = worker.readyz().await;
            assert_eq!(status, StatusCode::OK);
            latencies.push(started.elapsed());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        latencies
    };
    let (hung_results, mut latencies) = tokio::join!(hung_calls, meanwhile);
    let mut hung_took = Vec::new();
    for (status, body, took) in hung_results {
        assert_eq!(
            (status, &body["error"]["code"]),
            (StatusCode::GATEWAY_TIMEOUT, &json!("mcp_timeout")),
            "{body}"
        );
        hung_took.push(took);
    }
    hung_took.sort();
    latencies.sort();
    figures.note(format!(
        "hung: 8 calls at tool_timeout_ms 1000 → mcp_timeout after {:.2?}..{:.2?}; \
         echo + /readyz meanwhile max {:.1?}",
        hung_took[0],
        hung_took[hung_took.len() - 1],
        latencies.last().unwrap()
    ));
    assert!(
        hung_took[0] >= Duration::from_millis(1000)
            && hung_took[hung_took.len() - 1] < Duration::from_secs(4),
        "mcp_timeout answered after {hung_took:?}"
    );
    assert!(
        *latencies.last().unwrap() < Duration::from_secs(2),
        "the worker was slow while calls hung: {latencies:?}"
    );
    let timed_out = Instant::now();
    // The server was told to cancel them, and stopped them. As MCP asks, it
    // does not answer a cancelled call, so their slots stay held ...
    let hung_stats = eventually(
        Duration::from_millis(1500),
        "hung calls cancelled",
        || async {
            let seen = stats(worker, "hung").await;
            (seen["inflight_now"] == 0 && seen["cancelled"] == HUNG_CALLS).then_some(seen)
        },
    )
    .await;
    assert_eq!(child_pid(worker, "hung").await, Some(hung_pid));
    // ... until cancel_grace (2 s by default) has passed; then the connection
    // is recycled, once for all eight, and the next call starts a new server.
    let hung_recycled = |expected: f64| async move {
        let recycled = metric_sum(
            &format!("{}/metrics", worker.url()),
            "mcp_connection_recycled_total",
            &[r#"server_id="hung""#, r#"reason="cancel_unanswered""#],
        )
        .await;
        assert!(recycled <= expected, "hung: {recycled} recycles");
        recycled == expected
    };
    eventually(
        Duration::from_secs(5),
        "hung connection recycled",
        || async {
            // Recycled first, then served: a call that raced the recycling
            // may still have been answered by the old process.
            if !hung_recycled(1.0).await {
                return None;
            }
            let (status, body) = worker.call(&injected("hung", "stats"), json!({})).await;
            (status == StatusCode::OK).then_some(body)
        },
    )
    .await;
    let recycled_after = timed_out.elapsed();
    let new_pid = child_pid(worker, "hung").await.expect("new hung pid");
    assert_ne!(new_pid, hung_pid, "the recycled server still serves");
    eventually(Duration::from_secs(2), "recycled server ended", || async {
        proc_stat(hung_pid)
            .is_none_or(|now| now.start_time != hung_process.start_time)
            .then_some(())
    })
    .await;
    assert!(hung_recycled(1.0).await);
    figures.note(format!(
        "hung server after the timeouts: {hung_stats}; its slots held until the connection was \
         recycled (once) {recycled_after:.2?} after the timeouts (cancel_grace 2 s), the next call served by a new process"
    ));
    assert!(
        recycled_after >= Duration::from_millis(1800),
        "recycled {recycled_after:?} after the timeouts, before cancel_grace"
    );

    // Flood: one call answered with 100 MB, RSS sampled all along.
    let (rss_before, hwm_before) = memory_kib(pid);
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let sampling = sampling.clone();
        tokio::spawn(async move {
            let mut peak = 0;
            while sampling.load(Ordering::SeqCst) {
                peak = peak.max(memory_kib(pid).0);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            peak
        })
    };
    let started = Instant::now();
    let (status, body) = worker
        .call(&big, json!({"bytes": FLOOD_BYTES, "char": fill}))
        .await;
    let flood_took = started.elapsed();
    // Other servers are served meanwhile.
    let echo_started = Instant::now();
    assert_eq!(
        worker.call_text(&echo, json!({"text": "during"})).await,
        "during"
    );
    let echo_during = echo_started.elapsed();
    // 10 MB, under the transport's 16 MiB message cap: truncated to the budget.
    let truncated_started = Instant::now();
    let (big_status, big_body) = worker
        .call(&trunc, json!({"bytes": 10_000_000, "char": fill}))
        .await;
    let truncated_took = truncated_started.elapsed();
    // The flood's connection serves again once the rest of the flood is drained.
    eventually(
        Duration::from_secs(45),
        "flood server answers again",
        || async {
            let (status, body) = worker.call(&big, json!({"bytes": 4, "char": "x"})).await;
            (status == StatusCode::OK && body["content"][0]["text"] == "xxxx").then_some(())
        },
    )
    .await;
    let flood_recovered = started.elapsed();
    sampling.store(false, Ordering::SeqCst);
    let rss_peak_sampled = sampler.await.expect("sampler");
    let (rss_after, hwm_after) = memory_kib(pid);
    let code = body["error"]["code"].clone();
    figures.note(format!(
        "flood: 100 MB answer → HTTP {status} {code} after {flood_took:.2?} \
         (tool_timeout_ms 5000; the stdio transport drops a message over 16 MiB); \
         another server answered in {echo_during:.1?} meanwhile; the flooding server answered again \
         {flood_recovered:.2?} after the flood call started"
    ));
    let kept = big_body["content"][0]["text"].as_str().map_or(0, str::len);
    figures.note(format!(
        "10 MB answer at max_tool_output_bytes 1000000 → HTTP {big_status} truncated={} {} kept {kept} bytes, {truncated_took:.2?}",
        big_body["truncated"], big_body["error"]["code"]
    ));
    figures.note(format!(
        "worker memory: VmRSS {} MiB before, sampled peak {} MiB, {} MiB after; \
         VmHWM {} MiB before, {} MiB after (bound {} MiB)",
        rss_before / 1024,
        rss_peak_sampled / 1024,
        rss_after / 1024,
        hwm_before / 1024,
        hwm_after / 1024,
        RSS_BOUND_KIB / 1024
    ));
    assert!(
        (status == StatusCode::GATEWAY_TIMEOUT && code == "mcp_timeout")
            || (status == StatusCode::BAD_GATEWAY && code == "mcp_output_too_large"),
        "100 MB answer: {status} {}",
        truncate_for_message(&body)
    );
    assert_eq!(
        big_status,
        StatusCode::OK,
        "{}",
        truncate_for_message(&big_body)
    );
    assert_eq!(big_body["truncated"], true);
    assert_eq!(big_body["error"]["code"], "mcp_output_too_large");
    assert!(kept <= 1_000_000 && kept > 900_000, "kept {kept} bytes");
    assert!(
        hwm_after < RSS_BOUND_KIB,
        "worker peak RSS {} MiB over the {} MiB bound",
        hwm_after / 1024,
        RSS_BOUND_KIB / 1024
    );
    // Still responsive.
    assert_eq!(worker.call_text(&echo, json!({"text": "end"})).await, "end");
}

fn truncate_for_message(body: &Value) -> String {
    let text = body.to_string();
    text.chars().take(500).collect()
}

// ---------------------------------------------------------------------------
// 5. 500 concurrent calls at max_concurrency = 4

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_calls_at_max_concurrency_4() {
    const CALLS: usize = 500;
    let mut figures = Figures::new("concurrency_500");
    let stack = Stack::builder().start().await;
    stack
        .admin
        .upsert(budgeted(
            "roomy",
            &["inflight", "stats"],
            json!({"max_concurrency": 4, "tool_timeout_ms": 30000}),
        ))
        .await;
    let head = stack
        .admin
        .upsert(budgeted(
            "tight",
            &["inflight", "stats"],
            json!({"max_concurrency": 4, "tool_timeout_ms": 1000}),
        ))
        .await;
    stack.synced(head).await;
    let worker = &*stack.worker;

    let metrics_url = format!("{}/metrics", worker.url());
    for (server_id, ms, timeout) in [("roomy", 10, 30_000u64), ("tight", 50, 1_000)] {
        let name = injected(server_id, "inflight");
        assert_eq!(stats(worker, server_id).await["calls"], 0);
        let pid = child_pid(worker, server_id).await.expect("server pid");
        let started = Instant::now();
        let results = futures::future::join_all((0..CALLS).map(|_| async {
            let started = Instant::now();
            let (status, body) = worker.call(&name, json!({"ms": ms})).await;
            (status, body, started.elapsed())
        }))
        .await;
        let wall = started.elapsed();
        let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
        let mut latencies = Vec::new();
        // Each answer of `inflight` carries the most calls the server had
        // worked on at once until then.
        let mut answered_max = 0;
        for (status, body, took) in &results {
            let outcome = if *status == StatusCode::OK && body["is_error"] == false {
                let seen = body["content"][0]["text"]
                    .as_str()
                    .and_then(|t| t.parse().ok());
                answered_max = answered_max.max(seen.expect("inflight answers a count"));
                "ok".to_owned()
            } else {
                format!("{status} {}", body["error"]["code"])
            };
            *outcomes.entry(outcome).or_default() += 1;
            latencies.push(*took);
        }
        latencies.sort();
        // A timed-out call keeps its slot until the server answers it or
        // cancel_grace (2 s) after its cancellation; then the connection is
        // recycled. The test server stops a cancelled call without answering
        // it, so the tight round usually ends in one recycle.
        if server_id == "tight" {
            tokio::time::sleep(Duration::from_millis(2500)).await;
        }
        let server_label = format!(r#"server_id="{server_id}""#);
        let recycled = metric_sum(
            &metrics_url,
            "mcp_connection_recycled_total",
            &[&server_label],
        )
        .await;
        let seen = stats(worker, server_id).await;
        let new_pid = child_pid(worker, server_id).await.expect("server pid");
        figures.note(format!(
            "{server_id}: {CALLS} concurrent inflight({ms} ms) at max_concurrency 4, tool_timeout_ms {timeout}: \
             {outcomes:?} in {wall:.2?}; latency p50 {:.2?} p99 {:.2?} max {:.2?}; the server saw at most \
             {answered_max} at once; {recycled} recycle(s) after the timed-out calls' cancel_grace; server then {seen}",
            percentile(&latencies, 50),
            percentile(&latencies, 99),
            latencies.last().unwrap()
        ));
        // The server never works on more than max_concurrency calls, whether
        // calls time out or not (timed-out calls keep their slots).
        assert!(
            (1..=4).contains(&answered_max),
            "{server_id}: the server saw {answered_max} calls at once"
        );
        let inflight_max = seen["inflight_max"].as_u64().expect("inflight_max");
        assert!(inflight_max <= 4, "{server_id}: inflight_max: {seen}");
        // Recycled at most once, however many calls gave up on the connection;
        // a recycle ends the server: nothing is left running on it.
        assert!(recycled <= 1.0, "{server_id}: {recycled} recycles");
        assert_eq!(
            recycled == 1.0,
            new_pid != pid,
            "{server_id}: pid {pid} → {new_pid} with {recycled} recycle(s)"
        );
        assert_eq!(
            seen["inflight_now"], 0,
            "{server_id}: a call left running: {seen}"
        );
        for (status, body, took) in &results {
            let clean = (*status == StatusCode::OK && body["is_error"] == false)
                || (*status == StatusCode::GATEWAY_TIMEOUT
                    && body["error"]["code"] == "mcp_timeout")
                || (*status == StatusCode::SERVICE_UNAVAILABLE
                    && body["error"]["code"] == "mcp_unavailable"
                    && body["error"]["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("no call slot")));
            assert!(clean, "{server_id}: unclean outcome {status} {body}");
            assert!(
                *took < Duration::from_millis(timeout) + Duration::from_secs(5),
                "{server_id}: a call took {took:?} at tool_timeout_ms {timeout}"
            );
        }
        if server_id == "roomy" {
            assert_eq!(outcomes.get("ok"), Some(&CALLS), "roomy: {outcomes:?}");
            assert_eq!(seen["calls"], CALLS as u64, "{seen}");
            assert_eq!(recycled, 0.0, "roomy: no call timed out, yet recycled");
        }
    }
}

// ---------------------------------------------------------------------------
// 4b. A server that never answers `initialize`

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_hung_at_start() {
    const INITIALIZE_TIMEOUT_MS: u64 = 3000;
    const CATALOG_WAIT_MS: u64 = 500;
    let mut figures = Figures::new("hung_at_start");
    let (dir, db_url) = sqlite();
    let config = dir.path().join("worker.toml");
    std::fs::write(
        &config,
        format!(
            "[pool]\ninitialize_timeout_ms = {INITIALIZE_TIMEOUT_MS}\ncatalog_wait_ms = {CATALOG_WAIT_MS}\n"
        ),
    )
    .expect("worker config");
    let registry = registry(&db_url, None).await;
    let admin = Admin::new(&registry, ADMIN);
    let worker = WorkerProcess::start(
        &registry.grpc_url(),
        WORKER,
        CALLER,
        &["--config", config.to_str().expect("utf-8 path")],
    )
    .await;
    admin.upsert(stdio_record("steady", &["echo"])).await;
    // A "server" that never speaks: the handshake never completes.
    let head = admin
        .upsert(json!({
            "server_id": "stuck",
            "transport": "stdio",
            "stdio": {"command": "/bin/sleep", "args": ["600"]},
            "allowed_tools": ["*"],
            "budgets": {"tool_timeout_ms": 1000},
        }))
        .await;
    worker.synced(head, Duration::from_secs(10)).await;
    let echo = injected("steady", "echo");
    assert_eq!(worker.call_text(&echo, json!({"text": "up"})).await, "up");

    let stuck_call = async {
        let started = Instant::now();
        let (status, body) = worker
            .call(&injected("stuck", "echo"), json!({"text": "x"}))
            .await;
        (status, body, started.elapsed())
    };
    let listing = async {
        let started = Instant::now();
        let names: Vec<String> = worker
            .tools()
            .await
            .iter()
            .map(|tool| tool["name"].as_str().unwrap_or_default().to_owned())
            .collect();
        (names, started.elapsed())
    };
    let other = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let started = Instant::now();
        assert_eq!(worker.call_text(&echo, json!({"text": "b"})).await, "b");
        started.elapsed()
    };
    let ((status, body, call_took), (names, list_took), other_took) =
        tokio::join!(stuck_call, listing, other);
    figures.note(format!(
        "call to a server that never answers initialize (tool_timeout_ms 1000, initialize_timeout_ms {INITIALIZE_TIMEOUT_MS}): HTTP {status} {} after {call_took:.2?}",
        body["error"]["code"]
    ));
    figures.note(format!(
        "GET /v1/mcp/tools meanwhile: {} tools after {list_took:.2?}; a call to another server meanwhile: {other_took:.1?}",
        names.len()
    ));
    assert!(names.contains(&echo), "{names:?}");
    assert!(other_took < Duration::from_secs(2), "{other_took:?}");
    assert_eq!(
        (status, &body["error"]["code"]),
        (StatusCode::SERVICE_UNAVAILABLE, &json!("mcp_unavailable")),
        "{body}"
    );
    // The call to the stuck server is bounded by initialize_timeout_ms, not
    // by the tool's tool_timeout_ms (RELIABILITY.md, "A server that never
    // finishes initialize"); a listing of every server waits for it at most
    // catalog_wait_ms and leaves it out.
    let bound = Duration::from_millis(INITIALIZE_TIMEOUT_MS) + Duration::from_secs(3);
    assert!(call_took < bound, "{call_took:?}");
    assert!(
        list_took < Duration::from_millis(CATALOG_WAIT_MS) + Duration::from_secs(1),
        "{list_took:?}"
    );
    // The stuck process was ended: only the steady server's child is left.
    let worker_pid = worker.pid().as_raw();
    let steady_pid = child_pid(&worker, "steady").await.expect("steady pid");
    let children = eventually(Duration::from_secs(5), "stuck child ended", || async {
        let children: Vec<i32> = processes()
            .into_iter()
            .filter(|p| p.ppid == worker_pid)
            .map(|p| p.pid)
            .collect();
        (children == vec![steady_pid]).then_some(children)
    })
    .await;
    figures.note(format!(
        "children of the worker afterwards: {children:?} (the steady server only); zombies {:?}",
        zombies_of(worker_pid)
    ));
}
