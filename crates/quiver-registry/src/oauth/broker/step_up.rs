//! Step-up: widening a connection's scopes when its server answers 403
//! `insufficient_scope`, within the ceiling an admin set.

use quiver_mcp::credentials::Renewal;
use quiver_store::SecretUpdate;

use super::audit::audit;
use super::connections::OAuthBroker;
use super::step::{step, store_error};
use super::tokens::IssuedToken;
use crate::error::RegistryError;
use crate::oauth::spec::Grant;

impl OAuthBroker {
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
    pub(super) async fn step_up(
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
}
