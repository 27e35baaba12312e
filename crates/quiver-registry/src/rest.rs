//! The REST admin API under `/admin/api` (SPEC §5, §15).
//!
//! Bodies use the `mcp.d` field names. Record bodies are parsed strictly
//! (unknown fields are errors) so typos never silently vanish. Errors are JSON
//! `{"error": {"code", "message", "field"?}}` with a fitting status; reads made
//! without the admin token mask literal env and header values.

use std::collections::HashMap;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use quiver_model::{
    ChangeKind, Format, HistoryEntry, Source, StoredServer, Strictness, parse_document,
    parse_record,
};
use quiver_store::{DeleteRequest, UpsertOutcome, UpsertRequest};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::Role;
use crate::error::RegistryError;
use crate::state::{RegistryState, RescanOutcome, actor_name};

/// Header naming the person behind a write (audit), like the gRPC metadata.
pub const ACTOR_HEADER: &str = "x-quiver-actor";

/// Routes of the admin API, to be nested at `/admin/api`.
pub fn router() -> Router<RegistryState> {
    Router::new()
        .route("/mcp/servers", get(list_servers).post(upsert_server))
        .route("/mcp/servers/{id}", get(get_server).delete(delete_server))
        .route("/mcp/servers/{id}/history", get(server_history))
        .route("/mcp/servers/{id}/rollback", post(rollback_server))
        .route("/mcp/import", post(import))
        .route("/mcp/rescan", post(rescan))
        .route("/workers", get(list_workers))
}

/// The authenticated caller of a request.
struct Caller {
    role: Role,
    actor: String,
}

impl Caller {
    fn require_admin(&self) -> Result<(), RegistryError> {
        self.role.require(Role::Admin)
    }

    /// What a read returns of a record for this caller.
    fn present(&self, server: StoredServer) -> StoredServer {
        if self.role == Role::Admin {
            server
        } else {
            StoredServer {
                spec: server.spec.masked(),
                ..server
            }
        }
    }

    fn present_history(&self, entry: HistoryEntry) -> HistoryEntry {
        if self.role == Role::Admin {
            entry
        } else {
            HistoryEntry {
                spec: entry.spec.map(|spec| spec.masked()),
                ..entry
            }
        }
    }
}

impl FromRequestParts<RegistryState> for Caller {
    type Rejection = RegistryError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &RegistryState,
    ) -> Result<Self, Self::Rejection> {
        let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
        let role = state
            .auth
            .authenticate(header(header::AUTHORIZATION.as_str()))?;
        Ok(Caller {
            role,
            actor: actor_name(header(ACTOR_HEADER), "admin"),
        })
    }
}

