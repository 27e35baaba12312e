//! OAuth connections and their grants (the registry's OAuth credential
//! broker), one implementation for both backends: every statement is plain
//! SQL both engines run unchanged. The one-time state of flows in progress
//! (pending authorizations, authorization links) is in `oauth_flows`.
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
//!
//! A config write is an insert-if-absent, then an update conditional on a
//! change, then (neither matched) a read, in one write transaction.
//!
//! Token state lives in the connection's row for its own grant and in
//! `oauth_user_grants` for a principal's grant of a per-user connection;
//! the same statements serve both ([`grant_row`]).

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::error::StoreError;
use crate::sql::SqlStore;

/// Status of an OAuth connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OAuthStatus {
    /// No usable tokens: never authorized, or its settings changed since.
    NotConnected,
    /// Tokens are stored.
    Connected,
    /// The grant was revoked or refused: a person must authorize again.
    NeedsReconsent,
}

impl OAuthStatus {
    /// The stored name: `not_connected`, `connected` or `needs_reconsent`.
    pub fn as_str(self) -> &'static str {
        match self {
            OAuthStatus::NotConnected => "not_connected",
            OAuthStatus::Connected => "connected",
            OAuthStatus::NeedsReconsent => "needs_reconsent",
        }
    }
}

impl std::fmt::Display for OAuthStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for OAuthStatus {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "not_connected" => Ok(OAuthStatus::NotConnected),
            "connected" => Ok(OAuthStatus::Connected),
            "needs_reconsent" => Ok(OAuthStatus::NeedsReconsent),
            other => Err(format!("unknown oauth connection status {other:?}")),
        }
    }
}

/// Shows whether a sealed value is present, never the value.
pub(crate) struct Sealed(pub(crate) bool);

impl std::fmt::Debug for Sealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0 { "[sealed]" } else { "None" })
    }
}

pub(crate) fn sealed(value: &Option<String>) -> Sealed {
    Sealed(value.is_some())
}

/// Whose tokens of an OAuth connection a read or write is about: the
/// connection's own grant (one for the fleet), or one principal's grant of a
/// per-user connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantKey<'a> {
    /// The connection's name.
    pub connection: &'a str,
    /// The principal (`key:<id>`, `oidc:<issuer>#<sub>`); `None`: the
    /// connection's own grant.
    pub principal: Option<&'a str>,
}

impl<'a> GrantKey<'a> {
    /// The connection's own grant.
    pub fn fleet(connection: &'a str) -> Self {
        GrantKey {
            connection,
            principal: None,
        }
    }

    /// `principal`'s grant of `connection`.
    pub fn user(connection: &'a str, principal: &'a str) -> Self {
        GrantKey {
            connection,
            principal: Some(principal),
        }
    }
}

/// One stored OAuth connection, or one principal's grant of it. The sealed
/// fields hold what the caller encrypted; the store neither reads nor shows
/// them (`Debug` prints `[sealed]`).
#[derive(Clone, PartialEq)]
pub struct OAuthConnectionRow {
    /// The connection's name (its key).
    pub name: String,
    /// Whose grant the token fields hold: `None`, the connection's own;
    /// `Some`, that principal's (a per-user connection; the settings and
    /// client secret are the connection's).
    pub principal: Option<String>,
    /// The non-secret settings as JSON text (opaque to the store).
    pub config: String,
    /// The client secret, sealed.
    pub client_secret: Option<String>,
    /// The tokens as sealed JSON.
    pub credentials: Option<String>,
    /// Where the connection stands.
    pub status: OAuthStatus,
    /// When the access token expires, when known.
    pub expires_at: Option<DateTime<Utc>>,
    /// Moves on with every change of config, credentials or status; token
    /// writes are conditional on it.
    pub generation: u64,
    /// How many times refreshed tokens were stored (never reset).
    pub refresh_count: u64,
    /// The last failure (cleared when tokens are stored).
    pub last_error: Option<String>,
    /// When the current grant was made (not moved by refreshes).
    pub connected_at: Option<DateTime<Utc>>,
    /// When the row last changed.
    pub updated_at: DateTime<Utc>,
}

