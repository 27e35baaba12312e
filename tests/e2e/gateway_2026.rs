//! MCP 2026-07-28 at the gateway (issue #23): the official Python SDK's
//! high-level `Client` in its default mode (`server/discover`, no session,
//! every request on its own) against `/mcp/{id}` and `/mcp` of two workers
//! behind a round-robin balancer without affinity, and a 2025-11-25 client
//! (`initialize`, a session) on the same endpoints of one worker (a
//! session's answer to the server's request must reach the worker that
//! sent the request, docs/reference.md §13.4). The upstream is a server
//! of the same SDK over stdio, which the worker speaks the old revision to:
//! its elicitation and sampling during a call reach the new client as
//! `input_required` results, the client's answers resume the call (on
//! whichever worker the retry lands), and reach the old client as requests
//! on its session. (The SDK's server asks by `ctx.elicit` and
//! `create_message`, which it can only do on a session: its record pins
//! `protocol = "2025-11-25"`.)

use std::time::Duration;

use serde_json::{Value, json};

use crate::gateway::{round_robin, upstream_record};
use crate::harness::{
    ADMIN, Admin, CALLER, RegistryProcess, WORKER, WorkerProcess, injected, metric_sum, peer,
    registry, sqlite,
};
use crate::openai_sdk::sdk_python;

/// The SDK's upstream, spoken to in the revision its tools need.
fn legacy_upstream(state: &std::path::Path) -> Value {
    let mut record = upstream_record(state, &["*"]);
    record["protocol"] = json!("2025-11-25");
    record
}

/// A registry holding the SDK's upstream, and the revision to sync to.
struct Upstream {
    _dir: tempfile::TempDir,
    _state: tempfile::TempDir,
    registry: RegistryProcess,
    revision: u64,
}

impl Upstream {
    async fn start() -> Upstream {
        let (dir, db_url) = sqlite();
        let registry = registry(&db_url, None).await;
        let state = tempfile::tempdir().expect("state dir");
        let revision = Admin::new(&registry, ADMIN)
            .upsert(legacy_upstream(state.path()))
            .await;
        Upstream {
            _dir: dir,
            _state: state,
            registry,
            revision,
        }
    }

    /// A worker of this registry, synced.
    async fn worker(&self) -> WorkerProcess {
        let worker =
            WorkerProcess::start(&self.registry.grpc_url(), WORKER, CALLER, &[] as &[&str]).await;
        worker.synced(self.revision, Duration::from_secs(10)).await;
        worker
    }
}

