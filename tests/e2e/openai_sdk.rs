//! Compatibility with the official OpenAI Python SDK (`openai` from PyPI) as
//! the caller of the worker's `POST /v1/chat/completions`, for a
//! non-streaming and a streaming request with MCP tools enabled.
//!
//! `tests/e2e/openai_sdk.py` makes both requests with the SDK and prints what
//! the SDK returned as one JSON object; this test owns the registry, the
//! worker, the scripted upstream and the assertions. The interpreter is
//! `QUIVER_TEST_PYTHON`, a venv with the pinned SDK that `scripts/test.sh`
//! prepares (`target/pyenv/bin/python`). Without it the test fails: it never
//! skips silently.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use quiver_testkit::upstream::{
    COMPLETION_TOKENS_PER_ITEM, PROMPT_TOKENS_PER_MESSAGE, RecordedRequest, Reply, Script,
    ScriptedUpstream,
};
use serde_json::{Value, json};

use crate::harness::{Admin, RegistryProcess, WorkerProcess, testkit_mcp_bin};
use crate::worker::{ADMIN, WORKER, injected};

const CALLER: &str = "e2e-sdk-caller-token";
const SERVER: &str = "sdk-echo";
const MODEL: &str = "scripted-model";
const ECHOED: &str = "hello from the sdk";
const FINAL_TEXT: &str = "The echo tool said: hello from the sdk.";
const STREAMED_TEXT: &str =
    "Streaming now: the echo tool answered \"hello from the sdk\", piece by piece.";
/// How long the SDK script may run (both requests).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(60);

/// The interpreter of the SDK venv; fails the test when it is not set up.
pub(crate) fn sdk_python() -> String {
    let python = std::env::var("QUIVER_TEST_PYTHON").unwrap_or_default();
    assert!(
        !python.is_empty(),
        "QUIVER_TEST_PYTHON is not set: it must name a python with the `openai` SDK \
         installed; run the suite with scripts/test.sh (it creates target/pyenv), or run \
         its venv step and export QUIVER_TEST_PYTHON=$PWD/target/pyenv/bin/python"
    );
    assert!(
        Path::new(&python).is_file(),
        "QUIVER_TEST_PYTHON={python} does not exist; scripts/test.sh creates it \
         (target/pyenv/bin/python)"
    );
    python
}

/// Runs `openai_sdk.py` against the worker and returns its JSON report.
async fn run_sdk(python: &str, worker_url: &str) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/e2e/openai_sdk.py");
    let mut command = tokio::process::Command::new(python);
    command
        .arg(&script)
        .args([&format!("{worker_url}/v1"), CALLER, MODEL, SERVER])
        // Nothing from the test environment may redirect or configure the
        // SDK: no proxy for the loopback worker, no ambient OpenAI settings.
        .env("NO_PROXY", "*")
        .env("no_proxy", "*")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for key in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "OPENAI_BASE_URL",
        "OPENAI_API_KEY",
        "OPENAI_ORG_ID",
        "OPENAI_PROJECT_ID",
        "OPENAI_LOG",
    ] {
        command.env_remove(key);
    }
    let child = command
        .spawn()
        .unwrap_or_else(|err| panic!("spawn {python} {}: {err}", script.display()));
    let output = tokio::time::timeout(SCRIPT_TIMEOUT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("openai_sdk.py did not finish within {SCRIPT_TIMEOUT:?}"))
        .expect("wait for openai_sdk.py");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "openai_sdk.py failed ({}); is the `openai` SDK installed in {python} \
         (scripts/test.sh)?\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|err| panic!("openai_sdk.py printed no JSON ({err}):\n{stdout}\n{stderr}"))
}

