//! One live MCP client connection, on any of the three transports.
//!
//! Stdio children run in their own process group, with a minimal
//! environment, stdout reserved for the protocol and stderr captured into a
//! bounded tail for diagnostics; closing a connection ends everything the
//! server started (the crate's `process_tree` module) and reaps it. What the server
//! sends on its own (log notifications and the like) goes to its
//! [`ServerLog`], never one log line per message.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use process_wrap::tokio::{CommandWrap, ProcessGroup};
use quiver_model::Protocol;
use rmcp::model::ProtocolVersion;
use rmcp::service::{Peer, RunningService};
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpClientTransportConfig,
};
use rmcp::transport::{StreamableHttpClientTransport, Transport};
use rmcp::{ClientServiceExt, RoleClient};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::{Notify, OwnedSemaphorePermit};

pub use crate::client_side::ClientSide;
use crate::credentials::{BrokeredClient, CredentialSource, GrantBinding, GrantRef};
use crate::direct_call::{DirectCalls, DirectParts};
use crate::error::McpError;
use crate::launch::{HttpLaunch, Launch, StdioLaunch};
use crate::lifecycle::Handshake;
use crate::peer_events::PeerEvents;
use crate::process_tree;
use crate::server_log::ServerLog;
use crate::sse_answer::AnswerFirst;
use crate::stdio::StdioTransport;

/// Lines of stderr kept per server.
pub const STDERR_TAIL_LINES: usize = 50;
/// Longest stderr line kept (longer lines are cut).
const STDERR_LINE_MAX: usize = 1024;

/// The last lines a server wrote to stderr, across restarts.
#[derive(Debug, Clone, Default)]
pub struct StderrTail {
    lines: Arc<Mutex<VecDeque<String>>>,
    readers: Arc<Readers>,
    events: Arc<PeerEvents>,
}

/// Stderr pipes still being read into a tail.
#[derive(Debug, Default)]
struct Readers {
    open: AtomicUsize,
    closed: Notify,
}

impl StderrTail {
    fn push(&self, line: &str) {
        let line = crate::output::truncate_utf8(line, STDERR_LINE_MAX).to_owned();
        let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        if lines.len() == STDERR_TAIL_LINES {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    /// The kept lines, oldest first.
    pub fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// The last few lines joined, for error messages.
    pub fn summary(&self, last: usize) -> String {
        let lines = self.lines();
        lines[lines.len().saturating_sub(last)..].join(" | ")
    }

    /// Waits, at most `max`, until every stderr pipe feeding this tail has
    /// reached its end. A child that failed may still have its last words in
    /// the pipe when the protocol error arrives; after the process group is
    /// gone this lets a caller report them.
    pub async fn drained(&self, max: Duration) {
        let _ = tokio::time::timeout(max, async {
            loop {
                let closed = self.readers.closed.notified();
                tokio::pin!(closed);
                // Registered before the check, so a close in between is not missed.
                closed.as_mut().enable();
                if self.readers.open.load(Ordering::Acquire) == 0 {
                    return;
                }
                closed.await;
            }
        })
        .await;
    }

    /// Reads `stderr` into the tail until it ends.
    fn follow(&self, stderr: tokio::process::ChildStderr, pid: Option<u32>) {
        let tail = self.clone();
        tail.readers.open.fetch_add(1, Ordering::AcqRel);
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(suppressed) = tail.events.admit("stderr") {
                    tracing::debug!(target: "quiver::mcp::stderr", pid, suppressed, line = %line);
                }
                tail.push(&line);
            }
            tail.readers.open.fetch_sub(1, Ordering::AcqRel);
            tail.readers.closed.notify_waiters();
        });
    }
}

