//! An OAuth 2.1 authorization server and the MCP server it protects, served
//! together on one port, for end-to-end tests of OAuth clients (Quiver's
//! `quiver_mcp::oauth`, rmcp's `auth` module).
//!
//! The authorization server (issuer: the base URL `B`) publishes RFC 8414
//! metadata, registers clients dynamically (RFC 7591), checks authorization
//! requests (PKCE S256 required, RFC 8707 `resource` checked) and grants
//! `authorization_code`, `refresh_token` (rotating) and `client_credentials`.
//! The protected resource is MCP over streamable HTTP at `B/mcp`, with RFC
//! 9728 metadata; every request to it needs a live bearer token, and a call
//! of `admin_echo` one with scope `mcp:admin` (else 403 `insufficient_scope`,
//! for step-up). `/admin/*` lets a test read counters and the tokens issued,
//! expire or revoke tokens and change the access-token lifetime, and a
//! [`Fault`] makes one step misbehave so callers' error handling can be
//! tested.
//!
//! Every code and token belongs to a [`User`], so tests can tell one
//! person's grant from another's: a refreshed token keeps its user, and a
//! `client_credentials` token's user is its client id. By default
//! `/authorize` approves at once, for the server's auto user
//! ([`DEFAULT_AUTO_USER`] until `POST /admin/auto-user` `{"user": "bob"}`
//! names another). With [`OAuthServerOptions::consent_page`] it answers an
//! HTML form instead (a text input `user`, button `approve`); posting it back
//! to `/authorize` issues the code for the user typed in. The MCP tool
//! `whoami` returns the calling token's client id and `whoami_user` its
//! user; `GET /admin/tokens` maps each token to its user and `/admin/stats`
//! counts refresh grants per user, so a test can show that one person's
//! token was refreshed once however many gateways shared it.
//!
//! The same issuer is also a test OpenID Connect provider
//! ([`crate::oidc_issuer`]): `/.well-known/openid-configuration` adds
//! `jwks_uri` (`B/jwks`, ES256 and RS256 keys), `POST /admin/oidc/mint`
//! signs JWTs with any claims (expired, unsigned `alg: none`, HS256 keyed
//! with the public key, or under a `kid` the JWKS does not list), `POST
//! /admin/oidc/rotate` rotates the keys, and `/admin/stats` counts JWKS and
//! discovery fetches, for tests of JWT verifiers such as the worker's OIDC
//! callers. It signs people in, too: a code granted for scope `openid` (with
//! an optional `nonce`) is exchanged for an `id_token` as well, carrying the
//! claims `POST /admin/oidc/person` set, and `POST /admin/clients`
//! registers a public client under a client id the test chooses.
//!
//! Everything lives in memory behind one mutex, each table capped at
//! [`MAX_ENTRIES`]; `quiver-testkit-oauth` serves it as a process.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, RawQuery, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ServerHandler, tool, tool_handler, tool_router};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use url::Url;

use crate::oidc_issuer::{OPENID_SCOPE, OidcIssuer};

/// The one scope the server knows and grants by default.
pub const SCOPE: &str = "mcp:tools";

/// The scope the `admin_echo` tool needs beyond [`SCOPE`]: a token without
/// it gets 403 `insufficient_scope` (step-up). The protected resource's
/// metadata does not list it, so clients only ask for it when challenged.
pub const ADMIN_SCOPE: &str = "mcp:admin";

/// The tool that needs [`ADMIN_SCOPE`].
pub const ADMIN_TOOL: &str = "admin_echo";
/// Most clients, pending codes, consent requests, access tokens and refresh
/// tokens held (each); beyond it registrations and grants are refused with
/// 503.
pub const MAX_ENTRIES: usize = 10_000;
/// Default lifetime of access tokens.
pub const DEFAULT_ACCESS_TTL: Duration = Duration::from_secs(3600);
/// Longest access-token lifetime accepted (longer ones are cut to it), so an
/// expiry instant can never overflow.
pub const MAX_ACCESS_TTL: Duration = Duration::from_secs(366 * 24 * 3600);
/// How long an authorization code can be exchanged.
const CODE_TTL: Duration = Duration::from_secs(60);
/// How long a consent page can be answered: longer than a code lives, as a
/// person (or a slow browser test) fills it in.
const CONSENT_TTL: Duration = Duration::from_secs(600);
/// The user `/authorize` approves for until `POST /admin/auto-user` names
/// another.
pub const DEFAULT_AUTO_USER: &str = "auto";
/// Longest user name, in characters.
pub const MAX_USER_LEN: usize = 64;
/// Largest request body of the authorization server's endpoints.
const MAX_BODY_BYTES: usize = 64 * 1024;
/// Most redirect URIs one dynamic registration may carry, and their length.
const MAX_REDIRECT_URIS: usize = 16;
const MAX_URI_LEN: usize = 2048;
/// Longest `nonce` an authorization request may carry, and `client_id`
/// `POST /admin/clients` may choose.
const MAX_NONCE_LEN: usize = 512;
const MAX_CLIENT_ID_LEN: usize = 256;
/// The issuer the `wrong-issuer` fault announces.
const WRONG_ISSUER: &str = "http://issuer.invalid";

/// One step at which the server misbehaves on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The authorization server metadata is malformed JSON.
    BadMetadata,
    /// The metadata names another issuer (`http://issuer.invalid`).
    WrongIssuer,
    /// The metadata omits `code_challenge_methods_supported`.
    NoPkce,
    /// `/token` always answers 401 `invalid_client`.
    TokenError,
    /// `/authorize` redirects with a `state` other than the client's.
    StateMismatch,
}

impl Fault {
    /// Every fault, in the order of their names in [`Fault::name`].
    pub const ALL: [Fault; 5] = [
        Fault::BadMetadata,
        Fault::WrongIssuer,
        Fault::NoPkce,
        Fault::TokenError,
        Fault::StateMismatch,
    ];

    /// The fault's flag value (`--fault NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Fault::BadMetadata => "bad-metadata",
            Fault::WrongIssuer => "wrong-issuer",
            Fault::NoPkce => "no-pkce",
            Fault::TokenError => "token-error",
            Fault::StateMismatch => "state-mismatch",
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Fault {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Fault::ALL
            .into_iter()
            .find(|fault| fault.name() == name)
            .ok_or_else(|| {
                let names: Vec<_> = Fault::ALL.iter().map(|fault| fault.name()).collect();
                format!(
                    "unknown fault {name:?}, expected one of {}",
                    names.join(", ")
                )
            })
    }
}

/// The user a code or token was granted for: a name chosen at `/authorize`
/// (1 to [`MAX_USER_LEN`] characters, no control characters), or the client
/// id of a `client_credentials` token.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct User(String);

/// A user name that is empty, longer than [`MAX_USER_LEN`] characters or has
/// control characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("user must be 1 to {MAX_USER_LEN} characters without control characters")]
pub struct InvalidUser;

