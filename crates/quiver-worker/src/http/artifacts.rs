//! `GET /v1/artifacts/{id}` (docs/reference.md §13.2): an artifact's bytes
//! with their content type, to the caller whose call produced it (its
//! bearer token), or to whoever holds a URL the worker signed for a vision
//! model (`?caller=…&sig=…`). Another caller gets 404, as for an artifact
//! that expired or was evicted; no credential is 401.
//!
//! The worker's origin serves the tool API, so nothing a server produced
//! may run on it: raster images and audio are served inline with their
//! type, anything else (HTML, SVG, XML, …) as an attachment. Every answer
//! carries `Content-Security-Policy: sandbox` (a document it opens has a
//! unique origin and no script) and `X-Content-Type-Options: nosniff`.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use quiver_model::ErrorCode;
use serde::Deserialize;

use crate::error::ErrorObject;
use crate::http::error::ApiError;
use crate::http::extract::{Query, caller_key};
use crate::http::state::ApiState;

/// The query of a signed URL.
#[derive(Deserialize)]
pub struct SignedQuery {
    caller: Option<String>,
    sig: Option<String>,
}

/// `GET /v1/artifacts/{id}`.
pub async fn get(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    Query(query): Query<SignedQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let store = state.runner.artifacts();
    let signed = match (&query.caller, &query.sig) {
        (Some(caller), Some(sig)) if !headers.contains_key(header::AUTHORIZATION) => {
            store.verify(&id, caller, sig)
        }
        _ => None,
    };
    let owner = match signed {
        Some(owner) => owner,
        None => caller_key(&state, &headers).await?,
    };
    let artifact = store.get(owner, &id).ok_or_else(|| {
        ErrorObject::new(
            ErrorCode::NotFound,
            format!("no artifact {id:?} for this caller (it may have expired or been evicted)"),
        )
    })?;
    let inline = artifact.served_inline();
    let content_type = if inline {
        HeaderValue::from_str(&artifact.essence()).ok()
    } else {
        // The declared type, if it is one (`type/subtype`, token
        // characters), for the client that downloads it.
        let essence = artifact.essence();
        let token = |part: &str| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
        };
        essence
            .split_once('/')
            .is_some_and(|(kind, sub)| token(kind) && token(sub))
            .then(|| HeaderValue::from_str(&essence).ok())
            .flatten()
    }
    .unwrap_or(HeaderValue::from_static("application/octet-stream"));
    let disposition = if inline {
        HeaderValue::from_static("inline")
    } else {
        HeaderValue::from_str(&format!(
            "attachment; filename=\"artifact-{}\"",
            artifact.id
        ))
        .unwrap_or(HeaderValue::from_static("attachment"))
    };
    Ok((
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_DISPOSITION, disposition),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static("sandbox"),
            ),
            (
                header::CACHE_CONTROL,
                HeaderValue::from_static("private, max-age=300"),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ],
        artifact.bytes,
    )
        .into_response())
}
