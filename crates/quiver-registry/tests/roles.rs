//! Roles on the registry (issue #22, docs/reference.md §5): `admin` does
//! everything, `editor` writes MCP server records, `viewer` only reads,
//! `approver` only reads and decides approvals, and the worker token keeps
//! its reads. A refusal is 403 `permission_denied` naming the role needed and
//! the role presented; refused writes store nothing.

mod common;

use common::{ADMIN, TestRegistry, WORKER, rest, spec, sqlite_registry};
use quiver_model::approval::canonical_arguments_hash;
use quiver_proto::credentials::Credentials;
use quiver_proto::v1 as pb;
use quiver_registry::ApprovalOptions;
use quiver_registry::oauth::seal::Keyring;
use quiver_store::Store;
use reqwest::Method;
use serde_json::{Value, json};
use tonic::Code;
use tonic::transport::Channel;

const EDITOR: &str = "editor-secret";
const VIEWER: &str = "viewer-secret";
const APPROVER: &str = "approver-secret";

async fn registry() -> TestRegistry {
    sqlite_registry(|options| {
        options.auth.editor_token = Some(EDITOR.into());
        options.auth.viewer_token = Some(VIEWER.into());
        options.approvals = ApprovalOptions {
            approver_token: Some(APPROVER.into()),
            ..Default::default()
        };
        options.oauth.keyring = Some(Keyring::parse(&Keyring::generate_line("k1")).unwrap());
    })
    .await
}

fn record(id: &str) -> String {
    json!({"server_id": id, "transport": "stdio", "stdio": {"command": "true", "env": {"API_KEY": "sk-literal"}}})
        .to_string()
}

