//! The audit trail of server records (docs/reference.md §5): pages of the
//! never-compacted history, each change with the paths of the fields it
//! changed, found by a JSON diff of the record's versions. Paths only, never
//! values, so secrets cannot leak through it. The HTTP handler is
//! `rest::audit`.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use quiver_model::{ChangeKind, HistoryEntry, McpServerSpec, Source};
use quiver_store::{HistoryPage, HistoryRow};
use serde::Serialize;
use serde_json::Value;

use crate::error::RegistryError;
use crate::state::RegistryState;

/// Entries of an audit page when the caller names no limit.
pub const AUDIT_DEFAULT_LIMIT: u32 = 100;

/// Most entries one audit page holds.
pub const AUDIT_MAX_LIMIT: u32 = 1000;

/// `changed_fields` of the first revision of a record (and of one created
/// again after a delete).
pub const CREATED_MARKER: &str = "(created)";

/// `changed_fields` of a delete.
pub const DELETED_MARKER: &str = "(deleted)";

/// In `changed_fields` when the record's source (owner) changed, e.g. a record
/// that moved to another `mcp.d` file or was taken over by a file.
pub const SOURCE_MARKER: &str = "(source)";

/// Which registry changes an audit page holds ([`RegistryState::audit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditQuery {
    /// `None`: the newest changes, newest first. `Some(n)`: the changes after
    /// revision `n`, oldest first.
    pub since_revision: Option<u64>,
    /// Only changes of this record.
    pub server_id: Option<String>,
    /// At most this many entries (1…[`AUDIT_MAX_LIMIT`]).
    pub limit: u32,
}

/// One registry change: who changed which record how, at which revision.
/// Holds field paths only, never values, so secrets cannot leak through it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditEntry {
    /// The revision the change created.
    pub revision: u64,
    /// The record changed.
    pub server_id: String,
    /// Upsert or delete.
    pub kind: ChangeKind,
    /// Who made the change.
    pub actor: String,
    /// Where the change came from (`admin`, `api`, `file:<name>`).
    pub source: Source,
    /// Commit time.
    pub at: DateTime<Utc>,
    /// The record's revision the change is a change against; `None` for its
    /// first revision.
    pub previous_revision: Option<u64>,
    /// The diff summary against `previous_revision` (see [`changed_fields`]).
    pub changed_fields: Vec<String>,
}

/// One page of the audit trail ([`RegistryState::audit`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditPage {
    /// `newest_first` (no `since_revision`) or `oldest_first`.
    pub order: &'static str,
    /// The registry's head revision, read after the page (so at least the
    /// revision of every entry).
    pub head_revision: u64,
    /// The changes, in `order`.
    pub entries: Vec<AuditEntry>,
    /// Whether more changes lie beyond this page in its order (older ones
    /// for `newest_first`, newer ones for `oldest_first`).
    pub more: bool,
    /// The `since_revision` that asks for the changes after those seen so
    /// far: the newest revision of the page (the query's `since_revision`,
    /// or 0, when the page is empty).
    pub next_since_revision: u64,
}

/// The diff summary of one history row against the same record's previous
/// row: [`DELETED_MARKER`] for a delete, [`CREATED_MARKER`] for a first
/// revision or a re-creation after a delete, else the paths of the changed
/// fields ([`spec_changes`]) followed by [`SOURCE_MARKER`] when the source
/// changed too.
pub fn changed_fields(entry: &HistoryEntry, previous: Option<&HistoryEntry>) -> Vec<String> {
    if entry.kind == ChangeKind::Delete {
        return vec![DELETED_MARKER.to_owned()];
    }
    // A previous delete (or no previous row) makes this a creation.
    let before = previous
        .filter(|p| p.kind == ChangeKind::Upsert)
        .and_then(|p| Some((p, p.spec.as_ref()?)));
    match (before, entry.spec.as_ref()) {
        (Some((previous, before)), Some(after)) => {
            let mut fields = spec_changes(before, after);
            if previous.source != entry.source {
                fields.push(SOURCE_MARKER.to_owned());
            }
            fields
        }
        _ => vec![CREATED_MARKER.to_owned()],
    }
}