impl User {
    /// A user named `name`.
    pub fn new(name: impl Into<String>) -> Result<Self, InvalidUser> {
        let name = name.into();
        let length = name.chars().count();
        if length == 0 || length > MAX_USER_LEN || name.chars().any(char::is_control) {
            return Err(InvalidUser);
        }
        Ok(Self(name))
    }

    /// The user of `client_credentials` tokens: the client itself, whatever
    /// its id looks like.
    fn client(client_id: &str) -> Self {
        Self(client_id.to_owned())
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for User {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for User {
    type Err = InvalidUser;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::new(name)
    }
}

/// A confidential client known before the server starts; it may redirect to
/// any URI on a loopback host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreregisteredClient {
    /// Its client id.
    pub id: String,
    /// Its client secret.
    pub secret: String,
}

impl FromStr for PreregisteredClient {
    type Err = String;

    /// Parses `ID:SECRET` (the secret may contain colons).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.split_once(':') {
            Some((id, secret)) if !id.is_empty() && !secret.is_empty() => Ok(Self {
                id: id.to_owned(),
                secret: secret.to_owned(),
            }),
            _ => Err(format!("expected ID:SECRET, got {text:?}")),
        }
    }
}

/// How the server starts.
#[derive(Debug, Clone)]
pub struct OAuthServerOptions {
    /// Confidential clients registered from the start.
    pub clients: Vec<PreregisteredClient>,
    /// Lifetime of access tokens issued (cut to [`MAX_ACCESS_TTL`]);
    /// `/admin/config` changes it at run time.
    pub access_ttl: Duration,
    /// The step to misbehave at, if any.
    pub fault: Option<Fault>,
    /// `GET /authorize` answers a consent page asking for the user (posted
    /// back to `/authorize`) instead of approving at once for the auto user.
    pub consent_page: bool,
}

impl Default for OAuthServerOptions {
    fn default() -> Self {
        Self {
            clients: Vec::new(),
            access_ttl: DEFAULT_ACCESS_TTL,
            fault: None,
            consent_page: false,
        }
    }
}

/// Counters of what the server did, as `GET /admin/stats` reports them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OAuthStats {
    /// Codes exchanged for tokens.
    pub authorization_code_grants: u64,
    /// Refresh tokens exchanged (and rotated).
    pub refresh_grants: u64,
    /// Refresh attempts refused: unknown, used, revoked or another client's.
    pub refresh_failures: u64,
    /// Client-credentials grants.
    pub client_credentials_grants: u64,
    /// Dynamic client registrations.
    pub registrations: u64,
    /// Requests to `/mcp` let through.
    pub authorized_mcp_requests: u64,
    /// Requests to `/mcp` refused with 401.
    pub rejected_mcp_requests: u64,
    /// `GET /jwks` answered (the OIDC issuer, [`crate::oidc_issuer`]).
    pub jwks_fetches: u64,
    /// `GET /.well-known/openid-configuration` answered.
    pub discovery_fetches: u64,
    /// `id_token`s issued with the tokens of `openid` codes.
    pub id_tokens_issued: u64,
    /// [`OAuthStats::refresh_grants`] by the user of the token refreshed (for
    /// the first [`MAX_ENTRIES`] users), so a test can show that one
    /// person's token was refreshed once however many clients shared it.
    #[serde(default)]
    pub refresh_grants_by_user: BTreeMap<String, u64>,
}

/// The server; clones share their state.
#[derive(Clone)]
pub struct OAuthServer {
    shared: Arc<Shared>,
}

struct Shared {
    /// The base URL, without a trailing slash.
    issuer: String,
    /// `issuer` + `/mcp`.
    resource: String,
    fault: Option<Fault>,
    /// [`OAuthServerOptions::consent_page`].
    consent_page: bool,
    store: Mutex<Store>,
    /// The OpenID Connect side: signing keys, JWKS, minted JWTs.
    oidc: Arc<OidcIssuer>,
}

struct Client {
    /// `None`: a public client.
    secret: Option<String>,
    /// `None`: any URI on a loopback host (pre-registered clients).
    redirect_uris: Option<Vec<String>>,
}

/// Whom a code or token is for: the client it was issued to and the user who
/// granted it. The bearer check puts the caller's into the extensions of each
/// `/mcp` request it lets through (rmcp hands the request's `Parts` to
/// tools).
#[derive(Debug, Clone)]
struct OAuthCaller {
    client_id: String,
    user: User,
}

/// An authorization request `/authorize` checked; only [`grant_code`] turns
/// it into a code, for a user.
struct AuthorizationRequest {
    client_id: String,
    redirect_uri: String,
    challenge: String,
    scope: String,
    /// The request's `nonce`, for the `id_token`.
    nonce: Option<String>,
    /// The request's `state`, sent back with the code.
    state: Option<String>,
}

/// An authorization request waiting on its consent page.
struct PendingConsent {
    request: AuthorizationRequest,
    expires: Instant,
}

struct PendingCode {
    caller: OAuthCaller,
    redirect_uri: String,
    challenge: String,
    scope: String,
    /// The authorization request's `nonce`, for the `id_token`.
    nonce: Option<String>,
    expires: Instant,
}

struct AccessToken {
    caller: OAuthCaller,
    scope: String,
    expires: Instant,
}

struct RefreshToken {
    caller: OAuthCaller,
    scope: String,
}

/// The two kinds of token `GET /admin/tokens` lists.
#[derive(Clone, Copy, PartialEq, Eq)]
enum TokenKind {
    Access,
    Refresh,
}

/// A token as `GET /admin/tokens` remembers it.
struct IssuedToken {
    kind: TokenKind,
    token: String,
    user: User,
}

struct Store {
    clients: HashMap<String, Client>,
    /// Authorization requests shown a consent page, by the id the page posts
    /// back.
    consents: HashMap<String, PendingConsent>,
    codes: HashMap<String, PendingCode>,
    access: HashMap<String, AccessToken>,
    refresh: HashMap<String, RefreshToken>,
    access_ttl: Duration,
    /// The user `/authorize` approves for without a consent page.
    auto_user: User,
    stats: OAuthStats,
    /// Every token issued (the newest [`MAX_ENTRIES`]), so a test can look
    /// for them where they must not appear (`GET /admin/tokens`).
    issued: VecDeque<IssuedToken>,
}

impl OAuthServer {
    /// A server whose issuer is `base_url` (e.g. `http://127.0.0.1:8080`; a
    /// trailing slash is dropped): the URL it is reached at.
    pub fn new(base_url: &str, options: OAuthServerOptions) -> Self {
        let issuer = base_url.trim_end_matches('/').to_owned();
        let clients = options
            .clients
            .into_iter()
            .map(|client| {
                (
                    client.id,
                    Client {
                        secret: Some(client.secret),
                        redirect_uris: None,
                    },
                )
            })
            .collect();
        Self {
            shared: Arc::new(Shared {
                resource: format!("{issuer}/mcp"),
                oidc: Arc::new(OidcIssuer::new(&issuer)),
                issuer,
                fault: options.fault,
                consent_page: options.consent_page,
                store: Mutex::new(Store {
                    clients,
                    consents: HashMap::new(),
                    codes: HashMap::new(),
                    access: HashMap::new(),
                    refresh: HashMap::new(),
                    issued: VecDeque::new(),
                    access_ttl: options.access_ttl.min(MAX_ACCESS_TTL),
                    auto_user: User(DEFAULT_AUTO_USER.to_owned()),
                    stats: OAuthStats::default(),
                }),
            }),
        }
    }

