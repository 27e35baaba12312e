//! An OpenID Connect issuer for tests: signing keys published as a JWKS, and
//! an admin endpoint that mints JWTs, good or deliberately bad, so a
//! verifier (the worker's OIDC callers) can be tested against a real issuer
//! process.
//!
//! [`OAuthServer`](crate::oauth_server::OAuthServer) serves it on its base
//! URL `B` (the issuer): `B/.well-known/openid-configuration` names
//! `jwks_uri` = `B/jwks`, which lists the current signing keys (one ES256
//! P-256 key and one RS256 key, each with `kid`, `alg` and `use: "sig"`).
//! `POST B/admin/oidc/mint` signs the claims it is given (over defaults for
//! `iss`, `sub`, `aud`, `iat`, `exp`) with a key of the JWKS, with a
//! throwaway key under a `kid` the JWKS does not list, as `alg: none`, or as
//! HS256 keyed with the public key's PEM (the algorithm-confusion attack).
//! `POST B/admin/oidc/rotate` adds new current keys and may drop the old
//! ones. `GET B/admin/stats` counts JWKS and discovery fetches, so a test can
//! see how often a verifier comes back for keys.
//!
//! It is also the provider of an OpenID Connect sign-in (authorization code
//! flow with PKCE): a code granted for scope `openid` is exchanged at
//! `B/token` for an `id_token` as well ([`OidcIssuer::id_token`], signed by
//! [`OidcIssuer::mint`] with the current ES256 key), whose claims are those
//! of the person signing in, set by `POST B/admin/oidc/person`
//! ([`OidcIssuer::set_person`]).
//!
//! Keys are generated (aws-lc-rs, through `rcgen`) the first time they are
//! needed and held in memory only; tokens are signed with `jsonwebtoken`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::{Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// Default lifetime of a minted token (`ttl_secs`).
pub const DEFAULT_TOKEN_TTL_SECS: i64 = 300;
/// Largest `|ttl_secs|` accepted, so `exp` never overflows.
pub const MAX_TOKEN_TTL_SECS: i64 = 366 * 24 * 3600;
/// Most keys the JWKS holds; a rotation beyond it drops the oldest.
pub const MAX_KEYS: usize = 64;
/// Default `sub` of a minted token.
pub const DEFAULT_SUBJECT: &str = "test-user";
/// Default `aud` of a minted token.
pub const DEFAULT_AUDIENCE: &str = "quiver";
/// The scope that makes a code exchange return an `id_token`.
pub const OPENID_SCOPE: &str = "openid";
/// Lifetime of an `id_token` (`exp` - `iat`).
pub const ID_TOKEN_TTL_SECS: i64 = 300;
/// `sub` of the person signing in until `POST /admin/oidc/person` names
/// another.
pub const DEFAULT_PERSON_SUBJECT: &str = "testkit-user";
/// Claims of an `id_token` that the server sets, so a person cannot.
const SERVER_CLAIMS: [&str; 5] = ["iss", "aud", "iat", "exp", "nonce"];
/// Largest body of the `/admin/oidc/*` endpoints.
const MAX_BODY_BYTES: usize = 64 * 1024;
/// Longest `kid` a mint request may name.
const MAX_KID_LEN: usize = 256;

/// How a minted token is signed (`alg` of a mint request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum MintAlg {
    /// ECDSA P-256 with SHA-256.
    #[serde(rename = "ES256")]
    Es256,
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    #[serde(rename = "RS256")]
    Rs256,
    /// Header `{"alg":"none"}` (with the `kid` of the current key) and an
    /// empty signature: an unsigned token.
    #[serde(rename = "none")]
    None,
    /// Header `alg: HS256` with a key's `kid`, HMAC-SHA256 keyed with that
    /// key's public PEM (SubjectPublicKeyInfo): the algorithm-confusion
    /// attack on verifiers that take the algorithm from the token.
    #[serde(rename = "HS256-with-public-key")]
    Hs256WithPublicKey,
}

impl MintAlg {
    /// The signing algorithm of a real key, if this is one.
    fn key_algorithm(self) -> Option<Algorithm> {
        match self {
            MintAlg::Es256 => Some(Algorithm::ES256),
            MintAlg::Rs256 => Some(Algorithm::RS256),
            MintAlg::None | MintAlg::Hs256WithPublicKey => None,
        }
    }
}

