//! Callers from the organisation's identity provider (docs/reference.md
//! §12): JWTs verified locally against the issuer's JWKS ([`jwks`],
//! [`verify`]), their claims mapped to a task by the provider's rules
//! ([`rules`]), verified tokens remembered until they expire so a repeated
//! token costs a hash lookup.

pub mod jwks;
pub mod provider;
pub mod rules;
pub mod verify;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest as _, Sha256};

pub use provider::{Provider, ProviderConfig, ProviderError, RuleConfig};
pub use verify::Refused;

use crate::identity::jwks::Jwks;

/// Verified tokens remembered at most.
pub const MAX_VERIFIED_TOKENS: usize = 10_000;

/// A verified token's caller.
#[derive(Debug)]
pub struct Verified {
    /// The provider's name.
    pub provider: String,
    /// `oidc:<issuer>#<sub>`.
    pub principal: Arc<str>,
    /// The task of the first matching rule; `None`: no rule matched (403).
    pub task: Option<String>,
}

struct Remembered {
    verified: Arc<Verified>,
    /// `exp`, in seconds since the epoch.
    expires: u64,
}

/// The configured providers, their keys, and the verified tokens.
pub struct Identities {
    providers: Vec<(Provider, Jwks)>,
    verified: Mutex<HashMap<[u8; 32], Remembered>>,
}

impl std::fmt::Debug for Identities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.providers.iter().map(|(p, _)| &p.name))
            .finish()
    }
}

impl Identities {
    /// The providers; their keys are fetched on first use.
    pub fn new(providers: Vec<Provider>) -> Self {
        let client = reqwest::Client::builder()
            .timeout(jwks::FETCH_TIMEOUT)
            .connect_timeout(jwks::FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        Identities {
            providers: providers
                .into_iter()
                .map(|p| {
                    let keys = Jwks::new(&p.name, &p.issuer, client.clone());
                    (p, keys)
                })
                .collect(),
            verified: Mutex::default(),
        }
    }

    /// Whether no provider is configured.
    pub fn is_empty(&self) -> bool {
        self.providers.is_empty()
    }

    /// The caller of `token`, a JWT of one of the providers.
    pub async fn verify(&self, token: &str) -> Result<Arc<Verified>, Refused> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = now_secs();
        if let Some(found) = self
            .verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&digest)
            .filter(|r| now < r.expires)
        {
            return Ok(found.verified.clone());
        }
        let header = verify::peek(token)?;
        verify::allowed_algorithm(&header.alg)?;
        let (provider, keys) = self
            .providers
            .iter()
            .find(|(p, _)| header.iss.as_deref() == Some(p.issuer.as_str()))
            .ok_or(Refused::WrongIssuer)?;
        let claims = verify::verify(token, &header, provider, keys).await?;
        let sub = claims
            .get("sub")
            .and_then(|s| s.as_str())
            .unwrap_or_default();
        let verified = Arc::new(Verified {
            provider: provider.name.clone(),
            principal: format!("oidc:{}#{sub}", provider.issuer).into(),
            task: rules::first_match(&provider.rules, &claims).map(str::to_owned),
        });
        let expires = claims
            .get("exp")
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(0.0) as u64;
        self.remember(digest, verified.clone(), expires, now);
        Ok(verified)
    }

    fn remember(&self, digest: [u8; 32], verified: Arc<Verified>, expires: u64, now: u64) {
        if expires <= now {
            return; // accepted within the skew: not worth keeping
        }
        let mut map = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_VERIFIED_TOKENS {
            map.retain(|_, r| now < r.expires);
        }
        if map.len() >= MAX_VERIFIED_TOKENS
            && let Some(evict) = map.keys().next().copied()
        {
            map.remove(&evict);
        }
        map.insert(digest, Remembered { verified, expires });
    }

    /// Verified tokens remembered now (tests).
    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.verified.lock().unwrap().len()
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests;
