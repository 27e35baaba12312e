//! The worker's client of the registry's OAuth connections (docs/reference.md
//! §13.6): current access tokens, asked of the replica the sync follows with
//! the worker token. Caching is the caller's (the worker keeps each token
//! until its `refresh_at`).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use quiver_proto::v1 as pb;

use crate::SyncError;
use crate::client::Connector;

/// An access token as the registry handed it out.
#[derive(Clone)]
pub struct IssuedToken {
    /// The bearer token.
    pub access_token: String,
    /// When it expires, when known.
    pub expires_at: Option<SystemTime>,
    /// Use it until then, when known.
    pub refresh_at: Option<SystemTime>,
    /// The grant it belongs to.
    pub grant_id: String,
    /// The connection keeps one grant per caller: this is the asking
    /// principal's.
    pub per_user: bool,
}

impl std::fmt::Debug for IssuedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedToken")
            .field("expires_at", &self.expires_at)
            .field("refresh_at", &self.refresh_at)
            .field("grant_id", &self.grant_id)
            .field("per_user", &self.per_user)
            .finish_non_exhaustive()
    }
}

/// What the registry answers a token request.
#[derive(Debug, Clone)]
pub enum TokenAnswer {
    /// A current token.
    Token(IssuedToken),
    /// A per-user connection and a principal without a grant: its person
    /// consents at the link first.
    Consent(ConsentLink),
    /// A per-user connection asked without a principal.
    NoPrincipal,
}

/// A link that starts one principal's consent (a credential: never log it).
#[derive(Clone)]
pub struct ConsentLink {
    /// Absolute, single-use, bound to the principal and the connection.
    pub url: String,
    /// When it stops working, when known.
    pub expires_at: Option<SystemTime>,
}

impl std::fmt::Debug for ConsentLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsentLink")
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

/// A principal's grant of a per-user connection, as the registry shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GrantStatus {
    /// The OAuth connection.
    pub connection: String,
    /// `connected`, `expiring` or `needs_reconsent`.
    pub status: String,
    /// When its token expires, when known (Unix milliseconds).
    pub expires_at_ms: Option<i64>,
    /// When the principal consented (Unix milliseconds).
    pub connected_at_ms: Option<i64>,
    /// How often its token was refreshed.
    pub refresh_count: u64,
    /// The last failure.
    pub last_error: Option<String>,
}

fn time_of(unix_ms: i64) -> Option<SystemTime> {
    let ms = u64::try_from(unix_ms).ok().filter(|ms| *ms > 0)?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_millis(ms))
}

/// Asks the registry for access tokens; cheap to clone.
#[derive(Clone)]
pub struct RegistryTokens {
    pub(crate) connector: Arc<Connector>,
    /// This worker's id (the registry audits who asked for a step-up).
    pub(crate) worker_id: String,
}

impl RegistryTokens {
    /// A current token of connection `auth_ref` for a call by `principal`
    /// (its own grant when the connection is per user); never the one
    /// whose SHA-256 is `rejected`; with `insufficient_scope`, one for
    /// those scopes (or an error saying a person must consent to them).
    pub async fn access_token(
        &self,
        auth_ref: &str,
        principal: Option<&str>,
        rejected: Option<&str>,
        insufficient_scope: Option<&str>,
    ) -> Result<TokenAnswer, SyncError> {
        let request = pb::GetAccessTokenRequest {
            auth_ref: auth_ref.to_owned(),
            rejected_token_sha256: rejected.unwrap_or_default().to_owned(),
            insufficient_scope: insufficient_scope.unwrap_or_default().to_owned(),
            worker_id: self.worker_id.clone(),
            principal: principal.unwrap_or_default().to_owned(),
        };
        let response = self
            .connector
            .oauth_call("get access token", |mut client| async move {
                client.get_access_token(request).await
            })
            .await?;
        Ok(if !response.access_token.is_empty() {
            TokenAnswer::Token(IssuedToken {
                access_token: response.access_token,
                expires_at: time_of(response.expires_at_ms),
                refresh_at: time_of(response.refresh_at_ms),
                grant_id: response.grant_id,
                per_user: response.per_user,
            })
        } else if !response.authorization_url.is_empty() {
            TokenAnswer::Consent(ConsentLink {
                url: response.authorization_url,
                expires_at: time_of(response.authorization_expires_at_ms),
            })
        } else {
            TokenAnswer::NoPrincipal
        })
    }

    /// `principal`'s grants of per-user connections.
    pub async fn grants(&self, principal: &str) -> Result<Vec<GrantStatus>, SyncError> {
        let request = pb::ListGrantsRequest {
            principal: principal.to_owned(),
        };
        let response = self
            .connector
            .oauth_call("list grants", |mut client| async move {
                client.list_grants(request).await
            })
            .await?;
        let known = |ms: i64| (ms > 0).then_some(ms);
        Ok(response
            .grants
            .into_iter()
            .map(|grant| GrantStatus {
                connection: grant.connection,
                status: grant.status,
                expires_at_ms: known(grant.expires_at_ms),
                connected_at_ms: known(grant.connected_at_ms),
                refresh_count: grant.refresh_count,
                last_error: (!grant.last_error.is_empty()).then_some(grant.last_error),
            })
            .collect())
    }

    /// Revokes `principal`'s grant of `connection`; `Ok(false)` when it
    /// had none.
    pub async fn revoke_grant(&self, connection: &str, principal: &str) -> Result<bool, SyncError> {
        let request = pb::RevokeGrantRequest {
            connection: connection.to_owned(),
            principal: principal.to_owned(),
        };
        match self
            .connector
            .oauth_call("revoke grant", |mut client| async move {
                client.revoke_grant(request).await
            })
            .await
        {
            Ok(_) => Ok(true),
            Err(SyncError::Rpc {
                code: tonic::Code::NotFound,
                ..
            }) => Ok(false),
            Err(err) => Err(err),
        }
    }
}
