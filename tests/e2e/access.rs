//! Who may call, held by the registry (issue #22), end to end: a registry
//! on PostgreSQL, two workers started without any caller token, and an API
//! key created over REST.
//!
//! What it shows: the key calls its policy's tools on both workers and a
//! tool outside the policy is neither listed nor callable; `/v1/whoami`
//! names `key:<id>`, the policy and `via: "key"`; a policy edit reaches an
//! open `/mcp` session as `notifications/tools/list_changed`; the registry
//! learns the key's `last_used_at` from the workers; revoking the key is
//! refused (401) by both workers, and by the open gateway session, within
//! the bound; explain agrees with what the workers did; no secret is in any
//! log.

use std::time::{Duration, Instant};

use quiver_testkit::postgres::TestDatabase;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{
    ADMIN, Admin, RegistryProcess, WORKER, WorkerProcess, eventually, injected, registry,
    stdio_record,
};

/// The bound within which every worker must refuse a revoked key here
/// (the benchmark measures the p99; this test allows for a loaded CI host).
const REVOCATION_BOUND: Duration = Duration::from_secs(3);

struct Fixture {
    registry: RegistryProcess,
    workers: [WorkerProcess; 2],
    http: reqwest::Client,
    _db: TestDatabase,
}

impl Fixture {
    async fn rest(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        Admin::new(&self.registry, ADMIN)
            .rest(method, path, body)
            .await
    }

    async fn worker_get(&self, at: usize, path: &str, key: &str) -> (StatusCode, Value) {
        let response = self
            .http
            .get(format!("{}{path}", self.workers[at].url()))
            .bearer_auth(key)
            .send()
            .await
            .expect("worker GET");
        json_of(response).await
    }

    async fn call(&self, at: usize, key: &str, server_id: &str) -> (StatusCode, Value) {
        let response = self
            .http
            .post(format!("{}/v1/mcp/tools/call", self.workers[at].url()))
            .bearer_auth(key)
            .json(&json!({"name": injected(server_id, "echo"), "arguments": {"text": "hi"}}))
            .send()
            .await
            .expect("tools/call");
        json_of(response).await
    }

    async fn tool_names(&self, at: usize, key: &str) -> Vec<String> {
        let (status, body) = self.worker_get(at, "/v1/mcp/tools", key).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let mut names: Vec<String> = body
            .as_array()
            .expect("tools")
            .iter()
            .filter_map(|tool| tool["name"].as_str().map(str::to_owned))
            .collect();
        names.sort();
        names
    }

    async fn mcp(&self, key: &str, session: Option<&str>, body: Value) -> reqwest::Response {
        let mut request = self
            .http
            .post(format!("{}/mcp", self.workers[0].url()))
            .bearer_auth(key)
            .header("accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(session) = session {
            request = request
                .header("mcp-session-id", session)
                .header("mcp-protocol-version", "2025-11-25");
        }
        request.send().await.expect("POST /mcp")
    }
}

