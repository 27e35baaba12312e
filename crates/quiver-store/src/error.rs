//! The store's one error type.

use quiver_model::ModelError;
use quiver_model::access::AccessKind;

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
    /// A batch ([`Store::apply`](crate::Store::apply)) failed on the record at `index` (0-based);
    /// nothing of the batch was written.
    #[error("record {index}: {source}")]
    InRecord {
        /// Position of the record in the batch.
        index: usize,
        /// Why it failed.
        source: Box<StoreError>,
    },
}
