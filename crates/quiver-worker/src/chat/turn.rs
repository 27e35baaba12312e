//! One model turn: the assistant message of an upstream answer, read from a
//! whole completion or assembled from streamed chunks, and the tool calls it
//! makes.

use std::collections::BTreeMap;

use quiver_upstream::UpstreamError;
use serde_json::{Map, Value};

/// The parts of one upstream answer the tool loop needs.
#[derive(Debug, Clone, Default)]
pub struct Turn {
    /// The completion without `choices` and `usage` (id, model, created, …),
    /// from which the final answer is rebuilt.
    pub envelope: Map<String, Value>,
    /// The assistant message of the first choice.
    pub message: Map<String, Value>,
    /// Why the model stopped.
    pub finish_reason: Value,
    /// Token usage, when reported.
    pub usage: Option<Value>,
}

/// A tool call the model made.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelToolCall {
    /// `tool_call_id` for the answer.
    pub id: String,
    /// The function name as the model wrote it.
    pub name: String,
    /// The arguments as the model wrote them (usually a JSON string).
    pub arguments: Value,
}

impl Turn {
    /// The first choice of a non-streamed completion.
    pub fn from_completion(completion: Value) -> Result<Turn, UpstreamError> {
        let Value::Object(mut envelope) = completion else {
            return Err(invalid("the answer is not a JSON object"));
        };
        let usage = envelope.remove("usage").filter(|u| !u.is_null());
        let mut choice = match envelope.remove("choices") {
            Some(Value::Array(choices)) => match choices.into_iter().next() {
                Some(Value::Object(choice)) => choice,
                _ => return Err(invalid("choices[0] is missing")),
            },
            _ => return Err(invalid("choices is missing")),
        };
        let message = match choice.remove("message") {
            Some(Value::Object(message)) => message,
            _ => return Err(invalid("choices[0].message is missing")),
        };
        Ok(Turn {
            envelope,
            message,
            finish_reason: choice.remove("finish_reason").unwrap_or(Value::Null),
            usage,
        })
    }

    /// The message's tool calls, in order.
    pub fn tool_calls(&self) -> Result<Vec<ModelToolCall>, UpstreamError> {
        let calls = match self.message.get("tool_calls") {
            None | Some(Value::Null) => return Ok(Vec::new()),
            Some(Value::Array(calls)) => calls,
            Some(_) => return Err(invalid("message.tool_calls is not an array")),
        };
        calls
            .iter()
            .enumerate()
            .map(|(i, call)| {
                let id = call.get("id").and_then(Value::as_str);
                let function = call.get("function");
                let name = function.and_then(|f| f.get("name")).and_then(Value::as_str);
                match (id, name) {
                    (Some(id), Some(name)) => Ok(ModelToolCall {
                        id: id.to_owned(),
                        name: name.to_owned(),
                        arguments: function
                            .and_then(|f| f.get("arguments"))
                            .cloned()
                            .unwrap_or(Value::Null),
                    }),
                    _ => Err(invalid(&format!(
                        "message.tool_calls[{i}] lacks an id or a function name"
                    ))),
                }
            })
            .collect()
    }

    /// Keeps only the tool calls `keep` accepts; drops the key when none is
    /// left.
    pub fn retain_tool_calls(&mut self, keep: impl Fn(&str) -> bool) {
        if let Some(Value::Array(calls)) = self.message.get_mut("tool_calls") {
            calls.retain(|call| {
                call.get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .is_some_and(&keep)
            });
            if calls.is_empty() {
                self.message.remove("tool_calls");
            }
        }
    }
}

fn invalid(what: &str) -> UpstreamError {
    UpstreamError::InvalidResponse(what.to_owned())
}

/// Builds a [`Turn`] from streamed chunks.
#[derive(Debug, Default)]
pub struct ChunkAccumulator {
    envelope: Option<Map<String, Value>>,
    message: Map<String, Value>,
    tool_calls: BTreeMap<u64, Map<String, Value>>,
    finish_reason: Value,
    usage: Option<Value>,
}

impl ChunkAccumulator {
    /// Adds one chunk and returns the part of its first choice's delta that
    /// may be shown to the caller right away: everything but tool calls,
    /// which are held until the turn is known to be the caller's.
    pub fn push(&mut self, chunk: Value) -> Result<Option<Map<String, Value>>, UpstreamError> {
        let Value::Object(mut chunk) = chunk else {
            return Err(UpstreamError::Stream("a chunk is not a JSON object".into()));
        };
        if let Some(usage) = chunk.remove("usage").filter(|u| !u.is_null()) {
            self.usage = Some(usage);
        }
        let choices = chunk.remove("choices");
        if self.envelope.is_none() {
            self.envelope = Some(chunk);
        }
        let Some(Value::Object(mut choice)) = choices.and_then(|c| match c {
            Value::Array(choices) => choices.into_iter().next(),
            _ => None,
        }) else {
            // Usage-only chunks have no choices.
            return Ok(None);
        };
        if let Some(reason) = choice.remove("finish_reason").filter(|r| !r.is_null()) {
            self.finish_reason = reason;
        }
        let Some(Value::Object(mut delta)) = choice.remove("delta") else {
            return Ok(None);
        };
        if let Some(calls) = delta.remove("tool_calls") {
            self.add_tool_call_deltas(calls)?;
        }
        for (key, value) in &delta {
            merge_field(&mut self.message, key, value);
        }
        delta.retain(|_, value| match value {
            Value::Null => false,
            Value::String(text) => !text.is_empty(),
            _ => true,
        });
        Ok((!delta.is_empty()).then_some(delta))
    }