async fn json_of(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(json!(text)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_without_caller_tokens_follow_the_registrys_keys_and_policies() {
    let db = TestDatabase::create().await;
    let registry = registry(db.url(), None).await;
    let admin = Admin::new(&registry, ADMIN);
    admin.upsert(stdio_record("alpha", &["echo"])).await;
    admin.upsert(stdio_record("beta", &["echo"])).await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let no_args: [&str; 0] = [];
    let workers = [
        WorkerProcess::start_without_callers(&registry.grpc_url(), WORKER, &no_args).await,
        WorkerProcess::start_without_callers(&registry.grpc_url(), WORKER, &no_args).await,
    ];
    let f = Fixture {
        registry,
        workers,
        http,
        _db: db,
    };

    let (status, body) = f
        .rest(
            reqwest::Method::PUT,
            "/admin/api/policies/team-a",
            Some(json!({"allowed_server_ids": ["alpha"]})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, created) = f
        .rest(
            reqwest::Method::POST,
            "/admin/api/keys",
            Some(json!({"name": "ci", "policy": "team-a"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let key = created["key"].as_str().expect("key").to_owned();
    let id = created["id"].as_str().expect("id").to_owned();
    let revision = created["revision"].as_u64().expect("revision");
    for worker in &f.workers {
        worker.synced(revision, Duration::from_secs(10)).await;
    }

    // The key calls its policy's tools on both workers; beta is neither
    // listed nor callable.
    for at in 0..2 {
        let (status, whoami) = f.worker_get(at, "/v1/whoami", &key).await;
        assert_eq!(status, StatusCode::OK, "{whoami}");
        assert_eq!(whoami["principal"], format!("key:{id}"));
        assert_eq!(
            (whoami["policy"].clone(), whoami["via"].clone()),
            (json!("team-a"), json!("key"))
        );
        assert_eq!(f.tool_names(at, &key).await, [injected("alpha", "echo")]);
        let (status, body) = f.call(at, &key, "alpha").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let (status, body) = f.call(at, &key, "beta").await;
        assert!(
            status.is_client_error(),
            "beta is outside the policy: {status} {body}"
        );
        let (status, _) = f.worker_get(at, "/v1/whoami", "qk_not-a-key").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }

    // Explain agrees with what the workers did.
    for (server_id, decision) in [("alpha", "allow"), ("beta", "deny")] {
        let (status, answer) = f
            .rest(
                reqwest::Method::POST,
                "/admin/api/access/explain",
                Some(json!({"key_id": id, "server_id": server_id, "tool": "echo"})),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["decision"], decision, "{answer}");
        assert_eq!(answer["principal"], format!("key:{id}"), "{answer}");
    }

    // An open gateway session of the key.
    let response = f
        .mcp(
            &key,
            None,
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "e2e", "version": "1"}}}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let session = response.headers()["mcp-session-id"]
        .to_str()
        .expect("ascii")
        .to_owned();
    let _ = response.text().await;
    let initialized = f
        .mcp(
            &key,
            Some(&session),
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        )
        .await;
    assert!(initialized.status().is_success());
    let mut stream = f
        .http
        .get(format!("{}/mcp", f.workers[0].url()))
        .bearer_auth(&key)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-11-25")
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .expect("GET /mcp");
    assert_eq!(stream.status(), StatusCode::OK);

    // A policy edit reaches the open session as tools/list_changed.
    let (status, body) = f
        .rest(
            reqwest::Method::PUT,
            "/admin/api/policies/team-a",
            Some(json!({"allowed_server_ids": ["alpha", "beta"]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let notified = tokio::time::timeout(Duration::from_secs(10), async {
        let mut seen = String::new();
        while let Ok(Some(chunk)) = stream.chunk().await {
            seen.push_str(&String::from_utf8_lossy(&chunk));
            if seen.contains("notifications/tools/list_changed") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        notified,
        Ok(true),
        "no tools/list_changed on the open session"
    );
    let listed = f
        .mcp(
            &key,
            Some(&session),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        )
        .await;
    assert_eq!(listed.status(), StatusCode::OK);
    let listed = listed.text().await.expect("body");
    assert!(listed.contains(&injected("beta", "echo")), "{listed}");

    // The registry learns when the key was used, from the workers' reports.
    eventually(
        Duration::from_secs(20),
        "last_used_at of the key",
        || async {
            let (_, keys) = f.rest(reqwest::Method::GET, "/admin/api/keys", None).await;
            keys["keys"][0]["last_used_at"].as_str().map(str::to_owned)
        },
    )
    .await;

    // Revoked: both workers refuse it within the bound, and so does the
    // open gateway session.
    let (status, body) = f
        .rest(
            reqwest::Method::DELETE,
            &format!("/admin/api/keys/{id}"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let revoked = Instant::now();
    for at in 0..2 {
        loop {
            let (status, _) = f.worker_get(at, "/v1/whoami", &key).await;
            if status == StatusCode::UNAUTHORIZED {
                break;
            }
            assert!(
                revoked.elapsed() < REVOCATION_BOUND,
                "worker {at} still accepts the revoked key after {:?}",
                revoked.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let refused = f
        .mcp(
            &key,
            Some(&session),
            json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}),
        )
        .await;
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);

    // No secret in any log, whole.
    let Fixture {
        mut registry,
        mut workers,
        ..
    } = f;
    for worker in &mut workers {
        worker.terminate(Duration::from_secs(15)).await;
    }
    registry.terminate(Duration::from_secs(15)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let secret = key.trim_start_matches("qk_");
    for log in workers
        .iter()
        .map(WorkerProcess::log_tail)
        .chain([registry.log_tail()])
    {
        assert!(!log.contains(secret), "the key is in a log:\n{log}");
    }
}

/// `POST path` of the issuer with a JSON body (fails the test unless 200).
async fn issuer_post(issuer: &crate::oauth::OAuthServer, path: &str, body: Value) {
    let response = issuer
        .http
        .post(format!("{}{path}", issuer.base))
        .json(&body)
        .send()
        .await
        .expect("issuer admin call");
    assert_eq!(response.status(), StatusCode::OK, "POST {path} {body}");
}

/// The `Location` of a redirect, and its `Set-Cookie` values.
fn redirect(response: &reqwest::Response) -> (String, Vec<String>) {
    assert!(
        response.status().is_redirection(),
        "expected a redirect, got {}",
        response.status()
    );
    let location = response.headers()["location"]
        .to_str()
        .expect("ascii")
        .to_owned();
    let cookies = response
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_owned)
        .collect();
    (location, cookies)
}

/// `name=value` of the cookie `name` among `Set-Cookie` values.
fn cookie<'a>(set: &'a [String], name: &str) -> &'a str {
    set.iter()
        .find(|c| c.starts_with(&format!("{name}=")))
        .and_then(|c| c.split(';').next())
        .unwrap_or_else(|| panic!("no cookie {name} in {set:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn people_of_the_identity_provider_get_registry_roles_by_token_and_by_sign_in() {
    let issuer = crate::oauth::OAuthServer::start(&[]).await;
    let (_dir, db_url) = crate::harness::sqlite();
    let mut registry = registry(&db_url, None).await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let base = registry.http_url();
    let callback = format!("{base}/admin/signin/callback");
    issuer_post(
        &issuer,
        "/admin/clients",
        json!({"client_id": "quiver-web", "redirect_uris": [callback]}),
    )
    .await;
    let provider = json!({
        "issuer": issuer.base,
        "audiences": ["quiver-web", "quiver"],
        "web_client_id": "quiver-web",
        "rules": [
            {"claim": "groups", "contains": "admins", "roles": ["admin"]},
            {"claim": "groups", "contains": "viewers", "roles": ["viewer"]},
        ],
    });
    let response = http
        .put(format!("{base}/admin/api/identity/providers/corp"))
        .bearer_auth(ADMIN)
        .json(&provider)
        .send()
        .await
        .expect("PUT provider");
    assert_eq!(response.status(), StatusCode::CREATED);
    let whoami = async |request: reqwest::RequestBuilder| {
        json_of(request.send().await.expect("whoami")).await
    };
    let url = format!("{base}/admin/api/whoami");

    // A bearer JWT: the rules give the role, the principal is audited.
    let mint = async |claims: Value| {
        let response = issuer
            .http
            .post(format!("{}/admin/oidc/mint", issuer.base))
            .json(&json!({"claims": claims}))
            .send()
            .await
            .expect("mint");
        let body: Value = response.json().await.expect("minted");
        body["token"].as_str().expect("token").to_owned()
    };
    let viewer = mint(json!({"sub": "vic", "groups": ["viewers"]})).await;
    let (status, body) = whoami(http.get(&url).bearer_auth(&viewer)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["role"], "viewer");
    assert_eq!(body["principal"], format!("oidc:{}#vic", issuer.base));
    assert_eq!(body["via"], "oidc");
    let (status, _) = json_of(
        http.put(format!("{base}/admin/api/policies/p"))
            .bearer_auth(&viewer)
            .json(&json!({}))
            .send()
            .await
            .expect("PUT"),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a viewer does not write");
    let nobody = mint(json!({"sub": "nia", "groups": ["other"]})).await;
    let (status, body) = whoami(http.get(&url).bearer_auth(&nobody)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("no"),
        "{body}"
    );
    let wrong_audience = issuer
        .http
        .post(format!("{}/admin/oidc/mint", issuer.base))
        .json(&json!({"claims": {"sub": "eve", "groups": ["admins"], "aud": "someone-else"}}))
        .send()
        .await
        .expect("mint")
        .json::<Value>()
        .await
        .expect("minted")["token"]
        .as_str()
        .expect("token")
        .to_owned();
    let (status, _) = whoami(http.get(&url).bearer_auth(&wrong_audience)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // Explain verifies a JWT as a worker would: these rules give roles, no policy.
    for (token, code) in [
        (&viewer, "identity_no_matching_rule"),
        (&wrong_audience, "token_refused"),
    ] {
        let (status, answer) = json_of(
            http.post(format!("{base}/admin/api/access/explain"))
                .bearer_auth(ADMIN)
                .json(&json!({"token": token, "server_id": "x", "tool": "y"}))
                .send()
                .await
                .expect("explain"),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["decision"], "deny", "{answer}");
        assert_eq!(answer["code"], code, "{answer}");
    }

    // Sign-in in the web admin: authorization code + PKCE, then a session cookie.
    issuer_post(
        &issuer,
        "/admin/oidc/person",
        json!({"sub": "alice", "groups": ["admins"]}),
    )
    .await;
    let (status, providers) = json_of(
        http.get(format!("{base}/admin/signin/providers"))
            .send()
            .await
            .expect("providers"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(providers["providers"], json!([{"name": "corp"}]));
    let started = http
        .get(format!("{base}/admin/signin/corp"))
        .send()
        .await
        .expect("sign-in start");
    let (to_issuer, set) = redirect(&started);
    assert!(to_issuer.starts_with(&issuer.base), "{to_issuer}");
    assert!(to_issuer.contains("code_challenge_method=S256") && to_issuer.contains("nonce="));
    let flow = cookie(&set, "quiver_signin").to_owned();
    let approved = http.get(&to_issuer).send().await.expect("authorize");
    let (back, _) = redirect(&approved);
    assert!(back.starts_with(&callback), "{back}");

    // The answer in another browser (without the flow cookie) signs nobody in.
    let stolen = http.get(&back).send().await.expect("callback");
    let (location, set) = redirect(&stolen);
    assert!(location.starts_with("/admin/?signin_error="), "{location}");
    assert!(!set.iter().any(|c| c.starts_with("quiver_session=")));

    // A fresh flow in the same browser signs alice in.
    let started = http
        .get(format!("{base}/admin/signin/corp"))
        .send()
        .await
        .expect("sign-in start");
    let (to_issuer, set) = redirect(&started);
    let flow_again = cookie(&set, "quiver_signin").to_owned();
    assert_ne!(flow, flow_again);
    let (back, _) = redirect(&http.get(&to_issuer).send().await.expect("authorize"));
    let finished = http
        .get(&back)
        .header("cookie", &flow_again)
        .send()
        .await
        .expect("callback");
    let (location, set) = redirect(&finished);
    assert_eq!(location, "/admin/");
    let session_cookie = cookie(&set, "quiver_session").to_owned();
    let attributes = set
        .iter()
        .find(|c| c.starts_with("quiver_session="))
        .expect("session cookie");
    assert!(
        attributes.contains("HttpOnly") && attributes.contains("SameSite=Strict"),
        "{attributes}"
    );
    let (status, body) = whoami(http.get(&url).header("cookie", &session_cookie)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["role"], "admin");
    assert_eq!(body["principal"], format!("oidc:{}#alice", issuer.base));
    assert_eq!(body["via"], "session");

    // A write by the cookie needs the CSRF header.
    let put = |csrf: bool| {
        let mut request = http
            .put(format!("{base}/admin/api/policies/by-alice"))
            .header("cookie", &session_cookie)
            .json(&json!({}));
        if csrf {
            request = request.header("x-quiver-csrf", "1");
        }
        request
    };
    let (status, _) = json_of(put(false).send().await.expect("PUT")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, body) = json_of(put(true).send().await.expect("PUT")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["updated_by"], format!("oidc:{}#alice", issuer.base));

    // Signing out clears the cookie.
    let out = http
        .post(format!("{base}/admin/signout"))
        .header("cookie", &session_cookie)
        .header("x-quiver-csrf", "1")
        .send()
        .await
        .expect("signout");
    assert_eq!(out.status(), StatusCode::NO_CONTENT);
    let cleared = out.headers()["set-cookie"].to_str().expect("ascii");
    assert!(
        cleared.starts_with("quiver_session=;") && cleared.contains("Max-Age=0"),
        "{cleared}"
    );

    registry.terminate(Duration::from_secs(15)).await;
    let log = registry.log_tail();
    for secret in [&viewer, &nobody] {
        let signature = secret.rsplit('.').next().unwrap_or_default();
        assert!(!log.contains(signature), "a token is in the registry's log");
    }
    let sealed = session_cookie.trim_start_matches("quiver_session=");
    assert!(!log.contains(sealed), "the session cookie is in the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registrys_identity_providers_give_oidc_callers_their_policy_on_workers() {
    let issuer = crate::oauth::OAuthServer::start(&[]).await;
    let (_dir, db_url) = crate::harness::sqlite();
    let registry = registry(&db_url, None).await;
    let admin = Admin::new(&registry, ADMIN);
    admin.upsert(stdio_record("alpha", &["echo"])).await;
    admin.upsert(stdio_record("beta", &["echo"])).await;
    let no_args: [&str; 0] = [];
    let worker = WorkerProcess::start_without_callers(&registry.grpc_url(), WORKER, &no_args).await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let put = async |path: &str, body: Value| {
        let response = http
            .put(format!("{}{path}", registry.http_url()))
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
            .await
            .expect("PUT");
        let (status, body) = json_of(response).await;
        assert!(status.is_success(), "PUT {path}: {status} {body}");
        body["revision"].as_u64().expect("revision")
    };
    put(
        "/admin/api/policies/team-a",
        json!({"allowed_server_ids": ["alpha"]}),
    )
    .await;
    put(
        "/admin/api/policies/team-b",
        json!({"allowed_server_ids": ["beta"]}),
    )
    .await;
    let provider = |policy: &str| {
        json!({"issuer": issuer.base, "audiences": ["quiver"],
               "rules": [{"claim": "groups", "contains": "devs", "policy": policy}]})
    };
    let revision = put("/admin/api/identity/providers/corp", provider("team-b")).await;
    worker.synced(revision, Duration::from_secs(10)).await;
    let mint = async |groups: Value| {
        let response = issuer
            .http
            .post(format!("{}/admin/oidc/mint", issuer.base))
            .json(&json!({"claims": {"sub": "dana", "groups": groups}}))
            .send()
            .await
            .expect("mint");
        let body: Value = response.json().await.expect("minted");
        body["token"].as_str().expect("token").to_owned()
    };
    let get = async |path: &str, token: &str| {
        let response = http
            .get(format!("{}{path}", worker.url()))
            .bearer_auth(token)
            .send()
            .await
            .expect("worker GET");
        json_of(response).await
    };
    let dev = mint(json!(["devs"])).await;
    let (status, whoami) = get("/v1/whoami", &dev).await;
    assert_eq!(status, StatusCode::OK, "{whoami}");
    assert_eq!(whoami["via"], "oidc");
    assert_eq!(whoami["policy"], "team-b");
    assert_eq!(whoami["principal"], format!("oidc:{}#dana", issuer.base));
    let (_, tools) = get("/v1/mcp/tools", &dev).await;
    let names: Vec<&str> = tools
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, [injected("beta", "echo")]);
    let stranger = mint(json!(["other"])).await;
    let (status, body) = get("/v1/whoami", &stranger).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "identity_no_matching_rule");

    // A rule edit applies to the same token at once, without refetching keys.
    let fetched = issuer.stats().await["jwks_fetches"].as_u64();
    let revision = put("/admin/api/identity/providers/corp", provider("team-a")).await;
    worker.synced(revision, Duration::from_secs(10)).await;
    let (status, whoami) = get("/v1/whoami", &dev).await;
    assert_eq!(status, StatusCode::OK, "{whoami}");
    assert_eq!(whoami["policy"], "team-a");
    assert_eq!(issuer.stats().await["jwks_fetches"].as_u64(), fetched);
}
