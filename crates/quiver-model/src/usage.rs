//! Usage counts of tool calls (docs/reference.md §12.3): what workers
//! report to the registry per (principal, policy, server, tool, minute) and
//! what `GET /admin/api/usage` answers. Latency is a fixed histogram so
//! counts from many workers and minutes add up exactly; percentiles are
//! read off it (within one bucket's width).

use serde::{Deserialize, Serialize};

/// Upper bounds of the latency buckets, in milliseconds; a last bucket
/// holds everything slower.
pub const LATENCY_BOUNDS_MS: [f64; 15] = [
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1_000.0, 2_000.0, 5_000.0, 10_000.0,
    30_000.0, 60_000.0,
];
/// Number of latency buckets.
pub const LATENCY_BUCKETS: usize = LATENCY_BOUNDS_MS.len() + 1;
/// The length of one usage row's period.
pub const MINUTE_MS: i64 = 60_000;

/// The most rows one usage report may carry.
pub const MAX_BATCH_ROWS: usize = 1_000;

/// Calls per latency bucket.
pub type LatencyBuckets = [u64; LATENCY_BUCKETS];

/// The bucket a call of `ms` milliseconds falls in.
pub fn bucket_of(ms: f64) -> usize {
    LATENCY_BOUNDS_MS
        .iter()
        .position(|bound| ms <= *bound)
        .unwrap_or(LATENCY_BOUNDS_MS.len())
}

/// The `q` quantile (0 < q ≤ 1) of a histogram, interpolated linearly
/// within its bucket; the open last bucket answers its lower bound. `None`
/// for an empty histogram.
pub fn percentile(buckets: &LatencyBuckets, q: f64) -> Option<f64> {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = (q * total as f64).ceil().max(1.0);
    let mut below = 0u64;
    for (index, count) in buckets.iter().enumerate() {
        let through = below + count;
        if (through as f64) >= rank {
            let lower = if index == 0 {
                0.0
            } else {
                LATENCY_BOUNDS_MS[index - 1]
            };
            let Some(upper) = LATENCY_BOUNDS_MS.get(index) else {
                return Some(lower);
            };
            let within = (rank - below as f64) / *count as f64;
            return Some(lower + (upper - lower) * within);
        }
        below = through;
    }
    LATENCY_BOUNDS_MS.last().copied()
}

/// Who called what, in which minute: one usage row's key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct UsageKey {
    /// The caller's principal.
    pub principal: String,
    /// The caller's policy (task).
    pub policy: String,
    /// The server.
    pub server_id: String,
    /// The tool's own name at the server.
    pub tool: String,
    /// Start of the minute, milliseconds since the epoch.
    pub minute_ms: i64,
}

/// What happened to one key's calls.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageCounts {
    /// Calls that ran (whatever their outcome).
    pub calls: u64,
    /// Of them, those that failed (an error or the server's `isError`).
    pub errors: u64,
    /// Calls refused by a rate or concurrency limit (they did not run).
    pub rate_limited: u64,
    /// Latency of the calls that ran.
    pub latency: LatencyBuckets,
}

impl UsageCounts {
    /// Adds `other` in.
    pub fn add(&mut self, other: &UsageCounts) {
        self.calls += other.calls;
        self.errors += other.errors;
        self.rate_limited += other.rate_limited;
        for (mine, theirs) in self.latency.iter_mut().zip(other.latency) {
            *mine += theirs;
        }
    }
}

/// How `GET /admin/api/usage` groups rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageGroup {
    /// By caller.
    Principal,
    /// By policy.
    Policy,
    /// By server.
    Server,
    /// By server and tool.
    Tool,
}

impl UsageGroup {
    /// Parses the `group_by` parameter.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "principal" => Some(UsageGroup::Principal),
            "policy" => Some(UsageGroup::Policy),
            "server" => Some(UsageGroup::Server),
            "tool" => Some(UsageGroup::Tool),
            _ => None,
        }
    }
}

/// One answer row: a group's key values, its period (with a step), counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageTotal {
    /// The group's key: one value, two (`server`, `tool`) for
    /// [`UsageGroup::Tool`].
    pub key: Vec<String>,
    /// Start of the step, milliseconds since the epoch (with a step).
    pub time_ms: Option<i64>,
    /// The counts.
    pub counts: UsageCounts,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_and_percentiles() {
        assert_eq!(bucket_of(0.2), 0);
        assert_eq!(bucket_of(1.0), 0);
        assert_eq!(bucket_of(1.5), 1);
        assert_eq!(bucket_of(59_999.0), 14);
        assert_eq!(bucket_of(90_000.0), 15);
        let mut buckets = LatencyBuckets::default();
        assert_eq!(percentile(&buckets, 0.5), None);
        // 10 calls in (2, 5], 10 in (50, 100].
        buckets[2] = 10;
        buckets[6] = 10;
        let p50 = percentile(&buckets, 0.5).unwrap();
        assert!((p50 - 5.0).abs() < 1e-9, "{p50}");
        let p95 = percentile(&buckets, 0.95).unwrap();
        assert!((p95 - 95.0).abs() < 1e-9, "{p95}");
        buckets = LatencyBuckets::default();
        buckets[15] = 1;
        assert_eq!(percentile(&buckets, 0.95), Some(60_000.0));
    }
}
