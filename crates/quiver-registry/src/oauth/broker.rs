//! The OAuth credential broker (docs/reference.md §13.6): the registry holds
//! every OAuth connection's client registration and tokens (sealed, see
//! [`super::seal`]), runs the flows with rmcp's `auth` module, and hands
//! workers current access tokens, never refresh tokens.
//!
//! Flows:
//! - authorization code + PKCE: [`OAuthBroker::connect`] discovers the
//!   server's metadata, registers or names the client, and stores the
//!   pending flow (PKCE verifier sealed) in the database under its `state`;
//!   [`OAuthBroker::callback`] takes that row (one-time, whichever replica the
//!   browser comes back to) and exchanges the code;
//! - client credentials: [`OAuthBroker::connect`] asks for a token at once,
//!   and again whenever one is needed.
//!
//! A connection with `per_user` (R-OAUTH-8) keeps one grant per caller
//! principal instead: a principal without one gets a consent link
//! ([`Issued::Consent`]: absolute, single-use, bound to the principal and the
//! connection, expiring), whose first visit ([`OAuthBroker::follow_link`])
//! starts the authorization-code flow for that principal only; the callback
//! stores the grant under the principal. Each grant is sealed bound to its
//! connection and principal, refreshed under its own lease.
//!
//! Refresh happens on demand ([`OAuthBroker::access_token`]) under a lease
//! row in the database, so of all replicas exactly one refreshes a token;
//! the others wait for the lease and then find the new token. A refresh the
//! authorization server refuses (`invalid_grant`) marks the connection
//! `needs_reconsent`. Each step that fails says which step it was; a failed
//! flow stores nothing but the error message.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use oauth2::TokenResponse as _;
use quiver_mcp::credentials::{
    Bearer, CredentialError, CredentialSource, GrantRef, Renewal, token_fingerprint,
};
use quiver_store::{
    GrantKey, OAuthAuthorizationRow, OAuthConnectionRow, OAuthStatus, OAuthTicketRow, OAuthTokens,
    SecretUpdate, Store, StoreError,
};
use rmcp::transport::auth::{
    AuthError, AuthorizationManager, AuthorizationRequest, AuthorizationSession,
    ClientCredentialsConfig, CredentialStore, InMemoryCredentialStore, OAuthClientConfig,
    StateStore, StoredAuthorizationState, StoredCredentials,
};
use serde::{Deserialize, Serialize};

use super::seal::Keyring;
use super::spec::{Grant, OAuthConnectionSpec, OAuthConnectionView, OAuthGrantView, check_name};
use crate::error::RegistryError;

/// Bound on each network step of a flow (discovery, registration, token
/// request).
pub const STEP_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a pending authorization waits for the browser to come back.
pub const AUTHORIZATION_TTL: Duration = Duration::from_secs(600);
/// How long one replica may hold a connection's refresh lease; a replica
/// that dies holding it delays the next refresh by at most this.
const LEASE_TTL: Duration = Duration::from_secs(30);
/// How long a token request waits for another replica's refresh.
const LEASE_WAIT: Duration = Duration::from_secs(25);
/// Pause between looks at a lease another replica holds.
const LEASE_POLL: Duration = Duration::from_millis(50);
/// A token is handed out until this long before its expiry (at most half
/// its lifetime); after that it is refreshed first.
const REFRESH_MARGIN: Duration = Duration::from_secs(30);
/// Workers ask again for a principal's token at least this often, so a
/// grant revoked (by the principal on any worker, or by an admin) stops
/// serving calls on every worker within it.
pub const GRANT_RECHECK: Duration = Duration::from_secs(10);
/// A live consent link is handed out again while it lasts at least this
/// long; closer to its expiry a new one is made.
const LINK_REUSE_MARGIN: Duration = Duration::from_secs(120);
/// Where a consent link points, below the public URL.
pub const LINK_PATH: &str = "/oauth/authorize";

/// A current access token for a worker.
#[derive(Clone)]
pub struct IssuedToken {
    /// The bearer token.
    pub access_token: String,
    /// When it expires, when the authorization server said.
    pub expires_at: Option<DateTime<Utc>>,
    /// When the worker should ask again instead of using it.
    pub refresh_at: Option<DateTime<Utc>>,
    /// Identifies the grant (one consent or client-credentials connect):
    /// refreshed tokens keep it, a new consent changes it, so a worker never
    /// carries two grants' tokens over one MCP session.
    pub grant_id: String,
    /// The connection keeps one grant per caller; this is the principal's.
    pub per_user: bool,
}

impl std::fmt::Debug for IssuedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedToken")
            .field("expires_at", &self.expires_at)
            .field("grant_id", &self.grant_id)
            .finish_non_exhaustive()
    }
}

/// A link that starts one principal's consent for a per-user connection.
pub struct ConsentLink {
    /// Absolute; its last path segment is the secret.
    pub url: String,
    /// When it stops working.
    pub expires_at: DateTime<Utc>,
}

impl std::fmt::Debug for ConsentLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsentLink")
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

/// What a token request gets.
#[derive(Debug)]
pub enum Issued {
    /// A current token.
    Token(IssuedToken),
    /// A per-user connection and a principal without a grant: its person
    /// consents at the link first.
    Consent(ConsentLink),
    /// A per-user connection asked without a principal: no token of it
    /// serves anyone but a caller.
    NoPrincipal,
}

/// Whose grant a finished authorization stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorized {
    /// The connection.
    pub connection: String,
    /// The principal of a per-user grant; `None`: the connection's own.
    pub principal: Option<String>,
}

/// What pressing "Connect" leads to.
#[derive(Debug)]
pub enum ConnectOutcome {
    /// Send the browser to `url`; the authorization server redirects back to
    /// `/admin/oauth/callback`, which completes the flow only for the
    /// browser holding `cookie` (set it in the answer to Connect).
    Redirect {
        /// The authorization URL.
        url: String,
        /// The cookie binding the flow to this browser.
        cookie: FlowCookie,
    },
    /// Connected already (client credentials).
    Connected(OAuthConnectionView),
}

/// The query of `/admin/oauth/callback`.
#[derive(Debug, Default, Deserialize)]
pub struct CallbackParams {
    /// The authorization code.
    pub code: Option<String>,
    /// The flow's `state`.
    pub state: Option<String>,
    /// RFC 9207 issuer.
    pub iss: Option<String>,
    /// An error the authorization server reported instead of a code.
    pub error: Option<String>,
    /// Its description.
    pub error_description: Option<String>,
}

