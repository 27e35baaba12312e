//! Rate limit for log lines about what one peer does.
//!
//! A server can make any of its events happen as fast as it likes (log
//! notifications, stderr lines, garbage on stdout, crashes, ignored
//! cancellations), so no event of a peer may cost one log line each. Per kind
//! of event, the first [`BURST`] of an [`INTERVAL`] are logged; the rest are
//! counted, and the first event after the interval is logged with the count
//! of those left out. Counting metrics see every event.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Events of one kind logged per interval.
pub const BURST: u32 = 5;
/// Length of one rate-limit window.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// Counters of one kind of event in the current window.
#[derive(Debug)]
struct Window {
    started: Instant,
    logged: u32,
    suppressed: u64,
}

/// Log rate limit of one peer, per kind of event.
#[derive(Debug, Default)]
pub struct PeerEvents {
    kinds: Mutex<HashMap<&'static str, Window>>,
}

impl PeerEvents {
    /// Whether an event of `kind` may be logged now; if so, the number of
    /// events of that kind left out of the log since the last logged one
    /// (to be logged with it).
    pub fn admit(&self, kind: &'static str) -> Option<u64> {
        self.admit_at(kind, Instant::now())
    }

    fn admit_at(&self, kind: &'static str, now: Instant) -> Option<u64> {
        let mut kinds = self.kinds.lock().unwrap_or_else(|p| p.into_inner());
        let window = kinds.entry(kind).or_insert(Window {
            started: now,
            logged: 0,
            suppressed: 0,
        });
        if now.duration_since(window.started) >= INTERVAL {
            let suppressed = window.suppressed;
            *window = Window {
                started: now,
                logged: 1,
                suppressed: 0,
            };
            return Some(suppressed);
        }
        if window.logged < BURST {
            window.logged += 1;
            return Some(0);
        }
        window.suppressed += 1;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_logs_a_burst_then_one_line_per_interval_with_the_count() {
        let events = PeerEvents::default();
        let start = Instant::now();
        let logged: Vec<_> = (0..1000)
            .filter_map(|_| events.admit_at("log", start))
            .collect();
        assert_eq!(logged, vec![0; BURST as usize]);
        // Another kind has its own window.
        assert_eq!(events.admit_at("stderr", start), Some(0));
        let later = start + INTERVAL;
        assert_eq!(events.admit_at("log", later), Some(1000 - u64::from(BURST)));
        let logged_later = (0..100)
            .filter_map(|_| events.admit_at("log", later))
            .count();
        assert_eq!(logged_later, BURST as usize - 1);
    }
}
