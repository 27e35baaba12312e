//! The worker's pool of MCP connections (R-MCP-2…5, R-MCP-7).
//!
//! One entry per server id holds at most one live connection (shared
//! isolation), multiplexing every call of every session. Connections open
//! lazily on first use (or by warm-up), close after an idle period, and are
//! re-opened after a crash; consecutive failures to connect back off
//! exponentially with jitter, so a broken server costs one fast error per
//! call instead of a spawn per call. Every failure stays inside its entry:
//! other servers never wait on it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use arc_swap::ArcSwap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quiver_model::{Isolation, McpServerSpec, StoredServer};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, JsonObject, RequestMetaObject, ServerResult, Tool,
};
use rmcp::service::ServiceError;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, broadcast};
use tokio_util::sync::CancellationToken;

use crate::connection::{ClientSide, ConnectSettings, Connection, StderrTail};
use crate::credentials::{CredentialError, GrantRef, Renewal};
use crate::error::McpError;
use crate::inflight::{Answer, InFlightCall};
use crate::launch::{EnvLookup, Launch, launch, process_env};
use crate::leases::{LeaseLimits, Leases, SessionKey, SessionKind};
use crate::listing::ListLimits;
use crate::output::{OutputSize, enforce_cap};
use crate::relay::{CallAttachment, EVENT_CHANNEL_CAPACITY, Relay, ServerEvent};
use crate::server_log::ServerLog;
use crate::tools::ToolsCache;

/// Worker-wide pool settings.
#[derive(Clone)]
pub struct PoolOptions {
    /// Calls in flight at once across all servers.
    pub max_inflight_calls: usize,
    /// Stdio child processes alive at once.
    pub max_child_processes: usize,
    /// Bound on connecting plus `initialize`.
    pub initialize_timeout: Duration,
    /// Connections unused this long are closed (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// How long a `tools/list` result is reused.
    pub tools_ttl: Duration,
    /// How long a failed `tools/list` is remembered (stampede protection).
    pub tools_negative_ttl: Duration,
    /// First delay after a failed connect; doubles per failure.
    pub restart_backoff_min: Duration,
    /// Cap of the restart delay.
    pub restart_backoff_max: Duration,
    /// How long a timed-out call keeps its `max_concurrency` slot after it
    /// was cancelled, waiting for the server to answer it; unanswered by
    /// then, the connection is recycled (see [`crate::inflight`] for the
    /// trade-off).
    pub cancel_grace: Duration,
    /// Pages one listing (`tools/list`, …) follows at most: a server that
    /// always returns a `nextCursor` fails its listing with an error naming
    /// this limit instead of being paged forever.
    pub max_list_pages: usize,
    /// Items (tools, …) one listing keeps at most, over all its pages.
    pub max_list_items: usize,
    /// Bytes (as JSON) of the items of one listing at most, over all pages.
    pub max_list_bytes: usize,
    /// Bound on one whole listing, every page (connecting is bounded by
    /// `initialize_timeout` apart).
    pub list_timeout: Duration,
    /// Longest message a stdio server may send; a longer answer is dropped
    /// unread and fails its request at once (`mcp_output_too_large`).
    pub max_message_bytes: usize,
    /// Where `${ENV:…}` and the children's base environment come from.
    pub env: EnvLookup,
    /// HTTP client of the HTTP transports (build it from
    /// [`crate::egress::http_client_builder`]: no redirects).
    pub http: reqwest::Client,
    /// Hosts the HTTP transports may connect to (default: all).
    pub egress: crate::egress::EgressPolicy,
    /// Caps on the connections of `isolation = "per_session"` servers.
    pub session_leases: LeaseLimits,
    /// A per-session connection unused this long is closed (its session
    /// starts afresh on its next call).
    pub session_idle_timeout: Duration,
    /// Bearer tokens of records with `http.auth_ref` (the registry's OAuth
    /// connections); `None`: such records are unavailable.
    pub credentials: Option<Arc<dyn crate::credentials::CredentialSource>>,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            max_inflight_calls: 1024,
            max_child_processes: 64,
            initialize_timeout: Duration::from_secs(20),
            idle_timeout: Some(Duration::from_secs(600)),
            tools_ttl: Duration::from_secs(300),
            tools_negative_ttl: Duration::from_secs(2),
            restart_backoff_min: Duration::from_millis(250),
            restart_backoff_max: Duration::from_secs(30),
            cancel_grace: Duration::from_secs(2),
            max_list_pages: ListLimits::DEFAULT.max_pages,
            max_list_items: ListLimits::DEFAULT.max_items,
            max_list_bytes: ListLimits::DEFAULT.max_bytes,
            list_timeout: ListLimits::DEFAULT.timeout,
            max_message_bytes: crate::stdio::DEFAULT_MAX_MESSAGE_BYTES,
            env: process_env(),
            // Only fails where `reqwest::Client::new()` would panic (no TLS
            // backend); that client is the fallback.
            http: crate::egress::http_client_builder()
                .build()
                .unwrap_or_else(|_| reqwest::Client::new()),
            egress: crate::egress::EgressPolicy::default(),
            session_leases: LeaseLimits::default(),
            session_idle_timeout: Duration::from_secs(600),
            credentials: None,
        }
    }
}

impl PoolOptions {
    /// The bounds of one listing.
    fn list_limits(&self) -> ListLimits {
        ListLimits {
            max_pages: self.max_list_pages,
            max_items: self.max_list_items,
            max_bytes: self.max_list_bytes,
            timeout: self.list_timeout,
        }
    }
}

/// Connection state of one server, as reported to the registry (R-MCP-5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthState {
    /// Never connected yet (lazy).
    Idle,
    /// A live connection.
    Connected,
    /// Live, but recent calls or restarts failed.
    Degraded,
    /// The last connect failed, or its record cannot be launched on this worker.
    Down,
}

/// Health of one server on this worker.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerHealth {
    /// The server.
    pub server_id: String,
    /// State.
    pub state: HealthState,
    /// Last error seen.
    pub last_error: Option<String>,
    /// Connections opened after the first one.
    pub reconnects: u64,
    /// Tools in the cached list, when known.
    pub tool_count: Option<usize>,
    /// Median of recent call latencies.
    pub p50_latency_ms: Option<f64>,
    /// Pid of the live stdio child.
    pub pid: Option<u32>,
    /// The protocol version the live connection settled on (`None`
    /// without one).
    pub protocol_version: Option<String>,
    /// Live per-session connections (`isolation = "per_session"`).
    pub sessions: usize,
    /// Last stderr lines of the server.
    pub stderr_tail: Vec<String>,
    /// Last log messages the server sent (`notifications/message`).
    pub log_tail: Vec<String>,
}