/// The cookie that binds an authorization-code flow to the browser that
/// pressed Connect: a random nonce whose SHA-256 is stored with the pending
/// flow. Named per connection, scoped to the callback's path.
pub struct FlowCookie {
    /// The connection's name (part of the cookie's name).
    pub connection: String,
    nonce: String,
    /// Sent over HTTPS only (the registry's public URL is https).
    pub secure: bool,
}

impl std::fmt::Debug for FlowCookie {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowCookie")
            .field("connection", &self.connection)
            .finish_non_exhaustive()
    }
}

/// The path the flow cookie is sent to.
pub const CALLBACK_PATH: &str = "/admin/oauth/callback";

impl FlowCookie {
    /// The cookie's name for `connection`.
    pub fn name_for(connection: &str) -> String {
        format!("quiver_oauth_flow_{connection}")
    }

    /// The `Set-Cookie` header value: HttpOnly, SameSite=Lax (sent on the
    /// authorization server's top-level redirect back), Secure over HTTPS,
    /// living as long as the pending flow.
    pub fn header_value(&self) -> String {
        format!(
            "{}={}; Path={CALLBACK_PATH}; Max-Age={}; HttpOnly; SameSite=Lax{}",
            Self::name_for(&self.connection),
            self.nonce,
            AUTHORIZATION_TTL.as_secs(),
            if self.secure { "; Secure" } else { "" }
        )
    }
}

/// The pending flow, sealed into `oauth_authorizations.payload`.
#[derive(Serialize, Deserialize)]
struct Pending {
    client_id: String,
    redirect_uri: String,
    state: StoredAuthorizationState,
}

/// The broker.
#[derive(Clone)]
pub struct OAuthBroker {
    store: Arc<dyn Store>,
    keyring: Option<Keyring>,
    /// Where browsers reach the registry (consent links).
    public_url: String,
    callback_url: String,
    holder: String,
    /// The registry's egress allowlist over every request of a flow; `None`
    /// (no allowlist): rmcp's own client.
    egress: Option<Arc<super::egress::EgressOAuthClient>>,
}

impl std::fmt::Debug for OAuthBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthBroker")
            .field("keyring", &self.keyring)
            .field("callback_url", &self.callback_url)
            .finish_non_exhaustive()
    }
}

fn step(step: &str, message: impl std::fmt::Display) -> RegistryError {
    RegistryError::McpUnavailable {
        message: format!("oauth {step}: {message}"),
        stderr_tail: Vec::new(),
    }
}

fn store_error(err: StoreError) -> RegistryError {
    RegistryError::from(err)
}

async fn bounded<T>(
    name: &str,
    future: impl Future<Output = Result<T, AuthError>>,
) -> Result<T, RegistryError> {
    tokio::time::timeout(STEP_TIMEOUT, future)
        .await
        .map_err(|_| {
            step(
                name,
                format!("no answer within {} s", STEP_TIMEOUT.as_secs()),
            )
        })?
        .map_err(|err| step(name, err))
}

fn binding(name: &str, column: &str) -> String {
    format!("{name}/{column}")
}

/// What a grant's sealed tokens are bound to: its connection, and the
/// principal of a per-user grant (connection names hold no '/'), so one
/// principal's tokens never open as another's.
fn sealing_owner(name: &str, principal: Option<&str>) -> String {
    match principal {
        None => name.to_owned(),
        Some(principal) => format!("{name}/{principal}"),
    }
}

/// The grant a row's token fields belong to.
fn key_of(row: &OAuthConnectionRow) -> GrantKey<'_> {
    GrantKey {
        connection: &row.name,
        principal: row.principal.as_deref(),
    }
}

/// Who a grant is, in messages and audit lines.
fn whose(grant: GrantKey<'_>) -> String {
    match grant.principal {
        None => format!("connection {:?}", grant.connection),
        Some(principal) => format!("{principal}'s grant of connection {:?}", grant.connection),
    }
}

fn epoch_secs(at: DateTime<Utc>) -> u64 {
    u64::try_from(at.timestamp()).unwrap_or(0)
}

/// The expiry of stored credentials, when the server gave one.
fn expiry_of(credentials: &StoredCredentials) -> Option<DateTime<Utc>> {
    let response = credentials.token_response.as_ref()?;
    let expires_in = response.expires_in()?;
    let received = credentials.token_received_at?;
    let received = DateTime::from_timestamp(i64::try_from(received).ok()?, 0)?;
    Some(received + chrono::Duration::from_std(expires_in).ok()?)
}

/// When a token should no longer be handed out: [`REFRESH_MARGIN`] before
/// expiry, or half its lifetime for short-lived tokens.
fn refresh_at(credentials: &StoredCredentials) -> Option<DateTime<Utc>> {
    let expires_in = credentials.token_response.as_ref()?.expires_in()?;
    let margin = REFRESH_MARGIN.min(expires_in / 2);
    Some(expiry_of(credentials)? - chrono::Duration::from_std(margin).ok()?)
}

fn access_token_of(credentials: &StoredCredentials) -> Option<String> {
    Some(
        credentials
            .token_response
            .as_ref()?
            .access_token()
            .secret()
            .clone(),
    )
}

/// A state store holding one pending flow: the one taken from the
/// database (callback), or the one the flow saves (connect), which the
/// broker reads back through a clone.
#[derive(Clone, Default)]
struct OneState(Arc<tokio::sync::Mutex<Option<(String, StoredAuthorizationState)>>>);

impl OneState {
    fn holding(csrf: String, state: StoredAuthorizationState) -> Self {
        OneState(Arc::new(tokio::sync::Mutex::new(Some((csrf, state)))))
    }
}

#[async_trait]
impl StateStore for OneState {
    async fn save(&self, csrf: &str, state: StoredAuthorizationState) -> Result<(), AuthError> {
        *self.0.lock().await = Some((csrf.to_owned(), state));
        Ok(())
    }

    async fn load(&self, csrf: &str) -> Result<Option<StoredAuthorizationState>, AuthError> {
        Ok(self
            .0
            .lock()
            .await
            .as_ref()
            .filter(|(known, _)| known == csrf)
            .map(|(_, state)| state.clone()))
    }

    async fn delete(&self, _csrf: &str) -> Result<(), AuthError> {
        *self.0.lock().await = None;
        Ok(())
    }
}