/// Settings that apply to every connection.
#[derive(Clone)]
pub struct ConnectSettings {
    /// Bound on spawning/connecting plus the handshake (`server/discover`
    /// and/or `initialize`).
    pub initialize_timeout: Duration,
    /// The record's `protocol`: the era the handshake opens (see
    /// [`crate::lifecycle`]).
    pub protocol: Protocol,
    /// Longest message a stdio server may send (see the crate's `stdio` module).
    pub max_message_bytes: usize,
    /// HTTP client shared by the HTTP transports.
    pub http: reqwest::Client,
    /// Parallel requests one HTTP connection may carry.
    pub max_concurrent_requests: usize,
    /// Hosts the HTTP transports may connect to (checked before connecting).
    pub egress: crate::egress::EgressPolicy,
    /// Bearer tokens of records with `http.auth_ref` (none: such records
    /// cannot connect).
    pub credentials: Option<Arc<dyn CredentialSource>>,
    /// The caller whose grant the connection carries when its OAuth
    /// connection is per user (`None`: the fleet-wide grant).
    pub principal: Option<String>,
}

/// A connected, initialized MCP client.
pub struct Connection {
    peer: Peer<RoleClient>,
    /// `tools/call` posted by its caller (streamable HTTP only).
    direct: Option<Arc<DirectCalls>>,
    /// The protocol version the handshake settled on.
    protocol_version: ProtocolVersion,
    service: tokio::sync::Mutex<Option<RunningService<RoleClient, ClientSide>>>,
    pid: Option<u32>,
    /// The stdio server's [`process_tree::INSTANCE_VAR`] value.
    instance: String,
    log: ServerLog,
    /// Why the worker closed the connection on purpose, for the calls it cut off.
    recycled: OnceLock<String>,
    /// Holds one of the worker's child-process slots while the child lives.
    _child_slot: Option<OwnedSemaphorePermit>,
    /// When the connection was established.
    pub connected_at: Instant,
    /// The OAuth grant the connection carries (`http.auth_ref` records).
    grant: Option<Arc<GrantBinding>>,
}

