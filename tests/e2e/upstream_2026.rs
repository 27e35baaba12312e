//! The worker as a client of MCP 2026-07-28 (issue #23): a server of the
//! official Python SDK (`mcp` 2.x, `tests/e2e/peers/stateless_server.py`)
//! serving streamable HTTP in its stateless mode, spoken to in 2026-07-28
//! (`protocol = "2026-07-28"`: `server/discover`, no session, every request
//! with its own `_meta`), used through the tool API and chat; the version
//! in use shows in `/v1/mcp/servers`; a call the server answers
//! `input_required` is 409 `mcp_input_required` naming the server's keys.

use std::process::Command;

use quiver_testkit::upstream::{Reply, Script, ScriptedUpstream};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{
    ADMIN, Admin, CALLER, McpServerProcess, WORKER, WorkerProcess, injected, peer, registry, sqlite,
};
use crate::openai_sdk::sdk_python;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateless_server_of_2026_07_28_through_the_tool_api_and_chat() {
    let mut command = Command::new(sdk_python());
    command.args([&peer("stateless_server.py"), "http"]);
    let server = McpServerProcess::announced(command).await;
    let (_dir, db_url) = sqlite();
    let registry = registry(&db_url, None).await;
    let revision = Admin::new(&registry, ADMIN)
        .upsert(json!({
            "server_id": "py",
            "transport": "streamable_http",
            "http": {"url": server.url()},
            "protocol": "2026-07-28",
            "allowed_tools": ["*"],
        }))
        .await;
    let echo = injected("py", "echo");
    // The model calls `echo`, then answers with what it returned.
    let upstream = ScriptedUpstream::start(Script::sequence([
        Reply::tool_call("call-1", &echo, json!({"text": "through chat"})),
        Reply::text("done"),
    ]))
    .await;
    let worker = WorkerProcess::start(
        &registry.grpc_url(),
        WORKER,
        CALLER,
        &["--upstream-url", &upstream.base_url()],
    )
    .await;
    worker
        .synced(revision, std::time::Duration::from_secs(10))
        .await;

    // The tool API.
    assert_eq!(
        worker.call_text(&echo, json!({"text": "hello"})).await,
        "hello"
    );
    let server_view = worker.server("py").await.expect("py in /v1/mcp/servers");
    assert_eq!(server_view["protocol"], "2026-07-28", "{server_view}");
    assert_eq!(
        server_view["protocol_version"], "2026-07-28",
        "{server_view}"
    );

    // Chat: the tool loop calls the server and the model sees its answer.
    let (status, answer) = chat(
        &worker,
        json!({
            "model": "m",
            "messages": [{"role": "user", "content": "echo something"}],
            "mcp": {"enabled": true, "server_ids": ["py"]},
        }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        answer["choices"][0]["message"]["content"], "done",
        "{answer}"
    );
    let second = &upstream.requests()[1].body;
    let tool_message = second["messages"]
        .as_array()
        .and_then(|messages| messages.iter().find(|m| m["role"] == "tool"))
        .unwrap_or_else(|| panic!("a tool message: {second}"));
    assert!(
        tool_message["content"].to_string().contains("through chat"),
        "{tool_message}"
    );

    // The server asks by `input_required`: the tool API cannot answer it.
    let (status, body) = worker.call(&injected("py", "greet"), json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "mcp_input_required", "{body}");
}

async fn chat(worker: &WorkerProcess, body: Value) -> (StatusCode, Value) {
    let response = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", worker.url()))
        .bearer_auth(CALLER)
        .json(&body)
        .send()
        .await
        .expect("chat request");
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}