impl OAuthBroker {
    /// A broker over `store`; without a keyring every operation that would
    /// store a secret is refused, naming the missing setting.
    /// `public_url` is where browsers reach the registry: authorization
    /// servers send them back to its [`CALLBACK_PATH`], consent links point
    /// below its [`LINK_PATH`]; `holder` names this replica in leases.
    pub fn new(
        store: Arc<dyn Store>,
        keyring: Option<Keyring>,
        public_url: &str,
        holder: String,
    ) -> Self {
        let public_url = public_url.trim_end_matches('/').to_owned();
        OAuthBroker {
            store,
            keyring,
            callback_url: format!("{public_url}{CALLBACK_PATH}"),
            public_url,
            holder,
            egress: None,
        }
    }

    /// The same broker with every request of its flows under `egress` (the
    /// registry's allowlist, as its tool preview); an unrestricted policy
    /// keeps rmcp's own client.
    pub fn with_egress(
        mut self,
        egress: quiver_mcp::egress::EgressPolicy,
    ) -> Result<Self, RegistryError> {
        self.egress = if egress.is_unrestricted() {
            None
        } else {
            Some(Arc::new(
                super::egress::EgressOAuthClient::new(egress, STEP_TIMEOUT)
                    .map_err(RegistryError::Internal)?,
            ))
        };
        Ok(self)
    }

    fn keyring(&self) -> Result<&Keyring, RegistryError> {
        self.keyring.as_ref().ok_or_else(|| {
            RegistryError::FailedPrecondition(
                "the registry has no oauth key: set QUIVER_OAUTH_KEYS or --oauth-key-file".into(),
            )
        })
    }

    fn open(&self, name: &str, column: &str, sealed: &str) -> Result<String, RegistryError> {
        self.keyring()?
            .open(&binding(name, column), sealed)
            .map_err(|err| RegistryError::Internal(format!("oauth connection {name:?}: {err}")))
    }

    fn seal(&self, name: &str, column: &str, plaintext: &str) -> Result<String, RegistryError> {
        Ok(self.keyring()?.seal(&binding(name, column), plaintext))
    }

    async fn row(&self, name: &str) -> Result<OAuthConnectionRow, RegistryError> {
        self.store
            .get_oauth_connection(name)
            .await
            .map_err(store_error)?
            .ok_or_else(|| RegistryError::NotFound(format!("oauth connection {name:?} not found")))
    }

    fn spec_of(row: &OAuthConnectionRow) -> Result<OAuthConnectionSpec, RegistryError> {
        serde_json::from_str(&row.config).map_err(|err| {
            RegistryError::Internal(format!("stored oauth connection {:?}: {err}", row.name))
        })
    }

    fn secret_of(&self, row: &OAuthConnectionRow) -> Result<Option<String>, RegistryError> {
        row.client_secret
            .as_deref()
            .map(|sealed| self.open(&row.name, "client_secret", sealed))
            .transpose()
    }

    fn credentials_of(
        &self,
        row: &OAuthConnectionRow,
    ) -> Result<Option<StoredCredentials>, RegistryError> {
        let Some(sealed) = row.credentials.as_deref() else {
            return Ok(None);
        };
        let owner = sealing_owner(&row.name, row.principal.as_deref());
        let json = self.open(&owner, "credentials", sealed)?;
        serde_json::from_str(&json).map(Some).map_err(|err| {
            RegistryError::Internal(format!(
                "oauth connection {:?} credentials: {err}",
                row.name
            ))
        })
    }

    /// Every connection, as reads show them.
    pub async fn list(&self) -> Result<Vec<OAuthConnectionView>, RegistryError> {
        let now = Utc::now();
        self.store
            .list_oauth_connections()
            .await
            .map_err(store_error)?
            .iter()
            .map(|row| OAuthConnectionView::of(row, now))
            .collect()
    }

    /// One connection.
    pub async fn view(&self, name: &str) -> Result<OAuthConnectionView, RegistryError> {
        OAuthConnectionView::of(&self.row(name).await?, Utc::now())
    }

    /// Creates or changes a connection. Changed settings drop its tokens
    /// (they were granted for the old ones); the secret is kept unless the
    /// body names one (empty: removed).
    pub async fn put(
        &self,
        name: &str,
        spec: OAuthConnectionSpec,
        actor: &str,
    ) -> Result<OAuthConnectionView, RegistryError> {
        check_name(name)?;
        spec.validate()?;
        let existing = self
            .store
            .get_oauth_connection(name)
            .await
            .map_err(store_error)?;
        let secret = match spec.client_secret.as_deref() {
            None => SecretUpdate::Keep,
            Some("") => SecretUpdate::Clear,
            Some(secret) => {
                let same = match &existing {
                    Some(row) => self.secret_of(row)?.as_deref() == Some(secret),
                    None => false,
                };
                if same {
                    SecretUpdate::Keep
                } else {
                    SecretUpdate::Set(self.seal(name, "client_secret", secret)?)
                }
            }
        };
        let row = self
            .store
            .put_oauth_connection(name, spec.config_json(), secret)
            .await
            .map_err(store_error)?;
        audit("oauth_connection_put", name, actor, None);
        OAuthConnectionView::of(&row, Utc::now())
    }

    /// Deletes a connection with its tokens and pending flows.
    pub async fn delete(&self, name: &str, actor: &str) -> Result<(), RegistryError> {
        if !self
            .store
            .delete_oauth_connection(name)
            .await
            .map_err(store_error)?
        {
            return Err(RegistryError::NotFound(format!(
                "oauth connection {name:?} not found"
            )));
        }
        audit("oauth_connection_delete", name, actor, None);
        Ok(())
    }

    async fn discovered(
        &self,
        spec: &OAuthConnectionSpec,
        need_pkce: bool,
    ) -> Result<AuthorizationManager, RegistryError> {
        let mut manager = match &self.egress {
            Some(client) => {
                bounded(
                    "discovery",
                    AuthorizationManager::new_with_oauth_http_client(
                        spec.server_url.as_str(),
                        client.clone(),
                    ),
                )
                .await?
            }
            None => {
                bounded(
                    "discovery",
                    AuthorizationManager::new_allowing_private_addresses(spec.server_url.as_str()),
                )
                .await?
            }
        };
        // The server's own URL first: refused before anything is fetched.
        if let Some(client) = &self.egress {
            client
                .check(&spec.server_url)
                .await
                .map_err(|err| step("discovery", err))?;
        }
        let resolution = bounded("discovery", manager.resolve_metadata()).await?;
        if !resolution.source.is_discovered() {
            return Err(step(
                "discovery",
                format!(
                    "{} publishes no OAuth metadata (protected resource or authorization server)",
                    spec.server_url
                ),
            ));
        }
        if need_pkce {
            quiver_mcp::oauth::require_pkce(&resolution.metadata)
                .map_err(|err| step("discovery", err))?;
        }
        manager.set_metadata(resolution.metadata);
        Ok(manager)
    }