    /// The issuer (the base URL).
    pub fn issuer(&self) -> &str {
        &self.shared.issuer
    }

    /// The protected resource: the MCP endpoint's URL.
    pub fn resource_url(&self) -> &str {
        &self.shared.resource
    }

    /// The counters so far.
    pub fn stats(&self) -> OAuthStats {
        self.shared.stats()
    }

    /// The OpenID Connect issuer served alongside (same issuer URL).
    pub fn oidc(&self) -> &Arc<OidcIssuer> {
        &self.shared.oidc
    }

    /// Treats every access token issued so far as expired.
    pub fn expire_access_tokens(&self) {
        self.shared.expire_access_tokens();
    }

    /// Revokes every refresh token issued so far.
    pub fn revoke_refresh_tokens(&self) {
        self.shared.store().refresh.clear();
    }

    /// Sets the lifetime of access tokens issued from now on (cut to
    /// [`MAX_ACCESS_TTL`]).
    pub fn set_access_ttl(&self, ttl: Duration) {
        self.shared.store().access_ttl = ttl.min(MAX_ACCESS_TTL);
    }

    /// Sets the user `/authorize` approves for from now on without a consent
    /// page (`POST /admin/auto-user`).
    pub fn set_auto_user(&self, user: User) {
        self.shared.store().auto_user = user;
    }

    /// All endpoints: authorization server, `/mcp` behind the bearer check,
    /// the metadata documents and `/admin/*`.
    pub fn router(&self) -> Router {
        let server = OAuthMcpServer::new();
        let mcp: StreamableHttpService<OAuthMcpServer, LocalSessionManager> =
            StreamableHttpService::new(
                move || Ok(server.clone()),
                Arc::new(LocalSessionManager::default()),
                StreamableHttpServerConfig::default(),
            );
        let protected =
            Router::new()
                .nest_service("/mcp", mcp)
                .layer(axum::middleware::from_fn_with_state(
                    self.shared.clone(),
                    require_bearer,
                ));
        Router::new()
            .route(
                "/.well-known/oauth-authorization-server",
                get(authorization_server_metadata),
            )
            .route(
                "/.well-known/openid-configuration",
                get(openid_configuration),
            )
            .route(
                "/.well-known/oauth-protected-resource",
                get(protected_resource_metadata),
            )
            .route(
                "/.well-known/oauth-protected-resource/mcp",
                get(protected_resource_metadata),
            )
            .route("/register", post(register))
            .route("/authorize", get(authorize).post(approve))
            .route("/token", post(token))
            .route("/admin/stats", get(admin_stats))
            .route("/admin/tokens", get(admin_tokens))
            .route("/admin/expire-access-tokens", post(admin_expire))
            .route("/admin/revoke-refresh-tokens", post(admin_revoke))
            .route("/admin/config", post(admin_config))
            .route("/admin/auto-user", post(admin_auto_user))
            .route("/admin/clients", post(admin_clients))
            .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
            .with_state(self.shared.clone())
            .merge(self.shared.oidc.router())
            .merge(protected)
    }

    /// Serves [`OAuthServer::router`] on `listener` until the process ends.
    pub async fn serve(self, listener: tokio::net::TcpListener) -> anyhow::Result<()> {
        axum::serve(listener, self.router())
            .await
            .context("serving the oauth test server")
    }
}

/// Serves a server on `listener` whose issuer is `http://` + its local
/// address, until the process ends.
pub async fn serve(
    listener: tokio::net::TcpListener,
    options: OAuthServerOptions,
) -> anyhow::Result<()> {
    let addr = listener.local_addr().context("the listener's address")?;
    OAuthServer::new(&format!("http://{addr}"), options)
        .serve(listener)
        .await
}

impl Shared {
    /// The counters, the OIDC issuer's included.
    fn stats(&self) -> OAuthStats {
        let mut stats = self.store().stats.clone();
        let oidc = self.oidc.stats();
        stats.jwks_fetches = oidc.jwks_fetches;
        stats.discovery_fetches = oidc.discovery_fetches;
        stats.id_tokens_issued = oidc.id_tokens_issued;
        stats
    }

    /// The store; a handler that panicked cannot leave it half-written in a
    /// way that matters to tests, so poisoning is ignored.
    fn store(&self) -> MutexGuard<'_, Store> {
        self.store
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn expire_access_tokens(&self) {
        let now = Instant::now();
        for token in self.store().access.values_mut() {
            token.expires = token.expires.min(now);
        }
    }

    /// The `WWW-Authenticate` challenge of a 401 from `/mcp`.
    fn challenge(&self, invalid_token: bool) -> String {
        let mut challenge = format!(
            "Bearer resource_metadata=\"{}/.well-known/oauth-protected-resource/mcp\", scope=\"{SCOPE}\"",
            self.issuer
        );
        if invalid_token {
            challenge.push_str(", error=\"invalid_token\"");
        }
        challenge
    }
}

impl Store {
    /// Drops what has expired from the table that is full, then says whether
    /// one more entry fits.
    fn make_room_for_access(&mut self, now: Instant) -> Result<(), OAuthFailure> {
        if self.access.len() >= MAX_ENTRIES {
            self.access.retain(|_, token| token.expires > now);
        }
        if self.access.len() >= MAX_ENTRIES {
            return Err(full("access tokens"));
        }
        Ok(())
    }

    /// Issues an access token (and a refresh token when `refresh`) to
    /// `caller`; the token response.
    fn issue(
        &mut self,
        caller: &OAuthCaller,
        scope: &str,
        refresh: bool,
        now: Instant,
    ) -> Result<Value, OAuthFailure> {
        self.make_room_for_access(now)?;
        if refresh && self.refresh.len() >= MAX_ENTRIES {
            return Err(full("refresh tokens"));
        }
        let access_token = random_token();
        self.access.insert(
            access_token.clone(),
            AccessToken {
                caller: caller.clone(),
                scope: scope.to_owned(),
                expires: now + self.access_ttl,
            },
        );
        self.remember(TokenKind::Access, &access_token, &caller.user);
        let mut response = json!({
            "access_token": access_token,
            "token_type": "Bearer",
            "expires_in": self.access_ttl.as_secs(),
            "scope": scope,
        });
        if refresh {
            let refresh_token = random_token();
            self.refresh.insert(
                refresh_token.clone(),
                RefreshToken {
                    caller: caller.clone(),
                    scope: scope.to_owned(),
                },
            );
            self.remember(TokenKind::Refresh, &refresh_token, &caller.user);
            response["refresh_token"] = Value::String(refresh_token);
        }
        Ok(response)
    }

    fn remember(&mut self, kind: TokenKind, token: &str, user: &User) {
        if self.issued.len() >= MAX_ENTRIES {
            self.issued.pop_front();
        }
        self.issued.push_back(IssuedToken {
            kind,
            token: token.to_owned(),
            user: user.clone(),
        });
    }