/// The messages of a recorded upstream request.
fn messages(request: &RecordedRequest) -> &Vec<Value> {
    request.body["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("upstream request without messages: {}", request.body))
}

/// Usage the scripted upstream reports for `requests`, each answered with one
/// item (a text or a single tool call).
fn scripted_usage(requests: &[RecordedRequest]) -> Value {
    let prompt: u64 = requests
        .iter()
        .map(|request| messages(request).len() as u64 * PROMPT_TOKENS_PER_MESSAGE)
        .sum();
    let completion = requests.len() as u64 * COMPLETION_TOKENS_PER_ITEM;
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

/// Asserts the `mcp` extension reports one successful echo call, `call_id`,
/// in the first of two iterations.
fn assert_extension(mcp: &Value, call_id: &str, what: &str) {
    assert_eq!(mcp["iterations"], 2, "{what}: mcp extension: {mcp}");
    assert_eq!(
        mcp["stop_reason"], "completed",
        "{what}: mcp extension: {mcp}"
    );
    let calls = mcp["calls"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: mcp.calls is an array: {mcp}"));
    assert_eq!(calls.len(), 1, "{what}: one MCP call: {mcp}");
    let call = &calls[0];
    for (field, expected) in [
        ("id", json!(call_id)),
        ("name", json!(injected(SERVER, "echo"))),
        ("server_id", json!(SERVER)),
        ("tool", json!("echo")),
        ("status", json!("ok")),
        ("iteration", json!(1)),
    ] {
        assert_eq!(call[field], expected, "{what}: mcp.calls[0].{field}: {mcp}");
    }
    assert!(
        call["duration_ms"].as_f64().is_some_and(|ms| ms >= 0.0),
        "{what}: mcp.calls[0].duration_ms: {mcp}"
    );
}

/// Asserts `request` (the upstream's view of the turn after the call) ends
/// with the assistant's call `call_id` and the echo tool's answer to it.
fn assert_tool_result(request: &RecordedRequest, call_id: &str, what: &str) {
    let messages = messages(request);
    let tool = messages
        .iter()
        .find(|message| message["role"] == "tool")
        .unwrap_or_else(|| panic!("{what}: a role=tool message: {}", request.body));
    assert_eq!(tool["tool_call_id"], call_id, "{what}: {tool}");
    let content = tool["content"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: tool content is a string: {tool}"));
    assert!(content.contains(ECHOED), "{what}: echo output in {tool}");
    let assistant = messages
        .iter()
        .find(|message| message["role"] == "assistant")
        .unwrap_or_else(|| panic!("{what}: the assistant's turn: {}", request.body));
    assert_eq!(
        assistant["tool_calls"][0]["id"], call_id,
        "{what}: {assistant}"
    );
    assert_eq!(
        assistant["tool_calls"][0]["function"]["name"],
        injected(SERVER, "echo"),
        "{what}: {assistant}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_python_sdk_as_caller() {
    let python = sdk_python();
    let echo = injected(SERVER, "echo");
    let upstream = ScriptedUpstream::start(Script::sequence([
        Reply::tool_call("call_sdk_1", &echo, json!({"text": ECHOED})),
        Reply::text(FINAL_TEXT),
        Reply::tool_call("call_sdk_2", &echo, json!({"text": ECHOED})),
        Reply::text(STREAMED_TEXT),
    ]))
    .await;

    let dir = tempfile::tempdir().expect("temp dir");
    let db_url = format!("sqlite://{}", dir.path().join("quiver.db").display());
    let registry = RegistryProcess::start(&[
        "--database-url",
        &db_url,
        "--admin-token",
        ADMIN,
        "--worker-token",
        WORKER,
    ])
    .await;
    Admin::new(&registry, ADMIN)
        .upsert(json!({
            "server_id": SERVER,
            "transport": "stdio",
            "stdio": {"command": testkit_mcp_bin()},
            "allowed_tools": ["echo"],
        }))
        .await;
    let upstream_url = upstream.base_url();
    let worker = WorkerProcess::start(
        &registry.grpc_url(),
        WORKER,
        CALLER,
        &[
            "--upstream-url",
            upstream_url.as_str(),
            // A variable that is never set: no upstream key at all.
            "--upstream-api-key-env",
            "QUIVER_E2E_NO_UPSTREAM_KEY",
        ],
    )
    .await;
    // The worker's first snapshot already holds the record (upserted before
    // it started); the catalog must offer the echo tool.
    assert_eq!(worker.tool_names().await, vec![echo.clone()]);

    let report = run_sdk(&python, &worker.url()).await;
    let context = || {
        format!(
            "SDK report: {report:#}\nupstream requests: {:#}\nworker log:\n{}",
            Value::Array(upstream.requests().into_iter().map(|r| r.body).collect()),
            worker.log_tail()
        )
    };
    let requests = upstream.requests();
    assert_eq!(
        requests.len(),
        4,
        "two upstream requests per SDK request; {}",
        context()
    );

    // (a) Non-streaming.
    let plain = &report["non_streaming"];
    assert_eq!(plain["error"], Value::Null, "{}", context());
    assert_eq!(plain["object"], "chat.completion", "{}", context());
    assert_eq!(plain["choices"], 1, "{}", context());
    assert_eq!(plain["role"], "assistant", "{}", context());
    assert_eq!(plain["content"], FINAL_TEXT, "{}", context());
    assert_eq!(plain["finish_reason"], "stop", "{}", context());
    assert_eq!(plain["tool_calls"], json!([]), "{}", context());
    assert_eq!(
        plain["usage"],
        scripted_usage(&requests[0..2]),
        "usage summed over both upstream requests; {}",
        context()
    );
    assert_extension(&plain["mcp"], "call_sdk_1", "non-streaming");
    assert_eq!(
        plain["mcp_in_to_dict"],
        plain["mcp"],
        "to_dict() keeps the extension; {}",
        context()
    );

    // (b) Streaming.
    let streamed = &report["streaming"];
    assert_eq!(streamed["error"], Value::Null, "{}", context());
    assert_eq!(streamed["content"], STREAMED_TEXT, "{}", context());
    assert_eq!(
        streamed["objects"],
        json!(["chat.completion.chunk"]),
        "{}",
        context()
    );
    assert_eq!(streamed["roles"], json!(["assistant"]), "{}", context());
    assert_eq!(
        streamed["finish_reasons"],
        json!(["stop"]),
        "one finish_reason; {}",
        context()
    );
    assert_eq!(
        streamed["tool_call_deltas"],
        0,
        "MCP calls are not streamed to the caller; {}",
        context()
    );
    assert!(
        streamed["chunks"].as_u64().is_some_and(|n| n >= 3),
        "the text arrives in several chunks; {}",
        context()
    );
    assert_eq!(streamed["usage_chunks"], 1, "{}", context());
    assert_eq!(
        streamed["usage"],
        scripted_usage(&requests[2..4]),
        "stream usage summed over both upstream requests; {}",
        context()
    );
    assert_eq!(
        streamed["mcp_chunk_has_finish_reason"],
        true,
        "the extension rides on the finish_reason chunk; {}",
        context()
    );
    assert_eq!(
        streamed["mcp_chunks"].as_array().map(Vec::len),
        Some(1),
        "{}",
        context()
    );
    assert_extension(&streamed["mcp"], "call_sdk_2", "streaming");

    // What the upstream saw: the injected tool offered, the caller's token
    // never forwarded, the tool result fed back with its call id.
    for (index, request) in requests.iter().enumerate() {
        let tools = request.body["tools"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            tools
                .iter()
                .any(|tool| tool["function"]["name"] == echo.as_str()),
            "upstream request {index} offers {echo}; {}",
            context()
        );
        assert_eq!(request.body["model"], MODEL, "upstream request {index}");
        assert!(
            request.body.get("mcp").is_none(),
            "upstream request {index} carries no mcp extension: {}",
            request.body
        );
        let authorization = request
            .headers
            .get("authorization")
            .map(|value| value.to_str().unwrap_or_default().to_owned());
        assert!(
            !authorization
                .as_deref()
                .is_some_and(|value| value.contains(CALLER)),
            "upstream request {index} must not carry the caller token: {authorization:?}"
        );
    }
    assert_tool_result(&requests[1], "call_sdk_1", "upstream request 2");
    assert_tool_result(&requests[3], "call_sdk_2", "upstream request 4");

    upstream.shutdown().await;
}
