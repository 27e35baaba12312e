//! Comparing a scan with the store, rendering the difference (`--dry-run`)
//! and writing it (R-BOOT-4, R-BOOT-5).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};

use quiver_model::{McpServerSpec, Source, StoredServer};
use quiver_store::{DeleteRequest, Store, UpsertOutcome, UpsertRequest};
use similar::TextDiff;

use crate::BootstrapError;
use crate::scan::Scan;

/// What a rescan does with one `server_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A file declares a record the store lacks.
    Create {
        /// The declaring file.
        file: String,
        /// The declared record.
        spec: McpServerSpec,
    },
    /// A file-owned record whose content or owning file changes.
    Update {
        /// The declaring file, the record's new source.
        file: String,
        /// The record as stored when planning.
        current: Box<StoredServer>,
        /// The declared record.
        spec: McpServerSpec,
    },
    /// A file-owned record no valid file declares any more.
    Delete {
        /// The record as stored when planning.
        current: Box<StoredServer>,
        /// Why, e.g. `file 30-old.toml removed`.
        reason: String,
    },
    /// The store already holds exactly what the file declares.
    Unchanged {
        /// The record.
        server_id: String,
        /// The declaring file.
        file: String,
    },
    /// A file's declaration that is not applied (the record is admin-managed,
    /// or owned by an invalid file that takes precedence).
    Skipped {
        /// The record.
        server_id: String,
        /// The declaring file whose content is ignored.
        file: String,
        /// Why, naming the file.
        reason: String,
    },
    /// A record no valid file declares, kept because its own file is present
    /// but invalid.
    Kept {
        /// The record.
        server_id: String,
        /// The invalid file that owns it.
        file: String,
        /// Why, naming the file.
        reason: String,
    },
}

impl Action {
    /// The record this action concerns.
    pub fn server_id(&self) -> &str {
        match self {
            Action::Create { spec, .. } => &spec.server_id,
            Action::Update { current, .. } | Action::Delete { current, .. } => {
                &current.spec.server_id
            }
            Action::Unchanged { server_id, .. }
            | Action::Skipped { server_id, .. }
            | Action::Kept { server_id, .. } => server_id,
        }
    }
}

/// The changes a scan implies for the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Store revision the plan was computed against.
    pub revision: u64,
    /// One action per `server_id` concerned, ordered by `server_id`. Records
    /// owned by admin or api that no file declares have none.
    pub actions: Vec<Action>,
}

/// Counts of actions by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Tally {
    create: usize,
    update: usize,
    delete: usize,
    unchanged: usize,
    skipped: usize,
    kept: usize,
}

impl Plan {
    /// Whether applying the plan writes anything.
    pub fn has_changes(&self) -> bool {
        self.actions.iter().any(|a| {
            matches!(
                a,
                Action::Create { .. } | Action::Update { .. } | Action::Delete { .. }
            )
        })
    }

    /// A human-readable diff against the store, for `--dry-run`: one line per
    /// action, the new record's TOML for creates, a unified diff for updates,
    /// the removed TOML for deletes, then a summary line.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut tally = Tally::default();
        for action in &self.actions {
            match action {
                Action::Create { file, spec } => {
                    tally.create += 1;
                    line(
                        &mut out,
                        format_args!("+ create {} ({file})", spec.server_id),
                    );
                    prefix_lines(&mut out, '+', &spec.to_toml());
                }
                Action::Update {
                    file,
                    current,
                    spec,
                } => {
                    tally.update += 1;
                    let id = &spec.server_id;
                    let moved = current.source.file_name() != Some(file.as_str());
                    if moved {
                        line(
                            &mut out,
                            format_args!("~ update {id} ({file}, was {})", current.source),
                        );
                    } else {
                        line(&mut out, format_args!("~ update {id} ({file})"));
                    }
                    let old = current.spec.to_toml();
                    let new = spec.to_toml();
                    if old == new {
                        line(
                            &mut out,
                            format_args!(
                                "  content unchanged, source {} -> file:{file}",
                                current.source
                            ),
                        );
                    } else {
                        let diff = TextDiff::from_lines(&old, &new);
                        let mut unified = diff.unified_diff();
                        unified.header(
                            &format!("{id} (revision {}, {})", current.revision, current.source),
                            &format!("{id} (file:{file})"),
                        );
                        out.push_str(&unified.to_string());
                        if !out.ends_with('\n') {
                            out.push('\n');
                        }
                    }
                }
                Action::Delete { current, reason } => {
                    tally.delete += 1;
                    line(
                        &mut out,
                        format_args!("- delete {} ({reason})", current.spec.server_id),
                    );
                    prefix_lines(&mut out, '-', &current.spec.to_toml());
                }
                Action::Unchanged { server_id, file } => {
                    tally.unchanged += 1;
                    line(&mut out, format_args!("= unchanged {server_id} ({file})"));
                }
                Action::Skipped {
                    server_id,
                    file,
                    reason,
                } => {
                    tally.skipped += 1;
                    line(
                        &mut out,
                        format_args!("! skipped {server_id} ({file}): {reason}"),
                    );
                }
                Action::Kept {
                    server_id,
                    file,
                    reason,
                } => {
                    tally.kept += 1;
                    line(
                        &mut out,
                        format_args!("! kept {server_id} ({file}): {reason}"),
                    );
                }
            }
        }
        line(
            &mut out,
            format_args!(
                "plan against revision {}: {} to create, {} to update, {} to delete, {} unchanged, {} skipped, {} kept",
                self.revision,
                tally.create,
                tally.update,
                tally.delete,
                tally.unchanged,
                tally.skipped,
                tally.kept
            ),
        );
        out
    }
}

