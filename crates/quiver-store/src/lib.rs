//! The registry's durable, revisioned store of MCP server records (docs/reference.md §2)
//! and of access records (policies, API keys, identity providers; §12.2), which
//! share the servers' revision space, change log and invariants.
//!
//! One [`Store`] trait, two backends: PostgreSQL (production, several registry
//! replicas may share one database) and SQLite (embedded, zero setup). Both
//! run the same revision algorithm ([`SqlStore`]) with their own SQL dialect,
//! migrations, connection setup and change notification; writing the
//! algorithm twice would let the backends drift apart.
//!
//! Invariants every implementation keeps (R-STORE-2…6):
//! - every change commits its record, a new global revision, a change-log row
//!   and a history row in one transaction;
//! - revisions are consecutive integers, committed in revision order;
//! - an upsert of identical content is a no-op;
//! - `expected_revision` mismatches change nothing;
//! - the change log may be compacted below a floor; history is never compacted.
//!
//! One module per kind of record, each with the types its [`Store`] methods
//! take and return and the statements behind them: `servers`, `access`,
//! `approvals`, `oauth` (connections and grants), `oauth_flows` (flows in
//! progress), `sessions`, `usage`. `sql` is the revision core they share,
//! `store` the trait and its delegation, `postgres` and `sqlite` the two
//! dialects.

use std::sync::Arc;

mod access;
mod approvals;
mod error;
mod oauth;
mod oauth_flows;
mod postgres;
mod servers;
mod sessions;
mod sql;
mod sqlite;
mod store;
mod usage;

pub use access::{AccessDelete, AccessHistoryEntry, AccessOutcome, AccessPut};
pub use approvals::{DecideOutcome, NewApproval, RequestedApproval};
pub use error::StoreError;
pub use oauth::{GrantKey, OAuthConnectionRow, OAuthStatus, OAuthTokens, SecretUpdate};
pub use oauth_flows::{
    MAX_OAUTH_TICKETS, MAX_OAUTH_TICKETS_PER_GRANT, MAX_PENDING_OAUTH_AUTHORIZATIONS,
    OAuthAuthorizationRow, OAuthTicketRow,
};
pub use postgres::CHANGE_CHANNEL;
pub use servers::{DeleteRequest, HistoryPage, HistoryRow, Snapshot, UpsertOutcome, UpsertRequest};
pub use sessions::MAX_GATEWAY_SESSION_REVOCATIONS;
pub use sql::{Head, SqlStore};
pub use store::Store;
pub use usage::{CallsLease, MAX_USAGE_BATCH_ROWS, MAX_USAGE_ROWS, UsageBatch};

/// The largest revision a store can hold: revisions are stored as signed
/// 64-bit integers. Callers check cursors and revisions from requests
/// against it, so a number beyond it is refused as input.
pub const MAX_REVISION: u64 = i64::MAX as u64;

/// Opens the store a URL names (`sqlite://…` or `postgres://…`), applying migrations.
pub async fn open(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqlStore::open_sqlite(url).await?))
    } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        Ok(Arc::new(SqlStore::open_postgres(url).await?))
    } else {
        Err(StoreError::UnsupportedUrl(url.to_owned()))
    }
}
