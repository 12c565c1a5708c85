//! Whether an optional producer column (`headers`, `sequence_number`) is on
//! the table, remembered between claims.

use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an absent column is believed absent. Producers add these
/// columns with an `ALTER TABLE` while relays run; a relay that never looked
/// again would publish their rows without the column's content until it
/// restarted. Looking again twice a minute costs one catalog query per
/// replica, and bounds that window to this long.
pub(super) const ABSENT_RECHECK: Duration = Duration::from_secs(30);

/// A column's presence: found once, it is present until a statement naming
/// it fails for its absence ([`ColumnPresence::forget`]); absent, it is
/// looked up again after [`ABSENT_RECHECK`].
#[derive(Debug, Default)]
pub(super) struct ColumnPresence {
    known: Mutex<Option<Known>>,
}

#[derive(Debug, Clone, Copy)]
struct Known {
    present: bool,
    looked_up: Instant,
}

impl ColumnPresence {
    /// The remembered answer while it holds, otherwise `look_up`'s.
    pub(super) async fn get_or_look_up<E, F>(&self, look_up: impl FnOnce() -> F) -> Result<bool, E>
    where
        F: Future<Output = Result<bool, E>>,
    {
        if let Some(present) = self.remembered(Instant::now()) {
            return Ok(present);
        }
        let present = look_up().await?;
        *self.lock() = Some(Known {
            present,
            looked_up: Instant::now(),
        });
        Ok(present)
    }

    /// Forgets what was found: the next use looks the column up again
    /// (a statement naming it failed because it is gone).
    pub(super) fn forget(&self) {
        *self.lock() = None;
    }

    fn remembered(&self, now: Instant) -> Option<bool> {
        let known = (*self.lock())?;
        (known.present || now.duration_since(known.looked_up) < ABSENT_RECHECK).then_some(known.present)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Known>> {
        // The guarded value is a plain copy, valid even if a holder panicked.
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remembering(present: bool, looked_up: Instant) -> ColumnPresence {
        ColumnPresence {
            known: Mutex::new(Some(Known { present, looked_up })),
        }
    }

    #[test]
    fn nothing_is_remembered_before_the_first_look_up() {
        assert_eq!(ColumnPresence::default().remembered(Instant::now()), None);
    }

    #[test]
    fn a_present_column_stays_present() {
        let then = Instant::now();
        let presence = remembering(true, then);
        assert_eq!(presence.remembered(then + ABSENT_RECHECK * 100), Some(true));
    }

    #[test]
    fn an_absent_column_is_looked_up_again_after_the_recheck_interval() {
        let then = Instant::now();
        let presence = remembering(false, then);
        assert_eq!(presence.remembered(then + ABSENT_RECHECK / 2), Some(false));
        assert_eq!(presence.remembered(then + ABSENT_RECHECK), None);
    }

    #[tokio::test]
    async fn a_failed_look_up_remembers_nothing() {
        let presence = ColumnPresence::default();
        let failed: Result<bool, &str> = presence.get_or_look_up(|| async { Err("down") }).await;
        assert_eq!(failed, Err("down"));
        assert_eq!(presence.remembered(Instant::now()), None);
        assert_eq!(
            presence.get_or_look_up(|| async { Ok::<_, ()>(true) }).await,
            Ok(true)
        );
    }
}
