//! What the model reads back from an MCP call: the `content` of its
//! `role=tool` message. Output becomes text; every failure becomes the §10
//! error object, so a failed call never fails the chat request.
//!
//! The request's `max_tool_output_bytes` bounds what servers put in front of
//! the model. A message about an MCP call (its output, its `isError` text,
//! its failure, whose text may be the server's) is never longer than what is
//! left of that budget, and its length counts against it: the server's text
//! is cut at a character boundary, measured as it is escaped in JSON, and the
//! cut is marked. Only when even the worker's own words around it do not fit
//! are those words, short and bounded, sent alone. Refusals of calls that
//! never reached the pool (policy, approval, argument checks, the call
//! budget) are the worker's own and cost nothing.

use quiver_mcp::{ContentBlock, ResourceContents};
use quiver_model::ErrorCode;
use serde_json::{Value, json};

use crate::call::{CallDone, CallError};
use crate::error::ErrorObject;

/// §10-style code of a call refused because a session budget is used up
/// (an addition to the codes of docs/reference.md §10).
pub const BUDGET_EXCEEDED: &str = ErrorCode::McpBudgetExceeded.as_str();

/// What follows server text that was cut to fit the budget.
const CUT_MARK: &str = " [quiver: cut to fit the request's max_tool_output_bytes budget]";

/// A tool message's content and what it cost.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolMessage {
    /// The `content` string.
    pub content: String,
    /// `ok` or the §10 code.
    pub status: &'static str,
    /// Bytes counted against `max_tool_output_bytes`: the whole content of
    /// a message about an MCP call, nothing for the worker's own refusals.
    pub output_bytes: u64,
}

impl ToolMessage {
    /// The message for a call that did not run or failed, within
    /// `remaining` bytes when the failure is the MCP call's.
    pub fn error(err: &CallError, remaining: u64) -> Self {
        let status = err.code().as_str();
        if !matches!(err, CallError::Mcp(_)) {
            return ToolMessage {
                content: err.to_json().to_string(),
                status,
                output_bytes: 0,
            };
        }
        let (content, _) = fit(
            err.to_json(),
            "/error/message",
            &err.to_string(),
            CUT_MARK,
            limit(remaining),
        );
        ToolMessage {
            output_bytes: content.len() as u64,
            content,
            status,
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

    /// The message for a call that returned, at most `remaining` bytes
    /// (the rest of the request's output budget).
    pub fn output(done: &CallDone, remaining: u64) -> Self {
        let text = output_text(done);
        let limit = limit(remaining);
        let (content, status) = if done.is_error() {
            let error = done.error_object().unwrap_or_else(|| json!({}));
            let (content, _) = fit(
                json!({ "error": error }),
                "/error/message",
                &text,
                CUT_MARK,
                limit,
            );
            (content, ErrorCode::McpToolError.as_str())
        } else {
            match done.error_object() {
                None if text.len() <= limit => (text, "ok"),
                server_note => (
                    marked_output(server_note, &text, remaining, limit),
                    ErrorCode::McpOutputTooLarge.as_str(),
                ),
            }
        };
        ToolMessage {
            output_bytes: content.len() as u64,
            content,
            status,
        }
    }
}

/// `{"error": …, "output": …}` for output that was cut: by the server's
/// cap (`server_note` says so) when the rest fits, else by this budget.
fn marked_output(server_note: Option<Value>, text: &str, remaining: u64, limit: usize) -> String {
    if let Some(note) = server_note {
        let (content, cut) = fit(
            json!({"error": note, "output": ""}),
            "/output",
            text,
            "",
            limit,
        );
        if !cut {
            return content;
        }
    }
    let note = ErrorObject::new(
        ErrorCode::McpOutputTooLarge,
        format!(
            "output of {} bytes cut to fit the request's max_tool_output_bytes budget ({remaining} bytes left)",
            text.len()
        ),
    );
    fit(
        json!({"error": note.to_value(), "output": ""}),
        "/output",
        text,
        "",
        limit,
    )
    .0
}

fn limit(remaining: u64) -> usize {
    usize::try_from(remaining).unwrap_or(usize::MAX)
}

/// `envelope` as JSON with `text` in the string at `pointer` (which must
/// exist), in at most `limit` bytes: the whole text when it fits, else its
/// longest prefix that does followed by `mark`, or the mark alone when the
/// envelope leaves no room. Returns the JSON and whether `text` was cut.
fn fit(mut envelope: Value, pointer: &str, text: &str, mark: &str, limit: usize) -> (String, bool) {
    set_string(&mut envelope, pointer, String::new());
    let frame = envelope.to_string().len();
    let room = limit.saturating_sub(frame);
    let whole = escaped_prefix(text, room);
    let cut = whole.len() < text.len();
    let slot = if cut {
        let room = room.saturating_sub(mark.chars().map(escaped_len).sum());
        format!("{}{mark}", escaped_prefix(text, room))
    } else {
        text.to_owned()
    };
    set_string(&mut envelope, pointer, slot);
    (envelope.to_string(), cut)
}

fn set_string(value: &mut Value, pointer: &str, string: String) {
    if let Some(slot) = value.pointer_mut(pointer) {
        *slot = Value::String(string);
    }
}

/// Bytes of `c` inside a JSON string as serde_json writes it.
fn escaped_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\u{08}' | '\u{0c}' | '\n' | '\r' | '\t' => 2,
        '\0'..='\u{1f}' => 6,
        c => c.len_utf8(),
    }
}

