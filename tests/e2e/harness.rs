//! Spawning and driving real `quiver` processes.
//!
//! A [`RegistryProcess`] runs `quiver registry` on ephemeral loopback ports and
//! learns them from its JSON log line `quiver registry listening`. Its stderr
//! is drained by a background thread for the whole life of the process (the
//! last lines are kept for failure messages), and dropping it SIGKILLs and
//! reaps the child, so a failing test never leaks a process.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use quiver_proto::v1 as pb;
use quiver_proto::v1::mcp_registry_service_client::McpRegistryServiceClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// How long a registry may take to log that it is listening.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Log lines kept for diagnostics.
const LOG_TAIL: usize = 200;

/// Path of the `quiver` binary built for this test run.
pub fn quiver_bin() -> &'static str {
    env!("CARGO_BIN_EXE_quiver")
}

/// A `quiver` command isolated from the test process environment: no
/// inherited `QUIVER_*` or `RUST_LOG` setting can change what it does.
pub fn quiver_command() -> Command {
    let mut command = Command::new(quiver_bin());
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(|k| k.starts_with("QUIVER_")) {
            command.env_remove(&key);
        }
    }
    command.env("RUST_LOG", "info,sqlx=warn");
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

/// Adds `authorization: Bearer <token>` to every request (when a token is set).
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// A registry client with its credential attached.
pub type Client = McpRegistryServiceClient<InterceptedService<Channel, Bearer>>;

/// Connects a new channel (its own HTTP/2 connection) to `url`.
pub async fn connect(url: &str, token: Option<&str>) -> Client {
    let channel = Channel::from_shared(url.to_owned())
        .expect("grpc url")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap_or_else(|err| panic!("cannot connect to {url}: {err}"));
    let bearer = Bearer(token.map(|t| {
        format!("Bearer {t}")
            .parse()
            .expect("token is valid header text")
    }));
    McpRegistryServiceClient::with_interceptor(channel, bearer)
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

/// Ring buffer of the last log lines of a process.
type LogTail = Arc<Mutex<VecDeque<String>>>;

/// A running `quiver registry`.
pub struct RegistryProcess {
    child: Child,
    grpc: SocketAddr,
    http: SocketAddr,
    log: LogTail,
    reaped: Option<ExitStatus>,
    /// Whether the log tail was already part of a failure message.
    log_reported: bool,
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
        let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
        let mut command = quiver_command();
        command
            .arg("registry")
            .args(BASE_ARGS)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("spawn quiver registry");
        let stderr = child.stderr.take().expect("piped stderr");
        let log: LogTail = Arc::new(Mutex::new(VecDeque::with_capacity(LOG_TAIL)));
        let (ready_tx, mut ready_rx) = tokio::sync::mpsc::unbounded_channel();
        let tail = log.clone();
        std::thread::spawn(move || drain(stderr, &tail, &ready_tx));
        let mut process = RegistryProcess {
            child,
            grpc: SocketAddr::from(([127, 0, 0, 1], 0)),
            http: SocketAddr::from(([127, 0, 0, 1], 0)),
            log,
            reaped: None,
            log_reported: true,
        };
        match tokio::time::timeout(STARTUP_TIMEOUT, ready_rx.recv()).await {
            Ok(Some((grpc, http))) => {
                process.grpc = grpc;
                process.http = http;
                process.log_reported = false;
                process
            }
            Ok(None) => {
                let status = process.child.wait().ok();
                process.reaped = status;
                panic!(
                    "quiver registry {} exited before listening ({status:?}); log:\n{}",
                    args.join(" "),
                    process.log_tail()
                );
            }
            Err(_) => panic!(
                "quiver registry {} did not listen within {STARTUP_TIMEOUT:?}; log:\n{}",
                args.join(" "),
                process.log_tail()
            ),
        }
    }

    /// Starts a registry on `database_url` with the given admin token.
    pub async fn with_admin(database_url: &str, admin_token: &str) -> RegistryProcess {
        RegistryProcess::start(&["--database-url", database_url, "--admin-token", admin_token])
            .await
    }

    /// `http://<grpc addr>`.
    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// `http://<http addr>`.
    pub fn http_url(&self) -> String {
        format!("http://{}", self.http)
    }

    /// A client on a new channel, with `token` as bearer credential.
    pub async fn client(&self, token: Option<&str>) -> Client {
        connect(&self.grpc_url(), token).await
    }

    /// The process id.
    pub fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).expect("pid fits i32"))
    }

    /// The last log lines (stderr), for failure messages.
    pub fn log_tail(&self) -> String {
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

    /// Whether a log line containing `needle` was seen (among the kept lines).
    pub fn logged(&self, needle: &str) -> bool {
        let lines = self
            .log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        lines.iter().any(|line| line.contains(needle))
    }

    /// Sends a signal (the process must still be running).
    pub fn signal(&self, signal: Signal) {
        assert!(self.reaped.is_none(), "process already exited");
        signal::kill(self.pid(), signal).unwrap_or_else(|err| panic!("kill({signal}): {err}"));
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        if self.reaped.is_none() {
            self.reaped = self.child.try_wait().expect("try_wait");
        }
        self.reaped.is_none()
    }

    /// SIGHUP: rescan `mcp.d`.
    pub fn sighup(&self) {
        self.signal(Signal::SIGHUP);
    }

    /// SIGKILL and reap: a crash, with whatever was in flight.
    pub fn kill_hard(&mut self) {
        if self.reaped.is_none() {
            let _ = signal::kill(self.pid(), Signal::SIGKILL);
            self.reaped = Some(self.child.wait().expect("reap killed registry"));
        }
    }

    /// SIGTERM, then waits (at most `timeout`) for the process to exit;
    /// returns its status and how long it took. Fails the test on timeout.
    pub async fn terminate(&mut self, timeout: Duration) -> (ExitStatus, Duration) {
        self.signal(Signal::SIGTERM);
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                self.reaped = Some(status);
                return (status, started.elapsed());
            }
            if started.elapsed() > timeout {
                panic!(
                    "registry did not exit within {timeout:?} of SIGTERM; log:\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for RegistryProcess {
    fn drop(&mut self) {
        self.kill_hard();
        if std::thread::panicking() && !self.log_reported {
            eprintln!(
                "--- registry {} log (last {LOG_TAIL} lines) ---\n{}\n--- end of log ---",
                self.grpc,
                self.log_tail()
            );
        }
    }
}

/// Reads stderr until EOF, keeps the tail, and reports the listening line.
fn drain(
    stderr: std::process::ChildStderr,
    tail: &LogTail,
    ready: &tokio::sync::mpsc::UnboundedSender<(SocketAddr, SocketAddr)>,
) {
    let mut reported = false;
    for line in BufReader::new(stderr).lines() {
        let Ok(line) = line else { break };
        if !reported && let Some(addrs) = listening_addrs(&line) {
            reported = true;
            let _ = ready.send(addrs);
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

/// The `(grpc, http)` addresses of a `quiver registry listening` JSON log line.
fn listening_addrs(line: &str) -> Option<(SocketAddr, SocketAddr)> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    let fields = value.get("fields")?;
    if fields.get("message")?.as_str()? != "quiver registry listening" {
        return None;
    }
    let addr = |name: &str| fields.get(name)?.as_str()?.parse::<SocketAddr>().ok();
    Some((addr("grpc")?, addr("http")?))
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
