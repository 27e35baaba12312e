//! Security properties with real processes (docs/reference.md §12): the egress allowlist
//! of the HTTP transports (worker and registry preview), token files,
//! secrets kept out of logs, and stdio children that cannot read the
//! worker's environment unless their record passes a variable.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::harness::{
    Admin, McpServerProcess, RegistryProcess, WorkerProcess, eventually, run_quiver,
    testkit_mcp_bin,
};
use crate::worker::{ADMIN, CALLER, WORKER, injected, registry, stdio_record};

/// A SQLite registry in a temporary directory with its admin API.
async fn sqlite_registry() -> (RegistryProcess, Admin, TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let db_url = format!("sqlite://{}", dir.path().join("quiver.db").display());
    let registry = registry(&db_url, None).await;
    let admin = Admin::new(&registry, ADMIN);
    (registry, admin, dir)
}

/// A streamable HTTP record of the test server at `url`.
fn http_record(server_id: &str, url: &str) -> Value {
    json!({
        "server_id": server_id,
        "transport": "streamable_http",
        "http": {"url": url},
        "allowed_tools": ["echo"],
    })
}

/// Waits until the worker's snapshot is at `revision`.
async fn synced(worker: &WorkerProcess, revision: u64) {
    eventually(
        Duration::from_secs(5),
        &format!("worker at revision {revision}"),
        || async move {
            let (_, ready) = worker.readyz().await;
            (ready["revision"] == revision).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_allowlist_refuses_hosts_outside_it_before_connecting() {
    let (registry, admin, _dir) = sqlite_registry().await;
    let server = McpServerProcess::start("streamable-http").await;
    let url = server.url().to_owned();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let by_name = url.replace("127.0.0.1", "localhost");
    admin.upsert(http_record("outside", &url)).await;
    admin.upsert(http_record("by-name", &by_name)).await;
    // The legacy SSE transport is held to the same list.
    let sse = McpServerProcess::start("sse").await;
    let mut sse_outside = http_record("sse-outside", sse.url());
    sse_outside["transport"] = json!("http_sse_legacy");
    admin.upsert(sse_outside).await;
    let mut sse_by_name = http_record("sse-by-name", &sse.url().replace("127.0.0.1", "localhost"));
    sse_by_name["transport"] = json!("http_sse_legacy");
    let revision = admin.upsert(sse_by_name).await;

    // Allowed: the host name `localhost`, and 10.0.0.0/8 (which excludes 127.0.0.1).
    let worker = WorkerProcess::start(
        &registry.grpc_url(),
        WORKER,
        CALLER,
        &[
            "--egress-allow-host",
            "localhost",
            "--egress-allow-cidr",
            "10.0.0.0/8",
        ],
    )
    .await;
    synced(&worker, revision).await;
    let mut allowed = vec![injected("by-name", "echo"), injected("sse-by-name", "echo")];
    allowed.sort();
    assert_eq!(
        worker.tool_names().await,
        allowed,
        "only the allowed host's tools are listed"
    );
    assert_eq!(
        worker
            .call_text(&injected("sse-by-name", "echo"), json!({"text": "sse"}))
            .await,
        "sse"
    );
    let (status, body) = worker
        .call(&injected("sse-outside", "echo"), json!({"text": "refused"}))
        .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (StatusCode::FORBIDDEN, &json!("mcp_policy_denied")),
        "{body}"
    );
    assert_eq!(
        worker
            .call_text(&injected("by-name", "echo"), json!({"text": "allowed"}))
            .await,
        "allowed"
    );
    let (status, body) = worker
        .call(&injected("outside", "echo"), json!({"text": "refused"}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "mcp_policy_denied", "{body}");
    assert_eq!(body["error"]["retryable"], false, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("\"127.0.0.1\"") && message.contains("--egress-allow-host"),
        "the error names the host and how to allow it: {body}"
    );
    let outside = worker.server("outside").await.expect("outside listed");
    assert_eq!(outside["state"], "down", "{outside}");
    let last_error = outside["last_error"].as_str().unwrap_or_default();
    assert!(last_error.contains("egress"), "{outside}");
    assert!(last_error.contains("127.0.0.1"), "{outside}");

    // Allowed through a CIDR: `localhost` is resolved, every address must be
    // inside, and the connection is pinned to the checked addresses.
    let by_cidr = WorkerProcess::start(
        &registry.grpc_url(),
        WORKER,
        CALLER,
        &["--egress-allow-cidr", "127.0.0.0/8,::1/128"],
    )
    .await;
    synced(&by_cidr, revision).await;
    assert_eq!(
        by_cidr
            .call_text(&injected("by-name", "echo"), json!({"text": "pinned"}))
            .await,
        "pinned"
    );
    assert_eq!(
        by_cidr
            .call_text(&injected("outside", "echo"), json!({"text": "literal"}))
            .await,
        "literal"
    );

    // The registry's tool preview obeys the same allowlist.
    let guarded = RegistryProcess::start(&[
        "--database-url",
        &format!("sqlite://{}", _dir.path().join("preview.db").display()),
        "--admin-token",
        ADMIN,
        "--egress-allow-host",
        "localhost",
    ])
    .await;
    let client = reqwest::Client::new();
    let preview = |record: Value| {
        let request = client
            .post(format!("{}/admin/api/mcp/preview", guarded.http_url()))
            .bearer_auth(ADMIN)
            .json(&record);
        async move {
            let response = request.send().await.expect("preview request");
            let status = response.status();
            (
                status,
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    let (status, body) = preview(http_record("outside", &url)).await;
    assert!(!status.is_success(), "{status} {body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("egress") && message.contains("127.0.0.1"),
        "{body}"
    );
    let (status, body) = preview(http_record("by-name", &by_name)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_reads_its_tokens_from_files() {
    let dir = tempfile::tempdir().expect("temp dir");
    let admin_file = dir.path().join("admin.token");
    let worker_file = dir.path().join("worker.token");
    std::fs::write(&admin_file, "file-admin-token\n").unwrap();
    std::fs::write(&worker_file, "  file-worker-token  \n").unwrap();
    let db_url = format!("sqlite://{}", dir.path().join("quiver.db").display());
    let registry = RegistryProcess::start(&[
        "--database-url",
        db_url.as_str(),
        "--admin-token-file",
        admin_file.to_str().unwrap(),
        "--worker-token-file",
        worker_file.to_str().unwrap(),
    ])
    .await;
    let client = reqwest::Client::new();
    for (token, role) in [
        ("file-admin-token", "admin"),
        ("file-worker-token", "worker"),
    ] {
        let response = client
            .get(format!("{}/admin/api/whoami", registry.http_url()))
            .bearer_auth(token)
            .send()
            .await
            .expect("whoami");
        assert_eq!(response.status(), StatusCode::OK, "{role}");
        let body: Value = response.json().await.expect("json");
        assert_eq!(body["role"], role);
    }
    let admin = Admin::new(&registry, "file-admin-token");
    admin
        .upsert(stdio_record("from-file-token", &["echo"]))
        .await;
    // A worker takes caller tokens from a file (here through the env), in
    // addition to --caller-token.
    let callers = dir.path().join("callers");
    std::fs::write(&callers, "# callers of task default\nfile-caller-token\n\n").unwrap();
    let worker = WorkerProcess::start_with_env(
        &registry.grpc_url(),
        "file-worker-token",
        CALLER,
        &[] as &[&str],
        &[("QUIVER_CALLER_TOKEN_FILE", callers.to_str().unwrap())],
    )
    .await;
    for (token, status) in [
        ("file-caller-token", StatusCode::OK),
        (CALLER, StatusCode::OK),
        ("# callers of task default", StatusCode::UNAUTHORIZED),
    ] {
        let response = client
            .get(format!("{}/v1/mcp/tools", worker.url()))
            .bearer_auth(token)
            .send()
            .await
            .expect("tools");
        assert_eq!(response.status(), status, "{token}");
    }
    // A worker names the flag of a token file it cannot read.
    let finished = run_quiver(
        &[
            "worker",
            "--registry",
            &registry.grpc_url(),
            "--token-file",
            dir.path().join("missing").to_str().unwrap(),
        ],
        Duration::from_secs(10),
    )
    .await;
    assert!(!finished.status.success());
    assert!(
        finished.stderr.contains("--token-file"),
        "{}",
        finished.stderr
    );
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let finished = run_quiver(
        &[
            "registry",
            "--database-url",
            db_url.as_str(),
            "--admin-token-file",
            empty.to_str().unwrap(),
        ],
        Duration::from_secs(10),
    )
    .await;
    assert!(!finished.status.success());
    assert!(
        finished.stderr.contains("--admin-token-file") && finished.stderr.contains("empty"),
        "{}",
        finished.stderr
    );
}

const SECRET_ENV: &str = "env-secret-5f1d9c";
const SECRET_HEADER: &str = "header-secret-a7e203";
const SECRET_ARG: &str = "argument-secret-90b4ce";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_reach_the_logs() {
    let (registry, admin, _dir) = sqlite_registry().await;
    let server = McpServerProcess::start("streamable-http").await;
    let mut stdio = stdio_record("with-env", &["echo", "fail", "add"]);
    stdio["stdio"]["env"] = json!({"API_KEY": SECRET_ENV});
    admin.upsert(stdio).await;
    let mut http = http_record("with-header", server.url());
    http["http"]["headers"] = json!({"Authorization": format!("Bearer {SECRET_HEADER}")});
    let revision = admin.upsert(http).await;
    // A record refused with the secret in it (an invalid header name).
    let response = reqwest::Client::new()
        .post(format!("{}/admin/api/mcp/servers", registry.http_url()))
        .bearer_auth(ADMIN)
        .json(&json!({
            "server_id": "invalid",
            "transport": "streamable_http",
            "http": {"url": "http://127.0.0.1:1/mcp", "headers": {"X-Key": SECRET_HEADER}},
            "stdio": {"command": "x", "env": {"K": SECRET_ENV}},
        }))
        .send()
        .await
        .expect("invalid upsert");
    assert!(response.status().is_client_error());

    // At debug level, the most a worker writes.
    let worker = WorkerProcess::start_with_env(
        &registry.grpc_url(),
        WORKER,
        CALLER,
        &[] as &[&str],
        &[("RUST_LOG", "debug")],
    )
    .await;
    synced(&worker, revision).await;
    assert_eq!(worker.tool_names().await.len(), 4);
    assert_eq!(
        worker
            .call_text(&injected("with-env", "echo"), json!({"text": SECRET_ARG}))
            .await,
        SECRET_ARG
    );
    assert_eq!(
        worker
            .call_text(
                &injected("with-header", "echo"),
                json!({"text": SECRET_ARG})
            )
            .await,
        SECRET_ARG
    );
    // A tool error carrying the secret, invalid arguments carrying it, and
    // a name that does not resolve.
    let (_, body) = worker
        .call(
            &injected("with-env", "fail"),
            json!({"message": SECRET_ARG}),
        )
        .await;
    assert_eq!(body["is_error"], true, "{body}");
    let (status, _) = worker
        .call(
            &injected("with-env", "add"),
            json!({"a": SECRET_ARG, "b": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = worker
        .call(
            &injected("with-env", "nope"),
            json!({"password": SECRET_ARG}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = worker.get("/v1/mcp/servers").await;
    assert_eq!(status, StatusCode::OK);
    // Reads of the records (masked and not) through the registry.
    for path in ["", "?masked=true"] {
        let response = reqwest::Client::new()
            .get(format!(
                "{}/admin/api/mcp/servers{path}",
                registry.http_url()
            ))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("list");
        assert_eq!(response.status(), StatusCode::OK);
    }
    // Audit and request lines are written when requests finish.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The harness keeps the last 200 lines: all of them, so nothing escaped.
    let lines = worker.log_tail().lines().count();
    assert!(lines < 200, "{lines} log lines: some were not kept");
    assert!(worker.logged("quiver::audit"), "{}", worker.log_tail());
    for secret in [SECRET_ENV, SECRET_HEADER, SECRET_ARG] {
        assert!(
            !worker.logged(secret),
            "worker logged {secret}:\n{}",
            worker.log_tail()
        );
        assert!(
            !registry.logged(secret),
            "registry logged {secret}:\n{}",
            registry.log_tail()
        );
    }
}

/// A stdio record whose server first writes what it sees of `SECRET_X` to
/// stderr (kept in the worker's diagnostics), then runs the test server.
fn env_probe_record(server_id: &str) -> Value {
    json!({
        "server_id": server_id,
        "transport": "stdio",
        "stdio": {
            "command": "/bin/sh",
            "args": [
                "-c",
                "printf 'SECRET_X=[%s]\\n' \"$SECRET_X\" >&2; exec \"$0\"",
                testkit_mcp_bin(),
            ],
        },
        "allowed_tools": ["echo"],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_servers_cannot_read_the_workers_environment_unless_passed() {
    const SECRET: &str = "worker-only-secret-3c81";
    let (registry, admin, _dir) = sqlite_registry().await;
    admin.upsert(env_probe_record("isolated")).await;
    let mut passed = env_probe_record("passed");
    passed["stdio"]["env_from"] = json!(["SECRET_X"]);
    admin.upsert(passed).await;
    let mut referenced = env_probe_record("referenced");
    referenced["stdio"]["env"] = json!({"SECRET_X": "${ENV:SECRET_X}"});
    let revision = admin.upsert(referenced).await;
    let worker = WorkerProcess::start_with_env(
        &registry.grpc_url(),
        WORKER,
        CALLER,
        &[] as &[&str],
        &[("SECRET_X", SECRET)],
    )
    .await;
    synced(&worker, revision).await;
    for (server_id, seen) in [
        ("isolated", "SECRET_X=[]".to_owned()),
        ("passed", format!("SECRET_X=[{SECRET}]")),
        ("referenced", format!("SECRET_X=[{SECRET}]")),
    ] {
        assert_eq!(
            worker
                .call_text(&injected(server_id, "echo"), json!({"text": "hi"}))
                .await,
            "hi"
        );
        let entry = worker.server(server_id).await.expect("listed");
        let tail: Vec<&str> = entry["stderr_tail"]
            .as_array()
            .expect("stderr_tail")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            tail.contains(&seen.as_str()),
            "{server_id}: expected {seen:?} in {entry}"
        );
    }
}

/// A server that prints its literal secrets to stderr: callers of the
/// worker's `/v1/mcp/servers` read its stderr tail with the record's secret
/// values masked (issue #10.12).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stderr_tails_do_not_show_the_records_secrets() {
    const SECRET: &str = "sk-literal-in-record-7d2e";
    let (registry, admin, _dir) = sqlite_registry().await;
    let mut record = env_probe_record("leaky");
    record["stdio"]["env"] = json!({"SECRET_X": SECRET});
    let revision = admin.upsert(record).await;
    let worker =
        WorkerProcess::start_with_env(&registry.grpc_url(), WORKER, CALLER, &[] as &[&str], &[])
            .await;
    synced(&worker, revision).await;
    assert_eq!(
        worker
            .call_text(&injected("leaky", "echo"), json!({"text": "hi"}))
            .await,
        "hi"
    );
    let entry = worker.server("leaky").await.expect("listed");
    let tail = entry["stderr_tail"].to_string();
    assert!(!tail.contains(SECRET), "{SECRET} in {entry}");
    assert!(
        tail.contains(&format!("SECRET_X=[{}]", quiver_model::MASK)),
        "{entry}"
    );
}
