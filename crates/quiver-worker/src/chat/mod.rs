//! `POST /v1/chat/completions` (SPEC §9): forwards to the configured
//! OpenAI-compatible upstream; with the `mcp` extension enabled, injects the
//! caller's MCP tools and runs the model's calls in the tool loop.
//!
//! Without `mcp.enabled` the request is passed through: the body is sent as
//! the caller wrote it (re-encoded only when `mcp` had to be removed or the
//! task routes the model elsewhere) and the answer comes back unchanged.

mod body;
mod request;
mod stream;
mod tool_loop;
mod tool_message;
mod turn;

use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use quiver_upstream::{Upstream, UpstreamError};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::api::{ApiState, Caller, REQUEST_ID, error_response, request_id, session_id};
use crate::auth::Task;
use crate::call::CallContext;
use crate::catalog::Catalog;

pub use request::{ChatRequest, McpRequest, RequestError};
pub use tool_loop::{CallRecord, LoopReport, StopReason};
pub use tool_message::BUDGET_EXCEEDED;

use stream::{Outgoing, StreamingTurns};
use tool_loop::{ToolLoop, TurnSource};
use turn::Turn;

/// The handler.
pub async fn chat_completions(
    Caller(task): Caller,
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let context = CallContext {
        request_id: request_id(&headers),
        session_id: session_id(&headers),
    };
    let mut response = serve(&state, &task, &context, body).await;
    let status = response.status();
    metrics::counter!("chat_request_total", "status" => status.as_u16().to_string()).increment(1);
    tracing::info!(
        target: "quiver::audit",
        request_id = %context.request_id,
        session_id = context.session_id.as_deref().unwrap_or(""),
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

async fn serve(state: &ApiState, task: &Task, context: &CallContext, raw: Bytes) -> Response {
    let Some(upstream) = state.upstream.clone() else {
        return error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "upstream_not_configured",
            "this worker has no chat upstream (--upstream-url)",
            false,
        );
    };
    let request = match ChatRequest::parse(&raw, task) {
        Ok(request) => request,
        Err(err) => return request_error(&err),
    };
    let Some(mcp) = request.mcp.clone() else {
        let body = if request.rewritten {
            Bytes::from(serde_json::to_vec(&request.body).unwrap_or_default())
        } else {
            raw
        };
        return if request.stream {
            let (tx, rx) = mpsc::channel(64);
            tokio::spawn(stream::pass_through(upstream, body, tx));
            sse_response(rx).await
        } else {
            match upstream.complete(body).await {
                Ok(completion) => axum::Json(completion).into_response(),
                Err(err) => upstream_error(&err),
            }
        };
    };

    let snapshot = state.snapshot.current();
    let catalog = state
        .runner
        .catalog(&snapshot, task, Some(&mcp.session), None)
        .await;
    if let Err(err) = request.check_forced_function(|name| catalog.resolve(name).is_some()) {
        return request_error(&err);
    }
    if let Some(clash) = catalog
        .tools()
        .find(|tool| request.caller_tools.contains(&tool.injected_name))
    {
        return request_error(&RequestError {
            code: quiver_mcp::ErrorCode::InvalidRequest,
            field: "tools".into(),
            message: format!(
                "tools: {:?} is the name of an injected MCP tool; rename the caller's tool",
                clash.injected_name
            ),
        });
    }
    let mut body = request.body.clone();
    tracing::debug!(
        request_id = %context.request_id,
        injected = catalog.len(),
        "mcp tools injected"
    );
    let tool_loop = OwnedLoop {
        state: state.clone(),
        task: task.clone(),
        context: context.clone(),
        catalog,
        request,
        mcp,
    };
    if tool_loop.request.stream {
        // Usage is summed over the turns, so every turn must report it.
        body.insert("stream_options".into(), json!({"include_usage": true}));
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            let closed = tx.clone();
            tokio::select! {
                () = closed.closed() => {}
                () = tool_loop.stream(upstream, body, tx) => {}
            }
        });
        sse_response(rx).await
    } else {
        tool_loop.complete(upstream, body).await
    }
}

/// The state of one MCP-enabled request, owned so a streaming request can
/// run in its own task.
struct OwnedLoop {
    state: ApiState,
    task: Task,
    context: CallContext,
    catalog: Catalog,
    request: ChatRequest,
    mcp: McpRequest,
}

