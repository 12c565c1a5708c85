//! Backoff between publish attempts of one row: a pure function of the
//! attempt number, persisted as the row's `next_attempt_at`.

use std::time::Duration;

/// Exponential backoff with "equal jitter": the delay for attempt `n`
/// (1-based) is drawn from `[d/2, d)` where `d = min(base * 2^(n-1), max)`.
/// Half of it is fixed so a retry storm can never collapse to zero delay;
/// the other half spreads rows that failed together (a broker outage) so
/// they do not all come due in the same instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay ceiling of the first retry.
    pub base: Duration,
    /// Cap on any delay.
    pub max: Duration,
}

impl Backoff {
    /// The un-jittered delay ceiling after `attempt` failed attempts.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(63);
        let factor = 1u64 << exponent;
        let base_ms = u64::try_from(self.base.as_millis()).unwrap_or(u64::MAX);
        let max_ms = u64::try_from(self.max.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(base_ms.saturating_mul(factor).min(max_ms))
    }

    /// The delay after `attempt` failed attempts, `jitter` in `[0, 1)`
    /// choosing where in `[ceiling/2, ceiling)` it falls.
    pub fn delay_with(&self, attempt: u32, jitter: f64) -> Duration {
        let ceiling = self.ceiling(attempt);
        let half = ceiling / 2;
        half + half.mul_f64(jitter.clamp(0.0, 1.0))
    }

    /// The delay after `attempt` failed attempts, randomly jittered.
    pub fn delay(&self, attempt: u32) -> Duration {
        self.delay_with(attempt, rand::random::<f64>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BACKOFF: Backoff = Backoff {
        base: Duration::from_secs(1),
        max: Duration::from_secs(300),
    };

    #[test]
    fn ceiling_doubles_per_attempt_up_to_the_cap() {
        assert_eq!(BACKOFF.ceiling(1), Duration::from_secs(1));
        assert_eq!(BACKOFF.ceiling(2), Duration::from_secs(2));
        assert_eq!(BACKOFF.ceiling(5), Duration::from_secs(16));
        assert_eq!(BACKOFF.ceiling(9), Duration::from_secs(256));
        assert_eq!(BACKOFF.ceiling(10), Duration::from_secs(300));
        assert_eq!(BACKOFF.ceiling(u32::MAX), Duration::from_secs(300));
    }

    #[test]
    fn attempt_zero_is_treated_as_the_first() {
        assert_eq!(BACKOFF.ceiling(0), BACKOFF.ceiling(1));
    }

    #[test]
    fn jitter_stays_within_the_upper_half() {
        for attempt in 1..20 {
            let ceiling = BACKOFF.ceiling(attempt);
            assert_eq!(BACKOFF.delay_with(attempt, 0.0), ceiling / 2);
            assert!(BACKOFF.delay_with(attempt, 0.999) < ceiling || ceiling.is_zero());
            for _ in 0..50 {
                let delay = BACKOFF.delay(attempt);
                assert!(
                    delay >= ceiling / 2 && delay <= ceiling,
                    "{delay:?} vs {ceiling:?}"
                );
            }
        }
    }

    #[test]
    fn huge_bases_saturate_instead_of_overflowing() {
        let backoff = Backoff {
            base: Duration::from_secs(u64::MAX / 1000),
            max: Duration::from_secs(u64::MAX / 1000),
        };
        assert_eq!(backoff.ceiling(40), backoff.max);
    }
}
