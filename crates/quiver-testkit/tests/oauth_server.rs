//! The OAuth test server (`quiver_testkit::oauth_server`), in-process: its
//! endpoints driven by hand with reqwest, then the gateway's own OAuth client
//! (`quiver_mcp::oauth`, on rmcp's `auth` module) run against it, once
//! cleanly and once per injected fault.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use quiver_mcp::oauth::{Consent, OAuthClient, authorize};
use quiver_testkit::oauth_server::{
    Fault, OAuthServer, OAuthServerOptions, OAuthStats, PreregisteredClient,
};
use reqwest::StatusCode;
use rmcp::ServiceExt as _;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};
use sha2::Digest as _;

/// Upper bound for anything that should be quick.
const WAIT: Duration = Duration::from_secs(20);
const REDIRECT: &str = "http://127.0.0.1:1/callback";
const FORM: &str = "application/x-www-form-urlencoded";
const VERIFIER: &str = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";

/// The server on a free port; stopped on drop.
struct Running {
    server: OAuthServer,
    base: String,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Running {
    async fn start(options: OAuthServerOptions) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("address"));
        let server = OAuthServer::new(&base, options);
        let task = tokio::spawn(server.clone().serve(listener));
        Self { server, base, task }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn mcp(&self) -> String {
        self.url("/mcp")
    }

    async fn stats(&self) -> OAuthStats {
        let stats: OAuthStats = http()
            .get(self.url("/admin/stats"))
            .send()
            .await
            .expect("GET /admin/stats")
            .json()
            .await
            .expect("stats JSON");
        assert_eq!(stats, self.server.stats());
        stats
    }

    /// Registers a client dynamically; its id and secret.
    async fn register(&self, auth_method: &str) -> (String, Option<String>) {
        let response = http()
            .post(self.url("/register"))
            .json(&json!({
                "client_name": "test",
                "redirect_uris": [REDIRECT],
                "token_endpoint_auth_method": auth_method,
                "grant_types": ["authorization_code", "refresh_token"],
                "response_types": ["code"],
            }))
            .send()
            .await
            .expect("POST /register");
        assert_eq!(response.status(), StatusCode::CREATED);
        let body: Value = response.json().await.expect("registration JSON");
        assert_eq!(body["redirect_uris"], json!([REDIRECT]));
        let id = body["client_id"].as_str().expect("client_id").to_owned();
        let secret = body["client_secret"].as_str().map(str::to_owned);
        (id, secret)
    }

    /// `/authorize` with `extra` parameters on top of a valid request.
    async fn authorize_raw(&self, client_id: &str, extra: &[(&str, &str)]) -> reqwest::Response {
        let challenge = s256(VERIFIER);
        let mut params = vec![
            ("response_type", "code"),
            ("client_id", client_id),
            ("redirect_uri", REDIRECT),
            ("code_challenge", challenge.as_str()),
            ("code_challenge_method", "S256"),
            ("state", "st-1"),
            ("scope", "mcp:tools"),
        ];
        for (name, value) in extra {
            params.retain(|(existing, _)| existing != name);
            params.push((name, value));
        }
        http()
            .get(format!("{}?{}", self.url("/authorize"), encode(&params)))
            .send()
            .await
            .expect("GET /authorize")
    }