impl Connection {
    /// Connects and initializes, within `settings.initialize_timeout`.
    pub async fn open(
        launch: &Launch,
        settings: &ConnectSettings,
        stderr: &StderrTail,
        side: &ClientSide,
        child_slot: Option<OwnedSemaphorePermit>,
    ) -> Result<Self, McpError> {
        let deadline = settings.initialize_timeout;
        let handshake = Handshake::new(
            settings.protocol,
            match launch {
                Launch::Stdio(_) => quiver_model::Transport::Stdio,
                Launch::StreamableHttp(_) => quiver_model::Transport::StreamableHttp,
                Launch::LegacySse(_) => quiver_model::Transport::HttpSseLegacy,
            },
        );
        let instance = process_tree::instance_marker();
        let client_side = || side.clone();
        let grant = match launch {
            Launch::StreamableHttp(HttpLaunch {
                auth_ref: Some(auth_ref),
                ..
            })
            | Launch::LegacySse(HttpLaunch {
                auth_ref: Some(auth_ref),
                ..
            }) => Some(Arc::new(GrantBinding::new(GrantRef {
                auth_ref: auth_ref.clone(),
                principal: settings.principal.clone(),
            }))),
            _ => None,
        };
        let attempt = async |handshake: Handshake| -> Result<_, Opening> {
            Ok(match launch {
                Launch::Stdio(stdio) => {
                    let max_message_bytes = settings.max_message_bytes;
                    let (service, pid) = Self::open_stdio(
                        stdio,
                        stderr,
                        &instance,
                        max_message_bytes,
                        client_side(),
                        &handshake,
                    )
                    .await?;
                    (service, pid, None)
                }
                Launch::StreamableHttp(http) => {
                    let url = parse_url(&http.url)?;
                    let client = settings.egress.client_for(&url, &settings.http).await?;
                    let config = streamable_http_config(http, settings)?;
                    match (&http.auth_ref, &grant) {
                        (Some(auth_ref), Some(grant)) => {
                            let source = credential_source(settings, auth_ref)?;
                            let client = BrokeredClient::new(client, source, grant.clone());
                            serve_streamable(client, config, client_side(), &handshake).await?
                        }
                        _ => serve_streamable(client, config, client_side(), &handshake).await?,
                    }
                }
                Launch::LegacySse(http) => {
                    let url = parse_url(&http.url)?;
                    let client = settings.egress.client_for(&url, &settings.http).await?;
                    let mut headers = header_map(&http.headers)?;
                    // Legacy SSE keeps one stream open: the token of the
                    // moment it connects; a refused one ends the stream and
                    // the reconnect asks for a fresh token.
                    if let (Some(auth_ref), Some(grant)) = (&http.auth_ref, &grant) {
                        let bearer = credential_source(settings, auth_ref)?
                            .bearer(grant.source(), crate::credentials::Renewal::Current)
                            .await
                            .map_err(McpError::from)?;
                        grant.bind(&bearer).map_err(McpError::Unavailable)?;
                        let value = reqwest::header::HeaderValue::from_str(&format!(
                            "Bearer {}",
                            bearer.token
                        ))
                        .map_err(|_| {
                            McpError::Unavailable(format!(
                                "oauth connection {auth_ref:?}: the token is not a valid header value"
                            ))
                        })?;
                        headers.insert(reqwest::header::AUTHORIZATION, value);
                    }
                    let transport = crate::legacy_sse::LegacySseClientTransport::connect(
                        client, url, headers, deadline,
                    )
                    .await
                    .map_err(|err| {
                        McpError::Unavailable(format!("legacy sse connect failed: {err}"))
                    })?;
                    (
                        serve(client_side(), transport, &handshake).await?,
                        None,
                        None,
                    )
                }
            })
        };
        // `auto` opens with a session when the server offers one; a server
        // of 2026-07-28 alone refuses the handshake and is opened anew with
        // `server/discover`.
        let connecting = async {
            match attempt(handshake).await {
                Err(Opening::Refused(refused)) => match handshake.without_session() {
                    Some(modern) => attempt(modern).await.map_err(|err| match err {
                        Opening::Refused(err) | Opening::Failed(err) => {
                            McpError::Unavailable(format!("{refused}; then server/discover: {err}"))
                        }
                    }),
                    None => Err(refused),
                },
                other => other.map_err(Opening::into_error),
            }
        };
        let (service, pid, direct) = tokio::time::timeout(deadline, connecting)
            .await
            .map_err(|_| {
                McpError::Unavailable(with_stderr(
                    format!(
                        "initialize did not complete within {} ms (protocol = {:?})",
                        deadline.as_millis(),
                        handshake.protocol().as_str()
                    ),
                    stderr,
                ))
            })?
            .map_err(|err| match err {
                // Transport errors quote the URL (reqwest: "error sending
                // request for url (…?api_key=…)"); this text is logged and
                // reported, so URL secrets are masked first.
                McpError::Unavailable(message) => {
                    McpError::Unavailable(with_stderr(quiver_model::redact_urls(&message), stderr))
                }
                other => other,
            })?;
        // Both handshakes record what the server answered (a server that
        // answered nothing usable failed the handshake).
        let protocol_version = service
            .peer()
            .peer_info()
            .map_or(ProtocolVersion::LATEST_WITH_INITIALIZE, |info| {
                info.protocol_version.clone()
            });
        let direct = direct.map(|parts| {
            Arc::new(DirectCalls::new(
                parts,
                protocol_version.clone(),
                side.clone(),
                service.peer().clone(),
            ))
        });
        Ok(Connection {
            direct,
            protocol_version,
            peer: service.peer().clone(),
            service: tokio::sync::Mutex::new(Some(service)),
            pid,
            instance,
            log: side.log.clone(),
            recycled: OnceLock::new(),
            _child_slot: child_slot,
            connected_at: Instant::now(),
            grant,
        })
    }

