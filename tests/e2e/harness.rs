//! Spawning and driving real `quiver` processes.
//!
//! A [`RegistryProcess`] runs `quiver registry` on ephemeral loopback ports and
//! learns them from its JSON log line `quiver registry listening`; a
//! [`WorkerProcess`] runs `quiver worker` likewise (log line `quiver worker
//! listening`, then `/readyz` 200). Their stderr is drained by a background
//! thread for the whole life of the process (the last lines are kept for
//! failure messages), and dropping them SIGKILLs and reaps the child, so a
//! failing test never leaks a process. [`McpServerProcess`] runs the test MCP
//! server binary (`quiver-testkit-mcp`) on an HTTP transport.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use quiver_proto::v1 as pb;
use tonic::transport::Channel;

/// How long a registry may take to log that it is listening.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Log lines kept for diagnostics (and for tests that look through a whole
/// short run's log, as `oauth.rs` does).
pub const LOG_TAIL: usize = 1000;

/// Path of the `quiver` binary built for this test run.
pub fn quiver_bin() -> &'static str {
    env!("CARGO_BIN_EXE_quiver")
}

/// A `quiver` command isolated from the test process environment: no
/// inherited `QUIVER_*` or `RUST_LOG` setting can change what it does, and
/// it logs with the binary's default filter, as deployed.
pub fn quiver_command() -> Command {
    quiver_command_in(None)
}

/// [`quiver_command`] run in the network namespace `netns` (through
/// `ip netns exec`, which execs the binary: the child is quiver itself).
pub fn quiver_command_in(netns: Option<&str>) -> Command {
    let mut command = match netns {
        None => Command::new(quiver_bin()),
        Some(netns) => {
            let mut command = Command::new("ip");
            command.args(["netns", "exec", netns, quiver_bin()]);
            command
        }
    };
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(|k| k.starts_with("QUIVER_")) {
            command.env_remove(&key);
        }
    }
    command.env_remove("RUST_LOG");
    command.stdin(Stdio::null());
    command
}