/// A finished `tools/call`.
#[derive(Debug, Clone)]
pub struct CallOutcome {
    /// The server's result, with the output cap applied.
    pub result: CallToolResult,
    /// Output size before and after the cap.
    pub output: OutputSize,
    /// Time spent, queueing included.
    pub duration: Duration,
}

/// Why a forwarded request failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ForwardError {
    /// The server answered with a JSON-RPC error, passed on as it is.
    #[error("server error {}: {}", .0.code.0, .0.message)]
    Server(rmcp::model::ErrorData),
    /// The request did not get an answer (or not one that may be passed on).
    #[error(transparent)]
    Failed(#[from] McpError),
}

/// What a call carries besides its name and arguments.
#[derive(Debug, Clone, Default)]
pub struct CallOptions {
    /// The caller's `_meta`, passed on (protocol keys of the caller's own
    /// session and its progress token are not: see [`forwarded_meta`]).
    pub meta: Option<RequestMetaObject>,
    /// The caller, for the server's traffic about the call.
    pub attachment: Option<CallAttachment>,
    /// The caller's session: required by `isolation = "per_session"`
    /// servers, whose calls then run on the session's own connection (the
    /// caller's own: see [`SessionKey`]).
    pub session: Option<SessionKey>,
    /// What the caller answers to the server's `input_required` (a call
    /// repeated after [`McpError::InputRequired`]).
    pub input: Option<UpstreamInput>,
    /// The caller's principal (`key:<id>`, `oidc:<issuer>#<sub>`, …): a
    /// server whose OAuth connection is per user is called with that
    /// principal's own grant, on a connection of its own.
    pub principal: Option<String>,
    /// What the caller can be asked (elicitation, sampling, roots): told to
    /// a server spoken to in 2026-07-28 in the request's `_meta` instead of
    /// the worker's own capabilities, so it asks only what the caller can
    /// answer. `None`: the worker's.
    pub client_capabilities: Option<rmcp::model::ClientCapabilities>,
}

/// A repeated call's answers to a 2026-07-28 server's `input_required`:
/// sent upstream as the call's `inputResponses` and `requestState`.
#[derive(Debug, Clone, Default)]
pub struct UpstreamInput {
    /// The answers, by the keys of the server's `inputRequests`.
    pub responses: rmcp::model::InputResponses,
    /// The server's `requestState`, echoed unchanged.
    pub request_state: Option<String>,
}

/// The `_meta` sent upstream: the caller's, without the keys that describe
/// the caller's own session with the worker (`io.modelcontextprotocol/…`:
/// protocol version, capabilities) and without its progress token (rmcp
/// sends every request with a token of its own, mapped back by the relay).
fn forwarded_meta(meta: Option<RequestMetaObject>) -> Option<RequestMetaObject> {
    let mut meta = meta?;
    meta.0
        .0
        .retain(|key, _| key != "progressToken" && !key.starts_with("io.modelcontextprotocol/"));
    (!meta.0.0.is_empty()).then_some(meta)
}

const LATENCY_WINDOW: usize = 64;

/// Mutable state of one entry's connection slot.
#[derive(Default)]
struct Slot {
    connection: Option<Arc<Connection>>,
    /// Consecutive failed connects.
    failures: u32,
    /// Delays of the current run of failures; reset by a successful connect.
    backoff: Option<backon::ExponentialBackoff>,
    /// No new connect attempt before this instant.
    retry_at: Option<Instant>,
    last_error: Option<McpError>,
    connects: u64,
}

struct Entry {
    /// The record; replaced in place when a change keeps the connection.
    server: ArcSwap<StoredServer>,
    /// The newest revision this entry's record has had. After a registry
    /// restored from a backup the record can be older than that, and a call
    /// holding a record resolved before the restore must not bring it back.
    newest_revision: AtomicU64,
    launch: Result<Launch, McpError>,
    slot: tokio::sync::Mutex<Slot>,
    /// A copy of the slot's connection for lock-free fast paths and health.
    live: Mutex<Option<Arc<Connection>>>,
    /// `max_concurrency` permits; replaced when the budget changes (calls in
    /// flight keep the permits of the old one).
    calls: ArcSwap<Semaphore>,
    tools: Arc<ToolsCache>,
    /// Calls in flight, for what the server sends about them.
    relay: Arc<Relay>,
    stderr: StderrTail,
    log: ServerLog,
    last_used: Mutex<Instant>,
    last_error: Mutex<Option<String>>,
    recent_failures: AtomicU64,
    /// The last listing failed (or was not answered in time); cleared by
    /// one that succeeds. Health shows the server degraded meanwhile.
    listing_failed: AtomicBool,
    /// The last connect was refused by `max_child_processes`; cleared by a
    /// connect. Health shows the server down meanwhile.
    beyond_child_cap: AtomicBool,
    latencies: Mutex<std::collections::VecDeque<f64>>,
    /// A per-session lease (counted in `mcp_session_connections` while it lives).
    lease: AtomicBool,
    /// Whose grant the entry's connection carries (a per-user OAuth
    /// connection's lease); `None`: the fleet-wide one.
    principal: Option<String>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        if self.lease.load(Ordering::Relaxed) {
            metrics::gauge!("mcp_session_connections", "server_id" => self.server_id())
                .decrement(1.0);
        }
    }
}

impl Entry {
    fn new(server: Arc<StoredServer>, options: &PoolOptions, principal: Option<String>) -> Self {
        Entry {
            principal,
            launch: launch(&server.spec, &options.env)
                .and_then(|launch| options.egress.check_launch(&launch).map(|()| launch)),
            calls: ArcSwap::from_pointee(call_slots(&server.spec)),
            log: ServerLog::new(&server.spec.server_id),
            newest_revision: AtomicU64::new(server.revision),
            server: ArcSwap::new(server),
            slot: tokio::sync::Mutex::new(Slot::default()),
            live: Mutex::new(None),
            tools: Arc::default(),
            relay: Arc::default(),
            stderr: StderrTail::default(),
            last_used: Mutex::new(Instant::now()),
            last_error: Mutex::new(None),
            recent_failures: AtomicU64::new(0),
            listing_failed: AtomicBool::new(false),
            beyond_child_cap: AtomicBool::new(false),
            latencies: Mutex::new(std::collections::VecDeque::with_capacity(LATENCY_WINDOW)),
            lease: AtomicBool::new(false),
        }
    }

    /// Takes another record that needs no new connection.
    fn update(&self, server: &Arc<StoredServer>) {
        self.newest_revision
            .fetch_max(server.revision, Ordering::Relaxed);
        let old = self.server.swap(server.clone());
        if old.spec.budgets.max_concurrency != server.spec.budgets.max_concurrency {
            self.calls.store(Arc::new(call_slots(&server.spec)));
        }
        self.tools.clear();
    }

    fn server_id(&self) -> String {
        self.server.load().spec.server_id.clone()
    }

