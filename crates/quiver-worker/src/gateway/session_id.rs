//! Signed MCP session ids: any worker of a fleet can serve any session.
//!
//! rmcp's streamable HTTP server keeps sessions in the memory of one process.
//! Behind a round-robin load balancer the next request of a session lands on
//! another worker, which has never seen it. So the id the client gets is the
//! session's own id with a signature over what the session is bound to: the
//! caller (its principal: a digest of its bearer token, or its identity
//! provider's subject), the endpoint it was opened on, and
//! the protocol version it asked for. A worker that receives a session it
//! does not hold verifies the signature and re-creates the session from
//! what the id carries (see `super::store`); an id that is not signed by
//! the fleet's key, or is presented by another caller or at another
//! endpoint, is answered 404, which tells the client to initialize again.
//!
//! The key is shared by the fleet: `--mcp-session-key` (or derived from the
//! registry token every worker holds), see [`SessionSigner::new`].

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

type HmacSha256 = Hmac<Sha256>;

/// Bytes of the signature kept in an id (128 bits).
const TAG_BYTES: usize = 16;

/// Longest session id accepted from a client.
pub const MAX_SESSION_ID_LEN: usize = 256;

/// What a session is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding<'a> {
    /// The caller's principal (`crate::auth::CallerId::principal`).
    pub caller: &'a str,
    /// The endpoint the session was opened on (`/mcp?server_ids=…` or
    /// `/mcp/<server_id>`), normalized.
    pub endpoint: &'a str,
}

/// A verified session id, split into its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionToken {
    /// rmcp's id of the session.
    pub inner: String,
    /// The protocol version the client asked for in `initialize`.
    pub protocol_version: String,
    /// When the id was issued, in Unix milliseconds.
    pub issued_ms: u64,
}

impl SessionToken {
    /// When the id stops being served (Unix milliseconds) under `lifetime`.
    pub fn expires_ms(&self, lifetime: std::time::Duration) -> u64 {
        self.issued_ms
            .saturating_add(u64::try_from(lifetime.as_millis()).unwrap_or(u64::MAX))
    }

    /// The lowercase hex SHA-256 of the session's inner id: how the fleet
    /// names the session when it remembers its deletion.
    pub fn digest(&self) -> String {
        session_digest(&self.inner)
    }
}

/// The lowercase hex SHA-256 of a session's inner id.
pub fn session_digest(inner: &str) -> String {
    hex::encode(Sha256::digest(inner.as_bytes()))
}

/// The current time in Unix milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Signs and verifies session ids with the fleet's key.
#[derive(Clone)]
pub struct SessionSigner {
    key: [u8; 32],
}

impl std::fmt::Debug for SessionSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionSigner(..)")
    }
}

impl SessionSigner {
    /// A signer whose key is derived from `secret` (the same secret gives
    /// every worker the same key).
    pub fn new(secret: &[u8]) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"quiver mcp session id v1\0");
        hasher.update(secret);
        SessionSigner {
            key: hasher.finalize().into(),
        }
    }

    /// A signer with a random key: sessions survive only on this worker.
    pub fn random() -> Self {
        SessionSigner::new(&rand::random::<[u8; 32]>())
    }

    fn tag(
        &self,
        inner: &str,
        protocol_version: &str,
        issued: &str,
        binding: &Binding<'_>,
    ) -> [u8; TAG_BYTES] {
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC takes any key length");
        for part in [
            inner,
            protocol_version,
            issued,
            binding.caller,
            binding.endpoint,
        ] {
            // Length-prefixed, so no two splits of the same bytes collide.
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        let full = mac.finalize().into_bytes();
        let mut tag = [0; TAG_BYTES];
        tag.copy_from_slice(&full[..TAG_BYTES]);
        tag
    }

    /// The id given to the client for rmcp's session `inner`, issued at
    /// `issued_ms` (Unix milliseconds).
    pub fn sign(
        &self,
        inner: &str,
        protocol_version: &str,
        issued_ms: u64,
        binding: &Binding<'_>,
    ) -> String {
        let issued = issued_ms.to_string();
        format!(
            "{inner}.{}.{issued}.{}",
            URL_SAFE_NO_PAD.encode(protocol_version),
            URL_SAFE_NO_PAD.encode(self.tag(inner, protocol_version, &issued, binding))
        )
    }

    /// The session of an id a client presented, if it is signed for
    /// `binding` (its age is the caller's to judge: [`SessionToken::expires_ms`]).
    pub fn verify(&self, presented: &str, binding: &Binding<'_>) -> Option<SessionToken> {
        if presented.len() > MAX_SESSION_ID_LEN {
            return None;
        }
        let mut parts = presented.rsplitn(4, '.');
        let (tag, issued, version, inner) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let version = String::from_utf8(URL_SAFE_NO_PAD.decode(version).ok()?).ok()?;
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        let expected = self.tag(inner, &version, issued, binding);
        // Constant time: the comparison must not tell how much of a guess matched.
        if !bool::from(tag.as_slice().ct_eq(expected.as_slice())) {
            return None;
        }
        Some(SessionToken {
            inner: inner.to_owned(),
            protocol_version: version,
            issued_ms: issued.parse().ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BINDING: Binding<'static> = Binding {
        caller: "caller-a",
        endpoint: "/mcp/everything",
    };

    #[test]
    fn a_signed_id_verifies_only_for_its_binding_and_key() {
        let signer = SessionSigner::new(b"fleet secret");
        let id = signer.sign("0b5c-uuid", "2025-11-25", 1_700_000_000_000, &BINDING);
        let token = SessionSigner::new(b"fleet secret")
            .verify(&id, &BINDING)
            .expect("same key verifies");
        assert_eq!(token.inner, "0b5c-uuid");
        assert_eq!(token.protocol_version, "2025-11-25");
        assert_eq!(token.issued_ms, 1_700_000_000_000);
        assert_eq!(
            token.expires_ms(std::time::Duration::from_secs(1)),
            1_700_000_001_000
        );

        let other_caller = Binding {
            caller: "caller-b",
            ..BINDING
        };
        let other_endpoint = Binding {
            endpoint: "/mcp",
            ..BINDING
        };
        assert_eq!(signer.verify(&id, &other_caller), None);
        assert_eq!(signer.verify(&id, &other_endpoint), None);
        assert_eq!(SessionSigner::new(b"other").verify(&id, &BINDING), None);
        assert_eq!(SessionSigner::random().verify(&id, &BINDING), None);
    }

    #[test]
    fn tampered_or_malformed_ids_are_refused() {
        let signer = SessionSigner::new(b"k");
        let id = signer.sign("abc", "2025-06-18", 1_000, &BINDING);
        let tag = id.rsplit('.').next().unwrap();
        let forged_version = format!("abc.{}.1000.{tag}", URL_SAFE_NO_PAD.encode("2025-11-25"));
        // A later issue time (an expired id made young again) breaks the tag.
        let forged_time = format!("abc.{}.9000.{tag}", URL_SAFE_NO_PAD.encode("2025-06-18"));
        // The format before ids carried an issue time is refused.
        let untimed = format!("abc.{}.{tag}", URL_SAFE_NO_PAD.encode("2025-06-18"));
        for bad in [
            "",
            "abc",
            "abc.def",
            &forged_version,
            &forged_time,
            &untimed,
            &id.replacen("abc", "abd", 1),
            &format!("{id}x"),
            &"a.".repeat(200),
        ] {
            assert_eq!(signer.verify(bad, &BINDING), None, "{bad:?}");
        }
    }
}