    /// A code for `client_id` (PKCE verifier [`VERIFIER`]).
    async fn code(&self, client_id: &str) -> String {
        let resource = self.mcp();
        let response = self
            .authorize_raw(client_id, &[("resource", resource.as_str())])
            .await;
        assert_eq!(response.status(), StatusCode::FOUND);
        let location = response.headers()[reqwest::header::LOCATION]
            .to_str()
            .expect("ascii Location");
        let url = url::Url::parse(location).expect("Location is a URL");
        assert!(location.starts_with(REDIRECT), "{location}");
        let param = |name: &str| {
            url.query_pairs()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.into_owned())
        };
        assert_eq!(param("state").as_deref(), Some("st-1"));
        assert_eq!(param("iss"), Some(self.base.clone()));
        param("code").expect("code")
    }

    async fn token(&self, form: &[(&str, &str)]) -> (StatusCode, Value) {
        let response = http()
            .post(self.url("/token"))
            .header(reqwest::header::CONTENT_TYPE, FORM)
            .body(encode(form))
            .send()
            .await
            .expect("POST /token");
        let status = response.status();
        (status, response.json().await.expect("token JSON"))
    }

    /// Tokens for a fresh public client: its id and the token response.
    async fn public_tokens(&self) -> (String, Value) {
        let (client_id, secret) = self.register("none").await;
        assert_eq!(secret, None);
        let code = self.code(&client_id).await;
        let (status, body) = self
            .token(&[
                ("grant_type", "authorization_code"),
                ("code", &code),
                ("code_verifier", VERIFIER),
                ("redirect_uri", REDIRECT),
                ("client_id", &client_id),
            ])
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        (client_id, body)
    }

    /// A raw JSON-RPC initialize to `/mcp` with `token`.
    async fn initialize(&self, token: Option<&str>) -> reqwest::Response {
        let mut request = http()
            .post(self.mcp())
            .header(
                reqwest::header::ACCEPT,
                "application/json, text/event-stream",
            )
            .json(&json!({
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "test", "version": "0"},
                },
            }));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send().await.expect("POST /mcp")
    }

    fn challenge(&self, invalid_token: bool) -> String {
        let mut challenge = format!(
            "Bearer resource_metadata=\"{}/.well-known/oauth-protected-resource/mcp\", scope=\"mcp:tools\"",
            self.base
        );
        if invalid_token {
            challenge.push_str(", error=\"invalid_token\"");
        }
        challenge
    }
}

/// A client that shows redirects instead of following them.
fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(WAIT)
        .build()
        .expect("reqwest client")
}

/// `application/x-www-form-urlencoded` (reqwest's `form` and `query` are
/// features the workspace does not enable).
fn encode(params: &[(&str, &str)]) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(params)
        .finish()
}

fn s256(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(verifier.as_bytes()))
}

fn www_authenticate(response: &reqwest::Response) -> &str {
    response.headers()[reqwest::header::WWW_AUTHENTICATE]
        .to_str()
        .expect("ascii challenge")
}

#[tokio::test]
async fn serves_metadata_documents() {
    let running = Running::start(OAuthServerOptions::default()).await;
    let base = &running.base;
    for path in [
        "/.well-known/oauth-authorization-server",
        "/.well-known/openid-configuration",
    ] {
        let metadata: Value = http()
            .get(running.url(path))
            .send()
            .await
            .expect("GET metadata")
            .json()
            .await
            .expect("metadata JSON");
        let mut expected = json!({
            "issuer": base,
            "authorization_endpoint": format!("{base}/authorize"),
            "token_endpoint": format!("{base}/token"),
            "registration_endpoint": format!("{base}/register"),
            "response_types_supported": ["code"],
            "grant_types_supported": ["authorization_code", "refresh_token", "client_credentials"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["none", "client_secret_post", "client_secret_basic"],
            "scopes_supported": ["mcp:tools", "mcp:admin"],
            "client_id_metadata_document_supported": false,
        });
        // OpenID discovery adds the issuer's keys (`oidc_issuer`).
        if path == "/.well-known/openid-configuration" {
            expected["jwks_uri"] = json!(format!("{base}/jwks"));
            expected["id_token_signing_alg_values_supported"] = json!(["ES256", "RS256"]);
            expected["subject_types_supported"] = json!(["public"]);
            expected["scopes_supported"] = json!(["mcp:tools", "mcp:admin", "openid"]);
        }
        assert_eq!(metadata, expected, "{path}");
    }
    for path in [
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
    ] {
        let metadata: Value = http()
            .get(running.url(path))
            .send()
            .await
            .expect("GET resource metadata")
            .json()
            .await
            .expect("metadata JSON");
        assert_eq!(
            metadata,
            json!({
                "resource": format!("{base}/mcp"),
                "authorization_servers": [base],
                "scopes_supported": ["mcp:tools"],
                "bearer_methods_supported": ["header"],
            }),
            "{path}"
        );
    }
}

#[tokio::test]
async fn code_flow_grants_access_to_mcp() {
    let running = Running::start(OAuthServerOptions::default()).await;
    let (_, tokens) = running.public_tokens().await;
    assert_eq!(tokens["token_type"], "Bearer");
    assert_eq!(tokens["expires_in"], 3600);
    assert_eq!(tokens["scope"], "mcp:tools");
    assert!(tokens["refresh_token"].is_string(), "{tokens}");
    let access = tokens["access_token"].as_str().expect("access_token");

    let response = running.initialize(Some(access)).await;
    assert_eq!(response.status(), StatusCode::OK);

    let response = running.initialize(None).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(www_authenticate(&response), running.challenge(false));

    let response = running.initialize(Some("not-a-token")).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(www_authenticate(&response), running.challenge(true));

    let stats = running.stats().await;
    assert_eq!(stats.registrations, 1);
    assert_eq!(stats.authorization_code_grants, 1);
    assert_eq!(stats.authorized_mcp_requests, 1);
    assert_eq!(stats.rejected_mcp_requests, 2);
}

#[tokio::test]
async fn codes_need_the_verifier_and_work_once() {
    let running = Running::start(OAuthServerOptions::default()).await;
    let (client_id, _) = running.register("none").await;
    let code = running.code(&client_id).await;
    let exchange = |code: String, verifier: &'static str| {
        let client_id = client_id.clone();
        let running = &running;
        async move {
            running
                .token(&[
                    ("grant_type", "authorization_code"),
                    ("code", &code),
                    ("code_verifier", verifier),
                    ("redirect_uri", REDIRECT),
                    ("client_id", &client_id),
                ])
                .await
        }
    };
    let wrong = "wrong-verifier-wrong-verifier-wrong-verifier-0";
    let (status, body) = exchange(code.clone(), wrong).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"], "invalid_grant");
    // The failed attempt spent the code.
    let (status, body) = exchange(code, VERIFIER).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"], "invalid_grant");

    let code = running.code(&client_id).await;
    let (status, _) = exchange(code.clone(), VERIFIER).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = exchange(code, VERIFIER).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"], "invalid_grant");
    assert_eq!(running.stats().await.authorization_code_grants, 1);
}

