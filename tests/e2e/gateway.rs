//! Gateway mode (issue #12): the worker's MCP endpoints used by the official
//! Python SDK (`mcp` 2.x) as the client, over streamable HTTP to `/mcp` and
//! `/mcp/{id}` and over stdio through `quiver mcp-stdio`, in front of a
//! server of the same SDK (`tests/e2e/peers/gateway_upstream.py`); one
//! client alternating between two workers behind a round-robin balancer;
//! and the endpoints' refusals (no token, foreign `Host`/`Origin`, bad
//! JSON-RPC, unknown sessions). Issue #21: deleted and expired session ids
//! stay dead on every worker, resumed sessions count against the caps, one
//! caller cannot take every slot, and a registry outage fails open within
//! its bound.
//!
//! The client (`tests/e2e/peers/gateway_client.py`) runs every step and
//! prints a JSON report; the tests check it here.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{ADMIN, CALLER, injected, metric_sum, metrics_text, peer, quiver_bin};
use crate::openai_sdk::sdk_python;
use crate::stack::Stack;

/// The upstream's record: one call at a time (so a call after a cancelled
/// one proves the slot was freed), one public resource, one prompt.
pub(crate) fn upstream_record(state_dir: &Path, allowed_tools: &[&str]) -> Value {
    json!({
        "server_id": "py",
        "transport": "stdio",
        "stdio": {
            "command": sdk_python(),
            "args": [peer("gateway_upstream.py"), state_dir.display().to_string()],
        },
        "allowed_tools": allowed_tools,
        "allowed_resources": ["notes://public"],
        "allowed_prompts": ["greet"],
        "budgets": {"max_concurrency": 1, "tool_timeout_ms": 60000},
    })
}

/// Where the upstream notes cancelled calls, in the stack's directory.
fn state_dir(dir: &Path) -> PathBuf {
    dir.join("state")
}

/// A stack with the upstream registered.
async fn start() -> Stack {
    let builder = Stack::builder();
    let state = state_dir(builder.dir());
    std::fs::create_dir(&state).expect("state dir");
    builder
        .record(upstream_record(&state, &["*"]))
        .start()
        .await
}

/// The client's config: tool and prompt names as `endpoint` lists them,
/// and the edit that drops the `fail` tool.
fn client_config(stack: &Stack, transport: Value, catalog: bool) -> Value {
    let name = |tool: &str| {
        if catalog {
            injected("py", tool)
        } else {
            tool.to_owned()
        }
    };
    let state = state_dir(stack.dir());
    let mut config = json!({
        "names": {"add": name("add"), "slow": name("slow"), "fail": name("fail"), "grow": name("grow"), "greet": name("greet")},
        "state_dir": state,
        "edit": {
            "url": format!("{}/admin/api/mcp/servers", stack.registry.http_url()),
            "token": ADMIN,
            "record": upstream_record(&state, &["add", "slow"]),
        },
    });
    config
        .as_object_mut()
        .expect("object")
        .extend(transport.as_object().expect("object").clone());
    config
}

/// Runs the Python client with `config`; returns its report.
async fn run_client(config: &Value) -> Value {
    let mut command = tokio::process::Command::new(sdk_python());
    command
        .arg(peer("gateway_client.py"))
        .arg(config.to_string())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(180), command.output())
        .await
        .expect("the Python client finished within 180 s")
        .expect("the Python client ran");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "client failed ({}): {stdout}\n{stderr}",
        output.status
    );
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|err| panic!("report {stdout:?}: {err}\n{stderr}"))
}