/// Output of a finished command.
#[derive(Debug)]
pub struct Finished {
    /// Exit status.
    pub status: ExitStatus,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Runs `quiver ARGS` to completion (at most `timeout`, then it is killed
/// and the test fails).
pub async fn run_quiver(args: &[&str], timeout: Duration) -> Finished {
    let mut command = tokio::process::Command::from(quiver_command());
    command
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = command.spawn().expect("spawn quiver");
    let output = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "`quiver {}` did not finish within {timeout:?}",
                args.join(" ")
            )
        })
        .expect("wait for quiver");
    Finished {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// A registry client with its credential attached.
pub type Client = quiver_proto::credentials::RegistryClient;

/// Connects a new channel (its own HTTP/2 connection) to `url`.
pub async fn connect(url: &str, token: Option<&str>) -> Client {
    let channel = Channel::from_shared(url.to_owned())
        .expect("grpc url")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap_or_else(|err| panic!("cannot connect to {url}: {err}"));
    quiver_proto::credentials::Credentials::new(token, None)
        .expect("token is valid header text")
        .client(channel)
}

/// A stdio record whose content is determined by `server_id` and `arg`.
pub fn stdio_spec(server_id: &str, arg: &str) -> pb::McpServerSpec {
    pb::McpServerSpec {
        server_id: server_id.to_owned(),
        transport: pb::Transport::Stdio as i32,
        stdio: Some(pb::StdioConfig {
            command: "mcp-test-server".to_owned(),
            args: vec!["--value".to_owned(), arg.to_owned()],
            ..Default::default()
        }),
        allowed_tools: vec!["*".to_owned()],
        ..Default::default()
    }
}

/// Upserts `spec` without an expected revision and returns the response.
pub async fn upsert(
    client: &mut Client,
    spec: pb::McpServerSpec,
) -> Result<pb::UpsertMcpServerResponse, tonic::Status> {
    client
        .upsert_mcp_server(pb::UpsertMcpServerRequest {
            server: Some(spec),
            expected_revision: None,
        })
        .await
        .map(tonic::Response::into_inner)
}

/// The revision of a successful, changing upsert.
pub fn upserted_revision(response: &pb::UpsertMcpServerResponse) -> u64 {
    assert!(
        !response.unchanged,
        "upsert unexpectedly unchanged: {response:?}"
    );
    response
        .server
        .as_ref()
        .expect("upsert returns the record")
        .revision
}

/// Concurrent clients upserting new records (`<prefix><writer>-<i>`) as
/// fast as they can until the registry fails them, recording the revision
/// of every acknowledged write: the load of the crash tests.
pub struct WriteLoad {
    acknowledged: Arc<Mutex<std::collections::BTreeMap<String, u64>>>,
    /// Set once the registry was killed: a writer starts no new write, so
    /// none reaches whatever process binds the freed port next (tests run
    /// side by side; another one's server there would take the writes
    /// and the writer would never fail).
    crashed: Arc<std::sync::atomic::AtomicBool>,
    /// Per writer: its writes before the last, and how the last failed
    /// (`None`: it stopped between writes).
    writers: Vec<tokio::task::JoinHandle<(usize, Option<tonic::Status>)>>,
}

impl WriteLoad {
    /// Starts `writers` clients of `registry` with `token`; `spec` makes the
    /// record of an id.
    pub async fn start(
        registry: &RegistryProcess,
        token: &str,
        writers: usize,
        prefix: &str,
        spec: fn(&str) -> pb::McpServerSpec,
    ) -> WriteLoad {
        let acknowledged: Arc<Mutex<std::collections::BTreeMap<String, u64>>> = Arc::default();
        let crashed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut handles = Vec::new();
        for w in 0..writers {
            let mut client = registry.client(Some(token)).await;
            let (acknowledged, prefix, crashed) =
                (acknowledged.clone(), prefix.to_owned(), crashed.clone());
            handles.push(tokio::spawn(async move {
                for i in 0.. {
                    if crashed.load(std::sync::atomic::Ordering::SeqCst) {
                        return (i, None);
                    }
                    let id = format!("{prefix}{w}-{i}");
                    match upsert(&mut client, spec(&id)).await {
                        Ok(response) => {
                            let revision = upserted_revision(&response);
                            acknowledged.lock().unwrap().insert(id, revision);
                        }
                        // The registry is gone: this write (and only this one) is in doubt.
                        Err(status) => return (i, Some(status)),
                    }
                }
                unreachable!()
            }));
        }
        WriteLoad {
            acknowledged,
            crashed,
            writers: handles,
        }
    }

    /// Stops the writers while the registry is up (their last writes may
    /// or may not have landed); returns the acknowledged ones.
    pub async fn stop(self) -> std::collections::BTreeMap<String, u64> {
        for writer in &self.writers {
            writer.abort();
        }
        for writer in self.writers {
            let _ = writer.await;
        }
        self.acknowledged.lock().unwrap().clone()
    }

    /// Writes acknowledged so far.
    pub fn acknowledged_count(&self) -> usize {
        self.acknowledged.lock().unwrap().len()
    }

    /// After the registry was killed: waits for every writer to fail the way
    /// a crash fails a call (or to stop between writes); returns the writes
    /// attempted and the acknowledged ones with their revisions.
    pub async fn join_after_crash(self) -> (usize, std::collections::BTreeMap<String, u64>) {
        self.crashed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let mut attempted = 0;
        for writer in self.writers {
            let (count, status) = tokio::time::timeout(Duration::from_secs(10), writer)
                .await
                .expect("writers notice the crash")
                .expect("writer task");
            let Some(status) = status else {
                attempted += count;
                continue;
            };
            attempted += count + 1;
            assert!(
                matches!(
                    status.code(),
                    tonic::Code::Unavailable
                        | tonic::Code::Unknown
                        | tonic::Code::Internal
                        | tonic::Code::Cancelled
                ),
                "unexpected error after the crash: {status}"
            );
        }
        let acknowledged = self.acknowledged.lock().unwrap().clone();
        (attempted, acknowledged)
    }
}

/// Ring buffer of the last log lines of a process.
type LogTail = Arc<Mutex<VecDeque<String>>>;

/// A spawned child whose stderr (JSON log lines) is drained by a background
/// thread for its whole life; the last lines are kept for failure messages.
/// Dropping it SIGKILLs and reaps the child.
struct Supervised {
    /// What it is, for messages (`"registry"`, `"worker"`).
    what: &'static str,
    child: Child,
    log: LogTail,
    reaped: Option<ExitStatus>,
    /// Whether the log tail was already part of a failure message.
    log_reported: bool,
}

impl Supervised {
    /// Spawns `command` (stderr piped) and waits at most `STARTUP_TIMEOUT`
    /// for a log line that `listening` accepts; fails the test otherwise.
    async fn spawn<T: Send + 'static>(
        what: &'static str,
        mut command: Command,
        description: &str,
        listening: fn(&str) -> Option<T>,
    ) -> (Supervised, T) {
        command.stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .unwrap_or_else(|err| panic!("spawn quiver {what}: {err}"));
        let stderr = child.stderr.take().expect("piped stderr");
        let log: LogTail = Arc::new(Mutex::new(VecDeque::with_capacity(LOG_TAIL)));
        let (ready_tx, mut ready_rx) = tokio::sync::mpsc::unbounded_channel();
        let tail = log.clone();
        std::thread::spawn(move || drain(stderr, &tail, &ready_tx, listening));
        let mut process = Supervised {
            what,
            child,
            log,
            reaped: None,
            log_reported: true,
        };
        match tokio::time::timeout(STARTUP_TIMEOUT, ready_rx.recv()).await {
            Ok(Some(found)) => {
                process.log_reported = false;
                (process, found)
            }
            Ok(None) => {
                let status = process.child.wait().ok();
                process.reaped = status;
                panic!(
                    "quiver {what} {description} exited before listening ({status:?}); log:\n{}",
                    process.log_tail()
                );
            }
            Err(_) => panic!(
                "quiver {what} {description} did not listen within {STARTUP_TIMEOUT:?}; log:\n{}",
                process.log_tail()
            ),
        }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).expect("pid fits i32"))
    }

    fn log_tail(&self) -> String {
        let lines = self
            .log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        lines
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn logged(&self, needle: &str) -> bool {
        !self.logged_lines(needle).is_empty()
    }

    fn logged_lines(&self, needle: &str) -> Vec<String> {
        let lines = self
            .log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        lines
            .iter()
            .filter(|line| line.contains(needle))
            .cloned()
            .collect()
    }

    fn signal(&self, signal: Signal) {
        assert!(self.reaped.is_none(), "process already exited");
        signal::kill(self.pid(), signal).unwrap_or_else(|err| panic!("kill({signal}): {err}"));
    }

    fn is_running(&mut self) -> bool {
        if self.reaped.is_none() {
            self.reaped = self.child.try_wait().expect("try_wait");
        }
        self.reaped.is_none()
    }

    fn kill_hard(&mut self) {
        if self.reaped.is_none() {
            let _ = signal::kill(self.pid(), Signal::SIGKILL);
            self.reaped = Some(self.child.wait().expect("reap killed process"));
        }
    }

    async fn terminate(&mut self, timeout: Duration) -> (ExitStatus, Duration) {
        self.signal(Signal::SIGTERM);
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                self.reaped = Some(status);
                return (status, started.elapsed());
            }
            if started.elapsed() > timeout {
                panic!(
                    "{} did not exit within {timeout:?} of SIGTERM; log:\n{}",
                    self.what,
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.kill_hard();
        if std::thread::panicking() && !self.log_reported {
            eprintln!(
                "--- {} {} log (last {LOG_TAIL} lines) ---\n{}\n--- end of log ---",
                self.what,
                self.child.id(),
                self.log_tail()
            );
        }
    }
}

/// A running `quiver registry`.
pub struct RegistryProcess {
    process: Supervised,
    grpc: SocketAddr,
    http: SocketAddr,
}

/// Arguments every test registry gets: ephemeral loopback ports, JSON logs.
const BASE_ARGS: [&str; 6] = [
    "--grpc-listen",
    "127.0.0.1:0",
    "--http-listen",
    "127.0.0.1:0",
    "--log-format",
    "json",
];

impl RegistryProcess {
    /// Starts `quiver registry BASE_ARGS ARGS` and waits until it listens.
    pub async fn start<S: AsRef<str>>(args: &[S]) -> RegistryProcess {
        RegistryProcess::start_with(&BASE_ARGS, args).await
    }

    /// Like [`RegistryProcess::start`], but gRPC listens on `grpc` (e.g. the
    /// address of a registry that stopped, so its workers find the new one).
    pub async fn start_on<S: AsRef<str>>(grpc: SocketAddr, args: &[S]) -> RegistryProcess {
        let grpc = grpc.to_string();
        let base = [
            "--grpc-listen",
            grpc.as_str(),
            "--http-listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
        ];
        RegistryProcess::start_with(&base, args).await
    }

    /// Like [`RegistryProcess::start`], in the network namespace `netns`,
    /// listening on `host` (its address there).
    pub async fn start_in<S: AsRef<str>>(
        netns: &str,
        host: std::net::IpAddr,
        args: &[S],
    ) -> RegistryProcess {
        let any_port = SocketAddr::new(host, 0).to_string();
        let base = [
            "--grpc-listen",
            any_port.as_str(),
            "--http-listen",
            any_port.as_str(),
            "--log-format",
            "json",
        ];
        RegistryProcess::spawn(Some(netns), &base, args).await
    }

    async fn start_with<S: AsRef<str>>(base: &[&str], args: &[S]) -> RegistryProcess {
        RegistryProcess::spawn(None, base, args).await
    }

    async fn spawn<S: AsRef<str>>(
        netns: Option<&str>,
        base: &[&str],
        args: &[S],
    ) -> RegistryProcess {
        let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
        let mut command = quiver_command_in(netns);
        command.arg("registry").args(base).args(&args);
        let (process, (grpc, http)) =
            Supervised::spawn("registry", command, &args.join(" "), listening_addrs).await;
        RegistryProcess {
            process,
            grpc,
            http,
        }
    }

    /// Starts a registry on `database_url` with the given admin token.
    pub async fn with_admin(database_url: &str, admin_token: &str) -> RegistryProcess {
        RegistryProcess::start(&["--database-url", database_url, "--admin-token", admin_token])
            .await
    }

    /// The gRPC listen address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc
    }

    /// `http://<grpc addr>`.
    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// `http://<http addr>`.
    pub fn http_url(&self) -> String {
        format!("http://{}", self.http)
    }

    /// The process id.
    pub fn pid(&self) -> Pid {
        self.process.pid()
    }

    /// A client on a new channel, with `token` as bearer credential.
    pub async fn client(&self, token: Option<&str>) -> Client {
        connect(&self.grpc_url(), token).await
    }

    /// The last log lines (stderr), for failure messages.
    pub fn log_tail(&self) -> String {
        self.process.log_tail()
    }

    /// Whether a log line containing `needle` was seen (among the kept lines).
    pub fn logged(&self, needle: &str) -> bool {
        self.process.logged(needle)
    }

    /// Sends a signal (the process must still be running).
    pub fn signal(&self, signal: Signal) {
        self.process.signal(signal);
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    /// SIGHUP: rescan `mcp.d`.
    pub fn sighup(&self) {
        self.signal(Signal::SIGHUP);
    }

    /// SIGKILL and reap: a crash, with whatever was in flight.
    pub fn kill_hard(&mut self) {
        self.process.kill_hard();
    }

    /// SIGTERM, then waits (at most `timeout`) for the process to exit;
    /// returns its status and how long it took. Fails the test on timeout.
    pub async fn terminate(&mut self, timeout: Duration) -> (ExitStatus, Duration) {
        self.process.terminate(timeout).await
    }
}

/// Reads stderr until EOF, keeps the tail, and reports the first line that
/// `listening` accepts.
fn drain<T>(
    stderr: std::process::ChildStderr,
    tail: &LogTail,
    ready: &tokio::sync::mpsc::UnboundedSender<T>,
    listening: fn(&str) -> Option<T>,
) {
    let mut reported = false;
    for line in BufReader::new(stderr).lines() {
        let Ok(line) = line else { break };
        if !reported && let Some(found) = listening(&line) {
            reported = true;
            let _ = ready.send(found);
        }
        let mut lines = tail
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if lines.len() == LOG_TAIL {
            lines.pop_front();
        }
        lines.push_back(line);
    }
}

/// The `fields` of a JSON log line whose message is `message`.
fn log_fields(line: &str, message: &str) -> Option<serde_json::Value> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    let fields = value.get("fields")?;
    (fields.get("message")?.as_str()? == message).then(|| fields.clone())
}