/// `?expected_revision=N` or `If-Match: "N"`; the query string wins.
fn expected_revision(
    query: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Result<Option<u64>, RegistryError> {
    if let Some(value) = query.get("expected_revision") {
        return value.parse().map(Some).map_err(|_| {
            RegistryError::invalid(
                "expected_revision",
                format!("{value:?} is not a revision number"),
            )
        });
    }
    match headers.get(header::IF_MATCH) {
        None => Ok(None),
        Some(value) => {
            let text = value.to_str().unwrap_or_default().trim();
            let text = text.strip_prefix("W/").unwrap_or(text).trim_matches('"');
            text.parse().map(Some).map_err(|_| {
                RegistryError::invalid("If-Match", format!("{text:?} is not a revision number"))
            })
        }
    }
}

fn body_text(body: &Bytes) -> Result<&str, RegistryError> {
    std::str::from_utf8(body).map_err(|_| RegistryError::InvalidArgument {
        field: None,
        message: "request body is not UTF-8".into(),
    })
}

fn with_etag(status: StatusCode, revision: u64, body: Value) -> Response {
    let mut response = (status, axum::Json(body)).into_response();
    if let Ok(etag) = HeaderValue::from_str(&format!("\"{revision}\"")) {
        response.headers_mut().insert(header::ETAG, etag);
    }
    response
}

fn upsert_response(outcome: UpsertOutcome) -> Response {
    let status = match outcome {
        UpsertOutcome::Created(_) => StatusCode::CREATED,
        UpsertOutcome::Updated(_) | UpsertOutcome::Unchanged(_) => StatusCode::OK,
    };
    let unchanged = matches!(outcome, UpsertOutcome::Unchanged(_));
    let server = outcome.into_server();
    let mut body = json!(server);
    body["unchanged"] = json!(unchanged);
    with_etag(status, server.revision, body)
}

async fn list_servers(
    caller: Caller,
    State(state): State<RegistryState>,
) -> Result<Response, RegistryError> {
    let snapshot = state.store.list().await?;
    let servers: Vec<_> = snapshot
        .servers
        .into_iter()
        .map(|s| caller.present(s))
        .collect();
    Ok(axum::Json(json!({"revision": snapshot.revision, "servers": servers})).into_response())
}

async fn get_server(
    caller: Caller,
    State(state): State<RegistryState>,
    Path(id): Path<String>,
) -> Result<Response, RegistryError> {
    let server = state
        .store
        .get(&id)
        .await?
        .ok_or_else(|| RegistryError::NotFound(format!("mcp server {id:?} not found")))?;
    let revision = server.revision;
    Ok(with_etag(
        StatusCode::OK,
        revision,
        json!(caller.present(server)),
    ))
}

async fn upsert_server(
    caller: Caller,
    State(state): State<RegistryState>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, RegistryError> {
    caller.require_admin()?;
    let expected_revision = expected_revision(&query, &headers)?;
    let spec = parse_record(body_text(&body)?, Format::Json, Strictness::Strict)?.spec;
    let outcome = state
        .upsert(UpsertRequest {
            spec,
            expected_revision,
            actor: caller.actor,
            source: Source::Admin,
        })
        .await?;
    Ok(upsert_response(outcome))
}

async fn delete_server(
    caller: Caller,
    State(state): State<RegistryState>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, RegistryError> {
    caller.require_admin()?;
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

async fn server_history(
    caller: Caller,
    State(state): State<RegistryState>,
    Path(id): Path<String>,
) -> Result<Response, RegistryError> {
    let entries: Vec<_> = state
        .history(&id)
        .await?
        .into_iter()
        .map(|entry| caller.present_history(entry))
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
async fn rollback_server(
    caller: Caller,
    State(state): State<RegistryState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, RegistryError> {
    caller.require_admin()?;
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
    Ok(upsert_response(outcome))
}

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
async fn import(
    caller: Caller,
    State(state): State<RegistryState>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, RegistryError> {
    caller.require_admin()?;
    let text = body_text(&body)?;
    let format = import_format(&query, &headers, text)?;
    let strictness = match query.get("strict").map(String::as_str) {
        None | Some("true") => Strictness::Strict,
        Some("false") => Strictness::Lenient,
        Some(other) => {
            return Err(RegistryError::invalid(
                "strict",
                format!("{other:?} is not true or false"),
            ));
        }
    };
    let records = parse_document(text, format, strictness)?;
    let mut results = Vec::with_capacity(records.len());
    for record in records {
        let server_id = record.spec.server_id.clone();
        let result = state
            .upsert(UpsertRequest {
                spec: record.spec,
                expected_revision: None,
                actor: caller.actor.clone(),
                source: Source::Admin,
            })
            .await;
        results.push(match result {
            Ok(outcome) => {
                let outcome_name = match outcome {
                    UpsertOutcome::Created(_) => "created",
                    UpsertOutcome::Updated(_) => "updated",
                    UpsertOutcome::Unchanged(_) => "unchanged",
                };
                json!({"server_id": server_id, "outcome": outcome_name, "revision": outcome.server().revision,
                       "ignored_fields": record.ignored_fields})
            }
            Err(err) => json!({"server_id": server_id, "outcome": "failed", "error": err.to_string()}),
        });
    }
    Ok(axum::Json(json!({"results": results})).into_response())
}

async fn rescan(
    caller: Caller,
    State(state): State<RegistryState>,
) -> Result<Response, RegistryError> {
    caller.require_admin()?;
    let RescanOutcome { scan, report } = state.rescan().await?;
    Ok(axum::Json(json!({
        "records": scan.records.iter().map(|r| json!({"server_id": r.spec.server_id, "file": r.file})).collect::<Vec<_>>(),
        "errors": scan.errors.iter().map(|e| json!({"file": e.file, "message": e.message, "fields": e.fields})).collect::<Vec<_>>(),
        "warnings": scan.warnings,
        "created": report.created,
        "updated": report.updated,
        "deleted": report.deleted,
        "unchanged": report.unchanged,
        "skipped": report.skipped,
        "kept": report.kept,
        "failed": report.failed.iter().map(|(id, err)| json!({"server_id": id, "error": err})).collect::<Vec<_>>(),
    }))
    .into_response())
}

async fn list_workers(_caller: Caller, State(state): State<RegistryState>) -> Response {
    axum::Json(json!({"workers": state.workers.list()})).into_response()
}