/// Dotted paths (`mcp.d` field names) of the fields that differ between two
/// versions of a record, sorted. Objects are descended into, with map keys
/// as path segments (`budgets.max_concurrency`, `stdio.env.API_KEY`,
/// `labels.team`); arrays and scalars are compared whole (`allowed_tools`,
/// `stdio.args`). Only paths are returned, never values.
pub fn spec_changes(before: &McpServerSpec, after: &McpServerSpec) -> Vec<String> {
    let mut paths = BTreeSet::new();
    match (serde_json::to_value(before), serde_json::to_value(after)) {
        (Ok(before), Ok(after)) => diff_paths("", Some(&before), Some(&after), &mut paths),
        // A record is plain strings, numbers and string-keyed maps, so this
        // cannot happen; say "something changed" rather than nothing.
        _ => {
            paths.insert("(record)".to_owned());
        }
    }
    paths.into_iter().collect()
}

/// Adds to `out` the paths under `path` where `before` and `after` differ
/// (absent and `null` are the same).
fn diff_paths(
    path: &str,
    before: Option<&Value>,
    after: Option<&Value>,
    out: &mut BTreeSet<String>,
) {
    let before = before.filter(|v| !v.is_null());
    let after = after.filter(|v| !v.is_null());
    if before == after {
        return;
    }
    match (as_object(before), as_object(after)) {
        (Some(b), Some(a)) => {
            let keys: BTreeSet<&String> = b.iter().chain(a.iter()).flat_map(|m| m.keys()).collect();
            for key in keys {
                let child = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                diff_paths(
                    &child,
                    b.and_then(|m| m.get(key)),
                    a.and_then(|m| m.get(key)),
                    out,
                );
            }
        }
        _ => {
            out.insert(path.to_owned());
        }
    }
}

/// `Some(None)` for absent, `Some(map)` for an object, `None` for anything else.
fn as_object(value: Option<&Value>) -> Option<Option<&serde_json::Map<String, Value>>> {
    match value {
        None => Some(None),
        Some(Value::Object(map)) => Some(Some(map)),
        Some(_) => None,
    }
}

fn audit_entry(row: HistoryRow) -> AuditEntry {
    let changed_fields = changed_fields(&row.entry, row.previous.as_ref());
    AuditEntry {
        revision: row.entry.revision,
        server_id: row.server_id,
        kind: row.entry.kind,
        actor: row.entry.actor,
        source: row.entry.source,
        at: row.entry.at,
        previous_revision: row.previous.map(|p| p.revision),
        changed_fields,
    }
}

impl RegistryState {
    /// A page of the audit trail: registry changes of every record (or of
    /// one) from the never-compacted history, each with the paths of the
    /// fields it changed.
    pub async fn audit(&self, query: &AuditQuery) -> Result<AuditPage, RegistryError> {
        let limit = query.limit.clamp(1, AUDIT_MAX_LIMIT);
        let server_id = query.server_id.as_deref();
        // One row more than asked tells whether there are more.
        let page = match query.since_revision {
            None => HistoryPage::Newest {
                server_id,
                limit: limit + 1,
            },
            Some(after) => HistoryPage::After {
                after,
                server_id,
                limit: limit + 1,
            },
        };
        let mut rows = self.store.history_page(page).await?;
        let head_revision = self.store.head().await?.revision;
        let more = rows.len() > limit as usize;
        rows.truncate(limit as usize);
        let entries: Vec<AuditEntry> = rows.into_iter().map(audit_entry).collect();
        let (order, next_since_revision) = match query.since_revision {
            None => ("newest_first", entries.first().map_or(0, |e| e.revision)),
            Some(since) => ("oldest_first", entries.last().map_or(since, |e| e.revision)),
        };
        Ok(AuditPage {
            order,
            head_revision,
            entries,
            more,
            next_since_revision,
        })
    }
}