/// The `(grpc, http)` addresses of a `quiver registry listening` JSON log line.
fn listening_addrs(line: &str) -> Option<(SocketAddr, SocketAddr)> {
    let fields = log_fields(line, "quiver registry listening")?;
    let addr = |name: &str| fields.get(name)?.as_str()?.parse::<SocketAddr>().ok();
    Some((addr("grpc")?, addr("http")?))
}

/// The HTTP address of a `quiver worker listening` JSON log line.
fn worker_listening_addr(line: &str) -> Option<SocketAddr> {
    log_fields(line, "quiver worker listening")?
        .get("http")?
        .as_str()?
        .parse()
        .ok()
}

/// How long a worker may take to answer `/readyz` with 200 once it listens.
const WORKER_READY_TIMEOUT: Duration = Duration::from_secs(10);

/// A running `quiver worker`, with an HTTP client for its API that presents
/// the caller token it was started with.
pub struct WorkerProcess {
    process: Supervised,
    /// `http://<http addr>`, or `https://localhost:<port>` over TLS.
    url: String,
    caller_token: String,
    client: reqwest::Client,
}

impl WorkerProcess {
    /// Starts `quiver worker --registry REGISTRY --token WORKER_TOKEN
    /// --caller-token CALLER_TOKEN --http-listen 127.0.0.1:0 --log-format
    /// json ARGS` and waits until it listens and `/readyz` answers 200 (it
    /// holds a first snapshot of the registry).
    pub async fn start<S: AsRef<str>>(
        registry_url: &str,
        worker_token: &str,
        caller_token: &str,
        args: &[S],
    ) -> WorkerProcess {
        WorkerProcess::start_with_env(registry_url, worker_token, caller_token, args, &[]).await
    }

