//! OIDC callers of a worker (issue #22), end to end: a real issuer process
//! (`quiver-testkit-oauth`, which serves OpenID discovery, a JWKS and mints
//! JWTs), a registry with two servers, and a worker whose
//! `[[identity_providers]]` entry trusts that issuer and maps claims to
//! tasks.
//!
//! What it shows: a token's `groups` claim selects the caller's task (its
//! tools only are listed and callable; `/v1/whoami` names the principal
//! `oidc:<issuer>#<sub>`); expired, wrong-audience, wrong-issuer, `alg:
//! none`, HS256-keyed-with-the-public-key, bad-signature and unknown-key
//! tokens are refused with 401 saying why; a valid token matching no rule
//! gets 403 `identity_no_matching_rule`; a rotated key is picked up with
//! exactly one JWKS refetch, and a flood of unknown key ids does not hammer
//! the issuer; static caller tokens keep working; no token is ever logged.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{
    Admin, CALLER, LOG_TAIL, RegistryProcess, WORKER, WorkerProcess, injected, registry, sqlite,
    stdio_record,
};
use crate::oauth::OAuthServer;

/// A `quiver-testkit-oauth` process: the identity provider.
struct Issuer {
    server: OAuthServer,
}

impl Issuer {
    async fn start() -> Issuer {
        Issuer {
            server: OAuthServer::start(&[]).await,
        }
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        let response = self
            .server
            .http
            .post(format!("{}{path}", self.server.base))
            .json(&body)
            .send()
            .await
            .unwrap_or_else(|err| panic!("POST {path}: {err}"));
        let status = response.status();
        let answer: Value = response.json().await.expect("JSON answer");
        assert_eq!(status, StatusCode::OK, "POST {path} {body}: {answer}");
        answer
    }

    /// `POST /admin/oidc/mint` with `body`: the token.
    async fn mint(&self, body: Value) -> String {
        let answer = self.post("/admin/oidc/mint", body).await;
        answer["token"].as_str().expect("token").to_owned()
    }

    /// A token with these claims over the defaults (ES256, current key).
    async fn token(&self, claims: Value) -> String {
        self.mint(json!({"claims": claims})).await
    }

    /// `POST /admin/oidc/rotate`: the new current kid.
    async fn rotate(&self, drop_old: bool) -> String {
        let answer = self
            .post("/admin/oidc/rotate", json!({"drop_old": drop_old}))
            .await;
        answer["kid"].as_str().expect("kid").to_owned()
    }

    /// `jwks_fetches` of `GET /admin/stats`.
    async fn jwks_fetches(&self) -> u64 {
        let stats = self.server.stats().await;
        stats["jwks_fetches"].as_u64().expect("jwks_fetches")
    }

    /// `oidc:<issuer>#<sub>`.
    fn principal(&self, sub: &str) -> String {
        format!("oidc:{}#{sub}", self.server.base)
    }
}

/// The issuer, a registry with servers `alpha` and `beta` (tool `echo`
/// each), and a worker with tasks `team-a` (alpha) and `team-b` (beta), the
/// static caller [`CALLER`] (task `default`), and the issuer as identity
/// provider: `groups` containing `team-a` → `team-a`, then `email` equal to
/// `bob@example.com` → `team-b`.
struct Fixture {
    issuer: Issuer,
    worker: WorkerProcess,
    _registry: RegistryProcess,
    _dir: tempfile::TempDir,
    http: reqwest::Client,
    /// Every token minted, to look for in the log at the end.
    minted: Vec<String>,
}

impl Fixture {
    async fn start() -> Fixture {
        let issuer = Issuer::start().await;
        let (dir, db_url) = sqlite();
        let registry = registry(&db_url, None).await;
        let admin = Admin::new(&registry, ADMIN_TOKEN);
        admin.upsert(stdio_record("alpha", &["echo"])).await;
        let revision = admin.upsert(stdio_record("beta", &["echo"])).await;
        let config = dir.path().join("worker.toml");
        std::fs::write(
            &config,
            format!(
                r#"[tasks.team-a]
allowed_server_ids = ["alpha"]

[tasks.team-b]
allowed_server_ids = ["beta"]

[[identity_providers]]
name = "corp"
issuer = "{issuer}"
audiences = ["quiver"]

[[identity_providers.rules]]
claim = "groups"
contains = "team-a"
task = "team-a"

[[identity_providers.rules]]
claim = "email"
equals = "bob@example.com"
task = "team-b"
"#,
                issuer = issuer.server.base
            ),
        )
        .expect("worker config");
        let worker = WorkerProcess::start(
            &registry.grpc_url(),
            WORKER,
            CALLER,
            &["--config", config.to_str().expect("utf-8 path")],
        )
        .await;
        worker.synced(revision, Duration::from_secs(10)).await;
        Fixture {
            issuer,
            worker,
            _registry: registry,
            _dir: dir,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .expect("http client"),
            minted: Vec::new(),
        }
    }

