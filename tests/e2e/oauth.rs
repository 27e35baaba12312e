//! OAuth connections end to end (docs/reference.md §13.6, issue #15): a real
//! authorization server and OAuth-protected MCP server
//! (`quiver-testkit-oauth`), two registry replicas on one PostgreSQL
//! database, a worker on each, and the web admin's Connect button in
//! Chromium.
//!
//! What it shows: the registry holds the tokens and workers only ever get
//! access tokens; a token that expires is refreshed exactly once (counted at
//! the authorization server) although two workers through two replicas need
//! it at the same moment; a refused refresh token turns the connection to
//! `needs_reconsent` and its calls into a clear `mcp_unavailable` while other
//! servers keep working; a tool needing more scope (403 `insufficient_scope`)
//! asks for consent to it (client credentials: gets it at once); no token
//! shows up in any log line, REST read or history entry. The bad-input cases show each failing step named and
//! nothing stored.

use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::harness::{
    ADMIN, Admin, CALLER, RegistryProcess, WORKER, WorkerProcess, injected, sqlite, stdio_record,
    testkit_bin,
};

const CONNECTION: &str = "tracker";

/// A `quiver-testkit-oauth` process (also the OIDC issuer of
/// `crate::identity`).
pub(crate) struct OAuthServer {
    child: Child,
    /// Its base URL (the issuer).
    pub(crate) base: String,
    pub(crate) mcp: String,
    pub(crate) http: reqwest::Client,
}