    /// Starts connecting: for the authorization-code grant returns the URL
    /// to send the browser to; for client credentials asks for a token now.
    pub async fn connect(&self, name: &str, actor: &str) -> Result<ConnectOutcome, RegistryError> {
        self.keyring()?;
        let row = self.row(name).await?;
        let spec = Self::spec_of(&row)?;
        if spec.per_user {
            return Err(RegistryError::FailedPrecondition(format!(
                "oauth connection {name:?} is per user: each caller connects its own account through the link its first call gets (mcp_authorization_required)"
            )));
        }
        let secret = self.secret_of(&row)?;
        let result = match spec.grant {
            Grant::ClientCredentials => self
                .client_credentials(&row, &spec, secret, false)
                .await
                .and_then(|(row, _)| {
                    OAuthConnectionView::of(&row, Utc::now()).map(ConnectOutcome::Connected)
                }),
            Grant::AuthorizationCode => self.start_authorization(&row, &spec, secret, None).await,
        };
        self.note_failure(GrantKey::fleet(name), &result).await;
        if result.is_ok() {
            audit("oauth_connect", name, actor, None);
        }
        result
    }

    async fn note_failure<T>(&self, grant: GrantKey<'_>, result: &Result<T, RegistryError>) {
        if let Err(err) = result
            && matches!(err, RegistryError::McpUnavailable { .. })
        {
            let _ = self.store.set_oauth_error(grant, &err.to_string()).await;
        }
    }

    /// Starts an authorization-code flow of `row`'s connection, for
    /// `principal`'s grant or (`None`) the connection's own.
    async fn start_authorization(
        &self,
        row: &OAuthConnectionRow,
        spec: &OAuthConnectionSpec,
        secret: Option<String>,
        principal: Option<&str>,
    ) -> Result<ConnectOutcome, RegistryError> {
        let mut manager = self.discovered(spec, true).await?;
        let captured = OneState::default();
        manager.set_state_store(captured.clone());
        let mut request = AuthorizationRequest::new(self.callback_url.clone())
            .with_client_name("Quiver registry")
            .with_scopes(spec.scopes.iter().cloned());
        if spec.scopes.is_empty() {
            request = request.with_initial_scope_selection();
        }
        if let Some(id) = &spec.client_id {
            request = request.with_preregistered_client(id.clone());
        }
        if let Some(secret) = secret {
            request = request.with_client_secret(secret);
        }
        if let Some(url) = &spec.client_metadata_url {
            request = request.with_client_metadata_url(url.clone());
        }
        let session =
            tokio::time::timeout(STEP_TIMEOUT, AuthorizationSession::new(manager, request))
                .await
                .map_err(|_| step("registration", "no answer in time"))?
                .map_err(|(_, err)| step("registration", err))?;
        let (client_id, _) = session
            .auth_manager
            .get_credentials()
            .await
            .map_err(|err| step("registration", err))?;
        let Some((csrf, state)) = captured.0.lock().await.take() else {
            return Err(RegistryError::Internal(
                "the authorization request stored no state".into(),
            ));
        };
        let pending = Pending {
            client_id,
            redirect_uri: self.callback_url.clone(),
            state,
        };
        let payload = serde_json::to_string(&pending)
            .map_err(|err| RegistryError::Internal(err.to_string()))?;
        let nonce = format!(
            "{:032x}{:032x}",
            rand::random::<u128>(),
            rand::random::<u128>()
        );
        let now = Utc::now();
        self.store
            .create_oauth_authorization(OAuthAuthorizationRow {
                state: csrf.clone(),
                name: row.name.clone(),
                principal: principal.map(str::to_owned),
                generation: row.generation,
                payload: self.seal(&csrf, "authorization", &payload)?,
                created_at: now,
                expires_at: now + chrono::Duration::from_std(AUTHORIZATION_TTL).unwrap_or_default(),
                browser_hash: token_fingerprint(&nonce),
            })
            .await
            .map_err(store_error)?;
        Ok(ConnectOutcome::Redirect {
            url: session.auth_url,
            cookie: FlowCookie {
                connection: row.name.clone(),
                nonce,
                secure: self.callback_url.starts_with("https://"),
            },
        })
    }

    /// Finishes an authorization-code flow: checks that the browser holds
    /// the flow's cookie (`cookie`: the values of every cookie it sent, by
    /// name), takes its pending row (once), exchanges the code and stores
    /// the tokens. Returns the connection's name. A browser without the
    /// cookie (or with another) is refused and the flow stays pending for
    /// the browser that started it.
    pub async fn callback(
        &self,
        params: CallbackParams,
        cookie: impl Fn(&str) -> Option<String>,
    ) -> Result<Authorized, RegistryError> {
        self.keyring()?;
        let state = params
            .state
            .as_deref()
            .filter(|state| !state.is_empty() && state.len() <= 512)
            .ok_or_else(|| step("callback", "the redirect carries no state"))?;
        let mismatch = || {
            step(
                "callback",
                "state mismatch: no authorization is waiting for this state (used, expired or never started); press Connect again",
            )
        };
        let waiting = self
            .store
            .get_oauth_authorization(state)
            .await
            .map_err(store_error)?
            .ok_or_else(mismatch)?;
        let cookie_name = FlowCookie::name_for(&waiting.name);
        let presented = cookie(&cookie_name).map(|nonce| token_fingerprint(&nonce));
        let bound = presented.as_deref().is_some_and(|hash| {
            !waiting.browser_hash.is_empty()
                && quiver_model::token::TokenDigest::of(hash).matches(&waiting.browser_hash)
        });
        if !bound {
            tracing::warn!(
                target: "quiver::audit",
                action = "oauth_callback_refused",
                oauth_connection = %waiting.name,
                cookie = if presented.is_some() { "wrong" } else { "missing" },
                "oauth"
            );
            return Err(RegistryError::PermissionDenied(format!(
                "oauth callback: this browser did not start the authorization of connection \
                 {:?} (its cookie {cookie_name} is {}); finish it in the browser that pressed \
                 Connect, where it is still waiting, or press Connect again here",
                waiting.name,
                if presented.is_some() {
                    "wrong"
                } else {
                    "missing"
                }
            )));
        }
        let pending = self
            .store
            .take_oauth_authorization(state)
            .await
            .map_err(store_error)?
            .ok_or_else(mismatch)?;
        let authorized = Authorized {
            connection: pending.name.clone(),
            principal: pending.principal.clone(),
        };
        let grant = GrantKey {
            connection: &authorized.connection,
            principal: authorized.principal.as_deref(),
        };
        let result = self.finish_authorization(pending.clone(), &params).await;
        if grant.principal.is_none() {
            self.note_failure(grant, &result).await;
        }
        if result.is_ok() {
            audit_grant("oauth_connected", grant, "oauth-callback", None);
        }
        result.map(|()| authorized)
    }

