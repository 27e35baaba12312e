//! The REST admin API under `/admin/api` (docs/reference.md §5, §15).
//!
//! Bodies use the `mcp.d` field names. Record bodies are parsed strictly
//! (unknown fields are errors) so typos never silently vanish. Errors are JSON
//! `{"error": {"code", "message", "field"?}}` with a fitting status; reads made
//! with the viewer or editor token mask literal env and header values, and so
//! do reads with `?masked=true` (the web admin never holds secrets).
//!
//! Who may call a route is the extractor its handler takes ([`RequireEditor`],
//! [`RequireReader`], …; docs/reference.md §5), never the request's path.
//!
//! Masked values stay masked unless changed: a record written back (upsert,
//! import) or previewed with an env/header value (or a URL secret) that is
//! exactly the mask keeps the stored value of that key
//! ([`RegistryState::upsert_keeping_masked`]).
//!
//! Refusals by the framework itself — a body over [`MAX_BODY_BYTES`], an
//! unknown route, a method a route does not have — are the same JSON error
//! object ([`json_refusals`]); query strings are parsed here ([`Params`]),
//! so a repeated or undecodable parameter is an error naming it.
//!
//! A server's stderr (which may show secrets it printed) reaches the API in
//! workers' `last_error`s and in preview errors: it is shown to the admin
//! token only, and every text that may quote a record has the record's
//! secrets redacted ([`McpServerSpec::redact`]).

use std::collections::HashMap;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use quiver_model::{
    ChangeKind, Format, HistoryEntry, McpServerSpec, Source, StoredServer, Strictness,
    parse_document, parse_record, parse_record_value,
};
use quiver_store::{DeleteRequest, MAX_REVISION, UpsertOutcome, UpsertRequest};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::{Need, Role};
use crate::error::RegistryError;
use crate::preview::{self, EvaluateRequest};
use crate::state::{
    AUDIT_DEFAULT_LIMIT, AUDIT_MAX_LIMIT, AuditQuery, DirRescan, RegistryState, RescanOutcome,
    actor_name,
};
use crate::workers::WorkerListing;

/// Header naming the person behind a write (audit), like the gRPC metadata.
pub const ACTOR_HEADER: &str = "x-quiver-actor";

/// Largest request body of the admin API (records, imports, previews).
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

/// Where quiver-mcp's connection errors append the server's stderr to their
/// message (`initialize failed: …; stderr: line | line`).
const STDERR_MARKER: &str = "; stderr: ";

/// What a non-admin caller reads instead of a server's stderr.
const STDERR_HIDDEN: &str = "(shown to admins only)";

/// Routes of the admin API, to be nested at `/admin/api`.
pub fn router() -> Router<RegistryState> {
    Router::new()
        .route("/whoami", get(whoami))
        .route("/mcp/servers", get(list_servers).post(upsert_server))
        .route("/mcp/servers/{id}", get(get_server).delete(delete_server))
        .route("/mcp/servers/{id}/history", get(server_history))
        .route("/mcp/servers/{id}/rollback", post(rollback_server))
        .route("/mcp/import", post(import))
        .route("/servers/apply", post(apply_servers))
        .route("/mcp/rescan", post(rescan))
        .route("/mcp/preview", post(preview_tools))
        .route("/mcp/evaluate", post(evaluate_tools))
        .route("/workers", get(list_workers))
        .route("/audit", get(audit))
        .merge(crate::approvals::router())
        .merge(crate::access::router())
        .merge(crate::oauth::rest::router())
        .merge(crate::usage::router())
        .merge(crate::server_json_import::router())
        .fallback(unknown_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::map_response(json_refusals))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
}

async fn unknown_route(uri: axum::http::Uri) -> RegistryError {
    RegistryError::NotFound(format!("no admin API route {}", uri.path()))
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> RegistryError {
    RegistryError::MethodNotAllowed(format!(
        "admin API route {} does not take {method}",
        uri.path()
    ))
}

/// Turns a refusal the framework answered in plain text (a body over
/// [`MAX_BODY_BYTES`], a rejected extractor) into the JSON error object;
/// everything else passes unchanged.
async fn json_refusals(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        return RegistryError::PayloadTooLarge(format!(
            "request body is larger than the {} MiB limit of the admin API",
            MAX_BODY_BYTES / (1024 * 1024)
        ))
        .into_response();
    }
    // Rejection texts are short; a longer body is cut, not buffered whole.
    let text = axum::body::to_bytes(response.into_body(), 4096)
        .await
        .map(|body| String::from_utf8_lossy(&body).into_owned())
        .unwrap_or_default();
    let message = if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("refused")
            .to_lowercase()
    } else {
        text.to_lowercase()
    };
    match status {
        StatusCode::NOT_FOUND => RegistryError::NotFound(message),
        StatusCode::METHOD_NOT_ALLOWED => RegistryError::MethodNotAllowed(message),
        s if s.is_client_error() => RegistryError::InvalidArgument {
            field: None,
            message,
        },
        _ => RegistryError::Internal(message),
    }
    .into_response()
}

