//! Comparing an `mcp.d` scan with the store, rendering the difference
//! (`--dry-run`) and writing it (R-BOOT-4, R-BOOT-5); the ownership rules and
//! the rendering are shared with `policies.d` ([`decide`], [`Render`]).

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
        let mut out = Render::default();
        for action in &self.actions {
            match action {
                Action::Create { file, spec } => {
                    out.create(&spec.server_id, file, &spec.to_toml());
                }
                Action::Update {
                    file,
                    current,
                    spec,
                } => out.update(
                    &spec.server_id,
                    file,
                    (&current.source, current.revision),
                    &current.spec.to_toml(),
                    &spec.to_toml(),
                ),
                Action::Delete { current, reason } => {
                    out.delete(&current.spec.server_id, reason, &current.spec.to_toml());
                }
                Action::Unchanged { server_id, file } => out.unchanged(server_id, file),
                Action::Skipped {
                    server_id,
                    file,
                    reason,
                } => out.skipped(server_id, file, reason),
                Action::Kept {
                    server_id,
                    file,
                    reason,
                } => out.kept(server_id, file, reason),
            }
        }
        out.finish(self.revision)
    }
}

/// The text of a plan (`--dry-run`), one action at a time, with the counts
/// of its summary line. Shared by the `mcp.d` and `policies.d` plans, so
/// both read the same; `what` names the record (`fs`, `policy team-a`).
#[derive(Debug, Default)]
pub(crate) struct Render {
    out: String,
    create: usize,
    update: usize,
    delete: usize,
    unchanged: usize,
    skipped: usize,
    kept: usize,
}

impl Render {
    pub(crate) fn create(&mut self, what: &str, file: &str, toml: &str) {
        self.create += 1;
        self.line(format_args!("+ create {what} ({file})"));
        self.prefix_lines('+', toml);
    }

    /// `current` is the stored record's source and revision.
    pub(crate) fn update(
        &mut self,
        what: &str,
        file: &str,
        current: (&Source, u64),
        old: &str,
        new: &str,
    ) {
        self.update += 1;
        let (source, revision) = current;
        if source.file_name() == Some(file) {
            self.line(format_args!("~ update {what} ({file})"));
        } else {
            self.line(format_args!("~ update {what} ({file}, was {source})"));
        }
        if old == new {
            self.line(format_args!(
                "  content unchanged, source {source} -> file:{file}"
            ));
            return;
        }
        let diff = TextDiff::from_lines(old, new);
        let mut unified = diff.unified_diff();
        unified.header(
            &format!("{what} (revision {revision}, {source})"),
            &format!("{what} (file:{file})"),
        );
        self.out.push_str(&unified.to_string());
        if !self.out.ends_with('\n') {
            self.out.push('\n');
        }
    }

    pub(crate) fn delete(&mut self, what: &str, reason: &str, toml: &str) {
        self.delete += 1;
        self.line(format_args!("- delete {what} ({reason})"));
        self.prefix_lines('-', toml);
    }

    pub(crate) fn unchanged(&mut self, what: &str, file: &str) {
        self.unchanged += 1;
        self.line(format_args!("= unchanged {what} ({file})"));
    }

    pub(crate) fn skipped(&mut self, what: &str, file: &str, reason: &str) {
        self.skipped += 1;
        self.line(format_args!("! skipped {what} ({file}): {reason}"));
    }

    pub(crate) fn kept(&mut self, what: &str, file: &str, reason: &str) {
        self.kept += 1;
        self.line(format_args!("! kept {what} ({file}): {reason}"));
    }

    /// The text, ending with the summary line.
    pub(crate) fn finish(mut self, revision: u64) -> String {
        let summary = format!(
            "plan against revision {revision}: {} to create, {} to update, {} to delete, {} unchanged, {} skipped, {} kept",
            self.create, self.update, self.delete, self.unchanged, self.skipped, self.kept
        );
        self.line(format_args!("{summary}"));
        self.out
    }

    fn line(&mut self, args: fmt::Arguments<'_>) {
        // Writing to a String cannot fail.
        let _ = self.out.write_fmt(args);
        self.out.push('\n');
    }

