//! `POST /mcp/rescan`: re-reads `mcp.d` and `policies.d` and answers what
//! each directory's reconciliation did.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::error::RegistryError;
use crate::rest::extract::RequireEditor;
use crate::state::{DirRescan, RegistryState, RescanOutcome};

pub(super) async fn rescan(
    _caller: RequireEditor,
    State(state): State<RegistryState>,
) -> Result<Response, RegistryError> {
    let RescanOutcome { mcp, policies } = state.rescan().await?;
    // mcp.d's outcome at the top level, as before policies.d existed.
    let mut body = mcp.map_or_else(
        || json!({}),
        |mcp| {
            let records = mcp
                .scan
                .records
                .iter()
                .map(|r| json!({"server_id": r.spec.server_id, "file": r.file}))
                .collect();
            rescan_json(&mcp, records, "server_id")
        },
    );
    if let Some(policies) = policies {
        let records = crate::policies_dir::records_json(&policies.scan);
        body["policies"] = rescan_json(&policies, records, "record");
    }
    Ok(axum::Json(body).into_response())
}

/// One directory's rescan: its `records`, file `errors`, `warnings`, the
/// counts, and the `failed` writes with the record under `failed_key`.
fn rescan_json<R>(rescan: &DirRescan<R>, records: Vec<Value>, failed_key: &str) -> Value {
    let DirRescan { scan, report } = rescan;
    json!({
        "records": records,
        "errors": scan.errors.iter().map(|e| json!({"file": e.file, "message": e.message, "fields": e.fields})).collect::<Vec<_>>(),
        "warnings": scan.warnings,
        "created": report.created,
        "updated": report.updated,
        "deleted": report.deleted,
        "unchanged": report.unchanged,
        "skipped": report.skipped,
        "kept": report.kept,
        "failed": report.failed.iter().map(|(record, err)| json!({failed_key: record, "error": err})).collect::<Vec<_>>(),
    })
}
