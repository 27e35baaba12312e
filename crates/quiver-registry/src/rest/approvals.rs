//! `/approvals`, `/approvals/{id}` (docs/reference.md §13.7): approvers
//! list, read and decide approvals; the approvals themselves are
//! [`crate::approvals`]'.

use std::collections::HashMap;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use quiver_model::approval::{Approval, ApprovalDecision, ApprovalState, masked_arguments};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::RegistryError;
use crate::rest::extract::{ACTOR_HEADER, Params, RequireApprovalReader, RequireApprover};
use crate::state::RegistryState;

/// Arguments (as masked JSON text) longer than this are summarised in
/// lists: a preview of this many bytes, their size and hash; `GET` of one
/// approval shows them whole.
const LIST_ARGUMENTS_BYTES: usize = 4096;

/// Approvals a list returns when the caller names no limit, and at most.
const LIST_DEFAULT_LIMIT: u32 = 200;
const LIST_MAX_LIMIT: u32 = 1000;

/// Routes of the approvals API, merged into the admin API at `/admin/api`.
pub fn router() -> Router<RegistryState> {
    Router::new()
        .route("/approvals", get(list))
        .route("/approvals/{id}", get(show).post(decide))
}

/// Who decides is the authenticated credential's role (`decided_by`:
/// `approver` or `admin`); the client's `x-quiver-actor` header is only a
/// display note in the audit line, never the identity.
fn display_note(headers: &HeaderMap) -> String {
    crate::state::actor_name(headers.get(ACTOR_HEADER).and_then(|v| v.to_str().ok()), "")
}

/// An approval as the REST API shows it: arguments with secret-looking
/// keys masked (approvers decide on what the call does, not on secrets).
fn presented(approval: &Approval) -> Value {
    let mut body = json!(approval);
    body["arguments"] = masked_arguments(&approval.arguments);
    body
}

/// An approval as a list shows it: like [`presented`], but arguments whose
/// masked JSON is over [`LIST_ARGUMENTS_BYTES`] are summarised:
/// `arguments` null, `arguments_preview` (their first bytes, cut at a
/// character boundary), `arguments_bytes` and the `arguments_hash` every
/// approval carries; `arguments_truncated` says which.
fn listed(approval: &Approval) -> Value {
    let mut body = presented(approval);
    let text = body["arguments"].to_string();
    let truncated = text.len() > LIST_ARGUMENTS_BYTES;
    if truncated {
        let mut end = LIST_ARGUMENTS_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        body["arguments"] = Value::Null;
        body["arguments_preview"] = json!(&text[..end]);
        body["arguments_bytes"] = json!(text.len());
    }
    body["arguments_truncated"] = json!(truncated);
    body
}

fn list_query(
    query: &HashMap<String, String>,
) -> Result<(Option<ApprovalState>, u32), RegistryError> {
    let state = match query.get("state").map(String::as_str) {
        None | Some("" | "all") => None,
        Some(name) => Some(
            name.parse::<ApprovalState>()
                .map_err(|err| RegistryError::invalid("state", err.to_string()))?,
        ),
    };
    let limit = match query.get("limit") {
        None => LIST_DEFAULT_LIMIT,
        Some(text) => text
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=LIST_MAX_LIMIT).contains(n))
            .ok_or_else(|| {
                RegistryError::invalid("limit", format!("must be 1 to {LIST_MAX_LIMIT}"))
            })?,
    };
    Ok((state, limit))
}

async fn list(
    _caller: RequireApprovalReader,
    State(state): State<RegistryState>,
    Params(query): Params,
) -> Result<Response, RegistryError> {
    let (filter, limit) = list_query(&query)?;
    let approvals = state.approvals(filter, limit).await?;
    let approvals: Vec<Value> = approvals.iter().map(listed).collect();
    Ok(axum::Json(json!({"approvals": approvals})).into_response())
}

async fn show(
    _caller: RequireApprovalReader,
    State(state): State<RegistryState>,
    Path(id): Path<String>,
) -> Result<Response, RegistryError> {
    let approval = state.approval(&id).await?;
    Ok(axum::Json(presented(&approval)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionBody {
    decision: ApprovalDecision,
    #[serde(default)]
    note: Option<String>,
}

async fn decide(
    RequireApprover(caller): RequireApprover,
    State(state): State<RegistryState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, RegistryError> {
    let body: DecisionBody = serde_json::from_slice(&body).map_err(|err| {
        RegistryError::invalid(
            "decision",
            format!("expected {{\"decision\": \"approve\" | \"deny\", \"note\"?}}: {err}"),
        )
    })?;
    let approval = state
        .decide_approval(
            &id,
            body.decision,
            caller.role.as_str(),
            &display_note(&headers),
            body.note,
        )
        .await?;
    Ok(axum::Json(presented(&approval)).into_response())
}
