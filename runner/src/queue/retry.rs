//! Retry policy: exponential backoff `base * 2^attempts`, capped, with downward jitter so a
//! burst of failures does not come back as a burst. Pure logic; the queue only stores the
//! resulting delay.

use std::time::Duration;

use rand::Rng;

use super::ModuleSettings;

pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_secs(60);
pub const DEFAULT_BACKOFF_CAP: Duration = Duration::from_secs(3600);
/// A delay is scaled by a random factor in `[1 - jitter, 1]`: jitter never exceeds the cap.
pub const DEFAULT_JITTER: f64 = 0.25;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    pub base: Duration,
    pub cap: Duration,
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { base: DEFAULT_BACKOFF_BASE, cap: DEFAULT_BACKOFF_CAP, jitter: DEFAULT_JITTER }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum RetryPolicyError {
    #[error("backoff base must be positive")]
    ZeroBase,
    #[error("backoff cap ({cap:?}) must not be below the base ({base:?})")]
    CapBelowBase { base: Duration, cap: Duration },
    #[error("jitter must be within 0.0..=1.0, got {0}")]
    Jitter(f64),
}

impl RetryPolicy {
    pub fn new(base: Duration, cap: Duration) -> Result<Self, RetryPolicyError> {
        let policy = RetryPolicy { base, cap, ..RetryPolicy::default() };
        policy.validate()?;
        Ok(policy)
    }

    pub fn validate(&self) -> Result<(), RetryPolicyError> {
        if self.base.is_zero() {
            return Err(RetryPolicyError::ZeroBase);
        }
        if self.cap < self.base {
            return Err(RetryPolicyError::CapBelowBase { base: self.base, cap: self.cap });
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(RetryPolicyError::Jitter(self.jitter));
        }
        Ok(())
    }

    /// This policy with a module's backoff settings (`backoff_base_ms`, `backoff_cap_ms`) in
    /// place of its own: what the worker applies to a failed attempt and the reaper to a
    /// rescued one. Nonsense settings (negative) fall back to this policy's.
    pub fn for_module(self, settings: Option<&ModuleSettings>) -> RetryPolicy {
        let ms = |v: Option<i64>| v.and_then(|v| u64::try_from(v).ok()).map(Duration::from_millis);
        let Some(s) = settings else { return self };
        let policy = RetryPolicy {
            base: ms(s.backoff_base_ms).unwrap_or(self.base),
            cap: ms(s.backoff_cap_ms).unwrap_or(self.cap),
            jitter: self.jitter,
        };
        // The registry checks base <= cap for explicit pairs; a base above the default cap
        // alone lifts the cap with it.
        RetryPolicy { cap: policy.cap.max(policy.base), ..policy }
    }

    /// The backoff after `attempts` failed attempts, before jitter: `base * 2^attempts`,
    /// never above the cap (and never overflowing).
    pub fn backoff(&self, attempts: u32) -> Duration {
        let factor = 1u32.checked_shl(attempts.min(31)).unwrap_or(u32::MAX);
        self.base.checked_mul(factor).map_or(self.cap, |d| d.min(self.cap))
    }

    /// The delay before the next attempt, jittered with `rng`.
    pub fn delay(&self, attempts: u32, rng: &mut impl Rng) -> Duration {
        let scale = 1.0 - self.jitter * rng.random::<f64>();
        self.backoff(attempts).mul_f64(scale.clamp(0.0, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, SeedableRng};

    #[test]
    fn module_backoff_overrides_the_default() {
        let default = RetryPolicy::default();
        let s = ModuleSettings {
            backoff_base_ms: Some(10),
            backoff_cap_ms: Some(100),
            ..Default::default()
        };
        let p = default.for_module(Some(&s));
        assert_eq!((p.base, p.cap), (Duration::from_millis(10), Duration::from_millis(100)));
        assert_eq!(default.for_module(None), default);
        let only_base = ModuleSettings { backoff_base_ms: Some(7_200_000), ..Default::default() };
        let p = default.for_module(Some(&only_base));
        assert_eq!(p.cap, p.base, "cap lifted to the base");
    }

    #[test]
    fn backoff_doubles_from_base_and_stops_at_cap() {
        let p = RetryPolicy::default();
        assert_eq!(p.backoff(0), Duration::from_secs(60));
        assert_eq!(p.backoff(1), Duration::from_secs(120));
        assert_eq!(p.backoff(5), Duration::from_secs(60 * 32));
        assert_eq!(p.backoff(6), Duration::from_secs(3600), "64 minutes is capped to one hour");
        assert_eq!(p.backoff(40), Duration::from_secs(3600));
        assert_eq!(p.backoff(u32::MAX), Duration::from_secs(3600));
    }

    #[test]
    fn jitter_stays_within_its_band() {
        let p = RetryPolicy::default();
        let mut rng = StdRng::seed_from_u64(7);
        let mut seen = std::collections::HashSet::new();
        for attempts in 0..10 {
            for _ in 0..100 {
                let d = p.delay(attempts, &mut rng);
                let full = p.backoff(attempts);
                assert!(d <= full && d >= full.mul_f64(0.75), "{d:?} vs {full:?}");
                seen.insert(d);
            }
        }
        assert!(seen.len() > 100, "jitter should spread delays");
    }

    #[test]
    fn zero_jitter_is_exact() {
        let p = RetryPolicy { jitter: 0.0, ..RetryPolicy::default() };
        assert_eq!(p.delay(2, &mut rand::rng()), Duration::from_secs(240));
    }

    #[test]
    fn invalid_policies_are_rejected() {
        assert_eq!(
            RetryPolicy::new(Duration::ZERO, Duration::from_secs(1)),
            Err(RetryPolicyError::ZeroBase)
        );
        assert!(matches!(
            RetryPolicy::new(Duration::from_secs(10), Duration::from_secs(1)),
            Err(RetryPolicyError::CapBelowBase { .. })
        ));
        let p = RetryPolicy { jitter: 1.5, ..RetryPolicy::default() };
        assert_eq!(p.validate(), Err(RetryPolicyError::Jitter(1.5)));
    }
}