#[cfg(test)]
mod tests {
    use quiver_model::{HttpConfig, StdioConfig, Transport};

    use super::*;

    fn stdio(id: &str) -> McpServerSpec {
        let mut spec = McpServerSpec::new(id, Transport::Stdio);
        spec.stdio = Some(StdioConfig {
            command: "npx".into(),
            env: [("API_KEY".to_owned(), "sk-one".to_owned())].into(),
            ..Default::default()
        });
        spec
    }

    fn entry(revision: u64, spec: Option<McpServerSpec>, source: Source) -> HistoryEntry {
        HistoryEntry {
            revision,
            kind: if spec.is_some() {
                ChangeKind::Upsert
            } else {
                ChangeKind::Delete
            },
            spec,
            at: Utc::now(),
            actor: "ann".into(),
            source,
        }
    }

    #[test]
    fn nested_fields_are_named_by_path_without_values() {
        let before = stdio("a");
        let mut after = before.clone();
        after.budgets.max_concurrency = 2;
        after.display_name = Some("A".into());
        after.labels.insert("team".into(), "infra".into());
        if let Some(stdio) = after.stdio.as_mut() {
            stdio.env.insert("API_KEY".into(), "sk-two".into());
            stdio.env.insert("NEW".into(), "sk-new".into());
            stdio.args = vec!["-y".into()];
        }
        let fields = spec_changes(&before, &after);
        assert_eq!(
            fields,
            [
                "budgets.max_concurrency",
                "display_name",
                "labels.team",
                "stdio.args",
                "stdio.env.API_KEY",
                "stdio.env.NEW",
            ]
        );
        assert!(fields.iter().all(|f| !f.contains("sk-")));
        assert!(spec_changes(&before, &before).is_empty());
    }

    #[test]
    fn resource_and_prompt_lists_are_changed_fields() {
        let before = stdio("a");
        let mut after = before.clone();
        after.allowed_resources = vec!["ui://*".into()];
        after.allowed_prompts = vec!["greet".into()];
        assert_eq!(
            spec_changes(&before, &after),
            ["allowed_prompts", "allowed_resources"]
        );
        let mut widened = after.clone();
        widened.allowed_resources = vec!["file:///*".into(), "ui://*".into()];
        assert_eq!(spec_changes(&after, &widened), ["allowed_resources"]);
    }

    #[test]
    fn a_transport_switch_names_both_sides() {
        let before = stdio("a");
        let mut after = McpServerSpec::new("a", Transport::StreamableHttp);
        after.http = Some(HttpConfig {
            url: "https://mcp.example/mcp".into(),
            headers: [("Authorization".to_owned(), "Bearer x".to_owned())].into(),
            auth_ref: None,
        });
        assert_eq!(
            spec_changes(&before, &after),
            [
                "http.headers.Authorization",
                "http.url",
                "stdio.command",
                "stdio.env.API_KEY",
                "transport",
            ]
        );
    }

    #[test]
    fn creations_deletes_and_source_changes_are_marked() {
        let first = entry(1, Some(stdio("a")), Source::Admin);
        assert_eq!(changed_fields(&first, None), [CREATED_MARKER]);
        let deleted = entry(2, None, Source::Admin);
        assert_eq!(changed_fields(&deleted, Some(&first)), [DELETED_MARKER]);
        let again = entry(3, Some(stdio("a")), Source::Api);
        assert_eq!(changed_fields(&again, Some(&deleted)), [CREATED_MARKER]);
        let adopted = entry(4, Some(stdio("a")), Source::File("a.toml".into()));
        assert_eq!(changed_fields(&adopted, Some(&again)), [SOURCE_MARKER]);
    }
}