    /// Mints (and remembers) a token.
    async fn mint(&mut self, body: Value) -> String {
        let token = self.issuer.mint(body).await;
        self.minted.push(token.clone());
        token
    }

    /// Mints (and remembers) a token with `claims` over the defaults.
    async fn token(&mut self, claims: Value) -> String {
        let token = self.issuer.token(claims).await;
        self.minted.push(token.clone());
        token
    }

    /// `GET path` with `token`: status and JSON body.
    async fn get(&self, path: &str, token: &str) -> (StatusCode, Value) {
        let response = self
            .http
            .get(format!("{}{path}", self.worker.url()))
            .bearer_auth(token)
            .send()
            .await
            .unwrap_or_else(|err| panic!("GET {path}: {err}"));
        json_of(response).await
    }

    /// `POST /v1/mcp/tools/call` of `server_id`'s `echo` with `token`.
    async fn echo(&self, server_id: &str, token: &str) -> (StatusCode, Value) {
        let response = self
            .http
            .post(format!("{}/v1/mcp/tools/call", self.worker.url()))
            .bearer_auth(token)
            .json(&json!({"name": injected(server_id, "echo"), "arguments": {"text": "hi"}}))
            .send()
            .await
            .expect("POST /v1/mcp/tools/call");
        json_of(response).await
    }

    async fn whoami(&self, token: &str) -> Value {
        let (status, body) = self.get("/v1/whoami", token).await;
        assert_eq!(status, StatusCode::OK, "GET /v1/whoami: {body}");
        body
    }

    /// Asserts `token` is refused with 401 `unauthenticated` whose message
    /// contains `why`.
    async fn refused(&self, what: &str, token: &str, why: &str) {
        let (status, body) = self.get("/v1/whoami", token).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}: {body}");
        assert_eq!(body["error"]["code"], "unauthenticated", "{what}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.to_lowercase().contains(why),
            "{what}: the message should say {why:?}: {body}"
        );
        assert!(!message.contains(token), "{what}: the token is echoed");
    }

    /// Stops the worker, then: no minted token (nor its signature) in any
    /// line of its whole log.
    async fn assert_no_token_logged(&mut self) {
        // After exit the log is complete (its pipe drained to the end).
        self.worker.terminate(Duration::from_secs(15)).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let log = self.worker.log_tail();
        assert!(
            log.lines().count() < LOG_TAIL,
            "the log outgrew the kept tail: it can no longer be checked whole"
        );
        assert!(!self.minted.is_empty());
        for token in &self.minted {
            let signature = token.rsplit('.').next().unwrap_or_default();
            let leaked =
                log.contains(token.as_str()) || (signature.len() > 16 && log.contains(signature));
            assert!(!leaked, "a minted token is in the worker's log:\n{log}");
        }
    }
}

/// The admin token of the e2e registries.
const ADMIN_TOKEN: &str = crate::harness::ADMIN;

async fn json_of(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(json!(text)))
}

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_default()
}

