//! `GET /workers`: what each worker last reported, with the head revision
//! it is compared against.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use quiver_model::McpServerSpec;
use serde_json::json;

use crate::auth::Role;
use crate::error::RegistryError;
use crate::rest::extract::RequireReader;
use crate::state::RegistryState;
use crate::workers::WorkerListing;

/// Where quiver-mcp's connection errors append the server's stderr to their
/// message (`initialize failed: …; stderr: line | line`).
const STDERR_MARKER: &str = "; stderr: ";

/// What a non-admin caller reads instead of a server's stderr.
const STDERR_HIDDEN: &str = "(shown to admins only)";

/// What workers last reported. `last_error`s are redacted with the
/// record's secrets; the stderr part of one is for the admin token only.
pub(super) async fn list(
    RequireReader(caller): RequireReader,
    State(state): State<RegistryState>,
) -> Result<Response, RegistryError> {
    // From the in-memory head: the web admin asks every few seconds, and
    // reading every record from the database took ~200 ms at 10 000.
    let head = state.feed.head().await?;
    let admin = caller.role == Role::Admin;
    let workers: Vec<WorkerListing> = state
        .workers
        .list_behind(head.revision)
        .into_iter()
        .map(|mut listing| {
            for server in &mut listing.status.servers {
                if let Some(error) = &mut server.last_error {
                    let record = head.servers.get(server.server_id.as_str());
                    *error = presented_error(error, record.map(|s| &s.spec), admin);
                }
            }
            listing
        })
        .collect();
    Ok(axum::Json(json!({
        "head_revision": head.revision,
        "workers": workers,
    }))
    .into_response())
}

/// An error text about a record's server as a caller may read it: the
/// record's secrets (and URL secrets of any URL) redacted, the stderr part
/// replaced by [`STDERR_HIDDEN`] unless the caller is an admin.
fn presented_error(text: &str, record: Option<&McpServerSpec>, admin: bool) -> String {
    let text = match text.split_once(STDERR_MARKER) {
        Some((message, _)) if !admin => format!("{message}{STDERR_MARKER}{STDERR_HIDDEN}"),
        _ => text.to_owned(),
    };
    match record {
        Some(record) => record.redact(&text),
        None => quiver_model::redact_urls(&text),
    }
}