    /// Counts a refresh grant of `user`'s token; a user beyond the first
    /// [`MAX_ENTRIES`] is counted only in the total.
    fn count_refresh(&mut self, user: &User) {
        self.stats.refresh_grants += 1;
        let by_user = &mut self.stats.refresh_grants_by_user;
        if let Some(count) = by_user.get_mut(user.as_str()) {
            *count += 1;
        } else if by_user.len() < MAX_ENTRIES {
            by_user.insert(user.as_str().to_owned(), 1);
        }
    }

    /// Keeps `request` until its consent page is answered with `id`.
    fn hold_for_consent(
        &mut self,
        id: String,
        request: AuthorizationRequest,
        now: Instant,
    ) -> Result<(), OAuthFailure> {
        if self.consents.len() >= MAX_ENTRIES {
            self.consents.retain(|_, pending| pending.expires > now);
        }
        if self.consents.len() >= MAX_ENTRIES {
            return Err(full("consent requests"));
        }
        self.consents.insert(
            id,
            PendingConsent {
                request,
                expires: now + CONSENT_TTL,
            },
        );
        Ok(())
    }

    /// The request a consent page with `id` was shown for, once and while
    /// it has not expired.
    fn take_consent(&mut self, id: &str, now: Instant) -> Option<AuthorizationRequest> {
        self.consents
            .remove(id)
            .filter(|pending| pending.expires > now)
            .map(|pending| pending.request)
    }
}

/// 32 random bytes, base64url.
fn random_token() -> String {
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

/// An OAuth error answer (RFC 6749 §5.2 shape); small, unlike a
/// `Response`, so it can be the error of every step's `Result`.
struct OAuthFailure {
    status: StatusCode,
    error: &'static str,
    description: String,
}

impl IntoResponse for OAuthFailure {
    fn into_response(self) -> Response {
        let body = json!({"error": self.error, "error_description": self.description});
        let mut response = (
            self.status,
            [(header::CACHE_CONTROL, HeaderValue::from_static("no-store"))],
            axum::Json(body),
        )
            .into_response();
        // RFC 6749 §5.2: a 401 answers a failed client authentication.
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"token\""),
            );
        }
        response
    }
}

fn oauth_error(
    status: StatusCode,
    error: &'static str,
    description: impl Into<String>,
) -> OAuthFailure {
    OAuthFailure {
        status,
        error,
        description: description.into(),
    }
}

fn invalid_request(description: impl Into<String>) -> OAuthFailure {
    oauth_error(StatusCode::BAD_REQUEST, "invalid_request", description)
}

fn invalid_grant(description: impl Into<String>) -> OAuthFailure {
    oauth_error(StatusCode::BAD_REQUEST, "invalid_grant", description)
}

fn invalid_client(description: impl Into<String>) -> OAuthFailure {
    oauth_error(StatusCode::UNAUTHORIZED, "invalid_client", description)
}

/// A table at [`MAX_ENTRIES`].
fn full(what: &str) -> OAuthFailure {
    oauth_error(
        StatusCode::SERVICE_UNAVAILABLE,
        "temporarily_unavailable",
        format!("the server holds {MAX_ENTRIES} {what}, its limit"),
    )
}

/// `application/x-www-form-urlencoded` parameters; a repeated one is an
/// error (RFC 6749 §3.1).
fn parse_params(encoded: &[u8]) -> Result<HashMap<String, String>, OAuthFailure> {
    let mut params = HashMap::new();
    for (name, value) in url::form_urlencoded::parse(encoded) {
        if params
            .insert(name.to_string(), value.into_owned())
            .is_some()
        {
            return Err(invalid_request(format!(
                "parameter {name:?} given more than once"
            )));
        }
    }
    Ok(params)
}

/// `application/x-www-form-urlencoded` decoding of one value (the encoding
/// of HTTP Basic client credentials, RFC 6749 §2.3.1).
fn form_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'+' => decoded.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(high), Some(low)) => {
                    decoded.push((high * 16 + low) as u8);
                    i += 2;
                }
                _ => decoded.push(b'%'),
            },
            byte => decoded.push(byte),
        }
        i += 1;
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

/// Whether `uri` is an http(s) URL on a loopback host.
fn is_loopback_uri(uri: &str) -> bool {
    let Ok(url) = Url::parse(uri) else {
        return false;
    };
    if !matches!(url.scheme(), "http" | "https") {
        return false;
    }
    match url.host() {
        Some(url::Host::Domain(domain)) => domain == "localhost",
        Some(url::Host::Ipv4(addr)) => addr.is_loopback(),
        Some(url::Host::Ipv6(addr)) => addr.is_loopback(),
        None => false,
    }
}

/// Whether `scope` (space-separated) only names scopes of `granted`.
fn scope_within(scope: &str, granted: &str) -> bool {
    scope
        .split(' ')
        .filter(|s| !s.is_empty())
        .all(|s| granted.split(' ').any(|g| g == s))
}

async fn authorization_server_metadata(State(shared): State<Arc<Shared>>) -> Response {
    match metadata(&shared) {
        Some(metadata) => axum::Json(metadata).into_response(),
        None => bad_metadata(),
    }
}

/// OpenID discovery: the authorization server's metadata plus `jwks_uri`,
/// the signing algorithms and scope `openid` (counted as a discovery fetch).
async fn openid_configuration(State(shared): State<Arc<Shared>>) -> Response {
    let oidc = shared.oidc.discovery_fields();
    match metadata(&shared) {
        Some(mut metadata) => {
            if let (Some(object), Value::Object(oidc)) = (metadata.as_object_mut(), oidc) {
                object.extend(oidc);
            }
            if let Some(scopes) = metadata["scopes_supported"].as_array_mut() {
                scopes.push(json!(OPENID_SCOPE));
            }
            axum::Json(metadata).into_response()
        }
        None => bad_metadata(),
    }
}

/// The [`Fault::BadMetadata`] answer: malformed JSON.
fn bad_metadata() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        "{\"issuer\": 42",
    )
        .into_response()
}

