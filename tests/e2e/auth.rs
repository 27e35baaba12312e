//! Credentials (docs/reference.md §12) over both APIs, secret masking in REST reads, and
//! the start-up refusals of unsafe credential configurations.

use std::time::Duration;

use quiver_proto::v1 as pb;
use quiver_testkit::postgres::TestDatabase;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{RegistryProcess, run_quiver, stdio_spec, upsert, upserted_revision};

const ADMIN: &str = "admin-secret";
const WORKER: &str = "worker-secret";

fn code<T: std::fmt::Debug>(result: Result<T, tonic::Status>) -> tonic::Code {
    match result {
        Ok(value) => panic!("expected an error, got {value:?}"),
        Err(status) => status.code(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_grant_exactly_their_roles() {
    let db = TestDatabase::create().await;
    let registry = RegistryProcess::start(&[
        "--database-url",
        db.url(),
        "--admin-token",
        ADMIN,
        "--worker-token",
        WORKER,
    ])
    .await;

    // gRPC writes.
    let mut anonymous = registry.client(None).await;
    let mut worker = registry.client(Some(WORKER)).await;
    let mut admin = registry.client(Some(ADMIN)).await;
    let mut wrong = registry.client(Some("not-a-token")).await;
    assert_eq!(
        code(upsert(&mut anonymous, stdio_spec("grpc-a", "1")).await),
        tonic::Code::Unauthenticated
    );
    assert_eq!(
        code(upsert(&mut worker, stdio_spec("grpc-a", "1")).await),
        tonic::Code::PermissionDenied
    );
    assert_eq!(
        code(upsert(&mut wrong, stdio_spec("grpc-a", "1")).await),
        tonic::Code::Unauthenticated
    );
    let revision = upserted_revision(
        &upsert(&mut admin, stdio_spec("grpc-a", "1"))
            .await
            .expect("admin upsert"),
    );
    assert_eq!(revision, 1, "refused writes must not have written anything");
    assert_eq!(
        code(
            worker
                .delete_mcp_server(pb::DeleteMcpServerRequest {
                    server_id: "grpc-a".into(),
                    expected_revision: None,
                })
                .await
        ),
        tonic::Code::PermissionDenied
    );

    // gRPC reads with the worker token.
    let list = worker
        .list_mcp_servers(pb::ListMcpServersRequest {})
        .await
        .expect("worker list")
        .into_inner();
    assert_eq!(list.revision, 1);
    assert_eq!(list.servers.len(), 1);
    let got = worker
        .get_mcp_server(pb::GetMcpServerRequest {
            server_id: "grpc-a".into(),
        })
        .await
        .expect("worker get")
        .into_inner();
    assert_eq!(got.server.expect("record").revision, 1);
    let mut stream = worker
        .watch_mcp_servers(pb::WatchMcpServersRequest { since_revision: 0 })
        .await
        .expect("worker watch")
        .into_inner();
    let event = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("watch event")
        .expect("watch stream")
        .expect("watch open");
    assert_eq!(
        (event.revision, event.upserts),
        (1, vec!["grpc-a".to_owned()])
    );

    // gRPC reads without or with a wrong token.
    assert_eq!(
        code(
            anonymous
                .list_mcp_servers(pb::ListMcpServersRequest {})
                .await
        ),
        tonic::Code::Unauthenticated
    );
    assert_eq!(
        code(
            wrong
                .get_mcp_server(pb::GetMcpServerRequest {
                    server_id: "grpc-a".into()
                })
                .await
        ),
        tonic::Code::Unauthenticated
    );
    assert_eq!(
        code(
            wrong
                .watch_mcp_servers(pb::WatchMcpServersRequest { since_revision: 0 })
                .await
        ),
        tonic::Code::Unauthenticated
    );

    // REST.
    let http = reqwest::Client::new();
    let servers = format!("{}/admin/api/mcp/servers", registry.http_url());
    let body = json!({
        "server_id": "rest-a",
        "transport": "stdio",
        "stdio": {
            "command": "mcp-test-server",
            "env": {"API_KEY": "sk-literal", "TOKEN": "${ENV:X}"}
        },
        "allowed_tools": ["*"]
    });
    let post = |token: Option<&str>| {
        let request = http.post(&servers).json(&body);
        match token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    };

    let response = post(None).send().await.expect("POST without token");
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let error: Value = response.json().await.expect("JSON error body");
    assert_eq!(error["error"]["code"], "unauthenticated", "{error}");
    assert!(error["error"]["message"].is_string(), "{error}");

    let response = post(Some("not-a-token"))
        .send()
        .await
        .expect("POST with a wrong token");
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);

    let response = post(Some(WORKER))
        .send()
        .await
        .expect("POST with worker token");
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let error: Value = response.json().await.expect("JSON error body");
    assert_eq!(error["error"]["code"], "permission_denied", "{error}");

    let response = post(Some(ADMIN))
        .send()
        .await
        .expect("POST with admin token");
    assert_eq!(response.status(), StatusCode::CREATED);
    let created: Value = response.json().await.expect("stored record");
    assert_eq!(created["revision"], 2);
    assert_eq!(created["server_id"], "rest-a");

    let get = |token: Option<&'static str>| {
        let request = http.get(format!("{servers}/rest-a"));
        async move {
            let request = match token {
                Some(token) => request.bearer_auth(token),
                None => request,
            };
            request.send().await.expect("GET record")
        }
    };
    assert_eq!(get(None).await.status(), StatusCode::UNAUTHORIZED);
    let as_worker = get(Some(WORKER)).await;
    assert_eq!(as_worker.status(), StatusCode::OK);
    let as_worker: Value = as_worker.json().await.expect("JSON record");
    assert_eq!(
        as_worker["stdio"]["env"]["API_KEY"], "********",
        "literal must be masked: {as_worker}"
    );
    assert_eq!(
        as_worker["stdio"]["env"]["TOKEN"], "${ENV:X}",
        "references stay visible: {as_worker}"
    );
    let as_admin: Value = get(Some(ADMIN)).await.json().await.expect("JSON record");
    assert_eq!(
        as_admin["stdio"]["env"]["API_KEY"], "sk-literal",
        "{as_admin}"
    );
    assert_eq!(as_admin["stdio"]["env"]["TOKEN"], "${ENV:X}");

    // The list and history reads are masked for workers too.
    let list: Value = http
        .get(&servers)
        .bearer_auth(WORKER)
        .send()
        .await
        .expect("GET list")
        .json()
        .await
        .expect("JSON list");
    let rest_a = list["servers"]
        .as_array()
        .expect("servers")
        .iter()
        .find(|s| s["server_id"] == "rest-a")
        .expect("rest-a listed");
    assert_eq!(rest_a["stdio"]["env"]["API_KEY"], "********");
    let history: Value = http
        .get(format!("{servers}/rest-a/history"))
        .bearer_auth(WORKER)
        .send()
        .await
        .expect("GET history")
        .json()
        .await
        .expect("JSON history");
    assert_eq!(
        history["entries"][0]["spec"]["stdio"]["env"]["API_KEY"], "********",
        "{history}"
    );

    let response = http
        .delete(format!("{servers}/rest-a"))
        .bearer_auth(WORKER)
        .send()
        .await
        .expect("DELETE with worker token");
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn refuses_to_start_without_credentials_or_off_loopback() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("quiver.db").display());
    let listen = [
        "--grpc-listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
    ];

    let mut args = vec!["registry", "--database-url", &url];
    args.extend(listen);
    let finished = run_quiver(&args, Duration::from_secs(15)).await;
    assert!(
        !finished.status.success(),
        "started without credentials: {finished:?}"
    );
    assert!(
        finished.stderr.contains("--insecure-no-auth"),
        "{}",
        finished.stderr
    );

    let args = [
        "registry",
        "--database-url",
        &url,
        "--insecure-no-auth",
        "--grpc-listen",
        "127.0.0.1:0",
        "--http-listen",
        "0.0.0.0:0",
    ];
    let finished = run_quiver(&args, Duration::from_secs(15)).await;
    assert!(
        !finished.status.success(),
        "insecure registry listened off loopback: {finished:?}"
    );
    assert!(finished.stderr.contains("loopback"), "{}", finished.stderr);

    // The same flag on loopback only is accepted.
    let registry = RegistryProcess::start(&["--database-url", &url, "--insecure-no-auth"]).await;
    let mut anonymous = registry.client(None).await;
    let revision = upserted_revision(
        &upsert(&mut anonymous, stdio_spec("open", "1"))
            .await
            .expect("insecure upsert"),
    );
    assert_eq!(revision, 1);
}

