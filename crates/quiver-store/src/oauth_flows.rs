//! The one-time state of OAuth flows in progress: pending authorization-code
//! flows and the authorization links handed to principals whose call needs
//! their consent. Plain SQL both engines run unchanged; taking either is
//! `DELETE … RETURNING`, so of concurrent takers exactly one gets it, and
//! each table is bounded (expired rows are purged before a count).

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::error::StoreError;
use crate::oauth::{Sealed, counter};
use crate::sql::{SqlStore, from_millis, millis};

/// At most this many unexpired OAuth authorizations may be pending at once
/// ([`crate::Store::create_oauth_authorization`]).
pub const MAX_PENDING_OAUTH_AUTHORIZATIONS: u64 = 1_000;

/// At most this many unexpired per-user authorization links may exist at
/// once ([`crate::Store::create_oauth_ticket`]).
pub const MAX_OAUTH_TICKETS: u64 = 10_000;

/// At most this many unexpired authorization links one principal holds for
/// one connection; a new one replaces the oldest.
pub const MAX_OAUTH_TICKETS_PER_GRANT: u64 = 5;

/// A pending authorization-code flow (one-time: taking it deletes it).
#[derive(Clone, PartialEq)]
pub struct OAuthAuthorizationRow {
    /// The flow's `state` parameter (its key).
    pub state: String,
    /// The connection it authorizes.
    pub name: String,
    /// The principal whose grant it authorizes (`None`: the connection's
    /// own, started by an admin).
    pub principal: Option<String>,
    /// The connection's generation when the flow started.
    pub generation: u64,
    /// Sealed JSON: PKCE verifier, client id…
    pub payload: String,
    /// When the flow started.
    pub created_at: DateTime<Utc>,
    /// When the flow expires.
    pub expires_at: DateTime<Utc>,
    /// Lowercase hex SHA-256 of the nonce cookie set in the browser that
    /// started the flow; its callback must present that cookie. Empty for
    /// flows stored before browsers were bound (they match no cookie).
    pub browser_hash: String,
}

impl std::fmt::Debug for OAuthAuthorizationRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthAuthorizationRow")
            .field("state", &self.state)
            .field("name", &self.name)
            .field("principal", &self.principal)
            .field("generation", &self.generation)
            .field("payload", &Sealed(true))
            .field("created_at", &self.created_at)
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// An authorization link handed to a principal whose call needs its
/// consent (one-time: taking it deletes it).
#[derive(Clone, PartialEq)]
pub struct OAuthTicketRow {
    /// Lowercase hex SHA-256 of the link's secret (its key).
    pub ticket_sha256: String,
    /// The connection it authorizes.
    pub name: String,
    /// The principal it is bound to.
    pub principal: String,
    /// The link's secret, sealed by the caller.
    pub sealed_secret: String,
    /// When it was handed out.
    pub created_at: DateTime<Utc>,
    /// When it stops working.
    pub expires_at: DateTime<Utc>,
}

impl std::fmt::Debug for OAuthTicketRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthTicketRow")
            .field("name", &self.name)
            .field("principal", &self.principal)
            .field("sealed_secret", &Sealed(true))
            .field("created_at", &self.created_at)
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

const AUTHORIZATION_COLUMNS: &str =
    "state, name, generation, payload, created_at_ms, expires_at_ms, browser_hash, principal";

const TICKET_COLUMNS: &str =
    "ticket_sha256, name, principal, created_at_ms, expires_at_ms, sealed_secret";

/// $1 now.
const PURGE_EXPIRED_TICKETS: &str = "DELETE FROM oauth_grant_tickets WHERE expires_at_ms <= $1";
const COUNT_TICKETS: &str = "SELECT COUNT(*) FROM oauth_grant_tickets";
/// $1 name, $2 principal: newest first.
const OWNER_TICKETS: &str = "SELECT ticket_sha256 FROM oauth_grant_tickets \
     WHERE name = $1 AND principal = $2 ORDER BY created_at_ms DESC, ticket_sha256";
const DELETE_TICKET: &str = "DELETE FROM oauth_grant_tickets WHERE ticket_sha256 = $1";

fn insert_ticket_sql() -> String {
    format!("INSERT INTO oauth_grant_tickets ({TICKET_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)")
}

/// $1 name, $2 principal, $3 the instant it must live past.
fn live_ticket_sql() -> String {
    format!(
        "SELECT {TICKET_COLUMNS} FROM oauth_grant_tickets WHERE name = $1 AND principal = $2 \
         AND expires_at_ms > $3 ORDER BY created_at_ms DESC, ticket_sha256 LIMIT 1"
    )
}

fn take_ticket_sql() -> String {
    format!("DELETE FROM oauth_grant_tickets WHERE ticket_sha256 = $1 RETURNING {TICKET_COLUMNS}")
}

/// $1 now.
const PURGE_EXPIRED_AUTHORIZATIONS: &str =
    "DELETE FROM oauth_authorizations WHERE expires_at_ms <= $1";
const COUNT_AUTHORIZATIONS: &str = "SELECT COUNT(*) FROM oauth_authorizations";

fn insert_authorization_sql() -> String {
    format!(
        "INSERT INTO oauth_authorizations ({AUTHORIZATION_COLUMNS}) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
    )
}

fn get_authorization_sql() -> String {
    format!("SELECT {AUTHORIZATION_COLUMNS} FROM oauth_authorizations WHERE state = $1")
}

fn take_authorization_sql() -> String {
    format!("DELETE FROM oauth_authorizations WHERE state = $1 RETURNING {AUTHORIZATION_COLUMNS}")
}

