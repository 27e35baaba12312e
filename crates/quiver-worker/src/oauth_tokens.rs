//! The worker's OAuth access tokens (docs/reference.md §13.6): one cache
//! entry per OAuth connection (`http.auth_ref`), and for a per-user
//! connection one per (connection, caller principal), filled from the
//! registry and kept until the registry's `refresh_at` (shortly before
//! expiry; for a principal's grant within `GRANT_RECHECK`, so a revoked
//! grant stops serving soon). One request per entry at a time goes to the
//! registry; the others wait for it. Whether a connection is per user the
//! registry's answers tell: a connection known to be fleet-wide is asked
//! for once, whoever calls.
//! A token a server refused is named (by its SHA-256) in the next request,
//! so the registry refreshes it instead of handing it out again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use async_trait::async_trait;
use quiver_mcp::AuthorizationRequired;
use quiver_mcp::credentials::{
    Bearer, CredentialError, CredentialSource, GrantRef, Renewal, token_fingerprint,
};
use quiver_sync::{IssuedToken, RegistryTokens, TokenAnswer};
use serde::Serialize;

/// Most tokens one worker keeps (connections, and principals' grants);
/// beyond, the entry used longest ago is dropped (it is fetched again when
/// needed).
const MAX_ENTRIES: usize = 10_000;

/// What the worker knows of one OAuth connection, for `/v1/mcp/servers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CredentialStatus {
    /// A token is held and in date.
    Connected,
    /// The token held is due for refresh; the next request refreshes it.
    Expiring,
    /// The registry says a person must connect again.
    NeedsReconsent,
    /// The last request for a token failed for another reason.
    Unavailable,
}

#[derive(Default)]
struct Entry {
    token: Option<IssuedToken>,
    last_error: Option<String>,
}

/// One entry (locked while its token is asked for) and the stamp of its
/// last use.
type Slot = (Arc<tokio::sync::Mutex<Entry>>, u64);

/// An entry's key: the connection, and the principal of a per-user grant.
type Key = (String, Option<String>);

/// The cache; cheap to clone.
#[derive(Clone)]
pub struct TokenCache {
    registry: RegistryTokens,
    entries: Arc<Mutex<HashMap<Key, Slot>>>,
    /// Connections the registry last said are fleet-wide.
    fleet: Arc<Mutex<std::collections::HashSet<String>>>,
    uses: Arc<std::sync::atomic::AtomicU64>,
}

impl TokenCache {
    /// A cache in front of `registry`.
    pub fn new(registry: RegistryTokens) -> Self {
        TokenCache {
            registry,
            entries: Arc::default(),
            fleet: Arc::default(),
            uses: Arc::default(),
        }
    }