/// The query parameters of a request. Each name may appear once: a repeated
/// one is an error naming it (which value would win is not the caller's
/// guess to make). Names and values must decode to UTF-8.
pub(crate) struct Params(pub(crate) HashMap<String, String>);

impl<S: Send + Sync> FromRequestParts<S> for Params {
    type Rejection = RegistryError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let mut params = HashMap::new();
        for pair in parts.uri.query().unwrap_or_default().split('&') {
            if pair.is_empty() {
                continue;
            }
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let (Some(name), Some(value)) = (form_decoded(name), form_decoded(value)) else {
                return Err(RegistryError::InvalidArgument {
                    field: None,
                    message: format!("query parameter {pair:?} is not percent-encoded UTF-8"),
                });
            };
            if params.contains_key(&name) {
                return Err(RegistryError::invalid(
                    name.as_str(),
                    format!("query parameter {name:?} is given more than once"),
                ));
            }
            params.insert(name, value);
        }
        Ok(Params(params))
    }
}

/// `application/x-www-form-urlencoded` decoding (`+` is a space, `%XX` a
/// byte); `None` when the bytes are not UTF-8 or an escape is malformed.
fn form_decoded(text: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&byte, tail)) = rest.split_first() {
        rest = tail;
        match byte {
            b'+' => bytes.push(b' '),
            b'%' => {
                let hex = std::str::from_utf8(rest.get(..2)?).ok()?;
                bytes.push(u8::from_str_radix(hex, 16).ok()?);
                rest = &rest[2..];
            }
            other => bytes.push(other),
        }
    }
    String::from_utf8(bytes).ok()
}

/// The authenticated caller of a request, as an extractor below let it
/// through.
pub(crate) struct Caller {
    pub(crate) role: Role,
    pub(crate) actor: String,
    /// `key:<id>` or `oidc:<issuer>#<sub>` when the credential names one.
    pub(crate) principal: Option<String>,
    /// `token`, `key`, `oidc` (a bearer JWT) or `session` (the web admin's
    /// cookie).
    pub(crate) via: &'static str,
}

impl Caller {
    /// Whether reads must mask literal values: always without the admin
    /// role, on request (`?masked=true`) with it.
    fn masks(&self, query: &HashMap<String, String>) -> Result<bool, RegistryError> {
        Ok(self.role != Role::Admin || flag(query, "masked", false)?)
    }
}

/// What a read returns of a record ([`Caller::masks`] says whether masked).
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

/// A `true`/`false` query parameter, `default` when absent.
fn flag(query: &HashMap<String, String>, name: &str, default: bool) -> Result<bool, RegistryError> {
    match query.get(name).map(String::as_str) {
        None => Ok(default),
        Some("true") => Ok(true),
        Some("false") => Ok(false),
        Some(other) => Err(RegistryError::invalid(
            name,
            format!("{other:?} is not true or false"),
        )),
    }
}

