//! What the registry stores around a record: revision, provenance, history and change events.

use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::record::McpServerSpec;
use crate::source::Source;

/// A record as stored: its content plus revision and provenance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredServer {
    /// The record content.
    #[serde(flatten)]
    pub spec: McpServerSpec,
    /// Global revision of the last change of this record.
    pub revision: u64,
    /// When the record was first created.
    pub created_at: DateTime<Utc>,
    /// When the record was last changed.
    pub updated_at: DateTime<Utc>,
    /// Who made the last change.
    pub updated_by: String,
    /// Where the current content came from.
    pub source: Source,
}

impl StoredServer {
    /// `spec` as stored when `actor` created it through the API at
    /// `revision`, now: the record a worker's pool and catalog are handed,
    /// for code that holds one without a registry (tests, benchmarks).
    pub fn created(spec: McpServerSpec, revision: u64, actor: &str) -> Self {
        let now = Utc::now();
        StoredServer {
            spec,
            revision,
            created_at: now,
            updated_at: now,
            updated_by: actor.to_owned(),
            source: Source::Api,
        }
    }
}

/// Kind of change recorded at a revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// Created or replaced.
    Upsert,
    /// Removed.
    Delete,
}

impl ChangeKind {
    /// The name stored in the change log.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Upsert => "upsert",
            ChangeKind::Delete => "delete",
        }
    }
}

impl FromStr for ChangeKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "upsert" => Ok(ChangeKind::Upsert),
            "delete" => Ok(ChangeKind::Delete),
            other => Err(format!("unknown change kind {other:?}")),
        }
    }
}

/// One row of the change log: the light event watchers receive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// The revision this change created.
    pub revision: u64,
    /// The record changed: a server id, or for an access record its name
    /// within its kind.
    pub server_id: String,
    /// Upsert or delete.
    pub kind: ChangeKind,
    /// Commit time.
    pub at: DateTime<Utc>,
    /// Who made it.
    pub actor: String,
    /// `None` for a server record; the kind of an access record
    /// (`crate::access`), which shares the revision space.
    #[serde(default)]
    pub access: Option<crate::access::AccessKind>,
}

/// One revision of one record (R-STORE-5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// The revision.
    pub revision: u64,
    /// Upsert or delete.
    pub kind: ChangeKind,
    /// Full content as of this revision; `None` for deletes.
    pub spec: Option<McpServerSpec>,
    /// Commit time.
    pub at: DateTime<Utc>,
    /// Who made it.
    pub actor: String,
    /// Where it came from.
    pub source: Source,
}
