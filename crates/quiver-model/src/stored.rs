//! What the registry stores around a record: revision, provenance, history and change events.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::record::McpServerSpec;

/// Where a record's current content came from (R-REC-2).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    /// The web admin or REST admin API.
    Admin,
    /// The gRPC API (the `quiver servers` CLI, automation).
    Api,
    /// A file of the `mcp.d` directory, by file name.
    File(String),
}

impl Source {
    /// Whether a write from this source takes over a record whose content it
    /// does not change. Files do (a record moved between files changes owner);
    /// admin and API writes of identical content are no-ops, so an admin who
    /// saves an unchanged form does not detach a record from its file.
    pub fn adopts_identical_record(&self) -> bool {
        matches!(self, Source::File(_))
    }

    /// The file name for file sources.
    pub fn file_name(&self) -> Option<&str> {
        match self {
            Source::File(name) => Some(name),
            _ => None,
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Admin => f.write_str("admin"),
            Source::Api => f.write_str("api"),
            Source::File(name) => write!(f, "file:{name}"),
        }
    }
}

/// A source string that is none of `admin`, `api`, `file:<name>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown record source {0:?}")]
pub struct UnknownSource(pub String);

impl FromStr for Source {
    type Err = UnknownSource;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "admin" => Ok(Source::Admin),
            "api" => Ok(Source::Api),
            _ => match s.strip_prefix("file:") {
                Some(name) if !name.is_empty() => Ok(Source::File(name.to_owned())),
                _ => Err(UnknownSource(s.to_owned())),
            },
        }
    }
}

impl Serialize for Source {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Source {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_round_trips() {
        for source in [
            Source::Admin,
            Source::Api,
            Source::File("10-fs.toml".into()),
        ] {
            assert_eq!(source.to_string().parse::<Source>().unwrap(), source);
        }
        assert!("file:".parse::<Source>().is_err());
        assert!("root".parse::<Source>().is_err());
    }
}
