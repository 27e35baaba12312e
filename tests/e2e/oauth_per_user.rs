//! Per-user OAuth grants end to end (docs/reference.md R-OAUTH-8, issue
//! #24): a real authorization server and the MCP server it protects
//! (`quiver-testkit-oauth`, whose `whoami_user` tool names the user a token
//! was granted for), two registry replicas on one PostgreSQL database, a
//! worker on each, two API keys of the registry as the principals.
//!
//! What it shows: a principal without a grant gets 403
//! `mcp_authorization_required` with its own single-use link; following it
//! runs the authorization-code flow for that principal only; then each
//! principal's calls act as its own user on both workers, never as the
//! other's; an expired token is refreshed once per principal across the
//! replicas; a principal sees and revokes its own grant (others unaffected),
//! an admin lists and revokes any; chat ends its loop with
//! `authorization_required` and the link; the gateway asks the official
//! Python SDK client by URL elicitation (2025-11-25) or `input_required`
//! (2026-07-28); replayed and forged links are refused naming the step; no
//! token or link secret is in any log or read.

use std::time::Duration;

use quiver_testkit::postgres::TestDatabase;
use quiver_testkit::upstream::{Reply, Script, ScriptedUpstream};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{ADMIN, Admin, RegistryProcess, WORKER, WorkerProcess, eventually, injected};
use crate::oauth::{
    OAuthServer, authorize, callback_with, client, oauth_api, oauth_record, put_connection,
    replicas, sqlite_registry,
};

const CONNECTION: &str = "tracker";
pub(crate) const SERVER: &str = "tracker";

/// A principal: an API key of the registry.
pub(crate) struct Principal {
    pub(crate) key: String,
    pub(crate) principal: String,
}

/// The per-user connection to `server`, the record naming it and the
/// policy `team` allowing it.
pub(crate) async fn per_user_server(registry: &RegistryProcess, server: &OAuthServer) {
    put_connection(
        registry,
        CONNECTION,
        json!({"server_url": server.mcp, "per_user": true}),
    )
    .await;
    Admin::new(registry, ADMIN)
        .upsert(oauth_record(SERVER, &server.mcp, CONNECTION))
        .await;
    team_policy(registry).await;
}