    async fn finish_authorization(
        &self,
        pending: OAuthAuthorizationRow,
        params: &CallbackParams,
    ) -> Result<(), RegistryError> {
        if let Some(error) = &params.error {
            return Err(step(
                "authorization",
                format!(
                    "the authorization server answered {error}: {}",
                    params
                        .error_description
                        .as_deref()
                        .unwrap_or("no description")
                ),
            ));
        }
        if pending.expires_at <= Utc::now() {
            return Err(step(
                "callback",
                "the authorization expired before the browser came back; press Connect again",
            ));
        }
        let code = params
            .code
            .as_deref()
            .filter(|code| !code.is_empty())
            .ok_or_else(|| step("callback", "the redirect carries no code"))?;
        let row = self.row(&pending.name).await?;
        if row.generation != pending.generation {
            return Err(step(
                "callback",
                "the connection changed while the browser was away; press Connect again",
            ));
        }
        let spec = Self::spec_of(&row)?;
        let secret = self.secret_of(&row)?;
        let payload = self.open(&pending.state, "authorization", &pending.payload)?;
        let flow: Pending = serde_json::from_str(&payload)
            .map_err(|err| RegistryError::Internal(format!("pending authorization: {err}")))?;
        let mut manager = self.discovered(&spec, true).await?;
        let mut client = OAuthClientConfig::new(flow.client_id.clone(), flow.redirect_uri);
        if let Some(secret) = secret {
            client = client.with_client_secret(secret);
        }
        manager
            .configure_client(client)
            .map_err(|err| step("token exchange", err))?;
        manager.set_state_store(OneState::holding(pending.state.clone(), flow.state));
        let tokens = InMemoryCredentialStore::new();
        manager.set_credential_store(tokens.clone());
        bounded(
            "token exchange",
            manager.exchange_code_for_token_with_issuer(
                code,
                &pending.state,
                params.iss.as_deref(),
            ),
        )
        .await?;
        let credentials = tokens
            .load()
            .await
            .ok()
            .flatten()
            .ok_or_else(|| step("token exchange", "no token was stored"))?;
        let grant = GrantKey {
            connection: &row.name,
            principal: pending.principal.as_deref(),
        };
        self.save(grant, row.generation, &credentials, false)
            .await?;
        Ok(())
    }

    /// Stores `credentials` as `grant`'s tokens, conditional on
    /// `generation` (see [`Store::store_oauth_tokens`]).
    async fn save(
        &self,
        grant: GrantKey<'_>,
        generation: u64,
        credentials: &StoredCredentials,
        refreshed: bool,
    ) -> Result<OAuthConnectionRow, RegistryError> {
        let json = serde_json::to_string(credentials)
            .map_err(|err| RegistryError::Internal(err.to_string()))?;
        let owner = sealing_owner(grant.connection, grant.principal);
        let tokens = OAuthTokens {
            credentials: self.seal(&owner, "credentials", &json)?,
            expires_at: expiry_of(credentials),
            refreshed,
        };
        self.store
            .store_oauth_tokens(grant, generation, tokens)
            .await
            .map_err(store_error)?
            .ok_or_else(|| {
                step(
                    "token exchange",
                    "the connection changed during the request; nothing was stored",
                )
            })
    }

    async fn client_credentials(
        &self,
        row: &OAuthConnectionRow,
        spec: &OAuthConnectionSpec,
        secret: Option<String>,
        refreshed: bool,
    ) -> Result<(OAuthConnectionRow, StoredCredentials), RegistryError> {
        let (Some(client_id), Some(client_secret)) = (spec.client_id.clone(), secret) else {
            return Err(RegistryError::invalid(
                "client_secret",
                "grant \"client_credentials\" needs client_id and client_secret",
            ));
        };
        let mut manager = self.discovered(spec, false).await?;
        let config = ClientCredentialsConfig::ClientSecret {
            client_id: client_id.clone(),
            client_secret,
            scopes: spec.scopes.clone(),
            resource: Some(spec.server_url.clone()),
        };
        manager
            .configure_client_credentials(&config)
            .map_err(|err| step("client credentials", err))?;
        let response = bounded(
            "client credentials",
            manager.exchange_client_credentials(&config),
        )
        .await?;
        let credentials = StoredCredentials::new(
            client_id,
            Some(response),
            spec.scopes.clone(),
            Some(epoch_secs(Utc::now())),
        );
        let row = self
            .save(
                GrantKey::fleet(&row.name),
                row.generation,
                &credentials,
                refreshed,
            )
            .await?;
        Ok((row, credentials))
    }

    /// A current access token of connection `name` (the registry's own
    /// use: a fleet-wide grant). With [`Renewal::Rejected`] (the
    /// fingerprint of a token the server refused) a token with that
    /// fingerprint is not handed out again: it is refreshed, once across all
    /// replicas. [`Renewal::StepUp`]: see [`OAuthBroker::step_up`].
    pub async fn access_token(
        &self,
        name: &str,
        renewal: Renewal<'_>,
    ) -> Result<IssuedToken, RegistryError> {
        let actor = self.holder.clone();
        match self.access_token_for(name, None, renewal, &actor).await? {
            Issued::Token(token) => Ok(token),
            Issued::Consent(_) | Issued::NoPrincipal => Err(no_principal(name)),
        }
    }

