//! The broker itself: its store, keyring and public URL, how it seals and
//! opens a connection's secrets, and the admin's reads and writes of
//! connection settings.

use std::sync::Arc;

use chrono::Utc;
use quiver_store::{GrantKey, OAuthConnectionRow, SecretUpdate, Store};
use rmcp::transport::auth::StoredCredentials;

use super::audit::audit;
use super::step::{STEP_TIMEOUT, store_error};
use crate::error::RegistryError;
use crate::oauth::egress::EgressOAuthClient;
use crate::oauth::seal::Keyring;
use crate::oauth::spec::{OAuthConnectionSpec, OAuthConnectionView, check_name};

/// The path the flow cookie is sent to.
pub const CALLBACK_PATH: &str = "/admin/oauth/callback";

/// The broker.
#[derive(Clone)]
pub struct OAuthBroker {
    pub(super) store: Arc<dyn Store>,
    pub(super) keyring: Option<Keyring>,
    /// Where browsers reach the registry (consent links).
    pub(super) public_url: String,
    pub(super) callback_url: String,
    pub(super) holder: String,
    /// The registry's egress allowlist over every request of a flow; `None`
    /// (no allowlist): rmcp's own client.
    pub(super) egress: Option<Arc<EgressOAuthClient>>,
}

impl std::fmt::Debug for OAuthBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthBroker")
            .field("keyring", &self.keyring)
            .field("callback_url", &self.callback_url)
            .finish_non_exhaustive()
    }
}

fn binding(name: &str, column: &str) -> String {
    format!("{name}/{column}")
}

/// What a grant's sealed tokens are bound to: its connection, and the
/// principal of a per-user grant (connection names hold no '/'), so one
/// principal's tokens never open as another's.
pub(super) fn sealing_owner(name: &str, principal: Option<&str>) -> String {
    match principal {
        None => name.to_owned(),
        Some(principal) => format!("{name}/{principal}"),
    }
}

impl OAuthBroker {
    /// A broker over `store`; without a keyring every operation that would
    /// store a secret is refused, naming the missing setting.
    /// `public_url` is where browsers reach the registry: authorization
    /// servers send them back to its [`CALLBACK_PATH`], consent links point
    /// below its [`LINK_PATH`](super::LINK_PATH); `holder` names this replica in leases.
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
                EgressOAuthClient::new(egress, STEP_TIMEOUT).map_err(RegistryError::Internal)?,
            ))
        };
        Ok(self)
    }

    pub(super) fn keyring(&self) -> Result<&Keyring, RegistryError> {
        self.keyring.as_ref().ok_or_else(|| {
            RegistryError::FailedPrecondition(
                "the registry has no oauth key: set QUIVER_OAUTH_KEYS or --oauth-key-file".into(),
            )
        })
    }

    pub(super) fn open(
        &self,
        name: &str,
        column: &str,
        sealed: &str,
    ) -> Result<String, RegistryError> {
        self.keyring()?
            .open(&binding(name, column), sealed)
            .map_err(|err| RegistryError::Internal(format!("oauth connection {name:?}: {err}")))
    }

    pub(super) fn seal(
        &self,
        name: &str,
        column: &str,
        plaintext: &str,
    ) -> Result<String, RegistryError> {
        Ok(self.keyring()?.seal(&binding(name, column), plaintext))
    }

    pub(super) async fn row(&self, name: &str) -> Result<OAuthConnectionRow, RegistryError> {
        self.store
            .get_oauth_connection(name)
            .await
            .map_err(store_error)?
            .ok_or_else(|| RegistryError::NotFound(format!("oauth connection {name:?} not found")))
    }

    pub(super) fn spec_of(row: &OAuthConnectionRow) -> Result<OAuthConnectionSpec, RegistryError> {
        serde_json::from_str(&row.config).map_err(|err| {
            RegistryError::Internal(format!("stored oauth connection {:?}: {err}", row.name))
        })
    }

    pub(super) fn secret_of(
        &self,
        row: &OAuthConnectionRow,
    ) -> Result<Option<String>, RegistryError> {
        row.client_secret
            .as_deref()
            .map(|sealed| self.open(&row.name, "client_secret", sealed))
            .transpose()
    }

    pub(super) fn credentials_of(
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

    pub(super) async fn note_failure<T>(
        &self,
        grant: GrantKey<'_>,
        result: &Result<T, RegistryError>,
    ) {
        if let Err(err) = result
            && matches!(err, RegistryError::McpUnavailable { .. })
        {
            let _ = self.store.set_oauth_error(grant, &err.to_string()).await;
        }
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
}
