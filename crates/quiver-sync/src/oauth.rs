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
}

impl std::fmt::Debug for IssuedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedToken")
            .field("expires_at", &self.expires_at)
            .field("refresh_at", &self.refresh_at)
            .field("grant_id", &self.grant_id)
            .finish_non_exhaustive()
    }
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
    /// A current token of connection `auth_ref`; never the one whose
    /// SHA-256 is `rejected`; with `insufficient_scope`, one for those scopes
    /// (or an error saying a person must consent to them).
    pub async fn access_token(
        &self,
        auth_ref: &str,
        rejected: Option<&str>,
        insufficient_scope: Option<&str>,
    ) -> Result<IssuedToken, SyncError> {
        let request = pb::GetAccessTokenRequest {
            auth_ref: auth_ref.to_owned(),
            rejected_token_sha256: rejected.unwrap_or_default().to_owned(),
            insufficient_scope: insufficient_scope.unwrap_or_default().to_owned(),
            worker_id: self.worker_id.clone(),
        };
        let response = self
            .connector
            .oauth_call("get access token", |mut client| async move {
                client.get_access_token(request).await
            })
            .await?;
        Ok(IssuedToken {
            access_token: response.access_token,
            expires_at: time_of(response.expires_at_ms),
            refresh_at: time_of(response.refresh_at_ms),
            grant_id: response.grant_id,
        })
    }
}