    /// Like [`WorkerProcess::start`], with `env` added to the worker's
    /// environment.
    pub async fn start_with_env<S: AsRef<str>>(
        registry_url: &str,
        worker_token: &str,
        caller_token: &str,
        args: &[S],
        env: &[(&str, &str)],
    ) -> WorkerProcess {
        WorkerProcess::spawn(
            registry_url,
            worker_token,
            Some(caller_token),
            args,
            env,
            None,
            None,
        )
        .await
    }

    /// Like [`WorkerProcess::start`] without any caller token: its callers
    /// are the registry's (API keys, identity providers).
    pub async fn start_without_callers<S: AsRef<str>>(
        registry_url: &str,
        worker_token: &str,
        args: &[S],
    ) -> WorkerProcess {
        WorkerProcess::spawn(registry_url, worker_token, None, args, &[], None, None).await
    }

    /// Like [`WorkerProcess::start`], in the network namespace `netns`,
    /// listening on `host` (its address there).
    pub async fn start_in<S: AsRef<str>>(
        netns: &str,
        host: std::net::IpAddr,
        registry_url: &str,
        worker_token: &str,
        caller_token: &str,
        args: &[S],
    ) -> WorkerProcess {
        WorkerProcess::spawn(
            registry_url,
            worker_token,
            Some(caller_token),
            args,
            &[],
            None,
            Some((netns, host)),
        )
        .await
    }

