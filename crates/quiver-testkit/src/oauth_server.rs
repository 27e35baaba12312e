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
//!
//! One module a part: `options` (what a test sets and reads), `state` (the
//! memory), `wire` (forms in, errors out), `metadata`, `register`,
//! `authorize`, `token`, `resource` (`/mcp` and its bearer check) and
//! `admin`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

use self::admin::{
    admin_auto_user, admin_clients, admin_config, admin_expire, admin_revoke, admin_stats,
    admin_tokens,
};
use self::authorize::{approve, authorize};
use self::metadata::{
    authorization_server_metadata, openid_configuration, protected_resource_metadata,
};
use self::register::register;
use self::resource::{OAuthMcpServer, require_bearer};
use self::state::{Client, Shared, Store};
use self::token::token;
use self::wire::MAX_BODY_BYTES;
use crate::oidc_issuer::OidcIssuer;

mod admin;
mod authorize;
mod metadata;
mod options;
mod register;
mod resource;
mod state;
mod token;
mod wire;

pub use options::{
    ADMIN_SCOPE, ADMIN_TOOL, DEFAULT_ACCESS_TTL, DEFAULT_AUTO_USER, Fault, InvalidUser,
    MAX_ACCESS_TTL, MAX_ENTRIES, MAX_USER_LEN, OAuthServerOptions, OAuthStats, PreregisteredClient,
    SCOPE, User,
};

/// The server; clones share their state.
#[derive(Clone)]
pub struct OAuthServer {
    shared: Arc<Shared>,
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

#[cfg(test)]
#[path = "oauth_server_tests.rs"]
mod tests;