impl OAuthServer {
    pub(crate) async fn start(args: &[&str]) -> OAuthServer {
        let mut child = Command::new(testkit_bin("quiver-testkit-oauth"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn quiver-testkit-oauth");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        tokio::time::timeout(
            Duration::from_secs(20),
            BufReader::new(stdout).read_line(&mut line),
        )
        .await
        .expect("quiver-testkit-oauth: no listening line within 20 s")
        .expect("read the listening line");
        let value: Value = serde_json::from_str(&line)
            .unwrap_or_else(|err| panic!("bad listening line {line:?}: {err}"));
        OAuthServer {
            child,
            base: value["listening"].as_str().expect("listening").to_owned(),
            mcp: value["mcp"].as_str().expect("mcp").to_owned(),
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("http client"),
        }
    }

    pub(crate) async fn stats(&self) -> Value {
        self.http
            .get(format!("{}/admin/stats", self.base))
            .send()
            .await
            .expect("GET /admin/stats")
            .json()
            .await
            .expect("stats json")
    }

    pub(crate) async fn admin(&self, path: &str, body: Value) {
        let response = self
            .http
            .post(format!("{}/admin/{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap_or_else(|err| panic!("POST /admin/{path}: {err}"));
        assert!(
            response.status().is_success(),
            "POST /admin/{path}: {response:?}"
        );
    }

    /// Every access and refresh token the server issued.
    pub(crate) async fn issued_tokens(&self) -> Vec<String> {
        let body: Value = self
            .http
            .get(format!("{}/admin/tokens", self.base))
            .send()
            .await
            .expect("GET /admin/tokens")
            .json()
            .await
            .expect("tokens json");
        ["access_tokens", "refresh_tokens"]
            .iter()
            .flat_map(|kind| body[kind].as_array().cloned().unwrap_or_default())
            .filter_map(|token| token.as_str().map(str::to_owned))
            .collect()
    }
}

impl Drop for OAuthServer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// A fresh sealing key, as `--oauth-keys` takes it.
pub(crate) fn oauth_keys() -> String {
    let key: [u8; 32] = rand::random();
    format!(
        "e2e:{}",
        base64::engine::general_purpose::STANDARD.encode(key)
    )
}

/// Two registry replicas on `db`, sharing their OAuth keys.
pub(crate) async fn replicas(
    db: &quiver_testkit::postgres::TestDatabase,
) -> (RegistryProcess, RegistryProcess) {
    let keys = oauth_keys();
    let args = [
        "--database-url",
        db.url(),
        "--admin-token",
        ADMIN,
        "--worker-token",
        WORKER,
        "--oauth-keys",
        keys.as_str(),
    ];
    (
        RegistryProcess::start(&args).await,
        RegistryProcess::start(&args).await,
    )
}

/// A registry on a fresh SQLite file with OAuth keys.
pub(crate) async fn sqlite_registry() -> (tempfile::TempDir, RegistryProcess) {
    sqlite_registry_with(&[]).await
}

/// [`sqlite_registry`] with more flags.
async fn sqlite_registry_with(extra: &[&str]) -> (tempfile::TempDir, RegistryProcess) {
    let (dir, db_url) = sqlite();
    let keys = oauth_keys();
    let mut args = vec![
        "--database-url",
        db_url.as_str(),
        "--admin-token",
        ADMIN,
        "--worker-token",
        WORKER,
        "--oauth-keys",
        keys.as_str(),
    ];
    args.extend_from_slice(extra);
    let registry = RegistryProcess::start(&args).await;
    (dir, registry)
}

pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("http client")
}

/// `method /admin/api/oauth/connections/{name}{suffix}` with the admin token.
pub(crate) async fn oauth_api(
    registry: &RegistryProcess,
    method: reqwest::Method,
    suffix: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = client()
        .request(
            method,
            format!(
                "{}/admin/api/oauth/connections{suffix}",
                registry.http_url()
            ),
        )
        .bearer_auth(ADMIN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("oauth admin api");
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(json!(text)))
}

pub(crate) async fn put_connection(registry: &RegistryProcess, name: &str, spec: Value) -> Value {
    let (status, body) = oauth_api(
        registry,
        reqwest::Method::PUT,
        &format!("/{name}"),
        Some(spec),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "PUT connection {name}: {body}");
    body
}

async fn view(registry: &RegistryProcess, name: &str) -> Value {
    let (status, body) = oauth_api(registry, reqwest::Method::GET, &format!("/{name}"), None).await;
    assert_eq!(status, StatusCode::OK, "GET connection {name}: {body}");
    body
}

pub(crate) fn oauth_record(server_id: &str, url: &str, auth_ref: &str) -> Value {
    json!({
        "server_id": server_id,
        "transport": "streamable_http",
        "http": {"url": url, "auth_ref": auth_ref},
        "allowed_tools": ["*"],
    })
}

/// Calls `whoami` on `worker`, which must succeed: the client id the
/// server's token belongs to.
async fn whoami(worker: &WorkerProcess, server_id: &str) -> String {
    worker
        .call_text(&injected(server_id, "whoami"), json!({}))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_broker_serves_the_fleet_refreshes_once_and_asks_for_reconsent() {
    let db = quiver_testkit::postgres::TestDatabase::create().await;
    let (registry_a, registry_b) = replicas(&db).await;
    let server = OAuthServer::start(&[]).await;
    let admin = Admin::new(&registry_a, ADMIN);

    put_connection(&registry_a, CONNECTION, json!({"server_url": server.mcp})).await;
    admin
        .upsert(oauth_record("tracker", &server.mcp, CONNECTION))
        .await;
    let revision = admin.upsert(stdio_record("plain", &["*"])).await;
    let worker_a =
        WorkerProcess::start(&registry_a.grpc_url(), WORKER, CALLER, &[] as &[&str]).await;
    let worker_b =
        WorkerProcess::start(&registry_b.grpc_url(), WORKER, CALLER, &[] as &[&str]).await;
    for worker in [&worker_a, &worker_b] {
        worker.synced(revision, Duration::from_secs(10)).await;
    }

    // Before anyone connected: a clear refusal, the other server works.
    let (status, body) = worker_a
        .call(&injected("tracker", "whoami"), json!({}))
        .await;
    assert_eq!(body["error"]["code"], "mcp_unavailable", "{status}: {body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("not connected"),
        "{body}"
    );

    // A person presses Connect in the web admin (replica A); the test
    // authorization server approves at once.
    crate::web_admin::run_browser_script(
        "oauth.spec.mjs",
        &[
            ("QUIVER_REGISTRY_URL", registry_a.http_url()),
            ("QUIVER_ADMIN_TOKEN", ADMIN.to_owned()),
            ("QUIVER_OAUTH_CONNECTION", CONNECTION.to_owned()),
        ],
    )
    .await;
    assert_eq!(view(&registry_b, CONNECTION).await["status"], "connected");
    assert_eq!(server.stats().await["authorization_code_grants"], 1);

    // Both workers call, through both replicas.
    let client_id = whoami(&worker_a, "tracker").await;
    assert!(!client_id.is_empty());
    assert_eq!(whoami(&worker_b, "tracker").await, client_id);

    // The server stops accepting the access token: both workers get 401 at
    // once and ask their replica; exactly one refresh happens.
    server.admin("expire-access-tokens", json!({})).await;
    let (a, b) = tokio::join!(whoami(&worker_a, "tracker"), whoami(&worker_b, "tracker"));
    assert_eq!(
        (a.as_str(), b.as_str()),
        (client_id.as_str(), client_id.as_str())
    );
    let stats = server.stats().await;
    assert_eq!(stats["refresh_grants"], 1, "{stats}");
    assert_eq!(stats["refresh_failures"], 0, "{stats}");

    // Tokens that expire by the clock: refreshed before use, once.
    server.admin("config", json!({"access_ttl_secs": 4})).await;
    server.admin("expire-access-tokens", json!({})).await;
    whoami(&worker_a, "tracker").await; // refresh 2: a 4 s token
    tokio::time::sleep(Duration::from_millis(2500)).await; // past its refresh time
    let (a, b) = tokio::join!(whoami(&worker_a, "tracker"), whoami(&worker_b, "tracker"));
    assert_eq!(
        (a.as_str(), b.as_str()),
        (client_id.as_str(), client_id.as_str())
    );
    let stats = server.stats().await;
    assert_eq!(stats["refresh_grants"], 3, "{stats}");
    assert_eq!(stats["refresh_failures"], 0, "{stats}");
    let connection = view(&registry_a, CONNECTION).await;
    assert_eq!(connection["refresh_count"], 3, "{connection}");
    server
        .admin("config", json!({"access_ttl_secs": 3600}))
        .await;

    // The refresh token is revoked: needs re-consent, clear errors, the
    // other server unaffected.
    server.admin("revoke-refresh-tokens", json!({})).await;
    server.admin("expire-access-tokens", json!({})).await;
    for worker in [&worker_a, &worker_b] {
        let (status, body) = worker.call(&injected("tracker", "whoami"), json!({})).await;
        assert_eq!(body["error"]["code"], "mcp_unavailable", "{status}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("needs re-consent"), "{body}");
        assert_eq!(
            worker
                .call_text(&injected("plain", "add"), json!({"a": 1, "b": 2}))
                .await,
            "3"
        );
        let entry = worker.server("tracker").await.expect("tracker listed");
        assert_eq!(entry["oauth"]["status"], "needs_reconsent", "{entry}");
    }
    let connection = view(&registry_b, CONNECTION).await;
    assert_eq!(connection["status"], "needs_reconsent", "{connection}");
    assert_eq!(server.stats().await["refresh_failures"], 1);
    crate::web_admin::run_browser_script(
        "oauth.spec.mjs",
        &[
            ("QUIVER_REGISTRY_URL", registry_b.http_url()),
            ("QUIVER_ADMIN_TOKEN", ADMIN.to_owned()),
            ("QUIVER_OAUTH_CONNECTION", CONNECTION.to_owned()),
            ("QUIVER_OAUTH_EXPECT", "needs_reconsent".to_owned()),
        ],
    )
    .await;

    // Connecting again (a new grant, through the other replica) brings the
    // server back on both workers.
    let (status, body, cookie) = connect_with_cookie(&registry_b, CONNECTION).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let callback = authorize(body["authorization_url"].as_str().expect("url")).await;
    let response = callback_with(&callback, &cookie).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER, "{response:?}");
    let again = whoami(&worker_a, "tracker").await;
    assert_eq!(whoami(&worker_b, "tracker").await, again);
    assert_eq!(view(&registry_a, CONNECTION).await["status"], "connected");

    // Issue #21 item 6: without a ceiling set by an admin, a tool that
    // needs a scope the grant lacks cannot widen the connection nor flip it
    // to needs_reconsent.
    let admin_echo = injected("tracker", "admin_echo");
    let (status, body) = worker_a.call(&admin_echo, json!({"text": "hi"})).await;
    assert!(!status.is_success(), "{status}: {body}");
    let connection = view(&registry_b, CONNECTION).await;
    assert_eq!(connection["status"], "connected", "{connection}");
    assert_eq!(connection["scopes"], Value::Null, "{connection}");
    put_connection(
        &registry_a,
        CONNECTION,
        json!({"server_url": server.mcp, "max_scopes": ["mcp:tools", "mcp:admin"]}),
    )
    .await;
    let (_, body, cookie) = connect_with_cookie(&registry_a, CONNECTION).await;
    let callback = authorize(body["authorization_url"].as_str().expect("url")).await;
    let response = callback_with(&callback, &cookie).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER, "{response:?}");

    // Step-up within the ceiling: a tool that needs a scope the grant lacks
    // (403 insufficient_scope) asks a person to consent to it, once;
    // afterwards it works on both workers.
    let (status, body) = worker_a.call(&admin_echo, json!({"text": "hi"})).await;
    assert_eq!(body["error"]["code"], "mcp_unavailable", "{status}: {body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("needs re-consent") && message.contains("mcp:admin"),
        "{body}"
    );
    let connection = view(&registry_b, CONNECTION).await;
    assert_eq!(connection["status"], "needs_reconsent", "{connection}");
    assert_eq!(
        connection["scopes"],
        json!(["mcp:tools", "mcp:admin"]),
        "{connection}"
    );
    let (_, body, cookie) = connect_with_cookie(&registry_a, CONNECTION).await;
    let callback = authorize(body["authorization_url"].as_str().expect("url")).await;
    let response = callback_with(&callback, &cookie).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER, "{response:?}");
    for worker in [&worker_a, &worker_b] {
        assert_eq!(
            worker.call_text(&admin_echo, json!({"text": "hi"})).await,
            "hi"
        );
    }

    // No token anywhere: logs of every process, REST reads, history.
    let tokens = server.issued_tokens().await;
    assert!(tokens.len() >= 6, "{tokens:?}");
    let mut seen = vec![
        registry_a.log_tail(),
        registry_b.log_tail(),
        worker_a.log_tail(),
        worker_b.log_tail(),
    ];
    for path in [
        "/admin/api/oauth/connections",
        "/admin/api/mcp/servers",
        "/admin/api/mcp/servers/tracker/history",
        "/admin/api/audit",
    ] {
        let text = client()
            .get(format!("{}{path}", registry_a.http_url()))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("admin read")
            .text()
            .await
            .expect("body");
        seen.push(text);
    }
    seen.push(worker_a.get("/v1/mcp/servers").await.1.to_string());
    for log in &seen[..4] {
        // The whole log was kept, so every line was looked at.
        assert!(
            log.lines().count() < crate::harness::LOG_TAIL,
            "log longer than kept"
        );
    }
    for token in &tokens {
        for (index, text) in seen.iter().enumerate() {
            assert!(
                !text.contains(token.as_str()),
                "a token appears in output {index}"
            );
        }
    }
    drop(db);
}

/// Follows an authorization URL without a browser: the test server answers
/// with a redirect to the registry's callback.
pub(crate) async fn authorize(url: &str) -> String {
    let response = client()
        .get(url)
        .send()
        .await
        .expect("GET authorization url");
    assert_eq!(response.status(), StatusCode::FOUND, "{response:?}");
    response
        .headers()
        .get(reqwest::header::LOCATION)
        .and_then(|value| value.to_str().ok())
        .expect("redirect location")
        .to_owned()
}

async fn connect(registry: &RegistryProcess, name: &str) -> (StatusCode, Value) {
    let (status, body, _) = connect_with_cookie(registry, name).await;
    (status, body)
}

/// Connect as the web admin's browser does: also the flow's cookie
/// (`name=value`) the answer sets, which the callback needs.
async fn connect_with_cookie(
    registry: &RegistryProcess,
    name: &str,
) -> (StatusCode, Value, String) {
    let response = client()
        .post(format!(
            "{}/admin/api/oauth/connections/{name}/connect",
            registry.http_url()
        ))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("connect");
    let status = response.status();
    let cookie = response
        .headers()
        .get(reqwest::header::SET_COOKIE)
        .and_then(|value| value.to_str().ok())
        .map(|value| value.split(';').next().unwrap_or_default().to_owned())
        .unwrap_or_default();
    let text = response.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(json!(text)),
        cookie,
    )
}