    fn prefix_lines(&mut self, prefix: char, text: &str) {
        for text_line in text.lines() {
            self.out.push(prefix);
            self.out.push_str(text_line);
            self.out.push('\n');
        }
    }
}

/// What the ownership rules (crate docs) decide for one record, whatever
/// its kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// A file declares it and the store lacks it.
    Create,
    /// A file takes over or changes the file-owned stored record.
    Update,
    /// The owning file declares exactly what is stored.
    Unchanged,
    /// The declaration is not applied; why, naming the file.
    Skipped(String),
    /// The file-owned record is no longer declared; why.
    Delete(String),
    /// Not declared, but its invalid file still owns it; why.
    Kept(String),
    /// Stored, not declared and not file-owned: nothing to say.
    Untouched,
}

/// The ownership rules for the record `what` (`server_id fs`, `policy
/// team-a`): `declared` is the file declaring it, `stored` the stored
/// record's source and whether its content is the declared one.
/// `invalid_owner_wins(owner, file)` says whether an owner file that is
/// present but invalid would have won over the declaring file were it
/// valid; its declaration then keeps the record.
pub(crate) fn decide<R>(
    what: &str,
    declared: Option<&str>,
    stored: Option<(&Source, bool)>,
    scan: &Scan<R>,
    invalid_owner_wins: impl Fn(&str, &str) -> bool,
) -> Decision {
    match (declared, stored) {
        (Some(_), None) => Decision::Create,
        (Some(file), Some((source, same_content))) => match source {
            Source::Admin | Source::Api => {
                Decision::Skipped(format!("{what} is managed by {source}; {file} ignored"))
            }
            Source::File(owner)
                if owner != file
                    && scan.is_invalid_file(owner)
                    && invalid_owner_wins(owner, file) =>
            {
                Decision::Skipped(format!(
                    "{what} belongs to {owner}, which is invalid and takes precedence; {file} ignored"
                ))
            }
            Source::File(owner) if owner == file && same_content => Decision::Unchanged,
            Source::File(_) => Decision::Update,
        },
        (None, Some((Source::File(owner), _))) => {
            if scan.is_invalid_file(owner) {
                Decision::Kept(format!("{owner} is invalid; record kept until it is fixed"))
            } else if scan.is_valid_file(owner) {
                Decision::Delete(format!("no longer declared by {owner}"))
            } else {
                Decision::Delete(format!("file {owner} removed"))
            }
        }
        (None, _) => Decision::Untouched,
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
        let record = declared.get(id);
        let current = stored.get(id);
        let decision = decide(
            &format!("server_id {id}"),
            record.map(|r| r.file.as_str()),
            current.map(|c| (&c.source, record.is_some_and(|r| r.spec == c.spec))),
            scan,
            // The last file wins (R-BOOT-3).
            |owner, file| owner > file,
        );
        let action = match (decision, record, current) {
            (Decision::Create, Some(record), _) => Action::Create {
                file: record.file.clone(),
                spec: record.spec.clone(),
            },
            (Decision::Update, Some(record), Some(current)) => Action::Update {
                file: record.file.clone(),
                current: Box::new((*current).clone()),
                spec: record.spec.clone(),
            },
            (Decision::Unchanged, Some(record), _) => Action::Unchanged {
                server_id: id.to_owned(),
                file: record.file.clone(),
            },
            (Decision::Skipped(reason), Some(record), _) => Action::Skipped {
                server_id: id.to_owned(),
                file: record.file.clone(),
                reason,
            },
            (Decision::Delete(reason), _, Some(current)) => Action::Delete {
                current: Box::new((*current).clone()),
                reason,
            },
            (Decision::Kept(reason), _, Some(current)) => Action::Kept {
                server_id: id.to_owned(),
                file: current.source.file_name().unwrap_or_default().to_owned(),
                reason,
            },
            _ => continue,
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
    /// Actions that failed, as `(record, error message)` (the record's
    /// `server_id`, or `<kind> <name>` for `policies.d`); typically
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