/// The body of `POST /admin/oidc/mint`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MintRequest {
    /// Claims merged over the defaults (`iss`, `sub`, `aud`, `iat`, `exp`);
    /// a claim given as `null` is removed.
    #[serde(default)]
    pub claims: Map<String, Value>,
    /// The `kid` of the header: a key of the JWKS signs; any other value
    /// gets a fresh throwaway key that the JWKS never lists.
    pub kid: Option<String>,
    /// How to sign (default: ES256, the current key's algorithm).
    pub alg: Option<MintAlg>,
    /// `exp` = now + this (default [`DEFAULT_TOKEN_TTL_SECS`]); negative: an
    /// already expired token.
    pub ttl_secs: Option<i64>,
}

/// A mint request refused: 400 naming the field.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct MintError(String);

/// Claims of a person refused by [`OidcIssuer::set_person`]: 400 naming
/// the claim.
#[derive(Debug, thiserror::Error)]
pub enum PersonError {
    /// `sub` is missing or not a non-empty string.
    #[error("sub: a non-empty string is required")]
    Subject,
    /// A claim the server sets on each `id_token` ([`OidcIssuer::id_token`]).
    #[error("{0}: set by the server on each id_token, not by the person")]
    ServerClaim(String),
}

/// Counters of the issuer's endpoints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OidcStats {
    /// `GET /jwks` answered.
    pub jwks_fetches: u64,
    /// `GET /.well-known/openid-configuration` answered.
    pub discovery_fetches: u64,
    /// `id_token`s issued by code exchanges ([`OidcIssuer::id_token`]).
    pub id_tokens_issued: u64,
}

/// One signing key.
struct SigningKey {
    kid: String,
    alg: Algorithm,
    encoding: EncodingKey,
    /// The public JWK as the JWKS lists it.
    jwk: Value,
    /// SubjectPublicKeyInfo PEM (the HS256 confusion attack's "secret").
    public_pem: String,
}

impl SigningKey {
    /// A fresh key for `alg` (ES256 or RS256) named `kid`.
    fn generate(alg: Algorithm, kid: String) -> anyhow::Result<Self> {
        let (pair, encoding) = match alg {
            Algorithm::ES256 => {
                let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
                let encoding = EncodingKey::from_ec_der(&pair.serialize_der());
                (pair, encoding)
            }
            Algorithm::RS256 => {
                let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256)?;
                // PKCS#8 PEM: jsonwebtoken takes RSA keys as PKCS#1 DER or PEM.
                let encoding = EncodingKey::from_rsa_pem(pair.serialize_pem().as_bytes())?;
                (pair, encoding)
            }
            other => anyhow::bail!("no key generation for {other:?}"),
        };
        let mut jwk = Jwk::from_encoding_key(&encoding, alg)?;
        jwk.common.key_id = Some(kid.clone());
        jwk.common.public_key_use = Some(PublicKeyUse::Signature);
        Ok(Self {
            kid,
            alg,
            encoding,
            jwk: serde_json::to_value(&jwk)?,
            public_pem: pair.public_key_pem(),
        })
    }
}

/// The keys, oldest first; the last of each algorithm is its current one.
struct Keys {
    keys: Vec<SigningKey>,
    /// Rotations so far (part of each `kid`).
    generation: u64,
}

impl Keys {
    fn new() -> anyhow::Result<Self> {
        let mut keys = Self {
            keys: Vec::new(),
            generation: 0,
        };
        keys.add_generation()?;
        Ok(keys)
    }

    /// Adds a new current ES256 and RS256 key; the new ES256 key's `kid`.
    fn add_generation(&mut self) -> anyhow::Result<String> {
        self.generation += 1;
        let tag: [u8; 4] = rand::random();
        let tag = tag.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let es =
            SigningKey::generate(Algorithm::ES256, format!("es256-{}-{tag}", self.generation))?;
        let rs =
            SigningKey::generate(Algorithm::RS256, format!("rs256-{}-{tag}", self.generation))?;
        let kid = es.kid.clone();
        self.keys.push(es);
        self.keys.push(rs);
        while self.keys.len() > MAX_KEYS {
            self.keys.remove(0);
        }
        Ok(kid)
    }

    fn current(&self, alg: Algorithm) -> &SigningKey {
        self.keys
            .iter()
            .rev()
            .find(|key| key.alg == alg)
            .expect("every generation holds a key of each algorithm")
    }