    fn set_error(&self, error: &McpError) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(error.to_string());
    }

    fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn record_latency(&self, duration: Duration) {
        let mut latencies = self.latencies.lock().unwrap_or_else(|p| p.into_inner());
        if latencies.len() == LATENCY_WINDOW {
            latencies.pop_front();
        }
        latencies.push_back(duration.as_secs_f64() * 1000.0);
    }

    fn p50(&self) -> Option<f64> {
        let latencies = self.latencies.lock().unwrap_or_else(|p| p.into_inner());
        if latencies.is_empty() {
            return None;
        }
        let mut sorted: Vec<f64> = latencies.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        Some(sorted[sorted.len() / 2])
    }

    /// Forgets a connection that died (if it is still the current one).
    async fn discard(&self, dead: &Arc<Connection>) {
        let mut slot = self.slot.lock().await;
        if slot
            .connection
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, dead))
        {
            slot.connection = None;
            *self.live.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
        drop(slot);
        dead.close().await;
    }
}

struct PoolInner {
    options: PoolOptions,
    entries: Mutex<HashMap<String, Arc<Entry>>>,
    inflight: Arc<Semaphore>,
    children: Arc<Semaphore>,
    events: broadcast::Sender<ServerEvent>,
    /// Connections of per-session servers, one per (server, task, session).
    leases: Leases<Arc<Entry>>,
    shutdown: CancellationToken,
}

impl PoolInner {
    fn child_processes(&self) -> usize {
        self.options.max_child_processes.max(1) - self.children.available_permits()
    }

    /// Sets `mcp_child_processes` to the children alive now; called wherever
    /// a child slot is taken or may have been given back.
    fn update_child_gauge(&self) {
        metrics::gauge!("mcp_child_processes").set(self.child_processes() as f64);
    }
}

/// Handle to the pool; cheap to clone.
#[derive(Clone)]
pub struct McpPool {
    inner: Arc<PoolInner>,
}

/// Restart delays: exponential with jitter (so many workers do not restart
/// a shared server in lockstep), capped, never giving up.
fn restart_backoff(options: &PoolOptions) -> backon::ExponentialBackoff {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::default()
        .with_min_delay(options.restart_backoff_min)
        .with_max_delay(options.restart_backoff_max)
        .with_jitter()
        .without_max_times()
        .build()
}

/// Which records [`McpPool::reconcile`] lets replace an entry's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Adopt {
    /// A call's record, resolved from some snapshot: only one newer than
    /// any the entry has had (a call that raced with a newer snapshot must
    /// not roll it back).
    IfNewer,
    /// The current snapshot's record, whatever its revision: a registry
    /// restored from a backup moves revisions backwards, and the worker
    /// follows it on purpose.
    Current,
}

fn call_slots(spec: &McpServerSpec) -> Semaphore {
    Semaphore::new((spec.budgets.max_concurrency as usize).max(1))
}

/// Whether two records need different connections.
fn same_connection(a: &McpServerSpec, b: &McpServerSpec) -> bool {
    a.transport == b.transport
        && a.stdio == b.stdio
        && a.http == b.http
        && a.isolation == b.isolation
        && a.protocol == b.protocol
}

