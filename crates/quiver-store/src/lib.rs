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

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use quiver_model::access::{AccessKind, AccessSpec, StoredAccess};
use quiver_model::approval::{
    Approval, ApprovalBinding, ApprovalDecision, ApprovalState, UseOutcome,
};
use quiver_model::{
    Change, ChangeKind, HistoryEntry, McpServerSpec, ModelError, Source, StoredServer,
};
use tokio::sync::watch;

mod access;
mod approvals;
mod oauth;
mod postgres;
mod sessions;
mod sql;
mod sqlite;
mod usage;

pub use postgres::CHANGE_CHANNEL;
pub use sql::SqlStore;

/// The largest revision a store can hold: revisions are stored as signed
/// 64-bit integers. Callers check cursors and revisions from requests
/// against it, so a number beyond it is refused as input.
pub const MAX_REVISION: u64 = i64::MAX as u64;

/// At most this many unexpired OAuth authorizations may be pending at once
/// ([`Store::create_oauth_authorization`]).
pub const MAX_PENDING_OAUTH_AUTHORIZATIONS: u64 = 1_000;

/// At most this many unexpired per-user authorization links may exist at
/// once ([`Store::create_oauth_ticket`]).
pub const MAX_OAUTH_TICKETS: u64 = 10_000;

/// At most this many unexpired authorization links one principal holds for
/// one connection; a new one replaces the oldest.
pub const MAX_OAUTH_TICKETS_PER_GRANT: u64 = 5;

/// At most this many unexpired gateway session revocations are remembered
/// at once ([`Store::revoke_gateway_session`]).
pub const MAX_GATEWAY_SESSION_REVOCATIONS: u64 = 100_000;

/// At most this many rows one usage batch may add ([`Store::record_usage`]).
pub const MAX_USAGE_BATCH_ROWS: usize = quiver_model::usage::MAX_BATCH_ROWS;

/// At most this many rows one usage query answers ([`Store::usage`]).
pub const MAX_USAGE_ROWS: usize = 10_000;

/// Calls of a rate-limit window leased to a worker ([`Store::lease_calls`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallsLease {
    /// Calls granted, at most the ask; 0 when the window is used up.
    pub granted: u32,
    /// The window they belong to (its start, milliseconds since the epoch);
    /// unused calls are given back to it.
    pub window_start_ms: i64,
    /// Milliseconds until the window ends.
    pub remaining_ms: i64,
}

/// Usage counts one worker reports at once ([`Store::record_usage`]).
#[derive(Debug, Clone)]
pub struct UsageBatch {
    /// Who sends it (a worker instance).
    pub source: String,
    /// Its number at the source: a batch sent twice counts once.
    pub batch_id: u64,
    /// The counts, at most [`MAX_USAGE_BATCH_ROWS`].
    pub rows: Vec<(
        quiver_model::usage::UsageKey,
        quiver_model::usage::UsageCounts,
    )>,
}

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No record with this id.
    #[error("mcp server {0:?} not found")]
    NotFound(String),
    /// `expected_revision` did not match; nothing was changed.
    #[error(
        "revision conflict on {server_id:?}: expected revision {expected}, current revision {current}"
    )]
    Conflict {
        /// The record.
        server_id: String,
        /// The revision the caller expected (0: must not exist).
        expected: u64,
        /// The record's current revision (0: does not exist).
        current: u64,
    },
    /// The record failed validation.
    #[error(transparent)]
    Invalid(#[from] ModelError),
    /// A stored row could not be read back (a bug or manual tampering).
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// The database URL names no supported backend.
    #[error("unsupported database url {0:?}: expected sqlite://… or postgres://…")]
    UnsupportedUrl(String),
    /// The database failed.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// Applying migrations failed.
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A bound on stored data was reached: the request was refused. The
    /// message names the limit.
    #[error("limit reached: {0}")]
    Limit(String),
    /// An access record names another that does not exist (a key's or a
    /// rule's policy); nothing was written.
    #[error("{field}: no such {kind} {name:?}")]
    MissingReference {
        /// The field naming it (`policy`, `rules[2].policy`).
        field: String,
        /// What it names.
        kind: AccessKind,
        /// The name.
        name: String,
    },
    /// An access record is still named by others (a policy by keys or
    /// identity provider rules); nothing was deleted.
    #[error("{kind} {name:?} is still used by {}", .used_by.join(", "))]
    InUse {
        /// The record's kind.
        kind: AccessKind,
        /// Its name.
        name: String,
        /// Who names it: `api_key:<id>`, `identity_provider:<name>`.
        used_by: Vec<String>,
    },
    /// No access record of this kind and name.
    #[error("{kind} {name:?} not found")]
    AccessNotFound {
        /// The kind.
        kind: AccessKind,
        /// The name.
        name: String,
    },
    /// A batch ([`Store::apply`]) failed on the record at `index` (0-based);
    /// nothing of the batch was written.
    #[error("record {index}: {source}")]
    InRecord {
        /// Position of the record in the batch.
        index: usize,
        /// Why it failed.
        source: Box<StoreError>,
    },
}