fn line(out: &mut String, args: fmt::Arguments<'_>) {
    // Writing to a String cannot fail.
    let _ = out.write_fmt(args);
    out.push('\n');
}

fn prefix_lines(out: &mut String, prefix: char, text: &str) {
    for text_line in text.lines() {
        out.push(prefix);
        out.push_str(text_line);
        out.push('\n');
    }
}

/// Compares what `scan` declares with the store (see the crate docs for the
/// ownership rules). Reads only.
pub async fn plan(store: &dyn Store, scan: &Scan) -> Result<Plan, BootstrapError> {
    let snapshot = store.list().await?;
    let stored: BTreeMap<&str, &StoredServer> = snapshot
        .servers
        .iter()
        .map(|s| (s.spec.server_id.as_str(), s))
        .collect();
    let declared: BTreeMap<&str, _> = scan
        .records
        .iter()
        .map(|r| (r.spec.server_id.as_str(), r))
        .collect();
    let ids: BTreeSet<&str> = stored.keys().chain(declared.keys()).copied().collect();

    let mut actions = Vec::new();
    for id in ids {
        let action = match (declared.get(id), stored.get(id)) {
            (Some(record), None) => Action::Create {
                file: record.file.clone(),
                spec: record.spec.clone(),
            },
            (Some(record), Some(current)) => {
                let file = &record.file;
                match &current.source {
                    Source::Admin | Source::Api => Action::Skipped {
                        server_id: id.to_owned(),
                        file: file.clone(),
                        reason: format!(
                            "server_id {id} is managed by {}; {file} ignored",
                            current.source
                        ),
                    },
                    // Had the owner been valid it would have won over `file`.
                    Source::File(owner) if owner > file && scan.is_invalid_file(owner) => {
                        Action::Skipped {
                            server_id: id.to_owned(),
                            file: file.clone(),
                            reason: format!(
                                "server_id {id} belongs to {owner}, which is invalid and takes precedence; {file} ignored"
                            ),
                        }
                    }
                    Source::File(owner) if owner == file && current.spec == record.spec => {
                        Action::Unchanged {
                            server_id: id.to_owned(),
                            file: file.clone(),
                        }
                    }
                    Source::File(_) => Action::Update {
                        file: file.clone(),
                        current: Box::new((*current).clone()),
                        spec: record.spec.clone(),
                    },
                }
            }
            (None, Some(current)) => {
                let Source::File(owner) = &current.source else {
                    continue;
                };
                if scan.is_invalid_file(owner) {
                    Action::Kept {
                        server_id: id.to_owned(),
                        file: owner.clone(),
                        reason: format!("{owner} is invalid; record kept until it is fixed"),
                    }
                } else if scan.is_valid_file(owner) {
                    Action::Delete {
                        current: Box::new((*current).clone()),
                        reason: format!("no longer declared by {owner}"),
                    }
                } else {
                    Action::Delete {
                        current: Box::new((*current).clone()),
                        reason: format!("file {owner} removed"),
                    }
                }
            }
            (None, None) => continue,
        };
        actions.push(action);
    }
    Ok(Plan {
        revision: snapshot.revision,
        actions,
    })
}

