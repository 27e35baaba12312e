//! The output budget against a server that answers too much (issue #10.4):
//! `tests/e2e/peers/hostile_output.py`, a stdio server written with the
//! official Python SDK (`mcp` 2.x), whose `str` results arrive twice (text
//! and `structuredContent`), whose errors carry megabytes of text and whose
//! `_meta` can be padded.
//!
//! The record's `max_tool_output_bytes` must bound everything a result
//! carries on the tool API, the size metric must count what the server
//! sent, and a chat request's own `max_tool_output_bytes` must bound every
//! tool message the model is sent, error messages included.

use std::path::Path;

use quiver_testkit::upstream::{Reply, Script};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{CALLER, injected, metrics_text};
use crate::openai_sdk::sdk_python;
use crate::stack::Stack;

/// The record of the tool API test.
const SERVER: &str = "hostile-output";
/// The record's `max_tool_output_bytes` in the tool API test.
const CAP: u64 = 1000;
/// The record's cap in the chat test: far above the session budget, so
/// only the session budget can bound the tool messages.
const WIDE_CAP: u64 = 1_000_000;
/// The chat request's `max_tool_output_bytes`.
const SESSION_BUDGET: u64 = 4096;
/// Bytes of the `str` results. 8 MB arrives as ~16 MB (text plus
/// `structuredContent`), just under rmcp's 16 MiB stdio line limit.
const HUGE: u64 = 8_000_000;
/// Bytes of the error messages.
const TEN_MB: u64 = 10_000_000;

/// A stack with one record of the hostile-output peer (cap `cap`) and a
/// scripted upstream.
async fn start(server_id: &str, cap: u64, script: Script) -> Stack {
    let peer =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/e2e/peers/hostile_output.py");
    Stack::builder()
        .record(json!({
            "server_id": server_id,
            "transport": "stdio",
            "stdio": {"command": sdk_python(), "args": [peer.display().to_string()]},
            "allowed_tools": ["text", "tool_error", "server_error", "meta"],
            "budgets": {"max_tool_output_bytes": cap, "tool_timeout_ms": 10_000},
        }))
        .upstream(script)
        .tools_listed(4)
        .start()
        .await
}

/// `POST /v1/mcp/tools/call` of `tool` of `server_id` with `n`: status,
/// JSON body and the body's size on the wire.
async fn call(stack: &Stack, server_id: &str, tool: &str, n: u64) -> (StatusCode, Value, usize) {
    let (status, body) = stack
        .worker
        .call(&injected(server_id, tool), json!({"n": n}))
        .await;
    let size = body.to_string().len();
    (status, body, size)
}

/// The sum of `mcp_tool_call_output_bytes` for `tool` of `server_id` on
/// `/metrics`.
async fn output_bytes_sum(stack: &Stack, server_id: &str, tool: &str) -> f64 {
    let text = metrics_text(&format!("{}/metrics", stack.worker.url())).await;
    let labels = [
        format!("server_id=\"{server_id}\""),
        format!("tool=\"{tool}\""),
    ];
    text.lines()
        .find(|line| {
            line.starts_with("mcp_tool_call_output_bytes_sum{")
                && labels.iter().all(|label| line.contains(label.as_str()))
        })
        .and_then(|line| line.rsplit_once(' '))
        .map(|(_, value)| value.parse().expect("sample value"))
        .unwrap_or_else(|| panic!("no mcp_tool_call_output_bytes_sum for {tool}:\n{text}"))
}

