//! Callers from the organisation's identity provider (docs/reference.md
//! §12): JWTs verified locally against the issuer's JWKS ([`jwks`],
//! [`verify`]), their claims mapped to a policy and registry roles by the
//! provider's rules ([`quiver_model::access::first_matching_rule`]),
//! verified tokens remembered until they expire so a repeated token costs a
//! hash lookup. Providers are the registry's records or a worker's
//! configuration ([`quiver_model::access::IdentityProviderRecord`]); workers
//! verify with [`Identities`], whose provider list can be replaced while it
//! serves ([`Identities::replace`]).

pub mod jwks;
pub mod provider;
pub mod verify;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use quiver_model::access::Role;
use sha2::{Digest as _, Sha256};

pub use provider::{Provider, ProviderError};
pub use verify::Refused;

use crate::jwks::Jwks;

/// Verified tokens remembered at most.
pub const MAX_VERIFIED_TOKENS: usize = 10_000;

/// A caller of a provider: of a verified token, or (for explain) of claims
/// an admin supplies ([`Provider::evaluate`]). The first rule whose claim
/// matches decides both the policy and the roles; later rules never add to
/// them. The token's claims are not kept (up to [`MAX_VERIFIED_TOKENS`] of
/// these are remembered): what a caller is, is decided when it is verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The provider's name.
    pub provider: String,
    /// The provider's issuer (the token's `iss`).
    pub issuer: String,
    /// The token's `sub`.
    pub subject: String,
    /// `oidc:<issuer>#<sub>`.
    pub principal: Arc<str>,
    /// The policy of the deciding rule; `None`: no rule matched, or the
    /// deciding rule gives registry roles only (a worker refuses it, 403).
    pub policy: Option<String>,
    /// The registry roles of the deciding rule (none when no rule matched).
    pub roles: Vec<Role>,
    /// The index of the deciding rule among the provider's rules (explain);
    /// `None`: no rule matched.
    pub rule: Option<usize>,
}

struct Remembered {
    verified: Arc<Verified>,
    /// `exp`, in seconds since the epoch.
    expires: u64,
}

/// A provider and its issuer's keys.
struct Entry {
    provider: Provider,
    keys: Arc<Jwks>,
}

/// One provider list and the tokens verified under it. A replacement makes
/// a new one with an empty cache (the rules may have changed), so a
/// verification still running under the old list remembers its caller in
/// the old cache, which goes with it.
struct Generation {
    providers: Vec<Entry>,
    verified: Mutex<HashMap<[u8; 32], Remembered>>,
}

impl Generation {
    /// `providers`, with the keys of `previous` entries of the same issuer.
    fn new(providers: Vec<Provider>, previous: &[Entry], client: &reqwest::Client) -> Self {
        let providers = providers
            .into_iter()
            .map(|provider| {
                let keys = previous
                    .iter()
                    .find(|entry| entry.provider.issuer == provider.issuer)
                    .map_or_else(
                        || Arc::new(Jwks::new(&provider.issuer, client.clone())),
                        |entry| entry.keys.clone(),
                    );
                Entry { provider, keys }
            })
            .collect();
        Generation {
            providers,
            verified: Mutex::default(),
        }
    }

    fn remembered(&self, digest: &[u8; 32], now: u64) -> Option<Arc<Verified>> {
        self.verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(digest)
            .filter(|r| now < r.expires)
            .map(|r| r.verified.clone())
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
}

/// The providers, their keys, and the verified tokens. The provider list
/// may be empty (a worker following a registry that holds none yet) and
/// replaced while tokens are being verified.
pub struct Identities {
    client: reqwest::Client,
    current: ArcSwap<Generation>,
}

impl std::fmt::Debug for Identities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(
                self.current
                    .load()
                    .providers
                    .iter()
                    .map(|e| &e.provider.name),
            )
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
        let current = ArcSwap::from_pointee(Generation::new(providers, &[], &client));
        Identities { client, current }
    }

    /// Swaps in a new provider list. A provider whose issuer was already
    /// served keeps its fetched keys (a rule or policy edit costs the issuer
    /// no request); the verified tokens are forgotten, since the rules that
    /// mapped them may have changed.
    pub fn replace(&self, providers: Vec<Provider>) {
        let next = Generation::new(providers, &self.current.load().providers, &self.client);
        self.current.store(Arc::new(next));
    }

    /// Whether no provider is configured.
    pub fn is_empty(&self) -> bool {
        self.current.load().providers.is_empty()
    }

    /// The caller of `token`, a JWT of one of the providers (none: refused
    /// as [`Refused::WrongIssuer`]).
    pub async fn verify(&self, token: &str) -> Result<Arc<Verified>, Refused> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = now_secs();
        // Held across the key fetch: a replacement meanwhile does not change
        // the provider this token is verified against.
        let generation = self.current.load_full();
        if let Some(found) = generation.remembered(&digest, now) {
            return Ok(found);
        }
        let header = verify::peek(token)?;
        verify::allowed_algorithm(&header.alg)?;
        let entry = generation
            .providers
            .iter()
            .find(|e| header.iss.as_deref() == Some(e.provider.issuer.as_str()))
            .ok_or(Refused::WrongIssuer)?;
        let claims = verify::verify(token, &header, &entry.provider, &entry.keys).await?;
        let sub = claims
            .get("sub")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default();
        let verified = Arc::new(entry.provider.evaluate(sub, &claims));
        let expires = claims
            .get("exp")
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(0.0) as u64;
        generation.remember(digest, verified.clone(), expires, now);
        Ok(verified)
    }

    /// Verified tokens remembered now (tests).
    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.current.load().verified.lock().unwrap().len()
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests;
