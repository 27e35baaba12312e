//! Handing out access tokens: a current one when it may be used, else a
//! refresh under a lease row (so of all replicas exactly one refreshes), a
//! consent link for a principal without a grant, and re-consent when the
//! authorization server refuses a refresh token.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use oauth2::TokenResponse as _;
use quiver_mcp::credentials::{
    Bearer, CredentialError, CredentialSource, GrantRef, Renewal, token_fingerprint,
};
use quiver_store::{GrantKey, OAuthConnectionRow, OAuthStatus};
use rmcp::transport::auth::{
    AuthError, CredentialStore, InMemoryCredentialStore, OAuthClientConfig, StoredCredentials,
};

use super::audit::audit_grant;
use super::connections::OAuthBroker;
use super::exchange::expiry_of;
use super::grants::ConsentLink;
use super::step::{STEP_TIMEOUT, step, store_error};
use crate::error::RegistryError;
use crate::oauth::spec::Grant;

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

impl OAuthBroker {
    /// A current access token of connection `name` (the registry's own
    /// use: a fleet-wide grant). With [`Renewal::Rejected`] (the
    /// fingerprint of a token the server refused) a token with that
    /// fingerprint is not handed out again: it is refreshed, once across all
    /// replicas. [`Renewal::StepUp`]: see `OAuthBroker::step_up`.
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
            return self.consent(grant).await.map(Issued::Consent);
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
                return self.consent(grant).await.map(Issued::Consent);
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
            Ok(None) => self.consent(grant).await.map(Issued::Consent),
            Err(_) if grant.principal.is_some() && self.grant_row(grant).await?.is_none() => {
                self.consent(grant).await.map(Issued::Consent)
            }
            Err(err) => Err(err),
        }
    }

    /// `grant`'s row when it holds tokens to use or refresh; `None` for a
    /// principal who has not consented (or must again).
    pub(super) async fn grant_row(
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

    /// The stored token when it may be handed out: connected, not about to
    /// expire and not the rejected one. Errors for connections that cannot
    /// give one.
    pub(super) fn usable(
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

    pub(super) async fn refresh(
        &self,
        row: &OAuthConnectionRow,
    ) -> Result<IssuedToken, RegistryError> {
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

    pub(super) async fn reconsent(
        &self,
        row: &OAuthConnectionRow,
        error: &str,
    ) -> Result<(), RegistryError> {
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