    /// Like [`WorkerProcess::start`] for a worker whose HTTP listener serves
    /// TLS (`args` hold its `--tls-cert`/`--tls-key`) with a certificate for
    /// `localhost` issued by `ca_pem`, which the test client trusts.
    pub async fn start_tls<S: AsRef<str>>(
        registry_url: &str,
        worker_token: &str,
        caller_token: &str,
        args: &[S],
        ca_pem: &[u8],
    ) -> WorkerProcess {
        WorkerProcess::spawn(
            registry_url,
            worker_token,
            Some(caller_token),
            args,
            &[],
            Some(ca_pem),
            None,
        )
        .await
    }

    async fn spawn<S: AsRef<str>>(
        registry_url: &str,
        worker_token: &str,
        caller_token: Option<&str>,
        args: &[S],
        env: &[(&str, &str)],
        ca_pem: Option<&[u8]>,
        placement: Option<(&str, std::net::IpAddr)>,
    ) -> WorkerProcess {
        let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
        let mut command = quiver_command_in(placement.map(|(netns, _)| netns));
        let listen = SocketAddr::new(
            placement.map_or(std::net::Ipv4Addr::LOCALHOST.into(), |(_, host)| host),
            0,
        )
        .to_string();
        command.envs(env.iter().copied());
        command.arg("worker").args([
            "--registry",
            registry_url,
            "--token",
            worker_token,
            "--http-listen",
            &listen,
            "--log-format",
            "json",
        ]);
        if let Some(caller_token) = caller_token {
            command.args(["--caller-token", caller_token]);
        }
        command.args(&args);
        let description = format!("--registry {registry_url} {}", args.join(" "));
        let (process, http) =
            Supervised::spawn("worker", command, &description, worker_listening_addr).await;
        let mut client = reqwest::Client::builder().timeout(Duration::from_secs(30));
        let url = match ca_pem {
            Some(pem) => {
                client = client.tls_certs_only([
                    reqwest::Certificate::from_pem(pem).expect("CA certificate PEM")
                ]);
                format!("https://localhost:{}", http.port())
            }
            None => format!("http://{http}"),
        };
        let worker = WorkerProcess {
            process,
            url,
            caller_token: caller_token.unwrap_or_default().to_owned(),
            client: client.build().expect("http client"),
        };
        let started = Instant::now();
        loop {
            let (status, body) = worker.readyz().await;
            if status == reqwest::StatusCode::OK {
                break;
            }
            assert!(
                started.elapsed() < WORKER_READY_TIMEOUT,
                "worker not ready within {WORKER_READY_TIMEOUT:?}: {status} {body}; log:\n{}",
                worker.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        worker
    }

    /// `http://<http addr>` (`https://localhost:<port>` over TLS).
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The process id.
    pub fn pid(&self) -> Pid {
        self.process.pid()
    }

    /// The last log lines (stderr), for failure messages.
    pub fn log_tail(&self) -> String {
        self.process.log_tail()
    }

    /// Whether a log line containing `needle` was seen (among the kept lines).
    pub fn logged(&self, needle: &str) -> bool {
        self.process.logged(needle)
    }

    /// The kept log lines containing `needle`.
    pub fn logged_lines(&self, needle: &str) -> Vec<String> {
        self.process.logged_lines(needle)
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    /// SIGTERM, then waits (at most `timeout`) for the process to exit.
    pub async fn terminate(&mut self, timeout: Duration) -> (ExitStatus, Duration) {
        self.process.terminate(timeout).await
    }

    /// `GET path` with the caller token: status and JSON body (`Null` when
    /// the body is not JSON).
    pub async fn get(&self, path: &str) -> (reqwest::StatusCode, serde_json::Value) {
        let response = self
            .client
            .get(format!("{}{path}", self.url()))
            .bearer_auth(&self.caller_token)
            .send()
            .await
            .unwrap_or_else(|err| panic!("GET {path}: {err}"));
        json_of(response).await
    }

    /// `GET /readyz` (no credential).
    pub async fn readyz(&self) -> (reqwest::StatusCode, serde_json::Value) {
        let response = self
            .client
            .get(format!("{}/readyz", self.url()))
            .send()
            .await
            .unwrap_or_else(|err| panic!("GET /readyz: {err}"));
        json_of(response).await
    }

    /// Waits (at most `timeout`) until the snapshot is at `revision` and not
    /// degraded.
    pub async fn synced(&self, revision: u64, timeout: Duration) {
        eventually(
            timeout,
            &format!("worker at revision {revision}"),
            || async move {
                let (_, ready) = self.readyz().await;
                (ready["revision"] == revision && ready["degraded"] == false).then_some(())
            },
        )
        .await;
    }

    /// `GET /v1/mcp/tools`: the tool objects (fails the test unless 200).
    pub async fn tools(&self) -> Vec<serde_json::Value> {
        let (status, body) = self.get("/v1/mcp/tools").await;
        assert_eq!(status, reqwest::StatusCode::OK, "GET /v1/mcp/tools: {body}");
        body.as_array().expect("tool list is an array").clone()
    }

    /// The injected names of `GET /v1/mcp/tools`, sorted.
    pub async fn tool_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .tools()
            .await
            .iter()
            .map(|tool| tool["name"].as_str().expect("tool name").to_owned())
            .collect();
        names.sort();
        names
    }

    /// `POST /v1/mcp/tools/call {name, arguments}`: status and JSON body.
    pub async fn call(
        &self,
        name: &str,
        arguments: serde_json::Value,
    ) -> (reqwest::StatusCode, serde_json::Value) {
        let response = self
            .client
            .post(format!("{}/v1/mcp/tools/call", self.url()))
            .bearer_auth(&self.caller_token)
            .json(&serde_json::json!({"name": name, "arguments": arguments}))
            .send()
            .await
            .unwrap_or_else(|err| panic!("POST /v1/mcp/tools/call {name}: {err}"));
        json_of(response).await
    }

    /// Calls a tool that must succeed with one text item; returns the text.
    pub async fn call_text(&self, name: &str, arguments: serde_json::Value) -> String {
        let (status, body) = self.call(name, arguments).await;
        assert_eq!(
            (status, &body["is_error"]),
            (reqwest::StatusCode::OK, &serde_json::json!(false)),
            "call {name}: {body}"
        );
        let content = body["content"].as_array().expect("content array");
        assert_eq!(content.len(), 1, "call {name}: one content item: {body}");
        assert_eq!(content[0]["type"], "text", "call {name}: {body}");
        content[0]["text"].as_str().expect("text").to_owned()
    }

    /// `GET /v1/mcp/servers`: the entry of `server_id` (`None` if absent).
    pub async fn server(&self, server_id: &str) -> Option<serde_json::Value> {
        let (status, body) = self.get("/v1/mcp/servers").await;
        assert_eq!(
            status,
            reqwest::StatusCode::OK,
            "GET /v1/mcp/servers: {body}"
        );
        body["servers"]
            .as_array()
            .expect("servers array")
            .iter()
            .find(|server| server["server_id"] == server_id)
            .cloned()
    }
}

async fn json_of(response: reqwest::Response) -> (reqwest::StatusCode, serde_json::Value) {
    let status = response.status();
    let bytes = response.bytes().await.expect("response body");
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    )
}

/// The admin REST API of a registry (`/admin/api/mcp/servers`).
pub struct Admin {
    base: String,
    root: String,
    token: String,
    client: reqwest::Client,
}

impl Admin {
    /// The admin API of `registry` with `admin_token`.
    pub fn new(registry: &RegistryProcess, admin_token: &str) -> Admin {
        Admin {
            base: format!("{}/admin/api/mcp/servers", registry.http_url()),
            root: registry.http_url(),
            token: admin_token.to_owned(),
            client: reqwest::Client::new(),
        }
    }