    fn entry(&self, key: &Key) -> Arc<tokio::sync::Mutex<Entry>> {
        let stamp = self.uses.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if !entries.contains_key(key) && entries.len() >= MAX_ENTRIES {
            let oldest = entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(key, _)| key.clone());
            if let Some(oldest) = oldest {
                entries.remove(&oldest);
            }
        }
        let slot = entries
            .entry(key.clone())
            .or_insert_with(|| (Arc::default(), stamp));
        slot.1 = stamp;
        slot.0.clone()
    }

    /// The entry `grant` is served from: the connection's own while it is
    /// known to be fleet-wide, else the principal's.
    fn key_of(&self, grant: &GrantRef) -> Key {
        let fleet = self.fleet.lock().unwrap_or_else(|e| e.into_inner());
        let principal = if fleet.contains(&grant.auth_ref) {
            None
        } else {
            grant.principal.clone()
        };
        (grant.auth_ref.clone(), principal)
    }

    /// Notes what the registry said of `auth_ref`: fleet-wide or per user
    /// (a connection turned per user drops its fleet-wide token).
    fn learn(&self, auth_ref: &str, per_user: bool) {
        let mut fleet = self.fleet.lock().unwrap_or_else(|e| e.into_inner());
        if per_user {
            if fleet.remove(auth_ref) {
                drop(fleet);
                self.entries
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&(auth_ref.to_owned(), None));
            }
        } else {
            fleet.insert(auth_ref.to_owned());
        }
    }

    /// Forgets `principal`'s token of `auth_ref` (its grant was revoked
    /// here).
    pub fn forget(&self, auth_ref: &str, principal: &str) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(auth_ref.to_owned(), Some(principal.to_owned())));
    }

    /// The registry's client, for the grants of a principal.
    pub fn registry(&self) -> &RegistryTokens {
        &self.registry
    }

    /// The status of connection `auth_ref` as this worker last saw it;
    /// `None` before its first use.
    pub fn status(&self, auth_ref: &str) -> Option<CredentialStatus> {
        let entry = {
            let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            entries.get(&(auth_ref.to_owned(), None))?.0.clone()
        };
        // A request in flight holds the entry; its outcome is not known yet.
        let entry = entry.try_lock().ok()?;
        if let Some(error) = &entry.last_error {
            return Some(if error.contains("needs re-consent") {
                CredentialStatus::NeedsReconsent
            } else {
                CredentialStatus::Unavailable
            });
        }
        let token = entry.token.as_ref()?;
        Some(if is_due(token) {
            CredentialStatus::Expiring
        } else {
            CredentialStatus::Connected
        })
    }
}

fn is_due(token: &IssuedToken) -> bool {
    token.refresh_at.is_some_and(|at| at <= SystemTime::now())
}

#[async_trait]
impl CredentialSource for TokenCache {
    async fn bearer(
        &self,
        grant: &GrantRef,
        renewal: Renewal<'_>,
    ) -> Result<Bearer, CredentialError> {
        let key = self.key_of(grant);
        let entry = self.entry(&key);
        let mut entry = entry.lock().await;
        let (rejected, insufficient_scope) = match renewal {
            Renewal::Current => (None, None),
            Renewal::Rejected(fingerprint) => (Some(fingerprint), None),
            Renewal::StepUp(scope) => (None, Some(scope)),
        };
        if let Some(token) = &entry.token {
            let refused =
                rejected.is_some_and(|hash| hash == token_fingerprint(&token.access_token));
            if !refused && insufficient_scope.is_none() && !is_due(token) {
                return Ok(bearer_of(token));
            }
        }
        metrics::counter!("quiver_oauth_token_requests_total").increment(1);
        let answer = self
            .registry
            .access_token(
                &grant.auth_ref,
                grant.principal.as_deref(),
                rejected,
                insufficient_scope,
            )
            .await;
        entry.token = None;
        match answer {
            Ok(TokenAnswer::Token(token)) => {
                self.learn(&grant.auth_ref, token.per_user);
                let bearer = bearer_of(&token);
                entry.token = Some(token);
                entry.last_error = None;
                Ok(bearer)
            }
            Ok(TokenAnswer::Consent(link)) => {
                self.learn(&grant.auth_ref, true);
                entry.last_error = None;
                Err(CredentialError::AuthorizationRequired(
                    AuthorizationRequired {
                        connection: grant.auth_ref.clone(),
                        principal: grant
                            .principal
                            .clone()
                            .unwrap_or_else(|| "anonymous".to_owned()),
                        url: link.url,
                    },
                ))
            }
            Ok(TokenAnswer::NoPrincipal) => {
                self.learn(&grant.auth_ref, true);
                let message = format!(
                    "oauth connection {:?} acts as each caller (per user), and this request has no caller",
                    grant.auth_ref
                );
                entry.last_error = Some(message.clone());
                Err(CredentialError::NoCaller(message))
            }
            Err(err) => {
                let message = err.to_string();
                entry.last_error = Some(message.clone());
                Err(CredentialError::Unavailable(message))
            }
        }
    }
}

fn bearer_of(token: &IssuedToken) -> Bearer {
    Bearer {
        token: token.access_token.clone(),
        grant_id: token.grant_id.clone(),
        per_user: token.per_user,
    }
}
