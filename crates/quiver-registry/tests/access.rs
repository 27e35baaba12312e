//! Who may call as registry records (issue #22, docs/reference.md §12.2):
//! policies, API keys and identity providers over REST, in the records'
//! revision space and on the watch stream; keys with roles on the registry.

mod common;

use common::{ADMIN, TestRegistry, WORKER, postgres_registry, rest, sqlite_registry};
use quiver_proto::v1 as pb;
use reqwest::Method;
use serde_json::{Value, json};

const VIEWER: &str = "viewer-secret";

async fn registry() -> TestRegistry {
    sqlite_registry(|options| {
        options.auth.viewer_token = Some(VIEWER.into());
    })
    .await
}

async fn put(r: &TestRegistry, path: &str, body: Value) -> (u16, Value) {
    rest(r, Method::PUT, path, Some(ADMIN), Some(&body.to_string())).await
}

fn provider(policy: &str) -> Value {
    json!({
        "issuer": "https://idp.example.com",
        "audiences": ["quiver"],
        "rules": [
            {"claim": "groups", "contains": "admins", "roles": ["admin"]},
            {"claim": "groups", "contains": "team-a", "policy": policy},
        ],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_keys_and_providers_are_revisioned_records() {
    let r = registry().await;
    let (status, policy) = put(
        &r,
        "/admin/api/policies/team-a",
        json!({"allowed_server_ids": ["files"], "tool_denylist": ["files.delete_*"]}),
    )
    .await;
    assert_eq!(status, 201, "{policy}");
    assert_eq!(policy["revision"], 1);
    assert_eq!(policy["policy"]["tool_denylist"], json!(["files.delete_*"]));
    // Identical content: no new revision.
    let (status, same) = put(
        &r,
        "/admin/api/policies/team-a",
        json!({"allowed_server_ids": ["files"], "tool_denylist": ["files.delete_*"]}),
    )
    .await;
    assert_eq!((status, same["revision"].clone()), (200, json!(1)));

    let (status, created) = rest(
        &r,
        Method::POST,
        "/admin/api/keys",
        Some(ADMIN),
        Some(&json!({"name": "ci", "policy": "team-a", "roles": ["viewer"]}).to_string()),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let key = created["key"].as_str().unwrap().to_owned();
    let id = created["id"].as_str().unwrap().to_owned();
    assert!(key.starts_with("qk_"));
    assert_eq!(created["revision"], 2);

    // The secret is shown once: no read, list or history has it or its hash.
    let (_, listed) = rest(&r, Method::GET, "/admin/api/keys", Some(ADMIN), None).await;
    let (_, one) = rest(
        &r,
        Method::GET,
        &format!("/admin/api/keys/{id}"),
        Some(ADMIN),
        None,
    )
    .await;
    for read in [&listed, &one] {
        let text = read.to_string();
        assert!(!text.contains(&key) && !text.contains("sha256"), "{text}");
    }
    assert_eq!(listed["keys"][0]["id"], json!(id));
    assert_eq!(listed["keys"][0]["last_used_at"], Value::Null);

    // A key with roles is a registry credential; its principal is audited.
    let (status, whoami) = rest(&r, Method::GET, "/admin/api/whoami", Some(&key), None).await;
    assert_eq!((status, whoami["role"].clone()), (200, json!("viewer")));
    let (status, _) = put(&r, "/admin/api/policies/x", json!({})).await;
    assert_eq!(status, 201);
    let (status, refused) = rest(
        &r,
        Method::PUT,
        "/admin/api/policies/y",
        Some(&key),
        Some("{}"),
    )
    .await;
    assert_eq!(status, 403, "{refused}");

    let (status, body) = put(&r, "/admin/api/identity/providers/corp", provider("team-a")).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["rules"][1]["policy"], "team-a");

    // A policy still named elsewhere is not deleted; nothing is written.
    let (status, body) = rest(
        &r,
        Method::DELETE,
        "/admin/api/policies/team-a",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, 412, "{body}");
    assert_eq!(body["error"]["code"], "failed_precondition");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("api_key:{id}")) && message.contains("identity_provider:corp"),
        "{message}"
    );

    // Revoking the key: it no longer authenticates.
    let (status, _) = rest(
        &r,
        Method::DELETE,
        &format!("/admin/api/keys/{id}"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = rest(&r, Method::GET, "/admin/api/whoami", Some(&key), None).await;
    assert_eq!(status, 401);

    let (status, history) = rest(
        &r,
        Method::GET,
        "/admin/api/policies/team-a/history",
        Some(VIEWER),
        None,
    )
    .await;
    assert_eq!(status, 200, "{history}");
    assert_eq!(history["entries"][0]["revision"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_names_the_field_and_stores_nothing() {
    let r = registry().await;
    let cases = [
        (
            Method::PUT,
            "/admin/api/policies/p",
            json!({"tool_denylist": ["["]}),
            "tool_denylist[0]",
        ),
        (
            Method::PUT,
            "/admin/api/policies/p",
            json!({"allowed_servers": []}),
            "allowed_servers",
        ),
        (
            Method::PUT,
            "/admin/api/policies/bad%20name",
            json!({}),
            "name",
        ),
        (
            Method::POST,
            "/admin/api/keys",
            json!({"name": "k", "policy": "missing"}),
            "policy",
        ),
        (
            Method::POST,
            "/admin/api/keys",
            json!({"name": "k", "policy": "p", "expires_at": "yesterday"}),
            "expires_at",
        ),
        (
            Method::POST,
            "/admin/api/keys",
            json!({"name": "k", "policy": "p", "expires_at": "2001-01-01T00:00:00Z"}),
            "expires_at",
        ),
        (
            Method::POST,
            "/admin/api/keys",
            json!({"name": "k", "policy": "p", "roles": ["root"]}),
            "roles[0]",
        ),
        (
            Method::PUT,
            "/admin/api/identity/providers/corp",
            json!({"issuer": "http://idp.example.com", "audiences": ["a"], "rules": [{"claim": "g", "equals": "x", "roles": ["viewer"]}]}),
            "issuer",
        ),
        (
            Method::PUT,
            "/admin/api/identity/providers/corp",
            provider("missing"),
            "rules[1].policy",
        ),
        (
            Method::PUT,
            "/admin/api/identity/providers/corp",
            json!({"issuer": "https://idp.example.com", "audiences": ["a"], "rules": [{"claim": "g", "contains": "x", "equals": "y", "policy": "p"}]}),
            "rules[0].contains",
        ),
    ];
    for (method, path, body, field) in cases {
        let (status, answer) = rest(&r, method, path, Some(ADMIN), Some(&body.to_string())).await;
        assert_eq!(status, 400, "{path} {body}: {answer}");
        assert_eq!(answer["error"]["field"], field, "{path} {body}: {answer}");
    }
    let (_, policies) = rest(&r, Method::GET, "/admin/api/policies", Some(ADMIN), None).await;
    assert_eq!(policies["revision"], 0, "nothing stored: {policies}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_changes_reach_workers_on_the_watch_stream_and_viewers_see_none() {
    let r = postgres_registry().await;
    let mut worker = r.client(Some(WORKER)).await;
    let listed = worker
        .list_mcp_servers(pb::ListMcpServersRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut stream = worker
        .watch_mcp_servers(pb::WatchMcpServersRequest {
            since_revision: listed.revision,
        })
        .await
        .unwrap()
        .into_inner();
    put(&r, "/admin/api/policies/team-a", json!({"vision": true})).await;
    let event = loop {
        let event = stream.message().await.unwrap().unwrap();
        if !event.heartbeat {
            break event;
        }
    };
    assert_eq!(event.revision, 1);
    assert_eq!(event.access_upserts.len(), 1);
    assert_eq!(event.access_upserts[0].name, "team-a");
    assert!(
        event.access_upserts[0]
            .spec_json
            .contains("\"vision\":true")
    );

    // A watcher from revision 0 replays it from the change log, with its record.
    let mut replay = worker
        .watch_mcp_servers(pb::WatchMcpServersRequest { since_revision: 0 })
        .await
        .unwrap()
        .into_inner();
    let replayed = replay.message().await.unwrap().unwrap();
    assert_eq!(replayed.access_upserts, event.access_upserts);

    let listed = worker
        .list_mcp_servers(pb::ListMcpServersRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.access.len(), 1);
    let mut admin = r.client(Some(ADMIN)).await;
    let listed = admin
        .list_mcp_servers(pb::ListMcpServersRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.access.len(), 1, "the admin reads what workers read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn viewers_read_no_access_records_over_grpc() {
    let r = registry().await;
    put(&r, "/admin/api/policies/team-a", json!({})).await;
    let mut viewer = r.client(Some(VIEWER)).await;
    let listed = viewer
        .list_mcp_servers(pb::ListMcpServersRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.revision, 1);
    assert!(listed.access.is_empty());
    let mut stream = viewer
        .watch_mcp_servers(pb::WatchMcpServersRequest { since_revision: 0 })
        .await
        .unwrap()
        .into_inner();
    let event = stream.message().await.unwrap().unwrap();
    assert_eq!(event.revision, 1);
    assert!(event.access_upserts.is_empty() && event.access_deletes.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_names_the_deciding_rule_for_keys_and_subjects() {
    let r = registry().await;
    let record = json!({"server_id": "files", "transport": "stdio", "stdio": {"command": "true"}, "allowed_tools": ["*"]});
    let (status, _) = rest(
        &r,
        Method::POST,
        "/admin/api/mcp/servers",
        Some(ADMIN),
        Some(&record.to_string()),
    )
    .await;
    assert_eq!(status, 201);
    put(
        &r,
        "/admin/api/policies/team-a",
        json!({"allowed_server_ids": ["files"], "tool_denylist": ["files.delete_*"]}),
    )
    .await;
    put(&r, "/admin/api/identity/providers/corp", provider("team-a")).await;
    let (_, key) = rest(
        &r,
        Method::POST,
        "/admin/api/keys",
        Some(ADMIN),
        Some(&json!({"name": "ci", "policy": "team-a"}).to_string()),
    )
    .await;
    let explain = async |body: Value| {
        let (status, answer) = rest(
            &r,
            Method::POST,
            "/admin/api/access/explain",
            Some(VIEWER),
            Some(&body.to_string()),
        )
        .await;
        assert_eq!(status, 200, "{body}: {answer}");
        answer
    };
    let id = key["id"].as_str().unwrap();
    let allowed = explain(json!({"key_id": id, "server_id": "files", "tool": "read"})).await;
    assert_eq!(allowed["decision"], "allow", "{allowed}");
    assert_eq!(allowed["policy"], "team-a");
    let denied =
        explain(json!({"token": key["key"], "server_id": "files", "tool": "delete_all"})).await;
    assert_eq!(denied["decision"], "deny", "{denied}");
    assert_eq!(denied["code"], "denied_by_task");
    assert_eq!(
        denied["rule"],
        "policies.team-a.tool_denylist[\"files.delete_*\"]"
    );
    let subject = json!({"subject": "alice", "issuer": "https://idp.example.com",
        "claims": {"groups": ["team-a"]}, "server_id": "files", "tool": "read"});
    let by_rule = explain(subject.clone()).await;
    assert_eq!(by_rule["decision"], "allow", "{by_rule}");
    assert_eq!(by_rule["principal"], "oidc:https://idp.example.com#alice");
    assert_eq!(by_rule["rule"], "identity_providers.corp.rules[1]");
    let mut stranger = subject.clone();
    stranger["claims"] = json!({"groups": ["other"]});
    let no_rule = explain(stranger).await;
    assert_eq!(no_rule["code"], "identity_no_matching_rule", "{no_rule}");
    let unknown = explain(json!({"key_id": "nope", "server_id": "files", "tool": "read"})).await;
    assert_eq!(unknown["code"], "key_unknown");
    let (status, both) = rest(
        &r,
        Method::POST,
        "/admin/api/access/explain",
        Some(VIEWER),
        Some(
            &json!({"key_id": id, "token": "x", "server_id": "files", "tool": "read"}).to_string(),
        ),
    )
    .await;
    assert_eq!(status, 400, "{both}");
    assert_eq!(both["error"]["field"], "key_id");
}
