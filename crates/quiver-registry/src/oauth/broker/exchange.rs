//! The authorization server's endpoints the flows share: metadata discovery,
//! the client-credentials grant, and storing what a token endpoint answered.

use chrono::{DateTime, Utc};
use oauth2::TokenResponse as _;
use quiver_store::{GrantKey, OAuthConnectionRow, OAuthTokens};
use rmcp::transport::auth::{AuthorizationManager, ClientCredentialsConfig, StoredCredentials};

use super::connections::{OAuthBroker, sealing_owner};
use super::step::{bounded, step, store_error};
use crate::error::RegistryError;
use crate::oauth::spec::OAuthConnectionSpec;

fn epoch_secs(at: DateTime<Utc>) -> u64 {
    u64::try_from(at.timestamp()).unwrap_or(0)
}

/// The expiry of stored credentials, when the server gave one.
pub(super) fn expiry_of(credentials: &StoredCredentials) -> Option<DateTime<Utc>> {
    let response = credentials.token_response.as_ref()?;
    let expires_in = response.expires_in()?;
    let received = credentials.token_received_at?;
    let received = DateTime::from_timestamp(i64::try_from(received).ok()?, 0)?;
    Some(received + chrono::Duration::from_std(expires_in).ok()?)
}

impl OAuthBroker {
    pub(super) async fn discovered(
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

    /// Stores `credentials` as `grant`'s tokens, conditional on
    /// `generation` (see [`Store::store_oauth_tokens`]).
    pub(super) async fn save(
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

    pub(super) async fn client_credentials(
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
}