/// Runs `tests/e2e/peers/modern_client.py` with `config`; its report.
pub(crate) async fn modern_client(config: &Value) -> Value {
    let output = tokio::time::timeout(
        Duration::from_secs(180),
        tokio::process::Command::new(sdk_python())
            .arg(peer("modern_client.py"))
            .arg(config.to_string())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the client finished within 180 s")
    .expect("the client ran");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "client failed ({}): {stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|err| panic!("report {stdout:?}: {err}"))
}

fn text(result: &Value) -> String {
    result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// What a client of either revision gets at an endpoint (names as listed there).
fn check(report: &Value, protocol: &str, names: &Value) {
    eprintln!("report: {report:#}");
    assert_eq!(report["protocol_version"], protocol, "{report}");
    let tools: Vec<&str> = report["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("tools listed: {report}"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for tool in ["add", "ask", "think"] {
        let name = names[tool].as_str().expect("name");
        assert!(tools.contains(&name), "{name} listed: {tools:?}");
    }
    assert_eq!(report["add"]["isError"], false, "{report}");
    assert_eq!(report["add"]["structuredContent"], json!({"total": 5}));
    // The server's elicitation reached the person at the client, whose
    // answer reached the server; so did its sampling request.
    assert_eq!(text(&report["ask"]), "colour: teal", "{report}");
    assert_eq!(report["asked"], json!(["Which colour?"]), "{report}");
    assert_eq!(text(&report["think"]), "model said: hi from the client");
    assert_eq!(report["sampled"], 1, "{report}");
    assert_eq!(report["read"][0]["text"], "a public note", "{report}");
    assert_eq!(
        report["greet"][0]["content"]["text"], "Hello, Ada!",
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_revisions_across_two_workers_without_affinity() {
    let upstream = Upstream::start().await;
    let (a, b) = (upstream.worker().await, upstream.worker().await);
    let (balancer, requests) = round_robin(vec![a.url(), b.url()]).await;

    let own = json!({"add": "add", "ask": "ask", "think": "think", "greet": "greet"});
    let catalog = json!({
        "add": injected("py", "add"),
        "ask": injected("py", "ask"),
        "think": injected("py", "think"),
        "greet": injected("py", "greet"),
    });
    for (endpoint, names) in [("/mcp/py", &own), ("/mcp", &catalog)] {
        for (mode, protocol, base) in [
            ("auto", "2026-07-28", &balancer),
            ("legacy", "2025-11-25", &a.url()),
        ] {
            eprintln!("{base}{endpoint} in mode {mode}");
            let report = modern_client(&json!({
                "url": format!("{base}{endpoint}"),
                "token": CALLER,
                "mode": mode,
                "names": names,
                "resource": "notes://public",
            }))
            .await;
            check(&report, protocol, names);
        }
    }
    let sent = requests.load(std::sync::atomic::Ordering::Relaxed);
    assert!(sent >= 16, "{sent} requests through the balancer");
    // Both workers served: each counted discovery and tool calls.
    for worker in [&a, &b] {
        let metrics = format!("{}/metrics", worker.url());
        let discovered = metric_sum(
            &metrics,
            "mcp_gateway_requests_total",
            &["method=\"server/discover\""],
        )
        .await;
        let calls = metric_sum(
            &metrics,
            "mcp_gateway_requests_total",
            &["method=\"tools/call\""],
        )
        .await;
        assert!(
            discovered >= 1.0 && calls >= 3.0,
            "{} served {discovered} discoveries and {calls} calls\n{}",
            worker.url(),
            worker.log_tail()
        );
    }
}

/// A raw 2026-07-28 `tools/call` of `add` to `url` with `extra` params
/// merged in and `headers` on top of the ones the revision asks for; the
/// HTTP status and the JSON-RPC message answered (the first of an SSE stream).
async fn raw_call(url: &str, extra: Value, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut params = json!({
        "name": "add",
        "arguments": {"a": 1, "b": 2},
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        },
    });
    for (key, value) in extra.as_object().expect("object") {
        if key == "_meta" {
            params["_meta"]
                .as_object_mut()
                .expect("meta")
                .extend(value.as_object().expect("meta object").clone());
        } else {
            params[key] = value.clone();
        }
    }
    let mut sent = reqwest::header::HeaderMap::new();
    for (name, value) in [
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "add"),
    ]
    .iter()
    .chain(headers)
    {
        // `headers` replace the defaults of the same name.
        let name = reqwest::header::HeaderName::from_bytes(name.as_bytes()).expect("header name");
        sent.insert(name, value.parse().expect("header value"));
    }
    let response = reqwest::Client::new()
        .post(url)
        .bearer_auth(CALLER)
        .headers(sent)
        .body(
            json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params})
                .to_string(),
        )
        .send()
        .await
        .expect("POST");
    let status = response.status().as_u16();
    let body = response.text().await.expect("body");
    let message = body
        .lines()
        .find_map(|line| line.strip_prefix("data:"))
        .unwrap_or(&body)
        .trim()
        .to_owned();
    (
        status,
        serde_json::from_str(&message).unwrap_or_else(|err| panic!("{body:?}: {err}")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_of_the_new_revision_get_the_specification_errors() {
    let upstream = Upstream::start().await;
    let mut worker = upstream.worker().await;
    let url = format!("{}/mcp/py", worker.url());

    // The well-formed request is answered, without a session id.
    let (status, answer) = raw_call(&url, json!({}), &[]).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["result"]["structuredContent"], json!({"total": 3}));
    assert_eq!(answer["result"]["resultType"], "complete");

    // A requestState the gateway did not issue, or altered: -32602.
    for state in ["garbage", "qs1.e30.AAAA"] {
        let (_, answer) = raw_call(&url, json!({"requestState": state}), &[]).await;
        assert_eq!(answer["error"]["code"], -32602, "{state}: {answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("requestState")),
            "{answer}"
        );
    }

    // A Mcp-Method header that contradicts the body: -32020 (header mismatch).
    let (status, answer) = raw_call(&url, json!({}), &[("mcp-method", "tools/list")]).await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (400, &json!(-32020)),
        "{answer}"
    );

    // An unknown protocol version: the supported ones are named.
    let (status, answer) = raw_call(
        &url,
        json!({"_meta": {"io.modelcontextprotocol/protocolVersion": "2099-01-01"}}),
        &[("mcp-protocol-version", "2099-01-01")],
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"]["data"]["supported"]
            .as_array()
            .is_some_and(|versions| versions.contains(&json!("2026-07-28"))),
        "{answer}"
    );

    // Missing per-request metadata on an otherwise new-revision request: -32602.
    let (status, answer) = raw_call(
        &url,
        json!({"_meta": {"io.modelcontextprotocol/clientCapabilities": null}}),
        &[],
    )
    .await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (400, &json!(-32602)),
        "{answer}"
    );
    assert!(worker.is_running(), "{}", worker.log_tail());
}