    fn by_kid(&self, kid: &str) -> Option<&SigningKey> {
        self.keys.iter().find(|key| key.kid == kid)
    }
}

/// The issuer; share it with `Arc`.
pub struct OidcIssuer {
    issuer: String,
    /// `None` until first needed (RSA key generation is not free).
    keys: Mutex<Option<Keys>>,
    /// The claims of the person signing in (always a string `sub`).
    person: Mutex<Map<String, Value>>,
    jwks_fetches: AtomicU64,
    discovery_fetches: AtomicU64,
    id_tokens_issued: AtomicU64,
}

impl OidcIssuer {
    /// An issuer named `issuer` (the base URL, no trailing slash).
    pub fn new(issuer: &str) -> Self {
        Self {
            issuer: issuer.trim_end_matches('/').to_owned(),
            keys: Mutex::new(None),
            person: Mutex::new(Map::from_iter([(
                "sub".to_owned(),
                json!(DEFAULT_PERSON_SUBJECT),
            )])),
            jwks_fetches: AtomicU64::new(0),
            discovery_fetches: AtomicU64::new(0),
            id_tokens_issued: AtomicU64::new(0),
        }
    }

    /// The issuer (`iss` of minted tokens).
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// `issuer` + `/jwks`.
    pub fn jwks_uri(&self) -> String {
        format!("{}/jwks", self.issuer)
    }

    /// The counters so far.
    pub fn stats(&self) -> OidcStats {
        OidcStats {
            jwks_fetches: self.jwks_fetches.load(Ordering::Relaxed),
            discovery_fetches: self.discovery_fetches.load(Ordering::Relaxed),
            id_tokens_issued: self.id_tokens_issued.load(Ordering::Relaxed),
        }
    }

    /// Counts one discovery fetch; the fields OpenID discovery adds to the
    /// authorization server's metadata.
    pub fn discovery_fields(&self) -> Value {
        self.discovery_fetches.fetch_add(1, Ordering::Relaxed);
        json!({
            "jwks_uri": self.jwks_uri(),
            "id_token_signing_alg_values_supported": ["ES256", "RS256"],
            "subject_types_supported": ["public"],
        })
    }