    /// `method path` (from the registry's root, e.g. `/admin/api/keys`)
    /// with the admin token and `body` as JSON: status and JSON body.
    pub async fn rest(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (reqwest::StatusCode, serde_json::Value) {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.root))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        json_of(request.send().await.expect("registry REST")).await
    }

    /// Upserts `record` (a `mcp.d` record as JSON); returns the new revision.
    pub async fn upsert(&self, record: serde_json::Value) -> u64 {
        let response = self
            .client
            .post(&self.base)
            .bearer_auth(&self.token)
            .json(&record)
            .send()
            .await
            .expect("POST /admin/api/mcp/servers");
        let (status, body) = json_of(response).await;
        assert!(
            status.is_success() && body["unchanged"] == false,
            "upsert {record}: {status} {body}"
        );
        body["revision"].as_u64().expect("revision")
    }

    /// Deletes `server_id`; returns the new revision.
    pub async fn delete(&self, server_id: &str) -> u64 {
        let response = self
            .client
            .delete(format!("{}/{server_id}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .expect("DELETE /admin/api/mcp/servers/{id}");
        let (status, body) = json_of(response).await;
        assert!(status.is_success(), "delete {server_id}: {status} {body}");
        body["revision"].as_u64().expect("revision")
    }
}

/// One stateless MCP 2026-07-28 request `method` (with `params`, `name`
/// for the `Mcp-Name` header) to the endpoint `url` with `token`: the
/// JSON-RPC message answered (the first of an SSE stream).
pub async fn mcp_2026(
    url: &str,
    token: &str,
    method: &str,
    name: Option<&str>,
    mut params: serde_json::Value,
) -> serde_json::Value {
    params["_meta"] = serde_json::json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    let mut request = reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method);
    if let Some(name) = name {
        request = request.header("mcp-name", name);
    }
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let response = request
        .json(&body)
        .send()
        .await
        .unwrap_or_else(|err| panic!("POST {url} {method}: {err}"));
    let text = response.text().await.expect("body");
    let message = text
        .lines()
        .find_map(|line| line.strip_prefix("data:"))
        .unwrap_or(&text);
    serde_json::from_str(message.trim()).unwrap_or_else(|err| panic!("{text:?}: {err}"))
}

/// The admin token of the e2e registries.
pub const ADMIN: &str = "e2e-admin-token";
/// The worker token of the e2e registries.
pub const WORKER: &str = "e2e-worker-token";
/// The caller token of the e2e workers (task `default`).
pub const CALLER: &str = "e2e-caller-token";

/// Path of the testkit binary `name` (built next to `quiver` by cargo).
pub fn testkit_bin(name: &str) -> String {
    let path = std::path::Path::new(quiver_bin()).with_file_name(name);
    assert!(
        path.is_file(),
        "{} is missing; build it: cargo build -p quiver-testkit",
        path.display()
    );
    path.to_str().expect("utf-8 path").to_owned()
}

/// Path of the peer script `name` in `tests/e2e/peers/`.
pub fn peer(name: &str) -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/e2e/peers")
        .join(name)
        .display()
        .to_string()
}