    /// A current access token of connection `name` for a call by
    /// `principal` (a per-user connection's grant of that principal; a
    /// fleet-wide connection ignores it), asked by `actor` (the worker,
    /// audited with a step-up). A principal without a grant gets a consent
    /// link instead.
    pub async fn access_token_for(
        &self,
        name: &str,
        principal: Option<&str>,
        renewal: Renewal<'_>,
        actor: &str,
    ) -> Result<Issued, RegistryError> {
        self.keyring()?;
        let connection = self.row(name).await?;
        let spec = Self::spec_of(&connection)?;
        let grant = match (spec.per_user, principal) {
            (false, _) => GrantKey::fleet(name),
            (true, Some(principal)) => GrantKey::user(name, principal),
            (true, None) => return Ok(Issued::NoPrincipal),
        };
        let rejected = match renewal {
            Renewal::Current => None,
            Renewal::Rejected(fingerprint) => Some(fingerprint),
            Renewal::StepUp(scope) if grant.principal.is_none() => {
                return self.step_up(name, scope, actor).await.map(Issued::Token);
            }
            Renewal::StepUp(scope) => {
                return Err(step(
                    "step-up",
                    format!(
                        "per-user connection {name:?} widens no one principal's scopes (the server asked for {scope}); an admin widens its scopes, and every principal consents again"
                    ),
                ));
            }
        };
        let Some(row) = self.grant_row(grant).await? else {
            return self.consent(grant).await;
        };
        if let Some(token) = self.usable(&row, rejected)? {
            return Ok(Issued::Token(token));
        }
        let deadline = tokio::time::Instant::now() + LEASE_WAIT;
        loop {
            if self
                .store
                .acquire_oauth_lease(grant, &self.holder, LEASE_TTL)
                .await
                .map_err(store_error)?
            {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(RegistryError::Unavailable(format!(
                    "oauth {}: another registry replica has been refreshing its token for {} s",
                    whose(grant),
                    LEASE_WAIT.as_secs()
                )));
            }
            tokio::time::sleep(LEASE_POLL).await;
            let Some(row) = self.grant_row(grant).await? else {
                return self.consent(grant).await;
            };
            if let Some(token) = self.usable(&row, rejected)? {
                return Ok(Issued::Token(token));
            }
        }
        // Under the lease: another replica may have refreshed in between.
        let result = async {
            let Some(row) = self.grant_row(grant).await? else {
                return Ok(None);
            };
            if let Some(token) = self.usable(&row, rejected)? {
                return Ok(Some(token));
            }
            self.refresh(&row).await.map(Some)
        }
        .await;
        let _ = self.store.release_oauth_lease(grant, &self.holder).await;
        self.note_failure(grant, &result).await;
        match result {
            Ok(Some(token)) => Ok(Issued::Token(token)),
            // Revoked meanwhile, or its refresh token refused: the
            // principal consents (again).
            Ok(None) => self.consent(grant).await,
            Err(_) if grant.principal.is_some() && self.grant_row(grant).await?.is_none() => {
                self.consent(grant).await
            }
            Err(err) => Err(err),
        }
    }

    /// `grant`'s row when it holds tokens to use or refresh; `None` for a
    /// principal who has not consented (or must again).
    async fn grant_row(
        &self,
        grant: GrantKey<'_>,
    ) -> Result<Option<OAuthConnectionRow>, RegistryError> {
        let row = self
            .store
            .get_oauth_grant(grant)
            .await
            .map_err(store_error)?;
        Ok(match (grant.principal, row) {
            (None, None) => {
                return Err(RegistryError::NotFound(format!(
                    "oauth connection {:?} not found",
                    grant.connection
                )));
            }
            (Some(_), Some(row)) if row.status != OAuthStatus::Connected => None,
            (_, row) => row,
        })
    }

    /// A consent link for `grant`'s principal (see [`Issued::Consent`]):
    /// the principal's live one when it has one that lasts a while yet (a
    /// person may be on its way through it), else a new one. Its secret is
    /// stored as its SHA-256 and sealed, bound to the principal.
    async fn consent(&self, grant: GrantKey<'_>) -> Result<Issued, RegistryError> {
        let Some(principal) = grant.principal else {
            return Err(RegistryError::Internal(
                "a consent link for a fleet-wide connection".into(),
            ));
        };
        let owner = sealing_owner(grant.connection, Some(principal));
        let now = Utc::now();
        let lasting = now + chrono::Duration::from_std(LINK_REUSE_MARGIN).unwrap_or_default();
        let live = self
            .store
            .live_oauth_ticket(grant.connection, principal, lasting)
            .await
            .map_err(store_error)?;
        let (secret, expires_at) = match live {
            Some(ticket) => (
                self.open(&owner, "link", &ticket.sealed_secret)?,
                ticket.expires_at,
            ),
            None => {
                let secret = format!(
                    "{:032x}{:032x}",
                    rand::random::<u128>(),
                    rand::random::<u128>()
                );
                let expires_at =
                    now + chrono::Duration::from_std(AUTHORIZATION_TTL).unwrap_or_default();
                self.store
                    .create_oauth_ticket(OAuthTicketRow {
                        ticket_sha256: token_fingerprint(&secret),
                        name: grant.connection.to_owned(),
                        principal: principal.to_owned(),
                        sealed_secret: self.seal(&owner, "link", &secret)?,
                        created_at: now,
                        expires_at,
                    })
                    .await
                    .map_err(store_error)?;
                audit_grant("oauth_consent_link", grant, &self.holder, Some(expires_at));
                (secret, expires_at)
            }
        };
        Ok(Issued::Consent(ConsentLink {
            url: format!("{}{LINK_PATH}/{secret}", self.public_url),
            expires_at,
        }))
    }

