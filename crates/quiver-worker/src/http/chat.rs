//! `POST /v1/chat/completions` (docs/reference.md §9): the edge of
//! [`crate::chat`] — a completion as JSON, a stream as server-sent events,
//! an upstream's own refusal forwarded with its status and body.

use std::time::Instant;

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;

use crate::call::CallContext;
use crate::chat::{Chat, ChatAnswer, ChatError, ChatStream};
use crate::error::ErrorObject;
use crate::http::error::ApiError;
use crate::http::extract::{Body, Caller, CallerKey, REQUEST_ID, RequestId, SessionId};
use crate::http::state::ApiState;

/// The handler; every answer carries the request id.
pub async fn completions(
    Caller(task): Caller,
    CallerKey(caller): CallerKey,
    State(state): State<ApiState>,
    RequestId(request_id): RequestId,
    SessionId(session_id): SessionId,
    Body(body): Body,
) -> Response {
    let started = Instant::now();
    let context = CallContext::new(
        request_id,
        caller,
        &task,
        session_id.map(|id| (quiver_mcp::leases::SessionKind::Api, id)),
    )
    .keeping_artifacts();
    let chat = Chat {
        snapshot: state.snapshot,
        runner: state.runner,
        upstream: state.upstream,
    };
    let mut response = match chat.serve(&task, &context, body).await {
        Ok(ChatAnswer::Completion(completion)) => axum::Json(completion).into_response(),
        Ok(ChatAnswer::Stream(stream)) => event_stream(stream),
        Err(err) => error_response(err),
    };
    let status = response.status();
    metrics::counter!("chat_request_total", "status" => status.as_u16().to_string()).increment(1);
    tracing::info!(
        target: "quiver::audit",
        request_id = %context.request_id,
        session_id = context.session_id(),
        task = %task.name,
        status = status.as_u16(),
        duration_ms = started.elapsed().as_millis() as u64,
        "chat request"
    );
    if let Ok(id) = HeaderValue::from_str(&context.request_id) {
        response.headers_mut().insert(REQUEST_ID, id);
    }
    response
}

/// A streamed answer as `text/event-stream`.
fn event_stream(stream: ChatStream) -> Response {
    let events = stream.events().map(|event| {
        Ok::<_, std::convert::Infallible>(Bytes::from(format!("data: {}\n\n", event.data())))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(axum::body::Body::from_stream(events))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// A failed request: the provider's own status and body when it gave one
/// (an upstream refusal is the caller's to read), else the error object.
fn error_response(err: ChatError) -> Response {
    if let ChatError::Upstream(upstream) = &err
        && let Some((body, content_type)) = upstream.provider_body()
    {
        let mut response = Response::new(axum::body::Body::from(body.clone()));
        *response.status_mut() = upstream.http_status();
        if let Some(content_type) = content_type {
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, content_type.clone());
        }
        return response;
    }
    ApiError::from(ErrorObject::from(&err)).into_response()
}