/// A consistent view: the records exactly as of `revision`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Revision the snapshot was taken at.
    pub revision: u64,
    /// Every stored record, ordered by `server_id`.
    pub servers: Vec<StoredServer>,
    /// Every access record, ordered by kind (in [`AccessKind`]'s order:
    /// policies, keys, providers) then name.
    pub access: Vec<StoredAccess>,
}

/// The global revision and the change-log compaction floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Head {
    /// Last committed revision (0 for an empty store).
    pub revision: u64,
    /// Change-log rows at or below this revision are gone; watching from an
    /// older revision is impossible.
    pub compaction_floor: u64,
}

/// A create-or-replace.
#[derive(Debug, Clone)]
pub struct UpsertRequest {
    /// The new content.
    pub spec: McpServerSpec,
    /// `Some(0)`: must not exist; `Some(n)`: current revision must be `n`.
    pub expected_revision: Option<u64>,
    /// Who writes (audit).
    pub actor: String,
    /// Where the content comes from.
    pub source: Source,
}

/// A delete.
#[derive(Debug, Clone)]
pub struct DeleteRequest {
    /// The record to delete.
    pub server_id: String,
    /// `Some(n)`: current revision must be `n`.
    pub expected_revision: Option<u64>,
    /// Who deletes (audit).
    pub actor: String,
    /// Where the delete comes from.
    pub source: Source,
}

/// What an upsert did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpsertOutcome {
    /// The record did not exist.
    Created(StoredServer),
    /// The record changed (new revision).
    Updated(StoredServer),
    /// Identical content: nothing written, the stored record is returned.
    Unchanged(StoredServer),
}

impl UpsertOutcome {
    /// What happened, as APIs name it: `created`, `updated`, `unchanged`.
    pub fn as_str(&self) -> &'static str {
        match self {
            UpsertOutcome::Created(_) => "created",
            UpsertOutcome::Updated(_) => "updated",
            UpsertOutcome::Unchanged(_) => "unchanged",
        }
    }

    /// The record as stored after the upsert.
    pub fn server(&self) -> &StoredServer {
        match self {
            UpsertOutcome::Created(s) | UpsertOutcome::Updated(s) | UpsertOutcome::Unchanged(s) => {
                s
            }
        }
    }

    /// Consumes the outcome into the stored record.
    pub fn into_server(self) -> StoredServer {
        match self {
            UpsertOutcome::Created(s) | UpsertOutcome::Updated(s) | UpsertOutcome::Unchanged(s) => {
                s
            }
        }
    }
}

/// Which history rows [`Store::history_page`] returns, across all records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryPage<'a> {
    /// The newest rows, newest first.
    Newest {
        /// Only rows of this record.
        server_id: Option<&'a str>,
        /// At most this many rows.
        limit: u32,
    },
    /// Rows with a revision above `after`, oldest first (paging forward:
    /// pass the last revision of one page as `after` of the next).
    After {
        /// Only revisions above this one.
        after: u64,
        /// Only rows of this record.
        server_id: Option<&'a str>,
        /// At most this many rows.
        limit: u32,
    },
}

/// One history row of any record, with the revision of the same record
/// that came before it (what the change is a change against).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryRow {
    /// The record.
    pub server_id: String,
    /// The revision.
    pub entry: HistoryEntry,
    /// The record's previous history row; `None` for its first revision.
    pub previous: Option<HistoryEntry>,
}