/// The RFC 8414 metadata document (`None`: [`Fault::BadMetadata`]).
fn metadata(shared: &Shared) -> Option<Value> {
    if shared.fault == Some(Fault::BadMetadata) {
        return None;
    }
    let base = &shared.issuer;
    let issuer = if shared.fault == Some(Fault::WrongIssuer) {
        WRONG_ISSUER
    } else {
        base
    };
    let mut metadata = json!({
        "issuer": issuer,
        "authorization_endpoint": format!("{base}/authorize"),
        "token_endpoint": format!("{base}/token"),
        "registration_endpoint": format!("{base}/register"),
        "response_types_supported": ["code"],
        "grant_types_supported": ["authorization_code", "refresh_token", "client_credentials"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["none", "client_secret_post", "client_secret_basic"],
        "scopes_supported": [SCOPE, ADMIN_SCOPE],
        "client_id_metadata_document_supported": false,
    });
    if shared.fault == Some(Fault::NoPkce)
        && let Some(object) = metadata.as_object_mut()
    {
        object.remove("code_challenge_methods_supported");
    }
    Some(metadata)
}

async fn protected_resource_metadata(State(shared): State<Arc<Shared>>) -> Response {
    axum::Json(json!({
        "resource": shared.resource,
        "authorization_servers": [shared.issuer],
        "scopes_supported": [SCOPE],
        "bearer_methods_supported": ["header"],
    }))
    .into_response()
}

/// The fields of an RFC 7591 registration request the server uses; others
/// are ignored, as §2 asks.
#[derive(Deserialize)]
struct RegistrationRequest {
    redirect_uris: Vec<String>,
    token_endpoint_auth_method: Option<String>,
    client_name: Option<String>,
    grant_types: Option<Vec<String>>,
    response_types: Option<Vec<String>>,
}

/// A client's `redirect_uris`: 1 to [`MAX_REDIRECT_URIS`] absolute URLs
/// without fragment (RFC 7591 §2, RFC 6749 §3.1.2).
fn check_redirect_uris(uris: &[String]) -> Result<(), OAuthFailure> {
    let redirect_error = |description: String| {
        oauth_error(StatusCode::BAD_REQUEST, "invalid_redirect_uri", description)
    };
    if uris.is_empty() || uris.len() > MAX_REDIRECT_URIS {
        return Err(redirect_error(format!(
            "give 1 to {MAX_REDIRECT_URIS} redirect_uris, not {}",
            uris.len()
        )));
    }
    for uri in uris {
        let usable =
            uri.len() <= MAX_URI_LEN && Url::parse(uri).is_ok_and(|url| url.fragment().is_none());
        if !usable {
            return Err(redirect_error(format!(
                "redirect uri {uri:?} is not an absolute URL without fragment"
            )));
        }
    }
    Ok(())
}

async fn register(
    State(shared): State<Arc<Shared>>,
    body: Bytes,
) -> Result<Response, OAuthFailure> {
    let metadata_error = |description: String| {
        oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_client_metadata",
            description,
        )
    };
    let request: RegistrationRequest = serde_json::from_slice(&body)
        .map_err(|err| metadata_error(format!("the body is not a registration request: {err}")))?;
    check_redirect_uris(&request.redirect_uris)?;
    let method = request
        .token_endpoint_auth_method
        .unwrap_or_else(|| "client_secret_basic".to_owned());
    if !matches!(
        method.as_str(),
        "none" | "client_secret_post" | "client_secret_basic"
    ) {
        return Err(metadata_error(format!(
            "token_endpoint_auth_method {method:?} is not supported"
        )));
    }
    let client_id = format!("client-{}", random_token());
    let secret = (method != "none").then(random_token);
    {
        let mut store = shared.store();
        if store.clients.len() >= MAX_ENTRIES {
            return Err(full("clients"));
        }
        store.clients.insert(
            client_id.clone(),
            Client {
                secret: secret.clone(),
                redirect_uris: Some(request.redirect_uris.clone()),
            },
        );
        store.stats.registrations += 1;
    }
    let issued_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let mut response = json!({
        "client_id": client_id,
        "client_id_issued_at": issued_at,
        "redirect_uris": request.redirect_uris,
        "token_endpoint_auth_method": method,
        "grant_types": request.grant_types.unwrap_or_else(|| vec!["authorization_code".to_owned()]),
        "response_types": request.response_types.unwrap_or_else(|| vec!["code".to_owned()]),
    });
    if let Some(name) = request.client_name {
        response["client_name"] = Value::String(name);
    }
    if let Some(secret) = secret {
        response["client_secret"] = Value::String(secret);
        response["client_secret_expires_at"] = json!(0);
    }
    Ok((StatusCode::CREATED, axum::Json(response)).into_response())
}

/// `GET /authorize`: approves at once for the auto user, or shows the
/// consent page ([`OAuthServerOptions::consent_page`]).
async fn authorize(
    State(shared): State<Arc<Shared>>,
    RawQuery(query): RawQuery,
) -> Result<Response, OAuthFailure> {
    let request = check_authorization(&shared, query.unwrap_or_default().as_bytes())?;
    if shared.consent_page {
        let id = random_token();
        let page = consent_page(&request, &id);
        shared
            .store()
            .hold_for_consent(id, request, Instant::now())?;
        return Ok(page);
    }
    let user = shared.store().auto_user.clone();
    grant_code(&shared, request, user)
}

/// `POST /authorize`: a consent page answered, with form fields `request`
/// (the page's id) and `user`.
async fn approve(State(shared): State<Arc<Shared>>, body: Bytes) -> Result<Response, OAuthFailure> {
    let params = parse_params(&body)?;
    let Some(id) = params.get("request") else {
        return Err(invalid_request("request is missing"));
    };
    let Some(user) = params.get("user") else {
        return Err(invalid_request("user is missing"));
    };
    let user = User::new(user.as_str()).map_err(|err| invalid_request(err.to_string()))?;
    let Some(request) = shared.store().take_consent(id, Instant::now()) else {
        return Err(invalid_request(
            "request is unknown, already answered or expired",
        ));
    };
    grant_code(&shared, request, user)
}

/// The checks of an authorization request's query (RFC 6749 §4.1.1, RFC
/// 7636 §4.3, RFC 8707).
fn check_authorization(
    shared: &Shared,
    query: &[u8],
) -> Result<AuthorizationRequest, OAuthFailure> {
    let params = parse_params(query)?;
    let param = |name: &str| params.get(name).map(String::as_str);
    if param("response_type") != Some("code") {
        return Err(invalid_request("response_type must be \"code\""));
    }
    let Some(client_id) = param("client_id") else {
        return Err(invalid_request("client_id is missing"));
    };
    let Some(redirect_uri) = param("redirect_uri") else {
        return Err(invalid_request("redirect_uri is missing"));
    };
    let Some(challenge) = param("code_challenge") else {
        return Err(invalid_request(
            "code_challenge is missing (PKCE is required)",
        ));
    };
    // RFC 7636 §4.2: S256 of a verifier is 43 base64url characters.
    if challenge.len() != 43 || URL_SAFE_NO_PAD.decode(challenge).is_err() {
        return Err(invalid_request(
            "code_challenge is not a base64url SHA-256 digest",
        ));
    }
    if param("code_challenge_method") != Some("S256") {
        return Err(invalid_request("code_challenge_method must be S256"));
    }
    if let Some(resource) = param("resource")
        && resource != shared.resource
    {
        return Err(invalid_request(format!(
            "resource {resource:?} is not this server's protected resource {:?}",
            shared.resource
        )));
    }
    let scope = param("scope")
        .map(str::trim)
        .filter(|scope| !scope.is_empty())
        .unwrap_or(SCOPE);
    let nonce = param("nonce");
    if nonce.is_some_and(|nonce| nonce.len() > MAX_NONCE_LEN) {
        return Err(invalid_request(format!(
            "nonce is longer than {MAX_NONCE_LEN} bytes"
        )));
    }
    if Url::parse(redirect_uri).is_err() {
        return Err(invalid_request("redirect_uri is not a URL"));
    }
    let allowed = match shared.store().clients.get(client_id) {
        None => {
            return Err(invalid_request(format!("unknown client {client_id:?}")));
        }
        Some(Client {
            redirect_uris: Some(uris),
            ..
        }) => uris.iter().any(|uri| uri == redirect_uri),
        Some(Client {
            redirect_uris: None,
            ..
        }) => is_loopback_uri(redirect_uri),
    };
    if !allowed {
        return Err(invalid_request(format!(
            "redirect_uri {redirect_uri:?} is not registered for this client"
        )));
    }
    Ok(AuthorizationRequest {
        client_id: client_id.to_owned(),
        redirect_uri: redirect_uri.to_owned(),
        challenge: challenge.to_owned(),
        scope: scope.to_owned(),
        nonce: nonce.map(str::to_owned),
        state: param("state").map(str::to_owned),
    })
}