    /// The keys, generated on first use.
    fn keys(&self) -> anyhow::Result<MutexGuard<'_, Option<Keys>>> {
        let mut keys = self
            .keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if keys.is_none() {
            *keys = Some(Keys::new()?);
        }
        Ok(keys)
    }

    /// The JWKS document (not counted as a fetch).
    pub fn jwks(&self) -> anyhow::Result<Value> {
        let guard = self.keys()?;
        let keys = guard.as_ref().expect("initialised by keys()");
        Ok(json!({"keys": keys.keys.iter().map(|key| key.jwk.clone()).collect::<Vec<_>>()}))
    }

    /// The `kid` of the current key (ES256).
    pub fn current_kid(&self) -> anyhow::Result<String> {
        let guard = self.keys()?;
        let keys = guard.as_ref().expect("initialised by keys()");
        Ok(keys.current(Algorithm::ES256).kid.clone())
    }

    /// The SubjectPublicKeyInfo PEM of the listed key `kid` (what
    /// [`MintAlg::Hs256WithPublicKey`] keys its HMAC with).
    pub fn public_pem(&self, kid: &str) -> anyhow::Result<Option<String>> {
        let guard = self.keys()?;
        let keys = guard.as_ref().expect("initialised by keys()");
        Ok(keys.by_kid(kid).map(|key| key.public_pem.clone()))
    }

    /// Adds new current keys (ES256 and RS256); with `drop_old`, removes all
    /// others from the JWKS. The new ES256 key's `kid`.
    pub fn rotate(&self, drop_old: bool) -> anyhow::Result<String> {
        let mut guard = self.keys()?;
        let keys = guard.as_mut().expect("initialised by keys()");
        let kid = keys.add_generation()?;
        if drop_old {
            let keep = keys.keys.len() - 2;
            keys.keys.drain(..keep);
        }
        Ok(kid)
    }

    /// A token as `request` asks for.
    pub fn mint(&self, request: MintRequest) -> Result<String, MintError> {
        let ttl = request.ttl_secs.unwrap_or(DEFAULT_TOKEN_TTL_SECS);
        if ttl.abs() > MAX_TOKEN_TTL_SECS {
            return Err(MintError(format!(
                "ttl_secs: at most {MAX_TOKEN_TTL_SECS} either way, got {ttl}"
            )));
        }
        if let Some(kid) = &request.kid
            && (kid.is_empty() || kid.len() > MAX_KID_LEN)
        {
            return Err(MintError(format!(
                "kid: 1 to {MAX_KID_LEN} characters, got {}",
                kid.len()
            )));
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        let now = i64::try_from(now).unwrap_or(i64::MAX);
        let mut claims = Map::new();
        claims.insert("iss".into(), json!(self.issuer));
        claims.insert("sub".into(), json!(DEFAULT_SUBJECT));
        claims.insert("aud".into(), json!(DEFAULT_AUDIENCE));
        claims.insert("iat".into(), json!(now));
        claims.insert("exp".into(), json!(now + ttl));
        for (name, value) in request.claims {
            if value.is_null() {
                claims.remove(&name);
            } else {
                claims.insert(name, value);
            }
        }
        let internal = |err: anyhow::Error| MintError(format!("signing failed: {err:#}"));
        let guard = self.keys().map_err(internal)?;
        let keys = guard.as_ref().expect("initialised by keys()");
        let alg = request.alg.unwrap_or(MintAlg::Es256);
        // The key named by `kid`, the current one of `alg`, or a throwaway
        // key that no JWKS lists.
        let throwaway;
        let key = match (&request.kid, alg.key_algorithm()) {
            (Some(kid), algorithm) => match keys.by_kid(kid) {
                Some(key) => {
                    if algorithm.is_some_and(|algorithm| algorithm != key.alg) {
                        return Err(MintError(format!(
                            "alg: key {kid:?} is a {:?} key",
                            key.alg
                        )));
                    }
                    key
                }
                None => {
                    throwaway =
                        SigningKey::generate(algorithm.unwrap_or(Algorithm::ES256), kid.clone())
                            .map_err(internal)?;
                    &throwaway
                }
            },
            (None, Some(algorithm)) => keys.current(algorithm),
            (None, None) => keys.current(Algorithm::ES256),
        };
        let claims = Value::Object(claims);
        match alg {
            MintAlg::Es256 | MintAlg::Rs256 => {
                let mut header = Header::new(key.alg);
                header.kid = Some(key.kid.clone());
                jsonwebtoken::encode(&header, &claims, &key.encoding)
                    .map_err(|err| internal(err.into()))
            }
            MintAlg::Hs256WithPublicKey => {
                let mut header = Header::new(Algorithm::HS256);
                header.kid = Some(key.kid.clone());
                let secret = EncodingKey::from_secret(key.public_pem.as_bytes());
                jsonwebtoken::encode(&header, &claims, &secret).map_err(|err| internal(err.into()))
            }
            MintAlg::None => {
                let header = json!({"alg": "none", "typ": "JWT", "kid": key.kid});
                let part = |value: &Value| URL_SAFE_NO_PAD.encode(value.to_string());
                Ok(format!("{}.{}.", part(&header), part(&claims)))
            }
        }
    }

    /// The person signing in: the claims of the `id_token`s issued from
    /// now on, but for the ones the server sets (`iss`, `aud`, `iat`, `exp`,
    /// `nonce`). `sub` must be a non-empty string; a claim given as `null`
    /// is left out.
    pub fn set_person(&self, claims: Map<String, Value>) -> Result<(), PersonError> {
        if let Some(claim) = SERVER_CLAIMS
            .iter()
            .find(|claim| claims.contains_key(**claim))
        {
            return Err(PersonError::ServerClaim((*claim).to_owned()));
        }
        if claims
            .get("sub")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            return Err(PersonError::Subject);
        }
        *self.person_claims() = claims;
        Ok(())
    }

    /// The claims of the person signing in (default: `sub`
    /// [`DEFAULT_PERSON_SUBJECT`] alone).
    pub fn person(&self) -> Map<String, Value> {
        self.person_claims().clone()
    }

    fn person_claims(&self) -> MutexGuard<'_, Map<String, Value>> {
        self.person
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts and mints the `id_token` of a code exchange by `client_id`:
    /// the person's claims, `iss` (the issuer), `aud` = `client_id`, `iat`,
    /// `exp` = `iat` + [`ID_TOKEN_TTL_SECS`] and `nonce` when the
    /// authorization request had one; signed with the current ES256 key.
    pub async fn id_token(
        self: &Arc<Self>,
        client_id: &str,
        nonce: Option<&str>,
    ) -> Result<String, MintError> {
        let mut claims = self.person();
        claims.insert("aud".to_owned(), json!(client_id));
        if let Some(nonce) = nonce {
            claims.insert("nonce".to_owned(), json!(nonce));
        }
        let request = MintRequest {
            claims,
            ttl_secs: Some(ID_TOKEN_TTL_SECS),
            ..MintRequest::default()
        };
        // The first use generates the keys: off the runtime.
        let issuer = self.clone();
        let token = tokio::task::spawn_blocking(move || issuer.mint(request))
            .await
            .map_err(|err| MintError(format!("signing failed: {err}")))??;
        self.id_tokens_issued.fetch_add(1, Ordering::Relaxed);
        Ok(token)
    }

    /// `GET /jwks`, `POST /admin/oidc/mint`, `POST /admin/oidc/rotate` and
    /// `POST /admin/oidc/person` (discovery is the authorization server's
    /// metadata route, which adds [`OidcIssuer::discovery_fields`]).
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new()
            .route("/jwks", get(jwks))
            .route("/admin/oidc/mint", post(mint))
            .route("/admin/oidc/rotate", post(rotate))
            .route("/admin/oidc/person", post(person))
            .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
            .with_state(self.clone())
    }
}