/// The injected name, computed independently of the product's code:
/// `mcp__<b64url(server_id)>__<b64url(tool)>` without padding.
pub fn injected(server_id: &str, tool: &str) -> String {
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    format!(
        "mcp__{}__{}",
        URL_SAFE_NO_PAD.encode(server_id),
        URL_SAFE_NO_PAD.encode(tool)
    )
}

/// A stdio record running the test MCP server.
pub fn stdio_record(server_id: &str, allowed: &[&str]) -> serde_json::Value {
    serde_json::json!({
        "server_id": server_id,
        "transport": "stdio",
        "stdio": {"command": testkit_mcp_bin()},
        "allowed_tools": allowed,
    })
}

/// A record of the npm reference server `@modelcontextprotocol/server-everything`
/// (installed by scripts/test.sh, run by the Node it installs) over stdio.
pub fn everything_record(server_id: &str, allowed: &[&str]) -> serde_json::Value {
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!(
                "{name} is not set: run the tests with scripts/test.sh, which installs Node 24 \
                 and @modelcontextprotocol/server-everything and exports it"
            )
        })
    };
    serde_json::json!({
        "server_id": server_id,
        "transport": "stdio",
        "stdio": {
            "command": var("QUIVER_TEST_NODE"),
            "args": [var("QUIVER_TEST_EVERYTHING"), "stdio"],
        },
        "allowed_tools": allowed,
    })
}

/// A registry on `db_url` with the e2e tokens (gRPC on `grpc` when given,
/// else ephemeral).
pub async fn registry(db_url: &str, grpc: Option<SocketAddr>) -> RegistryProcess {
    let args = [
        "--database-url",
        db_url,
        "--admin-token",
        ADMIN,
        "--worker-token",
        WORKER,
    ];
    match grpc {
        Some(grpc) => RegistryProcess::start_on(grpc, &args).await,
        None => RegistryProcess::start(&args).await,
    }
}

/// A SQLite database URL in a new temporary directory (the database lives
/// as long as the directory).
pub fn sqlite() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("quiver.db").display());
    (dir, url)
}

/// Path of the `quiver-testkit-mcp` binary (built next to `quiver`), as
/// the text records and commands take.
pub fn testkit_mcp_bin() -> String {
    quiver_testkit::mcp_server::testkit_mcp_bin()
        .display()
        .to_string()
}

