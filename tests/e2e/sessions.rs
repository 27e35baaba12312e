//! Per-session isolation (issue #13): a stateful server of the official
//! Python SDK (`tests/e2e/peers/session_store.py`, an in-memory `put`/`get`
//! store) behind real `quiver registry` and `quiver worker` processes. With
//! `isolation = "per_session"` each `x-quiver-session` gets its own process;
//! with `shared` every caller sees one store. A session is its caller's
//! own (issue #21): a second caller token naming the same session, or a
//! gateway session's id, gets a session of its own.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::harness::{ADMIN, CALLER, WorkerProcess, eventually, injected, metric_sum, peer};
use crate::openai_sdk::sdk_python;
use crate::stack::Stack;

fn store_record(server_id: &str, isolation: &str) -> Value {
    json!({
        "server_id": server_id,
        "transport": "stdio",
        "stdio": {"command": sdk_python(), "args": [peer("session_store.py")]},
        "allowed_tools": ["*"],
        "isolation": isolation,
    })
}

/// A second caller token of the worker (task `default`, like [`CALLER`]).
const OTHER: &str = "e2e-other-caller-token";

/// A stack with a per-session and a shared store, and a worker with
/// `pool` as its `[pool]` section and callers [`CALLER`] and [`OTHER`].
async fn start(pool: &str) -> Stack {
    Stack::builder()
        .record(store_record("isolated", "per_session"))
        .record(store_record("shared", "shared"))
        .worker_config(&format!("[pool]\n{pool}\n"))
        .worker_args(&["--caller-token", OTHER])
        .start()
        .await
}

/// Calls `tool` of `server_id` in `session` (none: no header).
async fn call(
    stack: &Stack,
    server_id: &str,
    session: Option<&str>,
    tool: &str,
    arguments: Value,
) -> (StatusCode, Value) {
    call_as(stack, CALLER, server_id, session, tool, arguments).await
}

/// [`call`] with caller token `token`.
async fn call_as(
    stack: &Stack,
    token: &str,
    server_id: &str,
    session: Option<&str>,
    tool: &str,
    arguments: Value,
) -> (StatusCode, Value) {
    let mut request = reqwest::Client::new()
        .post(format!("{}/v1/mcp/tools/call", stack.worker.url()))
        .bearer_auth(token)
        .json(&json!({"name": injected(server_id, tool), "arguments": arguments}));
    if let Some(session) = session {
        request = request.header("x-quiver-session", session);
    }
    let response = request.send().await.expect("POST tools/call");
    let status = response.status();
    (status, response.json().await.expect("JSON body"))
}

