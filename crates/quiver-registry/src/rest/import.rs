//! `POST /mcp/import`: an uploaded `mcp.d` file (TOML or JSON, one record
//! or `[[servers]]`), each record written on its own with its outcome.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use quiver_model::{Format, Source, Strictness, parse_document};
use quiver_store::UpsertRequest;
use serde_json::json;

use crate::error::RegistryError;
use crate::rest::extract::{Params, RequireEditor, body_text, flag};
use crate::state::RegistryState;

/// The syntax of an import body: `?format=`, else the content type, else a sniff.
fn import_format(
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    text: &str,
) -> Result<Format, RegistryError> {
    if let Some(format) = query.get("format") {
        return match format.as_str() {
            "toml" => Ok(Format::Toml),
            "json" => Ok(Format::Json),
            other => Err(RegistryError::invalid(
                "format",
                format!("{other:?} is not toml or json"),
            )),
        };
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if content_type.contains("json") {
        Ok(Format::Json)
    } else if content_type.contains("toml") || !text.trim_start().starts_with(['{', '[']) {
        Ok(Format::Toml)
    } else {
        Ok(Format::Json)
    }
}

/// Imports an uploaded `mcp.d` file (one record or `[[servers]]`): every
/// record is validated before any is written.
pub(super) async fn import(
    RequireEditor(caller): RequireEditor,
    State(state): State<RegistryState>,
    Params(query): Params,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, RegistryError> {
    let text = body_text(&body)?;
    let format = import_format(&query, &headers, text)?;
    let strictness = if flag(&query, "strict", true)? {
        Strictness::Strict
    } else {
        Strictness::Lenient
    };
    let records = parse_document(text, format, strictness)?;
    // Masked values without a stored value to keep are input errors like any
    // other: found before anything is written. The writes below restore
    // again, from whatever is stored by then.
    let several = records.len() > 1;
    for (i, record) in records.iter().enumerate() {
        if record.spec.has_masked_values() {
            state
                .restore_masked(record.spec.clone(), caller.role)
                .await
                .map_err(|err| if several { in_record(err, i) } else { err })?;
        }
    }
    let mut results = Vec::with_capacity(records.len());
    for record in records {
        let server_id = record.spec.server_id.clone();
        let result = state
            .upsert_keeping_masked(
                UpsertRequest {
                    spec: record.spec,
                    expected_revision: None,
                    actor: caller.actor.clone(),
                    source: Source::Admin,
                },
                caller.role,
            )
            .await;
        results.push(match result {
            Ok(outcome) => {
                let outcome_name = outcome.as_str();
                json!({"server_id": server_id, "outcome": outcome_name, "revision": outcome.server().revision,
                       "ignored_fields": record.ignored_fields})
            }
            Err(err) => json!({"server_id": server_id, "outcome": "failed", "error": err.to_string()}),
        });
    }
    Ok(axum::Json(json!({"results": results})).into_response())
}

/// `err` about a field of the `index`-th record of a multi-record document,
/// named the way the parser names such fields (`servers[1].stdio.env.KEY`).
/// A document with one record keeps the plain field name, like the upsert.
fn in_record(err: RegistryError, index: usize) -> RegistryError {
    match err {
        RegistryError::InvalidArgument {
            field: Some(field),
            message,
        } => RegistryError::InvalidArgument {
            field: Some(format!("servers[{index}].{field}")),
            message,
        },
        other => other,
    }
}