#[tokio::test]
async fn authorize_refuses_bad_requests() {
    let running = Running::start(OAuthServerOptions {
        clients: vec![PreregisteredClient {
            id: "pre".into(),
            secret: "s3cret".into(),
        }],
        ..Default::default()
    })
    .await;
    let (client_id, _) = running.register("none").await;
    let cases: [(&str, &[(&str, &str)]); 6] = [
        ("unknown client", &[("client_id", "nobody")]),
        (
            "unregistered redirect",
            &[("redirect_uri", "http://127.0.0.1:1/other")],
        ),
        ("no challenge", &[("code_challenge", "")]),
        ("plain method", &[("code_challenge_method", "plain")]),
        ("other resource", &[("resource", "http://example.com/mcp")]),
        ("token response type", &[("response_type", "token")]),
    ];
    for (what, extra) in cases {
        let response = running.authorize_raw(&client_id, extra).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{what}");
        let body: Value = response.json().await.expect("error JSON");
        assert!(body["error"].is_string(), "{what}: {body}");
        assert!(body["error_description"].is_string(), "{what}: {body}");
    }
    // A pre-registered client may use any loopback redirect, and nothing else.
    let response = running
        .authorize_raw("pre", &[("redirect_uri", "http://localhost:9/cb")])
        .await;
    assert_eq!(response.status(), StatusCode::FOUND);
    let response = running
        .authorize_raw("pre", &[("redirect_uri", "https://example.com/cb")])
        .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    // Malformed input is a 400 JSON error, not a panic.
    let response = http()
        .get(running.url("/authorize?client_id=a&client_id=b"))
        .send()
        .await
        .expect("GET /authorize");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let response = http()
        .post(running.url("/register"))
        .body("{\"redirect_uris\": 5")
        .send()
        .await
        .expect("POST /register");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn refresh_tokens_rotate() {
    let running = Running::start(OAuthServerOptions::default()).await;
    let (client_id, tokens) = running.public_tokens().await;
    let first = tokens["refresh_token"].as_str().expect("refresh_token");
    let refresh = |token: String| {
        let client_id = client_id.clone();
        let running = &running;
        async move {
            running
                .token(&[
                    ("grant_type", "refresh_token"),
                    ("refresh_token", &token),
                    ("client_id", &client_id),
                ])
                .await
        }
    };
    let (status, body) = refresh(first.to_owned()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let second = body["refresh_token"].as_str().expect("rotated").to_owned();
    assert_ne!(second, first);
    let access = body["access_token"].as_str().expect("access_token");
    assert_eq!(
        running.initialize(Some(access)).await.status(),
        StatusCode::OK
    );

    let (status, body) = refresh(first.to_owned()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"], "invalid_grant");

    running.server.revoke_refresh_tokens();
    let (status, body) = refresh(second).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"], "invalid_grant");

    let stats = running.stats().await;
    assert_eq!(stats.refresh_grants, 1);
    assert_eq!(stats.refresh_failures, 2);
}

#[tokio::test]
async fn client_credentials_for_confidential_clients() {
    let running = Running::start(OAuthServerOptions {
        clients: vec!["pre:s3:cret".parse().expect("ID:SECRET")],
        ..Default::default()
    })
    .await;
    // HTTP Basic.
    let response = http()
        .post(running.url("/token"))
        .basic_auth("pre", Some("s3%3Acret"))
        .header(reqwest::header::CONTENT_TYPE, FORM)
        .body(encode(&[("grant_type", "client_credentials")]))
        .send()
        .await
        .expect("POST /token");
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.expect("token JSON");
    assert_eq!(body["token_type"], "Bearer");
    assert!(body.get("refresh_token").is_none(), "{body}");
    let access = body["access_token"].as_str().expect("access_token");
    assert_eq!(
        running.initialize(Some(access)).await.status(),
        StatusCode::OK
    );
    // client_secret_post, and a wrong secret.
    let (status, _) = running
        .token(&[
            ("grant_type", "client_credentials"),
            ("client_id", "pre"),
            ("client_secret", "s3:cret"),
        ])
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = running
        .token(&[
            ("grant_type", "client_credentials"),
            ("client_id", "pre"),
            ("client_secret", "wrong"),
        ])
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"], "invalid_client");
    // A public client may not.
    let (client_id, _) = running.register("none").await;
    let (status, body) = running
        .token(&[
            ("grant_type", "client_credentials"),
            ("client_id", &client_id),
        ])
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"], "unauthorized_client");
    // A dynamically registered confidential client may.
    let (client_id, secret) = running.register("client_secret_post").await;
    let secret = secret.expect("client_secret");
    let (status, _) = running
        .token(&[
            ("grant_type", "client_credentials"),
            ("client_id", &client_id),
            ("client_secret", &secret),
        ])
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(running.stats().await.client_credentials_grants, 3);
}

#[tokio::test]
async fn admin_expires_tokens_and_sets_their_lifetime() {
    let running = Running::start(OAuthServerOptions::default()).await;
    let (_, tokens) = running.public_tokens().await;
    let access = tokens["access_token"].as_str().expect("access_token");
    assert_eq!(
        running.initialize(Some(access)).await.status(),
        StatusCode::OK
    );
    let response = http()
        .post(running.url("/admin/expire-access-tokens"))
        .send()
        .await
        .expect("POST /admin/expire-access-tokens");
    assert_eq!(response.status(), StatusCode::OK);
    let response = running.initialize(Some(access)).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(www_authenticate(&response), running.challenge(true));

    let response = http()
        .post(running.url("/admin/config"))
        .json(&json!({"access_ttl_secs": 7}))
        .send()
        .await
        .expect("POST /admin/config");
    assert_eq!(response.status(), StatusCode::OK);
    let (_, tokens) = running.public_tokens().await;
    assert_eq!(tokens["expires_in"], 7);
    let response = http()
        .post(running.url("/admin/config"))
        .json(&json!({"access_ttl": 7}))
        .send()
        .await
        .expect("POST /admin/config");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
}

/// The gateway's OAuth client against the server.
async fn authorize_with_quiver(
    running: &Running,
) -> Result<rmcp::transport::AuthClient<reqwest::Client>, quiver_mcp::oauth::OAuthError> {
    let client = OAuthClient {
        redirect_uri: REDIRECT.into(),
        ..Default::default()
    };
    tokio::time::timeout(
        WAIT,
        authorize(&running.mcp(), None, &client, Consent::Automatic, http()),
    )
    .await
    .expect("authorization timed out")
}

#[tokio::test]
async fn quiver_oauth_client_authorizes_and_refreshes() {
    let running = Running::start(OAuthServerOptions::default()).await;
    let authorized = authorize_with_quiver(&running)
        .await
        .expect("quiver_mcp::oauth::authorize");
    let transport = StreamableHttpClientTransport::with_client(
        authorized,
        StreamableHttpClientTransportConfig::with_uri(running.mcp()),
    );
    let client = tokio::time::timeout(WAIT, ().serve(transport))
        .await
        .expect("initialize timed out")
        .expect("initialize (authorized)");
    let tools = tokio::time::timeout(WAIT, client.list_tools(None))
        .await
        .expect("tools/list timed out")
        .expect("tools/list");
    let mut names: Vec<_> = tools
        .tools
        .iter()
        .map(|tool| tool.name.to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["admin_echo", "echo", "whoami", "whoami_user"]);

    let call = |name: &str, args: Value| {
        let Value::Object(args) = args else {
            panic!("arguments must be an object");
        };
        let request = CallToolRequestParams::new(name.to_owned()).with_arguments(args);
        let peer = client.peer().clone();
        async move {
            let result = tokio::time::timeout(WAIT, peer.call_tool(request))
                .await
                .expect("tools/call timed out")
                .expect("tools/call");
            result.content[0].as_text().expect("text").text.clone()
        }
    };
    let who = call("whoami", json!({})).await;
    assert!(who.starts_with("client-"), "{who}");
    assert_eq!(call("echo", json!({"text": "hi"})).await, "hi");

    // An expired token: rmcp refreshes once on the 401 and retries.
    running.server.expire_access_tokens();
    assert_eq!(call("whoami", json!({})).await, who);
    let stats = running.stats().await;
    assert_eq!(stats.registrations, 1);
    assert_eq!(stats.authorization_code_grants, 1);
    assert_eq!(stats.refresh_grants, 1);
    assert!(stats.rejected_mcp_requests >= 1, "{stats:?}");
    let _ = client.cancel().await;
}

#[tokio::test]
async fn quiver_oauth_client_notices_faults() {
    // `no-pkce`: rmcp 3.11 alone would go on (sending S256 anyway) when the
    // metadata omits `code_challenge_methods_supported`; the MCP
    // authorization spec says a client must refuse, and quiver's does
    // (`quiver_mcp::oauth::require_pkce`).
    for fault in [
        Fault::BadMetadata,
        Fault::WrongIssuer,
        Fault::NoPkce,
        Fault::TokenError,
        Fault::StateMismatch,
    ] {
        let running = Running::start(OAuthServerOptions {
            fault: Some(fault),
            ..Default::default()
        })
        .await;
        let result = authorize_with_quiver(&running).await;
        let err = result
            .err()
            .unwrap_or_else(|| panic!("{fault}: authorized anyway"));
        let expected_step = match fault {
            Fault::BadMetadata | Fault::WrongIssuer | Fault::NoPkce => "discovery",
            _ => "exchange",
        };
        assert!(err.to_string().contains(expected_step), "{fault}: {err}");
        let stats = running.stats().await;
        assert_eq!(stats.authorization_code_grants, 0, "{fault}");
    }
}

#[tokio::test]
async fn faulty_metadata() {
    let metadata = |fault: Fault| async move {
        let running = Running::start(OAuthServerOptions {
            fault: Some(fault),
            ..Default::default()
        })
        .await;
        let body = http()
            .get(running.url("/.well-known/oauth-authorization-server"))
            .send()
            .await
            .expect("GET metadata")
            .text()
            .await
            .expect("metadata body");
        (running.base.clone(), body)
    };
    let (_, body) = metadata(Fault::BadMetadata).await;
    assert_eq!(body, "{\"issuer\": 42");
    let (base, body) = metadata(Fault::WrongIssuer).await;
    let body: Value = serde_json::from_str(&body).expect("metadata JSON");
    assert_eq!(body["issuer"], "http://issuer.invalid");
    assert_eq!(body["token_endpoint"], format!("{base}/token"));
    let (_, body) = metadata(Fault::NoPkce).await;
    let body: Value = serde_json::from_str(&body).expect("metadata JSON");
    assert!(
        body.get("code_challenge_methods_supported").is_none(),
        "{body}"
    );
    assert!(body.get("issuer").is_some(), "{body}");
}
