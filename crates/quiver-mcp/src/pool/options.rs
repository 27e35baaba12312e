//! The pool's settings, with their one `Default`.

use std::sync::Arc;
use std::time::Duration;

use crate::launch::{EnvLookup, process_env};
use crate::leases::LeaseLimits;
use crate::listing::ListLimits;

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
    /// then, the connection is recycled (see the crate's `inflight` module for the
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
    pub(super) fn list_limits(&self) -> ListLimits {
        ListLimits {
            max_pages: self.max_list_pages,
            max_items: self.max_list_items,
            max_bytes: self.max_list_bytes,
            timeout: self.list_timeout,
        }
    }
}
