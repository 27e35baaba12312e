//! Encryption at rest of the OAuth secrets the registry holds (client
//! secrets, tokens, pending PKCE verifiers): AES-256-GCM with a random
//! 96-bit nonce per value, keys from the registry's environment or a file.
//!
//! A keyring holds several keys, each with an id: the first seals, every one
//! opens, so a key is rotated by putting the new key first and keeping the
//! old one until every value was rewritten (each refresh rewrites its
//! connection's tokens). A sealed value says which key sealed it:
//! `v1.<key id>.<base64url(nonce ‖ ciphertext)>`. The associated data binds a
//! value to its connection and column, so a value copied to another row or
//! column does not open.

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};

/// Length of a key, in bytes (AES-256).
pub const KEY_BYTES: usize = 32;

const NONCE_BYTES: usize = 12;
const VERSION: &str = "v1";

/// Why a keyring could not be built or a value not opened.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// The key material is malformed; the message says where.
    #[error("oauth keys: {0}")]
    Keys(String),
    /// A sealed value names a key the keyring does not hold.
    #[error("sealed with key {0:?}, which the registry's oauth keys do not hold")]
    UnknownKey(String),
    /// A sealed value is malformed, tampered with, or bound to another row.
    #[error("a sealed value does not open: {0}")]
    Corrupt(&'static str),
}

/// The registry's encryption keys; the first one seals.
#[derive(Clone)]
pub struct Keyring {
    keys: Vec<(String, Aes256Gcm)>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|(id, _)| id.as_str()).collect();
        f.debug_struct("Keyring").field("key_ids", &ids).finish()
    }
}

impl Keyring {
    /// Parses key material: one key per line (or per comma), each
    /// `ID:BASE64` with 32 bytes of key; blank lines and `#` comments are
    /// skipped. The first key seals; all open.
    pub fn parse(text: &str) -> Result<Self, SealError> {
        let mut keys: Vec<(String, Aes256Gcm)> = Vec::new();
        for (index, entry) in text
            .split(['\n', ','])
            .map(str::trim)
            .filter(|entry| !entry.is_empty() && !entry.starts_with('#'))
            .enumerate()
        {
            let (id, material) = entry
                .split_once(':')
                .ok_or_else(|| SealError::Keys(format!("key {}: expected ID:BASE64", index + 1)))?;
            let id = id.trim();
            let valid_id = !id.is_empty()
                && id.len() <= 64
                && id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            if !valid_id {
                return Err(SealError::Keys(format!(
                    "key {}: the id must be 1-64 letters, digits, '-' or '_'",
                    index + 1
                )));
            }
            if keys.iter().any(|(known, _)| known == id) {
                return Err(SealError::Keys(format!("key id {id:?} appears twice")));
            }
            let bytes = STANDARD
                .decode(material.trim())
                .or_else(|_| URL_SAFE_NO_PAD.decode(material.trim()))
                .map_err(|_| SealError::Keys(format!("key {id:?}: not base64")))?;
            if bytes.len() != KEY_BYTES {
                return Err(SealError::Keys(format!(
                    "key {id:?}: {} bytes, expected {KEY_BYTES}",
                    bytes.len()
                )));
            }
            let cipher = Aes256Gcm::new_from_slice(&bytes)
                .map_err(|_| SealError::Keys(format!("key {id:?}: unusable")))?;
            keys.push((id.to_owned(), cipher));
        }
        if keys.is_empty() {
            return Err(SealError::Keys("no key given".into()));
        }
        Ok(Keyring { keys })
    }

    /// A new random key as a keyring line, `ID:BASE64`.
    pub fn generate_line(id: &str) -> String {
        let key: [u8; KEY_BYTES] = rand::random();
        format!("{id}:{}", STANDARD.encode(key))
    }

    /// A keyring of one new random key whose id is `prefix` and a random
    /// suffix, for a process that keeps nothing across restarts.
    pub fn ephemeral(prefix: &str) -> Self {
        let id = format!("{prefix}-{:08x}", rand::random::<u32>());
        let key: [u8; KEY_BYTES] = rand::random();
        Keyring {
            keys: vec![(id, Aes256Gcm::new(&key.into()))],
        }
    }