impl std::fmt::Debug for OAuthConnectionRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthConnectionRow")
            .field("name", &self.name)
            .field("principal", &self.principal)
            .field("config", &self.config)
            .field("client_secret", &sealed(&self.client_secret))
            .field("credentials", &sealed(&self.credentials))
            .field("status", &self.status)
            .field("expires_at", &self.expires_at)
            .field("generation", &self.generation)
            .field("refresh_count", &self.refresh_count)
            .field("last_error", &self.last_error)
            .field("connected_at", &self.connected_at)
            .field("updated_at", &self.updated_at)
            .finish()
    }
}

/// How a config write ([`crate::Store::put_oauth_connection`]) treats the stored
/// client secret.
#[derive(Clone, PartialEq, Eq)]
pub enum SecretUpdate {
    /// Leave it as stored.
    Keep,
    /// Store this sealed secret.
    Set(String),
    /// Remove it.
    Clear,
}

impl std::fmt::Debug for SecretUpdate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SecretUpdate::Keep => f.write_str("Keep"),
            SecretUpdate::Set(_) => f.debug_tuple("Set").field(&Sealed(true)).finish(),
            SecretUpdate::Clear => f.write_str("Clear"),
        }
    }
}

/// What a token write ([`crate::Store::store_oauth_tokens`]) records.
#[derive(Clone, PartialEq)]
pub struct OAuthTokens {
    /// The tokens as sealed JSON.
    pub credentials: String,
    /// When the access token expires, when known.
    pub expires_at: Option<DateTime<Utc>>,
    /// `true`: a refresh (`refresh_count` + 1, `connected_at` unchanged);
    /// `false`: a new grant (`connected_at` = now).
    pub refreshed: bool,
}

impl std::fmt::Debug for OAuthTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthTokens")
            .field("credentials", &Sealed(true))
            .field("expires_at", &self.expires_at)
            .field("refreshed", &self.refreshed)
            .finish()
    }
}

const COLUMNS: &str = "name, config, client_secret, credentials, status, expires_at_ms, \
     generation, refresh_count, last_error, connected_at_ms, updated_at_ms";

/// A principal's grant joined with its connection's settings, in the order
/// of [`COLUMNS`] and then the principal.
const USER_GRANT_COLUMNS: &str = "c.name, c.config, c.client_secret, g.credentials, g.status, \
     g.expires_at_ms, g.generation, g.refresh_count, g.last_error, g.connected_at_ms, \
     g.updated_at_ms, g.principal";

/// Where `grant`'s token state lives and the condition naming its row (the
/// connection's name is `$1`; a principal, when there is one, `$n`).
fn grant_row(grant: GrantKey<'_>, n: usize) -> (&'static str, String) {
    match grant.principal {
        None => ("oauth_connections", "name = $1".to_owned()),
        Some(_) => (
            "oauth_user_grants",
            format!("name = $1 AND principal = ${n}"),
        ),
    }
}

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
const DELETE_CONNECTION_USER_GRANTS: &str = "DELETE FROM oauth_user_grants WHERE name = $1";
const DELETE_CONNECTION_TICKETS: &str = "DELETE FROM oauth_grant_tickets WHERE name = $1";

/// What a connection takes with it when its settings change or it goes:
/// pending flows, principals' grants and their links (`$1` the name).
const CONNECTION_DEPENDENTS: [&str; 3] = [
    DELETE_CONNECTION_AUTHORIZATIONS,
    DELETE_CONNECTION_USER_GRANTS,
    DELETE_CONNECTION_TICKETS,
];

