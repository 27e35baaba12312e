//! OAuth connections and pending authorization-code flows (the registry's
//! OAuth credential broker), one implementation for both backends: every
//! statement is plain SQL both engines run unchanged.
//!
//! The store never sees a secret in the clear: the sealed columns hold what
//! the caller encrypted. Every step that must not race is one conditional
//! statement, which both engines apply atomically to the row (PostgreSQL
//! re-checks the condition on the newest row version after waiting for the
//! row lock; SQLite has one writer at a time):
//! - token and status writes are `UPDATE … WHERE generation = $expected …
//!   RETURNING`: a writer that read an older state writes nothing;
//! - the refresh lease is one `UPDATE … WHERE` the lease is free, expired or
//!   already the caller's: of concurrent callers exactly one takes it;
//! - taking an authorization is `DELETE … RETURNING`: one-time.
//!
//! A config write is an insert-if-absent, then an update conditional on a
//! change, then (neither matched) a read, in one write transaction.

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::sql::SqlStore;
use crate::{
    MAX_PENDING_OAUTH_AUTHORIZATIONS, OAuthAuthorizationRow, OAuthConnectionRow, OAuthTokens,
    SecretUpdate, StoreError,
};

const COLUMNS: &str = "name, config, client_secret, credentials, status, expires_at_ms, \
     generation, refresh_count, last_error, connected_at_ms, updated_at_ms";

const AUTHORIZATION_COLUMNS: &str =
    "state, name, generation, payload, created_at_ms, expires_at_ms, browser_hash";

/// $1 name, $2 config, $3 client secret (or NULL), $4 now. Returns nothing
/// when the connection exists.
fn insert_connection_sql() -> String {
    format!(
        "INSERT INTO oauth_connections (name, config, client_secret, credentials, \
         status, expires_at_ms, generation, refresh_count, last_error, connected_at_ms, \
         updated_at_ms, lease_holder, lease_until_ms) \
         VALUES ($1, $2, $3, NULL, 'not_connected', NULL, 1, 0, NULL, NULL, $4, NULL, NULL) \
         ON CONFLICT (name) DO NOTHING RETURNING {COLUMNS}"
    )
}

/// Starts a connection afresh when its config or secret changes: $1 name,
/// $2 config, $3 now, and for [`SecretUpdate::Set`] $4 the secret. Returns
/// nothing when nothing changes (or the connection is absent).
fn reset_connection_sql(secret: &SecretUpdate) -> String {
    let (assign, changed) = match secret {
        SecretUpdate::Keep => ("", ""),
        SecretUpdate::Set(_) => (
            ", client_secret = $4",
            " OR client_secret IS NULL OR client_secret <> $4",
        ),
        SecretUpdate::Clear => (", client_secret = NULL", " OR client_secret IS NOT NULL"),
    };
    format!(
        "UPDATE oauth_connections SET config = $2{assign}, \
         credentials = NULL, status = 'not_connected', expires_at_ms = NULL, last_error = NULL, \
         connected_at_ms = NULL, generation = generation + 1, updated_at_ms = $3 \
         WHERE name = $1 AND (config <> $2{changed}) RETURNING {COLUMNS}"
    )
}

fn select_connection_sql() -> String {
    format!("SELECT {COLUMNS} FROM oauth_connections WHERE name = $1")
}

fn list_connections_sql() -> String {
    format!("SELECT {COLUMNS} FROM oauth_connections ORDER BY name")
}

const DELETE_CONNECTION: &str = "DELETE FROM oauth_connections WHERE name = $1";
const DELETE_CONNECTION_AUTHORIZATIONS: &str = "DELETE FROM oauth_authorizations WHERE name = $1";

/// $1 name, $2 expected generation, $3 credentials, $4 expiry, $5 now.
fn store_tokens_sql(refreshed: bool) -> String {
    let (refreshes, connected_at) = if refreshed {
        ("refresh_count + 1", "")
    } else {
        ("refresh_count", "connected_at_ms = $5, ")
    };
    format!(
        "UPDATE oauth_connections SET credentials = $3, status = 'connected', \
         expires_at_ms = $4, last_error = NULL, generation = generation + 1, \
         refresh_count = {refreshes}, {connected_at}updated_at_ms = $5 \
         WHERE name = $1 AND generation = $2 RETURNING {COLUMNS}"
    )
}

