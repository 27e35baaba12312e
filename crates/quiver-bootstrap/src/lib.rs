//! Bootstrap of registry records from directories of files
//! (docs/reference.md §4): MCP server records from an `mcp.d` directory, and
//! policies and identity providers from a `policies.d` directory
//! ([`policies`], same walk, same ownership rules).
//!
//! Three steps, usable apart so `--dry-run` can stop after the second:
//! [`scan`] reads and validates the directory, [`plan`] compares what the files
//! declare with the store, [`apply`] writes the plan. [`reconcile`] runs all
//! three (start-up, SIGHUP, periodic and admin rescans); [`policies`] has the
//! same four for `policies.d`.
//!
//! # Which files are read
//!
//! Direct children of the directory named `*.toml` or `*.json`, in byte order
//! of their names. Hidden files, `*~`, `*.swp` and `*.tmp` are editor or
//! deployment leftovers and are ignored; directories are not descended into;
//! symlinks are never followed (skipped with a warning). A file holds one
//! record or a `[[servers]]` list. When several files declare one `server_id`,
//! the last by file name wins, with a warning naming both files.
//!
//! In lenient mode an invalid file is reported (file and fields) and the other
//! files still load. In strict mode any invalid file, unknown fields included,
//! fails the whole scan, so nothing is written.
//!
//! # Ownership rules
//!
//! A record written from a file gets the source `file:<file name>`; the store
//! keeps the source of the last write, so admin edits take a record over.
//! A rescan, per `server_id`:
//!
//! - **creates** a record a valid file declares and the store lacks;
//! - **updates** a record whose stored source is a file (any file) when the
//!   declared content differs, or when another file now declares it (its
//!   source then moves to that file);
//! - **never touches** a record whose stored source is `admin` or `api`: the
//!   file's declaration is skipped with the warning
//!   `server_id X is managed by admin; <file> ignored`, and the record is
//!   never deleted by a rescan either;
//! - **deletes** a record whose source is `file:<name>` when no valid file
//!   declares its `server_id` any more and `<name>` is either gone or valid
//!   (a valid file that stopped declaring a record has dropped it);
//! - **keeps** a record whose source is `file:<name>` while `<name>` is
//!   present but invalid (lenient mode): a typo must neither delete servers nor
//!   hand them to another file. So when `<name>` sorts after the valid file now
//!   declaring the same `server_id` (and so would have won), that declaration
//!   is skipped too; when `<name>` sorts before it, the later file wins as it
//!   would anyway.
//!
//! Writes carry the revision the plan saw (`expected_revision`), so a record
//! edited by an admin between [`plan`] and [`apply`] fails with a conflict for
//! that record alone instead of being overwritten.
//!
//! `policies.d` ([`policies`]) reads its files the same way and follows the
//! same rules per kind and name, except that a name defined by two files
//! makes the later file invalid rather than overriding.

mod plan;
pub mod policies;
mod scan;

use std::path::{Path, PathBuf};

use quiver_model::Strictness;
use quiver_store::{Store, StoreError};

pub use plan::{Action, ApplyReport, Plan, apply, plan};
pub use scan::{FileError, FileRecord, Scan, scan};

/// Why a bootstrap step failed as a whole.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// The directory itself could not be read.
    #[error("cannot read directory {}: {source}", path.display())]
    Io {
        /// The directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Strict mode: at least one file is invalid, so nothing was loaded.
    #[error("{}", display_invalid(dir, errors))]
    Invalid {
        /// The directory.
        dir: PathBuf,
        /// Every invalid file, in file-name order.
        errors: Vec<FileError>,
    },
    /// The store could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn display_invalid(dir: &Path, errors: &[FileError]) -> String {
    let mut text = format!("{} invalid file(s)", errors.len());
    for (i, error) in errors.iter().enumerate() {
        text.push_str(if i == 0 { ": " } else { "; " });
        text.push_str(&error.display_in(dir));
    }
    text
}

/// Scans `dir`, plans against `store` and applies the plan as `actor`.
///
/// Scan warnings and per-file errors are logged here; they are also returned
/// in the [`Scan`] for callers that show them (admin rescan).
pub async fn reconcile(
    store: &dyn Store,
    dir: &Path,
    strictness: Strictness,
    actor: &str,
) -> Result<(Scan, ApplyReport), BootstrapError> {
    let scanned = logged_scan(MCP_D, dir, scan(dir, strictness))?;
    let planned = plan(store, &scanned).await?;
    let report = apply(store, &planned, actor).await?;
    log_reconciled(MCP_D, dir, &scanned, planned.revision, &report);
    Ok((scanned, report))
}

/// How logs name the `mcp.d` directory.
const MCP_D: &str = "mcp.d";

/// `scanned` with its warnings and invalid files logged (`what` names the
/// kind of directory).
pub(crate) fn logged_scan<R>(
    what: &str,
    dir: &Path,
    scanned: Result<Scan<R>, BootstrapError>,
) -> Result<Scan<R>, BootstrapError> {
    let scanned = match scanned {
        Ok(scanned) => scanned,
        Err(err) => {
            if let BootstrapError::Invalid { errors, .. } = &err {
                log_file_errors(what, dir, errors);
            }
            return Err(err);
        }
    };
    for warning in &scanned.warnings {
        tracing::warn!(dir = %dir.display(), warning = %warning, "{what} scan warning");
    }
    log_file_errors(what, dir, &scanned.errors);
    Ok(scanned)
}

/// Logs what a reconcile of `dir` did: at INFO only when it changed
/// something, since rescans run every few seconds (`quiver dev`) and one
/// that changed nothing is not news.
pub(crate) fn log_reconciled<R>(
    what: &str,
    dir: &Path,
    scanned: &Scan<R>,
    planned_at_revision: u64,
    report: &ApplyReport,
) {
    tracing::debug!(
        dir = %dir.display(),
        files = scanned.files.len(),
        records = scanned.records.len(),
        invalid_files = scanned.errors.len(),
        planned_at_revision,
        "{what} scanned"
    );
    if report.changed_anything() {
        tracing::info!(dir = %dir.display(), report = %report, "{what} reconciled");
    }
}

fn log_file_errors(what: &str, dir: &Path, errors: &[FileError]) {
    for error in errors {
        tracing::warn!(
            dir = %dir.display(),
            file = %error.file,
            fields = ?error.fields,
            error = %error.message,
            "invalid {what} file skipped"
        );
    }
}