/// `PUT /admin/api/policies/team` allowing the per-user server.
async fn team_policy(registry: &RegistryProcess) {
    let (status, body) = json_of(
        client()
            .put(format!("{}/admin/api/policies/team", registry.http_url()))
            .bearer_auth(ADMIN)
            .json(&json!({"allowed_server_ids": [SERVER]}))
            .send()
            .await
            .expect("PUT policy"),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

/// `POST /admin/api/keys` for a key of `policy`.
pub(crate) async fn create_key(
    registry: &RegistryProcess,
    name: &str,
    policy: &str,
) -> (Principal, u64) {
    let response = client()
        .post(format!("{}/admin/api/keys", registry.http_url()))
        .bearer_auth(ADMIN)
        .json(&json!({"name": name, "policy": policy}))
        .send()
        .await
        .expect("POST /admin/api/keys");
    assert_eq!(response.status(), StatusCode::CREATED);
    let created: Value = response.json().await.expect("key json");
    (
        Principal {
            key: created["key"].as_str().expect("key").to_owned(),
            principal: format!("key:{}", created["id"].as_str().expect("id")),
        },
        created["revision"].as_u64().expect("revision"),
    )
}

async fn json_of(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(json!(text)))
}

/// `whoami_user` on `worker` as `who`.
pub(crate) async fn call_as(worker: &WorkerProcess, who: &Principal) -> (StatusCode, Value) {
    json_of(
        client()
            .post(format!("{}/v1/mcp/tools/call", worker.url()))
            .bearer_auth(&who.key)
            .json(&json!({"name": injected(SERVER, "whoami_user"), "arguments": {}}))
            .send()
            .await
            .expect("tools/call"),
    )
    .await
}

/// The user `who`'s call acts as on `worker` (the call must succeed).
async fn user_of(worker: &WorkerProcess, who: &Principal) -> String {
    let (status, body) = call_as(worker, who).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text: {body}"))
        .to_owned()
}

/// The link of a call refused for want of `who`'s consent.
pub(crate) async fn consent_link(worker: &WorkerProcess, who: &Principal) -> String {
    let (status, body) = call_as(worker, who).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(
        body["error"]["code"], "mcp_authorization_required",
        "{body}"
    );
    assert_eq!(body["error"]["oauth_connection"], CONNECTION, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(&who.principal), "{body}");
    let url = body["error"]["authorization_url"]
        .as_str()
        .unwrap_or_else(|| panic!("no authorization_url: {body}"))
        .to_owned();
    assert!(
        url.starts_with("http://127.0.0.1:") && url.contains("/oauth/authorize/"),
        "{url}"
    );
    assert!(!message.contains(&url), "the link is not in the message");
    url
}

/// Follows a consent link as a browser would, the authorization server
/// approving at once: link → authorization server (with the flow's cookie)
/// → callback → the page saying the account is connected.
async fn consent(link: &str) {
    let response = client().get(link).send().await.expect("GET link");
    assert_eq!(response.status(), StatusCode::SEE_OTHER, "{response:?}");
    let cookie = response
        .headers()
        .get(reqwest::header::SET_COOKIE)
        .and_then(|value| value.to_str().ok())
        .map(|value| value.split(';').next().unwrap_or_default().to_owned())
        .expect("the flow's cookie");
    let to_server = response
        .headers()
        .get(reqwest::header::LOCATION)
        .and_then(|value| value.to_str().ok())
        .expect("to the authorization server")
        .to_owned();
    let callback = authorize(&to_server).await;
    let done = callback_with(&callback, &cookie).await;
    assert_eq!(done.status(), StatusCode::SEE_OTHER, "{done:?}");
    let landing = done
        .headers()
        .get(reqwest::header::LOCATION)
        .and_then(|value| value.to_str().ok())
        .expect("landing page")
        .to_owned();
    assert_eq!(landing, format!("/oauth/connected?connection={CONNECTION}"));
}

/// A link that must not work: the page names the step and nothing starts.
async fn assert_refused_link(link: &str) {
    let response = client().get(link).send().await.expect("GET link");
    assert!(response.status().is_client_error() || response.status().is_server_error());
    assert!(
        response
            .headers()
            .get(reqwest::header::SET_COOKIE)
            .is_none(),
        "{response:?}"
    );
    let page = response.text().await.unwrap_or_default();
    assert!(page.contains("oauth link"), "{page}");
}

async fn worker_grants(worker: &WorkerProcess, who: &Principal) -> Value {
    let (status, body) = json_of(
        client()
            .get(format!("{}/v1/oauth/grants", worker.url()))
            .bearer_auth(&who.key)
            .send()
            .await
            .expect("GET /v1/oauth/grants"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_principal_connects_its_own_account_and_acts_as_itself() {
    let db = TestDatabase::create().await;
    let (registry_a, registry_b) = replicas(&db).await;
    let server = OAuthServer::start(&[]).await;

    per_user_server(&registry_a, &server).await;
    let (alice, _) = create_key(&registry_a, "alice", "team").await;
    let (bob, revision) = create_key(&registry_a, "bob", "team").await;
    let no_args: [&str; 0] = [];
    let worker_a =
        WorkerProcess::start_without_callers(&registry_a.grpc_url(), WORKER, &no_args).await;
    let worker_b =
        WorkerProcess::start_without_callers(&registry_b.grpc_url(), WORKER, &no_args).await;
    for worker in [&worker_a, &worker_b] {
        worker.synced(revision, Duration::from_secs(10)).await;
    }

    // An admin's Connect does not apply to a per-user connection.
    let (status, body) = oauth_api(
        &registry_a,
        reqwest::Method::POST,
        &format!("/{CONNECTION}/connect"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::PRECONDITION_FAILED, "{body}");

    // Alice has no grant: her call is refused with her own link, on the
    // worker of either replica; she consents as "alice".
    let alice_link = consent_link(&worker_a, &alice).await;
    // Her link until it is used (each replica names its own address).
    let secret_of = |link: &str| link.rsplit('/').next().unwrap_or_default().to_owned();
    assert_eq!(
        secret_of(&consent_link(&worker_b, &alice).await),
        secret_of(&alice_link)
    );
    server.admin("auto-user", json!({"user": "alice"})).await;
    consent(&alice_link).await;
    assert_eq!(user_of(&worker_a, &alice).await, "alice");
    assert_eq!(user_of(&worker_b, &alice).await, "alice");
    // A used link is refused, as is a forged one.
    assert_refused_link(&alice_link).await;
    let forged = format!(
        "{}/oauth/authorize/{}",
        registry_a.http_url(),
        "0".repeat(64)
    );
    assert_refused_link(&forged).await;

    // Bob is still asked: alice's grant is hers only.
    let bob_link = consent_link(&worker_b, &bob).await;
    server.admin("auto-user", json!({"user": "bob"})).await;
    consent(&bob_link).await;
    for worker in [&worker_a, &worker_b] {
        assert_eq!(user_of(worker, &bob).await, "bob");
        assert_eq!(user_of(worker, &alice).await, "alice");
    }
    // Reads: the admin sees both grants, each principal its own; no token.
    let (status, grants) = oauth_api(
        &registry_b,
        reqwest::Method::GET,
        &format!("/{CONNECTION}/grants"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{grants}");
    let mut principals: Vec<&str> = grants["grants"]
        .as_array()
        .expect("grants")
        .iter()
        .map(|grant| grant["principal"].as_str().unwrap_or_default())
        .collect();
    principals.sort_unstable();
    let mut expected = vec![alice.principal.as_str(), bob.principal.as_str()];
    expected.sort_unstable();
    assert_eq!(principals, expected, "{grants}");
    let own = worker_grants(&worker_b, &alice).await;
    assert_eq!(own["principal"], alice.principal.as_str(), "{own}");
    assert_eq!(own["grants"].as_array().map(Vec::len), Some(1), "{own}");
    assert_eq!(own["grants"][0]["connection"], CONNECTION, "{own}");
    assert_eq!(own["grants"][0]["status"], "connected", "{own}");

    // The server stops accepting every access token: each principal's is
    // refreshed once although both workers (two replicas) need it at once.
    server.admin("expire-access-tokens", json!({})).await;
    let (a1, b1, a2, b2) = tokio::join!(
        user_of(&worker_a, &alice),
        user_of(&worker_b, &alice),
        user_of(&worker_a, &bob),
        user_of(&worker_b, &bob),
    );
    assert_eq!(
        [a1.as_str(), b1.as_str(), a2.as_str(), b2.as_str()],
        ["alice", "alice", "bob", "bob"]
    );
    let stats = server.stats().await;
    assert_eq!(
        stats["refresh_grants_by_user"],
        json!({"alice": 1, "bob": 1}),
        "{stats}"
    );

    // Alice revokes her own grant on worker A: refused there at once, on
    // worker B within the registry's recheck bound; bob unaffected.
    let response = client()
        .delete(format!("{}/v1/oauth/grants/{CONNECTION}", worker_a.url()))
        .bearer_auth(&alice.key)
        .send()
        .await
        .expect("DELETE grant");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    consent_link(&worker_a, &alice).await;
    eventually(
        Duration::from_secs(15),
        "worker B refuses alice",
        || async {
            let (status, _) = call_as(&worker_b, &alice).await;
            (status == StatusCode::FORBIDDEN).then_some(())
        },
    )
    .await;
    consent_link(&worker_b, &alice).await;
    for worker in [&worker_a, &worker_b] {
        assert_eq!(user_of(worker, &bob).await, "bob");
    }
    let own = worker_grants(&worker_a, &alice).await;
    assert_eq!(own["grants"], json!([]), "{own}");
    let response = client()
        .delete(format!("{}/v1/oauth/grants/{CONNECTION}", worker_a.url()))
        .bearer_auth(&alice.key)
        .send()
        .await
        .expect("DELETE grant again");
    assert_eq!(response.status(), StatusCode::NOT_FOUND);

    // An admin revokes bob's.
    let (status, body) = oauth_api(
        &registry_b,
        reqwest::Method::DELETE,
        &format!("/{CONNECTION}/grants/{}", bob.principal),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    eventually(
        Duration::from_secs(15),
        "both workers refuse bob",
        || async {
            let (a, _) = call_as(&worker_a, &bob).await;
            let (b, _) = call_as(&worker_b, &bob).await;
            (a == StatusCode::FORBIDDEN && b == StatusCode::FORBIDDEN).then_some(())
        },
    )
    .await;

    // Nothing secret anywhere: tokens the server issued and the secrets of
    // every link handed out, in the logs of every process and every read.
    let mut secrets = server.issued_tokens().await;
    assert!(secrets.len() >= 6, "{secrets:?}");
    for link in [&alice_link, &bob_link] {
        secrets.push(secret_of(link));
    }
    let mut seen = vec![
        registry_a.log_tail(),
        registry_b.log_tail(),
        worker_a.log_tail(),
        worker_b.log_tail(),
    ];
    for path in [
        "/admin/api/oauth/connections",
        "/admin/api/oauth/connections/tracker/grants",
        "/admin/api/mcp/servers/tracker/history",
        "/admin/api/audit",
    ] {
        seen.push(oauth_read(&registry_a, path).await);
    }
    seen.push(worker_grants(&worker_a, &bob).await.to_string());
    for log in &seen[..4] {
        assert!(
            log.lines().count() < crate::harness::LOG_TAIL,
            "log longer than kept"
        );
    }
    for secret in &secrets {
        for (index, text) in seen.iter().enumerate() {
            assert!(
                !text.contains(secret.as_str()),
                "a secret appears in output {index}"
            );
        }
    }
    drop(db);
}

async fn oauth_read(registry: &RegistryProcess, path: &str) -> String {
    client()
        .get(format!("{}{path}", registry.http_url()))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("admin read")
        .text()
        .await
        .expect("body")
}

/// The official Python SDK client (`mcp` 2.x) at `/mcp/tracker` as `who`,
/// calling `whoami_user` once; `extra` adds to its configuration (see
/// tests/e2e/peers/modern_client.py).
async fn sdk_call(worker: &WorkerProcess, who: &Principal, mode: &str, extra: Value) -> Value {
    let mut config = json!({
        "url": format!("{}/mcp/{SERVER}", worker.url()),
        "token": who.key,
        "mode": mode,
        "calls": {"who": ["whoami_user", {}]},
    });
    for (key, value) in extra.as_object().into_iter().flatten() {
        config[key] = value.clone();
    }
    crate::gateway_2026::modern_client(&config).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_asks_for_consent_in_the_protocol_the_client_speaks() {
    let (_dir, registry) = sqlite_registry().await;
    let server = OAuthServer::start(&[]).await;
    per_user_server(&registry, &server).await;
    let (carol, _) = create_key(&registry, "carol", "team").await;
    let (alice, _) = create_key(&registry, "alice", "team").await;
    let (bob, _) = create_key(&registry, "bob", "team").await;
    let (dave, revision) = create_key(&registry, "dave", "team").await;
    let no_args: [&str; 0] = [];
    let worker = WorkerProcess::start_without_callers(&registry.grpc_url(), WORKER, &no_args).await;
    worker.synced(revision, Duration::from_secs(10)).await;
    // Carol connected hers through the tool API: the worker knows the
    // server's tools since (a server's tools are the server's).
    server.admin("auto-user", json!({"user": "carol"})).await;
    consent(&consent_link(&worker, &carol).await).await;
    assert_eq!(user_of(&worker, &carol).await, "carol");

    // 2026-07-28 (no session): `input_required` with the link as a URL
    // elicitation; the SDK follows it and the retry acts as alice.
    server.admin("auto-user", json!({"user": "alice"})).await;
    let report = sdk_call(&worker, &alice, "auto", json!({"consent": true})).await;
    assert_eq!(report["protocol_version"], "2026-07-28", "{report}");
    assert_eq!(report["who"]["content"][0]["text"], "alice", "{report}");
    assert_eq!(
        report["links"].as_array().map(Vec::len),
        Some(1),
        "{report}"
    );
    assert_eq!(report["landed"], 200, "{report}");

    // 2025-11-25 (a session): an `elicitation/create` in URL mode before
    // the call runs; the call waits for the grant and acts as bob.
    server.admin("auto-user", json!({"user": "bob"})).await;
    let report = sdk_call(&worker, &bob, "legacy", json!({"consent": true})).await;
    assert_eq!(report["protocol_version"], "2025-11-25", "{report}");
    assert_eq!(report["who"]["content"][0]["text"], "bob", "{report}");
    assert_eq!(
        report["links"].as_array().map(Vec::len),
        Some(1),
        "{report}"
    );

    // A client that cannot open links gets the link in the tool error.
    for mode in ["auto", "legacy"] {
        let report = sdk_call(&worker, &dave, mode, json!({"no_elicitation": true})).await;
        let error = &report["who"]["structuredContent"]["error"];
        assert_eq!(report["who"]["isError"], true, "{report}");
        assert_eq!(error["code"], "mcp_authorization_required", "{report}");
        let link = error["authorization_url"].as_str().unwrap_or_default();
        assert!(link.contains("/oauth/authorize/"), "{report}");
    }
    // Each acted as itself only.
    assert_eq!(user_of(&worker, &alice).await, "alice");
    assert_eq!(user_of(&worker, &bob).await, "bob");
    let (status, _) = call_as(&worker, &dave).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_stops_for_consent_and_then_acts_as_the_caller() {
    let (_dir, registry) = sqlite_registry().await;
    let server = OAuthServer::start(&[]).await;
    per_user_server(&registry, &server).await;
    let (carol, _) = create_key(&registry, "carol", "team").await;
    let (erin, revision) = create_key(&registry, "erin", "team").await;
    let who = injected(SERVER, "whoami_user");
    let upstream = ScriptedUpstream::start(Script::sequence([
        Reply::tool_call("c1", &who, json!({})),
        Reply::tool_call("c2", &who, json!({})),
        Reply::text("done"),
    ]))
    .await;
    let worker = WorkerProcess::start_without_callers(
        &registry.grpc_url(),
        WORKER,
        &["--upstream-url".to_owned(), upstream.base_url()],
    )
    .await;
    worker.synced(revision, Duration::from_secs(10)).await;
    // Carol's grant lets the worker list the server's tools for everyone.
    server.admin("auto-user", json!({"user": "carol"})).await;
    consent(&consent_link(&worker, &carol).await).await;
    assert_eq!(user_of(&worker, &carol).await, "carol");

    let chat = || async {
        json_of(
            client()
                .post(format!("{}/v1/chat/completions", worker.url()))
                .bearer_auth(&erin.key)
                .json(&json!({
                    "model": "m",
                    "messages": [{"role": "user", "content": "who am I?"}],
                    "mcp": {"enabled": true, "server_ids": [SERVER]},
                }))
                .send()
                .await
                .expect("chat"),
        )
        .await
    };
    // Erin has not connected: the loop ends before the call runs, with her
    // link in the `mcp` extension.
    let (status, answer) = chat().await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        answer["mcp"]["stop_reason"], "authorization_required",
        "{answer}"
    );
    assert_eq!(
        answer["mcp"]["calls"][0]["status"],
        "authorization_required"
    );
    let asked = &answer["mcp"]["authorizations"][0];
    assert_eq!(asked["oauth_connection"], CONNECTION, "{answer}");
    assert_eq!(asked["name"], who.as_str(), "{answer}");
    let link = asked["authorization_url"]
        .as_str()
        .expect("link")
        .to_owned();
    assert_eq!(upstream.request_count(), 1, "the model was not asked again");

    // After consenting, the same conversation runs the call as erin.
    server.admin("auto-user", json!({"user": "erin"})).await;
    consent(&link).await;
    let (status, answer) = chat().await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["mcp"]["stop_reason"], "completed", "{answer}");
    let sent = &upstream.requests()[2].body;
    let tool_message = sent["messages"]
        .as_array()
        .and_then(|messages| messages.iter().find(|m| m["role"] == "tool"))
        .unwrap_or_else(|| panic!("a tool message: {sent}"));
    assert_eq!(tool_message["content"], "erin", "{sent}");
    assert!(
        !worker
            .log_tail()
            .contains(link.rsplit('/').next().unwrap_or_default()),
        "the link is in no log"
    );
}
