//! The direct tool API (docs/reference.md §15): `GET /v1/mcp/tools[?server_ids=a,b]`
//! lists what the caller may use (with `query`, the best matches of a tool
//! search, best first); `POST /v1/mcp/tools/call`
//! `{name, arguments}` runs one tool under the same policy and budgets as
//! chat.

use std::time::Instant;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use quiver_mcp::McpError;
use quiver_mcp::leases::SessionKind;
use quiver_model::ErrorCode;
use quiver_model::policy::{SessionFilter, check_session_within_task};
use quiver_model::tool_search::{DEFAULT_MAX_TOOLS, MAX_TOOLS_LIMIT};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::approval::ApprovalFlow;
use crate::call::{Call, CallContext, CallError, Lookup};
use crate::error::ErrorObject;
use crate::http::error::ApiError;
use crate::http::extract::{Body, Caller, CallerKey, Query, RequestId, SessionId};
use crate::http::state::ApiState;

/// The query of a listing.
#[derive(Deserialize)]
pub struct ToolsQuery {
    server_ids: Option<String>,
    /// Tool search: only the best matches of this text.
    query: Option<String>,
    /// With `query`: how many matches at most.
    limit: Option<u32>,
}

/// The body of `POST /v1/mcp/tools/call`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CallBody {
    /// Injected name (or `mcp.<server_id>.<tool_name>`).
    name: String,
    /// Tool arguments: a JSON object; absent or null means `{}`.
    #[serde(default)]
    arguments: Option<Value>,
    /// An approval of exactly this call, for a tool that needs one
    /// (docs/reference.md §13.7).
    #[serde(default)]
    approval_id: Option<String>,
}

/// `GET /v1/mcp/tools`.
pub async fn list(
    Caller(task): Caller,
    CallerKey(caller): CallerKey,
    State(state): State<ApiState>,
    Query(query): Query<ToolsQuery>,
) -> Result<Response, ApiError> {
    let session = SessionFilter {
        server_ids: query.server_ids.map(|ids| {
            ids.split(',')
                .filter(|id| !id.is_empty())
                .map(str::to_owned)
                .collect()
        }),
        ..Default::default()
    }
    .compile()
    .map_err(|err| ErrorObject::new(ErrorCode::InvalidRequest, err.to_string()))?;
    check_session_within_task(&task.policy, &session)
        .map_err(|err| ErrorObject::new(ErrorCode::McpPolicyDenied, err.to_string()))?;
    let snapshot = state.snapshot.current();
    let catalog = state
        .runner
        .catalog(&snapshot, &task, Some(&caller), Some(&session), None)
        .await;
    let limit = query.limit.unwrap_or(DEFAULT_MAX_TOOLS);
    if !(1..=MAX_TOOLS_LIMIT).contains(&limit) {
        return Err(ErrorObject::new(
            ErrorCode::InvalidRequest,
            format!("limit: {limit} is not between 1 and {MAX_TOOLS_LIMIT}"),
        )
        .with_field("limit")
        .into());
    }
    let all: Vec<_> = catalog.tools().collect();
    let listed: Vec<_> = match &query.query {
        None => all,
        Some(text) => state
            .runner
            .tool_index(&catalog)
            .search(text, limit as usize)
            .into_iter()
            .filter_map(|position| all.get(position).copied())
            .collect(),
    };
    let tools: Vec<Value> = listed
        .into_iter()
        .map(|tool| {
            json!({
                "name": tool.injected_name,
                "server_id": tool.server_id(),
                "tool_name": tool.tool_name(),
                "description": tool.tool.description,
                "input_schema": tool.tool.input_schema,
            })
        })
        .collect();
    Ok(axum::Json(Value::Array(tools)).into_response())
}

/// `POST /v1/mcp/tools/call`.
pub async fn call(
    Caller(task): Caller,
    CallerKey(caller): CallerKey,
    State(state): State<ApiState>,
    RequestId(request_id): RequestId,
    SessionId(session_id): SessionId,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let request: CallBody = serde_json::from_slice(&body).map_err(|err| {
        ErrorObject::new(
            ErrorCode::InvalidRequest,
            format!("body must be {{\"name\": string, \"arguments\": object}}: {err}"),
        )
    })?;
    let started = Instant::now();
    let context = CallContext::new(
        request_id,
        caller,
        &task,
        session_id.map(|id| (SessionKind::Api, id)),
    )
    .keeping_artifacts();
    let snapshot = state.snapshot.current();
    let call = Call {
        name: &request.name,
        arguments: request.arguments,
        lookup: Lookup::Injected {
            snapshot: &snapshot,
            session: None,
        },
        approval: ApprovalFlow::RequestOrUse(request.approval_id.as_deref()),
    };
    let done = state
        .runner
        .call(&task, &context, call)
        .await
        .map_err(|err| {
            // Argument errors may quote the caller's values (secrets among
            // them): their code is logged, their text only goes to the caller.
            let detail = match &err {
                CallError::InvalidArguments(_)
                | CallError::Mcp(McpError::InvalidArguments(_) | McpError::Protocol(_)) => None,
                other => Some(other.to_string()),
            };
            tracing::debug!(name = %request.name, elapsed_ms = started.elapsed().as_millis() as u64, code = err.code().as_str(), error = detail.as_deref(), "tool call failed");
            ErrorObject::from(&err)
        })?;
    let mut body = json!({"content": done.outcome.result.content, "is_error": done.is_error()});
    if let Some(structured) = &done.outcome.result.structured_content {
        body["structured_content"] = structured.clone();
    }
    if let Some(error) = done.error_object() {
        body["error"] = error;
    }
    if done.outcome.output.truncated() {
        body["truncated"] = json!(true);
    }
    if !done.artifacts.is_empty() {
        body["artifacts"] = done.artifacts.iter().map(|a| a.to_json()).collect();
    }
    Ok(axum::Json(body).into_response())
}
