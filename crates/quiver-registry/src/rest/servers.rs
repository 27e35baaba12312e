//! MCP server records: `GET`/`POST /mcp/servers`, `GET`/`DELETE
//! /mcp/servers/{id}`, `GET …/history` and `POST …/rollback`. Reads are
//! masked unless the caller is an admin who did not ask for masking
//! ([`Caller::masks`](crate::rest::Caller::masks)); a single record carries
//! its revision as the `ETag`.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use quiver_model::{
    ChangeKind, Format, HistoryEntry, Source, StoredServer, Strictness, parse_record,
};
use quiver_store::{DeleteRequest, UpsertOutcome, UpsertRequest};
use serde::Deserialize;
use serde_json::json;

use crate::error::RegistryError;
use crate::rest::extract::{Params, RequireEditor, RequireReader, body_text};
use crate::rest::revision::{expected_revision, with_etag};
use crate::state::RegistryState;

/// What a read returns of a record ([`Caller::masks`](crate::rest::Caller::masks)
/// says whether masked).
fn present(server: StoredServer, masked: bool) -> StoredServer {
    if masked {
        StoredServer {
            spec: server.spec.masked(),
            ..server
        }
    } else {
        server
    }
}

fn present_history(entry: HistoryEntry, masked: bool) -> HistoryEntry {
    if masked {
        HistoryEntry {
            spec: entry.spec.map(|spec| spec.masked()),
            ..entry
        }
    } else {
        entry
    }
}

/// The written record; masked like a read when the caller asks for it.
fn upsert_response(outcome: UpsertOutcome, masked: bool) -> Response {
    let status = match outcome {
        UpsertOutcome::Created(_) => StatusCode::CREATED,
        UpsertOutcome::Updated(_) | UpsertOutcome::Unchanged(_) => StatusCode::OK,
    };
    let unchanged = matches!(outcome, UpsertOutcome::Unchanged(_));
    let server = present(outcome.into_server(), masked);
    let mut body = json!(server);
    body["unchanged"] = json!(unchanged);
    with_etag(status, server.revision, body)
}

pub(super) async fn list(
    RequireReader(caller): RequireReader,
    State(state): State<RegistryState>,
    Params(query): Params,
) -> Result<Response, RegistryError> {
    let masked = caller.masks(&query)?;
    // From the in-memory head, encoded once per revision.
    let head = state.feed.head().await?;
    Ok((
        [(header::CONTENT_TYPE, "application/json")],
        head.rest_list(masked),
    )
        .into_response())
}

pub(super) async fn get(
    RequireReader(caller): RequireReader,
    State(state): State<RegistryState>,
    Path(id): Path<String>,
    Params(query): Params,
) -> Result<Response, RegistryError> {
    let masked = caller.masks(&query)?;
    let server = state
        .store
        .get(&id)
        .await?
        .ok_or_else(|| RegistryError::NotFound(format!("mcp server {id:?} not found")))?;
    let revision = server.revision;
    Ok(with_etag(
        StatusCode::OK,
        revision,
        json!(present(server, masked)),
    ))
}

pub(super) async fn upsert(
    RequireEditor(caller): RequireEditor,
    State(state): State<RegistryState>,
    Params(query): Params,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, RegistryError> {
    let expected_revision = expected_revision(&query, &headers)?;
    let masked = caller.masks(&query)?;
    let spec = parse_record(body_text(&body)?, Format::Json, Strictness::Strict)?.spec;
    let outcome = state
        .upsert_keeping_masked(
            UpsertRequest {
                spec,
                expected_revision,
                actor: caller.actor,
                source: Source::Admin,
            },
            caller.role,
        )
        .await?;
    Ok(upsert_response(outcome, masked))
}

pub(super) async fn delete(
    RequireEditor(caller): RequireEditor,
    State(state): State<RegistryState>,
    Path(id): Path<String>,
    Params(query): Params,
    headers: HeaderMap,
) -> Result<Response, RegistryError> {
    let revision = state
        .delete(DeleteRequest {
            server_id: id,
            expected_revision: expected_revision(&query, &headers)?,
            actor: caller.actor,
            source: Source::Admin,
        })
        .await?;
    Ok(axum::Json(json!({"revision": revision})).into_response())
}

pub(super) async fn history(
    RequireReader(caller): RequireReader,
    State(state): State<RegistryState>,
    Path(id): Path<String>,
    Params(query): Params,
) -> Result<Response, RegistryError> {
    let masked = caller.masks(&query)?;
    let entries: Vec<_> = state
        .history(&id)
        .await?
        .into_iter()
        .map(|entry| present_history(entry, masked))
        .collect();
    Ok(axum::Json(json!({"server_id": id, "entries": entries})).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RollbackBody {
    revision: u64,
    #[serde(default)]
    expected_revision: Option<u64>,
}

/// Re-applies the content of an earlier revision as a new upsert (R-STORE-5).
pub(super) async fn rollback(
    RequireEditor(caller): RequireEditor,
    State(state): State<RegistryState>,
    Path(id): Path<String>,
    Params(query): Params,
    body: Bytes,
) -> Result<Response, RegistryError> {
    let masked = caller.masks(&query)?;
    let request: RollbackBody =
        serde_json::from_slice(&body).map_err(|err| RegistryError::InvalidArgument {
            field: Some("revision".into()),
            message: format!("rollback body must be {{\"revision\": N}}: {err}"),
        })?;
    let entry = state
        .history(&id)
        .await?
        .into_iter()
        .find(|entry| entry.revision == request.revision)
        .ok_or_else(|| {
            RegistryError::NotFound(format!(
                "mcp server {id:?} has no revision {}",
                request.revision
            ))
        })?;
    let spec = match (entry.kind, entry.spec) {
        (ChangeKind::Upsert, Some(spec)) => spec,
        _ => {
            return Err(RegistryError::invalid(
                "revision",
                format!(
                    "revision {} is a delete; roll back to an earlier revision",
                    request.revision
                ),
            ));
        }
    };
    let outcome = state
        .upsert(UpsertRequest {
            spec,
            expected_revision: request.expected_revision,
            actor: caller.actor,
            source: Source::Admin,
        })
        .await?;
    Ok(upsert_response(outcome, masked))
}