async fn put(stack: &Stack, server_id: &str, session: &str, value: &str) {
    let (status, body) = call(
        stack,
        server_id,
        Some(session),
        "put",
        json!({"key": "k", "value": value}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// The value `get` answers in `session`, and the pid that answered.
async fn get(stack: &Stack, server_id: &str, session: &str) -> (String, i32) {
    get_as(stack, CALLER, server_id, session).await
}

/// [`get`] with caller token `token`.
async fn get_as(stack: &Stack, token: &str, server_id: &str, session: &str) -> (String, i32) {
    let (status, body) = call_as(
        stack,
        token,
        server_id,
        Some(session),
        "get",
        json!({"key": "k"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let text = body["content"][0]["text"]
        .as_str()
        .expect("text")
        .to_owned();
    let (value, pid) = text.rsplit_once('@').expect("value@pid");
    (value.to_owned(), pid.parse().expect("pid"))
}

async fn end_session(stack: &Stack, session: &str) -> (StatusCode, Value) {
    end_session_as(stack, CALLER, session).await
}

/// [`end_session`] with caller token `token`.
async fn end_session_as(stack: &Stack, token: &str, session: &str) -> (StatusCode, Value) {
    let response = reqwest::Client::new()
        .delete(format!("{}/v1/sessions/{session}", stack.worker.url()))
        .bearer_auth(token)
        .send()
        .await
        .expect("DELETE session");
    let status = response.status();
    (status, response.json().await.expect("JSON body"))
}

async fn sessions_of(stack: &Stack, server_id: &str) -> u64 {
    stack
        .worker
        .server(server_id)
        .await
        .and_then(|s| s["sessions"].as_u64())
        .unwrap_or(0)
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_session_servers_keep_sessions_apart() {
    let stack = start("").await;

    // Isolated: session B does not see session A's value; each has a process.
    put(&stack, "isolated", "A", "alpha").await;
    let (b_value, b_pid) = get(&stack, "isolated", "B").await;
    let (a_value, a_pid) = get(&stack, "isolated", "A").await;
    assert_eq!((a_value.as_str(), b_value.as_str()), ("alpha", ""));
    assert_ne!(a_pid, b_pid);
    assert_eq!(sessions_of(&stack, "isolated").await, 2);
    let metrics = format!("{}/metrics", stack.worker.url());
    assert_eq!(
        metric_sum(
            &metrics,
            "mcp_session_connections",
            &["server_id=\"isolated\""]
        )
        .await,
        2.0
    );

    // The registry (and its web admin) show the live sessions per server,
    // from the worker's status reports.
    let workers_url = format!("{}/admin/api/workers", stack.registry.http_url());
    let client = &reqwest::Client::new();
    eventually(
        Duration::from_secs(20),
        "sessions in the worker's report",
        || async {
            let workers: Value = client
                .get(&workers_url)
                .bearer_auth(ADMIN)
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            workers["workers"][0]["servers"]
                .as_array()?
                .iter()
                .any(|s| s["server_id"] == "isolated" && s["session_connections"] == 2)
                .then_some(())
        },
    )
    .await;

    // Shared: one store for everyone.
    put(&stack, "shared", "A", "beta").await;
    assert_eq!(get(&stack, "shared", "B").await.0, "beta");

    // No session: refused, naming the header; nothing shared silently.
    let (status, body) = call(&stack, "isolated", None, "get", json!({"key": "k"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "invalid_request");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("x-quiver-session")),
        "{body}"
    );

    // Ending session A ends its process; A starts afresh; B is untouched.
    let (status, body) = end_session(&stack, "A").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["connections_ended"], 1);
    eventually(
        Duration::from_secs(10),
        "session A's process ended",
        || async { (!alive(a_pid)).then_some(()) },
    )
    .await;
    let (fresh, fresh_pid) = get(&stack, "isolated", "A").await;
    assert_eq!(fresh, "");
    assert_ne!(fresh_pid, a_pid);
    assert_eq!(get(&stack, "isolated", "B").await, (String::new(), b_pid));
    let (status, _) = end_session(&stack, "no-such-session").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // A record change starts every session afresh.
    let mut changed = store_record("isolated", "per_session");
    changed["budgets"] = json!({"tool_timeout_ms": 20000});
    stack.upsert(changed).await;
    eventually(
        Duration::from_secs(10),
        "old session processes ended",
        || async { (!alive(b_pid) && !alive(fresh_pid)).then_some(()) },
    )
    .await;

    // Shutdown leaves no process behind.
    let (_, c_pid) = get(&stack, "isolated", "C").await;
    let mut stack = stack;
    let (status, _) = stack.worker_mut().terminate(Duration::from_secs(15)).await;
    assert!(status.success(), "worker exit {status}");
    assert!(!alive(c_pid), "session process {c_pid} outlived the worker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_connections_are_capped_and_expire_when_idle() {
    let stack =
        // Idle long enough that the live sessions outlast the refusal below
        // on a loaded machine; short enough for the test to see them end.
        start("max_session_connections_per_server = 2\nsession_idle_timeout_ms = 5000")
            .await;
    let (_, first) = get(&stack, "isolated", "one").await;
    get(&stack, "isolated", "two").await;
    // A third session is refused; the two live ones are not evicted.
    let (status, body) = call(
        &stack,
        "isolated",
        Some("three"),
        "get",
        json!({"key": "k"}),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "mcp_unavailable");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("session capacity")),
        "{body}"
    );
    assert_eq!(get(&stack, "isolated", "one").await.1, first);
    // Idle sessions end (their processes too), which makes room again.
    eventually(Duration::from_secs(30), "idle sessions ended", || async {
        (sessions_of(&stack, "isolated").await == 0 && !alive(first)).then_some(())
    })
    .await;
    let (status, body) = call(
        &stack,
        "isolated",
        Some("three"),
        "get",
        json!({"key": "k"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// An MCP session on a worker's `/mcp/{server_id}`, spoken raw.
struct McpSession {
    client: reqwest::Client,
    url: String,
    id: String,
}

/// The JSON-RPC message of an SSE or JSON answer body.
fn message_of(body: &str) -> Value {
    body.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(str::trim)
        .filter(|data| !data.is_empty())
        .find_map(|data| serde_json::from_str(data).ok())
        .or_else(|| serde_json::from_str(body).ok())
        .unwrap_or_else(|| panic!("no JSON-RPC message in {body:?}"))
}

impl McpSession {
    async fn open(worker: &WorkerProcess, server_id: &str) -> McpSession {
        let client = reqwest::Client::new();
        let url = format!("{}/mcp/{server_id}", worker.url());
        let response = client
            .post(&url)
            .bearer_auth(CALLER)
            .header("accept", "application/json, text/event-stream")
            .json(
                &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "raw", "version": "1"}}}),
            )
            .send()
            .await
            .expect("initialize");
        assert_eq!(response.status(), StatusCode::OK);
        let id = response.headers()["mcp-session-id"]
            .to_str()
            .expect("ascii")
            .to_owned();
        let _ = response.text().await;
        let session = McpSession { client, url, id };
        session
            .send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        session
    }

    async fn send(&self, message: Value) -> String {
        self.client
            .post(&self.url)
            .bearer_auth(CALLER)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &self.id)
            .header("mcp-protocol-version", "2025-11-25")
            .json(&message)
            .send()
            .await
            .expect("POST")
            .text()
            .await
            .expect("body")
    }

    /// Calls `tool`; returns its text.
    async fn call(&self, tool: &str, arguments: Value) -> String {
        let body = self
            .send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": tool, "arguments": arguments}}))
            .await;
        let message = message_of(&body);
        message["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("{message}"))
            .to_owned()
    }

    async fn close(&self) {
        let status = self
            .client
            .delete(&self.url)
            .bearer_auth(CALLER)
            .header("mcp-session-id", &self.id)
            .send()
            .await
            .expect("DELETE")
            .status();
        assert!(status.is_success(), "{status}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_sessions_are_the_sessions_of_per_session_servers() {
    let stack = start("").await;
    let one = McpSession::open(&stack.worker, "isolated").await;
    let two = McpSession::open(&stack.worker, "isolated").await;
    one.call("put", json!({"key": "k", "value": "mine"})).await;
    let (theirs, two_pid) = two
        .call("get", json!({"key": "k"}))
        .await
        .rsplit_once('@')
        .map(|(v, p)| (v.to_owned(), p.parse::<i32>().expect("pid")))
        .expect("value@pid");
    let (mine, one_pid) = one
        .call("get", json!({"key": "k"}))
        .await
        .rsplit_once('@')
        .map(|(v, p)| (v.to_owned(), p.parse::<i32>().expect("pid")))
        .expect("value@pid");
    assert_eq!((mine.as_str(), theirs.as_str()), ("mine", ""));
    assert_ne!(one_pid, two_pid);
    // Ending the MCP session ends its server process; the other lives on.
    one.close().await;
    eventually(
        Duration::from_secs(10),
        "session one's process ended",
        || async { (!alive(one_pid)).then_some(()) },
    )
    .await;
    assert!(alive(two_pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_sets_its_own_session_idle_time() {
    let stack = start("").await;
    let mut quick = store_record("quick", "per_session");
    quick["budgets"] = json!({"session_idle_ms": 1000});
    stack.upsert(quick).await;
    let (_, pid) = get(&stack, "quick", "s").await;
    let (_, kept) = get(&stack, "isolated", "s").await;
    // The record's 1 s applies to its sessions; the worker's 10 minutes to
    // the other record's.
    eventually(
        Duration::from_secs(10),
        "the quick session ended",
        || async { (sessions_of(&stack, "quick").await == 0 && !alive(pid)).then_some(()) },
    )
    .await;
    assert_eq!(sessions_of(&stack, "isolated").await, 1);
    assert!(alive(kept));
    // Out of bounds: refused naming the field.
    let mut bad = store_record("bad", "per_session");
    bad["budgets"] = json!({"session_idle_ms": 10});
    let (status, body) = stack
        .admin
        .rest(Method::POST, "/admin/api/mcp/servers", Some(bad))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["field"], "budgets.session_idle_ms", "{body}");
}

/// Issue #21 item 1: caller B naming caller A's session gets a session of
/// its own (B's empty store, another process), and B's DELETE of that name
/// does not end A's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_name_is_its_callers_own() {
    let stack = start("").await;
    put(&stack, "isolated", "alice-sess", "alice-secret").await;
    let (_, alice_pid) = get(&stack, "isolated", "alice-sess").await;

    // B cannot end A's session: B has none of that name.
    let (status, body) = end_session_as(&stack, OTHER, "alice-sess").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "not_found", "{body}");
    assert!(alive(alice_pid));
    assert_eq!(
        get(&stack, "isolated", "alice-sess").await,
        ("alice-secret".to_owned(), alice_pid)
    );

    // B naming it gets its own, empty store in another process.
    let (bobs, bob_pid) = get_as(&stack, OTHER, "isolated", "alice-sess").await;
    assert_eq!(bobs, "", "B read A's session state");
    assert_ne!(bob_pid, alice_pid);
    assert_eq!(sessions_of(&stack, "isolated").await, 2);

    // B ends its own session of that name; A's lives on.
    let (status, body) = end_session_as(&stack, OTHER, "alice-sess").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["connections_ended"], 1);
    eventually(
        Duration::from_secs(10),
        "B's session process ended",
        || async { (!alive(bob_pid)).then_some(()) },
    )
    .await;
    assert_eq!(
        get(&stack, "isolated", "alice-sess").await,
        ("alice-secret".to_owned(), alice_pid)
    );
}

/// Issue #21 item 1: a gateway session's per-session connection is keyed
/// in the gateway's own namespace, so its id (the part before the
/// signature, which audit lines print) named as `x-quiver-session` on the
/// tool API reaches another session, whoever names it, and cannot be ended
/// with `DELETE /v1/sessions/{id}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_session_is_not_reachable_by_its_id_on_the_tool_api() {
    let stack = start("").await;
    let gateway = McpSession::open(&stack.worker, "isolated").await;
    gateway
        .call("put", json!({"key": "k", "value": "gateway-secret"}))
        .await;
    let answer = gateway.call("get", json!({"key": "k"})).await;
    let (value, pid) = answer.rsplit_once('@').expect("value@pid");
    assert_eq!(value, "gateway-secret");
    let gateway_pid: i32 = pid.parse().expect("pid");
    let inner = gateway.id.split('.').next().expect("inner id").to_owned();

    for token in [OTHER, CALLER] {
        let (status, body) = end_session_as(&stack, token, &inner).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        let (value, pid) = get_as(&stack, token, "isolated", &inner).await;
        assert_eq!(
            value, "",
            "the tool API reached the gateway session's state"
        );
        assert_ne!(pid, gateway_pid);
    }
    assert!(alive(gateway_pid));
    let answer = gateway.call("get", json!({"key": "k"})).await;
    assert_eq!(answer, format!("gateway-secret@{gateway_pid}"));
}

/// Issue #21 item 8: one caller at `max_session_connections_per_caller` is
/// refused a new session, naming the cap; its live ones are kept, and
/// another caller still opens one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_caller_cannot_take_every_session_slot() {
    let stack =
        start("max_session_connections_per_caller = 2\nmax_session_connections_per_server = 3")
            .await;
    let (_, first) = get(&stack, "isolated", "a1").await;
    get(&stack, "isolated", "a2").await;
    let (status, body) = call(&stack, "isolated", Some("a3"), "get", json!({"key": "k"})).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "mcp_unavailable");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_session_connections_per_caller = 2")),
        "{body}"
    );
    assert_eq!(get(&stack, "isolated", "a1").await.1, first, "not evicted");
    let (status, body) = call_as(
        &stack,
        OTHER,
        "isolated",
        Some("b1"),
        "get",
        json!({"key": "k"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(sessions_of(&stack, "isolated").await, 3);
}