    async fn open_stdio(
        launch: &StdioLaunch,
        stderr_tail: &StderrTail,
        instance: &str,
        max_message_bytes: usize,
        client_side: ClientSide,
        handshake: &Handshake,
    ) -> Result<(RunningService<RoleClient, ClientSide>, Option<u32>), Opening> {
        let mut command = tokio::process::Command::new(&launch.command);
        command
            .args(&launch.args)
            .env_clear()
            .envs(&launch.env)
            .env(process_tree::INSTANCE_VAR, instance);
        if let Some(cwd) = &launch.cwd {
            command.current_dir(cwd);
        }
        let mut wrapped = CommandWrap::from(command);
        // Its own process group: closing kills the server and anything it spawned.
        wrapped.wrap(ProcessGroup::leader());
        let (transport, pid, stderr) =
            StdioTransport::spawn(wrapped, max_message_bytes, &client_side.log).map_err(|err| {
                McpError::Unavailable(format!("cannot start {:?}: {err}", launch.command))
            })?;
        if let Some(stderr) = stderr {
            stderr_tail.follow(stderr, pid);
        }
        Ok((serve(client_side, transport, handshake).await?, pid))
    }

    /// The client side of the connection (cheap to clone, multiplexes requests).
    pub fn peer(&self) -> &Peer<RoleClient> {
        &self.peer
    }

    /// Its calls posted by their callers, on streamable HTTP.
    pub(crate) fn direct(&self) -> Option<&Arc<DirectCalls>> {
        self.direct.as_ref()
    }

    /// The child's process id (stdio only).
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// The protocol version the handshake settled on: `2026-07-28` after
    /// `server/discover`, else what the server answered to `initialize`.
    pub fn protocol_version(&self) -> &ProtocolVersion {
        &self.protocol_version
    }

    /// Whether the connection may no longer serve: the transport is gone
    /// (child exited, HTTP session ended) or the worker recycled it. A
    /// recycled connection counts as closed at once, before its process has
    /// been ended, so no new call lands on it meanwhile.
    pub fn is_closed(&self) -> bool {
        self.recycled.get().is_some()
            || self.peer.is_transport_closed()
            || self
                .grant
                .as_ref()
                .is_some_and(|grant| grant.stale().is_some())
    }

    /// Whether the connection still carries its OAuth connection's current
    /// grant (always, without `http.auth_ref`); see
    /// [`GrantBinding::is_current`].
    pub async fn carries_current_grant(&self, source: Option<&dyn CredentialSource>) -> bool {
        match (&self.grant, source) {
            (Some(grant), Some(source)) => grant.is_current(source).await,
            _ => true,
        }
    }

    /// Whether the connection closed because its OAuth connection got a
    /// new grant ([`GrantBinding::stale`]).
    pub fn grant_changed(&self) -> bool {
        self.grant
            .as_ref()
            .is_some_and(|grant| grant.stale().is_some())
    }

    /// The server's log tail and event rate limit.
    pub fn log(&self) -> &ServerLog {
        &self.log
    }

    /// Why the worker recycled this connection, if it did.
    pub fn recycled(&self) -> Option<&str> {
        self.recycled.get().map(String::as_str)
    }

    /// Closes the connection; for stdio, ends and reaps what the server started.
    pub async fn close(&self) {
        let service = self.service.lock().await.take();
        if let Some(mut service) = service {
            // Looked up while the server lives: its parent links lead to
            // what it started, even what left its process group.
            let started = self.pid.map(process_tree::descendants);
            // The child transport closes stdin, waits, sends SIGTERM, then
            // kills the group, and reaps the server.
            let _ = service.close_with_timeout(Duration::from_secs(5)).await;
            // A server that exits by itself once stdin closes (or crashed)
            // takes only itself along: what it started goes now.
            if let (Some(pid), Some(started)) = (self.pid, started) {
                process_tree::end(pid, &self.instance, started).await;
            }
        }
    }

    /// Closes the connection on purpose (`kind` labels the metric, `reason`
    /// tells the calls cut off why): a stdio server and what it started are
    /// ended without waiting for the server to exit by itself.
    pub async fn recycle(&self, kind: &'static str, reason: String) {
        let server_id = self.log.server_id();
        // Several abandoned calls may give up on the same connection: the
        // first ends it, the others wait for it to be closed.
        if self.recycled.set(reason.clone()).is_ok() {
            metrics::counter!(
                "mcp_connection_recycled_total",
                "server_id" => server_id.to_owned(),
                "reason" => kind
            )
            .increment(1);
            if let Some(suppressed) = self.log.events().admit("recycled") {
                tracing::warn!(server_id, pid = self.pid, suppressed, reason = %reason, "recycling mcp connection");
            }
            if let Some(pid) = self.pid {
                let started = process_tree::descendants(pid);
                process_tree::end(pid, &self.instance, started).await;
            }
        }
        self.close().await;
    }
}