fn authorization_from_row(row: &AnyRow) -> Result<OAuthAuthorizationRow, StoreError> {
    Ok(OAuthAuthorizationRow {
        state: row.try_get(0)?,
        name: row.try_get(1)?,
        generation: counter(row.try_get(2)?, "generation")?,
        payload: row.try_get(3)?,
        created_at: from_millis(row.try_get(4)?)?,
        expires_at: from_millis(row.try_get(5)?)?,
        browser_hash: row.try_get::<Option<String>, _>(6)?.unwrap_or_default(),
        principal: row.try_get(7)?,
    })
}

fn ticket_from_row(row: &AnyRow) -> Result<OAuthTicketRow, StoreError> {
    Ok(OAuthTicketRow {
        ticket_sha256: row.try_get(0)?,
        name: row.try_get(1)?,
        principal: row.try_get(2)?,
        created_at: from_millis(row.try_get(3)?)?,
        expires_at: from_millis(row.try_get(4)?)?,
        sealed_secret: row.try_get(5)?,
    })
}

impl SqlStore {
    pub(crate) async fn oauth_create_ticket(&self, row: OAuthTicketRow) -> Result<(), StoreError> {
        let (mut tx, _turn) = self.begin_write_tx().await?;
        sqlx::query(PURGE_EXPIRED_TICKETS)
            .bind(millis(Utc::now()))
            .execute(&mut *tx)
            .await?;
        let live: i64 = sqlx::query(COUNT_TICKETS)
            .fetch_one(&mut *tx)
            .await?
            .try_get(0)?;
        if u64::try_from(live).unwrap_or(0) >= MAX_OAUTH_TICKETS {
            tx.commit().await?;
            return Err(StoreError::Limit(format!(
                "at most {MAX_OAUTH_TICKETS} pending oauth authorization links"
            )));
        }
        sqlx::query(sqlx::AssertSqlSafe(insert_ticket_sql()))
            .bind(row.ticket_sha256)
            .bind(row.name.clone())
            .bind(row.principal.clone())
            .bind(millis(row.created_at))
            .bind(millis(row.expires_at))
            .bind(row.sealed_secret)
            .execute(&mut *tx)
            .await?;
        // One principal asking again and again replaces its own links.
        let owned = sqlx::query(OWNER_TICKETS)
            .bind(row.name)
            .bind(row.principal)
            .fetch_all(&mut *tx)
            .await?;
        let keep = usize::try_from(MAX_OAUTH_TICKETS_PER_GRANT).unwrap_or(usize::MAX);
        for surplus in owned.iter().skip(keep) {
            let sha: String = surplus.try_get(0)?;
            sqlx::query(DELETE_TICKET)
                .bind(sha)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub(crate) async fn oauth_live_ticket(
        &self,
        connection: &str,
        principal: &str,
        live_at: DateTime<Utc>,
    ) -> Result<Option<OAuthTicketRow>, StoreError> {
        sqlx::query(sqlx::AssertSqlSafe(live_ticket_sql()))
            .bind(connection.to_owned())
            .bind(principal.to_owned())
            .bind(millis(live_at))
            .fetch_optional(self.pool())
            .await?
            .map(|row| ticket_from_row(&row))
            .transpose()
    }

    pub(crate) async fn oauth_take_ticket(
        &self,
        ticket_sha256: &str,
    ) -> Result<Option<OAuthTicketRow>, StoreError> {
        sqlx::query(sqlx::AssertSqlSafe(take_ticket_sql()))
            .bind(ticket_sha256.to_owned())
            .fetch_optional(self.pool())
            .await?
            .map(|row| ticket_from_row(&row))
            .transpose()
    }

    pub(crate) async fn oauth_create_authorization(
        &self,
        row: OAuthAuthorizationRow,
    ) -> Result<(), StoreError> {
        let generation = i64::try_from(row.generation).map_err(|_| {
            StoreError::Corrupt(format!("generation {} out of range", row.generation))
        })?;
        let (mut tx, _turn) = self.begin_write_tx().await?;
        sqlx::query(PURGE_EXPIRED_AUTHORIZATIONS)
            .bind(millis(Utc::now()))
            .execute(&mut *tx)
            .await?;
        let live: i64 = sqlx::query(COUNT_AUTHORIZATIONS)
            .fetch_one(&mut *tx)
            .await?
            .try_get(0)?;
        if u64::try_from(live).unwrap_or(0) >= MAX_PENDING_OAUTH_AUTHORIZATIONS {
            // Keep the purge; refuse the new flow.
            tx.commit().await?;
            return Err(StoreError::Limit(format!(
                "at most {MAX_PENDING_OAUTH_AUTHORIZATIONS} pending oauth authorizations"
            )));
        }
        sqlx::query(sqlx::AssertSqlSafe(insert_authorization_sql()))
            .bind(row.state)
            .bind(row.name)
            .bind(generation)
            .bind(row.payload)
            .bind(millis(row.created_at))
            .bind(millis(row.expires_at))
            .bind(row.browser_hash)
            .bind(row.principal)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    pub(crate) async fn oauth_get_authorization(
        &self,
        state: &str,
    ) -> Result<Option<OAuthAuthorizationRow>, StoreError> {
        sqlx::query(sqlx::AssertSqlSafe(get_authorization_sql()))
            .bind(state.to_owned())
            .fetch_optional(self.pool())
            .await?
            .map(|row| authorization_from_row(&row))
            .transpose()
    }

    pub(crate) async fn oauth_take_authorization(
        &self,
        state: &str,
    ) -> Result<Option<OAuthAuthorizationRow>, StoreError> {
        sqlx::query(sqlx::AssertSqlSafe(take_authorization_sql()))
            .bind(state.to_owned())
            .fetch_optional(self.pool())
            .await?
            .map(|row| authorization_from_row(&row))
            .transpose()
    }
}