    /// The id of the key that seals.
    pub fn current_key_id(&self) -> &str {
        &self.keys[0].0
    }

    /// Encrypts `plaintext` for the place `binding` names (connection and
    /// column).
    pub fn seal(&self, binding: &str, plaintext: &str) -> String {
        let (id, cipher) = &self.keys[0];
        let nonce_bytes: [u8; NONCE_BYTES] = rand::random();
        // Encryption with a valid key and nonce cannot fail for inputs
        // below the AEAD's 64 GiB bound; values here are kilobytes.
        let ciphertext = cipher
            .encrypt(
                Nonce::from_slice(&nonce_bytes),
                Payload {
                    msg: plaintext.as_bytes(),
                    aad: binding.as_bytes(),
                },
            )
            .unwrap_or_default();
        let mut sealed = nonce_bytes.to_vec();
        sealed.extend_from_slice(&ciphertext);
        format!("{VERSION}.{id}.{}", URL_SAFE_NO_PAD.encode(sealed))
    }

    /// Decrypts a value [`Keyring::seal`] made for the same `binding`, with
    /// whichever key of the ring sealed it.
    pub fn open(&self, binding: &str, sealed: &str) -> Result<String, SealError> {
        let mut parts = sealed.splitn(3, '.');
        let (Some(VERSION), Some(id), Some(body)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(SealError::Corrupt("unknown format"));
        };
        let cipher = self
            .keys
            .iter()
            .find(|(known, _)| known == id)
            .map(|(_, cipher)| cipher)
            .ok_or_else(|| SealError::UnknownKey(id.to_owned()))?;
        let bytes = URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|_| SealError::Corrupt("not base64"))?;
        if bytes.len() < NONCE_BYTES {
            return Err(SealError::Corrupt("too short"));
        }
        let (nonce, ciphertext) = bytes.split_at(NONCE_BYTES);
        let plaintext = cipher
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: ciphertext,
                    aad: binding.as_bytes(),
                },
            )
            .map_err(|_| SealError::Corrupt("authentication failed"))?;
        String::from_utf8(plaintext).map_err(|_| SealError::Corrupt("not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_with_any_key_of_the_ring_and_only_for_their_binding() {
        let line_k1 = Keyring::generate_line("k1");
        let ring_k1 = Keyring::parse(&line_k1).unwrap();
        let value = ring_k1.seal("a/credentials", "secret");
        assert!(!value.contains("secret"));
        let ring_k2_k1 =
            Keyring::parse(&format!("{}\n{line_k1}", Keyring::generate_line("k2"))).unwrap();
        assert_eq!(ring_k2_k1.open("a/credentials", &value).unwrap(), "secret");
        assert_eq!(ring_k2_k1.current_key_id(), "k2");
        assert!(ring_k2_k1.seal("a/credentials", "s").starts_with("v1.k2."));
        assert!(matches!(
            ring_k2_k1.open("b/credentials", &value),
            Err(SealError::Corrupt(_))
        ));
        let ring_k2 = Keyring::parse(&Keyring::generate_line("k2")).unwrap();
        assert!(matches!(
            ring_k2.open("a/credentials", &value),
            Err(SealError::UnknownKey(id)) if id == "k1"
        ));
        let mut tampered = value.clone();
        tampered.pop();
        tampered.push(if value.ends_with('A') { 'B' } else { 'A' });
        assert!(ring_k1.open("a/credentials", &tampered).is_err());
    }

    #[test]
    fn malformed_key_material_is_refused_with_its_position() {
        for (text, needle) in [
            ("", "no key"),
            ("nokey", "expected ID:BASE64"),
            ("k:!!!", "not base64"),
            ("k:AAAA", "expected 32"),
            ("bad id:AAAA", "the id"),
        ] {
            let err = Keyring::parse(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
        let line = Keyring::generate_line("k");
        assert!(
            Keyring::parse(&format!("{line}\n{line}"))
                .unwrap_err()
                .to_string()
                .contains("twice")
        );
    }
}
