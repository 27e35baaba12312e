//! Reconnecting with backoff, as a unit of its own: how long an entry waits
//! after failed connects, and what a call is told meanwhile. Delays grow
//! exponentially with jitter (so many workers do not restart a shared
//! server in lockstep), are capped, and never give up; a connect that
//! succeeds starts the next run of failures afresh.

use std::time::Duration;

use backon::BackoffBuilder;

use super::options::PoolOptions;
use crate::error::McpError;

/// The current run of failed connects of one entry.
#[derive(Default)]
pub(super) struct Backoff {
    /// Consecutive failed connects.
    failures: u32,
    /// Delays of this run; made on its first failure.
    delays: Option<backon::ExponentialBackoff>,
}

impl Backoff {
    /// Counts a failed connect; returns how long to wait before the next.
    pub(super) fn failed(&mut self, options: &PoolOptions) -> Duration {
        self.failures += 1;
        self.delays
            .get_or_insert_with(|| {
                backon::ExponentialBuilder::default()
                    .with_min_delay(options.restart_backoff_min)
                    .with_max_delay(options.restart_backoff_max)
                    .with_jitter()
                    .without_max_times()
                    .build()
            })
            .next()
            .unwrap_or(options.restart_backoff_max)
    }

    /// Consecutive failed connects so far.
    pub(super) fn failures(&self) -> u32 {
        self.failures
    }
}

/// What a call gets while its server backs off: a fast error instead of a
/// spawn per call. A refusal by the egress allowlist keeps its code.
pub(super) fn refusal(retry_in: Duration, cause: &McpError) -> McpError {
    if let McpError::EgressDenied(_) = cause {
        return cause.clone();
    }
    McpError::Unavailable(format!(
        "server is restarting after failures (retry in {} ms): {cause}",
        retry_in.as_millis()
    ))
}
