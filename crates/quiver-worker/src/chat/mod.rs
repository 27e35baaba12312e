//! Chat completions with MCP tools (docs/reference.md §9): forwards to the
//! configured OpenAI-compatible upstream; with the `mcp` extension enabled,
//! injects the caller's MCP tools and runs the model's calls in the tool loop.
//!
//! Without `mcp.enabled` the request is passed through: the body is sent as
//! the caller wrote it (re-encoded only when `mcp` had to be removed or the
//! task routes the model elsewhere) and the answer comes back unchanged.
//!
//! Domain code: it answers with a [`ChatAnswer`] or a [`ChatError`]; the HTTP
//! edge (`crate::http`) turns them into responses.

mod body;
mod request;
mod search;
mod stream;
mod tool_loop;
mod tool_message;
mod turn;
mod vision;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use quiver_model::ErrorCode;
use quiver_sync::SnapshotHandle;
use quiver_upstream::{Upstream, UpstreamError};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::approval::ApprovalSet;
use crate::auth::Task;
use crate::call::{CallContext, ToolRunner};
use crate::catalog::Catalog;
use crate::error::ErrorObject;
use crate::tool_search::SEARCH_FUNCTION;

pub use request::{ChatRequest, McpRequest, RequestError};
pub use stream::Outgoing;
pub use tool_loop::{CallRecord, LoopReport, StopReason};
pub use tool_message::BUDGET_EXCEEDED;

use search::ToolSearch;
use stream::StreamingTurns;
use tool_loop::{ToolLoop, TurnSource};
use turn::Turn;

/// What a chat request needs: the registry snapshot, the tool runner and
/// the upstream.
#[derive(Clone)]
pub struct Chat {
    /// The registry snapshot.
    pub snapshot: SnapshotHandle,
    /// Runs the model's MCP calls.
    pub runner: ToolRunner,
    /// The OpenAI-compatible upstream, when configured.
    pub upstream: Option<Upstream>,
}

/// A chat request's answer.
pub enum ChatAnswer {
    /// A whole completion.
    Completion(Value),
    /// A stream of events whose first one is not a failure.
    Stream(ChatStream),
}

/// The events of a streamed answer, in order; it ends with
/// [`Outgoing::Done`] or an [`Outgoing::Failed`] (mid-stream failure).
pub struct ChatStream {
    first: Outgoing,
    rest: mpsc::Receiver<Outgoing>,
}

impl ChatStream {
    /// Waits for the first event: a failure before anything was streamed is
    /// the request's error, not a stream.
    async fn start(mut rx: mpsc::Receiver<Outgoing>) -> Result<ChatAnswer, ChatError> {
        match rx.recv().await {
            Some(Outgoing::Failed(err)) => Err(ChatError::Upstream(err)),
            Some(first) => Ok(ChatAnswer::Stream(ChatStream { first, rest: rx })),
            None => Err(ChatError::NoAnswer),
        }
    }

    /// Every event, the first included.
    pub fn events(self) -> impl Stream<Item = Outgoing> + Send {
        futures::stream::once(async move { self.first }).chain(ReceiverStream::new(self.rest))
    }
}

/// Why a chat request has no answer.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The worker has no upstream.
    #[error("this worker has no chat upstream (--upstream-url)")]
    NotConfigured,
    /// The request was refused before anything was sent upstream.
    #[error("{}", .0.message)]
    Request(RequestError),
    /// The upstream failed before anything was streamed.
    #[error(transparent)]
    Upstream(UpstreamError),
    /// The streaming task ended without a single event (a bug).
    #[error("the chat request ended without an answer")]
    NoAnswer,
}

impl From<&ChatError> for ErrorObject {
    fn from(err: &ChatError) -> Self {
        match err {
            ChatError::NotConfigured => {
                ErrorObject::new(ErrorCode::UpstreamNotConfigured, err.to_string())
            }
            ChatError::Request(err) => err.into(),
            ChatError::Upstream(err) => err.into(),
            ChatError::NoAnswer => ErrorObject::new(ErrorCode::Internal, err.to_string()),
        }
    }
}