/// $1 name, $2 expected generation, $3 credentials, $4 expiry, $5 now,
/// $6 principal (a principal's grant).
fn store_tokens_sql(grant: GrantKey<'_>, refreshed: bool) -> String {
    let (refreshes, connected_at) = if refreshed {
        ("refresh_count + 1", "")
    } else {
        ("refresh_count", "connected_at_ms = $5, ")
    };
    let (table, row) = grant_row(grant, 6);
    format!(
        "UPDATE {table} SET credentials = $3, status = 'connected', \
         expires_at_ms = $4, last_error = NULL, generation = generation + 1, \
         refresh_count = {refreshes}, {connected_at}updated_at_ms = $5 \
         WHERE {row} AND generation = $2 RETURNING name"
    )
}

/// A principal's new grant, replacing any it had, only while the
/// connection is at the generation its flow started under: $1 name, $2 the
/// connection's generation, $3 credentials, $4 expiry, $5 now, $6 principal.
const STORE_NEW_USER_GRANT: &str = "INSERT INTO oauth_user_grants (name, principal, \
     credentials, status, expires_at_ms, generation, refresh_count, last_error, connected_at_ms, \
     updated_at_ms, lease_holder, lease_until_ms) \
     SELECT name, $6, $3, 'connected', $4, 1, 0, NULL, $5, $5, NULL, NULL \
     FROM oauth_connections WHERE name = $1 AND generation = $2 \
     ON CONFLICT (name, principal) DO UPDATE SET credentials = excluded.credentials, \
     status = 'connected', expires_at_ms = excluded.expires_at_ms, last_error = NULL, \
     generation = oauth_user_grants.generation + 1, connected_at_ms = excluded.connected_at_ms, \
     updated_at_ms = excluded.updated_at_ms RETURNING name";

/// $1 name, $2 expected generation, $3 error, $4 now, $5 principal.
fn needs_reconsent_sql(grant: GrantKey<'_>) -> String {
    let (table, row) = grant_row(grant, 5);
    format!(
        "UPDATE {table} SET status = 'needs_reconsent', credentials = NULL, \
         expires_at_ms = NULL, last_error = $3, generation = generation + 1, updated_at_ms = $4 \
         WHERE {row} AND generation = $2 RETURNING name"
    )
}

/// $1 name, $2 error, $3 now, $4 principal.
fn set_error_sql(grant: GrantKey<'_>) -> String {
    let (table, row) = grant_row(grant, 4);
    format!("UPDATE {table} SET last_error = $2, updated_at_ms = $3 WHERE {row}")
}

/// $1 name, $2 holder, $3 lease end, $4 now, $5 principal.
fn acquire_lease_sql(grant: GrantKey<'_>) -> String {
    let (table, row) = grant_row(grant, 5);
    format!(
        "UPDATE {table} SET lease_holder = $2, lease_until_ms = $3 WHERE {row} \
         AND (lease_until_ms IS NULL OR lease_until_ms <= $4 OR lease_holder = $2)"
    )
}

/// $1 name, $2 holder, $3 principal.
fn release_lease_sql(grant: GrantKey<'_>) -> String {
    let (table, row) = grant_row(grant, 3);
    format!(
        "UPDATE {table} SET lease_holder = NULL, lease_until_ms = NULL \
         WHERE {row} AND lease_holder = $2"
    )
}

/// Principals' grants, filtered by `$1` connection and/or the next
/// parameter principal, as asked.
fn list_user_grants_sql(by_connection: bool, by_principal: bool) -> String {
    let mut conditions = Vec::new();
    if by_connection {
        conditions.push("g.name = $1".to_owned());
    }
    if by_principal {
        conditions.push(format!("g.principal = ${}", conditions.len() + 1));
    }
    let filter = if conditions.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conditions.join(" AND "))
    };
    format!(
        "SELECT {USER_GRANT_COLUMNS} FROM oauth_user_grants g \
         JOIN oauth_connections c ON c.name = g.name{filter} ORDER BY g.name, g.principal"
    )
}