/// A `quiver-testkit-mcp` process serving an HTTP transport; killed on drop.
pub struct McpServerProcess {
    child: Child,
    url: String,
}

impl McpServerProcess {
    /// Starts `quiver-testkit-mcp --transport TRANSPORT` (`streamable-http`
    /// or `sse`) on an ephemeral loopback port and reads its URL from the
    /// `{"listening": …}` line it prints.
    pub async fn start(transport: &str) -> McpServerProcess {
        let mut command = Command::new(testkit_mcp_bin());
        command.args(["--transport", transport, "--listen", "127.0.0.1:0"]);
        McpServerProcess::announced(command).await
    }

    /// Starts `command`, an MCP server that prints `{"listening": URL}`
    /// once it listens, and reads its URL.
    pub async fn announced(mut command: Command) -> McpServerProcess {
        let what = format!("{command:?}");
        let mut child = command
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|err| panic!("spawn {what}: {err}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        // Owned from here on, so a failure below still kills the child.
        let mut server = McpServerProcess {
            child,
            url: String::new(),
        };
        let line = tokio::time::timeout(STARTUP_TIMEOUT, rx)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_else(|| panic!("{what}: no listening line within {STARTUP_TIMEOUT:?}"));
        let value: serde_json::Value = serde_json::from_str(&line)
            .unwrap_or_else(|err| panic!("{what}: bad listening line {line:?}: {err}"));
        server.url = value["listening"]
            .as_str()
            .unwrap_or_else(|| panic!("no url in {line:?}"))
            .to_owned();
        server
    }

    /// The MCP endpoint (`…/mcp` or `…/sse`).
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for McpServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `probe` every 50 ms until it returns `Some`, at most `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(
            started.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `/metrics` page at `metrics_url`, as text.
pub async fn metrics_text(metrics_url: &str) -> String {
    reqwest::get(metrics_url)
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text")
}

/// The sum of the samples of `metric` on the `/metrics` page at
/// `metrics_url` whose labels hold every one of `labels` (`name="value"`);
/// 0 when there is none.
pub async fn metric_sum(metrics_url: &str, metric: &str, labels: &[&str]) -> f64 {
    let page = metrics_text(metrics_url).await;
    let prefix = format!("{metric}{{");
    page.lines()
        .filter(|line| line.starts_with(&prefix))
        .filter(|line| labels.iter().all(|label| line.contains(label)))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .fold(0.0, |sum, sample| sum + sample)
}

/// One line of `/proc/<pid>/stat`, the fields the tests need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Process id.
    pub pid: i32,
    /// State letter (`R`, `S`, `Z`, …).
    pub state: char,
    /// Parent process id.
    pub ppid: i32,
    /// Process group id.
    pub pgrp: i32,
    /// Start time in clock ticks since boot (tells a reused pid apart).
    pub start_time: u64,
}

/// `/proc/<pid>/stat` of `pid`, if such a process (or zombie) exists.
pub fn proc_stat(pid: i32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces or parentheses.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(ProcStat {
        pid,
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        // Field 22 of stat; `rest` starts at field 3.
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// Every process in the process table.
pub fn processes() -> Vec<ProcStat> {
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(proc_stat)
        .collect()
}

#[test]
fn parses_the_worker_listening_line() {
    let line = r#"{"timestamp":"2026-11-22T18:17:35.012818Z","level":"INFO","fields":{"message":"quiver worker listening","http":"127.0.0.1:37695","registry":"http://127.0.0.1:33193"},"target":"quiver::cmd::worker"}"#;
    assert_eq!(
        worker_listening_addr(line),
        Some("127.0.0.1:37695".parse().unwrap())
    );
    assert_eq!(
        worker_listening_addr(&line.replace("worker", "registry")),
        None
    );
}

#[test]
fn reads_this_process_from_proc() {
    let me = proc_stat(i32::try_from(std::process::id()).unwrap()).expect("own stat");
    assert_eq!(me.ppid, nix::unistd::getppid().as_raw());
    assert_eq!(me.pgrp, nix::unistd::getpgrp().as_raw());
    assert!(me.start_time > 0);
    assert!(processes().iter().any(|p| p.pid == me.pid));
}

#[test]
fn parses_the_listening_line() {
    let line = r#"{"timestamp":"2026-01-01T00:00:00Z","level":"INFO","fields":{"message":"quiver registry listening","grpc":"127.0.0.1:4001","http":"127.0.0.1:4002","insecure":false},"target":"quiver::cmd::registry"}"#;
    assert_eq!(
        listening_addrs(line),
        Some((
            "127.0.0.1:4001".parse().unwrap(),
            "127.0.0.1:4002".parse().unwrap()
        ))
    );
    assert_eq!(listening_addrs("plain text"), None);
}