impl McpPool {
    /// An empty pool; the idle reaper runs until [`McpPool::shutdown`].
    pub fn new(options: PoolOptions) -> Self {
        let leases = Leases::new(options.session_leases);
        let session_idle = options.session_idle_timeout;
        let inner = Arc::new(PoolInner {
            inflight: Arc::new(Semaphore::new(options.max_inflight_calls.max(1))),
            children: Arc::new(Semaphore::new(options.max_child_processes.max(1))),
            options,
            entries: Mutex::new(HashMap::new()),
            events: broadcast::channel(EVENT_CHANNEL_CAPACITY).0,
            leases,
            shutdown: CancellationToken::new(),
        });
        if let Some(idle) = inner.options.idle_timeout {
            tokio::spawn(reap_idle(
                Arc::downgrade(&inner),
                idle,
                inner.shutdown.clone(),
            ));
        }
        tokio::spawn(reap_idle_leases(
            Arc::downgrade(&inner),
            session_idle,
            inner.shutdown.clone(),
        ));
        McpPool { inner }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Entry>>> {
        self.inner.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The entry serving `server`, created or brought up to its revision.
    fn entry(&self, server: &Arc<StoredServer>) -> Arc<Entry> {
        let (entry, retired) = {
            let mut entries = self.entries();
            self.reconcile(&mut entries, server, Adopt::IfNewer)
        };
        if let Some(retired) = retired {
            retire(retired, Arc::downgrade(&self.inner));
        }
        entry
    }

    /// Makes the entry of `server` current, if `adopt` lets the record
    /// replace the entry's: one that keeps the connection settings updates
    /// the entry in place; one that changes them replaces the entry, whose
    /// old connection is returned for retiring.
    fn reconcile(
        &self,
        entries: &mut HashMap<String, Arc<Entry>>,
        server: &Arc<StoredServer>,
        adopt: Adopt,
    ) -> (Arc<Entry>, Option<Arc<Entry>>) {
        let id = &server.spec.server_id;
        let mut newest_revision = server.revision;
        if let Some(entry) = entries.get(id) {
            let current = entry.server.load();
            let keep = match adopt {
                Adopt::IfNewer => entry.newest_revision.load(Ordering::Relaxed) >= server.revision,
                Adopt::Current => Arc::ptr_eq(&current, server) || **current == **server,
            };
            if keep {
                return (entry.clone(), None);
            }
            if same_connection(&current.spec, &server.spec) {
                entry.update(server);
                return (entry.clone(), None);
            }
            newest_revision = newest_revision.max(entry.newest_revision.load(Ordering::Relaxed));
        }
        let entry = Arc::new(Entry::new(server.clone(), &self.inner.options, None));
        entry
            .newest_revision
            .store(newest_revision, Ordering::Relaxed);
        let retired = entries.insert(id.clone(), entry.clone());
        (entry, retired)
    }

    /// Applies a new registry snapshot (R-SYNC-6): servers that are gone or
    /// disabled are closed, servers whose connection settings changed are
    /// restarted (calls in flight finish on the old connection), and the tool
    /// caches of every changed server are dropped. Every entry takes the
    /// snapshot's record, whatever its revision (see [`Adopt::Current`]);
    /// unchanged records are the same allocation, so checking all is cheap
    /// and needs no list of what changed (which coalesced updates could lose).
    pub fn apply_snapshot(&self, servers: &BTreeMap<String, Arc<StoredServer>>) {
        let mut retired = Vec::new();
        {
            let mut entries = self.entries();
            entries.retain(|id, entry| {
                let keep = servers.get(id).is_some_and(|s| s.spec.enabled);
                if !keep {
                    retired.push(entry.clone());
                }
                keep
            });
            let ids: Vec<String> = entries.keys().cloned().collect();
            for id in ids {
                if let Some(server) = servers.get(&id) {
                    retired.extend(self.reconcile(&mut entries, server, Adopt::Current).1);
                }
            }
        }
        // A session's connection ends with its record's revision: a changed
        // record starts every session afresh.
        retired.extend(self.inner.leases.remove_where(|server_id, _, lease| {
            servers
                .get(server_id)
                .is_none_or(|s| !s.spec.enabled || **s != **lease.server.load())
        }));
        let pool = Arc::downgrade(&self.inner);
        for entry in retired {
            retire(entry, pool.clone());
        }
    }

    /// Whether `principal`'s requests of `server` need a connection of
    /// their own, carrying the principal's grant: the server's OAuth
    /// connection is per user. Fails when the principal has no grant yet
    /// ([`McpError::AuthorizationRequired`]); other failures to get a
    /// token are left to the connection, which reports them.
    async fn per_user_grant(
        &self,
        server: &StoredServer,
        principal: Option<&str>,
    ) -> Result<bool, McpError> {
        let (Some(auth_ref), Some(source)) = (
            server
                .spec
                .http
                .as_ref()
                .and_then(|http| http.auth_ref.as_ref()),
            &self.inner.options.credentials,
        ) else {
            return Ok(false);
        };
        let grant = GrantRef {
            auth_ref: auth_ref.clone(),
            principal: principal.map(str::to_owned),
        };
        match source.bearer(&grant, Renewal::Current).await {
            Ok(bearer) => Ok(bearer.per_user),
            // Without a caller no connection can carry a grant: fail here,
            // not in a connect that would back off for every caller.
            Err(
                err @ (CredentialError::AuthorizationRequired(_) | CredentialError::NoCaller(_)),
            ) => Err(err.into()),
            Err(CredentialError::Unavailable(_)) => Ok(false),
        }
    }

    /// Whether `principal` may call `server` as far as its OAuth grant
    /// goes: [`McpError::AuthorizationRequired`] when the server's
    /// connection is per user and the principal has not consented (other
    /// failures to get a token are the call's to report).
    pub async fn check_grant(
        &self,
        server: &StoredServer,
        principal: Option<&str>,
    ) -> Result<(), McpError> {
        match self.per_user_grant(server, principal).await {
            Err(err @ McpError::AuthorizationRequired(_)) => Err(err),
            _ => Ok(()),
        }
    }

    /// The entry a caller's request runs on: the server's own; for a
    /// per-session server the lease of the caller's session; for a server
    /// whose OAuth connection is per user the lease of the caller's own
    /// grant (both created on first use, within the caps).
    async fn call_entry(
        &self,
        server: &Arc<StoredServer>,
        session: Option<&SessionKey>,
        principal: Option<&str>,
    ) -> Result<Arc<Entry>, McpError> {
        let per_user = self.per_user_grant(server, principal).await?;
        let server_id = &server.spec.server_id;
        let grant_session;
        let session = if server.spec.isolation == Isolation::PerSession {
            let Some(session) = session else {
                return Err(McpError::SessionRequired(format!(
                    "{server_id} keeps state per session (isolation = \"per_session\"): send the x-quiver-session header naming your session (on /mcp endpoints the MCP session is used)"
                )));
            };
            session
        } else if let (true, Some(principal)) = (per_user, principal) {
            grant_session = SessionKey {
                caller: principal.to_owned(),
                task: String::new(),
                kind: SessionKind::Grant,
                session_id: server
                    .spec
                    .http
                    .as_ref()
                    .and_then(|http| http.auth_ref.clone())
                    .unwrap_or_default(),
            };
            &grant_session
        } else {
            return Ok(self.entry(server));
        };
        let carried = per_user.then(|| principal.map(str::to_owned)).flatten();
        let (lease, replaced) = self.inner.leases.lease(
            server_id,
            session,
            |lease| lease.newest_revision.load(Ordering::Relaxed) >= server.revision,
            || {
                metrics::gauge!("mcp_session_connections", "server_id" => server_id.clone())
                    .increment(1.0);
                tracing::info!(server_id = %server_id, task = %session.task, caller = %session.caller, kind = ?session.kind, "per-session connection leased");
                let entry = Entry::new(server.clone(), &self.inner.options, carried);
                entry.lease.store(true, Ordering::Relaxed);
                Arc::new(entry)
            },
        )?;
        if let Some(replaced) = replaced {
            retire(replaced, Arc::downgrade(&self.inner));
        }
        Ok(lease)
    }

    /// Ends `principal`'s own connections carrying its grant of OAuth
    /// connection `auth_ref` (its grant was revoked); returns how many.
    pub fn end_grant(&self, principal: &str, auth_ref: &str) -> usize {
        let ended = self.inner.leases.remove_where(|_, key, _| {
            key.kind == SessionKind::Grant && key.caller == principal && key.session_id == auth_ref
        });
        let count = ended.len();
        let pool = Arc::downgrade(&self.inner);
        for entry in ended {
            retire(entry, pool.clone());
        }
        count
    }

    /// Ends the per-session connections of `session` (every server; only
    /// that caller's session of that kind): calls in flight finish, then
    /// the processes are ended and reaped. Returns how many there were.
    pub fn end_session(&self, session: &SessionKey) -> usize {
        let ended = self.inner.leases.remove_where(|_, key, _| key == session);
        let count = ended.len();
        let pool = Arc::downgrade(&self.inner);
        for entry in ended {
            retire(entry, pool.clone());
        }
        count
    }

    /// Returns the live connection of `entry`, opening one if needed.
    async fn connection(&self, entry: &Arc<Entry>) -> Result<Arc<Connection>, McpError> {
        let live = entry.live.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(connection) = live
            && !connection.is_closed()
            // A connection carries one OAuth grant: after a new consent it
            // is stale (closed) and a new one opens below.
            && connection
                .carries_current_grant(self.inner.options.credentials.as_deref())
                .await
        {
            return Ok(connection);
        }
        let launch = entry.launch.as_ref().map_err(Clone::clone)?;
        // Single flight: concurrent callers wait for one connect.
        let mut slot = entry.slot.lock().await;
        if let Some(connection) = &slot.connection {
            if !connection.is_closed() {
                return Ok(connection.clone());
            }
            let dead = slot.connection.take();
            if let Some(dead) = dead {
                tokio::spawn(async move { dead.close().await });
            }
        }
        if let Some(retry_at) = slot.retry_at
            && Instant::now() < retry_at
        {
            // A refusal by the egress allowlist keeps its code while backing off.
            if let Some(denied @ McpError::EgressDenied(_)) = &slot.last_error {
                return Err(denied.clone());
            }
            return Err(McpError::Unavailable(format!(
                "server is restarting after failures (retry in {} ms): {}",
                retry_at
                    .saturating_duration_since(Instant::now())
                    .as_millis(),
                slot.last_error
                    .as_ref()
                    .map_or_else(|| "unknown error".to_owned(), ToString::to_string)
            )));
        }
        let child_slot = match launch {
            Launch::Stdio(_) => match self.inner.children.clone().try_acquire_owned() {
                Ok(child_slot) => Some(child_slot),
                Err(_) => {
                    // Not a failure of the server: no backoff, it starts as
                    // soon as a slot is free; health says why it waits.
                    let err = McpError::Unavailable(format!(
                        "worker child-process limit reached (max_child_processes = {}): this stdio server is not started until another one stops",
                        self.inner.options.max_child_processes
                    ));
                    if !entry.beyond_child_cap.swap(true, Ordering::AcqRel) {
                        tracing::warn!(server_id = %entry.server_id(), error = %err, "mcp server not started");
                    }
                    metrics::counter!("mcp_child_limit_refusals_total", "server_id" => entry.server_id())
                        .increment(1);
                    entry.set_error(&err);
                    return Err(err);
                }
            },
            _ => None,
        };
        let settings = ConnectSettings {
            max_message_bytes: self.inner.options.max_message_bytes,
            initialize_timeout: self.inner.options.initialize_timeout,
            http: self.inner.options.http.clone(),
            max_concurrent_requests: entry.server.load().spec.budgets.max_concurrency as usize,
            protocol: entry.server.load().spec.protocol,
            egress: self.inner.options.egress.clone(),
            credentials: self.inner.options.credentials.clone(),
            principal: entry.principal.clone(),
        };
        let server_id = &entry.server_id();
        let side = ClientSide {
            log: entry.log.clone(),
            relay: entry.relay.clone(),
            events: self.inner.events.clone(),
            tools: entry.tools.clone(),
        };
        let opened = Connection::open(launch, &settings, &entry.stderr, &side, child_slot).await;
        self.inner.update_child_gauge();
        match opened {
            Ok(connection) => {
                let connection = Arc::new(connection);
                slot.connects += 1;
                slot.failures = 0;
                entry.beyond_child_cap.store(false, Ordering::Release);
                slot.backoff = None;
                slot.retry_at = None;
                slot.connection = Some(connection.clone());
                *entry.live.lock().unwrap_or_else(|p| p.into_inner()) = Some(connection.clone());
                metrics::counter!("mcp_server_connect_total", "server_id" => server_id.clone())
                    .increment(1);
                tracing::info!(server_id = %server_id, pid = connection.pid(), "mcp server connected");
                Ok(connection)
            }
            Err(err) => {
                slot.failures += 1;
                let options = &self.inner.options;
                let delay = slot
                    .backoff
                    .get_or_insert_with(|| restart_backoff(options))
                    .next()
                    .unwrap_or(options.restart_backoff_max);
                slot.retry_at = Some(Instant::now() + delay);
                slot.last_error = Some(err.clone());
                entry.set_error(&err);
                tracing::warn!(server_id = %server_id, failures = slot.failures, error = %err, "mcp server connect failed");
                Err(err)
            }
        }
    }

    /// Connects a server ahead of its first call and loads its tools.
    pub async fn warm_up(&self, server: &Arc<StoredServer>) -> Result<(), McpError> {
        self.list_tools(server).await.map(|_| ())
    }

    /// The server's cached tool list (or recent listing failure), without
    /// any I/O; `None` when [`list_tools`](Self::list_tools) would have to
    /// fetch.
    pub fn cached_tools(
        &self,
        server: &Arc<StoredServer>,
    ) -> Option<Result<Arc<Vec<Tool>>, McpError>> {
        let entry = self.entry(server);
        let options = &self.inner.options;
        let hit = entry
            .tools
            .lookup(options.tools_ttl, options.tools_negative_ttl)?;
        metrics::counter!("mcp_tools_list_cache_hits_total", "server_id" => entry.server_id())
            .increment(1);
        Some(hit)
    }

    /// The server's tools, waiting at most `wait` for them: a listing not
    /// done by then goes on in a task of its own (and serves later callers),
    /// while this caller gets an error, also shown in the server's health.
    pub async fn list_tools_within(
        &self,
        server: &Arc<StoredServer>,
        principal: Option<&str>,
        wait: Duration,
    ) -> Result<Arc<Vec<Tool>>, McpError> {
        // The steady state: answered from the cache, no task needed.
        if let Some(cached) = self.cached_tools(server) {
            return cached;
        }
        let listing = {
            let (pool, server) = (self.clone(), server.clone());
            let principal = principal.map(str::to_owned);
            tokio::spawn(async move { pool.list_tools_for(&server, principal.as_deref()).await })
        };
        match tokio::time::timeout(wait, listing).await {
            Ok(Ok(listed)) => listed,
            Ok(Err(join)) => Err(McpError::Unavailable(format!(
                "listing tools failed: {join}"
            ))),
            Err(_) => {
                let err = McpError::Unavailable(format!(
                    "tools not listed within {} ms (the server is still connecting or has not answered tools/list)",
                    wait.as_millis()
                ));
                let entry = self.entry(server);
                entry.listing_failed.store(true, Ordering::Release);
                entry.set_error(&err);
                Err(err)
            }
        }
    }

    /// The server's tools: cached with a TTL, failures cached briefly, and
    /// concurrent misses sharing one fetch (R-MCP-4). Follows pagination
    /// within the pool's listing limits (`max_list_pages`, …).
    pub async fn list_tools(&self, server: &Arc<StoredServer>) -> Result<Arc<Vec<Tool>>, McpError> {
        self.list_tools_for(server, None).await
    }

    /// [`list_tools`](Self::list_tools) for `principal`. A server whose
    /// OAuth connection is per user is listed through the principal's own
    /// connection, and its listing kept on the server's entry too: a
    /// server's tools are the server's, so a caller without a grant is
    /// offered them as another caller's connection listed them (calling
    /// one then asks it to consent); before anyone listed them, its
    /// listing fails with [`McpError::AuthorizationRequired`].
    pub async fn list_tools_for(
        &self,
        server: &Arc<StoredServer>,
        principal: Option<&str>,
    ) -> Result<Arc<Vec<Tool>>, McpError> {
        let shared = self.entry(server);
        let options = &self.inner.options;
        let entry = if server.spec.isolation == Isolation::PerSession {
            // Listing needs no session: the server's own connection lists.
            shared.clone()
        } else {
            if let Some(Ok(listed)) = shared
                .tools
                .lookup(options.tools_ttl, options.tools_negative_ttl)
            {
                metrics::counter!("mcp_tools_list_cache_hits_total", "server_id" => shared.server_id())
                    .increment(1);
                return Ok(listed);
            }
            self.call_entry(server, None, principal).await?
        };
        if !Arc::ptr_eq(&entry, &shared) {
            let listed = self.list_entry_tools(&entry).await?;
            let kept = listed.clone();
            let _ = shared
                .tools
                .get_or_fetch(options.tools_ttl, options.tools_negative_ttl, async move {
                    Ok(kept)
                })
                .await;
            return Ok(listed);
        }
        self.list_entry_tools(&entry).await
    }

    /// The tools of `entry`'s server through its connection (see
    /// [`list_tools`](Self::list_tools)).
    async fn list_entry_tools(&self, entry: &Arc<Entry>) -> Result<Arc<Vec<Tool>>, McpError> {
        let entry = entry.clone();
        let options = &self.inner.options;
        let fetched = std::sync::atomic::AtomicBool::new(false);
        let fetch = {
            let entry = entry.clone();
            let pool = self.clone();
            let fetched = &fetched;
            async move {
                fetched.store(true, Ordering::Relaxed);
                let connection = pool.connection(&entry).await?;
                entry.touch();
                let limits = pool.inner.options.list_limits();
                let listed = limits
                    .list_tools(connection.peer(), |err| map_service_error(err, 0))
                    .await;
                match listed {
                    Ok(tools) => {
                        entry.listing_failed.store(false, Ordering::Release);
                        Ok(Arc::new(tools))
                    }
                    Err(err) => {
                        entry.listing_failed.store(true, Ordering::Release);
                        tracing::warn!(server_id = %entry.server_id(), error = %err, "mcp server tools/list failed");
                        if connection.is_closed() {
                            entry.discard(&connection).await;
                            drop(connection);
                            pool.inner.update_child_gauge();
                        }
                        entry.set_error(&err);
                        Err(err)
                    }
                }
            }
        };
        let result = entry
            .tools
            .get_or_fetch(options.tools_ttl, options.tools_negative_ttl, fetch)
            .await;
        let server_id = entry.server_id();
        if fetched.load(Ordering::Relaxed) {
            metrics::counter!("mcp_tools_list_cache_misses_total", "server_id" => server_id)
                .increment(1);
        } else {
            metrics::counter!("mcp_tools_list_cache_hits_total", "server_id" => server_id)
                .increment(1);
        }
        result
    }

    /// Calls a tool within the server's budgets: the worker-wide in-flight
    /// cap, the server's `max_concurrency` (held until the server is done
    /// with the call, see [`crate::inflight`]), `tool_timeout_ms` (a
    /// timed-out call is cancelled on the server) and `max_tool_output_bytes`.
    pub async fn call_tool(
        &self,
        server: &Arc<StoredServer>,
        tool: &str,
        arguments: Option<JsonObject>,
    ) -> Result<CallOutcome, McpError> {
        self.call_tool_since(server, tool, arguments, Instant::now())
            .await
    }

    /// [`call_tool`](Self::call_tool) for a caller whose `tool_timeout_ms`
    /// started at `started` (resolving the tool counts against it too).
    pub async fn call_tool_since(
        &self,
        server: &Arc<StoredServer>,
        tool: &str,
        arguments: Option<JsonObject>,
        started: Instant,
    ) -> Result<CallOutcome, McpError> {
        self.call_tool_with(server, tool, arguments, started, CallOptions::default())
            .await
    }

    /// [`call_tool_since`](Self::call_tool_since) with the caller's `_meta`
    /// passed on and the server's traffic about the call relayed to it.
    pub async fn call_tool_with(
        &self,
        server: &Arc<StoredServer>,
        tool: &str,
        arguments: Option<JsonObject>,
        started: Instant,
        options: CallOptions,
    ) -> Result<CallOutcome, McpError> {
        let entry = self
            .call_entry(
                server,
                options.session.as_ref(),
                options.principal.as_deref(),
            )
            .await?;
        let budgets = entry.server.load().spec.budgets;
        let timeout = Duration::from_millis(budgets.tool_timeout_ms);
        let server_id = entry.server_id();
        let result = async {
            // A second attempt only for a call that never reached the
            // server: its connection's OAuth grant changed (see below).
            let mut attempts = 0;
            loop {
                attempts += 1;
                // Waiting for room counts against the same budget as the call.
                let permits = tokio::time::timeout(
                    timeout,
                    acquire_both(&self.inner.inflight, &entry.calls.load_full(), &server_id),
                )
                .await
                .map_err(|_| {
                    McpError::Unavailable(format!(
                        "no call slot within {} ms (max_concurrency = {})",
                        budgets.tool_timeout_ms, budgets.max_concurrency
                    ))
                })??;
                let connection = self.connection(&entry).await?;
                entry.touch();
                let relayed = entry
                    .relay
                    .register(options.attachment.clone(), started + timeout);
                let mut params = CallToolRequestParams::new(tool.to_owned());
                params.arguments = arguments.clone();
                params.meta = forwarded_meta(options.meta.clone());
                if let Some(input) = &options.input {
                    params.input_responses =
                        (!input.responses.is_empty()).then(|| input.responses.clone());
                    params.request_state = input.request_state.clone();
                }
                let remaining = timeout.saturating_sub(started.elapsed());
                let grace = self.inner.options.cancel_grace;
                let answer = tokio::time::timeout(remaining, async {
                    // Only a 2026-07-28 request carries capabilities; a
                    // session's were the worker's, declared at `initialize`.
                    let caller_meta = options
                        .client_capabilities
                        .clone()
                        .filter(|_| {
                            connection.protocol_version().as_str()
                                >= rmcp::model::ProtocolVersion::V_2026_07_28.as_str()
                        })
                        .map(|capabilities| {
                            let mut meta = RequestMetaObject::new();
                            meta.set_client_capabilities(capabilities);
                            meta
                        });
                    match InFlightCall::send(
                        connection.clone(),
                        params,
                        permits,
                        grace,
                        caller_meta,
                    )
                    .await
                    {
                        Ok(call) => {
                            relayed.bind_progress(call.progress_token.clone());
                            call.answer(remaining).await
                        }
                        Err(err) => Some(Err(err)),
                    }
                })
                .await
                .ok()
                .flatten();
                drop(relayed);
                let Some(answer) = answer else {
                    break Err(McpError::Timeout(budgets.tool_timeout_ms));
                };
                let answer = answer.map_err(|err| {
                    crate::output::cap_service_error(err, budgets.max_tool_output_bytes as usize)
                });
                let outcome = self
                    .answered(&entry, &connection, answer, budgets.tool_timeout_ms)
                    .await;
                // The OAuth connection got a new grant (a person consented
                // again) while this call was on its way: the connection
                // refused to send it with the new grant's token (the server
                // never ran it) and is closed; a new one carries the call.
                if outcome.is_err() && attempts == 1 && connection.grant_changed() {
                    continue;
                }
                break outcome;
            }
        }
        .await;
        let duration = started.elapsed();
        match result {
            Ok(mut result) => {
                let output = enforce_cap(&mut result, budgets.max_tool_output_bytes as usize);
                entry.record_latency(duration);
                entry.recent_failures.store(0, Ordering::Relaxed);
                if output.truncated() {
                    metrics::counter!("mcp_tool_output_truncated_total", "server_id" => server_id.clone(), "tool" => tool.to_owned())
                        .increment(1);
                }
                metrics::histogram!("mcp_tool_call_output_bytes", "server_id" => server_id, "tool" => tool.to_owned())
                    .record(output.original as f64);
                Ok(CallOutcome {
                    result,
                    output,
                    duration,
                })
            }
            // The server answered: asking for input is no failure of it.
            Err(err @ McpError::InputRequired(_)) => {
                entry.record_latency(duration);
                Err(err)
            }
            Err(err) => {
                entry.recent_failures.fetch_add(1, Ordering::Relaxed);
                entry.set_error(&err);
                Err(err)
            }
        }
    }

    /// Changes servers announce (list changes, resource updates), for every
    /// subscriber; see [`crate::relay`].
    pub fn events(&self) -> broadcast::Receiver<ServerEvent> {
        self.inner.events.subscribe()
    }

    /// What the server said of itself when it was connected (capabilities,
    /// implementation, instructions); connects if needed, within
    /// `initialize_timeout`.
    pub async fn server_info(
        &self,
        server: &Arc<StoredServer>,
        principal: Option<&str>,
    ) -> Result<Arc<rmcp::model::ServerPeerInfo>, McpError> {
        // A per-session server introduces itself on its own connection; a
        // per-user one on the caller's.
        let entry = if server.spec.isolation == Isolation::PerSession {
            self.entry(server)
        } else {
            self.call_entry(server, None, principal).await?
        };
        let connection = self.connection(&entry).await?;
        connection
            .peer()
            .peer_info()
            .ok_or_else(|| McpError::Unavailable("the server sent no initialize result".into()))
    }

    /// Sends any other request to the server (resources, prompts,
    /// completions, subscriptions, log level) and returns its answer as it
    /// is (a per-session server answers on `session`'s connection): within the worker-wide in-flight cap, `tool_timeout_ms` (a
    /// request out of time is cancelled on the server) and, for the answer,
    /// `max_tool_output_bytes`. A JSON-RPC error of the server is returned
    /// as the server sent it. What the server asks while it answers
    /// (elicitation, sampling, roots) goes to `attachment`'s caller, as for
    /// a call; the request counts as in flight for the relay either way, so
    /// nothing it causes reaches another caller.
    pub async fn forward<T, F, Fut>(
        &self,
        server: &Arc<StoredServer>,
        session: Option<&SessionKey>,
        principal: Option<&str>,
        attachment: Option<CallAttachment>,
        request: F,
    ) -> Result<T, ForwardError>
    where
        T: serde::Serialize,
        F: FnOnce(rmcp::service::Peer<rmcp::RoleClient>) -> Fut,
        Fut: std::future::Future<Output = Result<T, ServiceError>>,
    {
        let started = Instant::now();
        let entry = self.call_entry(server, session, principal).await?;
        let budgets = entry.server.load().spec.budgets;
        let timeout = Duration::from_millis(budgets.tool_timeout_ms);
        let answer = tokio::time::timeout(timeout, async {
            let _permit = self
                .inner
                .inflight
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| McpError::Unavailable("worker is shutting down".into()))?;
            let connection = self.connection(&entry).await?;
            entry.touch();
            let _relayed = entry.relay.register(attachment, started + timeout);
            // Dropping the request on timeout sends `notifications/cancelled`.
            let answer = request(connection.peer().clone()).await;
            if answer.is_err() && connection.is_closed() {
                entry.discard(&connection).await;
                self.inner.update_child_gauge();
            }
            Ok::<_, McpError>(answer)
        })
        .await
        .map_err(|_| McpError::Timeout(budgets.tool_timeout_ms))??;
        let result = match answer {
            Ok(result) => result,
            Err(ServiceError::McpError(error))
                if crate::dropped::dropped_answer(&error).is_none() =>
            {
                return Err(ForwardError::Server(error));
            }
            Err(err) => return Err(map_service_error(err, budgets.tool_timeout_ms).into()),
        };
        let size = crate::output::json_len(&result);
        let max = budgets.max_tool_output_bytes as usize;
        if size > max {
            return Err(McpError::OutputTooLarge(format!(
                "the answer is {size} bytes, over max_tool_output_bytes ({max})"
            ))
            .into());
        }
        entry.record_latency(started.elapsed());
        Ok(result)
    }

    /// The result of an answered call; a connection found closed is
    /// forgotten, and errors name why the worker closed it, if it did.
    async fn answered(
        &self,
        entry: &Entry,
        connection: &Arc<Connection>,
        answer: Answer,
        timeout_ms: u64,
    ) -> Result<CallToolResult, McpError> {
        let err = match answer {
            Ok(ServerResult::CallToolResult(result)) => return Ok(result),
            // Results without content (an empty result) are valid answers.
            Ok(ServerResult::EmptyResult(_)) => return Ok(CallToolResult::default()),
            // A 2026-07-28 server's request for input, for the caller to
            // answer by repeating the call (see [`UpstreamInput`]).
            Ok(ServerResult::InputRequiredResult(result)) => {
                return Err(McpError::InputRequired(Box::new(result)));
            }
            Ok(_) => ServiceError::UnexpectedResponse,
            Err(err) => err,
        };
        let err = match connection.recycled() {
            Some(reason) => McpError::Unavailable(format!("connection recycled: {reason}")),
            None => map_service_error(err, timeout_ms),
        };
        if connection.is_closed() {
            entry.discard(connection).await;
            self.inner.update_child_gauge();
        }
        Err(err)
    }

    /// Health of every server the pool knows (R-MCP-5).
    pub fn health(&self) -> Vec<ServerHealth> {
        let entries: Vec<_> = self.entries().values().cloned().collect();
        let sessions = self.inner.leases.counts();
        let mut health: Vec<_> = entries
            .iter()
            .map(|entry| {
                let live = entry.live.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let slot = entry.slot.try_lock().ok();
                // Down until a connect succeeds again, not only while backing off.
                let last_connect_failed = slot.as_ref().is_some_and(|s| s.failures > 0)
                    || entry.beyond_child_cap.load(Ordering::Acquire);
                let listing_failed = entry.listing_failed.load(Ordering::Acquire);
                let state = match (&entry.launch, &live) {
                    (Err(_), _) => HealthState::Down,
                    (_, Some(c)) if !c.is_closed() => {
                        if listing_failed || entry.recent_failures.load(Ordering::Relaxed) > 0 {
                            HealthState::Degraded
                        } else {
                            HealthState::Connected
                        }
                    }
                    _ if last_connect_failed || listing_failed => HealthState::Down,
                    _ => HealthState::Idle,
                };
                let last_error = match &entry.launch {
                    Err(err) => Some(err.to_string()),
                    Ok(_) => entry
                        .last_error
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone(),
                };
                ServerHealth {
                    server_id: entry.server_id(),
                    state,
                    last_error,
                    reconnects: slot.map_or(0, |s| s.connects.saturating_sub(1)),
                    tool_count: entry.tools.cached_len(),
                    p50_latency_ms: entry.p50(),
                    pid: live.as_ref().and_then(|c| c.pid()),
                    protocol_version: live
                        .as_ref()
                        .filter(|c| !c.is_closed())
                        .map(|c| c.protocol_version().to_string()),
                    sessions: sessions.get(&entry.server_id()).copied().unwrap_or(0),
                    stderr_tail: entry.stderr.lines(),
                    log_tail: entry.log.lines(),
                }
            })
            .collect();
        health.sort_by(|a, b| a.server_id.cmp(&b.server_id));
        health
    }

    /// Number of stdio children alive.
    pub fn child_processes(&self) -> usize {
        self.inner.child_processes()
    }

    /// Closes every connection and kills every child process group.
    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        let mut entries: Vec<_> = self.entries().drain().map(|(_, entry)| entry).collect();
        entries.extend(self.inner.leases.remove_where(|_, _, _| true));
        let closing = entries.into_iter().filter_map(|entry| {
            let connection = entry.live.lock().unwrap_or_else(|p| p.into_inner()).take();
            connection.map(|connection| async move { connection.close().await })
        });
        futures::future::join_all(closing).await;
        self.inner.update_child_gauge();
    }
}