/// A pending approval, requested as a worker does.
async fn pending_approval(registry: &TestRegistry) -> String {
    let channel = Channel::from_shared(registry.grpc.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = Credentials::new(Some(WORKER), Some("w1"))
        .unwrap()
        .approval_client(channel);
    let arguments = json!({"path": "/tmp/x"});
    let approval = client
        .request_approval(pb::RequestApprovalRequest {
            task: "t".into(),
            server_id: "files".into(),
            tool: "files__delete".into(),
            arguments_json: arguments.to_string(),
            arguments_hash: canonical_arguments_hash(&arguments),
            record_revision: 1,
            requested_by: "token:00000000000000aa".into(),
            worker_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    approval.approval.unwrap().approval_id
}

/// Asserts a 403 whose message names the role needed and the one presented.
fn assert_denied(what: &str, (status, body): (u16, Value), needed: &str, presented: &str) {
    assert_eq!(status, 403, "{what}: {body}");
    assert_eq!(body["error"]["code"], "permission_denied", "{what}: {body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("needs the {needed} role"))
            && message.contains(&format!("the {presented} token")),
        "{what}: {message}"
    );
}

/// Every write of the admin API, with a body where it takes one.
fn writes(id: &str) -> Vec<(Method, String, Option<String>)> {
    vec![
        (
            Method::POST,
            "/admin/api/mcp/servers".into(),
            Some(record(id)),
        ),
        (Method::DELETE, format!("/admin/api/mcp/servers/{id}"), None),
        (
            Method::POST,
            format!("/admin/api/mcp/servers/{id}/rollback"),
            Some(json!({"revision": 1}).to_string()),
        ),
        (
            Method::POST,
            "/admin/api/servers/apply".into(),
            Some(
                json!({"servers": [serde_json::from_str::<Value>(&record(id)).unwrap()]})
                    .to_string(),
            ),
        ),
        (
            Method::POST,
            "/admin/api/mcp/import".into(),
            Some(record(id)),
        ),
        (Method::POST, "/admin/api/mcp/rescan".into(), None),
        (
            Method::POST,
            "/admin/api/mcp/preview".into(),
            Some(record(id)),
        ),
    ]
}

fn oauth_writes() -> Vec<(Method, String, Option<String>)> {
    vec![
        (
            Method::PUT,
            "/admin/api/oauth/connections/gh".into(),
            Some(json!({"server_url": "http://127.0.0.1:9/mcp"}).to_string()),
        ),
        (
            Method::POST,
            "/admin/api/oauth/connections/gh/connect".into(),
            None,
        ),
        (
            Method::DELETE,
            "/admin/api/oauth/connections/gh".into(),
            None,
        ),
    ]
}

/// The reads of a person (viewer, editor, admin).
fn reads(id: &str) -> Vec<String> {
    vec![
        "/admin/api/mcp/servers".into(),
        format!("/admin/api/mcp/servers/{id}"),
        format!("/admin/api/mcp/servers/{id}/history"),
        "/admin/api/audit".into(),
        "/admin/api/workers".into(),
        "/admin/api/approvals".into(),
        "/admin/api/oauth/connections".into(),
    ]
}

#[tokio::test]
async fn viewer_reads_everything_and_writes_nothing() {
    let r = registry().await;
    let (status, _) = rest(
        &r,
        Method::POST,
        "/admin/api/mcp/servers",
        Some(ADMIN),
        Some(&record("a")),
    )
    .await;
    assert_eq!(status, 201);
    let approval = pending_approval(&r).await;
    let (status, who) = rest(&r, Method::GET, "/admin/api/whoami", Some(VIEWER), None).await;
    assert_eq!((status, &who["role"]), (200, &json!("viewer")));

    for path in reads("a") {
        let (status, body) = rest(&r, Method::GET, &path, Some(VIEWER), None).await;
        assert_eq!(status, 200, "viewer GET {path}: {body}");
    }
    let (_, body) = rest(
        &r,
        Method::GET,
        &format!("/admin/api/approvals/{approval}"),
        Some(VIEWER),
        None,
    )
    .await;
    assert_eq!(body["state"], "pending", "{body}");
    // Reads are masked, even when the viewer asks for them unmasked.
    let (_, body) = rest(
        &r,
        Method::GET,
        "/admin/api/mcp/servers/a?masked=false",
        Some(VIEWER),
        None,
    )
    .await;
    assert!(!body.to_string().contains("sk-literal"), "{body}");

    for (method, path, body) in writes("a") {
        let answer = rest(&r, method.clone(), &path, Some(VIEWER), body.as_deref()).await;
        assert_denied(
            &format!("viewer {method} {path}"),
            answer,
            "editor",
            "viewer",
        );
    }
    for (method, path, body) in oauth_writes() {
        let answer = rest(&r, method.clone(), &path, Some(VIEWER), body.as_deref()).await;
        assert_denied(
            &format!("viewer {method} {path}"),
            answer,
            "admin",
            "viewer",
        );
    }
    let answer = rest(
        &r,
        Method::POST,
        &format!("/admin/api/approvals/{approval}"),
        Some(VIEWER),
        Some(r#"{"decision": "approve"}"#),
    )
    .await;
    assert_denied("viewer decides", answer, "approver", "viewer");
    // Nothing was written.
    assert_eq!(r.store.head().await.unwrap().revision, 1);
    let (_, body) = rest(
        &r,
        Method::GET,
        &format!("/admin/api/approvals/{approval}"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(body["state"], "pending", "{body}");
    let (_, body) = rest(
        &r,
        Method::GET,
        "/admin/api/oauth/connections",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(body["connections"], json!([]), "{body}");
}

#[tokio::test]
async fn editor_writes_records_but_not_oauth_connections_or_approvals() {
    let r = registry().await;
    let approval = pending_approval(&r).await;
    let (status, body) = rest(
        &r,
        Method::POST,
        "/admin/api/mcp/servers",
        Some(EDITOR),
        Some(&record("e")),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    // The editor reads records masked (secrets are the admin's).
    assert!(!body.to_string().contains("sk-literal"), "{body}");
    let apply =
        json!({"servers": [serde_json::from_str::<Value>(&record("f")).unwrap()]}).to_string();
    let (status, body) = rest(
        &r,
        Method::POST,
        "/admin/api/servers/apply",
        Some(EDITOR),
        Some(&apply),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = rest(
        &r,
        Method::DELETE,
        "/admin/api/mcp/servers/f",
        Some(EDITOR),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // The masked value written back keeps the stored one.
    let (_, read) = rest(
        &r,
        Method::GET,
        "/admin/api/mcp/servers/e",
        Some(EDITOR),
        None,
    )
    .await;
    let mut back = read.clone();
    back["display_name"] = json!("E");
    for key in [
        "revision",
        "updated_at",
        "created_at",
        "source",
        "updated_by",
        "created_by",
    ] {
        back.as_object_mut().unwrap().remove(key);
    }
    let (status, body) = rest(
        &r,
        Method::POST,
        "/admin/api/mcp/servers",
        Some(EDITOR),
        Some(&back.to_string()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let stored = r.store.get("e").await.unwrap().unwrap();
    assert_eq!(stored.spec.stdio.unwrap().env["API_KEY"], "sk-literal");
    let (status, _) = rest(&r, Method::POST, "/admin/api/mcp/evaluate", Some(EDITOR), Some(&json!({"record": serde_json::from_str::<Value>(&record("e")).unwrap(), "tools": ["x"]}).to_string())).await;
    assert_eq!(status, 200);

    for path in reads("e") {
        let (status, body) = rest(&r, Method::GET, &path, Some(EDITOR), None).await;
        assert_eq!(status, 200, "editor GET {path}: {body}");
    }
    for (method, path, body) in oauth_writes() {
        let answer = rest(&r, method.clone(), &path, Some(EDITOR), body.as_deref()).await;
        assert_denied(
            &format!("editor {method} {path}"),
            answer,
            "admin",
            "editor",
        );
    }
    let answer = rest(
        &r,
        Method::POST,
        &format!("/admin/api/approvals/{approval}"),
        Some(EDITOR),
        Some(r#"{"decision": "approve"}"#),
    )
    .await;
    assert_denied("editor decides", answer, "approver", "editor");
}

/// An editor never reads a stored secret, and must not be able to send one
/// elsewhere either: writing back a masked value keeps the stored secret
/// only while the record's destination is unchanged (the same command and
/// arguments, the same HTTP origin); the admin may move it.
#[tokio::test]
async fn an_editor_cannot_send_a_kept_secret_to_another_destination() {
    let r = registry().await;
    let created = |id: &str, url: &str| {
        json!({"server_id": id, "transport": "streamable_http",
               "http": {"url": url, "headers": {"Authorization": "Bearer sk-upstream"}}})
        .to_string()
    };
    for (id, body) in [
        ("h", created("h", "https://mcp.example.com/mcp")),
        ("s", record("s")),
    ] {
        let (status, body) = rest(
            &r,
            Method::POST,
            "/admin/api/mcp/servers",
            Some(ADMIN),
            Some(&body),
        )
        .await;
        assert_eq!(status, 201, "{id}: {body}");
    }
    let masked = |id: &str| {
        let r = &r;
        let id = id.to_owned();
        async move {
            let (_, mut read) = rest(
                r,
                Method::GET,
                &format!("/admin/api/mcp/servers/{id}"),
                Some(EDITOR),
                None,
            )
            .await;
            for key in [
                "revision",
                "updated_at",
                "created_at",
                "source",
                "updated_by",
                "created_by",
            ] {
                read.as_object_mut().unwrap().remove(key);
            }
            read
        }
    };
    // Another origin, another command or arguments: refused, nothing stored,
    // and the preview (which would connect from the registry) likewise.
    let mut moved = masked("h").await;
    moved["http"]["url"] = json!("https://attacker.example/mcp");
    let mut rerun = masked("s").await;
    rerun["stdio"]["args"] = json!(["-c", "echo $API_KEY"]);
    for (what, body) in [("origin", &moved), ("args", &rerun)] {
        for path in ["/admin/api/mcp/servers", "/admin/api/mcp/preview"] {
            let (status, answer) = rest(
                &r,
                Method::POST,
                path,
                Some(EDITOR),
                Some(&body.to_string()),
            )
            .await;
            assert_eq!(status, 403, "{what} {path}: {answer}");
            let message = answer["error"]["message"].as_str().unwrap_or_default();
            assert!(
                message.contains("only the admin"),
                "{what} {path}: {message}"
            );
        }
    }
    let stored = r.store.get("h").await.unwrap().unwrap();
    assert_eq!(stored.spec.http.unwrap().url, "https://mcp.example.com/mcp");
    let stored = r.store.get("s").await.unwrap().unwrap();
    assert!(stored.spec.stdio.unwrap().args.is_empty());
    // The same origin (another path) keeps the secret; the admin may move it.
    let mut same = masked("h").await;
    same["http"]["url"] = json!("https://mcp.example.com/v2/mcp");
    let (status, body) = rest(
        &r,
        Method::POST,
        "/admin/api/mcp/servers",
        Some(EDITOR),
        Some(&same.to_string()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = rest(
        &r,
        Method::POST,
        "/admin/api/mcp/servers",
        Some(ADMIN),
        Some(&moved.to_string()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let stored = r.store.get("h").await.unwrap().unwrap().spec.http.unwrap();
    assert_eq!(stored.url, "https://attacker.example/mcp");
    assert_eq!(stored.headers["Authorization"], "Bearer sk-upstream");
}

#[tokio::test]
async fn approver_only_reads_and_decides_approvals_and_admin_does_everything() {
    let r = registry().await;
    let (status, _) = rest(
        &r,
        Method::POST,
        "/admin/api/mcp/servers",
        Some(ADMIN),
        Some(&record("a")),
    )
    .await;
    assert_eq!(status, 201);
    let first = pending_approval(&r).await;
    for path in reads("a").into_iter().filter(|p| !p.contains("approvals")) {
        let answer = rest(&r, Method::GET, &path, Some(APPROVER), None).await;
        assert_eq!(answer.0, 403, "approver GET {path}: {}", answer.1);
        assert!(
            answer.1["error"]["message"]
                .as_str()
                .unwrap()
                .contains("the approver token may only read and decide approvals"),
            "{}",
            answer.1
        );
    }
    for (method, path, body) in writes("a") {
        let answer = rest(&r, method.clone(), &path, Some(APPROVER), body.as_deref()).await;
        assert_denied(
            &format!("approver {method} {path}"),
            answer,
            "editor",
            "approver",
        );
    }
    let (status, body) = rest(
        &r,
        Method::GET,
        "/admin/api/approvals",
        Some(APPROVER),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = rest(
        &r,
        Method::POST,
        &format!("/admin/api/approvals/{first}"),
        Some(APPROVER),
        Some(r#"{"decision": "deny"}"#),
    )
    .await;
    assert_eq!(
        (status, &body["decided_by"]),
        (200, &json!("approver")),
        "{body}"
    );
    // The worker token keeps its reads, and still may not read approvals.
    let (status, _) = rest(
        &r,
        Method::GET,
        "/admin/api/mcp/servers",
        Some(WORKER),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = rest(&r, Method::GET, "/admin/api/approvals", Some(WORKER), None).await;
    assert_eq!(status, 403);
    let (status, _) = rest(
        &r,
        Method::GET,
        "/admin/api/oauth/connections",
        Some(WORKER),
        None,
    )
    .await;
    assert_eq!(status, 403);

    // The admin does everything.
    let second = pending_approval(&r).await;
    let (status, body) = rest(
        &r,
        Method::POST,
        &format!("/admin/api/approvals/{second}"),
        Some(ADMIN),
        Some(r#"{"decision": "approve"}"#),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = rest(
        &r,
        Method::PUT,
        "/admin/api/oauth/connections/gh",
        Some(ADMIN),
        Some(&json!({"server_url": "http://127.0.0.1:9/mcp"}).to_string()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = rest(
        &r,
        Method::GET,
        "/admin/api/oauth/connections/gh",
        Some(VIEWER),
        None,
    )
    .await;
    assert_eq!((status, &body["name"]), (200, &json!("gh")), "{body}");
    let (status, body) = rest(
        &r,
        Method::DELETE,
        "/admin/api/mcp/servers/a",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn grpc_writes_need_the_editor_role_and_viewer_reads_are_masked() {
    let r = registry().await;
    let mut viewer = r.client(Some(VIEWER)).await;
    let mut editor = r.client(Some(EDITOR)).await;
    let mut worker = r.client(Some(WORKER)).await;
    let upsert = |id: &str| pb::UpsertMcpServerRequest {
        server: Some((&spec(id, "true")).into()),
        expected_revision: None,
    };
    let err = viewer.upsert_mcp_server(upsert("g")).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(
        err.message().contains("needs the editor role"),
        "{}",
        err.message()
    );
    let err = viewer
        .apply_mcp_servers(pb::ApplyMcpServersRequest {
            servers: vec![upsert("g")],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert_eq!(r.store.head().await.unwrap().revision, 0);

    editor.upsert_mcp_server(upsert("g")).await.unwrap();
    editor
        .apply_mcp_servers(pb::ApplyMcpServersRequest {
            servers: vec![upsert("h")],
        })
        .await
        .unwrap();
    let err = viewer
        .delete_mcp_server(pb::DeleteMcpServerRequest {
            server_id: "h".into(),
            expected_revision: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    editor
        .delete_mcp_server(pb::DeleteMcpServerRequest {
            server_id: "h".into(),
            expected_revision: None,
        })
        .await
        .unwrap();

    // Reads: the viewer's are masked, the worker's are not.
    let list = viewer
        .list_mcp_servers(pb::ListMcpServersRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.servers.len(), 1);
    assert!(!format!("{list:?}").contains("sk-literal"), "{list:?}");
    let one = viewer
        .get_mcp_server(pb::GetMcpServerRequest {
            server_id: "g".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!format!("{one:?}").contains("sk-literal"), "{one:?}");
    let history = viewer
        .get_mcp_server_history(pb::GetMcpServerHistoryRequest {
            server_id: "g".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!history.entries.is_empty() && !format!("{history:?}").contains("sk-literal"));
    let mut watch = viewer
        .watch_mcp_servers(pb::WatchMcpServersRequest { since_revision: 0 })
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(std::time::Duration::from_secs(5), watch.message())
        .await
        .expect("a watch event within 5 s")
        .unwrap()
        .expect("the stream is open");
    assert_eq!((first.revision, first.servers.len()), (1, 1), "{first:?}");
    assert!(!format!("{first:?}").contains("sk-literal"), "{first:?}");
    let list = worker
        .list_mcp_servers(pb::ListMcpServersRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(format!("{list:?}").contains("sk-literal"));
    // The data plane's calls stay the worker's.
    let err = viewer
        .report_worker_status(pb::ReportWorkerStatusRequest {
            worker_id: "v".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
}