    fn add_tool_call_deltas(&mut self, calls: Value) -> Result<(), UpstreamError> {
        let Value::Array(calls) = calls else {
            return Err(UpstreamError::Stream(
                "delta.tool_calls is not an array".into(),
            ));
        };
        for (position, call) in calls.into_iter().enumerate() {
            let Value::Object(mut call) = call else {
                return Err(UpstreamError::Stream(
                    "a tool call delta is not an object".into(),
                ));
            };
            let index = match call.remove("index") {
                Some(index) => index.as_u64().ok_or_else(|| {
                    UpstreamError::Stream("a tool call delta has an invalid index".into())
                })?,
                None => position as u64,
            };
            let entry = self.tool_calls.entry(index).or_default();
            for (key, value) in &call {
                if key == "function" {
                    let function = entry
                        .entry("function")
                        .or_insert_with(|| Value::Object(Map::new()));
                    if let (Value::Object(function), Value::Object(delta)) = (function, value) {
                        for (key, value) in delta {
                            merge_field(function, key, value);
                        }
                    }
                } else {
                    merge_field(entry, key, value);
                }
            }
        }
        Ok(())
    }

    /// Whether any chunk arrived.
    pub fn started(&self) -> bool {
        self.envelope.is_some()
    }

    /// The assembled turn.
    pub fn finish(self) -> Turn {
        let mut message = self.message;
        message
            .entry("role")
            .or_insert_with(|| Value::String("assistant".into()));
        message.entry("content").or_insert(Value::Null);
        if !self.tool_calls.is_empty() {
            let calls = self.tool_calls.into_values().map(|mut call| {
                call.entry("type")
                    .or_insert_with(|| Value::String("function".into()));
                Value::Object(call)
            });
            message.insert("tool_calls".into(), Value::Array(calls.collect()));
        }
        let mut envelope = self.envelope.unwrap_or_default();
        envelope.insert("object".into(), Value::String("chat.completion".into()));
        Turn {
            envelope,
            message,
            finish_reason: self.finish_reason,
            usage: self.usage,
        }
    }
}

/// Streamed strings are pieces to concatenate; anything else replaces.
fn merge_field(target: &mut Map<String, Value>, key: &str, value: &Value) {
    match (target.get_mut(key), value) {
        (Some(Value::String(existing)), Value::String(piece)) if key != "role" && key != "id" => {
            existing.push_str(piece)
        }
        (_, Value::Null) => {}
        _ => {
            target.insert(key.to_owned(), value.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn completion_turns_and_their_tool_calls() {
        let completion = json!({
            "id": "c1", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": null,
                "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}},
                    {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{}"}},
                ]}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        });
        let mut turn = Turn::from_completion(completion).unwrap();
        assert_eq!(turn.envelope["id"], "c1");
        assert!(!turn.envelope.contains_key("choices"));
        assert_eq!(turn.usage.as_ref().unwrap()["total_tokens"], 5);
        let calls = turn.tool_calls().unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments, json!("{\"x\":1}"));
        turn.retain_tool_calls(|name| name == "g");
        assert_eq!(turn.tool_calls().unwrap()[0].id, "b");
        turn.retain_tool_calls(|_| false);
        assert!(!turn.message.contains_key("tool_calls"));

        for bad in [
            json!([]),
            json!({"choices": []}),
            json!({"choices": [{"index": 0}]}),
        ] {
            assert!(Turn::from_completion(bad).is_err());
        }
        let bad_call = Turn::from_completion(
            json!({"choices": [{"message": {"tool_calls": [{"function": {"name": "f"}}]}}]}),
        )
        .unwrap();
        assert!(bad_call.tool_calls().is_err());
    }

    #[test]
    fn chunks_assemble_into_a_turn() {
        let chunk = |delta: Value, finish: Value| {
            json!({"id": "s1", "object": "chat.completion.chunk", "model": "m",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        };
        let mut acc = ChunkAccumulator::default();
        let shown = acc
            .push(chunk(
                json!({"role": "assistant", "content": ""}),
                Value::Null,
            ))
            .unwrap();
        assert_eq!(
            shown,
            Some(json!({"role": "assistant"}).as_object().unwrap().clone())
        );
        let shown = acc
            .push(chunk(json!({"content": "Hel"}), Value::Null))
            .unwrap();
        assert_eq!(shown.unwrap()["content"], "Hel");
        acc.push(chunk(json!({"content": "lo"}), Value::Null))
            .unwrap();
        let held = acc
            .push(chunk(
                json!({"tool_calls": [{"index": 0, "id": "t1", "type": "function", "function": {"name": "f", "arguments": ""}}]}),
                Value::Null,
            ))
            .unwrap();
        assert!(held.is_none(), "tool call deltas are held back");
        acc.push(chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\":"}}]}),
            Value::Null,
        ))
        .unwrap();
        acc.push(chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
            Value::Null,
        ))
        .unwrap();
        acc.push(chunk(json!({}), json!("tool_calls"))).unwrap();
        acc.push(json!({"id": "s1", "choices": [], "usage": {"total_tokens": 9}}))
            .unwrap();
        let turn = acc.finish();
        assert_eq!(turn.message["content"], "Hello");
        assert_eq!(turn.finish_reason, "tool_calls");
        assert_eq!(turn.usage.unwrap()["total_tokens"], 9);
        assert_eq!(turn.envelope["id"], "s1");
        assert_eq!(turn.envelope["object"], "chat.completion");
        let calls = Turn {
            message: turn.message,
            ..Turn::default()
        }
        .tool_calls()
        .unwrap();
        assert_eq!(
            calls,
            vec![ModelToolCall {
                id: "t1".into(),
                name: "f".into(),
                arguments: json!("{\"a\":1}")
            }]
        );
    }
}
