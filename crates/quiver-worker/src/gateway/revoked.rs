//! Deleted gateway sessions: a session id a client ended with `DELETE` is
//! refused (404) for the rest of its lifetime, on this worker and, through
//! the registry, on every worker of the fleet (docs/reference.md §13.4).
//!
//! - The worker that answers the `DELETE` remembers the session locally
//!   (a bounded set, each entry until the id would have expired) and tells
//!   the registry (`McpSessionService.RevokeSession`, bounded wait).
//! - A worker about to restore a session it does not hold asks the registry
//!   first (`IsSessionRevoked`, bounded wait); a session it holds is asked
//!   about at most every [`RECHECK`] on its next request, so a session live
//!   on two workers ends on both.
//! - The registry unreachable (or slow): the worker serves on what it knows
//!   locally (fail open, counted in `mcp_gateway_revocation_checks_failed_total`)
//!   and stops asking for [`RECHECK`], so an outage costs no request more
//!   than one bounded wait. Workers keep serving through a registry outage;
//!   a deletion made on another worker meanwhile is enforced once the
//!   registry answers again. A deletion the registry could not record is
//!   counted in `mcp_gateway_revocations_unshared_total` (it still holds on
//!   the worker that answered it).
//! - Without a registry, deletions are remembered by the worker alone.
//!
//! Sessions are named by the SHA-256 of their inner id, never the signed id.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use quiver_sync::RegistrySessions;

use crate::gateway::session_id::now_ms;

/// Longest wait for the registry on one request.
pub const REGISTRY_WAIT: Duration = Duration::from_secs(2);

/// A held session is checked against the registry at most this often; and
/// after a failed check the registry is not asked for this long.
pub const RECHECK: Duration = Duration::from_secs(5);

/// Deleted sessions remembered locally at most; beyond, expired entries
/// are dropped, then the one expiring soonest (counted in
/// `mcp_gateway_revocations_forgotten_total`).
pub const MAX_LOCAL_REVOCATIONS: usize = 100_000;

/// Held sessions whose last registry check is remembered at most; a full
/// map starts over (those sessions are checked again on their next request).
const MAX_CHECKED: usize = 16_384;

/// The worker's memory of deleted sessions.
pub struct Revoked {
    /// Session digest → end of its id's lifetime (Unix milliseconds).
    local: Mutex<HashMap<String, u64>>,
    /// Session digest → last registry check (held sessions).
    checked: Mutex<HashMap<String, Instant>>,
    /// The registry is not asked until then (it failed).
    quiet_until: Mutex<Option<Instant>>,
    registry: Option<RegistrySessions>,
}