/// What [`apply`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApplyReport {
    /// Records created.
    pub created: usize,
    /// Records updated.
    pub updated: usize,
    /// Records deleted.
    pub deleted: usize,
    /// Records already as declared.
    pub unchanged: usize,
    /// Declarations not applied (admin-managed records and the like).
    pub skipped: usize,
    /// Records kept because their file is invalid.
    pub kept: usize,
    /// Actions that failed, as `(server_id, error message)`; typically
    /// revision conflicts with a concurrent edit.
    pub failed: Vec<(String, String)>,
}

impl ApplyReport {
    /// Whether the store changed (a record created, updated or deleted) or
    /// an action failed.
    pub fn changed_anything(&self) -> bool {
        self.created + self.updated + self.deleted > 0 || !self.failed.is_empty()
    }
}

impl fmt::Display for ApplyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} created, {} updated, {} deleted, {} unchanged, {} skipped, {} kept, {} failed",
            self.created,
            self.updated,
            self.deleted,
            self.unchanged,
            self.skipped,
            self.kept,
            self.failed.len()
        )?;
        for (i, (server_id, error)) in self.failed.iter().enumerate() {
            f.write_str(if i == 0 { " (" } else { "; " })?;
            write!(f, "{server_id}: {error}")?;
        }
        if !self.failed.is_empty() {
            f.write_str(")")?;
        }
        Ok(())
    }
}

/// Writes `plan` as `actor`. Every write expects the revision the plan saw, so
/// a record changed since planning fails alone (listed in
/// [`ApplyReport::failed`]) while the other actions still run.
pub async fn apply(
    store: &dyn Store,
    plan: &Plan,
    actor: &str,
) -> Result<ApplyReport, BootstrapError> {
    let mut report = ApplyReport::default();
    for action in &plan.actions {
        let server_id = action.server_id();
        let result = match action {
            Action::Create { file, spec } => upsert(store, &mut report, actor, file, spec, 0).await,
            Action::Update {
                file,
                current,
                spec,
            } => upsert(store, &mut report, actor, file, spec, current.revision).await,
            Action::Delete { current, reason } => {
                let request = DeleteRequest {
                    server_id: server_id.to_owned(),
                    expected_revision: Some(current.revision),
                    actor: actor.to_owned(),
                    source: current.source.clone(),
                };
                store.delete(request).await.map(|revision| {
                    report.deleted += 1;
                    tracing::info!(server_id, revision, reason = %reason, "mcp server deleted by mcp.d rescan");
                })
            }
            Action::Unchanged { .. } => {
                report.unchanged += 1;
                Ok(())
            }
            Action::Skipped { file, reason, .. } => {
                report.skipped += 1;
                tracing::warn!(server_id, file = %file, reason = %reason, "mcp.d declaration skipped");
                Ok(())
            }
            Action::Kept { file, reason, .. } => {
                report.kept += 1;
                tracing::warn!(server_id, file = %file, reason = %reason, "mcp server kept");
                Ok(())
            }
        };
        if let Err(err) = result {
            tracing::warn!(server_id, error = %err, "mcp.d change not applied");
            report.failed.push((server_id.to_owned(), err.to_string()));
        }
    }
    Ok(report)
}

async fn upsert(
    store: &dyn Store,
    report: &mut ApplyReport,
    actor: &str,
    file: &str,
    spec: &McpServerSpec,
    expected_revision: u64,
) -> Result<(), quiver_store::StoreError> {
    let request = UpsertRequest {
        spec: spec.clone(),
        expected_revision: Some(expected_revision),
        actor: actor.to_owned(),
        source: Source::File(file.to_owned()),
    };
    let outcome = store.upsert(request).await?;
    let server_id = spec.server_id.as_str();
    match &outcome {
        UpsertOutcome::Created(stored) => {
            report.created += 1;
            tracing::info!(
                server_id,
                file,
                revision = stored.revision,
                "mcp server created from mcp.d"
            );
        }
        UpsertOutcome::Updated(stored) => {
            report.updated += 1;
            tracing::info!(
                server_id,
                file,
                revision = stored.revision,
                "mcp server updated from mcp.d"
            );
        }
        UpsertOutcome::Unchanged(_) => report.unchanged += 1,
    }
    Ok(())
}