/// $1 name, $2 expected generation, $3 error, $4 now.
fn needs_reconsent_sql() -> String {
    format!(
        "UPDATE oauth_connections SET status = 'needs_reconsent', credentials = NULL, \
         expires_at_ms = NULL, last_error = $3, generation = generation + 1, updated_at_ms = $4 \
         WHERE name = $1 AND generation = $2 RETURNING {COLUMNS}"
    )
}

/// $1 name, $2 error, $3 now.
const SET_ERROR: &str =
    "UPDATE oauth_connections SET last_error = $2, updated_at_ms = $3 WHERE name = $1";

/// $1 name, $2 holder, $3 lease end, $4 now.
const ACQUIRE_LEASE: &str = "UPDATE oauth_connections SET lease_holder = $2, lease_until_ms = $3 \
     WHERE name = $1 AND (lease_until_ms IS NULL OR lease_until_ms <= $4 OR lease_holder = $2)";

/// $1 name, $2 holder.
const RELEASE_LEASE: &str = "UPDATE oauth_connections SET lease_holder = NULL, \
     lease_until_ms = NULL WHERE name = $1 AND lease_holder = $2";

/// $1 now.
const PURGE_EXPIRED_AUTHORIZATIONS: &str =
    "DELETE FROM oauth_authorizations WHERE expires_at_ms <= $1";
const COUNT_AUTHORIZATIONS: &str = "SELECT COUNT(*) FROM oauth_authorizations";

fn insert_authorization_sql() -> String {
    format!(
        "INSERT INTO oauth_authorizations ({AUTHORIZATION_COLUMNS}) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)"
    )
}

fn get_authorization_sql() -> String {
    format!("SELECT {AUTHORIZATION_COLUMNS} FROM oauth_authorizations WHERE state = $1")
}

fn take_authorization_sql() -> String {
    format!("DELETE FROM oauth_authorizations WHERE state = $1 RETURNING {AUTHORIZATION_COLUMNS}")
}

fn millis(at: DateTime<Utc>) -> i64 {
    at.timestamp_millis()
}

fn from_millis(ms: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_millis(ms)
        .ok_or_else(|| StoreError::Corrupt(format!("timestamp {ms} out of range")))
}

fn counter(value: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("negative {what} {value}")))
}

/// A generation as a bound parameter; `None` when beyond what a row can hold
/// (then no row has it).
fn generation_param(generation: u64) -> Option<i64> {
    i64::try_from(generation).ok()
}

fn connection_from_row(row: &AnyRow) -> Result<OAuthConnectionRow, StoreError> {
    let status: String = row.try_get(4)?;
    let optional_time = |index: usize| -> Result<Option<DateTime<Utc>>, StoreError> {
        row.try_get::<Option<i64>, _>(index)?
            .map(from_millis)
            .transpose()
    };
    Ok(OAuthConnectionRow {
        name: row.try_get(0)?,
        config: row.try_get(1)?,
        client_secret: row.try_get(2)?,
        credentials: row.try_get(3)?,
        status: status.parse().map_err(StoreError::Corrupt)?,
        expires_at: optional_time(5)?,
        generation: counter(row.try_get(6)?, "generation")?,
        refresh_count: counter(row.try_get(7)?, "refresh count")?,
        last_error: row.try_get(8)?,
        connected_at: optional_time(9)?,
        updated_at: from_millis(row.try_get(10)?)?,
    })
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
    })
}

impl SqlStore {
    pub(crate) async fn oauth_put_connection(
        &self,
        name: &str,
        config: String,
        secret: SecretUpdate,
    ) -> Result<OAuthConnectionRow, StoreError> {
        let now = millis(Utc::now());
        let (mut tx, _turn) = self.begin_write_tx().await?;
        let initial_secret = match &secret {
            SecretUpdate::Set(value) => Some(value.clone()),
            SecretUpdate::Keep | SecretUpdate::Clear => None,
        };
        // A concurrent insert of the same name makes this wait for its
        // outcome (PostgreSQL) or cannot interleave (SQLite's one writer).
        let inserted = sqlx::query(sqlx::AssertSqlSafe(insert_connection_sql()))
            .bind(name.to_owned())
            .bind(config.clone())
            .bind(initial_secret)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await?;
        if let Some(row) = inserted {
            let created = connection_from_row(&row)?;
            tx.commit().await?;
            return Ok(created);
        }
        let mut reset = sqlx::query(sqlx::AssertSqlSafe(reset_connection_sql(&secret)))
            .bind(name.to_owned())
            .bind(config)
            .bind(now);
        if let SecretUpdate::Set(value) = secret {
            reset = reset.bind(value);
        }
        if let Some(row) = reset.fetch_optional(&mut *tx).await? {
            let updated = connection_from_row(&row)?;
            // Flows started under the old settings must not complete.
            sqlx::query(DELETE_CONNECTION_AUTHORIZATIONS)
                .bind(name.to_owned())
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            return Ok(updated);
        }
        let stored = sqlx::query(sqlx::AssertSqlSafe(select_connection_sql()))
            .bind(name.to_owned())
            .fetch_optional(&mut *tx)
            .await?;
        // Nothing was written: end the transaction (and the writer turn).
        tx.rollback().await?;
        match stored {
            Some(row) => connection_from_row(&row),
            None => Err(StoreError::Corrupt(format!(
                "oauth connection {name:?} neither inserted nor found"
            ))),
        }
    }