/// Issues a code for `request`, granted by `user`: the redirect back to the
/// client with `code`, `state` and `iss`.
fn grant_code(
    shared: &Shared,
    request: AuthorizationRequest,
    user: User,
) -> Result<Response, OAuthFailure> {
    let Ok(mut location) = Url::parse(&request.redirect_uri) else {
        return Err(invalid_request("redirect_uri is not a URL"));
    };
    let code = random_token();
    {
        let mut store = shared.store();
        let now = Instant::now();
        if store.codes.len() >= MAX_ENTRIES {
            store.codes.retain(|_, code| code.expires > now);
        }
        if store.codes.len() >= MAX_ENTRIES {
            return Err(full("authorization codes"));
        }
        store.codes.insert(
            code.clone(),
            PendingCode {
                caller: OAuthCaller {
                    client_id: request.client_id,
                    user,
                },
                redirect_uri: request.redirect_uri,
                challenge: request.challenge,
                scope: request.scope,
                nonce: request.nonce,
                expires: now + CODE_TTL,
            },
        );
    }
    let state = if shared.fault == Some(Fault::StateMismatch) {
        Some(random_token())
    } else {
        request.state
    };
    {
        let mut query = location.query_pairs_mut();
        query.append_pair("code", &code);
        if let Some(state) = &state {
            query.append_pair("state", state);
        }
        query.append_pair("iss", &shared.issuer);
    }
    let Ok(location) = HeaderValue::from_str(location.as_str()) else {
        return Err(invalid_request(
            "redirect_uri cannot be sent back in a header",
        ));
    };
    Ok((StatusCode::FOUND, [(header::LOCATION, location)]).into_response())
}

/// The consent page of a checked authorization request: a form posting
/// `request` (`id`) and `user` back to `/authorize`, submitted by the button
/// `approve`. No scripts; every value shown is escaped.
fn consent_page(request: &AuthorizationRequest, id: &str) -> Response {
    let client = html_escape(&request.client_id);
    let scope = html_escape(&request.scope);
    let id = html_escape(id);
    let page = format!(
        r#"<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Authorize {client}</title></head>
<body>
<h1>Authorize {client}</h1>
<p>Scope: {scope}</p>
<form method="post" action="authorize">
<input type="hidden" name="request" value="{id}">
<label for="user">User</label>
<input type="text" id="user" name="user" autocomplete="username">
<button type="submit" id="approve">Approve</button>
</form>
</body>
</html>
"#
    );
    (
        [(header::CACHE_CONTROL, HeaderValue::from_static("no-store"))],
        Html(page),
    )
        .into_response()
}

/// `text` safe inside HTML text and double-quoted attributes.
fn html_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            c => escaped.push(c),
        }
    }
    escaped
}

/// The client a token request authenticates as.
struct Authenticated {
    id: String,
    confidential: bool,
}

/// Client authentication at `/token`: HTTP Basic, `client_secret_post`, or
/// a public client's bare `client_id`.
fn authenticate(
    shared: &Shared,
    headers: &HeaderMap,
    params: &HashMap<String, String>,
) -> Result<Authenticated, OAuthFailure> {
    let basic = match headers.get(header::AUTHORIZATION) {
        None => None,
        Some(value) => {
            let credentials = value
                .to_str()
                .ok()
                .and_then(|value| value.split_once(' '))
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("basic"))
                .and_then(|(_, encoded)| STANDARD.decode(encoded.trim()).ok())
                .and_then(|decoded| String::from_utf8(decoded).ok())
                .and_then(|decoded| {
                    decoded
                        .split_once(':')
                        .map(|(id, secret)| (form_decode(id), form_decode(secret)))
                });
            match credentials {
                Some(credentials) => Some(credentials),
                None => {
                    return Err(invalid_request(
                        "the Authorization header is not HTTP Basic client credentials",
                    ));
                }
            }
        }
    };
    let form_id = params.get("client_id");
    let form_secret = params.get("client_secret");
    let (id, secret) = match basic {
        Some((id, secret)) => {
            if form_secret.is_some() {
                return Err(invalid_request(
                    "client authenticated both by HTTP Basic and client_secret",
                ));
            }
            if form_id.is_some_and(|form_id| *form_id != id) {
                return Err(invalid_request(
                    "client_id differs from the HTTP Basic user",
                ));
            }
            (id, Some(secret))
        }
        None => match form_id {
            Some(id) => (id.clone(), form_secret.cloned()),
            None => return Err(invalid_client("no client authentication")),
        },
    };
    let store = shared.store();
    let Some(client) = store.clients.get(&id) else {
        return Err(invalid_client(format!("unknown client {id:?}")));
    };
    match (&client.secret, &secret) {
        (Some(expected), Some(given)) if expected == given => Ok(Authenticated {
            id,
            confidential: true,
        }),
        (None, None) => Ok(Authenticated {
            id,
            confidential: false,
        }),
        (Some(_), _) => Err(invalid_client("wrong or missing client secret")),
        (None, Some(_)) => Err(invalid_client("a public client has no secret")),
    }
}

async fn token(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, OAuthFailure> {
    if shared.fault == Some(Fault::TokenError) {
        return Err(invalid_client("fault injected"));
    }
    let form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| {
            value.split(';').next().is_some_and(|mime| {
                mime.trim()
                    .eq_ignore_ascii_case("application/x-www-form-urlencoded")
            })
        });
    if !form {
        return Err(invalid_request(
            "the body must be application/x-www-form-urlencoded",
        ));
    }
    let params = parse_params(&body)?;
    let client = authenticate(&shared, &headers, &params)?;
    let param = |name: &str| params.get(name).map(String::as_str);
    if let Some(resource) = param("resource")
        && resource != shared.resource
    {
        return Err(oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_target",
            format!("resource {resource:?} is not this server's protected resource"),
        ));
    }
    let (mut body, id_token) = match param("grant_type") {
        Some("authorization_code") => authorization_code_grant(&shared, &client, param)?,
        Some("refresh_token") => (refresh_grant(&shared, &client, param)?, None),
        Some("client_credentials") => (client_credentials_grant(&shared, &client, param)?, None),
        Some(other) => {
            return Err(oauth_error(
                StatusCode::BAD_REQUEST,
                "unsupported_grant_type",
                format!("grant_type {other:?} is not supported"),
            ));
        }
        None => return Err(invalid_request("grant_type is missing")),
    };
    if let Some(IdTokenDue { nonce }) = id_token {
        // Signing fails only if key generation does: the access token
        // already issued is not taken back.
        let token = shared
            .oidc
            .id_token(&client.id, nonce.as_deref())
            .await
            .map_err(|err| {
                oauth_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    err.to_string(),
                )
            })?;
        body["id_token"] = Value::String(token);
    }
    Ok((
        [
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            (header::PRAGMA, HeaderValue::from_static("no-cache")),
        ],
        axum::Json(body),
    )
        .into_response())
}