/// The tool names `token` is offered.
async fn tool_names(fixture: &Fixture, token: &str) -> Vec<String> {
    let (status, body) = fixture.get("/v1/mcp/tools", token).await;
    assert_eq!(status, StatusCode::OK, "GET /v1/mcp/tools: {body}");
    let mut names: Vec<String> = body
        .as_array()
        .expect("tool list")
        .iter()
        .map(|tool| tool["name"].as_str().expect("name").to_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_callers_get_the_task_of_their_first_matching_rule() {
    let mut fixture = Fixture::start().await;
    let alpha = injected("alpha", "echo");
    let beta = injected("beta", "echo");

    // groups ["team-a"] → task team-a: alpha's tool only.
    let alice = fixture
        .token(json!({"sub": "alice", "groups": ["staff", "team-a"]}))
        .await;
    assert_eq!(
        fixture.whoami(&alice).await,
        json!({"principal": fixture.issuer.principal("alice"), "policy": "team-a", "via": "oidc"})
    );
    assert_eq!(tool_names(&fixture, &alice).await, vec![alpha.clone()]);
    let (status, body) = fixture.echo("alpha", &alice).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["content"][0]["text"], "hi", "{body}");
    let (status, body) = fixture.echo("beta", &alice).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::FORBIDDEN, "mcp_policy_denied"),
        "a tool outside the task: {body}"
    );

    // The second rule (email equals) gives team-b; the first matching rule
    // decides when both match.
    let bob = fixture
        .token(json!({"sub": "bob", "email": "bob@example.com"}))
        .await;
    assert_eq!(fixture.whoami(&bob).await["policy"], "team-b");
    assert_eq!(tool_names(&fixture, &bob).await, vec![beta.clone()]);
    let both = fixture
        .token(json!({"sub": "bob", "email": "bob@example.com", "groups": ["team-a"]}))
        .await;
    assert_eq!(fixture.whoami(&both).await["policy"], "team-a");
    // A string claim does not "equal" by containment.
    let near = fixture
        .token(json!({"sub": "eve", "email": "bob@example.com.evil"}))
        .await;

    // A valid token that matches no rule: 403, saying so, on every API.
    let nobody = fixture
        .token(json!({"sub": "carol", "groups": ["team-z"]}))
        .await;
    for token in [&nobody, &near] {
        let (status, body) = fixture.get("/v1/whoami", token).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::FORBIDDEN, "identity_no_matching_rule"),
            "{body}"
        );
        let (status, body) = fixture.echo("alpha", token).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::FORBIDDEN, "identity_no_matching_rule"),
            "{body}"
        );
        let (status, body) = fixture.get("/v1/mcp/tools", token).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    }

    // The static caller token keeps working beside the provider.
    let static_caller = fixture.whoami(CALLER).await;
    assert_eq!(static_caller["via"], "static", "{static_caller}");
    assert_eq!(static_caller["policy"], "default", "{static_caller}");
    assert!(
        static_caller["principal"]
            .as_str()
            .is_some_and(|principal| principal.starts_with("token:")),
        "{static_caller}"
    );
    assert_eq!(tool_names(&fixture, CALLER).await, {
        let mut all = vec![alpha, beta];
        all.sort();
        all
    });
    let (status, body) = fixture.echo("beta", CALLER).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    fixture.assert_no_token_logged().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_oidc_tokens_are_refused_saying_why() {
    let mut fixture = Fixture::start().await;
    let claims = json!({"sub": "alice", "groups": ["team-a"]});
    // A good token first: the worker holds the issuer's keys.
    let good = fixture.token(claims.clone()).await;
    assert_eq!(fixture.whoami(&good).await["via"], "oidc");

    // Expired beyond the clock skew (60 s by default).
    let expired = fixture
        .mint(json!({"claims": claims, "ttl_secs": -600}))
        .await;
    fixture.refused("expired", &expired, "expired").await;

    let wrong_audience = fixture
        .token(json!({"sub": "alice", "groups": ["team-a"], "aud": "another-service"}))
        .await;
    fixture
        .refused("wrong audience", &wrong_audience, "audience")
        .await;

    // Signed with the issuer's real key, claiming another issuer.
    let wrong_issuer = fixture
        .token(json!({"sub": "alice", "groups": ["team-a"], "iss": "http://127.0.0.1:1"}))
        .await;
    fixture
        .refused("wrong issuer", &wrong_issuer, "issuer")
        .await;

    let unsigned = fixture.mint(json!({"claims": claims, "alg": "none"})).await;
    assert!(unsigned.ends_with('.'), "an empty signature: {unsigned}");
    fixture.refused("alg none", &unsigned, "algorithm").await;

    let confused = fixture
        .mint(json!({"claims": claims, "alg": "HS256-with-public-key"}))
        .await;
    fixture
        .refused("HS256 keyed with the public key", &confused, "algorithm")
        .await;

    // The good token with its claims changed (groups → team-b), signature
    // kept.
    let mut parts: Vec<&str> = good.split('.').collect();
    let payload: Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).expect("base64url"))
            .expect("claims JSON");
    let mut tampered_claims = payload.clone();
    tampered_claims["sub"] = json!("mallory");
    let tampered_payload = URL_SAFE_NO_PAD.encode(tampered_claims.to_string());
    parts[1] = &tampered_payload;
    let tampered = parts.join(".");
    fixture
        .refused("bad signature", &tampered, "signature")
        .await;

    // Signed by a key the issuer never published.
    let unknown = fixture
        .mint(json!({"claims": claims, "kid": "never-published"}))
        .await;
    fixture
        .refused("unknown key", &unknown, "unknown key")
        .await;

    // Not a JWT, not a caller token.
    fixture.refused("garbage", "not-a-known-token", "").await;

    // None of them reached a tool either.
    for token in [
        &expired,
        &wrong_audience,
        &wrong_issuer,
        &unsigned,
        &confused,
    ] {
        let (status, body) = fixture.echo("alpha", token).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    }
    // The good token still works.
    let (status, body) = fixture.echo("alpha", &good).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    fixture.minted.push(tampered);
    fixture.assert_no_token_logged().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_key_is_picked_up_with_one_jwks_refetch() {
    let mut fixture = Fixture::start().await;
    let claims = json!({"sub": "alice", "groups": ["team-a"]});
    let before = fixture.token(claims.clone()).await;
    // Minted with the old key, first shown after the rotation.
    let old_unseen = fixture.token(claims.clone()).await;
    assert_eq!(fixture.whoami(&before).await["policy"], "team-a");
    let fetches = fixture.issuer.jwks_fetches().await;
    assert!(fetches >= 1, "the worker fetched the JWKS");

    let new_kid = fixture.issuer.rotate(true).await;
    let after = fixture.token(claims.clone()).await;
    let header: Value = serde_json::from_slice(
        &URL_SAFE_NO_PAD
            .decode(after.split('.').next().expect("header"))
            .expect("base64url"),
    )
    .expect("header JSON");
    assert_eq!(header["kid"], json!(new_kid));

    // The unknown kid makes the worker refetch the JWKS once, at once.
    let whoami = fixture.whoami(&after).await;
    assert_eq!(
        whoami,
        json!({"principal": fixture.issuer.principal("alice"), "policy": "team-a", "via": "oidc"})
    );
    assert_eq!(
        fixture.issuer.jwks_fetches().await,
        fetches + 1,
        "exactly one extra JWKS fetch"
    );
    let (status, body) = fixture.echo("alpha", &after).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // The old key left the JWKS: a token of it not seen before is refused,
    // and asking again does not refetch (rate limit).
    fixture
        .refused("a dropped key", &old_unseen, "unknown key")
        .await;
    assert_eq!(fixture.issuer.jwks_fetches().await, fetches + 1);

    fixture.assert_no_token_logged().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unknown_key_ids_does_not_hammer_the_issuer() {
    let mut fixture = Fixture::start().await;
    let claims = json!({"sub": "alice", "groups": ["team-a"]});
    let good = fixture.token(claims.clone()).await;
    assert_eq!(fixture.whoami(&good).await["via"], "oidc");
    let fetches = fixture.issuer.jwks_fetches().await;

    let mut flood = Vec::new();
    for at in 0..50 {
        flood.push(
            fixture
                .mint(json!({"claims": claims, "kid": format!("flood-{at}")}))
                .await,
        );
    }
    // All at once.
    let shared = &fixture;
    let answers = futures::future::join_all(
        flood
            .iter()
            .map(|token| async move { shared.get("/v1/whoami", token).await }),
    )
    .await;
    for (status, body) in &answers {
        assert_eq!(*status, StatusCode::UNAUTHORIZED, "{body}");
        assert_eq!(code(body), "unauthenticated", "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("unknown key"), "{body}");
    }
    let extra = fixture.issuer.jwks_fetches().await - fetches;
    assert!(
        extra <= 2,
        "50 unknown kids cost the issuer {extra} JWKS fetches"
    );
    // The known key still works meanwhile.
    let (status, body) = fixture.echo("alpha", &good).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    fixture.assert_no_token_logged().await;
}
