//! Approvals on the tool API across two workers (issue #13): a call of a tool
//! that needs an approval is refused with an `approval_id`; an approver
//! decides over the registry's REST API; the call repeated with the id runs
//! exactly once, on any worker. Real `quiver registry` and two `quiver worker`
//! processes, the testkit MCP server over stdio.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{
    ADMIN, CALLER, RegistryProcess, WORKER, WorkerProcess, injected, peer, sqlite, stdio_record,
};
use crate::openai_sdk::sdk_python;

/// Approvals expire this long after they are requested.
const TTL_SECS: u64 = 4;

/// `POST /v1/mcp/tools/call` with an optional approval id.
async fn call(
    worker: &WorkerProcess,
    name: &str,
    arguments: Value,
    approval: Option<&str>,
) -> (StatusCode, Value) {
    let mut body = json!({"name": name, "arguments": arguments});
    if let Some(id) = approval {
        body["approval_id"] = json!(id);
    }
    let response = reqwest::Client::new()
        .post(format!("{}/v1/mcp/tools/call", worker.url()))
        .bearer_auth(CALLER)
        .json(&body)
        .send()
        .await
        .expect("POST tools/call");
    let status = response.status();
    (status, response.json().await.expect("JSON body"))
}

/// Decides an approval over REST with `token`.
async fn decide(registry: &RegistryProcess, token: &str, id: &str, decision: &str) -> StatusCode {
    reqwest::Client::new()
        .post(format!("{}/admin/api/approvals/{id}", registry.http_url()))
        .bearer_auth(token)
        .json(&json!({"decision": decision, "note": "e2e"}))
        .send()
        .await
        .expect("POST decision")
        .status()
}

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_default()
}

/// A registry on a fresh SQLite file (`extra` flags appended) holding the
/// `guarded` server, whose every call needs an approval.
struct Guarded {
    _dir: tempfile::TempDir,
    registry: RegistryProcess,
    admin: crate::harness::Admin,
    revision: u64,
}