/// An `openid` code exchanged: the `id_token` to add to the response.
struct IdTokenDue {
    /// The authorization request's `nonce`.
    nonce: Option<String>,
}

/// The token response, and the `id_token` due when the code's scope has
/// `openid`.
fn authorization_code_grant<'a>(
    shared: &Shared,
    client: &Authenticated,
    param: impl Fn(&str) -> Option<&'a str>,
) -> Result<(Value, Option<IdTokenDue>), OAuthFailure> {
    let (Some(code), Some(verifier), Some(redirect_uri)) =
        (param("code"), param("code_verifier"), param("redirect_uri"))
    else {
        return Err(invalid_request(
            "code, code_verifier and redirect_uri are required",
        ));
    };
    let now = Instant::now();
    let mut store = shared.store();
    // A code is spent by its first use, right or wrong (RFC 6749 §4.1.2).
    let Some(pending) = store.codes.remove(code) else {
        return Err(invalid_grant("unknown or used authorization code"));
    };
    if pending.expires <= now {
        return Err(invalid_grant("the authorization code has expired"));
    }
    if pending.caller.client_id != client.id {
        return Err(invalid_grant("the code was issued to another client"));
    }
    if pending.redirect_uri != redirect_uri {
        return Err(invalid_grant(
            "redirect_uri differs from the authorization request's",
        ));
    }
    if URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes())) != pending.challenge {
        return Err(invalid_grant(
            "code_verifier does not match the code_challenge",
        ));
    }
    let response = store.issue(&pending.caller, &pending.scope, true, now)?;
    store.stats.authorization_code_grants += 1;
    let id_token = scope_within(OPENID_SCOPE, &pending.scope).then_some(IdTokenDue {
        nonce: pending.nonce,
    });
    Ok((response, id_token))
}

fn refresh_grant<'a>(
    shared: &Shared,
    client: &Authenticated,
    param: impl Fn(&str) -> Option<&'a str>,
) -> Result<Value, OAuthFailure> {
    let Some(refresh_token) = param("refresh_token") else {
        return Err(invalid_request("refresh_token is missing"));
    };
    let now = Instant::now();
    let mut store = shared.store();
    let owned = store
        .refresh
        .get(refresh_token)
        .is_some_and(|token| token.caller.client_id == client.id);
    let Some(old) = store.refresh.remove(refresh_token).filter(|_| owned) else {
        store.stats.refresh_failures += 1;
        return Err(invalid_grant(
            "unknown, used or revoked refresh token, or another client's",
        ));
    };
    let scope = match param("scope") {
        Some(scope) if !scope_within(scope, &old.scope) => {
            store.refresh.insert(refresh_token.to_owned(), old);
            return Err(oauth_error(
                StatusCode::BAD_REQUEST,
                "invalid_scope",
                "the scope exceeds the one originally granted",
            ));
        }
        Some(scope) if !scope.trim().is_empty() => scope.trim().to_owned(),
        _ => old.scope.clone(),
    };
    // The new tokens keep the user the old one was granted for.
    match store.issue(&old.caller, &scope, true, now) {
        Ok(response) => {
            store.count_refresh(&old.caller.user);
            Ok(response)
        }
        Err(response) => {
            // Nothing was issued: the old token stays usable.
            store.refresh.insert(refresh_token.to_owned(), old);
            Err(response)
        }
    }
}

fn client_credentials_grant<'a>(
    shared: &Shared,
    client: &Authenticated,
    param: impl Fn(&str) -> Option<&'a str>,
) -> Result<Value, OAuthFailure> {
    if !client.confidential {
        return Err(oauth_error(
            StatusCode::BAD_REQUEST,
            "unauthorized_client",
            "client_credentials is for confidential clients",
        ));
    }
    let scope = param("scope")
        .map(str::trim)
        .filter(|scope| !scope.is_empty())
        .unwrap_or(SCOPE);
    // No person takes part: the client is its own user.
    let caller = OAuthCaller {
        client_id: client.id.clone(),
        user: User::client(&client.id),
    };
    let mut store = shared.store();
    let response = store.issue(&caller, scope, false, Instant::now())?;
    store.stats.client_credentials_grants += 1;
    Ok(response)
}

