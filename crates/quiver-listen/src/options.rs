//! The bounds every listener of a process applies to its connections.

use std::time::Duration;

/// Per-connection deadlines and the cap on open connections, shared by the
/// listeners of one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerOptions {
    /// How long a new connection may take to deliver its first complete
    /// request head, counted from accept: covers the TLS handshake, the
    /// HTTP/2 preface and a request head that never ends.
    pub header_read_timeout: Duration,
    /// How long a connection may stay open with no request in flight after
    /// its last response (HTTP/1 keep-alive and HTTP/2 alike).
    pub idle_timeout: Duration,
    /// Open connections of all the process's listeners together; at the cap
    /// the oldest connection without a request in flight is closed to make
    /// room, and a new connection is refused only if every open one is
    /// serving a request. `None` derives it from the descriptor limit
    /// (minus [`ListenerOptions::reserved_descriptors`], at most
    /// [`ListenerOptions::derived_max_connections_ceiling`]).
    pub max_connections: Option<usize>,
    /// Descriptors left for everything but connections (store, MCP children
    /// and their pipes, outgoing HTTP) when the cap is derived.
    pub reserved_descriptors: u64,
    /// Upper bound of a derived cap: an idle connection costs memory too
    /// (tens of KiB), so a huge descriptor limit must not mean a huge cap.
    pub derived_max_connections_ceiling: usize,
    /// Interval of HTTP/2 keep-alive pings (dead peers are noticed).
    pub http2_keepalive_interval: Duration,
    /// How long an HTTP/2 keep-alive ping may go unanswered before the
    /// connection is closed.
    pub http2_keepalive_timeout: Duration,
}

impl Default for ListenerOptions {
    fn default() -> Self {
        ListenerOptions {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: None,
            reserved_descriptors: 512,
            derived_max_connections_ceiling: 16_384,
            http2_keepalive_interval: Duration::from_secs(30),
            http2_keepalive_timeout: Duration::from_secs(20),
        }
    }
}

impl ListenerOptions {
    /// The connection cap under a descriptor limit of `descriptor_limit`:
    /// the configured one, else the limit minus the reserve (at least half
    /// the limit, at most the ceiling), never 0.
    pub fn max_connections_under(&self, descriptor_limit: u64) -> usize {
        let cap = self.max_connections.unwrap_or_else(|| {
            let derived = descriptor_limit
                .saturating_sub(self.reserved_descriptors)
                .max(descriptor_limit / 2);
            usize::try_from(derived)
                .unwrap_or(usize::MAX)
                .min(self.derived_max_connections_ceiling)
        });
        cap.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_cap_stays_below_the_descriptor_limit() {
        let options = ListenerOptions::default();
        assert_eq!(options.max_connections_under(20_000), 16_384);
        assert_eq!(options.max_connections_under(4_096), 4_096 - 512);
        assert_eq!(options.max_connections_under(1_024), 512);
        assert_eq!(options.max_connections_under(600), 300);
        assert_eq!(options.max_connections_under(0), 1);
        let configured = ListenerOptions {
            max_connections: Some(200),
            ..ListenerOptions::default()
        };
        assert_eq!(configured.max_connections_under(20_000), 200);
    }
}