/// A create-or-replace of an access record.
#[derive(Debug, Clone)]
pub struct AccessPut {
    /// The new content (its kind and name are its key).
    pub spec: AccessSpec,
    /// `Some(0)`: must not exist; `Some(n)`: current revision must be `n`.
    pub expected_revision: Option<u64>,
    /// Who writes (audit).
    pub actor: String,
    /// Where the content comes from.
    pub source: Source,
}

/// A delete of an access record.
#[derive(Debug, Clone)]
pub struct AccessDelete {
    /// Its kind.
    pub kind: AccessKind,
    /// Its name within its kind.
    pub name: String,
    /// `Some(n)`: current revision must be `n`.
    pub expected_revision: Option<u64>,
    /// Who deletes (audit).
    pub actor: String,
    /// Where the delete comes from.
    pub source: Source,
}

/// What a put of an access record did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessOutcome {
    /// It did not exist.
    Created(StoredAccess),
    /// It changed (new revision).
    Updated(StoredAccess),
    /// Identical content: nothing written, the stored record is returned.
    Unchanged(StoredAccess),
}

impl AccessOutcome {
    /// The record as stored after the put.
    pub fn record(&self) -> &StoredAccess {
        match self {
            AccessOutcome::Created(r) | AccessOutcome::Updated(r) | AccessOutcome::Unchanged(r) => {
                r
            }
        }
    }
}

/// One revision of one access record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessHistoryEntry {
    /// The revision.
    pub revision: u64,
    /// The record's kind.
    pub access: AccessKind,
    /// Its name within its kind.
    pub name: String,
    /// Upsert or delete.
    pub kind: ChangeKind,
    /// Full content as of this revision; `None` for deletes.
    pub spec: Option<AccessSpec>,
    /// Commit time.
    pub at: DateTime<Utc>,
    /// Who made it.
    pub actor: String,
    /// Where it came from.
    pub source: Source,
}

/// A new approval request (docs/reference.md §13.7).
#[derive(Debug, Clone)]
pub struct NewApproval {
    /// The call it is for.
    pub binding: ApprovalBinding,
    /// The call's arguments (hashed into `binding.arguments_hash`).
    pub arguments: serde_json::Value,
    /// Who asks (audit).
    pub requested_by: String,
    /// How long it may wait for a decision and then for its use.
    pub ttl: chrono::Duration,
    /// The most pending approvals one `requested_by` may have; a request
    /// beyond is refused with [`StoreError::Limit`] naming it.
    pub max_pending: u32,
}

/// What a request for an approval did.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestedApproval {
    /// The approval the request is answered with.
    pub approval: Approval,
    /// `true` when an identical pending request (same `requested_by` and
    /// binding) already existed: this is that one, nothing was stored.
    pub merged: bool,
}

/// What a decision on an approval did.
#[derive(Debug, Clone, PartialEq)]
pub enum DecideOutcome {
    /// It was pending and unexpired: now approved or denied.
    Decided(Approval),
    /// No approval has this id.
    NotFound,
    /// It was no longer pending (decided, used or expired); unchanged.
    NotPending(Approval),
}

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
struct Sealed(bool);

impl std::fmt::Debug for Sealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0 { "[sealed]" } else { "None" })
    }
}