/// Why an opening failed: the server refused the handshake (it answered,
/// in another era), or anything else.
enum Opening {
    Refused(McpError),
    Failed(McpError),
}

impl From<McpError> for Opening {
    fn from(err: McpError) -> Self {
        Opening::Failed(err)
    }
}

impl Opening {
    fn into_error(self) -> McpError {
        match self {
            Opening::Refused(err) | Opening::Failed(err) => err,
        }
    }
}

/// A streamable-HTTP connection over `client`, with what its calls need to
/// be posted by their callers ([`crate::direct_call`]).
async fn serve_streamable<C: StreamableHttpClient + Sync>(
    client: C,
    config: StreamableHttpClientTransportConfig,
    side: ClientSide,
    handshake: &Handshake,
) -> Result<
    (
        RunningService<RoleClient, ClientSide>,
        Option<u32>,
        Option<DirectParts>,
    ),
    Opening,
> {
    let client = AnswerFirst {
        client,
        session: Arc::default(),
    };
    let direct = DirectParts::new(&client, &config);
    let transport = StreamableHttpClientTransport::with_client(client, config);
    Ok((serve(side, transport, handshake).await?, None, Some(direct)))
}

/// Opens the MCP session on `transport` with `handshake`.
async fn serve<T: Transport<RoleClient> + 'static>(
    side: ClientSide,
    transport: T,
    handshake: &Handshake,
) -> Result<RunningService<RoleClient, ClientSide>, Opening> {
    side.serve_with_lifecycle(handshake.probe(transport), handshake.mode())
        .await
        .map_err(|err| {
            let refused = Handshake::refused(&err);
            let err = handshake.failed(err);
            if refused {
                Opening::Refused(err)
            } else {
                Opening::Failed(err)
            }
        })
}

fn with_stderr(message: String, stderr: &StderrTail) -> String {
    let tail = stderr.summary(5);
    if tail.is_empty() {
        message
    } else {
        format!("{message}; stderr: {tail}")
    }
}

fn parse_url(url: &str) -> Result<url::Url, McpError> {
    url::Url::parse(url).map_err(|err| McpError::Unavailable(format!("invalid url {url:?}: {err}")))
}

fn header_map(
    headers: &std::collections::BTreeMap<String, String>,
) -> Result<reqwest::header::HeaderMap, McpError> {
    let mut map = reqwest::header::HeaderMap::new();
    for (name, value) in headers {
        let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
            .map_err(|err| McpError::Unavailable(format!("http.headers.{name}: {err}")))?;
        let value = reqwest::header::HeaderValue::from_str(value)
            .map_err(|err| McpError::Unavailable(format!("http.headers.{name}: {err}")))?;
        map.insert(name, value);
    }
    Ok(map)
}

fn streamable_http_config(
    http: &HttpLaunch,
    settings: &ConnectSettings,
) -> Result<StreamableHttpClientTransportConfig, McpError> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(http.url.clone());
    config.custom_headers = header_map(&http.headers)?
        .into_iter()
        .filter_map(|(k, v)| Some((k?, v)))
        .collect();
    config.max_concurrent_requests = settings.max_concurrent_requests.max(1);
    Ok(config)
}

fn credential_source(
    settings: &ConnectSettings,
    auth_ref: &str,
) -> Result<Arc<dyn CredentialSource>, McpError> {
    settings.credentials.clone().ok_or_else(|| {
        McpError::Unavailable(format!(
            "http.auth_ref {auth_ref:?}: this process has no OAuth credential source (a registry)"
        ))
    })
}
