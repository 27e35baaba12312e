//! The signing keys of a provider: its OpenID discovery document names its
//! `jwks_uri`, whose keys are fetched on first use (each fetch bounded in
//! time and size) and kept. A token naming a key id the set does not hold
//! triggers one refetch, at most once per [`REFETCH_INTERVAL`] per issuer;
//! concurrent lookups share one fetch (single flight), so a flood of
//! unknown key ids costs the issuer at most one request per interval.

use std::collections::HashMap;
use std::str::FromStr as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::Value;

use quiver_model::access::check_issuer_url;

/// Time allowed for one discovery or JWKS request.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest discovery document or JWKS accepted.
pub const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;
/// At most one refetch for an unknown key id per issuer in this time.
pub const REFETCH_INTERVAL: Duration = Duration::from_secs(10);
/// While no key set was ever fetched, a failed fetch is retried after this.
pub const UNREACHABLE_RETRY: Duration = Duration::from_secs(2);
/// A key set older than this is refetched on its next use (keys the issuer
/// dropped stop verifying); if that fails the old set is kept.
pub const MAX_KEYS_AGE: Duration = Duration::from_secs(3600);

/// Algorithms a token may be signed with (the JWK must name it, or be of
/// its key type when it names none).
pub const ALLOWED: [Algorithm; 9] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// One usable signing key.
pub struct Key {
    /// The only algorithm tokens signed with this key may name.
    pub alg: Algorithm,
    /// The key.
    pub decoding: DecodingKey,
}

/// What a key lookup found.
pub enum Lookup {
    /// The key.
    Found(Arc<Key>),
    /// The issuer's set has no such key (after a refetch, or the refetch
    /// was rate-limited).
    Unknown,
    /// No key set could be fetched.
    Unreachable,
}

#[derive(Default)]
struct Keys {
    by_kid: HashMap<String, Arc<Key>>,
    /// Keys without a `kid` (a token without `kid` may use the only key).
    all: Vec<Arc<Key>>,
}

#[derive(Default)]
struct State {
    keys: Option<Arc<Keys>>,
    fetched_at: Option<Instant>,
    jwks_uri: Option<url::Url>,
    last_refetch: Option<Instant>,
    last_failure: Option<Instant>,
    /// An outage is logged once, and its end once.
    failing: bool,
}

/// The key set of one issuer. It holds no provider name (log lines take
/// the one [`Jwks::key`] is given), so a provider renamed or with new rules
/// keeps its keys as long as its issuer is the same.
pub struct Jwks {
    issuer: String,
    client: reqwest::Client,
    state: Mutex<State>,
    fetch: tokio::sync::Mutex<()>,
}

impl Jwks {
    /// The (not yet fetched) key set of `issuer`.
    pub fn new(issuer: &str, client: reqwest::Client) -> Self {
        Jwks {
            issuer: issuer.to_owned(),
            client,
            state: Mutex::default(),
            fetch: tokio::sync::Mutex::new(()),
        }
    }

    /// The key `kid` names (or the only key when the token names none),
    /// fetching the set when needed; `provider` names the issuer's provider
    /// in log lines.
    pub async fn key(&self, provider: &str, kid: Option<&str>) -> Lookup {
        if let Some(found) = self.cached(kid, true) {
            return Lookup::Found(found);
        }
        let _flight = self.fetch.lock().await;
        if let Some(found) = self.cached(kid, true) {
            return Lookup::Found(found);
        }
        let now = Instant::now();
        let fetch = {
            let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let recently_failed = state
                .last_failure
                .is_some_and(|at| now.duration_since(at) < UNREACHABLE_RETRY);
            match &state.keys {
                None => !recently_failed,
                Some(_) if self.lookup(&state, kid).is_some() => !recently_failed, // stale
                Some(_) => {
                    !recently_failed
                        && state
                            .last_refetch
                            .is_none_or(|at| now.duration_since(at) >= REFETCH_INTERVAL)
                }
            }
        };
        let mut failed = false;
        if fetch {
            let result = self.fetch_keys().await;
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if state.keys.is_some() && self.lookup(&state, kid).is_none() {
                state.last_refetch = Some(now);
            }
            match result {
                Ok((jwks_uri, keys)) => {
                    if state.failing {
                        tracing::info!(%provider, "identity provider reachable again");
                    }
                    state.failing = false;
                    state.keys = Some(Arc::new(keys));
                    state.fetched_at = Some(Instant::now());
                    state.jwks_uri = Some(jwks_uri);
                    state.last_failure = None;
                }
                Err(error) => {
                    if !state.failing {
                        tracing::warn!(%provider, issuer = %self.issuer, %error, "identity provider keys cannot be fetched; its callers are refused until it answers");
                    }
                    state.failing = true;
                    state.jwks_uri = None;
                    state.last_failure = Some(Instant::now());
                    failed = true;
                }
            }
        }
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match (&state.keys, self.lookup(&state, kid)) {
            (_, Some(found)) => Lookup::Found(found),
            (None, None) => Lookup::Unreachable,
            (Some(_), None) if failed => Lookup::Unreachable,
            (Some(_), None) => Lookup::Unknown,
        }
    }

