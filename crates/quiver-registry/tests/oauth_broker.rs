//! `OAuthBroker` in process against a real authorization server: the
//! testkit's OAuth server (`quiver_testkit::oauth_server`) on a loopback
//! port, the broker over a real SQLite store. The browser's part of a
//! consent (following the authorization URL, coming back to the callback)
//! is played by reqwest without following redirects. Fleet-wide and
//! per-user authorization-code grants, refreshes of a rejected token,
//! client credentials, and a server that fails a step, named in the error.
//! (`src/oauth/broker_tests.rs` covers what needs no authorization server:
//! refused consent links, per-principal links.)

use std::sync::Arc;
use std::time::Duration;

use quiver_mcp::credentials::{Renewal, token_fingerprint};
use quiver_registry::error::RegistryError;
use quiver_registry::oauth::broker::{
    Authorized, CallbackParams, ConnectOutcome, FlowCookie, Issued, IssuedToken, OAuthBroker,
};
use quiver_registry::oauth::seal::Keyring;
use quiver_registry::oauth::spec::{Grant, OAuthConnectionSpec};
use quiver_store::{SqlStore, Store};
use quiver_testkit::oauth_server::{Fault, OAuthServer, OAuthServerOptions, PreregisteredClient};

/// Where the broker says browsers reach the registry; nothing listens
/// there: the test brings the callback's query to the broker itself.
const PUBLIC_URL: &str = "http://127.0.0.1:9";
/// A pre-registered confidential client of the server.
const MACHINE: &str = "machine";
const MACHINE_SECRET: &str = "machine-secret";
/// How long any one step may take.
const BOUND: Duration = Duration::from_secs(20);

/// The authorization server on a loopback port, and a broker over a fresh
/// store; the server stops on drop.
struct Fixture {
    server: OAuthServer,
    base: String,
    broker: OAuthBroker,
    serving: tokio::task::AbortHandle,
    _dir: tempfile::TempDir,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.serving.abort();
    }
}

impl Fixture {
    async fn start(fault: Option<Fault>) -> Fixture {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("address"));
        let server = OAuthServer::new(
            &base,
            OAuthServerOptions {
                clients: vec![PreregisteredClient {
                    id: MACHINE.into(),
                    secret: MACHINE_SECRET.into(),
                }],
                fault,
                ..Default::default()
            },
        );
        let serving = tokio::spawn(server.clone().serve(listener)).abort_handle();
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("registry.db").display());
        let store: Arc<dyn Store> = Arc::new(SqlStore::open_sqlite(&url).await.expect("store"));
        let broker = OAuthBroker::new(
            store,
            Some(Keyring::ephemeral("test")),
            PUBLIC_URL,
            "replica-a".into(),
        );
        Fixture {
            server,
            base,
            broker,
            serving,
            _dir: dir,
        }
    }

    /// An authorization-code connection `name` to the server's MCP endpoint.
    async fn put(&self, name: &str, per_user: bool) {
        let spec = OAuthConnectionSpec {
            server_url: format!("{}/mcp", self.base),
            per_user,
            ..Default::default()
        };
        self.broker.put(name, spec, "admin").await.expect("put");
    }

    /// The browser's part of a consent the broker started: follows the
    /// authorization URL to the server, which approves at once; the query
    /// it is sent back to the callback with, and the flow's cookie.
    async fn browse(&self, started: ConnectOutcome) -> (CallbackParams, (String, String)) {
        let ConnectOutcome::Redirect { url, cookie } = started else {
            panic!("not a redirect: {started:?}");
        };
        assert!(url.starts_with(&self.base), "{url}");
        (self.redirected(&url).await, cookie_pair(&cookie))
    }

    /// The callback of a browser holding `cookie`, with `params`.
    async fn callback(
        &self,
        params: CallbackParams,
        (name, value): &(String, String),
    ) -> Result<Authorized, RegistryError> {
        tokio::time::timeout(
            BOUND,
            self.broker
                .callback(params, |asked| (asked == name).then(|| value.clone())),
        )
        .await
        .expect("callback in time")
    }

    /// A whole consent: [`Fixture::browse`], then [`Fixture::callback`].
    async fn consent(&self, started: ConnectOutcome) -> Authorized {
        let (params, cookie) = self.browse(started).await;
        self.callback(params, &cookie).await.expect("callback")
    }

    /// The query the server redirects the browser back with from `url`.
    async fn redirected(&self, url: &str) -> CallbackParams {
        let response = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client")
            .get(url)
            .send()
            .await
            .expect("GET authorization URL");
        assert!(response.status().is_redirection(), "{response:?}");
        let location = response.headers()["location"]
            .to_str()
            .expect("ascii location");
        assert!(
            location.starts_with(&format!("{PUBLIC_URL}/admin/oauth/callback?")),
            "{location}"
        );
        let query = url::Url::parse(location).expect("location URL");
        let value = |key: &str| {
            query
                .query_pairs()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.into_owned())
        };
        CallbackParams {
            code: value("code"),
            state: value("state"),
            iss: value("iss"),
            error: value("error"),
            error_description: value("error_description"),
        }
    }

    /// The connection's own current token.
    async fn token(&self, name: &str, renewal: Renewal<'_>) -> IssuedToken {
        tokio::time::timeout(BOUND, self.broker.access_token(name, renewal))
            .await
            .expect("token in time")
            .expect("token")
    }

    /// Whether the server takes `token` at its MCP endpoint.
    async fn accepted(&self, token: &IssuedToken) -> bool {
        let response = reqwest::Client::new()
            .post(format!("{}/mcp", self.base))
            .bearer_auth(&token.access_token)
            .header("accept", "application/json, text/event-stream")
            .json(&serde_json::json!({
                "jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                           "clientInfo": {"name": "test", "version": "1"}},
            }))
            .send()
            .await
            .expect("POST /mcp");
        response.status().is_success()
    }
}

