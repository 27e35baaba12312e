//! The worker's OAuth access tokens (docs/reference.md §13.6): one cache
//! entry per OAuth connection (`http.auth_ref`), filled from the registry and
//! kept until the registry's `refresh_at`, shortly before expiry. One request
//! per connection at a time goes to the registry; the others wait for it.
//! A token a server refused is named (by its SHA-256) in the next request,
//! so the registry refreshes it instead of handing it out again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use async_trait::async_trait;
use quiver_mcp::credentials::{Bearer, CredentialSource, Renewal, token_fingerprint};
use quiver_sync::{IssuedToken, RegistryTokens};
use serde::Serialize;

/// Most OAuth connections whose tokens one worker keeps; beyond, the entry
/// used longest ago is dropped (it is fetched again when needed).
const MAX_CONNECTIONS: usize = 1024;

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

/// One connection's entry (locked while its token is asked for) and the
/// stamp of its last use.
type Slot = (Arc<tokio::sync::Mutex<Entry>>, u64);

/// The cache; cheap to clone.
#[derive(Clone)]
pub struct TokenCache {
    registry: RegistryTokens,
    entries: Arc<Mutex<HashMap<String, Slot>>>,
    uses: Arc<std::sync::atomic::AtomicU64>,
}

impl TokenCache {
    /// A cache in front of `registry`.
    pub fn new(registry: RegistryTokens) -> Self {
        TokenCache {
            registry,
            entries: Arc::default(),
            uses: Arc::default(),
        }
    }

    fn entry(&self, auth_ref: &str) -> Arc<tokio::sync::Mutex<Entry>> {
        let stamp = self.uses.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if !entries.contains_key(auth_ref) && entries.len() >= MAX_CONNECTIONS {
            let oldest = entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(name, _)| name.clone());
            if let Some(oldest) = oldest {
                entries.remove(&oldest);
            }
        }
        let slot = entries
            .entry(auth_ref.to_owned())
            .or_insert_with(|| (Arc::default(), stamp));
        slot.1 = stamp;
        slot.0.clone()
    }

    /// The status of connection `auth_ref` as this worker last saw it;
    /// `None` before its first use.
    pub fn status(&self, auth_ref: &str) -> Option<CredentialStatus> {
        let entry = {
            let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            entries.get(auth_ref)?.0.clone()
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
    async fn bearer(&self, auth_ref: &str, renewal: Renewal<'_>) -> Result<Bearer, String> {
        let entry = self.entry(auth_ref);
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
                return Ok(Bearer {
                    token: token.access_token.clone(),
                    grant_id: token.grant_id.clone(),
                });
            }
        }
        metrics::counter!("quiver_oauth_token_requests_total").increment(1);
        match self
            .registry
            .access_token(auth_ref, rejected, insufficient_scope)
            .await
        {
            Ok(token) => {
                let bearer = Bearer {
                    token: token.access_token.clone(),
                    grant_id: token.grant_id.clone(),
                };
                entry.token = Some(token);
                entry.last_error = None;
                Ok(bearer)
            }
            Err(err) => {
                let message = err.to_string();
                entry.token = None;
                entry.last_error = Some(message.clone());
                Err(message)
            }
        }
    }
}
