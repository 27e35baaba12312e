//! `stream: true` with MCP tools: every upstream turn is streamed; text the
//! model produces reaches the caller as it arrives, in any turn, as one
//! `chat.completion.chunk` stream under the first turn's id. Tool-call deltas
//! are held until the turn is known to be final; then the caller's own calls
//! are sent, followed by the finish chunk (carrying the `mcp` extension),
//! the summed usage when the caller asked for it, and `[DONE]`.

use futures::StreamExt;
use quiver_upstream::{Upstream, UpstreamError};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use crate::chat::tool_loop::{LoopReport, TurnSource};
use crate::chat::turn::{ChunkAccumulator, Turn};
use crate::error::ErrorObject;

/// What the streaming task hands on, one event at a time.
#[derive(Debug)]
pub enum Outgoing {
    /// One chunk for the caller.
    Chunk(Value),
    /// The end: `data: [DONE]`.
    Done,
    /// The request failed; before the first chunk this is the request's
    /// error ([`crate::chat::ChatError::Upstream`]), later an event.
    Failed(UpstreamError),
}

impl Outgoing {
    /// The event's `data:` payload. A failure is the provider's own error
    /// object when it sent one, else the worker's.
    pub fn data(&self) -> String {
        match self {
            Outgoing::Chunk(chunk) => chunk.to_string(),
            Outgoing::Done => "[DONE]".to_owned(),
            Outgoing::Failed(err) => {
                if let Some((body, _)) = err.provider_body()
                    && let Ok(provider @ Value::Object(_)) = serde_json::from_slice::<Value>(body)
                {
                    return provider.to_string();
                }
                ErrorObject::from(err).to_body().to_string()
            }
        }
    }
}

/// Streams turns from the upstream and forwards what the caller may see.
pub struct StreamingTurns {
    upstream: Upstream,
    out: mpsc::Sender<Outgoing>,
    /// The first turn's chunk fields (id, created, model, …), reused by
    /// every chunk so the caller sees one completion.
    envelope: Option<Map<String, Value>>,
    role_sent: bool,
}

impl StreamingTurns {
    /// Forwards to `out`.
    pub fn new(upstream: Upstream, out: mpsc::Sender<Outgoing>) -> Self {
        StreamingTurns {
            upstream,
            out,
            envelope: None,
            role_sent: false,
        }
    }

    fn chunk(&self, delta: Map<String, Value>, finish_reason: Value) -> Value {
        let mut chunk = self.envelope.clone().unwrap_or_default();
        chunk.insert(
            "object".into(),
            Value::String("chat.completion.chunk".into()),
        );
        chunk.insert(
            "choices".into(),
            json!([{"index": 0, "delta": delta, "finish_reason": finish_reason}]),
        );
        Value::Object(chunk)
    }

    async fn send_delta(&mut self, mut delta: Map<String, Value>) {
        // The role is announced once, in the first chunk of the whole answer.
        delta.remove("role");
        if !self.role_sent {
            delta.insert("role".into(), Value::String("assistant".into()));
            self.role_sent = true;
        } else if delta.is_empty() {
            return;
        }
        let chunk = self.chunk(delta, Value::Null);
        // A caller that went away is noticed by the task's select.
        let _ = self.out.send(Outgoing::Chunk(chunk)).await;
    }

    /// Sends the end of the stream for the final turn.
    pub async fn finish(mut self, turn: Turn, report: &LoopReport, include_usage: bool) {
        if let Some(calls) = turn.message.get("tool_calls").and_then(Value::as_array) {
            let deltas: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(index, call)| {
                    let mut call = call.clone();
                    call["index"] = json!(index);
                    call
                })
                .collect();
            let mut delta = Map::new();
            delta.insert("tool_calls".into(), Value::Array(deltas));
            self.send_delta(delta).await;
        } else if !self.role_sent {
            self.send_delta(Map::new()).await;
        }
        let mut last = self.chunk(Map::new(), turn.finish_reason.clone());
        last["mcp"] = serde_json::to_value(report).unwrap_or(Value::Null);
        let _ = self.out.send(Outgoing::Chunk(last)).await;
        if include_usage {
            let mut usage = self.envelope.clone().unwrap_or_default();
            usage.insert(
                "object".into(),
                Value::String("chat.completion.chunk".into()),
            );
            usage.insert("choices".into(), json!([]));
            usage.insert("usage".into(), report.usage.clone().unwrap_or(Value::Null));
            let _ = self.out.send(Outgoing::Chunk(Value::Object(usage))).await;
        }
        let _ = self.out.send(Outgoing::Done).await;
    }
}

impl TurnSource for StreamingTurns {
    async fn next_turn(&mut self, body: bytes::Bytes) -> Result<Turn, UpstreamError> {
        let mut chunks = self.upstream.stream(body).await?;
        let mut turn = ChunkAccumulator::default();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk?;
            if self.envelope.is_none()
                && let Value::Object(fields) = &chunk
            {
                let mut envelope = fields.clone();
                envelope.remove("choices");
                envelope.remove("usage");
                self.envelope = Some(envelope);
            }
            if let Some(delta) = turn.push(chunk)? {
                self.send_delta(delta).await;
            }
        }
        if !turn.started() {
            return Err(UpstreamError::Stream(
                "the stream ended without a chunk".into(),
            ));
        }
        let turn = turn.finish();
        if turn.finish_reason.is_null() {
            return Err(UpstreamError::Stream(
                "the stream ended before a finish_reason".into(),
            ));
        }
        Ok(turn)
    }
}

/// Forwards a stream unchanged (MCP not enabled).
pub async fn pass_through(upstream: Upstream, body: bytes::Bytes, out: mpsc::Sender<Outgoing>) {
    let mut chunks = match upstream.stream(body).await {
        Ok(chunks) => chunks,
        Err(err) => {
            let _ = out.send(Outgoing::Failed(err)).await;
            return;
        }
    };
    while let Some(chunk) = chunks.next().await {
        let message = match chunk {
            Ok(chunk) => Outgoing::Chunk(chunk),
            Err(err) => {
                let _ = out.send(Outgoing::Failed(err)).await;
                return;
            }
        };
        if out.send(message).await.is_err() {
            return;
        }
    }
    let _ = out.send(Outgoing::Done).await;
}