/// Closes a replaced or removed entry's connection once the calls in flight
/// on it are done, so they are never cut off.
fn retire(entry: Arc<Entry>, pool: std::sync::Weak<PoolInner>) {
    tokio::spawn(async move {
        let connection = entry.live.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(connection) = connection {
            let calls = entry.calls.load_full();
            let all = (entry.server.load().spec.budgets.max_concurrency).max(1);
            let drained = calls.acquire_many(all).await;
            connection.close().await;
            // The child slot is given back when the last handle goes.
            drop((connection, drained, entry));
            if let Some(pool) = pool.upgrade() {
                pool.update_child_gauge();
            }
        }
    });
}

/// Takes the server's `max_concurrency` permit, then a worker-wide in-flight
/// permit, recording the wait for each in `mcp_semaphore_wait_ms`
/// (`semaphore` = `server` or `worker`). A wait cut short by the call's
/// timeout is not recorded (the call's error is counted instead).
async fn acquire_both(
    inflight: &Arc<Semaphore>,
    calls: &Arc<Semaphore>,
    server_id: &str,
) -> Result<(OwnedSemaphorePermit, OwnedSemaphorePermit), McpError> {
    let closed = |_| McpError::Unavailable("worker is shutting down".into());
    let waited = |started: Instant, semaphore: &'static str| {
        metrics::histogram!("mcp_semaphore_wait_ms", "server_id" => server_id.to_owned(), "semaphore" => semaphore)
            .record(started.elapsed().as_secs_f64() * 1000.0);
    };
    let started = Instant::now();
    let server = calls.clone().acquire_owned().await.map_err(closed)?;
    waited(started, "server");
    let started = Instant::now();
    let worker = inflight.clone().acquire_owned().await.map_err(closed)?;
    waited(started, "worker");
    Ok((server, worker))
}