/// The bearer check in front of `/mcp`.
async fn require_bearer(
    State(shared): State<Arc<Shared>>,
    mut request: Request,
    next: Next,
) -> Response {
    let presented = request.headers().get(header::AUTHORIZATION).map(|value| {
        value
            .to_str()
            .ok()
            .and_then(|value| value.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim().to_owned())
    });
    let caller = {
        let mut store = shared.store();
        let now = Instant::now();
        let caller = presented
            .as_ref()
            .and_then(Option::as_deref)
            .and_then(|token| store.access.get(token))
            .filter(|token| token.expires > now)
            .map(|token| (token.caller.clone(), token.scope.clone()));
        if caller.is_some() {
            store.stats.authorized_mcp_requests += 1;
        } else {
            store.stats.rejected_mcp_requests += 1;
        }
        caller
    };
    let Some((caller, scope)) = caller else {
        let given = presented.is_some();
        let challenge = shared.challenge(given);
        let description = if given {
            "the access token is unknown or expired"
        } else {
            "an access token is required"
        };
        return challenged(
            StatusCode::UNAUTHORIZED,
            if given {
                "invalid_token"
            } else {
                "unauthorized"
            },
            description.to_owned(),
            &challenge,
        );
    };
    let has_admin_scope = scope.split(' ').any(|granted| granted == ADMIN_SCOPE);
    if !has_admin_scope {
        // Step-up: `admin_echo` needs more than the token grants. The body
        // is read (bounded) to see which tool is called, then passed on.
        let (parts, body) = request.into_parts();
        let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY_BYTES).await else {
            return StatusCode::PAYLOAD_TOO_LARGE.into_response();
        };
        if calls_admin_tool(&bytes) {
            let challenge = format!(
                "Bearer error=\"insufficient_scope\", scope=\"{SCOPE} {ADMIN_SCOPE}\", resource_metadata=\"{}/.well-known/oauth-protected-resource/mcp\"",
                shared.issuer
            );
            return challenged(
                StatusCode::FORBIDDEN,
                "insufficient_scope",
                format!("{ADMIN_TOOL} needs scope {ADMIN_SCOPE}"),
                &challenge,
            );
        }
        request = Request::from_parts(parts, axum::body::Body::from(bytes));
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// A refusal of `/mcp` with its `WWW-Authenticate` challenge.
fn challenged(status: StatusCode, error: &str, description: String, challenge: &str) -> Response {
    let mut response = (
        status,
        axum::Json(json!({"error": error, "error_description": description})),
    )
        .into_response();
    if let Ok(value) = HeaderValue::from_str(challenge) {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

/// Whether a JSON-RPC body calls [`ADMIN_TOOL`].
fn calls_admin_tool(body: &[u8]) -> bool {
    serde_json::from_slice::<Value>(body).is_ok_and(|message| {
        message["method"] == "tools/call" && message["params"]["name"] == ADMIN_TOOL
    })
}

async fn admin_stats(State(shared): State<Arc<Shared>>) -> Response {
    axum::Json(shared.stats()).into_response()
}

/// Every token issued so far, by kind, and `users`: each token's user
/// (test only: the server has no secrets worth keeping).
async fn admin_tokens(State(shared): State<Arc<Shared>>) -> Response {
    let store = shared.store();
    let of = |kind: TokenKind| -> Vec<&str> {
        store
            .issued
            .iter()
            .filter(|issued| issued.kind == kind)
            .map(|issued| issued.token.as_str())
            .collect()
    };
    let users: serde_json::Map<String, Value> = store
        .issued
        .iter()
        .map(|issued| (issued.token.clone(), json!(issued.user.as_str())))
        .collect();
    axum::Json(json!({
        "access_tokens": of(TokenKind::Access),
        "refresh_tokens": of(TokenKind::Refresh),
        "users": users,
    }))
    .into_response()
}

async fn admin_expire(State(shared): State<Arc<Shared>>) -> Response {
    shared.expire_access_tokens();
    axum::Json(json!({"expired": true})).into_response()
}

async fn admin_revoke(State(shared): State<Arc<Shared>>) -> Response {
    shared.store().refresh.clear();
    axum::Json(json!({"revoked": true})).into_response()
}

/// The body of `POST /admin/config`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AdminConfig {
    access_ttl_secs: u64,
}

async fn admin_config(
    State(shared): State<Arc<Shared>>,
    body: Bytes,
) -> Result<Response, OAuthFailure> {
    let config: AdminConfig = serde_json::from_slice(&body)
        .map_err(|err| invalid_request(format!("expected {{\"access_ttl_secs\": n}}: {err}")))?;
    if config.access_ttl_secs > MAX_ACCESS_TTL.as_secs() {
        return Err(invalid_request(format!(
            "access_ttl_secs is at most {}",
            MAX_ACCESS_TTL.as_secs()
        )));
    }
    shared.store().access_ttl = Duration::from_secs(config.access_ttl_secs);
    Ok(axum::Json(json!({"access_ttl_secs": config.access_ttl_secs})).into_response())
}

/// The body of `POST /admin/auto-user`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AdminAutoUser {
    user: String,
}

/// Sets the user `/authorize` approves for without a consent page.
async fn admin_auto_user(
    State(shared): State<Arc<Shared>>,
    body: Bytes,
) -> Result<Response, OAuthFailure> {
    let request: AdminAutoUser = serde_json::from_slice(&body)
        .map_err(|err| invalid_request(format!("expected {{\"user\": string}}: {err}")))?;
    let user = User::new(request.user).map_err(|err| invalid_request(err.to_string()))?;
    let body = json!({"user": user.as_str()});
    shared.store().auto_user = user;
    Ok(axum::Json(body).into_response())
}

/// The body of `POST /admin/clients`: a public client (no secret, PKCE
/// only) under a client id the test chooses.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AdminClient {
    client_id: String,
    redirect_uris: Vec<String>,
}

/// Registers (or replaces) a public client with a fixed `client_id`.
async fn admin_clients(
    State(shared): State<Arc<Shared>>,
    body: Bytes,
) -> Result<Response, OAuthFailure> {
    let request: AdminClient = serde_json::from_slice(&body).map_err(|err| {
        invalid_request(format!(
            "expected {{\"client_id\": string, \"redirect_uris\": [string]}}: {err}"
        ))
    })?;
    let id = &request.client_id;
    if id.is_empty() || id.len() > MAX_CLIENT_ID_LEN || id.chars().any(char::is_control) {
        return Err(invalid_request(format!(
            "client_id: 1 to {MAX_CLIENT_ID_LEN} bytes without control characters"
        )));
    }
    check_redirect_uris(&request.redirect_uris)?;
    {
        let mut store = shared.store();
        if !store.clients.contains_key(id) && store.clients.len() >= MAX_ENTRIES {
            return Err(full("clients"));
        }
        store.clients.insert(
            id.clone(),
            Client {
                secret: None,
                redirect_uris: Some(request.redirect_uris.clone()),
            },
        );
    }
    Ok(axum::Json(json!({
        "client_id": request.client_id,
        "redirect_uris": request.redirect_uris,
        "token_endpoint_auth_method": "none",
    }))
    .into_response())
}

/// The protected MCP server: who am I (client and user), and echo.
#[derive(Clone)]
struct OAuthMcpServer {
    tool_router: rmcp::handler::server::router::tool::ToolRouter<Self>,
}

/// Arguments of `echo`.
#[derive(Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct EchoParams {
    /// The text to return.
    text: String,
}

#[tool_router]
impl OAuthMcpServer {
    fn new() -> Self {
        Self {
            tool_router: Self::tool_router(),
        }
    }

    #[tool(description = "Returns the OAuth client id the request's access token was issued to.")]
    async fn whoami(&self, Extension(parts): Extension<Parts>) -> CallToolResult {
        caller_says(&parts, |caller| caller.client_id.clone())
    }

    #[tool(description = "Returns the user the request's access token was granted for.")]
    async fn whoami_user(&self, Extension(parts): Extension<Parts>) -> CallToolResult {
        caller_says(&parts, |caller| caller.user.to_string())
    }

    #[tool(description = "Returns `text` unchanged.")]
    async fn echo(&self, Parameters(EchoParams { text }): Parameters<EchoParams>) -> String {
        text
    }

    #[tool(description = "Returns `text` unchanged; needs scope mcp:admin.")]
    async fn admin_echo(&self, Parameters(EchoParams { text }): Parameters<EchoParams>) -> String {
        text
    }
}

/// `what` of the request's [`OAuthCaller`], as a tool result.
fn caller_says(parts: &Parts, what: impl Fn(&OAuthCaller) -> String) -> CallToolResult {
    match parts.extensions.get::<OAuthCaller>() {
        Some(caller) => CallToolResult::success(vec![ContentBlock::text(what(caller))]),
        None => CallToolResult::error(vec![ContentBlock::text(
            "the request carries no authorized client",
        )]),
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for OAuthMcpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_server_info(
            Implementation::new("quiver-testkit-oauth", env!("CARGO_PKG_VERSION")),
        )
    }
}

#[cfg(test)]
#[path = "oauth_server_tests.rs"]
mod tests;