/// Bytes of the text items of a tool API answer, the worker's own
/// truncation note (the last item of a truncated answer) excluded.
fn kept_text_bytes(body: &Value) -> usize {
    let content = body["content"].as_array().expect("content array");
    let server_items = if body["truncated"] == true {
        &content[..content.len().saturating_sub(1)]
    } else {
        &content[..]
    };
    server_items
        .iter()
        .filter_map(|item| item["text"].as_str())
        .map(str::len)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_api_answer_is_bounded_by_the_record_cap() {
    let stack = start(SERVER, CAP, Script::sequence([])).await;

    // A 100 KB `str`: ~200 KB sent (text + structuredContent).
    let (status, body, size) = call(&stack, SERVER, "text", 100_000).await;
    eprintln!(
        "100 KB str at max_tool_output_bytes {CAP}: HTTP {status}, answer {size} bytes, \
         kept {} text bytes, structured_content {}, truncated {}",
        kept_text_bytes(&body),
        body.get("structured_content").is_some(),
        body["truncated"]
    );
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        body.get("structured_content").is_none(),
        "structuredContent does not fit after the text: dropped"
    );
    assert!(kept_text_bytes(&body) <= CAP as usize);
    assert_eq!(body["truncated"], true);
    assert_eq!(body["error"]["code"], "mcp_output_too_large");
    assert!(size < 2 * CAP as usize, "answer of {size} bytes");

    // 8 MB: ~16 MB sent, the answer still bounded and marked.
    let (status, body, size) = call(&stack, SERVER, "text", HUGE).await;
    eprintln!(
        "8 MB str: HTTP {status}, answer {size} bytes, truncated {}",
        body["truncated"]
    );
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["truncated"], true);
    assert!(body.get("structured_content").is_none());
    assert!(size < 2 * CAP as usize, "answer of {size} bytes");
    let sent = output_bytes_sum(&stack, SERVER, "text").await;
    eprintln!("mcp_tool_call_output_bytes sum after 100 KB + 8 MB str: {sent}");
    assert!(
        sent >= 2.0 * (100_000 + HUGE) as f64,
        "the metric counts text and structuredContent: {sent}"
    );

    // `_meta` counts too: dropped when over, and marked.
    let (status, body, size) = call(&stack, SERVER, "meta", 100_000).await;
    eprintln!(
        "100 KB _meta: HTTP {status}, answer {size} bytes, truncated {}",
        body["truncated"]
    );
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["content"][0]["text"], "small");
    assert_eq!(body["truncated"], true);
    assert!(output_bytes_sum(&stack, SERVER, "meta").await >= 100_000.0);

    // A 10 MB `ToolError` (isError) and a 10 MB JSON-RPC error.
    for tool in ["tool_error", "server_error"] {
        let (status, body, size) = call(&stack, SERVER, tool, TEN_MB).await;
        let message = body["error"]["message"].as_str().unwrap_or_default();
        eprintln!(
            "10 MB {tool}: HTTP {status} {}, answer {size} bytes, error message {} bytes",
            body["error"]["code"],
            message.len()
        );
        assert!(size < 3 * CAP as usize, "{tool}: answer of {size} bytes");
        assert!(
            message.contains("max_tool_output_bytes"),
            "{tool}: the cut names the limit: {message}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_tool_messages_stay_within_the_session_budget() {
    let server_error = injected("hostile-wide", "server_error");
    let tool_error = injected("hostile-wide", "tool_error");
    let stack = start(
        "hostile-wide",
        WIDE_CAP,
        Script::sequence([
            Reply::tool_call("call_server", &server_error, json!({"n": TEN_MB})),
            Reply::text("the server failed"),
            Reply::tool_call("call_tool", &tool_error, json!({"n": TEN_MB})),
            Reply::text("the tool failed"),
        ]),
    )
    .await;
    let http = reqwest::Client::new();
    for expected in ["mcp_unavailable", "mcp_tool_error"] {
        let response = http
            .post(format!("{}/v1/chat/completions", stack.worker.url()))
            .bearer_auth(CALLER)
            .json(&json!({
                "model": "m",
                "messages": [{"role": "user", "content": "fail hugely"}],
                "mcp": {"enabled": true, "max_tool_output_bytes": SESSION_BUDGET},
            }))
            .send()
            .await
            .expect("chat request");
        let status = response.status();
        let answer: Value = response.json().await.unwrap_or(Value::Null);
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["mcp"]["calls"][0]["status"], expected, "{answer}");
    }
    let requests = stack.upstream().requests();
    assert_eq!(requests.len(), 4);
    for (request, expected) in [
        (&requests[1], "mcp_unavailable"),
        (&requests[3], "mcp_tool_error"),
    ] {
        let messages = request.body["messages"].as_array().expect("messages");
        let tool = messages
            .iter()
            .find(|m| m["role"] == "tool")
            .expect("a tool message");
        let content = tool["content"].as_str().expect("tool content");
        eprintln!(
            "10 MB {expected} through chat at session max_tool_output_bytes {SESSION_BUDGET}: \
             tool message of {} bytes",
            content.len()
        );
        assert!(
            content.len() <= SESSION_BUDGET as usize,
            "{expected}: a tool message of {} bytes",
            content.len()
        );
        let parsed: Value = serde_json::from_str(content).expect("tool message JSON");
        assert_eq!(parsed["error"]["code"], expected);
    }
}