fn text_of(content: &Value) -> String {
    content
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// What every endpoint and transport must show (the names differ).
fn check_report(report: &Value, catalog: bool) {
    check_report_but(report, catalog, &[]);
}

/// [`check_report`] without the steps in `skipped`.
fn check_report_but(report: &Value, catalog: bool, skipped: &[&str]) {
    eprintln!("report: {report:#}");
    let name = |tool: &str| {
        if catalog {
            injected("py", tool)
        } else {
            tool.to_owned()
        }
    };
    let tools = report["tools"].as_array().expect("tools listed");
    let add = tools
        .iter()
        .find(|t| t["name"] == name("add"))
        .unwrap_or_else(|| panic!("add listed: {tools:?}"));
    // Passed through: description, schemas, annotations; the title too,
    // prefixed with the server on the catalog endpoint.
    assert_eq!(add["annotations"]["readOnlyHint"], true);
    assert_eq!(
        add["outputSchema"]["properties"]["total"]["type"],
        "integer"
    );
    assert_eq!(add["description"], "Adds a and b.");
    let title = if catalog {
        "py · Add two numbers"
    } else {
        "Add two numbers"
    };
    assert_eq!(add["title"], title);
    assert_eq!(report["add"]["structuredContent"], json!({"total": 5}));
    assert_eq!(report["add"]["isError"], false);
    assert_eq!(report["fail"]["isError"], true, "{}", report["fail"]);
    assert!(
        report["unknown_tool"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("unknown tool")),
        "{}",
        report["unknown_tool"]
    );
    // Resources and prompts through the record's allow lists.
    assert_eq!(report["resources"], json!(["notes://public"]));
    assert_eq!(text_of(&report["read_public"]), "a public note");
    assert!(
        report["read_secret"]["error"].is_string(),
        "{}",
        report["read_secret"]
    );
    let prompts: Vec<&str> = report["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(prompts, [name("greet")]);
    assert!(
        report["greet"].to_string().contains("Hello, Ada!"),
        "{}",
        report["greet"]
    );
    // Progress of the upstream reaches the client.
    assert!(
        report["progress"]["progress"].as_u64().unwrap_or(0) >= 5,
        "{}",
        report["progress"]
    );
    // A cancelled call is cancelled upstream and its slot freed (the
    // record allows one call at a time).
    if !skipped.contains(&"cancel") {
        let cancel = &report["cancel"];
        let saw = cancel["upstream_saw_cancel_after_s"].as_f64();
        assert!(saw.is_some_and(|s| s < 5.0), "{cancel}");
        assert_eq!(
            cancel["next_call"]["structuredContent"],
            json!({"total": 2}),
            "{cancel}"
        );
    }
    // The upstream's own tools/list_changed reaches the client, and the
    // next listing has the new tool.
    if !skipped.contains(&"upstream_changed") {
        let grown = &report["upstream_changed"];
        assert_eq!(grown["notified"], true, "{grown}");
        assert!(
            grown["tools"]
                .as_array()
                .expect("tools")
                .iter()
                .any(|t| *t == name("grown")),
            "{grown}"
        );
    }
    // An admin edit reaches the open session as tools/list_changed.
    let changed = &report["list_changed"];
    assert_eq!(changed["status"], 200, "{changed}");
    assert_eq!(changed["notified"], true, "{changed}");
    assert!(
        !changed["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .any(|t| *t == name("fail")),
        "{changed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_client_uses_one_server_as_itself() {
    let stack = start().await;
    let config = client_config(
        &stack,
        json!({"transport": "http", "url": format!("{}/mcp/py", stack.worker.url()), "token": CALLER}),
        false,
    );
    let report = run_client(&config).await;
    assert_eq!(report["initialize"]["server"], "python-upstream");
    assert_eq!(
        report["initialize"]["instructions"],
        "a test server behind the gateway"
    );
    check_report(&report, false);
    // Metrics and the audit line with the MCP session id.
    let metrics = format!("{}/metrics", stack.worker.url());
    assert!(
        metric_sum(
            &metrics,
            "mcp_gateway_requests_total",
            &["method=\"tools/call\"", "status=\"200\""]
        )
        .await
            >= 5.0
    );
    let audit = stack.worker.logged_lines("mcp tool call");
    assert!(
        audit.iter().any(|line| line.contains("\"session_id\":\"") && !line.contains("\"session_id\":\"\"")),
        "{audit:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_client_uses_the_whole_catalog() {
    let stack = start().await;
    let config = client_config(
        &stack,
        json!({"transport": "http", "url": format!("{}/mcp", stack.worker.url()), "token": CALLER}),
        true,
    );
    let report = run_client(&config).await;
    assert_eq!(report["initialize"]["server"], "quiver-gateway");
    check_report(&report, true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_client_over_stdio_through_mcp_stdio() {
    let stack = start().await;
    let config = client_config(
        &stack,
        json!({
            "transport": "stdio",
            "command": quiver_bin(),
            "args": ["mcp-stdio", "--worker", stack.worker.url(), "--server", "py"],
            "env": {"QUIVER_TOKEN": CALLER},
        }),
        false,
    );
    let report = run_client(&config).await;
    assert_eq!(report["initialize"]["server"], "python-upstream");
    check_report(&report, false);
}

/// A plain HTTP load balancer: each request goes to the next backend in
/// turn (responses, SSE streams included, are streamed back).
pub(crate) async fn round_robin(backends: Vec<String>) -> (String, Arc<AtomicUsize>) {
    use axum::body::Body;
    use axum::extract::Request;
    use axum::response::Response;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind balancer");
    let addr = listener.local_addr().expect("addr");
    let next = Arc::new(AtomicUsize::new(0));
    let counter = next.clone();
    let client = reqwest::Client::new();
    let app = axum::Router::new().fallback(move |request: Request| {
        let backend = backends[counter.fetch_add(1, Ordering::Relaxed) % backends.len()].clone();
        let client = client.clone();
        async move {
            let (parts, body) = request.into_parts();
            let url = format!(
                "{backend}{}",
                parts.uri.path_and_query().map_or("/", |p| p.as_str())
            );
            let body = axum::body::to_bytes(body, 16 << 20)
                .await
                .unwrap_or_default();
            let mut forwarded = client.request(parts.method, url).body(body);
            for (name, value) in &parts.headers {
                if name != "host" && name != "content-length" {
                    forwarded = forwarded.header(name, value);
                }
            }
            match forwarded.send().await {
                Ok(upstream) => {
                    let mut response = Response::builder().status(upstream.status());
                    for (name, value) in upstream.headers() {
                        response = response.header(name, value);
                    }
                    response
                        .body(Body::from_stream(upstream.bytes_stream()))
                        .expect("response")
                }
                Err(err) => Response::builder()
                    .status(502)
                    .body(Body::from(err.to_string()))
                    .expect("response"),
            }
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), next)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_alternating_between_two_workers_keeps_its_session() {
    let stack = start().await;
    // Same registry token, so the same session-signing key (no extra setup).
    let second = stack.start_worker(&[]).await;
    let (balancer, requests) = round_robin(vec![stack.worker.url(), second.url()]).await;
    // Two steps depend on which worker a request lands on, not on the
    // session: a `notifications/cancelled` is applied by the worker it
    // reaches (the call may run on the other one), and each worker runs its
    // own process of a stdio server, so a tool one of them adds at run time
    // is not on the other (docs/reference.md §13.4). Registry edits reach
    // the session whichever worker holds its stream.
    let skipped = ["cancel", "upstream_changed"];
    let config = client_config(
        &stack,
        json!({"transport": "http", "url": format!("{balancer}/mcp/py"), "token": CALLER, "skip": skipped}),
        false,
    );
    let report = run_client(&config).await;
    check_report_but(&report, false, &skipped);
    let sent = requests.load(Ordering::Relaxed);
    assert!(sent >= 10, "{sent} requests through the balancer");
    // Both workers served the session: each counted tool calls.
    for worker in [&stack.worker, &second] {
        let calls = metric_sum(
            &format!("{}/metrics", worker.url()),
            "mcp_gateway_requests_total",
            &[],
        )
        .await;
        assert!(calls >= 5.0, "{} served {calls} requests", worker.url());
        assert!(
            worker.logged_lines("Session not found").is_empty(),
            "{}",
            worker.log_tail()
        );
    }
}

/// A raw JSON-RPC POST to `url`.
async fn post(
    url: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
    body: &str,
) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body.to_owned());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.expect("POST")
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoints_refuse_what_they_must() {
    let stack = start().await;
    let url = format!("{}/mcp/py", stack.worker.url());

    // No token: 401 with the challenge the MCP authorization spec asks for,
    // pointing at metadata that is served.
    let response = post(&url, None, &[], INITIALIZE).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let challenge = response.headers()["www-authenticate"]
        .to_str()
        .expect("ascii")
        .to_owned();
    assert!(
        challenge.starts_with("Bearer resource_metadata=\""),
        "{challenge}"
    );
    let metadata_url = challenge
        .trim_start_matches("Bearer resource_metadata=\"")
        .trim_end_matches('"');
    let metadata: Value = reqwest::get(metadata_url)
        .await
        .expect("GET metadata")
        .json()
        .await
        .expect("metadata JSON");
    assert_eq!(metadata["bearer_methods_supported"], json!(["header"]));

    // DNS rebinding: a foreign Host or Origin is refused, token or not.
    for headers in [
        [("host", "evil.example.com")],
        [("origin", "http://evil.example.com")],
    ] {
        let response = post(&url, Some(CALLER), &headers, INITIALIZE).await;
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{headers:?}");
        let body: Value = response.json().await.expect("error JSON");
        assert_eq!(body["error"]["code"], "forbidden_origin");
    }

    // A session: its id works for its caller only.
    let response = post(&url, Some(CALLER), &[], INITIALIZE).await;
    assert_eq!(response.status(), StatusCode::OK);
    let session = response.headers()["mcp-session-id"]
        .to_str()
        .expect("ascii")
        .to_owned();
    let _ = response.text().await;
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    let with_session = [
        ("mcp-session-id", session.as_str()),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    assert!(
        post(&url, Some(CALLER), &with_session, initialized)
            .await
            .status()
            .is_success()
    );
    let listed = post(&url, Some(CALLER), &with_session, list).await;
    assert_eq!(listed.status(), StatusCode::OK);
    assert!(listed.text().await.expect("body").contains("\"add\""));
    // Another endpoint, or a forged id: 404 (initialize again).
    let other_endpoint = post(
        &format!("{}/mcp", stack.worker.url()),
        Some(CALLER),
        &with_session,
        list,
    )
    .await;
    assert_eq!(other_endpoint.status(), StatusCode::NOT_FOUND);
    let forged = format!("{session}x");
    let forged = post(
        &url,
        Some(CALLER),
        &[("mcp-session-id", forged.as_str())],
        list,
    )
    .await;
    assert_eq!(forged.status(), StatusCode::NOT_FOUND);

    // Bad JSON-RPC: the transport's errors, the worker keeps serving.
    for body in [
        "{not json",
        r#"{"jsonrpc":"2.0","id":3,"method":"no/such/method"}"#,
    ] {
        let response = post(&url, Some(CALLER), &with_session, body).await;
        let status = response.status();
        let text = response.text().await.expect("body");
        assert!(
            status == StatusCode::BAD_REQUEST || text.contains("-32601") || text.contains("-32700"),
            "{body}: {status} {text}"
        );
    }
    // Over the body limit: 413, named.
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{{"name":"add","arguments":{{"pad":"{}"}}}}}}"#,
        "x".repeat(3 << 20)
    );
    let response = post(&url, Some(CALLER), &with_session, &huge).await;
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let (status, _) = stack.worker.readyz().await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_beyond_the_cap_are_refused_and_open_ones_keep_working() {
    let stack = start().await;
    let capped = stack.start_worker(&["--mcp-max-sessions", "1"]).await;
    let url = format!("{}/mcp/py", capped.url());
    let first = post(&url, Some(CALLER), &[], INITIALIZE).await;
    assert_eq!(first.status(), StatusCode::OK);
    let session = first.headers()["mcp-session-id"]
        .to_str()
        .expect("ascii")
        .to_owned();
    let _ = first.text().await;
    let second = post(&url, Some(CALLER), &[], INITIALIZE).await;
    assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = second.json().await.expect("error JSON");
    assert_eq!(body["error"]["code"], "mcp_unavailable");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_sessions = 1")),
        "{body}"
    );
    // The open session is unaffected.
    let with_session = [
        ("mcp-session-id", session.as_str()),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    assert!(
        post(&url, Some(CALLER), &with_session, initialized)
            .await
            .status()
            .is_success()
    );
    let listed = post(
        &url,
        Some(CALLER),
        &with_session,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    )
    .await;
    assert_eq!(listed.status(), StatusCode::OK);
}

// Issue #21: session lifecycle and the edge.

/// Opens a session at `url` for `token`: its signed id, once the client
/// said `notifications/initialized`.
async fn open_session(url: &str, token: &str) -> String {
    let response = post(url, Some(token), &[], INITIALIZE).await;
    assert_eq!(response.status(), StatusCode::OK, "initialize at {url}");
    let session = response.headers()["mcp-session-id"]
        .to_str()
        .expect("ascii")
        .to_owned();
    let _ = response.text().await;
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let response = post(url, Some(token), &session_headers(&session), initialized).await;
    assert!(response.status().is_success(), "initialized at {url}");
    session
}

fn session_headers(session: &str) -> [(&str, &str); 2] {
    [
        ("mcp-session-id", session),
        ("mcp-protocol-version", "2025-11-25"),
    ]
}

/// `tools/list` on `session` at `url`: the status and the body.
async fn list_tools(url: &str, token: &str, session: &str) -> (StatusCode, String) {
    let response = post(
        url,
        Some(token),
        &session_headers(session),
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    )
    .await;
    (response.status(), response.text().await.expect("body"))
}

/// The worker's refusal of a request that would open a session: 503
/// `mcp_unavailable` whose message names `cap`.
async fn assert_capped(response: reqwest::Response, cap: &str) {
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = response.json().await.expect("error JSON");
    assert_eq!(body["error"]["code"], "mcp_unavailable", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(cap)),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_session_stays_deleted_on_every_worker() {
    let stack = start().await;
    let second = stack.start_worker(&[]).await;
    let first_url = format!("{}/mcp/py", stack.worker.url());
    let second_url = format!("{}/mcp/py", second.url());
    let session = open_session(&first_url, CALLER).await;
    // Live on both workers: opened on the first, resumed on the second.
    for url in [&first_url, &second_url] {
        let (status, body) = list_tools(url, CALLER, &session).await;
        assert_eq!(status, StatusCode::OK, "{url}: {body}");
    }
    let deleted = reqwest::Client::new()
        .delete(&first_url)
        .bearer_auth(CALLER)
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await
        .expect("DELETE");
    assert!(deleted.status().is_success(), "{}", deleted.status());
    // The same worker: gone, for good.
    let (status, body) = list_tools(&first_url, CALLER, &session).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(body.contains("deleted"), "{body}");
    // A worker that never held it refuses to restore it (the registry knows).
    let third = stack.start_worker(&[]).await;
    let (status, body) = list_tools(&format!("{}/mcp/py", third.url()), CALLER, &session).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    // The worker where it was live ends it on its next check.
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    let (status, body) = list_tools(&second_url, CALLER, &session).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, _) = list_tools(&second_url, CALLER, &session).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // New sessions are unaffected.
    let fresh = open_session(&second_url, CALLER).await;
    assert_eq!(
        list_tools(&second_url, CALLER, &fresh).await.0,
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_session_id_is_refused() {
    let stack = start().await;
    let short = stack
        .start_worker(&["--mcp-max-session-lifetime-ms", "1500"])
        .await;
    let url = format!("{}/mcp/py", short.url());
    let session = open_session(&url, CALLER).await;
    assert_eq!(list_tools(&url, CALLER, &session).await.0, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    let (status, body) = list_tools(&url, CALLER, &session).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(body.contains("max_session_lifetime"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_resumed_from_another_worker_count_against_the_cap() {
    let stack = start().await;
    let capped = stack
        .start_worker(&[
            "--mcp-max-sessions",
            "2",
            "--mcp-max-sessions-per-caller",
            "2",
        ])
        .await;
    let opener = format!("{}/mcp/py", stack.worker.url());
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(open_session(&opener, CALLER).await);
    }
    let url = format!("{}/mcp/py", capped.url());
    for session in &sessions[..2] {
        let (status, body) = list_tools(&url, CALLER, session).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let refused = post(
        &url,
        Some(CALLER),
        &session_headers(&sessions[2]),
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    )
    .await;
    assert_capped(refused, "max_sessions = 2").await;
    // A new session is refused the same way; the resumed ones keep working.
    assert_capped(
        post(&url, Some(CALLER), &[], INITIALIZE).await,
        "max_sessions = 2",
    )
    .await;
    assert_eq!(
        list_tools(&url, CALLER, &sessions[0]).await.0,
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_jsonrpc_bodies_get_400_with_their_codes() {
    let stack = start().await;
    let url = format!("{}/mcp/py", stack.worker.url());
    let session = open_session(&url, CALLER).await;
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{{"name":"add","arguments":{{"a":{}1{}}}}}}}"#,
        "[".repeat(5_000),
        "]".repeat(5_000)
    );
    let cases = [
        (
            r#"{"jsonrpc":"2.0","id":null,"method":"tools/list"}"#,
            -32600,
        ),
        (
            r#"{"jsonrpc":"2.0","id":{"x":1},"method":"tools/list"}"#,
            -32600,
        ),
        (
            r#"{"jsonrpc":"2.0","id":[1,2],"method":"tools/list"}"#,
            -32600,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":7}"#,
            -32600,
        ),
        (deep.as_str(), -32700),
    ];
    for (body, code) in cases {
        for headers in [&session_headers(&session)[..], &[]] {
            let response = post(&url, Some(CALLER), headers, body).await;
            let status = response.status();
            let text = response.text().await.expect("body");
            let short = &body[..body.len().min(80)];
            assert_eq!(status, StatusCode::BAD_REQUEST, "{short}: {text}");
            let error: Value = serde_json::from_str(&text).expect("JSON-RPC error");
            assert_eq!(error["error"]["code"], code, "{short}: {text}");
        }
    }
    // A 2026-07-28 call the edge would answer itself (no session, the
    // transport's headers, its `_meta`) is held to the same depth, even
    // nested within what a JSON parser would take (100 levels).
    let plain_deep = format!(
        r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{{"name":"add","arguments":{{"a":{}1{}}},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{{"name":"t","version":"1"}},"io.modelcontextprotocol/clientCapabilities":{{}}}}}}}}"#,
        "[".repeat(100),
        "]".repeat(100)
    );
    let plain_headers = [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "add"),
    ];
    let response = post(&url, Some(CALLER), &plain_headers, &plain_deep).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let error: Value = response.json().await.expect("JSON-RPC error");
    assert_eq!(error["error"]["code"], -32700, "{error}");
    let (status, _) = stack.worker.readyz().await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list_tools(&url, CALLER, &session).await.0, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialize_for_unavailable_servers_only_is_refused_and_not_counted() {
    let stack = start().await;
    let capped = stack.start_worker(&["--mcp-max-sessions", "1"]).await;
    for endpoint in ["/mcp?server_ids=ghost,nope", "/mcp/ghost"] {
        let response = post(
            &format!("{}{endpoint}", capped.url()),
            Some(CALLER),
            &[],
            INITIALIZE,
        )
        .await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{endpoint}");
        assert!(response.headers().get("mcp-session-id").is_none());
        let body: Value = response.json().await.expect("error JSON");
        assert_eq!(body["error"]["code"], "not_found", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("\"ghost\"")),
            "{body}"
        );
    }
    // Nothing was counted: the one slot is still free, and a list that
    // names one available server among absent ones is served.
    let session = open_session(&format!("{}/mcp?server_ids=py,ghost", capped.url()), CALLER).await;
    assert!(!session.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_caller_cannot_take_every_gateway_session_slot() {
    const OTHER: &str = "e2e-other-caller-token";
    let stack = start().await;
    let worker = stack
        .start_worker(&["--mcp-max-sessions", "8", "--caller-token", OTHER])
        .await;
    let url = format!("{}/mcp/py", worker.url());
    // Default share: a quarter of max_sessions.
    for _ in 0..2 {
        open_session(&url, CALLER).await;
    }
    assert_capped(
        post(&url, Some(CALLER), &[], INITIALIZE).await,
        "max_sessions_per_caller = 2",
    )
    .await;
    // Another caller is unaffected.
    let other = open_session(&url, OTHER).await;
    assert_eq!(list_tools(&url, OTHER, &other).await.0, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_outage_fails_open_within_the_bound() {
    use nix::sys::signal::Signal;
    let stack = start().await;
    let second = stack.start_worker(&[]).await;
    let first_url = format!("{}/mcp/py", stack.worker.url());
    let second_url = format!("{}/mcp/py", second.url());
    let deleted = open_session(&first_url, CALLER).await;
    let other = open_session(&first_url, CALLER).await;
    // The registry stops answering (its sockets stay open).
    stack.registry.signal(Signal::SIGSTOP);
    // A deletion holds on the worker that answered it, within the bound.
    let started = std::time::Instant::now();
    let response = reqwest::Client::new()
        .delete(&first_url)
        .bearer_auth(CALLER)
        .header("mcp-session-id", &deleted)
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await
        .expect("DELETE");
    assert!(response.status().is_success(), "{}", response.status());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        list_tools(&first_url, CALLER, &deleted).await.0,
        StatusCode::NOT_FOUND
    );
    // Another worker resumes a session after one bounded wait (fail open),
    // and so does the next (without asking again while the registry is
    // quiet; the bound is what is asserted, the machine may be slow).
    let started = std::time::Instant::now();
    let (status, body) = list_tools(&second_url, CALLER, &other).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let third = open_session(&first_url, CALLER).await;
    let started = std::time::Instant::now();
    assert_eq!(
        list_tools(&second_url, CALLER, &third).await.0,
        StatusCode::OK
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    stack.registry.signal(Signal::SIGCONT);
    let unshared = counter(
        &stack.worker.url(),
        "mcp_gateway_revocations_unshared_total",
    )
    .await;
    assert_eq!(unshared, 1.0);
    let failed = counter(&second.url(), "mcp_gateway_revocation_checks_failed_total").await;
    assert!(failed >= 1.0, "{failed}");
}

/// A counter of the worker at `url`, labelled or not.
async fn counter(url: &str, name: &str) -> f64 {
    let page = metrics_text(&format!("{url}/metrics")).await;
    page.lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}