/// The cookie's name and value, as a browser would send them back.
fn cookie_pair(cookie: &FlowCookie) -> (String, String) {
    let header = cookie.header_value();
    let pair = header.split(';').next().expect("name=value");
    let (name, value) = pair.split_once('=').expect("name=value");
    assert_eq!(name, FlowCookie::name_for(&cookie.connection));
    (name.to_owned(), value.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consent_grants_the_fleet_a_token_that_is_refreshed_once_rejected() {
    let fixture = Fixture::start(None).await;
    fixture.put("gh", false).await;
    let started = fixture
        .broker
        .connect("gh", "admin")
        .await
        .expect("connect");
    let authorized = fixture.consent(started).await;
    assert_eq!(
        authorized,
        Authorized {
            connection: "gh".into(),
            principal: None,
        }
    );
    assert_eq!(fixture.server.stats().authorization_code_grants, 1);
    assert_eq!(fixture.server.stats().registrations, 1);

    let first = fixture.token("gh", Renewal::Current).await;
    assert!(fixture.accepted(&first).await);
    assert!(!first.per_user);
    // Asked again: the same token, nothing refreshed.
    let again = fixture.token("gh", Renewal::Current).await;
    assert_eq!(again.access_token, first.access_token);
    assert_eq!(fixture.server.stats().refresh_grants, 0);

    // The server stops taking it: a worker reports it rejected, and gets
    // a refreshed token of the same grant, refreshed once however often
    // it is reported.
    fixture.server.expire_access_tokens();
    assert!(!fixture.accepted(&first).await);
    let rejected = token_fingerprint(&first.access_token);
    let renewed = fixture.token("gh", Renewal::Rejected(&rejected)).await;
    assert_ne!(renewed.access_token, first.access_token);
    assert_eq!(renewed.grant_id, first.grant_id);
    assert!(fixture.accepted(&renewed).await);
    let reported_again = fixture.token("gh", Renewal::Rejected(&rejected)).await;
    assert_eq!(reported_again.access_token, renewed.access_token);
    assert_eq!(fixture.server.stats().refresh_grants, 1);

    // A callback replayed finds no flow waiting.
    let started = fixture
        .broker
        .connect("gh", "admin")
        .await
        .expect("connect");
    let (params, cookie) = fixture.browse(started).await;
    let replay = CallbackParams {
        code: params.code.clone(),
        state: params.state.clone(),
        iss: params.iss.clone(),
        ..Default::default()
    };
    fixture
        .callback(params, &cookie)
        .await
        .expect("the first callback");
    let error = fixture
        .callback(replay, &cookie)
        .await
        .expect_err("a replayed callback");
    assert!(error.to_string().contains("state mismatch"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_principal_consents_for_its_own_grant() {
    let fixture = Fixture::start(None).await;
    fixture.put("docs", true).await;
    let issued = |principal: &'static str| {
        let broker = fixture.broker.clone();
        async move {
            tokio::time::timeout(
                BOUND,
                broker.access_token_for("docs", Some(principal), Renewal::Current, "worker"),
            )
            .await
            .expect("answered in time")
            .expect("answered")
        }
    };
    // Without a grant, alice gets a consent link; following it starts her
    // flow, and the consent stores her grant.
    let Issued::Consent(link) = issued("key:alice").await else {
        panic!("not a consent link");
    };
    let secret = link.url.rsplit('/').next().expect("secret").to_owned();
    let started = fixture.broker.follow_link(&secret).await.expect("link");
    let authorized = fixture.consent(started).await;
    assert_eq!(authorized.principal.as_deref(), Some("key:alice"));

    let Issued::Token(alice) = issued("key:alice").await else {
        panic!("alice has a grant now");
    };
    assert!(alice.per_user);
    assert!(fixture.accepted(&alice).await);
    // Bob has none yet, and the link alice used is spent.
    assert!(matches!(issued("key:bob").await, Issued::Consent(_)));
    assert!(fixture.broker.follow_link(&secret).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_credentials_connect_without_a_browser() {
    let fixture = Fixture::start(None).await;
    let spec = OAuthConnectionSpec {
        server_url: format!("{}/mcp", fixture.base),
        grant: Grant::ClientCredentials,
        client_id: Some(MACHINE.into()),
        client_secret: Some(MACHINE_SECRET.into()),
        ..Default::default()
    };
    fixture.broker.put("m2m", spec, "admin").await.expect("put");
    let connected = fixture
        .broker
        .connect("m2m", "admin")
        .await
        .expect("connect");
    assert!(
        matches!(connected, ConnectOutcome::Connected(_)),
        "{connected:?}"
    );
    let token = fixture.token("m2m", Renewal::Current).await;
    assert!(fixture.accepted(&token).await);
    assert_eq!(fixture.server.stats().client_credentials_grants, 1);
    assert_eq!(fixture.server.stats().authorization_code_grants, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_the_server_fails_is_named() {
    // Discovery: the server announces no PKCE, which the broker requires.
    let fixture = Fixture::start(Some(Fault::NoPkce)).await;
    fixture.put("gh", false).await;
    let error = fixture
        .broker
        .connect("gh", "admin")
        .await
        .expect_err("connect without PKCE");
    assert!(error.to_string().contains("oauth discovery"), "{error}");

    // The token endpoint: the code is refused in exchange.
    let fixture = Fixture::start(Some(Fault::TokenError)).await;
    fixture.put("gh", false).await;
    let started = fixture
        .broker
        .connect("gh", "admin")
        .await
        .expect("connect");
    let (params, cookie) = fixture.browse(started).await;
    let error = fixture
        .callback(params, &cookie)
        .await
        .expect_err("a refused exchange");
    assert!(
        error.to_string().contains("oauth token exchange"),
        "{error}"
    );
    // Nothing was stored: the connection has no token to hand out.
    assert!(
        fixture
            .broker
            .access_token("gh", Renewal::Current)
            .await
            .is_err()
    );
}