impl std::fmt::Debug for Revoked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Revoked")
            .field("registry", &self.registry.is_some())
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Revoked {
    /// Deleted sessions shared through `registry`, or local only.
    pub fn new(registry: Option<RegistrySessions>) -> Self {
        Revoked {
            local: Mutex::default(),
            checked: Mutex::default(),
            quiet_until: Mutex::default(),
            registry,
        }
    }

    /// Remembers locally that session `digest` is deleted until `expires_ms`.
    fn remember(&self, digest: &str, expires_ms: u64) {
        let now = now_ms();
        let mut local = lock(&self.local);
        if local.len() >= MAX_LOCAL_REVOCATIONS && !local.contains_key(digest) {
            local.retain(|_, expires| *expires > now);
            if local.len() >= MAX_LOCAL_REVOCATIONS
                && let Some(soonest) = local
                    .iter()
                    .min_by_key(|(_, expires)| **expires)
                    .map(|(key, _)| key.clone())
            {
                local.remove(&soonest);
                metrics::counter!("mcp_gateway_revocations_forgotten_total").increment(1);
            }
        }
        let entry = local.entry(digest.to_owned()).or_insert(expires_ms);
        *entry = (*entry).max(expires_ms);
    }

    fn registry_usable(&self) -> Option<&RegistrySessions> {
        let registry = self.registry.as_ref()?;
        match *lock(&self.quiet_until) {
            Some(until) if Instant::now() < until => {
                metrics::counter!("mcp_gateway_revocation_checks_failed_total").increment(1);
                None
            }
            _ => Some(registry),
        }
    }

    fn registry_failed(&self, what: &str, error: &quiver_sync::SyncError) {
        let mut quiet = lock(&self.quiet_until);
        let first = quiet.is_none_or(|until| Instant::now() >= until);
        *quiet = Some(Instant::now() + RECHECK);
        drop(quiet);
        // One line per quiet period, not one per request.
        if first {
            tracing::warn!(%error, what, "registry unreachable for gateway session revocations; serving on local knowledge");
        }
    }

    /// Ends session `digest` for good (its id lives until `expires_ms`):
    /// remembered here, and told to the registry within [`REGISTRY_WAIT`].
    pub async fn revoke(&self, digest: &str, expires_ms: u64) {
        self.remember(digest, expires_ms);
        let Some(registry) = self.registry.as_ref() else {
            return;
        };
        let expires_at = SystemTime::UNIX_EPOCH + Duration::from_millis(expires_ms);
        if let Err(error) = registry.revoke(digest, expires_at, REGISTRY_WAIT).await {
            metrics::counter!("mcp_gateway_revocations_unshared_total").increment(1);
            self.registry_failed("revoke", &error);
        }
    }

    /// Whether session `digest` was deleted. `held`: this worker holds the
    /// session (then the registry is asked at most every [`RECHECK`]);
    /// otherwise it is about to be restored and the registry is asked now.
    pub async fn is_revoked(&self, digest: &str, held: bool) -> bool {
        let now = now_ms();
        if lock(&self.local)
            .get(digest)
            .is_some_and(|expires| *expires > now)
        {
            return true;
        }
        {
            // Asked now (a restore always asks; a held session at most
            // every RECHECK, counted from its last answer or restore).
            let mut checked = lock(&self.checked);
            if held && checked.get(digest).is_some_and(|at| at.elapsed() < RECHECK) {
                return false;
            }
            if checked.len() >= MAX_CHECKED {
                checked.clear();
            }
            checked.insert(digest.to_owned(), Instant::now());
        }
        let Some(registry) = self.registry_usable() else {
            return false;
        };
        match registry.revoked_until(digest, REGISTRY_WAIT).await {
            Ok(Some(until)) => {
                let until = until
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
                self.remember(digest, until);
                true
            }
            Ok(None) => false,
            Err(error) => {
                metrics::counter!("mcp_gateway_revocation_checks_failed_total").increment(1);
                self.registry_failed("check", &error);
                false
            }
        }
    }

    /// Forgets the last registry check of a session that ended here.
    pub fn forget_check(&self, digest: &str) {
        lock(&self.checked).remove(digest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_deletion_is_remembered_until_the_id_expires() {
        let revoked = Revoked::new(None);
        let later = now_ms() + 60_000;
        assert!(!revoked.is_revoked("a", false).await);
        revoked.revoke("a", later).await;
        assert!(revoked.is_revoked("a", false).await);
        assert!(revoked.is_revoked("a", true).await);
        assert!(!revoked.is_revoked("b", true).await);
        // An entry past its id's lifetime no longer counts.
        revoked.revoke("old", now_ms().saturating_sub(1)).await;
        assert!(!revoked.is_revoked("old", false).await);
    }

    #[tokio::test]
    async fn the_local_set_is_bounded() {
        let revoked = Revoked::new(None);
        let later = now_ms() + 60_000;
        for at in 0..MAX_LOCAL_REVOCATIONS + 10 {
            revoked.remember(&format!("s{at}"), later + at as u64);
        }
        assert_eq!(lock(&revoked.local).len(), MAX_LOCAL_REVOCATIONS);
        // The ones expiring soonest were forgotten; the newest are kept.
        assert!(!revoked.is_revoked("s0", false).await);
        assert!(
            revoked
                .is_revoked(&format!("s{}", MAX_LOCAL_REVOCATIONS + 9), false)
                .await
        );
    }
}