impl Chat {
    /// Answers the chat request `raw` of a caller of `task`.
    pub async fn serve(
        &self,
        task: &Task,
        context: &CallContext,
        raw: Bytes,
    ) -> Result<ChatAnswer, ChatError> {
        let Some(upstream) = self.upstream.clone() else {
            return Err(ChatError::NotConfigured);
        };
        let request = ChatRequest::parse(&raw, task).map_err(ChatError::Request)?;
        let Some(mcp) = request.mcp.clone() else {
            let body = if request.rewritten {
                Bytes::from(serde_json::to_vec(&request.body).unwrap_or_default())
            } else {
                raw
            };
            return if request.stream {
                let (tx, rx) = mpsc::channel(64);
                tokio::spawn(stream::pass_through(upstream, body, tx));
                ChatStream::start(rx).await
            } else {
                match upstream.complete(body).await {
                    Ok(completion) => Ok(ChatAnswer::Completion(completion)),
                    Err(err) => Err(ChatError::Upstream(err)),
                }
            };
        };

        let snapshot = self.snapshot.current();
        let catalog = self
            .runner
            .catalog(
                &snapshot,
                task,
                context.caller.as_ref(),
                Some(&mcp.session),
                None,
            )
            .await;
        let searching = mcp.tool_search.is_some();
        request
            .check_forced_function(|name| {
                catalog.resolve(name).is_some() || (searching && ToolSearch::is_search(name))
            })
            .map_err(ChatError::Request)?;
        if searching && request.caller_tools.contains(SEARCH_FUNCTION) {
            return Err(ChatError::Request(RequestError {
                code: ErrorCode::InvalidRequest,
                field: "tools".into(),
                message: format!(
                    "tools: {SEARCH_FUNCTION:?} is the tool search function of this request \
                     (mcp.tool_search); rename the caller's tool"
                ),
            }));
        }
        if let Some(clash) = catalog
            .tools()
            .find(|tool| request.caller_tools.contains(&tool.injected_name))
        {
            return Err(ChatError::Request(RequestError {
                code: ErrorCode::InvalidRequest,
                field: "tools".into(),
                message: format!(
                    "tools: {:?} is the name of an injected MCP tool; rename the caller's tool",
                    clash.injected_name
                ),
            }));
        }
        let mut body = request.body.clone();
        let search = mcp
            .tool_search
            .map(|max_tools| ToolSearch::start(self.runner.tool_index(&catalog), max_tools, &body));
        tracing::debug!(
            request_id = %context.request_id,
            injected = catalog.len(),
            tool_search = search.is_some(),
            "mcp tools injected"
        );
        let tool_loop = OwnedLoop {
            runner: self.runner.clone(),
            task: task.clone(),
            context: context.clone(),
            catalog,
            search,
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
            ChatStream::start(rx).await
        } else {
            tool_loop.complete(upstream, body).await
        }
    }
}

/// The state of one MCP-enabled request, owned so a streaming request can
/// run in its own task.
struct OwnedLoop {
    runner: ToolRunner,
    task: Task,
    context: CallContext,
    catalog: Catalog,
    search: Option<ToolSearch>,
    request: ChatRequest,
    mcp: McpRequest,
}

impl OwnedLoop {
    fn tool_loop(&self) -> ToolLoop<'_> {
        ToolLoop {
            runner: &self.runner,
            task: &self.task,
            context: &self.context,
            catalog: &self.catalog,
            search: self.search.as_ref(),
            caller_tools: &self.request.caller_tools,
            vision: self.mcp.vision,
            budgets: self.mcp.budgets,
            approvals: ApprovalSet::new(self.mcp.approvals.clone()),
        }
    }

    async fn complete(
        &self,
        upstream: Upstream,
        mut body: Map<String, Value>,
    ) -> Result<ChatAnswer, ChatError> {
        let mut source = Completions(upstream);
        match self.tool_loop().run(&mut body, &mut source).await {
            Ok((turn, report)) => {
                log_loop(&self.context, &report);
                Ok(ChatAnswer::Completion(final_completion(turn, &report)))
            }
            Err(err) => Err(ChatError::Upstream(err)),
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
