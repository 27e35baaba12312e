//! The authorization-code flow with PKCE: Connect (or a consent link)
//! starts it and stores it pending, bound to the browser by a cookie; the
//! callback takes it once, on whichever replica, and exchanges the code.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use quiver_mcp::credentials::token_fingerprint;
use quiver_store::{GrantKey, OAuthAuthorizationRow, OAuthConnectionRow};
use rmcp::transport::auth::{
    AuthError, AuthorizationRequest, AuthorizationSession, CredentialStore,
    InMemoryCredentialStore, OAuthClientConfig, StateStore, StoredAuthorizationState,
};
use serde::{Deserialize, Serialize};

use super::audit::{audit, audit_grant};
use super::connections::{CALLBACK_PATH, OAuthBroker};
use super::step::{STEP_TIMEOUT, bounded, step, store_error};
use crate::error::RegistryError;
use crate::oauth::spec::{Grant, OAuthConnectionSpec, OAuthConnectionView};

/// How long a pending authorization waits for the browser to come back.
pub const AUTHORIZATION_TTL: Duration = Duration::from_secs(600);

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

    /// Starts an authorization-code flow of `row`'s connection, for
    /// `principal`'s grant or (`None`) the connection's own.
    pub(super) async fn start_authorization(
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

    pub(super) async fn finish_authorization(
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
}