fn sealed(value: &Option<String>) -> Sealed {
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

/// How a config write ([`Store::put_oauth_connection`]) treats the stored
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

/// What a token write ([`Store::store_oauth_tokens`]) records.
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

/// The revisioned record store.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// A consistent snapshot of every record.
    async fn list(&self) -> Result<Snapshot, StoreError>;
    /// One record.
    async fn get(&self, server_id: &str) -> Result<Option<StoredServer>, StoreError>;
    /// Creates or replaces a record (validated first).
    async fn upsert(&self, request: UpsertRequest) -> Result<UpsertOutcome, StoreError>;
    /// Upserts every record of a batch in one transaction, in order, with
    /// the semantics of [`Store::upsert`] per record: the records that change
    /// take one contiguous range of revisions (unchanged ones take none), and
    /// either all are written or none is. A failure is
    /// [`StoreError::InRecord`] naming the record's position; a `server_id`
    /// that appears twice is refused before anything is written.
    async fn apply(&self, requests: Vec<UpsertRequest>) -> Result<Vec<UpsertOutcome>, StoreError>;
    /// Deletes a record; returns the new revision.
    async fn delete(&self, request: DeleteRequest) -> Result<u64, StoreError>;
    /// Every revision of one record, newest first (deleted records included).
    async fn history(&self, server_id: &str) -> Result<Vec<HistoryEntry>, StoreError>;
    /// History rows of every record (or of one), in revision order as
    /// `page` says, each with the same record's previous row. History is
    /// never compacted, so this reaches back to revision 1.
    async fn history_page(&self, page: HistoryPage<'_>) -> Result<Vec<HistoryRow>, StoreError>;
    /// Creates or replaces an access record (validated first) at the next
    /// revision, with its change-log and history rows, in one transaction.
    /// Refused with [`StoreError::MissingReference`] when it names a policy
    /// that does not exist; identical content is a no-op.
    async fn put_access(&self, request: AccessPut) -> Result<AccessOutcome, StoreError>;
    /// Deletes an access record; returns the new revision. Refused with
    /// [`StoreError::InUse`] for a policy that keys or provider rules name.
    async fn delete_access(&self, request: AccessDelete) -> Result<u64, StoreError>;
    /// One access record.
    async fn get_access(
        &self,
        kind: AccessKind,
        name: &str,
    ) -> Result<Option<StoredAccess>, StoreError>;
    /// Every revision of one access record, newest first.
    async fn access_history(
        &self,
        kind: AccessKind,
        name: &str,
    ) -> Result<Vec<AccessHistoryEntry>, StoreError>;
    /// The access history row of exactly `revision`, if that revision
    /// changed an access record (the change feed reads each upsert's
    /// content by it).
    async fn access_at(&self, revision: u64) -> Result<Option<AccessHistoryEntry>, StoreError>;
    /// Records that API keys were used (workers report it); each key's
    /// `last_used_at` only moves forward. Not a revision: use is not
    /// configuration. Unknown ids are ignored.
    async fn touch_api_keys(&self, used: &[(String, DateTime<Utc>)]) -> Result<(), StoreError>;
    /// When each API key was last used, by id (keys never used are absent).
    async fn api_keys_last_used(
        &self,
    ) -> Result<std::collections::BTreeMap<String, DateTime<Utc>>, StoreError>;

    /// Change-log rows with revision > `after`, in order, at most `limit`.
    async fn changes_since(&self, after: u64, limit: u32) -> Result<Vec<Change>, StoreError>;
    /// Current head and compaction floor.
    async fn head(&self) -> Result<Head, StoreError>;
    /// Drops change-log rows at or below `floor` (clamped to head); returns the new head.
    async fn compact(&self, floor: u64) -> Result<Head, StoreError>;
    /// The latest committed revision known to this process, updated as soon as
    /// a change commits here or, for shared databases, in another process.
    fn subscribe(&self) -> watch::Receiver<u64>;

    /// Stores a new pending approval expiring `ttl` from now, or answers
    /// with the pending approval of an identical request (same
    /// `requested_by` and binding; one atomic insert, so racing identical
    /// requests get one id). Refused with [`StoreError::Limit`] when
    /// `requested_by` already has `max_pending` pending approvals.
    async fn create_approval(&self, request: NewApproval) -> Result<RequestedApproval, StoreError>;
    /// Deletes at most `limit` approvals that are denied, used or expired
    /// and whose expiry is before `before`; returns how many.
    async fn purge_approvals(
        &self,
        before: chrono::DateTime<chrono::Utc>,
        limit: u32,
    ) -> Result<u64, StoreError>;
    /// One approval, as stored (an approval past its expiry that no sweep
    /// has marked yet still shows its old state: call [`Store::expire_approvals`] first).
    async fn get_approval(&self, approval_id: &str) -> Result<Option<Approval>, StoreError>;
    /// Approvals in one state (or all), newest first; with every state,
    /// pending ones first.
    async fn list_approvals(
        &self,
        state: Option<ApprovalState>,
        limit: u32,
    ) -> Result<Vec<Approval>, StoreError>;
    /// Marks pending and approved approvals past their expiry `expired`;
    /// returns exactly those this call marked (for audit and metrics).
    async fn expire_approvals(&self) -> Result<Vec<Approval>, StoreError>;
    /// Approves or denies a pending, unexpired approval (one atomic update).
    async fn decide_approval(
        &self,
        approval_id: &str,
        decision: ApprovalDecision,
        decided_by: &str,
        note: Option<String>,
    ) -> Result<DecideOutcome, StoreError>;
    /// Uses an approval for `call`: one atomic update that succeeds only if
    /// it is approved, unexpired and bound to exactly this call, so of any
    /// number of concurrent uses (from any worker) exactly one gets
    /// [`UseOutcome::Used`]. Otherwise returns why, with the approval.
    async fn use_approval(
        &self,
        approval_id: &str,
        call: &ApprovalBinding,
        used_by: &str,
    ) -> Result<(UseOutcome, Option<Approval>), StoreError>;

    /// Creates an OAuth connection (`not_connected`, generation 1) or
    /// updates its settings. When `config` differs from the stored one or
    /// the client secret changes, the connection starts afresh: tokens,
    /// expiry, error and connection time are cleared, the
    /// status becomes `not_connected`, the generation moves on and its
    /// pending authorizations are deleted. When nothing changes, nothing is
    /// written and the row is returned as stored. One transaction.
    async fn put_oauth_connection(
        &self,
        name: &str,
        config: String,
        secret: SecretUpdate,
    ) -> Result<OAuthConnectionRow, StoreError>;
    /// One OAuth connection.
    async fn get_oauth_connection(
        &self,
        name: &str,
    ) -> Result<Option<OAuthConnectionRow>, StoreError>;
    /// Every OAuth connection, ordered by name.
    async fn list_oauth_connections(&self) -> Result<Vec<OAuthConnectionRow>, StoreError>;
    /// Deletes an OAuth connection and its pending authorizations; `true`
    /// when it existed.
    async fn delete_oauth_connection(&self, name: &str) -> Result<bool, StoreError>;
    /// Stores tokens of `grant` (status `connected`, error cleared,
    /// generation + 1) in one conditional update, only if it is still at
    /// `expected_generation`. A principal's first grant (`tokens.refreshed`
    /// false) is conditional on the *connection's* generation instead (the
    /// one its flow started under) and replaces any grant the principal
    /// had. `None`: it changed or vanished meanwhile and nothing was
    /// written.
    async fn store_oauth_tokens(
        &self,
        grant: GrantKey<'_>,
        expected_generation: u64,
        tokens: OAuthTokens,
    ) -> Result<Option<OAuthConnectionRow>, StoreError>;
    /// Marks `grant` `needs_reconsent` (tokens and expiry cleared, `error`
    /// recorded, generation + 1), only if it is still at
    /// `expected_generation`; `None` otherwise (nothing written).
    async fn set_oauth_needs_reconsent(
        &self,
        grant: GrantKey<'_>,
        expected_generation: u64,
        error: &str,
    ) -> Result<Option<OAuthConnectionRow>, StoreError>;
    /// Records a transient failure of `grant`: only `last_error` and
    /// `updated_at` change (status and generation do not).
    async fn set_oauth_error(&self, grant: GrantKey<'_>, error: &str) -> Result<(), StoreError>;
    /// Takes (or extends) the lease of `grant` for `ttl`: one atomic
    /// update that succeeds when no lease is held, the held one has
    /// expired, or `holder` holds it. Of any number of concurrent callers
    /// (on any replica) with different holders, at most one gets `true`.
    async fn acquire_oauth_lease(
        &self,
        grant: GrantKey<'_>,
        holder: &str,
        ttl: std::time::Duration,
    ) -> Result<bool, StoreError>;
    /// Releases the lease if `holder` holds it; otherwise does nothing.
    async fn release_oauth_lease(
        &self,
        grant: GrantKey<'_>,
        holder: &str,
    ) -> Result<(), StoreError>;
    /// One grant with its connection's settings: the connection's own
    /// ([`Store::get_oauth_connection`]) or a principal's (`None` when the
    /// principal has none).
    async fn get_oauth_grant(
        &self,
        grant: GrantKey<'_>,
    ) -> Result<Option<OAuthConnectionRow>, StoreError>;
    /// Principals' grants, of one connection and/or one principal (both
    /// `None`: every one), ordered by connection and principal.
    async fn list_oauth_user_grants(
        &self,
        connection: Option<&str>,
        principal: Option<&str>,
    ) -> Result<Vec<OAuthConnectionRow>, StoreError>;
    /// Deletes a principal's grant and its pending links and flows; `true`
    /// when the grant existed.
    async fn delete_oauth_user_grant(
        &self,
        connection: &str,
        principal: &str,
    ) -> Result<bool, StoreError>;
    /// Stores an authorization link, after deleting every expired one and,
    /// beyond [`MAX_OAUTH_TICKETS_PER_GRANT`] of the same principal and
    /// connection, its oldest. Refused with [`StoreError::Limit`] when
    /// [`MAX_OAUTH_TICKETS`] live ones exist.
    async fn create_oauth_ticket(&self, row: OAuthTicketRow) -> Result<(), StoreError>;
    /// The newest link of `principal` for `connection` that is still live at
    /// `live_at` (untaken and not expired by then).
    async fn live_oauth_ticket(
        &self,
        connection: &str,
        principal: &str,
        live_at: DateTime<Utc>,
    ) -> Result<Option<OAuthTicketRow>, StoreError>;
    /// Takes (deletes and returns) a link: of any number of concurrent
    /// takers, exactly one gets it. Returned even if expired; the caller
    /// checks `expires_at`.
    async fn take_oauth_ticket(
        &self,
        ticket_sha256: &str,
    ) -> Result<Option<OAuthTicketRow>, StoreError>;
    /// Stores a pending authorization, after deleting every expired one.
    /// Refused with [`StoreError::Limit`] when
    /// [`MAX_PENDING_OAUTH_AUTHORIZATIONS`] live ones exist.
    async fn create_oauth_authorization(
        &self,
        row: OAuthAuthorizationRow,
    ) -> Result<(), StoreError>;
    /// A pending authorization, left in place (the callback checks the
    /// browser before taking it).
    async fn get_oauth_authorization(
        &self,
        state: &str,
    ) -> Result<Option<OAuthAuthorizationRow>, StoreError>;
    /// Takes (deletes and returns) a pending authorization: of any number
    /// of concurrent takers, exactly one gets it. Returned even if expired;
    /// the caller checks `expires_at`.
    async fn take_oauth_authorization(
        &self,
        state: &str,
    ) -> Result<Option<OAuthAuthorizationRow>, StoreError>;

    /// Remembers a deleted gateway session (by the lowercase hex SHA-256 of
    /// its inner id) until `expires_at`, after purging expired ones; a
    /// second call keeps the later expiry. Refused with
    /// [`StoreError::Limit`] when [`MAX_GATEWAY_SESSION_REVOCATIONS`]
    /// unexpired ones exist.
    async fn revoke_gateway_session(
        &self,
        session_sha256: &str,
        expires_at: DateTime<Utc>,
    ) -> Result<(), StoreError>;
    /// Until when a gateway session is remembered as deleted; `None` when it
    /// is not (or no longer).
    async fn gateway_session_revocation(
        &self,
        session_sha256: &str,
    ) -> Result<Option<DateTime<Utc>>, StoreError>;

    /// Leases up to `want` calls of the current window of the rate-limit
    /// counter `key` (`limit` calls per `per_s` seconds), opening a new
    /// window when the last one ended. Never grants more than `limit` per
    /// window in all, whoever asks.
    async fn lease_calls(
        &self,
        key: &str,
        limit: u32,
        per_s: u32,
        want: u32,
    ) -> Result<CallsLease, StoreError>;
    /// Gives back `calls` leased from the window that started at
    /// `window_start_ms` and not used; nothing when that window ended.
    async fn give_back_calls(
        &self,
        key: &str,
        window_start_ms: i64,
        calls: u32,
    ) -> Result<(), StoreError>;
    /// Adds a batch of usage counts; `false` when this batch was added
    /// before (and nothing changed).
    async fn record_usage(&self, batch: &UsageBatch) -> Result<bool, StoreError>;
    /// Usage between `since_ms` and `until_ms` grouped by `group` (per
    /// `step_ms` when given), by time then calls; at most
    /// [`MAX_USAGE_ROWS`] rows, and whether more there were.
    async fn usage(
        &self,
        group: quiver_model::usage::UsageGroup,
        since_ms: i64,
        until_ms: i64,
        step_ms: Option<i64>,
    ) -> Result<(Vec<quiver_model::usage::UsageTotal>, bool), StoreError>;
    /// Deletes usage rows older than `before_ms`, batch marks older than a
    /// day and rate windows that ended; how many rows went.
    async fn prune_usage(&self, before_ms: i64) -> Result<u64, StoreError>;
}

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
