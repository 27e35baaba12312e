//! Bootstrap of policies and identity providers (docs/reference.md §12.2)
//! from a `policies.d` directory (§4), so a fleet's callers can be described
//! in files next to its servers.
//!
//! # Files
//!
//! The files of `mcp.d`'s rules (crate docs: direct children named
//! `*.toml` or `*.json`, byte order of names, hidden and editor files
//! ignored, symlinks never followed). A file holds any number of named
//! policies and identity providers:
//!
//! ```toml
//! [policies.team-a]              # the fields of a worker's [tasks.<name>]
//! allowed_server_ids = ["github"]
//! tool_denylist = ["github.*delete*"]
//!
//! [[identity_providers]]         # the fields of PUT /identity/providers/{name}
//! name = "corp"
//! issuer = "https://idp.example.com"
//! audiences = ["quiver"]
//! rules = [{ claim = "groups", contains = "team-a", policy = "team-a" }]
//! ```
//!
//! (JSON: `{"policies": {"team-a": {…}}, "identity_providers": [{…}]}`.)
//! API keys are never read from files: a key's secret is made by the
//! registry and shown once.
//!
//! Records are validated as the REST API validates them; errors name the
//! file and the field (`10-teams.toml: policies.team-a.tool_denylist[0]:
//! …`). A name (or a provider's issuer) defined by two files makes the
//! later file invalid, the error naming both. Unknown fields are errors in
//! strict mode and dropped with a warning otherwise, as in `mcp.d`.
//!
//! # Ownership
//!
//! As for `mcp.d` servers, per kind and name: a record written from a file
//! has the source `file:<file name>`; an edit over REST takes it over
//! (source `admin`) and rescans then leave it alone; a file-owned record is
//! deleted when no valid file declares it any more, and kept while its file
//! is present but invalid (no other file takes it over meanwhile).
//!
//! # References
//!
//! Provider rules name policies, and the store refuses a rule naming a
//! missing policy or the delete of a policy still named. The plan checks
//! both against the records as they will be: a provider naming a policy
//! that will not exist (or whose issuer another provider keeps) is skipped,
//! naming the field; a policy that keys or remaining providers still name
//! is kept. [`apply`] writes provider deletes, then policies, then
//! providers, then policy deletes.

mod plan;
mod scan;

use std::path::Path;

use quiver_model::Strictness;
use quiver_store::Store;

use crate::{ApplyReport, BootstrapError, log_reconciled, logged_scan};

pub use plan::{AccessAction, PolicyPlan, apply, describe, plan};
pub use scan::{AccessFileRecord, PolicyScan, scan};

/// How logs name the directory.
const POLICIES_D: &str = "policies.d";

/// Scans `dir`, plans against `store` and applies the plan as `actor`
/// (start-up, SIGHUP, periodic and admin rescans). Warnings and per-file
/// errors are logged here and returned in the scan.
pub async fn reconcile(
    store: &dyn Store,
    dir: &Path,
    strictness: Strictness,
    actor: &str,
) -> Result<(PolicyScan, ApplyReport), BootstrapError> {
    let scanned = logged_scan(POLICIES_D, dir, scan(dir, strictness))?;
    let planned = plan(store, &scanned).await?;
    let report = apply(store, &planned, actor).await?;
    log_reconciled(POLICIES_D, dir, &scanned, planned.revision, &report);
    Ok((scanned, report))
}
