//! A per-user connection's grants (R-OAUTH-8): the consent link a principal
//! without one gets, its first visit starting that principal's flow, and
//! the admin's list and revocation of grants.

use std::time::Duration;

use chrono::{DateTime, Utc};
use quiver_mcp::credentials::token_fingerprint;
use quiver_store::{GrantKey, OAuthTicketRow};

use super::audit::audit_grant;
use super::connections::{OAuthBroker, sealing_owner};
use super::flow::{AUTHORIZATION_TTL, ConnectOutcome};
use super::step::{step, store_error};
use crate::error::RegistryError;
use crate::oauth::spec::OAuthGrantView;

/// A live consent link is handed out again while it lasts at least this
/// long; closer to its expiry a new one is made.
const LINK_REUSE_MARGIN: Duration = Duration::from_secs(120);

/// Where a consent link points, below the public URL.
pub const LINK_PATH: &str = "/oauth/authorize";

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

impl OAuthBroker {
    /// A consent link for `grant`'s principal (see [`Issued::Consent`](super::Issued::Consent)):
    /// the principal's live one when it has one that lasts a while yet (a
    /// person may be on its way through it), else a new one. Its secret is
    /// stored as its SHA-256 and sealed, bound to the principal.
    pub(super) async fn consent(&self, grant: GrantKey<'_>) -> Result<ConsentLink, RegistryError> {
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
        Ok(ConsentLink {
            url: format!("{}{LINK_PATH}/{secret}", self.public_url),
            expires_at,
        })
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
    /// [`GRANT_RECHECK`](super::GRANT_RECHECK).
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
}
