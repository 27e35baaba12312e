//! Helpers shared by the benchmarks: latency samples with nearest-rank
//! percentiles, and sizes read from the environment.

use std::time::Duration;

/// Latency samples, sorted once.
#[derive(Debug, Clone, Default)]
pub struct Samples(Vec<Duration>);

impl Samples {
    /// Sorts `samples`.
    pub fn new(mut samples: Vec<Duration>) -> Self {
        samples.sort_unstable();
        Samples(samples)
    }

    /// Nearest-rank percentile, `p` in (0, 1]; zero without samples.
    pub fn percentile(&self, p: f64) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        let rank = (p * self.0.len() as f64).ceil() as usize;
        self.0[rank.clamp(1, self.0.len()) - 1]
    }

    /// Median.
    pub fn p50(&self) -> Duration {
        self.percentile(0.50)
    }

    /// 99th percentile.
    pub fn p99(&self) -> Duration {
        self.percentile(0.99)
    }

    /// Largest sample.
    pub fn max(&self) -> Duration {
        self.0.last().copied().unwrap_or_default()
    }

    /// Arithmetic mean; zero without samples.
    pub fn mean(&self) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        self.0.iter().sum::<Duration>() / self.0.len() as u32
    }

    /// The samples, ascending.
    pub fn sorted(&self) -> &[Duration] {
        &self.0
    }
}

/// Milliseconds as a float, for tables.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A size from the environment variable `name`, or `default`.
///
/// # Panics
/// When the variable is set but not a non-negative integer: a benchmark run
/// with a mistyped size must stop, not measure something else.
pub fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(value) => value
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a non-negative integer, got {value:?}")),
        Err(_) => default,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let samples = Samples::new((1..=100).rev().map(Duration::from_millis).collect());
        assert_eq!(samples.p50(), Duration::from_millis(50));
        assert_eq!(samples.p99(), Duration::from_millis(99));
        assert_eq!(samples.max(), Duration::from_millis(100));
        assert_eq!(samples.mean(), Duration::from_micros(50_500));
        assert_eq!(Samples::default().p50(), Duration::ZERO);
    }
}