/// The longest prefix of `text` whose JSON-escaped form is at most `room`
/// bytes; it ends on a character boundary.
fn escaped_prefix(text: &str, room: usize) -> &str {
    let mut used = 0;
    for (at, c) in text.char_indices() {
        used += escaped_len(c);
        if used > room {
            return &text[..at];
        }
    }
    text
}

/// The result as text: text items as they are, other items as a short note
/// (images and audio are notes naming their artifact by now), and
/// `structuredContent` as JSON when the server sent no text or the tool
/// declared an `outputSchema` (not repeated when a text item already is
/// that JSON). All of it counts against the byte budget.
fn output_text(done: &CallDone) -> String {
    let result = &done.outcome.result;
    let mut parts: Vec<String> = result
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
    if let Some(structured) = &result.structured_content
        && (!done.server_text || done.tool.tool.output_schema.is_some())
    {
        let repeated = result.content.iter().any(|item| {
            item.as_text().is_some_and(|text| {
                serde_json::from_str::<Value>(&text.text).is_ok_and(|v| &v == structured)
            })
        });
        if !repeated {
            parts.retain(|part| !part.is_empty());
            parts.push(structured.to_string());
        }
    }
    parts.join("\n")
}

#[cfg(test)]
mod tests {
    use quiver_mcp::McpError;

    use super::*;

    fn done(
        content: Vec<ContentBlock>,
        structured: Option<Value>,
        output_schema: bool,
    ) -> CallDone {
        use std::sync::Arc;

        use quiver_mcp::{CallOutcome, CallToolResult, Tool};
        use quiver_model::{McpServerSpec, StoredServer, Transport};

        let mut tool = Tool::new("t", "a tool", Arc::new(serde_json::Map::new()));
        if output_schema {
            tool.output_schema = Some(Arc::new(serde_json::Map::new()));
        }
        let mut result = CallToolResult::success(content);
        result.structured_content = structured;
        let server_text = result
            .content
            .iter()
            .any(|c| c.as_text().is_some_and(|t| !t.text.trim().is_empty()));
        CallDone {
            tool: crate::catalog::CatalogTool {
                injected_name: "mcp__x__t".into(),
                server: Arc::new(StoredServer::created(
                    McpServerSpec::new("x", Transport::Stdio),
                    1,
                    "test",
                )),
                tool,
                exposed_name: "t".into(),
            },
            outcome: CallOutcome {
                result,
                output: quiver_mcp::output::OutputSize {
                    original: 0,
                    kept: 0,
                },
                duration: std::time::Duration::ZERO,
            },
            artifacts: Vec::new(),
            server_text,
        }
    }