/// Issue #22: `--editor-token` and `--viewer-token-file` (as an operator
/// passes them) grant exactly their roles through the real binary: the
/// viewer reads and gets 403 naming the roles on a write, the editor writes;
/// neither token reaches the log; an empty viewer token file is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn editor_and_viewer_tokens_from_flags_and_files() {
    const EDITOR: &str = "editor-e2e-secret";
    const VIEWER: &str = "viewer-e2e-secret";
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("quiver.db").display());
    let viewer_file = dir.path().join("viewer.token");
    std::fs::write(&viewer_file, format!("{VIEWER}\n")).expect("write token file");
    let viewer_path = viewer_file.display().to_string();
    let registry = RegistryProcess::start(&[
        "--database-url",
        &url,
        "--admin-token",
        ADMIN,
        "--editor-token",
        EDITOR,
        "--viewer-token-file",
        &viewer_path,
    ])
    .await;
    let http = reqwest::Client::new();
    let call = |method: reqwest::Method, path: &str, token: &str, body: Option<Value>| {
        let mut request = http
            .request(method, format!("{}/admin/api{path}", registry.http_url()))
            .bearer_auth(token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        async move {
            let response = request.send().await.expect("request");
            let status = response.status();
            (status, response.json::<Value>().await.expect("JSON body"))
        }
    };
    let record =
        json!({"server_id": "roles-e2e", "transport": "stdio", "stdio": {"command": "true"}});
    for (token, role) in [(EDITOR, "editor"), (VIEWER, "viewer")] {
        let (status, body) = call(reqwest::Method::GET, "/whoami", token, None).await;
        assert_eq!((status, &body["role"]), (StatusCode::OK, &json!(role)));
    }
    let (status, body) = call(
        reqwest::Method::POST,
        "/mcp/servers",
        VIEWER,
        Some(record.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "permission_denied", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("needs the editor role")
            && message.contains("the viewer token may only read"),
        "{message}"
    );
    let (status, body) = call(reqwest::Method::POST, "/mcp/servers", EDITOR, Some(record)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = call(reqwest::Method::GET, "/mcp/servers/roles-e2e", VIEWER, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // gRPC: the viewer may not write.
    let mut viewer = registry.client(Some(VIEWER)).await;
    assert_eq!(
        code(upsert(&mut viewer, stdio_spec("grpc-viewer", "1")).await),
        tonic::Code::PermissionDenied
    );
    let log = registry.log_tail();
    assert!(
        !log.contains(EDITOR) && !log.contains(VIEWER),
        "a token was logged"
    );

    let empty = dir.path().join("empty.token");
    std::fs::write(&empty, "\n").expect("write empty token file");
    let empty_path = empty.display().to_string();
    let other = format!("sqlite://{}", dir.path().join("other.db").display());
    let args = [
        "registry",
        "--database-url",
        &other,
        "--admin-token",
        ADMIN,
        "--viewer-token-file",
        &empty_path,
        "--grpc-listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
    ];
    let finished = run_quiver(&args, Duration::from_secs(15)).await;
    assert!(
        !finished.status.success(),
        "started with an empty viewer token: {finished:?}"
    );
    assert!(
        finished.stderr.contains("viewer-token-file") || finished.stderr.contains("viewer token"),
        "{}",
        finished.stderr
    );
}
