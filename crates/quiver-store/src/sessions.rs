//! Deleted MCP gateway sessions (docs/reference.md §13.4): the fleet's
//! memory of which session ids must no longer be served. One table for both
//! backends, plain SQL both engines run unchanged; rows are keyed by the
//! SHA-256 of the session's inner id and live until the id would have
//! expired anyway.

use chrono::{DateTime, Utc};
use sqlx::Row;

use crate::error::StoreError;
use crate::sql::SqlStore;

/// At most this many unexpired gateway session revocations are remembered
/// at once ([`crate::Store::revoke_gateway_session`]).
pub const MAX_GATEWAY_SESSION_REVOCATIONS: u64 = 100_000;

/// $1 now.
const PURGE_EXPIRED: &str = "DELETE FROM gateway_session_revocations WHERE expires_at_ms <= $1";
const COUNT: &str = "SELECT COUNT(*) FROM gateway_session_revocations";
/// $1 digest.
const EXISTS: &str = "SELECT 1 FROM gateway_session_revocations WHERE session_sha256 = $1";
/// $1 digest, $2 expiry, $3 now. A second revocation keeps the later expiry.
const UPSERT: &str = "INSERT INTO gateway_session_revocations \
     (session_sha256, expires_at_ms, revoked_at_ms) VALUES ($1, $2, $3) \
     ON CONFLICT (session_sha256) DO UPDATE SET expires_at_ms = CASE \
     WHEN excluded.expires_at_ms > gateway_session_revocations.expires_at_ms \
     THEN excluded.expires_at_ms ELSE gateway_session_revocations.expires_at_ms END";
/// $1 digest, $2 now.
const SELECT_LIVE: &str = "SELECT expires_at_ms FROM gateway_session_revocations \
     WHERE session_sha256 = $1 AND expires_at_ms > $2";

impl SqlStore {
    pub(crate) async fn sessions_revoke(
        &self,
        session_sha256: &str,
        expires_at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let now = Utc::now().timestamp_millis();
        let expires_at = expires_at.timestamp_millis();
        if expires_at <= now {
            // Already expired: every worker refuses the id on its own.
            return Ok(());
        }
        let (mut tx, _turn) = self.begin_write_tx().await?;
        sqlx::query(PURGE_EXPIRED)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        let known = sqlx::query(EXISTS)
            .bind(session_sha256.to_owned())
            .fetch_optional(&mut *tx)
            .await?
            .is_some();
        if !known {
            let live: i64 = sqlx::query(COUNT).fetch_one(&mut *tx).await?.try_get(0)?;
            if u64::try_from(live).unwrap_or(0) >= MAX_GATEWAY_SESSION_REVOCATIONS {
                // Keep the purge; refuse the new row.
                tx.commit().await?;
                return Err(StoreError::Limit(format!(
                    "at most {MAX_GATEWAY_SESSION_REVOCATIONS} unexpired gateway session revocations"
                )));
            }
        }
        sqlx::query(UPSERT)
            .bind(session_sha256.to_owned())
            .bind(expires_at)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    pub(crate) async fn sessions_revocation(
        &self,
        session_sha256: &str,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        let row = sqlx::query(SELECT_LIVE)
            .bind(session_sha256.to_owned())
            .bind(Utc::now().timestamp_millis())
            .fetch_optional(self.pool())
            .await?;
        row.map(|row| {
            let ms: i64 = row.try_get(0)?;
            DateTime::from_timestamp_millis(ms)
                .ok_or_else(|| StoreError::Corrupt(format!("timestamp {ms} out of range")))
        })
        .transpose()
    }
}
