//! `POST /mcp/preview` (connect to a record's server from the registry and
//! list its tools with the record's decisions) and `POST /mcp/evaluate`
//! (the decisions for given tool names, without connecting); the work is
//! [`crate::preview`]'s.

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use quiver_model::{Format, McpServerSpec, Strictness, parse_record};

use crate::error::RegistryError;
use crate::preview::{self, EvaluateRequest};
use crate::rest::extract::{RequireEditor, RequireReader, body_text};
use crate::state::RegistryState;

/// Connects to the record's server from the registry and previews its tools
/// (see [`crate::preview`]). Editor or admin: it starts the record's
/// command on the registry host.
pub(super) async fn preview(
    RequireEditor(caller): RequireEditor,
    State(state): State<RegistryState>,
    body: Bytes,
) -> Result<Response, RegistryError> {
    let spec = parse_record(body_text(&body)?, Format::Json, Strictness::Strict)?.spec;
    let spec = state.restore_masked(spec, caller.role).await?;
    tracing::info!(
        target: "quiver::audit",
        action = "preview",
        server_id = %spec.server_id,
        transport = spec.transport.as_str(),
        actor = %caller.actor,
        "mcp server preview"
    );
    let preview = preview::preview(
        spec.clone(),
        state.preview_env().clone(),
        state.preview_egress().clone(),
        Some(std::sync::Arc::new(state.oauth.clone())),
        state.preview_timeout(),
    )
    .await
    .map_err(|err| redacted(err, &spec))?;
    Ok(axum::Json(preview).into_response())
}

/// The preview's decisions for given tool names, without connecting.
pub(super) async fn evaluate(
    _caller: RequireReader,
    body: Bytes,
) -> Result<Response, RegistryError> {
    let request = EvaluateRequest::parse(&body)?;
    let evaluation = preview::evaluate(&request.record, request.tools.iter().map(String::as_str))?;
    Ok(axum::Json(evaluation).into_response())
}

/// A preview's connection error without the record's secrets, which the
/// server's stderr or a transport error quoting the URL may hold.
fn redacted(err: RegistryError, spec: &McpServerSpec) -> RegistryError {
    let redact_all = |lines: Vec<String>| lines.iter().map(|line| spec.redact(line)).collect();
    match err {
        RegistryError::McpUnavailable {
            message,
            stderr_tail,
        } => RegistryError::McpUnavailable {
            message: spec.redact(&message),
            stderr_tail: redact_all(stderr_tail),
        },
        RegistryError::McpTimeout {
            message,
            stderr_tail,
        } => RegistryError::McpTimeout {
            message: spec.redact(&message),
            stderr_tail: redact_all(stderr_tail),
        },
        other => other,
    }
}