/// Maps rmcp's errors to the §10 codes.
fn map_service_error(err: ServiceError, timeout_ms: u64) -> McpError {
    if let ServiceError::McpError(error) = &err
        && let Some(dropped) = crate::dropped::dropped_answer(error)
    {
        return dropped;
    }
    match err {
        ServiceError::McpError(error) if error.code == rmcp::model::ErrorCode::INVALID_PARAMS => {
            McpError::InvalidArguments(error.message.to_string())
        }
        ServiceError::McpError(error)
            if error.code == rmcp::model::ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY =>
        {
            McpError::CapabilityRequired(Box::new(error))
        }
        ServiceError::McpError(error) => {
            McpError::Protocol(format!("server error {}: {}", error.code.0, error.message))
        }
        ServiceError::Timeout { .. } => McpError::Timeout(timeout_ms),
        ServiceError::TransportClosed => {
            McpError::Unavailable("connection to the server closed (it may have crashed)".into())
        }
        other => McpError::Unavailable(other.to_string()),
    }
}

async fn reap_idle(pool: std::sync::Weak<PoolInner>, idle: Duration, shutdown: CancellationToken) {
    let mut timer =
        tokio::time::interval((idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(30)));
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = timer.tick() => {}
        }
        let Some(pool) = pool.upgrade() else { return };
        let entries: Vec<_> = pool
            .entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for entry in entries {
            let unused_for = entry
                .last_used
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .elapsed();
            let budget = entry.server.load().spec.budgets.max_concurrency as usize;
            let idle_calls = entry.calls.load().available_permits() == budget.max(1);
            if unused_for < idle || !idle_calls {
                continue;
            }
            let connection = {
                let Ok(mut slot) = entry.slot.try_lock() else {
                    continue;
                };
                *entry.live.lock().unwrap_or_else(|p| p.into_inner()) = None;
                slot.connection.take()
            };
            if let Some(connection) = connection {
                tracing::info!(server_id = %entry.server_id(), "closing idle mcp connection");
                connection.close().await;
                drop(connection);
                pool.update_child_gauge();
            }
        }
    }
}

/// Ends per-session connections unused for their record's
/// `budgets.session_idle_ms` (else `idle`) with no call in flight.
async fn reap_idle_leases(
    pool: std::sync::Weak<PoolInner>,
    idle: Duration,
    shutdown: CancellationToken,
) {
    // Often enough for the shortest idle time a record may set (1 s).
    let mut timer = tokio::time::interval(
        (idle / 4).clamp(Duration::from_millis(50), Duration::from_millis(250)),
    );
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = timer.tick() => {}
        }
        let Some(pool) = pool.upgrade() else { return };
        let expired = pool.leases.remove_where(|_, _, entry| {
            let unused_for = entry
                .last_used
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .elapsed();
            let budgets = entry.server.load().spec.budgets;
            // The record's own idle time, else the worker's.
            let idle = budgets.session_idle_ms.map_or(idle, Duration::from_millis);
            let budget = (budgets.max_concurrency as usize).max(1);
            unused_for >= idle && entry.calls.load().available_permits() == budget
        });
        for entry in expired {
            tracing::info!(server_id = %entry.server_id(), "closing idle per-session connection");
            retire(entry, Arc::downgrade(&pool));
        }
    }
}