fn get_user_grant_sql() -> String {
    format!(
        "SELECT {USER_GRANT_COLUMNS} FROM oauth_user_grants g \
         JOIN oauth_connections c ON c.name = g.name WHERE g.name = $1 AND g.principal = $2"
    )
}

/// A principal's grant and what hangs on it ($1 name, $2 principal).
const DELETE_USER_GRANT: &str = "DELETE FROM oauth_user_grants WHERE name = $1 AND principal = $2";
const DELETE_USER_GRANT_TICKETS: &str =
    "DELETE FROM oauth_grant_tickets WHERE name = $1 AND principal = $2";
const DELETE_USER_GRANT_AUTHORIZATIONS: &str =
    "DELETE FROM oauth_authorizations WHERE name = $1 AND principal = $2";

type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>;

/// Binds `grant`'s principal, when it has one: the last parameter of every
/// statement of [`grant_row`].
fn bind_principal<'q>(query: AnyQuery<'q>, grant: GrantKey<'_>) -> AnyQuery<'q> {
    match grant.principal {
        Some(principal) => query.bind(principal.to_owned()),
        None => query,
    }
}

fn millis(at: DateTime<Utc>) -> i64 {
    at.timestamp_millis()
}

fn from_millis(ms: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_millis(ms)
        .ok_or_else(|| StoreError::Corrupt(format!("timestamp {ms} out of range")))
}

pub(crate) fn counter(value: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("negative {what} {value}")))
}

/// A generation as a bound parameter; `None` when beyond what a row can hold
/// (then no row has it).
fn generation_param(generation: u64) -> Option<i64> {
    i64::try_from(generation).ok()
}

