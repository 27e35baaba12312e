//! `GET /audit`: registry changes of every record (or of one), a page at a
//! time, with the paths of the fields each changed.

use std::collections::HashMap;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use quiver_store::MAX_REVISION;

use crate::audit::{AUDIT_DEFAULT_LIMIT, AUDIT_MAX_LIMIT, AuditQuery};
use crate::error::RegistryError;
use crate::rest::extract::{Params, RequireReader};
use crate::state::RegistryState;

/// `?since_revision=N&limit=M&server_id=X` of the audit trail; any other
/// parameter is an error, so a misspelt one never silently widens the page.
fn audit_query(query: &HashMap<String, String>) -> Result<AuditQuery, RegistryError> {
    if let Some(unknown) = query
        .keys()
        .filter(|k| !matches!(k.as_str(), "since_revision" | "limit" | "server_id"))
        .min()
    {
        return Err(RegistryError::invalid(
            unknown.as_str(),
            format!(
                "unknown query parameter {unknown:?}: expected since_revision, limit or server_id"
            ),
        ));
    }
    let since_revision = match query.get("since_revision") {
        None => None,
        Some(value) => Some(
            value
                .parse::<u64>()
                .ok()
                .filter(|revision| *revision <= MAX_REVISION)
                .ok_or_else(|| {
                    RegistryError::invalid(
                        "since_revision",
                        format!("{value:?} is not a revision number from 0 to {MAX_REVISION}"),
                    )
                })?,
        ),
    };
    let limit = match query.get("limit") {
        None => AUDIT_DEFAULT_LIMIT,
        Some(value) => value
            .parse::<u32>()
            .ok()
            .filter(|limit| (1..=AUDIT_MAX_LIMIT).contains(limit))
            .ok_or_else(|| {
                RegistryError::invalid(
                    "limit",
                    format!("{value:?} is not a number from 1 to {AUDIT_MAX_LIMIT}"),
                )
            })?,
    };
    let server_id = match query.get("server_id") {
        None => None,
        Some(id) if quiver_model::is_valid_server_id(id) => Some(id.clone()),
        Some(id) => {
            return Err(RegistryError::invalid(
                "server_id",
                format!("{id:?} is not a valid server_id"),
            ));
        }
    };
    Ok(AuditQuery {
        since_revision,
        server_id,
        limit,
    })
}

/// Registry changes of every record (or of one), with the paths of the
/// fields each changed; readable with the worker token as it holds no values.
pub(super) async fn audit(
    _caller: RequireReader,
    State(state): State<RegistryState>,
    Params(query): Params,
) -> Result<Response, RegistryError> {
    let page = state.audit(&audit_query(&query)?).await?;
    Ok(axum::Json(page).into_response())
}