impl Guarded {
    async fn start(extra: &[&str]) -> Guarded {
        let (dir, db_url) = sqlite();
        let mut args = vec![
            "--database-url",
            &db_url,
            "--admin-token",
            ADMIN,
            "--worker-token",
            WORKER,
        ];
        args.extend_from_slice(extra);
        let registry = RegistryProcess::start(&args).await;
        let admin = crate::harness::Admin::new(&registry, ADMIN);
        let mut guarded = stdio_record("guarded", &["*"]);
        guarded["approval_policy"] = json!("always");
        let revision = admin.upsert(guarded).await;
        Guarded {
            _dir: dir,
            registry,
            admin,
            revision,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_runs_its_call_exactly_once_on_any_worker() {
    let ttl = TTL_SECS.to_string();
    let Guarded {
        _dir,
        mut registry,
        admin,
        ..
    } = Guarded::start(&["--approval-ttl-secs", &ttl]).await;
    let revision = admin.upsert(stdio_record("open", &["*"])).await;
    let a = WorkerProcess::start(&registry.grpc_url(), WORKER, CALLER, &[] as &[&str]).await;
    let b = WorkerProcess::start(&registry.grpc_url(), WORKER, CALLER, &[] as &[&str]).await;
    for worker in [&a, &b] {
        worker.synced(revision, Duration::from_secs(10)).await;
    }
    let add = injected("guarded", "add");
    let args = json!({"a": 2, "b": 3});

    // Requested on A: refused with the approval to ask for.
    let (status, body) = call(&a, &add, args.clone(), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(code(&body), "mcp_approval_required");
    let id = body["error"]["approval_id"]
        .as_str()
        .expect("approval_id")
        .to_owned();

    // Pending, it cannot be used; the worker token cannot decide it.
    let (status, body) = call(&b, &add, args.clone(), Some(&id)).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::FORBIDDEN, "mcp_approval_invalid"),
        "{body}"
    );
    assert_eq!(
        decide(&registry, WORKER, &id, "approve").await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        decide(&registry, ADMIN, &id, "approve").await,
        StatusCode::OK
    );

    // Approved for 2 + 3: other arguments are refused, the call runs on B,
    // once; a replay on A is refused.
    let (status, body) = call(&b, &add, json!({"a": 2, "b": 4}), Some(&id)).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::FORBIDDEN, "mcp_approval_invalid"),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("arguments_hash"),
        "{body}"
    );
    let (status, body) = call(&b, &add, args.clone(), Some(&id)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["content"][0]["text"], "5");
    let (status, body) = call(&a, &add, args.clone(), Some(&id)).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::FORBIDDEN, "mcp_approval_invalid"),
        "{body}"
    );

    // Denied: mcp_approval_denied.
    let (_, body) = call(&a, &add, args.clone(), None).await;
    let denied = body["error"]["approval_id"]
        .as_str()
        .expect("approval_id")
        .to_owned();
    assert_eq!(
        decide(&registry, ADMIN, &denied, "deny").await,
        StatusCode::OK
    );
    let (status, body) = call(&a, &add, args.clone(), Some(&denied)).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::FORBIDDEN, "mcp_approval_denied"),
        "{body}"
    );

    // Expired: can be neither decided nor used.
    let (_, body) = call(&a, &add, args.clone(), None).await;
    let late = body["error"]["approval_id"]
        .as_str()
        .expect("approval_id")
        .to_owned();
    tokio::time::sleep(Duration::from_secs(TTL_SECS + 1)).await;
    assert_eq!(
        decide(&registry, ADMIN, &late, "approve").await,
        StatusCode::CONFLICT
    );
    let (status, body) = call(&b, &add, args.clone(), Some(&late)).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::FORBIDDEN, "mcp_approval_invalid"),
        "{body}"
    );

    // Every transition left an audit line and a count by state.
    for action in [
        "approval_requested",
        "approval_approved",
        "approval_used",
        "approval_denied",
        "approval_expired",
    ] {
        assert!(registry.logged(action), "no {action} audit line");
    }
    let metrics = reqwest::get(format!("{}/metrics", registry.http_url()))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text");
    for state in ["pending", "approved", "used", "denied", "expired"] {
        assert!(
            metrics.contains(&format!("quiver_approvals_total{{state=\"{state}\"}}")),
            "no count for {state}"
        );
    }

    // Registry down: calls needing an approval are mcp_unavailable, the
    // others keep working.
    registry.kill_hard();
    let (status, body) = call(&a, &add, args.clone(), None).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::SERVICE_UNAVAILABLE, "mcp_unavailable"),
        "{body}"
    );
    let (status, body) = call(&a, &injected("open", "add"), args, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// Runs `tests/e2e/peers/approval_client.py` in `mode`; its report.
async fn approval_client(worker: &WorkerProcess, registry: &RegistryProcess, mode: &str) -> Value {
    let output = tokio::time::timeout(
        Duration::from_secs(90),
        tokio::process::Command::new(sdk_python())
            .arg(peer("approval_client.py"))
            .args([
                &format!("{}/mcp/guarded", worker.url()),
                CALLER,
                &registry.http_url(),
                ADMIN,
                mode,
            ])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the client finished within 90 s")
    .expect("the client ran");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.trim()).expect("report JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_calls_ask_for_their_approval_through_mcp() {
    let Guarded {
        _dir,
        registry,
        revision,
        ..
    } = Guarded::start(&[]).await;
    let worker = WorkerProcess::start(&registry.grpc_url(), WORKER, CALLER, &[] as &[&str]).await;
    worker.synced(revision, Duration::from_secs(10)).await;

    // The client was asked, approved, and the call ran.
    let asked_and_ran = |report: &Value| {
        assert!(
            report["asked"].as_str().is_some_and(|m| m.contains("apr_")),
            "{report}"
        );
        assert_eq!(report["approved"], json!([200]), "{report}");
        assert_eq!(report["first"]["isError"], false, "{report}");
        assert_eq!(report["first"]["content"][0]["text"], "5", "{report}");
    };
    // A client that can be asked: elicitation, then the call runs.
    asked_and_ran(&approval_client(&worker, &registry, "elicit").await);

    // A client of 2026-07-28 (no session): asked by an `input_required`
    // result; its retry with the answer runs the call once approved.
    let report = approval_client(&worker, &registry, "modern").await;
    assert_eq!(report["protocol_version"], "2026-07-28", "{report}");
    asked_and_ran(&report);

    // One that cannot: a tool error with the approval's id, and the call
    // repeated with it in _meta runs.
    let report = approval_client(&worker, &registry, "retry").await;
    assert_eq!(report["first"]["isError"], true, "{report}");
    assert_eq!(
        report["first"]["structuredContent"]["error"]["code"], "mcp_approval_required",
        "{report}"
    );
    assert!(
        report["approval_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("apr_")),
        "{report}"
    );
    assert_eq!(report["second"]["isError"], false, "{report}");
    assert_eq!(report["second"]["content"][0]["text"], "5", "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_stops_for_an_approval_and_resumes_with_it() {
    use quiver_testkit::upstream::{Reply, Script, ScriptedUpstream};

    let Guarded {
        _dir,
        registry,
        revision,
        ..
    } = Guarded::start(&[]).await;
    let add = injected("guarded", "add");
    // The model asks for the call; asked again after the approval, it asks
    // for the same call, then answers.
    let upstream = ScriptedUpstream::start(Script::sequence([
        Reply::tool_call("c1", &add, json!({"a": 2, "b": 3})),
        Reply::tool_call("c2", &add, json!({"a": 2, "b": 3})),
        Reply::text("2 + 3 = 5"),
    ]))
    .await;
    let worker = WorkerProcess::start(
        &registry.grpc_url(),
        WORKER,
        CALLER,
        &["--upstream-url", &upstream.base_url()],
    )
    .await;
    worker.synced(revision, Duration::from_secs(10)).await;
    let chat = |approvals: Value| {
        let body = json!({
            "model": "m",
            "messages": [{"role": "user", "content": "add 2 and 3"}],
            "mcp": {"enabled": true, "approvals": approvals},
        });
        let url = format!("{}/v1/chat/completions", worker.url());
        async move {
            let response = reqwest::Client::new()
                .post(url)
                .bearer_auth(CALLER)
                .json(&body)
                .send()
                .await
                .expect("chat");
            let status = response.status();
            (status, response.json::<Value>().await.expect("chat JSON"))
        }
    };

    // The loop stops with the pending approval; the call did not run.
    let (status, body) = chat(json!([])).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["mcp"]["stop_reason"], "approval_required", "{body}");
    let pending = &body["mcp"]["approvals"][0];
    assert_eq!(pending["name"], add.as_str(), "{body}");
    // As the model sent them (a JSON string, in the chat API's form).
    let arguments: Value =
        serde_json::from_str(pending["arguments"].as_str().expect("arguments")).expect("JSON");
    assert_eq!(arguments, json!({"a": 2, "b": 3}), "{body}");
    let id = pending["approval_id"]
        .as_str()
        .expect("approval_id")
        .to_owned();
    assert_eq!(upstream.requests().len(), 1);

    // Approved, the conversation sent again runs the call and finishes.
    assert_eq!(
        decide(&registry, ADMIN, &id, "approve").await,
        StatusCode::OK
    );
    let (status, body) = chat(json!([id])).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["mcp"]["stop_reason"], "completed", "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "2 + 3 = 5");
    let last = upstream.requests().last().expect("requests").body.clone();
    let tool_message = last["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .find(|m| m["role"] == "tool")
        .cloned()
        .expect("the tool's answer went to the model");
    assert_eq!(tool_message["content"], "5", "{tool_message}");
}

/// A second caller token of the worker in
/// [`pending_approvals_are_capped_per_caller_through_the_worker`].
const OTHER_CALLER: &str = "e2e-approvals-other-caller";

async fn call_as(
    worker: &WorkerProcess,
    token: &str,
    name: &str,
    arguments: Value,
) -> (StatusCode, Value) {
    let response = reqwest::Client::new()
        .post(format!("{}/v1/mcp/tools/call", worker.url()))
        .bearer_auth(token)
        .json(&json!({"name": name, "arguments": arguments}))
        .send()
        .await
        .expect("POST tools/call");
    let status = response.status();
    (status, response.json().await.expect("JSON body"))
}

/// Issue #21 item 3 through a real worker: the worker names the caller
/// (`requested_by` = its token's principal); identical pending calls of one
/// caller share one approval; a caller at the registry's cap
/// (`--max-pending-approvals`) is refused naming it, another caller of the
/// same worker is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_approvals_are_capped_per_caller_through_the_worker() {
    let Guarded {
        _dir,
        registry,
        revision,
        ..
    } = Guarded::start(&["--max-pending-approvals", "2"]).await;
    let config = tempfile::tempdir().expect("tempdir");
    let path = config.path().join("worker.toml");
    std::fs::write(
        &path,
        format!("[[callers]]\ntoken = \"{OTHER_CALLER}\"\ntask = \"other\"\n\n[tasks.other]\n"),
    )
    .expect("worker config");
    let worker = WorkerProcess::start(
        &registry.grpc_url(),
        WORKER,
        CALLER,
        &["--config", path.to_str().expect("utf-8 path")],
    )
    .await;
    worker.synced(revision, Duration::from_secs(10)).await;
    let add = injected("guarded", "add");
    let approval_of = |body: &Value| body["error"]["approval_id"].as_str().map(str::to_owned);

    let (status, body) = call_as(&worker, CALLER, &add, json!({"a": 1, "b": 1})).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let first = approval_of(&body).expect("approval_id");
    let (_, body) = call_as(&worker, CALLER, &add, json!({"a": 1, "b": 1})).await;
    assert_eq!(
        approval_of(&body).as_deref(),
        Some(first.as_str()),
        "merged"
    );
    let (_, body) = call_as(&worker, CALLER, &add, json!({"a": 1, "b": 2})).await;
    assert!(approval_of(&body).is_some(), "{body}");
    let (status, body) = call_as(&worker, CALLER, &add, json!({"a": 1, "b": 3})).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::TOO_MANY_REQUESTS, "resource_exhausted"),
        "{body}"
    );
    assert_eq!(approval_of(&body), None, "{body}");
    assert_eq!(body["error"]["retryable"], json!(true), "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("max_pending_approvals") && message.contains('2'),
        "{body}"
    );
    // The other caller of the same worker is unaffected, and its approval
    // names it, not the first caller.
    let (_, body) = call_as(&worker, OTHER_CALLER, &add, json!({"a": 1, "b": 1})).await;
    let other = approval_of(&body).expect("other caller's approval");
    assert_ne!(other, first);
    let shown = |id: String| {
        let url = format!("{}/admin/api/approvals/{id}", registry.http_url());
        async move {
            reqwest::Client::new()
                .get(url)
                .bearer_auth(ADMIN)
                .send()
                .await
                .expect("GET approval")
                .json::<Value>()
                .await
                .expect("approval JSON")
        }
    };
    let (mine, theirs) = (shown(first).await, shown(other).await);
    let mine = mine["requested_by"].as_str().unwrap_or_default().to_owned();
    let theirs = theirs["requested_by"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        mine.starts_with("token:") && theirs.starts_with("token:"),
        "{mine} {theirs}"
    );
    assert_ne!(mine, theirs);
}