fn bad_request(message: String) -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(json!({"error": "invalid_request", "error_description": message})),
    )
        .into_response()
}

fn internal_error(err: &anyhow::Error) -> Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        axum::Json(json!({"error": "server_error", "error_description": format!("{err:#}")})),
    )
        .into_response()
}

async fn jwks(State(issuer): State<Arc<OidcIssuer>>) -> Response {
    issuer.jwks_fetches.fetch_add(1, Ordering::Relaxed);
    // The first use generates the keys: off the runtime.
    match tokio::task::spawn_blocking(move || issuer.jwks()).await {
        Ok(Ok(jwks)) => axum::Json(jwks).into_response(),
        Ok(Err(err)) => internal_error(&err),
        Err(err) => internal_error(&err.into()),
    }
}

async fn mint(State(issuer): State<Arc<OidcIssuer>>, body: Bytes) -> Response {
    let mut deserializer = serde_json::Deserializer::from_slice(&body);
    let request: MintRequest = match serde_path_to_error::deserialize(&mut deserializer) {
        Ok(request) => request,
        Err(err) => return bad_request(format!("{}: {}", err.path(), err.inner())),
    };
    // Key generation (a throwaway RSA key) may take a while: off the runtime.
    match tokio::task::spawn_blocking(move || issuer.mint(request)).await {
        Ok(Ok(token)) => axum::Json(json!({"token": token})).into_response(),
        Ok(Err(MintError(message))) => bad_request(message),
        Err(err) => internal_error(&err.into()),
    }
}

/// The body of `POST /admin/oidc/rotate` (may be empty).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RotateRequest {
    #[serde(default)]
    drop_old: bool,
}

async fn rotate(State(issuer): State<Arc<OidcIssuer>>, body: Bytes) -> Response {
    let request: RotateRequest = if body.iter().all(u8::is_ascii_whitespace) {
        RotateRequest::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(request) => request,
            Err(err) => return bad_request(format!("expected {{\"drop_old\": bool}}: {err}")),
        }
    };
    match tokio::task::spawn_blocking(move || issuer.rotate(request.drop_old)).await {
        Ok(Ok(kid)) => axum::Json(json!({"kid": kid})).into_response(),
        Ok(Err(err)) => internal_error(&err),
        Err(err) => internal_error(&err.into()),
    }
}

/// `POST /admin/oidc/person`: the body is the person's claims
/// ([`OidcIssuer::set_person`]); the answer `{"person": claims}`.
async fn person(State(issuer): State<Arc<OidcIssuer>>, body: Bytes) -> Response {
    let claims: Map<String, Value> = match serde_json::from_slice(&body) {
        Ok(claims) => claims,
        Err(err) => return bad_request(format!("expected a JSON object of claims: {err}")),
    };
    match issuer.set_person(claims) {
        Ok(()) => axum::Json(json!({"person": issuer.person()})).into_response(),
        Err(err) => bad_request(err.to_string()),
    }
}