    /// The key from the held set; with `fresh`, only from a set younger
    /// than [`MAX_KEYS_AGE`].
    fn cached(&self, kid: Option<&str>, fresh: bool) -> Option<Arc<Key>> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if fresh
            && state
                .fetched_at
                .is_none_or(|at| at.elapsed() >= MAX_KEYS_AGE)
        {
            return None;
        }
        self.lookup(&state, kid)
    }

    fn lookup(&self, state: &State, kid: Option<&str>) -> Option<Arc<Key>> {
        let keys = state.keys.as_ref()?;
        match kid {
            Some(kid) => keys.by_kid.get(kid).cloned(),
            None if keys.all.len() == 1 => keys.all.first().cloned(),
            None => None,
        }
    }

    /// Discovery (unless its `jwks_uri` is known) and the key set.
    async fn fetch_keys(&self) -> Result<(url::Url, Keys), String> {
        let known = self
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .jwks_uri
            .clone();
        let jwks_uri = match known {
            Some(uri) => uri,
            None => self.discover().await?,
        };
        let document = get_json(&self.client, jwks_uri.as_str()).await?;
        let keys = parse_keys(&document).map_err(|e| format!("{jwks_uri}: {e}"))?;
        Ok((jwks_uri, keys))
    }

    async fn discover(&self) -> Result<url::Url, String> {
        let url = format!(
            "{}/.well-known/openid-configuration",
            self.issuer.trim_end_matches('/')
        );
        let document = get_json(&self.client, &url).await?;
        let issuer = document.get("issuer").and_then(Value::as_str);
        if issuer.map(|i| i.trim_end_matches('/')) != Some(self.issuer.trim_end_matches('/')) {
            return Err(format!(
                "{url}: issuer is {issuer:?}, not the configured {:?}",
                self.issuer
            ));
        }
        let jwks_uri = document
            .get("jwks_uri")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("{url}: no jwks_uri"))?;
        check_issuer_url(jwks_uri).map_err(|e| format!("{url}: jwks_uri: {e}"))
    }
}

/// The body of an identity provider's answer from `url` as JSON, read
/// chunk by chunk up to [`MAX_DOCUMENT_BYTES`] (whatever its
/// `Content-Length` says).
pub async fn read_json(mut response: reqwest::Response, url: &str) -> Result<Value, String> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| format!("{url}: {e}"))? {
        if body.len() + chunk.len() > MAX_DOCUMENT_BYTES {
            return Err(format!(
                "{url}: document larger than the limit of {MAX_DOCUMENT_BYTES} bytes"
            ));
        }
        body.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&body).map_err(|e| format!("{url}: not JSON: {e}"))
}

/// GET `url` as JSON within [`FETCH_TIMEOUT`] and [`MAX_DOCUMENT_BYTES`]
/// (an identity provider's discovery document or key set).
pub async fn get_json(client: &reqwest::Client, url: &str) -> Result<Value, String> {
    let fetch = async {
        let response = client
            .get(url)
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("{url}: HTTP {}", response.status()));
        }
        read_json(response, url).await
    };
    tokio::time::timeout(FETCH_TIMEOUT, fetch)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "{url}: no answer within the limit of {} s",
                FETCH_TIMEOUT.as_secs()
            ))
        })
}

/// The usable signature keys of a JWKS document; keys of other uses,
/// symmetric keys and keys of refused algorithms are left out.
fn parse_keys(document: &Value) -> Result<Keys, String> {
    let list = document
        .get("keys")
        .and_then(Value::as_array)
        .ok_or("no keys array")?;
    let mut keys = Keys::default();
    for raw in list {
        let Ok(jwk) = serde_json::from_value::<Jwk>(raw.clone()) else {
            continue;
        };
        if matches!(
            jwk.common.public_key_use,
            Some(ref use_) if *use_ != PublicKeyUse::Signature
        ) {
            continue;
        }
        let Some(alg) = algorithm_of(&jwk) else {
            continue;
        };
        let Ok(decoding) = DecodingKey::from_jwk(&jwk) else {
            continue;
        };
        let key = Arc::new(Key { alg, decoding });
        if let Some(kid) = &jwk.common.key_id {
            keys.by_kid.insert(kid.clone(), key.clone());
        }
        keys.all.push(key);
    }
    Ok(keys)
}

/// The one algorithm a key verifies: the one it names, if allowed and of
/// its key type; else the usual one of its key type.
fn algorithm_of(jwk: &Jwk) -> Option<Algorithm> {
    let typical = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => Algorithm::ES256,
            EllipticCurve::P384 => Algorithm::ES384,
            _ => return None,
        },
        AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => {
            Algorithm::EdDSA
        }
        _ => return None,
    };
    let Some(named) = jwk.common.key_algorithm else {
        return Some(typical);
    };
    let named = Algorithm::from_str(&named.to_string()).ok()?;
    let fits = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => matches!(
            named,
            Algorithm::RS256
                | Algorithm::RS384
                | Algorithm::RS512
                | Algorithm::PS256
                | Algorithm::PS384
                | Algorithm::PS512
        ),
        _ => named == typical,
    };
    (fits && ALLOWED.contains(&named)).then_some(named)
}