    /// The first visit of a consent link: takes it (once) and starts the
    /// authorization-code flow of its principal's grant, bound to this
    /// browser like Connect. A link used, expired, unknown or of a
    /// connection no longer per user is refused naming the step, and
    /// nothing is stored.
    pub async fn follow_link(&self, secret: &str) -> Result<ConnectOutcome, RegistryError> {
        self.keyring()?;
        let refused = || {
            step(
                "link",
                "this authorization link was used already, has expired or was never issued; call the tool again for a new one",
            )
        };
        if secret.len() != 64 || !secret.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(refused());
        }
        let ticket = self
            .store
            .take_oauth_ticket(&token_fingerprint(secret))
            .await
            .map_err(store_error)?
            .ok_or_else(refused)?;
        if ticket.expires_at <= Utc::now() {
            return Err(refused());
        }
        let row = self.row(&ticket.name).await?;
        let spec = Self::spec_of(&row)?;
        if !spec.per_user {
            return Err(step(
                "link",
                format!(
                    "connection {:?} is no longer per user; call the tool again",
                    ticket.name
                ),
            ));
        }
        let secret = self.secret_of(&row)?;
        let grant = GrantKey::user(&ticket.name, &ticket.principal);
        let result = self
            .start_authorization(&row, &spec, secret, Some(&ticket.principal))
            .await;
        if result.is_ok() {
            audit_grant("oauth_consent_started", grant, "oauth-link", None);
        }
        result
    }

    /// Principals' grants of per-user connections (of `connection` and/or
    /// `principal`), never a token.
    pub async fn grants(
        &self,
        connection: Option<&str>,
        principal: Option<&str>,
    ) -> Result<Vec<OAuthGrantView>, RegistryError> {
        if let Some(connection) = connection {
            self.row(connection).await?;
        }
        let now = Utc::now();
        Ok(self
            .store
            .list_oauth_user_grants(connection, principal)
            .await
            .map_err(store_error)?
            .iter()
            .filter_map(|row| OAuthGrantView::of(row, now))
            .collect())
    }

    /// Revokes `principal`'s grant of `connection` (its tokens and pending
    /// links and flows); `actor` is audited. Workers stop using it within
    /// [`GRANT_RECHECK`].
    pub async fn revoke_grant(
        &self,
        connection: &str,
        principal: &str,
        actor: &str,
    ) -> Result<(), RegistryError> {
        if !self
            .store
            .delete_oauth_user_grant(connection, principal)
            .await
            .map_err(store_error)?
        {
            return Err(RegistryError::NotFound(format!(
                "{principal} has no grant of oauth connection {connection:?}"
            )));
        }
        audit_grant(
            "oauth_grant_revoked",
            GrantKey::user(connection, principal),
            actor,
            None,
        );
        Ok(())
    }

    /// The stored token when it may be handed out: connected, not about to
    /// expire and not the rejected one. Errors for connections that cannot
    /// give one.
    fn usable(
        &self,
        row: &OAuthConnectionRow,
        rejected: Option<&str>,
    ) -> Result<Option<IssuedToken>, RegistryError> {
        match row.status {
            OAuthStatus::NeedsReconsent => {
                return Err(step(
                    "refresh",
                    format!(
                        "connection {:?} needs re-consent: press Connect in the web admin ({})",
                        row.name,
                        row.last_error
                            .as_deref()
                            .unwrap_or("the refresh token was refused")
                    ),
                ));
            }
            OAuthStatus::NotConnected => {
                let spec = Self::spec_of(row)?;
                if spec.grant == Grant::ClientCredentials {
                    return Ok(None);
                }
                return Err(step(
                    "authorization",
                    format!(
                        "connection {:?} is not connected: press Connect in the web admin",
                        row.name
                    ),
                ));
            }
            OAuthStatus::Connected => {}
        }
        let Some(credentials) = self.credentials_of(row)? else {
            return Ok(None);
        };
        let Some(access_token) = access_token_of(&credentials) else {
            return Ok(None);
        };
        if rejected.is_some_and(|fingerprint| fingerprint == token_fingerprint(&access_token)) {
            return Ok(None);
        }
        let refresh_at = refresh_at(&credentials);
        if refresh_at.is_some_and(|at| at <= Utc::now()) {
            return Ok(None);
        }
        Ok(Some(issued(row, access_token, &credentials)?))
    }

    async fn refresh(&self, row: &OAuthConnectionRow) -> Result<IssuedToken, RegistryError> {
        let spec = Self::spec_of(row)?;
        let secret = self.secret_of(row)?;
        let credentials = self.credentials_of(row)?;
        let has_refresh_token = credentials
            .as_ref()
            .and_then(|c| c.token_response.as_ref())
            .is_some_and(|response| response.refresh_token().is_some());
        let (row, credentials) = if spec.grant == Grant::ClientCredentials && !has_refresh_token {
            let refreshed = row.status == OAuthStatus::Connected;
            self.client_credentials(row, &spec, secret, refreshed)
                .await?
        } else {
            let Some(credentials) = credentials.filter(|_| has_refresh_token) else {
                self.reconsent(row, "the token expired and no refresh token was issued")
                    .await?;
                return Err(step(
                    "refresh",
                    format!(
                        "connection {:?} needs re-consent: its token expired and it has no refresh token",
                        row.name
                    ),
                ));
            };
            let mut manager = self.discovered(&spec, false).await?;
            let mut client =
                OAuthClientConfig::new(credentials.client_id.clone(), self.callback_url.clone());
            if let Some(secret) = secret {
                client = client.with_client_secret(secret);
            }
            manager
                .configure_client(client)
                .map_err(|err| step("refresh", err))?;
            let store = InMemoryCredentialStore::new();
            store
                .save(credentials)
                .await
                .map_err(|err| step("refresh", err))?;
            manager.set_credential_store(store.clone());
            let refreshed = tokio::time::timeout(STEP_TIMEOUT, manager.refresh_token())
                .await
                .map_err(|_| step("refresh", "no answer in time"))?;
            match refreshed {
                Ok(_) => {}
                Err(AuthError::TokenRefreshRejected(reason)) => {
                    metrics::counter!("quiver_oauth_refreshes_total", "result" => "rejected")
                        .increment(1);
                    self.reconsent(row, &format!("refresh token refused: {reason}"))
                        .await?;
                    return Err(step(
                        "refresh",
                        format!(
                            "connection {:?} needs re-consent: the authorization server refused its refresh token",
                            row.name
                        ),
                    ));
                }
                Err(err) => {
                    metrics::counter!("quiver_oauth_refreshes_total", "result" => "failed")
                        .increment(1);
                    return Err(step("refresh", err));
                }
            }
            let credentials = store
                .load()
                .await
                .ok()
                .flatten()
                .ok_or_else(|| step("refresh", "no token was stored"))?;
            (
                self.save(key_of(row), row.generation, &credentials, true)
                    .await?,
                credentials,
            )
        };
        metrics::counter!("quiver_oauth_refreshes_total", "result" => "ok").increment(1);
        audit_grant(
            "oauth_refresh",
            key_of(&row),
            &self.holder,
            expiry_of(&credentials),
        );
        let access_token = access_token_of(&credentials)
            .ok_or_else(|| step("refresh", "the response carries no access token"))?;
        issued(&row, access_token, &credentials)
    }

    /// Step-up: the server answered 403 `insufficient_scope` asking for
    /// `scope`. Only within the connection's ceiling
    /// ([`OAuthConnectionSpec::scope_ceiling`]: `max_scopes`, else the
    /// configured scopes, so by default nothing widens): a scope beyond it
    /// is refused with an error naming the ceiling, and the connection is
    /// left as it is. Within it, the connection's scopes become the
    /// configured ones plus what it was granted (within the ceiling) plus
    /// what the server asks for, which drops its tokens (they were granted
    /// for less). Client credentials get a token for the wider scopes at
    /// once (through the refresh lease, so once across replicas); an
    /// authorization-code connection needs a person to consent again.
    /// Scopes asked for already change nothing: the caller gets the current
    /// token and gives up if it is the one refused, so there is no loop.
    /// `actor` (who asked: the worker) is audited.
    async fn step_up(
        &self,
        name: &str,
        scope: &str,
        actor: &str,
    ) -> Result<IssuedToken, RegistryError> {
        let row = self.row(name).await?;
        let mut spec = Self::spec_of(&row)?;
        let granted = self
            .credentials_of(&row)?
            .map(|credentials| credentials.granted_scopes)
            .unwrap_or_default();
        let missing: Vec<&str> = scope
            .split_whitespace()
            .filter(|wanted| {
                !spec
                    .scopes
                    .iter()
                    .chain(&granted)
                    .any(|known| known == wanted)
            })
            .collect();
        if missing.is_empty() {
            // Asked for already (another worker's step-up, or the server
            // asks for what it has): the current token, whose caller tries
            // once more only if it differs from the refused one.
            return Box::pin(self.access_token(name, Renewal::Current)).await;
        }
        let ceiling = spec.scope_ceiling().to_vec();
        let beyond: Vec<&str> = missing
            .iter()
            .copied()
            .filter(|wanted| !ceiling.iter().any(|allowed| allowed == wanted))
            .collect();
        if !beyond.is_empty() {
            metrics::counter!("quiver_oauth_step_ups_total", "result" => "refused").increment(1);
            tracing::warn!(
                target: "quiver::audit",
                action = "oauth_step_up_refused",
                oauth_connection = %name,
                actor = %actor,
                scope = %beyond.join(" "),
                "oauth"
            );
            let source = if spec.max_scopes.is_some() {
                "max_scopes"
            } else {
                "its configured scopes (max_scopes not set)"
            };
            return Err(step(
                "step-up",
                format!(
                    "connection {name:?} may not widen to scope {}: outside its ceiling \
                     [{}] ({source}); an admin can raise max_scopes",
                    beyond.join(" "),
                    ceiling.join(" ")
                ),
            ));
        }
        let mut scopes = spec.scopes.clone();
        for wanted in granted
            .iter()
            .map(String::as_str)
            .filter(|held| ceiling.iter().any(|allowed| allowed == held))
            .chain(missing.iter().copied())
        {
            if !scopes.iter().any(|known| known == wanted) {
                scopes.push(wanted.to_owned());
            }
        }
        spec.scopes = scopes;
        spec.validate().map_err(|err| step("step-up", err))?;
        let row = self
            .store
            .put_oauth_connection(name, spec.config_json(), SecretUpdate::Keep)
            .await
            .map_err(store_error)?;
        metrics::counter!("quiver_oauth_step_ups_total", "result" => "widened").increment(1);
        audit("oauth_step_up", name, actor, None);
        let missing = missing.join(" ");
        match spec.grant {
            Grant::ClientCredentials => Box::pin(self.access_token(name, Renewal::Current)).await,
            Grant::AuthorizationCode => {
                self.reconsent(
                    &row,
                    &format!("the server needs scope {missing}: press Connect to consent to it"),
                )
                .await?;
                Err(step(
                    "step-up",
                    format!(
                        "connection {name:?} needs re-consent: the server needs scope {missing}; press Connect in the web admin"
                    ),
                ))
            }
        }
    }

    async fn reconsent(&self, row: &OAuthConnectionRow, error: &str) -> Result<(), RegistryError> {
        self.store
            .set_oauth_needs_reconsent(key_of(row), row.generation, error)
            .await
            .map_err(store_error)?;
        audit_grant("oauth_needs_reconsent", key_of(row), &self.holder, None);
        Ok(())
    }
}

