//! `POST /servers/apply`: many records in one transaction, all or nothing.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use quiver_model::{Source, Strictness, parse_record_value};
use quiver_store::UpsertRequest;
use serde_json::{Value, json};

use crate::error::RegistryError;
use crate::rest::extract::{RequireEditor, body_text};
use crate::state::RegistryState;

/// Applies many records in one transaction (`ApplyMcpServers` over REST):
/// `{"servers": [record, …], "expected_revisions": {"id": n, …}?}`. All or
/// nothing; an error names the record (`servers[i]…`, and `index`). A
/// record with masked values keeps the stored values and expects the
/// revision they were read at, so a concurrent change fails the batch
/// instead of being overwritten.
pub(super) async fn apply(
    RequireEditor(caller): RequireEditor,
    State(state): State<RegistryState>,
    body: Bytes,
) -> Result<Response, RegistryError> {
    let body: Value =
        serde_json::from_str(body_text(&body)?).map_err(|err| RegistryError::InvalidArgument {
            field: None,
            message: format!("request body is not JSON: {err}"),
        })?;
    let Value::Object(mut body) = body else {
        return Err(RegistryError::InvalidArgument {
            field: None,
            message: "expected an object with \"servers\"".into(),
        });
    };
    let records = match body.remove("servers") {
        Some(Value::Array(records)) => records,
        _ => {
            return Err(RegistryError::invalid(
                "servers",
                "expected an array of records",
            ));
        }
    };
    let expected: HashMap<String, u64> = match body.remove("expected_revisions") {
        None | Some(Value::Null) => HashMap::new(),
        Some(value) => serde_json::from_value(value).map_err(|err| {
            RegistryError::invalid(
                "expected_revisions",
                format!("expected an object of revision numbers: {err}"),
            )
        })?,
    };
    if let Some(key) = body.keys().next() {
        return Err(RegistryError::invalid(key.clone(), "unknown field"));
    }
    let mut requests = Vec::with_capacity(records.len());
    for (index, value) in records.into_iter().enumerate() {
        let spec = parse_record_value(value, Strictness::Strict)
            .map_err(|err| RegistryError::from(err).in_record(index))?
            .spec;
        let mut expected_revision = expected.get(&spec.server_id).copied();
        let spec = if spec.has_masked_values() {
            let stored = state
                .store
                .get(&spec.server_id)
                .await
                .map_err(|err| RegistryError::from(err).in_record(index))?;
            let current = stored.as_ref().map_or(0, |s| s.revision);
            expected_revision = Some(expected_revision.unwrap_or(current));
            let mut spec = spec;
            crate::state::keep_masked(&mut spec, stored.as_ref().map(|s| &s.spec), caller.role)
                .map_err(|err| err.in_record(index))?;
            spec
        } else {
            spec
        };
        requests.push(UpsertRequest {
            spec,
            expected_revision,
            actor: caller.actor.clone(),
            source: Source::Admin,
        });
    }
    if let Some(id) = expected
        .keys()
        .find(|id| !requests.iter().any(|r| &r.spec.server_id == *id))
    {
        return Err(RegistryError::invalid(
            format!("expected_revisions.{id}"),
            "names no record of the batch",
        ));
    }
    let outcomes = state.apply(requests).await?;
    let (first_revision, last_revision) = crate::state::revision_range(&outcomes);
    let results: Vec<Value> = outcomes
        .iter()
        .map(|outcome| {
            let outcome_name = outcome.as_str();
            let server = outcome.server();
            json!({"server_id": server.spec.server_id, "outcome": outcome_name, "revision": server.revision})
        })
        .collect();
    Ok(axum::Json(json!({
        "first_revision": first_revision,
        "last_revision": last_revision,
        "results": results,
    }))
    .into_response())
}