/// A row of [`COLUMNS`] (the connection's own grant) or of
/// [`USER_GRANT_COLUMNS`] (a principal's).
fn connection_from_row(row: &AnyRow) -> Result<OAuthConnectionRow, StoreError> {
    let status: String = row.try_get(4)?;
    let optional_time = |index: usize| -> Result<Option<DateTime<Utc>>, StoreError> {
        row.try_get::<Option<i64>, _>(index)?
            .map(from_millis)
            .transpose()
    };
    Ok(OAuthConnectionRow {
        name: row.try_get(0)?,
        principal: if row.len() > 11 {
            Some(row.try_get(11)?)
        } else {
            None
        },
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
            // Flows started under the old settings must not complete, and
            // principals' grants were granted for them.
            for dependents in CONNECTION_DEPENDENTS {
                sqlx::query(dependents)
                    .bind(name.to_owned())
                    .execute(&mut *tx)
                    .await?;
            }
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
        for dependents in CONNECTION_DEPENDENTS {
            sqlx::query(dependents)
                .bind(name.to_owned())
                .execute(&mut *tx)
                .await?;
        }
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
        grant: GrantKey<'_>,
        expected_generation: u64,
        tokens: OAuthTokens,
    ) -> Result<Option<OAuthConnectionRow>, StoreError> {
        let Some(generation) = generation_param(expected_generation) else {
            return Ok(None);
        };
        let sql = match grant.principal {
            Some(_) if !tokens.refreshed => STORE_NEW_USER_GRANT.to_owned(),
            _ => store_tokens_sql(grant, tokens.refreshed),
        };
        let query = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(grant.connection.to_owned())
            .bind(generation)
            .bind(tokens.credentials)
            .bind(tokens.expires_at.map(millis))
            .bind(millis(Utc::now()));
        self.write_then_read(query, grant).await
    }

    /// Runs a conditional write of `grant` (`RETURNING` a row when it
    /// applied) and reads the grant back; `None` when nothing was written.
    async fn write_then_read<'q>(
        &self,
        query: AnyQuery<'q>,
        grant: GrantKey<'q>,
    ) -> Result<Option<OAuthConnectionRow>, StoreError> {
        if bind_principal(query, grant)
            .fetch_optional(self.pool())
            .await?
            .is_none()
        {
            return Ok(None);
        }
        self.oauth_get_grant(grant).await
    }

    pub(crate) async fn oauth_set_needs_reconsent(
        &self,
        grant: GrantKey<'_>,
        expected_generation: u64,
        error: &str,
    ) -> Result<Option<OAuthConnectionRow>, StoreError> {
        let Some(generation) = generation_param(expected_generation) else {
            return Ok(None);
        };
        let query = sqlx::query(sqlx::AssertSqlSafe(needs_reconsent_sql(grant)))
            .bind(grant.connection.to_owned())
            .bind(generation)
            .bind(error.to_owned())
            .bind(millis(Utc::now()));
        self.write_then_read(query, grant).await
    }

    pub(crate) async fn oauth_set_error(
        &self,
        grant: GrantKey<'_>,
        error: &str,
    ) -> Result<(), StoreError> {
        let query = sqlx::query(sqlx::AssertSqlSafe(set_error_sql(grant)))
            .bind(grant.connection.to_owned())
            .bind(error.to_owned())
            .bind(millis(Utc::now()));
        bind_principal(query, grant).execute(self.pool()).await?;
        Ok(())
    }

    pub(crate) async fn oauth_acquire_lease(
        &self,
        grant: GrantKey<'_>,
        holder: &str,
        ttl: std::time::Duration,
    ) -> Result<bool, StoreError> {
        let now = millis(Utc::now());
        let ttl = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let query = sqlx::query(sqlx::AssertSqlSafe(acquire_lease_sql(grant)))
            .bind(grant.connection.to_owned())
            .bind(holder.to_owned())
            .bind(now.saturating_add(ttl))
            .bind(now);
        let taken = bind_principal(query, grant).execute(self.pool()).await?;
        Ok(taken.rows_affected() > 0)
    }

    pub(crate) async fn oauth_release_lease(
        &self,
        grant: GrantKey<'_>,
        holder: &str,
    ) -> Result<(), StoreError> {
        let query = sqlx::query(sqlx::AssertSqlSafe(release_lease_sql(grant)))
            .bind(grant.connection.to_owned())
            .bind(holder.to_owned());
        bind_principal(query, grant).execute(self.pool()).await?;
        Ok(())
    }

    pub(crate) async fn oauth_get_grant(
        &self,
        grant: GrantKey<'_>,
    ) -> Result<Option<OAuthConnectionRow>, StoreError> {
        let Some(principal) = grant.principal else {
            return self.oauth_get_connection(grant.connection).await;
        };
        sqlx::query(sqlx::AssertSqlSafe(get_user_grant_sql()))
            .bind(grant.connection.to_owned())
            .bind(principal.to_owned())
            .fetch_optional(self.pool())
            .await?
            .map(|row| connection_from_row(&row))
            .transpose()
    }

    pub(crate) async fn oauth_list_user_grants(
        &self,
        connection: Option<&str>,
        principal: Option<&str>,
    ) -> Result<Vec<OAuthConnectionRow>, StoreError> {
        let sql = list_user_grants_sql(connection.is_some(), principal.is_some());
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for value in [connection, principal].into_iter().flatten() {
            query = query.bind(value.to_owned());
        }
        let rows = query.fetch_all(self.pool()).await?;
        rows.iter().map(connection_from_row).collect()
    }

    pub(crate) async fn oauth_delete_user_grant(
        &self,
        connection: &str,
        principal: &str,
    ) -> Result<bool, StoreError> {
        let (mut tx, _turn) = self.begin_write_tx().await?;
        for dependents in [DELETE_USER_GRANT_TICKETS, DELETE_USER_GRANT_AUTHORIZATIONS] {
            sqlx::query(dependents)
                .bind(connection.to_owned())
                .bind(principal.to_owned())
                .execute(&mut *tx)
                .await?;
        }
        let deleted = sqlx::query(DELETE_USER_GRANT)
            .bind(connection.to_owned())
            .bind(principal.to_owned())
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(deleted > 0)
    }
}