/// Whose authority a connection's tokens carry. Authorization code: the
/// person who consented, so each consent is a grant of its own (the
/// connection, the principal of a per-user grant, and the moment it was
/// connected). Client credentials: the client itself, whatever its token's
/// scopes.
fn grant_id(row: &OAuthConnectionRow) -> Result<String, RegistryError> {
    let spec = OAuthBroker::spec_of(row)?;
    let principal = match (spec.grant, &spec.client_id) {
        (Grant::ClientCredentials, Some(client_id)) => format!("client\n{client_id}"),
        _ => format!(
            "consent\n{}",
            row.connected_at
                .map(|at| at.timestamp_millis())
                .unwrap_or_default()
        ),
    };
    let owner = match &row.principal {
        None => row.name.clone(),
        Some(user) => format!("{}\nuser\n{user}", row.name),
    };
    Ok(token_fingerprint(&format!("{owner}\n{principal}"))[..16].to_owned())
}

/// The token of `row` as handed out: a principal's is asked for again
/// within [`GRANT_RECHECK`], so a revoked grant stops serving soon.
fn issued(
    row: &OAuthConnectionRow,
    access_token: String,
    credentials: &StoredCredentials,
) -> Result<IssuedToken, RegistryError> {
    let mut refresh_at = refresh_at(credentials);
    if row.principal.is_some() {
        let recheck = Utc::now() + chrono::Duration::from_std(GRANT_RECHECK).unwrap_or_default();
        refresh_at = Some(refresh_at.map_or(recheck, |at| at.min(recheck)));
    }
    Ok(IssuedToken {
        access_token,
        expires_at: expiry_of(credentials),
        refresh_at,
        grant_id: grant_id(row)?,
        per_user: row.principal.is_some(),
    })
}

fn no_principal(name: &str) -> RegistryError {
    RegistryError::FailedPrecondition(format!(
        "oauth connection {name:?} is per user: its tokens serve a caller's own requests only"
    ))
}

fn audit(action: &'static str, name: &str, actor: &str, expires_at: Option<DateTime<Utc>>) {
    audit_grant(action, GrantKey::fleet(name), actor, expires_at);
}

fn audit_grant(
    action: &'static str,
    grant: GrantKey<'_>,
    actor: &str,
    expires_at: Option<DateTime<Utc>>,
) {
    tracing::info!(
        target: "quiver::audit",
        action,
        oauth_connection = %grant.connection,
        principal = grant.principal.unwrap_or(""),
        actor = %actor,
        expires_at = ?expires_at,
        "oauth"
    );
}

/// The registry's own connections (tool previews) take their tokens
/// straight from the broker.
#[async_trait]
impl CredentialSource for OAuthBroker {
    async fn bearer(
        &self,
        grant: &GrantRef,
        renewal: Renewal<'_>,
    ) -> Result<Bearer, CredentialError> {
        let token = self
            .access_token(&grant.auth_ref, renewal)
            .await
            .map_err(|err| CredentialError::Unavailable(err.to_string()))?;
        Ok(Bearer {
            token: token.access_token,
            grant_id: token.grant_id,
            per_user: token.per_user,
        })
    }
}

#[cfg(test)]
#[path = "broker_tests.rs"]
mod tests;