    pub(crate) async fn oauth_get_connection(
        &self,
        name: &str,
    ) -> Result<Option<OAuthConnectionRow>, StoreError> {
        sqlx::query(sqlx::AssertSqlSafe(select_connection_sql()))
            .bind(name.to_owned())
            .fetch_optional(self.pool())
            .await?
            .map(|row| connection_from_row(&row))
            .transpose()
    }

    pub(crate) async fn oauth_list_connections(
        &self,
    ) -> Result<Vec<OAuthConnectionRow>, StoreError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(list_connections_sql()))
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(connection_from_row).collect()
    }

    pub(crate) async fn oauth_delete_connection(&self, name: &str) -> Result<bool, StoreError> {
        let (mut tx, _turn) = self.begin_write_tx().await?;
        sqlx::query(DELETE_CONNECTION_AUTHORIZATIONS)
            .bind(name.to_owned())
            .execute(&mut *tx)
            .await?;
        let deleted = sqlx::query(DELETE_CONNECTION)
            .bind(name.to_owned())
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(deleted > 0)
    }

    pub(crate) async fn oauth_store_tokens(
        &self,
        name: &str,
        expected_generation: u64,
        tokens: OAuthTokens,
    ) -> Result<Option<OAuthConnectionRow>, StoreError> {
        let Some(generation) = generation_param(expected_generation) else {
            return Ok(None);
        };
        let sql = store_tokens_sql(tokens.refreshed);
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(name.to_owned())
            .bind(generation)
            .bind(tokens.credentials)
            .bind(tokens.expires_at.map(millis))
            .bind(millis(Utc::now()))
            .fetch_optional(self.pool())
            .await?
            .map(|row| connection_from_row(&row))
            .transpose()
    }

    pub(crate) async fn oauth_set_needs_reconsent(
        &self,
        name: &str,
        expected_generation: u64,
        error: &str,
    ) -> Result<Option<OAuthConnectionRow>, StoreError> {
        let Some(generation) = generation_param(expected_generation) else {
            return Ok(None);
        };
        sqlx::query(sqlx::AssertSqlSafe(needs_reconsent_sql()))
            .bind(name.to_owned())
            .bind(generation)
            .bind(error.to_owned())
            .bind(millis(Utc::now()))
            .fetch_optional(self.pool())
            .await?
            .map(|row| connection_from_row(&row))
            .transpose()
    }

    pub(crate) async fn oauth_set_error(&self, name: &str, error: &str) -> Result<(), StoreError> {
        sqlx::query(SET_ERROR)
            .bind(name.to_owned())
            .bind(error.to_owned())
            .bind(millis(Utc::now()))
            .execute(self.pool())
            .await?;
        Ok(())
    }

    pub(crate) async fn oauth_acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl: std::time::Duration,
    ) -> Result<bool, StoreError> {
        let now = millis(Utc::now());
        let ttl = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let taken = sqlx::query(ACQUIRE_LEASE)
            .bind(name.to_owned())
            .bind(holder.to_owned())
            .bind(now.saturating_add(ttl))
            .bind(now)
            .execute(self.pool())
            .await?
            .rows_affected();
        Ok(taken > 0)
    }

    pub(crate) async fn oauth_release_lease(
        &self,
        name: &str,
        holder: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(RELEASE_LEASE)
            .bind(name.to_owned())
            .bind(holder.to_owned())
            .execute(self.pool())
            .await?;
        Ok(())
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
