//! Reconciling the `policies.d` directory (docs/reference.md §4): the
//! policies and identity providers it declares are written as access
//! records (§12.2) at start-up and on every rescan, with `mcp.d` (SIGHUP,
//! the timer, `POST /admin/api/mcp/rescan`). Scanning and planning are
//! [`quiver_bootstrap::policies`]'; this is the registry's side.

use std::path::Path;

use quiver_bootstrap::policies::AccessFileRecord;
use quiver_bootstrap::{ApplyReport, Scan};
use quiver_model::Strictness;
use quiver_store::Store;
use serde_json::{Value, json};

use crate::error::RegistryError;

/// Actor recorded for changes made by `policies.d` rescans.
pub const POLICIES_ACTOR: &str = "policies.d";

/// Reconciles the store with the directory `dir`: what the scan found and
/// what was written. A strict-mode error (or an unreadable directory)
/// writes nothing and is `failed_precondition`, naming the files and fields.
pub(crate) async fn reconcile(
    store: &dyn Store,
    dir: &Path,
    strictness: Strictness,
) -> Result<(Scan<AccessFileRecord>, ApplyReport), RegistryError> {
    let (scan, report) =
        quiver_bootstrap::policies::reconcile(store, dir, strictness, POLICIES_ACTOR)
            .await
            .map_err(|err| RegistryError::FailedPrecondition(err.to_string()))?;
    tracing::debug!(dir = %dir.display(), report = %report, "policies.d rescanned");
    Ok((scan, report))
}

/// The records of a `policies.d` rescan as `POST /admin/api/mcp/rescan`
/// shows them under `policies.records`.
pub(crate) fn records_json(scan: &Scan<AccessFileRecord>) -> Vec<Value> {
    scan.records
        .iter()
        .map(|r| json!({"kind": r.spec.kind(), "name": r.spec.name(), "file": r.file}))
        .collect()
}