/// Declares an extractor that lets through the callers whose role has
/// `$need` and refuses the others (403 `permission_denied` naming the role
/// needed and the one presented). Which extractor a handler takes decides
/// who may call it, never the request's path (docs/reference.md §5).
macro_rules! requirement {
    ($(#[$doc:meta])* $name:ident, $need:expr) => {
        $(#[$doc])*
        #[allow(dead_code, reason = "some routes need only the check, not the caller")]
        pub(crate) struct $name(pub(crate) Caller);

        impl FromRequestParts<RegistryState> for $name {
            type Rejection = RegistryError;

            async fn from_request_parts(
                parts: &mut Parts,
                state: &RegistryState,
            ) -> Result<Self, Self::Rejection> {
                let caller = http_identity(parts, state).await?;
                caller.role.require($need)?;
                Ok($name(caller))
            }
        }
    };
}

requirement!(
    /// The admin role only: OAuth connection writes and Connect.
    RequireAdmin,
    Need::Admin
);
requirement!(
    /// Editor or admin: MCP server record writes, imports, rescans, previews.
    RequireEditor,
    Need::Editor
);
requirement!(
    /// Viewer, editor or admin: what people read that the worker token does
    /// not (OAuth connection status).
    RequireViewer,
    Need::Viewer
);
requirement!(
    /// Viewer, editor, admin or the worker token: record reads (masked
    /// unless admin), history, audit, workers, evaluate.
    RequireReader,
    Need::Reader
);
requirement!(
    /// Approver, viewer, editor or admin: reading approvals.
    RequireApprovalReader,
    Need::ApprovalReader
);
requirement!(
    /// Approver or admin: deciding approvals.
    RequireApprover,
    Need::Approver
);

/// Any authenticated caller, whatever its role: the extractor of `whoami`,
/// which the web admin signs in with.
pub(crate) struct AnyRole(Caller);

impl FromRequestParts<RegistryState> for AnyRole {
    type Rejection = RegistryError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &RegistryState,
    ) -> Result<Self, Self::Rejection> {
        Ok(AnyRole(http_identity(parts, state).await?))
    }
}

/// Who sends an HTTP request: a configured token, an API key or a JWT of
/// an identity provider (`Authorization: Bearer`), else a web admin
/// session cookie. Who acts is the principal when the credential names one
/// (audit names it, not a claimed actor), else the `x-quiver-actor` header,
/// else the name of the token's kind.
pub(crate) async fn http_identity(
    parts: &Parts,
    state: &RegistryState,
) -> Result<Caller, RegistryError> {
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
    let authorization = header(header::AUTHORIZATION.as_str());
    let (role, principal, via) = match authorization {
        None => match crate::signin::session_person(&state.signin, &parts.method, &parts.headers) {
            Some(person) => {
                let person = person?;
                (person.role, Some(person.principal), "session")
            }
            None => {
                let (role, principal) = state.authenticate(None).await?;
                (role, principal, "token")
            }
        },
        Some(_) => {
            let (role, principal) = state.authenticate(authorization).await?;
            let via = match principal.as_deref() {
                Some(p) if p.starts_with("key:") => "key",
                Some(_) => "oidc",
                None => "token",
            };
            (role, principal, via)
        }
    };
    let actor = principal
        .clone()
        .unwrap_or_else(|| actor_name(header(ACTOR_HEADER), role.as_str()));
    Ok(Caller {
        role,
        actor,
        principal,
        via,
    })
}

/// `?expected_revision=N` or `If-Match: "N"`; the query string wins.
pub(crate) fn expected_revision(
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

pub(crate) fn with_etag(status: StatusCode, revision: u64, body: Value) -> Response {
    let mut response = (status, axum::Json(body)).into_response();
    if let Ok(etag) = HeaderValue::from_str(&format!("\"{revision}\"")) {
        response.headers_mut().insert(header::ETAG, etag);
    }
    response
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

async fn whoami(AnyRole(caller): AnyRole) -> Response {
    axum::Json(json!({
        "role": caller.role.as_str(),
        "principal": caller.principal,
        "via": caller.via,
    }))
    .into_response()
}

async fn list_servers(
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

async fn get_server(
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

async fn upsert_server(
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

async fn delete_server(
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

async fn server_history(
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
async fn rollback_server(
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

/// Applies many records in one transaction (`ApplyMcpServers` over REST):
/// `{"servers": [record, …], "expected_revisions": {"id": n, …}?}`. All or
/// nothing; an error names the record (`servers[i]…`, and `index`). A
/// record with masked values keeps the stored values and expects the
/// revision they were read at, so a concurrent change fails the batch
/// instead of being overwritten.
async fn apply_servers(
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
            let outcome_name = match outcome {
                UpsertOutcome::Created(_) => "created",
                UpsertOutcome::Updated(_) => "updated",
                UpsertOutcome::Unchanged(_) => "unchanged",
            };
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

async fn rescan(
    _caller: RequireEditor,
    State(state): State<RegistryState>,
) -> Result<Response, RegistryError> {
    let RescanOutcome { mcp, policies } = state.rescan().await?;
    // mcp.d's outcome at the top level, as before policies.d existed.
    let mut body = mcp.map_or_else(
        || json!({}),
        |mcp| {
            let records = mcp
                .scan
                .records
                .iter()
                .map(|r| json!({"server_id": r.spec.server_id, "file": r.file}))
                .collect();
            rescan_json(&mcp, records, "server_id")
        },
    );
    if let Some(policies) = policies {
        let records = crate::policies_dir::records_json(&policies);
        body["policies"] = rescan_json(&policies, records, "record");
    }
    Ok(axum::Json(body).into_response())
}

/// One directory's rescan: its `records`, file `errors`, `warnings`, the
/// counts, and the `failed` writes with the record under `failed_key`.
fn rescan_json<R>(rescan: &DirRescan<R>, records: Vec<Value>, failed_key: &str) -> Value {
    let DirRescan { scan, report } = rescan;
    json!({
        "records": records,
        "errors": scan.errors.iter().map(|e| json!({"file": e.file, "message": e.message, "fields": e.fields})).collect::<Vec<_>>(),
        "warnings": scan.warnings,
        "created": report.created,
        "updated": report.updated,
        "deleted": report.deleted,
        "unchanged": report.unchanged,
        "skipped": report.skipped,
        "kept": report.kept,
        "failed": report.failed.iter().map(|(record, err)| json!({failed_key: record, "error": err})).collect::<Vec<_>>(),
    })
}

/// Connects to the record's server from the registry and previews its tools
/// (see [`crate::preview`]). Editor or admin: it starts the record's
/// command on the registry host.
async fn preview_tools(
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
async fn evaluate_tools(_caller: RequireReader, body: Bytes) -> Result<Response, RegistryError> {
    let request = EvaluateRequest::parse(&body)?;
    let evaluation = preview::evaluate(&request.record, request.tools.iter().map(String::as_str))?;
    Ok(axum::Json(evaluation).into_response())
}

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
async fn audit(
    _caller: RequireReader,
    State(state): State<RegistryState>,
    Params(query): Params,
) -> Result<Response, RegistryError> {
    let page = state.audit(&audit_query(&query)?).await?;
    Ok(axum::Json(page).into_response())
}

/// What workers last reported. `last_error`s are redacted with the
/// record's secrets; the stderr part of one is for the admin token only.
async fn list_workers(
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