impl OwnedLoop {
    fn tool_loop(&self) -> ToolLoop<'_> {
        ToolLoop {
            runner: &self.state.runner,
            task: &self.task,
            context: &self.context,
            catalog: &self.catalog,
            caller_tools: &self.request.caller_tools,
            budgets: self.mcp.budgets,
        }
    }

    async fn complete(&self, upstream: Upstream, mut body: Map<String, Value>) -> Response {
        let mut source = Completions(upstream);
        match self.tool_loop().run(&mut body, &mut source).await {
            Ok((turn, report)) => {
                log_loop(&self.context, &report);
                axum::Json(final_completion(turn, &report)).into_response()
            }
            Err(err) => upstream_error(&err),
        }
    }

    async fn stream(
        &self,
        upstream: Upstream,
        mut body: Map<String, Value>,
        out: mpsc::Sender<Outgoing>,
    ) {
        let mut source = StreamingTurns::new(upstream, out.clone());
        match self.tool_loop().run(&mut body, &mut source).await {
            Ok((turn, report)) => {
                log_loop(&self.context, &report);
                source
                    .finish(turn, &report, self.request.include_usage)
                    .await;
            }
            Err(err) => {
                let _ = out.send(Outgoing::Failed(err)).await;
            }
        }
    }
}

fn log_loop(context: &CallContext, report: &LoopReport) {
    metrics::histogram!("chat_tool_loop_iterations").record(f64::from(report.iterations));
    tracing::info!(
        target: "quiver::audit",
        request_id = %context.request_id,
        iterations = report.iterations,
        mcp_calls = report.calls.len(),
        stop_reason = ?report.stop_reason,
        "chat tool loop"
    );
}

/// Whole completions.
struct Completions(Upstream);

impl TurnSource for Completions {
    async fn next_turn(&mut self, body: Bytes) -> Result<Turn, UpstreamError> {
        Turn::from_completion(self.0.complete(body).await?)
    }
}

/// The last turn as a completion, with usage summed over the turns and the
/// `mcp` extension.
fn final_completion(turn: Turn, report: &LoopReport) -> Value {
    let mut completion = turn.envelope;
    completion.insert(
        "choices".into(),
        json!([{"index": 0, "message": turn.message, "finish_reason": turn.finish_reason}]),
    );
    if let Some(usage) = &report.usage {
        completion.insert("usage".into(), usage.clone());
    }
    completion.insert(
        "mcp".into(),
        serde_json::to_value(report).unwrap_or(Value::Null),
    );
    Value::Object(completion)
}

/// Waits for the first event: a failure before anything was streamed is an
/// ordinary HTTP error; otherwise the answer is an SSE stream.
async fn sse_response(mut rx: mpsc::Receiver<Outgoing>) -> Response {
    let first = match rx.recv().await {
        Some(Outgoing::Failed(err)) => return upstream_error(&err),
        Some(first) => first,
        None => {
            return error_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the chat request ended without an answer",
                true,
            );
        }
    };
    let events = futures::stream::once(async move { first })
        .chain(ReceiverStream::new(rx))
        .map(|event| {
            let data = match event {
                Outgoing::Chunk(chunk) => chunk.to_string(),
                Outgoing::Done => "[DONE]".to_owned(),
                Outgoing::Failed(err) => error_body(&err).to_string(),
            };
            Ok::<_, std::convert::Infallible>(Bytes::from(format!("data: {data}\n\n")))
        });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(events))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn request_error(err: &RequestError) -> Response {
    (
        err.code.http_status(),
        axum::Json(json!({"error": {
            "code": err.code,
            "message": err.message,
            "field": err.field,
            "type": "invalid_request_error",
            "retryable": false,
        }})),
    )
        .into_response()
}

/// The worker's description of an upstream failure.
fn error_body(err: &UpstreamError) -> Value {
    if let Some((body, _)) = err.provider_body()
        && let Ok(provider @ Value::Object(_)) = serde_json::from_slice::<Value>(body)
    {
        return provider;
    }
    json!({"error": {"code": err.code(), "message": err.to_string(), "type": "upstream_error"}})
}

/// The caller's answer for an upstream failure: the provider's own status
/// and body when it gave one (R-CHAT-6), else a 502/504 of the worker's.
fn upstream_error(err: &UpstreamError) -> Response {
    if let Some((body, content_type)) = err.provider_body() {
        let mut response = Response::new(Body::from(body.clone()));
        *response.status_mut() = err.http_status();
        if let Some(content_type) = content_type {
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, content_type.clone());
        }
        return response;
    }
    (err.http_status(), axum::Json(error_body(err))).into_response()
}
