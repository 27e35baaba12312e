//! `POST /admin/api/import/server-json`: a `server.json` of the official
//! MCP Registry imported as a record (docs/reference.md §5.4). The mapping
//! is `quiver_model::server_json`'s; this route adds the caller's role,
//! `dry_run` and the store write, through the same call as `/mcp/import`.

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use quiver_model::Source;
use quiver_model::server_json::{self, ImportOptions};
use quiver_store::UpsertRequest;
use serde_json::json;

use crate::error::RegistryError;
use crate::rest::extract::{Params, RequireEditor};
use crate::state::RegistryState;

/// The route, merged into the admin API router (its body limit applies).
pub fn router() -> Router<RegistryState> {
    Router::new().route("/import/server-json", post(import_server_json))
}

/// `?dry_run=true|false` (default false), `?choice=remotes[i]|packages[i]`,
/// `?allowed_tools=a,b*`: `{records, inputs, choice, stored, revisions?}`.
/// A refused document is a 400 naming its field; nothing is stored then,
/// nor on a dry run.
async fn import_server_json(
    RequireEditor(caller): RequireEditor,
    State(state): State<RegistryState>,
    Params(query): Params,
    body: Bytes,
) -> Result<Response, RegistryError> {
    let dry_run = match query.get("dry_run").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(RegistryError::invalid(
                "dry_run",
                format!("{other:?} is not true or false"),
            ));
        }
    };
    let choice = match query.get("choice").filter(|c| !c.is_empty()) {
        None => None,
        Some(text) => Some(
            text.parse()
                .map_err(|message: String| RegistryError::invalid("choice", message))?,
        ),
    };
    let allowed_tools = query
        .get("allowed_tools")
        .map(|list| {
            list.split(',')
                .map(str::trim)
                .filter(|pattern| !pattern.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let text = std::str::from_utf8(&body).map_err(|_| RegistryError::InvalidArgument {
        field: None,
        message: "request body is not UTF-8".into(),
    })?;
    let imported = server_json::import(
        text,
        &ImportOptions {
            choice,
            allowed_tools,
        },
    )?;
    let mut answer = json!({
        "records": [&imported.spec],
        "inputs": imported.inputs,
        "choice": imported.choice.to_string(),
        "stored": false,
    });
    if !dry_run {
        let server_id = imported.spec.server_id.clone();
        let outcome = state
            .upsert_keeping_masked(
                UpsertRequest {
                    spec: imported.spec,
                    expected_revision: None,
                    actor: caller.actor,
                    source: Source::Admin,
                },
                caller.role,
            )
            .await?;
        let outcome_name = outcome.as_str();
        answer["stored"] = json!(true);
        answer["revisions"] = json!({&server_id: outcome.server().revision});
        answer["outcomes"] = json!({server_id: outcome_name});
    }
    Ok(axum::Json(answer).into_response())
}
