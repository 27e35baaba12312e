//! The worker's client of the registry's memory of deleted gateway sessions
//! (docs/reference.md §13.4), asked of the replica the sync follows with
//! the worker token. Every call is bounded by the caller's timeout.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use quiver_proto::v1 as pb;

use crate::SyncError;
use crate::client::Connector;

/// Records and looks up deleted gateway sessions; cheap to clone.
#[derive(Clone)]
pub struct RegistrySessions {
    pub(crate) connector: Arc<Connector>,
}

impl std::fmt::Debug for RegistrySessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RegistrySessions(..)")
    }
}

fn unix_ms(at: SystemTime) -> i64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl RegistrySessions {
    /// Remembers session `session_sha256` (lowercase hex SHA-256 of its
    /// inner id) as deleted until `expires_at`.
    pub async fn revoke(
        &self,
        session_sha256: &str,
        expires_at: SystemTime,
        timeout: Duration,
    ) -> Result<(), SyncError> {
        let request = pb::RevokeSessionRequest {
            session_sha256: session_sha256.to_owned(),
            expires_at_ms: unix_ms(expires_at),
        };
        self.connector
            .session_call("revoke session", timeout, |mut client| async move {
                client.revoke_session(request).await
            })
            .await?;
        Ok(())
    }

    /// Until when session `session_sha256` is remembered as deleted; `None`
    /// when it is not.
    pub async fn revoked_until(
        &self,
        session_sha256: &str,
        timeout: Duration,
    ) -> Result<Option<SystemTime>, SyncError> {
        let request = pb::IsSessionRevokedRequest {
            session_sha256: session_sha256.to_owned(),
        };
        let response = self
            .connector
            .session_call("is session revoked", timeout, |mut client| async move {
                client.is_session_revoked(request).await
            })
            .await?;
        Ok(response.revoked.then(|| {
            u64::try_from(response.expires_at_ms)
                .ok()
                .and_then(|ms| SystemTime::UNIX_EPOCH.checked_add(Duration::from_millis(ms)))
                .unwrap_or(SystemTime::UNIX_EPOCH)
        }))
    }
}
