//! Verifying one JWT against its provider: the algorithm rules, the key,
//! the signature, and `exp`/`nbf`/`iss`/`aud` with the provider's skew.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Validation};
use serde_json::{Map, Value};

use crate::jwks::{ALLOWED, Jwks, Lookup};
use crate::provider::Provider;

/// Longest `sub` accepted.
pub const MAX_SUB_CHARS: usize = 255;

/// Why a token is refused (the 401's message; never the token).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Not a decodable JWT.
    #[error("malformed token")]
    Malformed,
    /// `alg` is `none`, HMAC, not allowed, or not the key's.
    #[error("algorithm refused: {0}")]
    AlgorithmRefused(String),
    /// `iss` is no configured provider's (or not the provider's).
    #[error("wrong issuer")]
    WrongIssuer,
    /// `aud` names none of the provider's audiences.
    #[error("wrong audience")]
    WrongAudience,
    /// `exp` is past (beyond the skew).
    #[error("token expired")]
    Expired,
    /// `nbf` is ahead (beyond the skew).
    #[error("token not valid yet")]
    NotYetValid,
    /// The issuer's key set has no key the token names.
    #[error("unknown key")]
    UnknownKey,
    /// The signature does not verify.
    #[error("bad signature")]
    BadSignature,
    /// A claim a caller needs is missing or unusable (`sub`: not a
    /// string of 1 to 255 characters without control characters).
    #[error("claim {0} missing or invalid")]
    MissingClaim(String),
    /// The provider's keys cannot be fetched.
    #[error("identity provider {0} unreachable")]
    Unreachable(String),
}

/// Whether `token` has the shape of a JWS in compact form: three base64url
/// parts (the signature may be empty, as with `alg: none`).
pub fn looks_like_jwt(token: &str) -> bool {
    let mut parts = 0;
    for (at, part) in token.split('.').enumerate() {
        parts += 1;
        if (at < 2 && part.is_empty())
            || !part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return false;
        }
    }
    parts == 3
}

/// The unverified header (`alg`, `kid`) and claims of a JWT.
pub struct Unverified {
    /// `alg` as written.
    pub alg: String,
    /// `kid`.
    pub kid: Option<String>,
    /// `iss`, to pick the provider.
    pub iss: Option<String>,
}

/// Reads the header and `iss` without trusting them.
pub fn peek(token: &str) -> Result<Unverified, Refused> {
    let mut parts = token.split('.');
    let json = |part: Option<&str>| -> Result<Map<String, Value>, Refused> {
        let bytes = URL_SAFE_NO_PAD
            .decode(part.ok_or(Refused::Malformed)?)
            .map_err(|_| Refused::Malformed)?;
        serde_json::from_slice(&bytes).map_err(|_| Refused::Malformed)
    };
    let header = json(parts.next())?;
    let claims = json(parts.next())?;
    let alg = header
        .get("alg")
        .and_then(Value::as_str)
        .ok_or(Refused::Malformed)?
        .to_owned();
    let kid = match header.get("kid") {
        None => None,
        Some(Value::String(kid)) => Some(kid.clone()),
        Some(_) => return Err(Refused::Malformed),
    };
    Ok(Unverified {
        alg,
        kid,
        iss: claims.get("iss").and_then(Value::as_str).map(str::to_owned),
    })
}

/// The algorithm of `alg` if it may sign tokens at all (`none` and HMAC
/// never: a public key is no secret).
pub fn allowed_algorithm(alg: &str) -> Result<Algorithm, Refused> {
    alg.parse::<Algorithm>()
        .ok()
        .filter(|alg| ALLOWED.contains(alg))
        .ok_or_else(|| Refused::AlgorithmRefused(alg.to_owned()))
}

/// Verifies `token` (already peeked as `header`) with `provider`'s keys;
/// the verified claims.
pub async fn verify(
    token: &str,
    header: &Unverified,
    provider: &Provider,
    keys: &Jwks,
) -> Result<Map<String, Value>, Refused> {
    let alg = allowed_algorithm(&header.alg)?;
    let key = match keys.key(&provider.name, header.kid.as_deref()).await {
        Lookup::Found(key) => key,
        Lookup::Unknown => return Err(Refused::UnknownKey),
        Lookup::Unreachable => return Err(Refused::Unreachable(provider.name.clone())),
    };
    if key.alg != alg {
        return Err(Refused::AlgorithmRefused(format!(
            "{} (the key is for {:?})",
            header.alg, key.alg
        )));
    }
    let mut validation = Validation::new(alg);
    validation.leeway = provider.clock_skew.as_secs();
    validation.validate_nbf = true;
    validation.set_issuer(&[&provider.issuer]);
    validation.set_audience(&provider.audiences);
    validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
    let data = jsonwebtoken::decode::<Map<String, Value>>(token, &key.decoding, &validation)
        .map_err(|err| match err.kind() {
            ErrorKind::ExpiredSignature => Refused::Expired,
            ErrorKind::ImmatureSignature => Refused::NotYetValid,
            ErrorKind::InvalidAudience => Refused::WrongAudience,
            ErrorKind::InvalidIssuer => Refused::WrongIssuer,
            ErrorKind::InvalidSignature => Refused::BadSignature,
            ErrorKind::InvalidAlgorithm => Refused::AlgorithmRefused(header.alg.clone()),
            ErrorKind::MissingRequiredClaim(claim) => Refused::MissingClaim(claim.clone()),
            _ => Refused::Malformed,
        })?;
    let claims = data.claims;
    match claims.get("sub") {
        // OIDC Core §2: at most 255 ASCII characters; no control
        // characters in the principal audit lines and approvals carry.
        Some(Value::String(sub))
            if !sub.is_empty()
                && sub.chars().count() <= MAX_SUB_CHARS
                && !sub.chars().any(char::is_control) => {}
        _ => return Err(Refused::MissingClaim("sub".into())),
    }
    if !matches!(claims.get("exp"), Some(Value::Number(_))) {
        return Err(Refused::MissingClaim("exp".into()));
    }
    Ok(claims)
}