/// The browser's way back: GET the callback with the flow's cookie.
pub(crate) async fn callback_with(callback: &str, cookie: &str) -> reqwest::Response {
    client()
        .get(callback)
        .header(reqwest::header::COOKIE, cookie)
        .send()
        .await
        .expect("callback")
}

/// The connection is exactly as before the failed attempt, apart from the
/// error it names.
async fn assert_nothing_stored(registry: &RegistryProcess, name: &str, step: &str) {
    let connection = view(registry, name).await;
    assert_eq!(connection["status"], "not_connected", "{connection}");
    assert_eq!(connection["connected_at"], Value::Null, "{connection}");
    let error = connection["last_error"].as_str().unwrap_or_default();
    assert!(
        error.contains(step),
        "last_error names {step:?}: {connection}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_failing_step_is_named_and_nothing_is_stored() {
    let (_dir, registry) = sqlite_registry().await;

    // Discovery refuses bad metadata before anything is registered.
    for (fault, needle) in [
        ("bad-metadata", "oauth discovery"),
        ("wrong-issuer", "oauth discovery"),
        ("no-pkce", "PKCE"),
    ] {
        let server = OAuthServer::start(&["--fault", fault]).await;
        put_connection(&registry, fault, json!({"server_url": server.mcp})).await;
        let (status, body) = connect(&registry, fault).await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{fault}: {body}");
        assert_eq!(body["error"]["code"], "mcp_unavailable", "{fault}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(needle), "{fault}: {body}");
        assert_nothing_stored(&registry, fault, "oauth discovery").await;
        assert_eq!(server.stats().await["registrations"], 0, "{fault}");
    }

    // The authorization server's redirect carries another state.
    let server = OAuthServer::start(&["--fault", "state-mismatch"]).await;
    put_connection(&registry, "mismatch", json!({"server_url": server.mcp})).await;
    let (status, body) = connect(&registry, "mismatch").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let callback = authorize(body["authorization_url"].as_str().expect("url")).await;
    let response = client().get(&callback).send().await.expect("callback");
    assert!(response.status().is_client_error() || response.status().is_server_error());
    let page = response.text().await.unwrap_or_default();
    assert!(
        page.contains("oauth-error") && page.contains("state mismatch"),
        "{page}"
    );
    let connection = view(&registry, "mismatch").await;
    assert_eq!(connection["status"], "not_connected", "{connection}");
    assert_eq!(server.stats().await["authorization_code_grants"], 0);

    // The token endpoint refuses: named, nothing stored; the state was used
    // up, so replaying the callback is refused too.
    let server = OAuthServer::start(&["--fault", "token-error"]).await;
    put_connection(&registry, "refused", json!({"server_url": server.mcp})).await;
    let (_, body, cookie) = connect_with_cookie(&registry, "refused").await;
    let callback = authorize(body["authorization_url"].as_str().expect("url")).await;
    let response = callback_with(&callback, &cookie).await;
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    let page = response.text().await.unwrap_or_default();
    assert!(page.contains("oauth token exchange"), "{page}");
    assert_nothing_stored(&registry, "refused", "oauth token exchange").await;
    let replay = callback_with(&callback, &cookie).await;
    let page = replay.text().await.unwrap_or_default();
    assert!(page.contains("state mismatch"), "{page}");

    // Malformed settings: refused naming the field.
    let (status, body) = oauth_api(
        &registry,
        reqwest::Method::PUT,
        "/bad",
        Some(json!({"server_url": "ftp://x"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["field"], "server_url", "{body}");
    let (status, body) = oauth_api(
        &registry,
        reqwest::Method::PUT,
        "/bad%20name",
        Some(json!({"server_url": server.mcp})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["field"], "name", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_credentials_connect_without_a_person() {
    let (_dir, registry) = sqlite_registry().await;
    let server = OAuthServer::start(&["--client", "machine:s3cret"]).await;
    let secret_view = put_connection(
        &registry,
        "m2m",
        json!({
            "server_url": server.mcp,
            "grant": "client_credentials",
            "client_id": "machine",
            "client_secret": "s3cret",
        }),
    )
    .await;
    assert_eq!(secret_view["has_client_secret"], true);
    assert!(!secret_view.to_string().contains("s3cret"), "{secret_view}");
    let (status, body) = connect(&registry, "m2m").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["connection"]["status"], "connected", "{body}");
    let revision = Admin::new(&registry, ADMIN)
        .upsert(oauth_record("m2m", &server.mcp, "m2m"))
        .await;
    let worker = WorkerProcess::start(&registry.grpc_url(), WORKER, CALLER, &[] as &[&str]).await;
    worker.synced(revision, Duration::from_secs(10)).await;
    assert_eq!(whoami(&worker, "m2m").await, "machine");
    // An expired token is simply asked for again.
    server.admin("expire-access-tokens", json!({})).await;
    assert_eq!(whoami(&worker, "m2m").await, "machine");
    assert_eq!(server.stats().await["client_credentials_grants"], 2);
    // Issue #21 item 6: the worker token cannot widen the connection: by
    // default (no max_scopes) a step-up is refused naming the ceiling, the
    // connection is unchanged and the refusal is audited with the worker.
    let before = view(&registry, "m2m").await;
    let (status, body) = worker
        .call(&injected("m2m", "admin_echo"), json!({"text": "hi"}))
        .await;
    assert!(!status.is_success(), "{status}: {body}");
    let after = view(&registry, "m2m").await;
    assert_eq!(after["scopes"], before["scopes"], "{after}");
    assert_eq!(after["status"], "connected", "{after}");
    assert_eq!(after["updated_at"], before["updated_at"], "{after}");
    assert_eq!(server.stats().await["client_credentials_grants"], 2);
    let log = registry.log_tail();
    let refusal = log
        .lines()
        .find(|line| line.contains("oauth_step_up_refused"))
        .unwrap_or_else(|| panic!("no refusal audited:\n{log}"));
    assert!(refusal.contains("\"actor\":\"worker:"), "{refusal}");
    // An admin sets a ceiling: a step-up within it asks for the wider
    // scope at once, without a person.
    put_connection(
        &registry,
        "m2m",
        json!({
            "server_url": server.mcp,
            "grant": "client_credentials",
            "client_id": "machine",
            "max_scopes": ["mcp:tools", "mcp:admin"],
        }),
    )
    .await;
    assert_eq!(
        worker
            .call_text(&injected("m2m", "admin_echo"), json!({"text": "hi"}))
            .await,
        "hi"
    );
    assert!(
        registry
            .log_tail()
            .lines()
            .any(|line| line.contains("\"oauth_step_up\"") && line.contains("\"actor\":\"worker:")),
        "step-up audited with the worker"
    );
    assert_eq!(
        view(&registry, "m2m").await["scopes"],
        json!(["mcp:tools", "mcp:admin"])
    );
    assert!(!registry.log_tail().contains("s3cret"));
}

/// Issue #21 item 8: the broker's requests (discovery, registration, token)
/// are held to the registry's egress allowlist like its tool preview: with
/// an allowlist that does not admit loopback, Connect fetches nothing from
/// the loopback server; one that admits it (by CIDR) connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_obeys_the_registry_egress_allowlist() {
    let server = OAuthServer::start(&["--client", "machine:s3cret"]).await;
    let spec = json!({
        "server_url": server.mcp,
        "grant": "client_credentials",
        "client_id": "machine",
        "client_secret": "s3cret",
    });
    let (_dir, refusing) =
        sqlite_registry_with(&["--egress-allow-host", "mcp.allowed.example"]).await;
    put_connection(&refusing, "m2m", spec.clone()).await;
    let (status, body) = connect(&refusing, "m2m").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("oauth discovery") && message.contains("not allowed"),
        "{body}"
    );
    assert_eq!(server.stats().await["client_credentials_grants"], 0);
    // The preview refuses the same URL.
    let response = client()
        .post(format!("{}/admin/api/mcp/preview", refusing.http_url()))
        .bearer_auth(ADMIN)
        .json(&oauth_record("m2m", &server.mcp, "m2m"))
        .send()
        .await
        .expect("preview");
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    assert!(!status.is_success(), "{status}: {body}");
    assert!(body.contains("not allowed"), "{body}");

    let (_dir, admitting) = sqlite_registry_with(&["--egress-allow-cidr", "127.0.0.0/8"]).await;
    put_connection(&admitting, "m2m", spec).await;
    let (status, body) = connect(&admitting, "m2m").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["connection"]["status"], "connected", "{body}");
    assert_eq!(server.stats().await["client_credentials_grants"], 1);
}

/// Issue #21 item 8: the callback completes a flow only in the browser that
/// pressed Connect (the HttpOnly cookie Connect set). Anyone else holding
/// the callback URL is refused with a page naming the step, and the flow
/// stays pending for its owner, who then completes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_callback_completes_only_in_the_browser_that_pressed_connect() {
    let (_dir, registry) = sqlite_registry().await;
    let server = OAuthServer::start(&[]).await;
    put_connection(&registry, "bound", json!({"server_url": server.mcp})).await;
    let (status, body, cookie) = connect_with_cookie(&registry, "bound").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(cookie.starts_with("quiver_oauth_flow_bound="), "{cookie}");
    let callback = authorize(body["authorization_url"].as_str().expect("url")).await;

    for (presented, why) in [
        (String::new(), "missing"),
        (
            "quiver_oauth_flow_bound=0123456789abcdef".to_owned(),
            "wrong",
        ),
    ] {
        let response = callback_with(&callback, &presented).await;
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{why}");
        let page = response.text().await.unwrap_or_default();
        assert!(
            page.contains("oauth-error")
                && page.contains("oauth callback")
                && page.contains("did not start the authorization")
                && page.contains(why),
            "{page}"
        );
        let connection = view(&registry, "bound").await;
        assert_eq!(connection["status"], "not_connected", "{connection}");
        assert_eq!(server.stats().await["authorization_code_grants"], 0);
    }

    // The owner's browser still completes it.
    let response = callback_with(&callback, &cookie).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER, "{response:?}");
    let cleared = response
        .headers()
        .get(reqwest::header::SET_COOKIE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    assert!(cleared.contains("Max-Age=0"), "{cleared}");
    assert_eq!(view(&registry, "bound").await["status"], "connected");
    assert_eq!(server.stats().await["authorization_code_grants"], 1);
}
