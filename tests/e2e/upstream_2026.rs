//! The worker as a client of MCP 2026-07-28 (issue #23): a server of the
//! official Python SDK (`mcp` 2.x, `tests/e2e/peers/stateless_server.py`)
//! serving streamable HTTP in its stateless mode, spoken to in 2026-07-28
//! (`protocol = "2026-07-28"`: `server/discover`, no session, every request
//! with its own `_meta`), used through the tool API and chat; the version
//! in use shows in `/v1/mcp/servers`; a call the server answers
//! `input_required` is 409 `mcp_input_required` naming the server's keys.
//! A client of 2025-11-25 (`initialize`, a session) at the gateway is asked
//! what the server asks by `input_required` (elicitation, sampling) as
//! requests on its session, and its answers resume the call.

use std::process::Command;
use std::time::Duration;

use quiver_testkit::upstream::{Reply, Script, ScriptedUpstream};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::gateway_2026::modern_client;
use crate::harness::{
    ADMIN, Admin, CALLER, McpServerProcess, RegistryProcess, WORKER, WorkerProcess, injected, peer,
    registry, sqlite,
};
use crate::openai_sdk::sdk_python;

/// The SDK's stateless server and a registry whose record `py` pins
/// 2026-07-28 for it.
struct Stateless {
    _server: McpServerProcess,
    _dir: tempfile::TempDir,
    registry: RegistryProcess,
    revision: u64,
}

impl Stateless {
    async fn start() -> Stateless {
        let mut command = Command::new(sdk_python());
        command.args([&peer("stateless_server.py"), "http"]);
        let server = McpServerProcess::announced(command).await;
        let (dir, db_url) = sqlite();
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
        Stateless {
            _server: server,
            _dir: dir,
            registry,
            revision,
        }
    }

    /// A worker of this registry started with `args`, synced.
    async fn worker(&self, args: &[&str]) -> WorkerProcess {
        let worker = WorkerProcess::start(&self.registry.grpc_url(), WORKER, CALLER, args).await;
        worker.synced(self.revision, Duration::from_secs(10)).await;
        worker
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateless_server_of_2026_07_28_through_the_tool_api_and_chat() {
    let stateless = Stateless::start().await;
    let echo = injected("py", "echo");
    // The model calls `echo`, then answers with what it returned.
    let upstream = ScriptedUpstream::start(Script::sequence([
        Reply::tool_call("call-1", &echo, json!({"text": "through chat"})),
        Reply::text("done"),
    ]))
    .await;
    let worker = stateless
        .worker(&["--upstream-url", &upstream.base_url()])
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_client_of_2025_11_25_answers_what_the_server_asks() {
    let stateless = Stateless::start().await;
    let worker = stateless.worker(&[]).await;
    let own = ("greet".to_owned(), "think".to_owned());
    let catalog = (injected("py", "greet"), injected("py", "think"));
    for (endpoint, (greet, think)) in [("/mcp/py", own), ("/mcp", catalog)] {
        let report = legacy_client(json!({
            "url": format!("{}{endpoint}", worker.url()),
            "elicit": {"action": "accept", "content": {"name": "Ada"}},
            "calls": {"greet": [greet, {}], "think": [think, {}]},
        }))
        .await;
        // The server's question reached the person at the client as an
        // elicitation on its session, and the answer reached the server.
        assert_eq!(report["asked"], json!(["What is your name?"]), "{report}");
        assert_eq!(report["greet"]["isError"], false, "{report}");
        assert_eq!(
            report["greet"]["content"][0]["text"], "Hello, Ada!",
            "{report}"
        );
        // So did its request for the client's model.
        assert_eq!(report["prompts"], json!(["Say hello."]), "{report}");
        assert_eq!(report["think"]["isError"], false, "{report}");
        assert_eq!(
            report["think"]["content"][0]["text"], "model said: hi from the client",
            "{report}"
        );
    }

    // A declined question ends the call as the server ends it: a tool error.
    let report = legacy_client(json!({
        "url": format!("{}/mcp/py", worker.url()),
        "elicit": {"action": "decline"},
        "calls": {"greet": ["greet", {}]},
    }))
    .await;
    assert_eq!(report["asked"], json!(["What is your name?"]), "{report}");
    assert_eq!(report["greet"]["isError"], true, "{report}");
    assert_eq!(
        report["greet"]["content"][0]["text"],
        "Error executing tool greet: Resolver for parameter 'person' could not resolve: elicitation was decline",
        "{report}"
    );
}

/// Runs `tests/e2e/peers/modern_client.py` with `config` as a client of
/// 2025-11-25 (a session) with the caller's token; its report.
async fn legacy_client(mut config: Value) -> Value {
    config["mode"] = json!("legacy");
    config["token"] = json!(CALLER);
    let report = modern_client(&config).await;
    assert_eq!(report["protocol_version"], "2025-11-25", "{report}");
    report
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