    #[test]
    fn structured_content_reaches_the_model_without_text_or_with_an_output_schema() {
        let structured = json!({"temperature": 21});
        // No content, or only empty text: the JSON.
        for content in [vec![], vec![ContentBlock::text("")]] {
            let message =
                ToolMessage::output(&done(content, Some(structured.clone()), false), 1000);
            assert_eq!(message.content, r#"{"temperature":21}"#);
            assert_eq!(message.output_bytes, message.content.len() as u64);
        }
        // Text and no schema: the text only.
        let message = ToolMessage::output(
            &done(
                vec![ContentBlock::text("21 degrees")],
                Some(structured.clone()),
                false,
            ),
            1000,
        );
        assert_eq!(message.content, "21 degrees");
        // A declared outputSchema: both, counted.
        let message = ToolMessage::output(
            &done(
                vec![ContentBlock::text("21 degrees")],
                Some(structured.clone()),
                true,
            ),
            1000,
        );
        assert_eq!(message.content, "21 degrees\n{\"temperature\":21}");
        assert_eq!(message.output_bytes, message.content.len() as u64);
        // ... unless the text already is that JSON.
        let message = ToolMessage::output(
            &done(
                vec![ContentBlock::text(r#"{"temperature": 21}"#)],
                Some(structured.clone()),
                true,
            ),
            1000,
        );
        assert_eq!(message.content, r#"{"temperature": 21}"#);
        // Over the budget: cut and marked like any output.
        let message = ToolMessage::output(
            &done(vec![], Some(json!({"pad": "x".repeat(500)})), true),
            300,
        );
        assert!(message.content.len() <= 300, "{}", message.content);
        assert!(message.content.contains("xxxx"), "{}", message.content);
        assert_eq!(message.status, "mcp_output_too_large");
    }

    #[test]
    fn escaped_len_is_what_serde_json_writes() {
        let chars = (0u32..0x80)
            .filter_map(char::from_u32)
            .chain(['é', '€', '😀', '\u{2028}', '\u{7f}']);
        for c in chars {
            let written = serde_json::to_string(&c.to_string()).unwrap().len() - 2;
            assert_eq!(escaped_len(c), written, "{c:?}");
        }
    }

    #[test]
    fn fitted_json_stays_within_the_limit_whatever_the_text() {
        let hostile = "\"\\\u{1}\né😀x".repeat(5000);
        let envelope =
            json!({"error": {"code": "mcp_unavailable", "message": "", "retryable": true}});
        let floor = fit(envelope.clone(), "/error/message", &hostile, CUT_MARK, 0)
            .0
            .len();
        for limit in (0..400).chain([1000, 4096, 65_536]) {
            let (json, cut) = fit(
                envelope.clone(),
                "/error/message",
                &hostile,
                CUT_MARK,
                limit,
            );
            assert!(cut);
            assert!(
                json.len() <= limit.max(floor),
                "{limit}: {} bytes",
                json.len()
            );
            let parsed: Value = serde_json::from_str(&json).unwrap();
            let message = parsed["error"]["message"].as_str().unwrap();
            let kept = message.strip_suffix(CUT_MARK).expect("marked");
            assert!(hostile.starts_with(kept));
        }
        let (json, cut) = fit(envelope, "/error/message", "short", CUT_MARK, 4096);
        assert!(!cut);
        assert!(json.contains("\"short\""));
    }

    #[test]
    fn server_error_text_fits_the_remaining_budget_and_counts() {
        let err = CallError::Mcp(McpError::Protocol(format!(
            "server error -32000: {}",
            "s".repeat(1_000_000)
        )));
        let message = ToolMessage::error(&err, 4096);
        assert!(message.content.len() <= 4096, "{}", message.content.len());
        assert!(message.content.len() > 4000, "{}", message.content.len());
        assert_eq!(message.output_bytes, message.content.len() as u64);
        let parsed: Value = serde_json::from_str(&message.content).unwrap();
        assert_eq!(parsed["error"]["code"], "mcp_unavailable");
        assert!(
            parsed["error"]["message"]
                .as_str()
                .unwrap()
                .ends_with(CUT_MARK)
        );

        // Nothing left: the worker's own words alone, still saying what failed.
        let message = ToolMessage::error(&err, 0);
        assert!(message.content.len() < 200, "{}", message.content);
        assert!(message.content.contains("mcp_unavailable"));

        // The worker's own refusals are free and whole.
        let refusal = ToolMessage::error(&CallError::not_available("x"), 0);
        assert_eq!(refusal.output_bytes, 0);
        assert!(refusal.content.contains("not a tool available"));

        // A rate limit's refusal tells the model which rule and when.
        let limited = ToolMessage::error(
            &CallError::RateLimited {
                message: "rate_limits[0] (10 calls of \"s.t\" per 60 s per principal) reached"
                    .into(),
                retry_after: std::time::Duration::from_millis(1500),
            },
            0,
        );
        let parsed: serde_json::Value = serde_json::from_str(&limited.content).unwrap();
        assert_eq!(parsed["error"]["code"], "mcp_rate_limited");
        assert_eq!(parsed["error"]["retry_after_ms"], 1500);
        assert!(limited.content.contains("rate_limits[0]"));
        assert_eq!(limited.status, "mcp_rate_limited");
    }
}
