//! Bearer tokens (docs/reference.md §12), shared by the registry and the worker.
//!
//! Only SHA-256 digests of configured tokens are kept, and a presented token
//! is compared with them in constant time, so neither the content nor the
//! length of a token leaks through timing.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The digest of one configured token.
#[derive(Clone)]
pub struct TokenDigest([u8; 32]);

impl TokenDigest {
    /// Digests `token`.
    pub fn of(token: &str) -> Self {
        TokenDigest(Sha256::digest(token.as_bytes()).into())
    }

    /// The digest's bytes (a map key: a digest of a random secret is safe
    /// to look up in non-constant time).
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lowercase hex, as API keys are stored (a digest of a random secret
    /// reveals nothing usable about it).
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Whether `presented` is the token, in constant time.
    pub fn matches(&self, presented: &str) -> bool {
        self.matches_digest(&TokenDigest::of(presented))
    }

    /// Whether `presented` is the digest of the token, in constant time: a
    /// token checked against many digests is hashed once.
    pub fn matches_digest(&self, presented: &TokenDigest) -> bool {
        bool::from(self.0.ct_eq(&presented.0))
    }
}

impl std::fmt::Debug for TokenDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenDigest(<redacted>)")
    }
}

/// The token of an `Authorization: Bearer <token>` header value. The scheme
/// is matched case-insensitively (RFC 9110 §11.1: `bearer`, `BEARER` …) and
/// may be followed by several spaces or tabs.
pub fn bearer(authorization: Option<&str>) -> Option<&str> {
    let value = authorization?;
    let (scheme, token) = value.split_once([' ', '\t'])?;
    if !scheme.eq_ignore_ascii_case("Bearer") {
        return None;
    }
    Some(token.trim()).filter(|token| !token.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_only_the_token() {
        let digest = TokenDigest::of("s3cret");
        assert!(digest.matches("s3cret"));
        assert!(!digest.matches("s3cret "));
        assert!(!digest.matches(""));
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(Some("Basic abc")), None);
        for scheme in ["bearer", "BEARER", "bEaReR", "Bearer\t", "Bearer  "] {
            assert_eq!(
                bearer(Some(&format!("{scheme} abc"))),
                Some("abc"),
                "{scheme}"
            );
        }
        assert_eq!(bearer(Some("Bearerabc")), None);
        assert_eq!(bearer(Some("Bearerx abc")), None);
        assert_eq!(bearer(Some("bearer \t")), None);
        assert_eq!(bearer(None), None);
    }
}
