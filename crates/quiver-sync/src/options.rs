//! How the sync reaches and follows the registry.

use std::fmt;
use std::time::Duration;

use crate::SyncError;

/// Default of [`SyncOptions::registry_urls`]: a registry on this host, on the
/// protocol's default port.
pub fn default_registry_url() -> String {
    format!("http://127.0.0.1:{}", quiver_proto::DEFAULT_GRPC_PORT)
}

/// Configuration of a [`crate::SyncService`].
#[derive(Clone)]
pub struct SyncOptions {
    /// gRPC endpoints of the registry's replicas, e.g.
    /// `http://registry:50051`: the sync follows one and moves to the next
    /// when it fails (in order, round and round).
    pub registry_urls: Vec<String>,
    /// Worker token sent as `authorization: Bearer …`.
    pub token: Option<String>,
    /// Identity reported to the registry with `ReportWorkerStatus`.
    pub worker_id: String,
    /// Safety-net poll period, drawn uniformly from this range after every
    /// poll so a fleet does not poll in lockstep (R-SYNC-3).
    pub poll_interval: (Duration, Duration),
    /// First reconnect delay (before jitter).
    pub backoff_min: Duration,
    /// Cap of the reconnect delay, jitter included.
    pub backoff_max: Duration,
    /// Moving on to the next replica waits a random delay up to this long:
    /// the workers of a replica that died all notice at once, and must not
    /// all arrive at the next one in the same instant.
    pub failover_spread: Duration,
    /// Period of status reports (R-SYNC-7).
    pub report_interval: Duration,
    /// TCP + HTTP/2 connect timeout.
    pub connect_timeout: Duration,
    /// Timeout of unary calls (list, get, report).
    pub request_timeout: Duration,
    /// A watch stream with no message (event or heartbeat) for this long is
    /// treated as dead; about 3× the registry's heartbeat period.
    pub stream_idle_timeout: Duration,
    /// PEM CA certificates trusted for an `https://` registry; `None`
    /// trusts the system roots. Refused with an `http://` registry.
    pub registry_ca: Option<Vec<u8>>,
}

impl Default for SyncOptions {
    fn default() -> Self {
        SyncOptions {
            registry_urls: vec![default_registry_url()],
            token: None,
            worker_id: String::new(),
            poll_interval: (Duration::from_secs(30), Duration::from_secs(120)),
            backoff_min: Duration::from_millis(200),
            backoff_max: Duration::from_secs(10),
            failover_spread: Duration::from_secs(1),
            report_interval: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            stream_idle_timeout: Duration::from_secs(45),
            registry_ca: None,
        }
    }
}

// The token must not end up in logs.
impl fmt::Debug for SyncOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SyncOptions")
            .field("registry_urls", &self.registry_urls)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("worker_id", &self.worker_id)
            .field("poll_interval", &self.poll_interval)
            .field("backoff_min", &self.backoff_min)
            .field("backoff_max", &self.backoff_max)
            .field("failover_spread", &self.failover_spread)
            .field("report_interval", &self.report_interval)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("stream_idle_timeout", &self.stream_idle_timeout)
            .field("registry_ca", &self.registry_ca.as_ref().map(|_| "<pem>"))
            .finish()
    }
}

impl SyncOptions {
    /// Rejects values that would make the loops spin, panic or never run.
    pub fn validate(&self) -> Result<(), SyncError> {
        let invalid = |message: &str| Err(SyncError::InvalidOptions(message.to_owned()));
        if self.registry_urls.is_empty() {
            return invalid("registry_urls must name at least one registry");
        }
        if self.worker_id.trim().is_empty() || self.worker_id.len() > 256 {
            return invalid("worker_id must be 1 to 256 characters");
        }
        let (poll_min, poll_max) = self.poll_interval;
        if poll_min.is_zero() || poll_min > poll_max {
            return invalid("poll_interval must be a non-empty range of positive durations");
        }
        if self.backoff_min.is_zero() || self.backoff_min > self.backoff_max {
            return invalid("backoff_min must be positive and at most backoff_max");
        }
        for (name, value) in [
            ("report_interval", self.report_interval),
            ("connect_timeout", self.connect_timeout),
            ("request_timeout", self.request_timeout),
            ("stream_idle_timeout", self.stream_idle_timeout),
        ] {
            if value.is_zero() {
                return Err(SyncError::InvalidOptions(format!(
                    "{name} must be positive"
                )));
            }
        }
        Ok(())
    }
}
