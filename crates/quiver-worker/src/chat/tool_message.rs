//! What the model reads back from an MCP call: the `content` of its
//! `role=tool` message. Output becomes text; every failure becomes the §10
//! error object, so a failed call never fails the chat request.

use quiver_mcp::output::truncate_utf8;
use quiver_mcp::{ContentBlock, ErrorCode, ResourceContents};
use serde_json::{Value, json};

use crate::call::{CallDone, CallError};

/// §10-style code of a call refused because a session budget is used up
/// (an addition to the codes of SPEC §10).
pub const BUDGET_EXCEEDED: &str = ErrorCode::McpBudgetExceeded.as_str();

/// A tool message's content and what it cost.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolMessage {
    /// The `content` string.
    pub content: String,
    /// `ok` or the §10 code.
    pub status: &'static str,
    /// Tool output bytes handed to the model (counted against
    /// `max_tool_output_bytes`; error objects of the worker's own are free).
    pub output_bytes: u64,
}

impl ToolMessage {
    /// The message for a call that did not run or failed.
    pub fn error(err: &CallError) -> Self {
        ToolMessage {
            content: err.to_json().to_string(),
            status: err.code().as_str(),
            output_bytes: 0,
        }
    }

    /// The message for a call refused because `budget` is used up.
    pub fn budget_exceeded(budget: &str) -> Self {
        ToolMessage {
            content: json!({"error": {
                "code": BUDGET_EXCEEDED,
                "message": format!("not run: this request's {budget} budget is used up"),
                "retryable": false,
            }})
            .to_string(),
            status: BUDGET_EXCEEDED,
            output_bytes: 0,
        }
    }

    /// The message for a call that returned, keeping at most `remaining`
    /// bytes of its output (the rest of the request's output budget).
    pub fn output(done: &CallDone, remaining: u64) -> Self {
        let text = output_text(done);
        let limit = usize::try_from(remaining).unwrap_or(usize::MAX);
        let kept = truncate_utf8(&text, limit);
        let output_bytes = kept.len() as u64;
        if done.is_error() {
            let mut error = done.error_object().unwrap_or_else(|| json!({}));
            error["message"] = Value::String(kept.to_owned());
            return ToolMessage {
                content: json!({ "error": error }).to_string(),
                status: ErrorCode::McpToolError.as_str(),
                output_bytes,
            };
        }
        if kept.len() < text.len() {
            return ToolMessage {
                content: json!({
                    "error": {
                        "code": ErrorCode::McpOutputTooLarge,
                        "message": format!(
                            "output truncated to {} of {} bytes: the request's max_tool_output_bytes budget is used up",
                            kept.len(),
                            text.len()
                        ),
                        "retryable": false,
                    },
                    "output": kept,
                })
                .to_string(),
                status: ErrorCode::McpOutputTooLarge.as_str(),
                output_bytes,
            };
        }
        if let Some(error) = done.error_object() {
            // Cut by the server's own output cap (already marked in the text).
            return ToolMessage {
                content: json!({"error": error, "output": text}).to_string(),
                status: ErrorCode::McpOutputTooLarge.as_str(),
                output_bytes,
            };
        }
        ToolMessage {
            content: text,
            status: "ok",
            output_bytes,
        }
    }
}

/// The result as text: text items as they are, other items as a short note,
/// structured content as JSON when there is nothing else.
fn output_text(done: &CallDone) -> String {
    let result = &done.outcome.result;
    let parts: Vec<String> = result
        .content
        .iter()
        .map(|item| match item {
            ContentBlock::Text(text) => text.text.clone(),
            ContentBlock::Image(image) => format!(
                "[image: {}, {} bytes base64, not shown to text models]",
                image.mime_type,
                image.data.len()
            ),
            ContentBlock::Audio(audio) => format!(
                "[audio: {}, {} bytes base64]",
                audio.mime_type,
                audio.data.len()
            ),
            ContentBlock::Resource(resource) => match &resource.resource {
                ResourceContents::TextResourceContents { text, .. } => text.clone(),
                ResourceContents::BlobResourceContents { uri, .. } => {
                    format!("[resource: {uri}]")
                }
                _ => "[resource]".to_owned(),
            },
            ContentBlock::ResourceLink(link) => format!("[resource link: {}]", link.uri),
            _ => "[unsupported content]".to_owned(),
        })
        .collect();
    if parts.is_empty()
        && let Some(structured) = &result.structured_content
    {
        return structured.to_string();
    }
    parts.join("\n")
}
