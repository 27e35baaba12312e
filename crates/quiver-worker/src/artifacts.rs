//! The artifact store (docs/reference.md §13.2): image and audio content of
//! tool results, kept in memory for the caller whose call produced them and
//! served at `GET /v1/artifacts/{id}`.
//!
//! - **Content-addressed.** An artifact's id is the SHA-256 of its content
//!   type and bytes ([`artifact_id`], lowercase hex): the same bytes stored
//!   again with the same type by the same caller are one artifact,
//!   refreshed (newest again, its TTL restarted); under another type they
//!   are another artifact, so an id (and a URL signed for it) always serves
//!   the type it was issued for.
//! - **Per caller.** Artifacts are keyed by (caller, id): another caller
//!   asking for the same id finds nothing, even when it produced the same
//!   bytes itself (its copy is its own, counted separately).
//! - **Bounded.** One item is at most `max_item_bytes` (a bigger one is not
//!   stored: the result carries a note naming the limit instead), one
//!   caller's together at most its share ([`ArtifactOptions::caller_share`]:
//!   beyond it the caller's own oldest go first, never another caller's),
//!   all of them together at most `max_total_bytes` (the oldest go first),
//!   and every artifact leaves after `ttl`. Storing never fails a call.
//! - **Passive.** Only raster images and audio are served inline
//!   ([`Artifact::served_inline`]); anything else (HTML, SVG, …) is served as
//!   an attachment in a sandbox (`http::artifacts`).
//!
//! Results of gateway calls (MCP clients) keep their images inline, within
//! the same per-item limit ([`ArtifactStore::limit_inline`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use hmac::{Hmac, Mac};
use quiver_mcp::CallToolResult;
use quiver_mcp::ContentBlock;
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::auth::CallerId;

/// How vision requests point the model at an image.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VisionUrl {
    /// The bytes themselves, as a `data:` URL.
    #[default]
    Data,
    /// The artifact's absolute URL on this worker, signed so the model
    /// provider can fetch it without the caller's token.
    Artifact,
}

/// Limits of the store and how vision requests refer to artifacts.
#[derive(Debug, Clone)]
pub struct ArtifactOptions {
    /// Bytes of every artifact together.
    pub max_total_bytes: usize,
    /// Bytes of one caller's artifacts together; `None`: a quarter of
    /// `max_total_bytes`, at least one item ([`Self::caller_share`]).
    pub max_caller_bytes: Option<usize>,
    /// Bytes of one artifact (decoded).
    pub max_item_bytes: usize,
    /// How long an artifact is kept.
    pub ttl: Duration,
    /// `data:` URLs or artifact URLs in vision requests.
    pub vision_url: VisionUrl,
    /// Base URL of this worker as the model provider reaches it (e.g.
    /// `https://worker.example.com`), for `vision_url = "artifact"`;
    /// `None`: the listener's own address.
    pub public_url: Option<String>,
}

impl Default for ArtifactOptions {
    fn default() -> Self {
        ArtifactOptions {
            max_total_bytes: 64 * 1024 * 1024,
            max_caller_bytes: None,
            max_item_bytes: 8 * 1024 * 1024,
            ttl: Duration::from_secs(3600),
            vision_url: VisionUrl::Data,
            public_url: None,
        }
    }
}

impl ArtifactOptions {
    /// Bytes one caller's artifacts may take together: `max_caller_bytes`,
    /// by default a quarter of `max_total_bytes` but at least the item
    /// limit; never more than `max_total_bytes`.
    pub fn caller_share(&self) -> usize {
        self.max_caller_bytes
            .unwrap_or_else(|| {
                (self.max_total_bytes / 4).max(self.max_item_bytes.min(self.max_total_bytes))
            })
            .min(self.max_total_bytes)
    }

    /// The smallest limit one item must fit, and the setting that sets it.
    fn item_limit(&self) -> (usize, &'static str) {
        [
            (self.max_item_bytes, "max_item_bytes"),
            (self.max_total_bytes, "max_total_bytes"),
            (self.caller_share(), "max_caller_bytes"),
        ]
        .into_iter()
        .min_by_key(|(limit, _)| *limit)
        .unwrap_or((self.max_item_bytes, "max_item_bytes"))
    }
}

/// The id of `bytes` declared as `mime_type`: the SHA-256 (lowercase hex)
/// of the type's length (8 bytes, big-endian), the type and the bytes.
pub fn artifact_id(mime_type: &str, bytes: &[u8]) -> String {
    let mut digest = Sha256::new();
    digest.update((mime_type.len() as u64).to_be_bytes());
    digest.update(mime_type.as_bytes());
    digest.update(bytes);
    format!("{:x}", digest.finalize())
}

/// One stored artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// [`artifact_id`] of its type and bytes.
    pub id: String,
    /// The content type the server declared.
    pub mime_type: String,
    /// The bytes.
    pub bytes: Bytes,
}

impl Artifact {
    /// Where the caller fetches it: `/v1/artifacts/{id}`.
    pub fn path(&self) -> String {
        format!("/v1/artifacts/{}", self.id)
    }

    /// `{id, url, mime_type, bytes}` as the tool API lists it.
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "url": self.path(),
            "mime_type": self.mime_type,
            "bytes": self.bytes.len(),
        })
    }

    /// The text that stands in a result for the item stored as `self`.
    pub fn note(&self) -> String {
        format!(
            "[quiver: artifact {} produced: {}, {} bytes, at {}]",
            self.id,
            self.mime_type,
            self.bytes.len(),
            self.path()
        )
    }

    /// The bytes as a `data:` URL.
    pub fn data_url(&self) -> String {
        format!(
            "data:{};base64,{}",
            self.mime_type,
            BASE64.encode(&self.bytes)
        )
    }

    /// The declared type without parameters, lowercase (`image/png`).
    pub fn essence(&self) -> String {
        let mime = self.mime_type.split(';').next().unwrap_or("").trim();
        mime.to_ascii_lowercase()
    }

    /// Whether vision models are shown it: png, jpeg, gif and webp images.
    pub fn is_vision_image(&self) -> bool {
        matches!(
            self.essence().as_str(),
            "image/png" | "image/jpeg" | "image/jpg" | "image/gif" | "image/webp"
        )
    }

    /// Whether `GET /v1/artifacts/{id}` serves it inline, with its type:
    /// raster images and audio, which a browser does not run. Anything
    /// else, SVG included (it may hold script), is an attachment.
    pub fn served_inline(&self) -> bool {
        matches!(
            self.essence().as_str(),
            "image/png"
                | "image/jpeg"
                | "image/jpg"
                | "image/gif"
                | "image/webp"
                | "image/avif"
                | "image/bmp"
                | "audio/mpeg"
                | "audio/mp3"
                | "audio/mp4"
                | "audio/aac"
                | "audio/ogg"
                | "audio/opus"
                | "audio/wav"
                | "audio/wave"
                | "audio/x-wav"
                | "audio/webm"
                | "audio/flac"
                | "audio/x-flac"
        )
    }
}

/// Why an item was not stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArtifactError {
    /// Bigger than `max_item_bytes` (or than `max_total_bytes`, or the
    /// caller's share).
    #[error(
        "{mime_type} content of {bytes} bytes not kept: over the artifact limit of {limit} bytes ([artifacts] {field})"
    )]
    TooLarge {
        /// Its type.
        mime_type: String,
        /// Its size (decoded, or estimated from the base64 length).
        bytes: usize,
        /// The limit.
        limit: usize,
        /// Which setting.
        field: &'static str,
    },
    /// The base64 data does not decode.
    #[error("{mime_type} content not kept: its data is not valid base64")]
    InvalidData {
        /// Its type.
        mime_type: String,
    },
}

impl ArtifactError {
    fn note(&self) -> String {
        format!("[quiver: {self}]")
    }
}

type Key = (CallerId, String);

struct Entry {
    artifact: Artifact,
    stored: Instant,
    seq: u64,
}

/// What one caller holds.
#[derive(Default)]
struct Usage {
    bytes: usize,
    /// Its keys' sequence numbers (oldest first).
    order: BTreeMap<u64, String>,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<Key, Entry>,
    /// Keys by storage order (oldest first).
    order: BTreeMap<u64, Key>,
    callers: HashMap<CallerId, Usage>,
    total: usize,
    next: u64,
}

impl Inner {
    fn remove(&mut self, key: &Key) -> Option<Entry> {
        let entry = self.entries.remove(key)?;
        self.order.remove(&entry.seq);
        let size = entry.artifact.bytes.len();
        self.total -= size;
        if let Some(usage) = self.callers.get_mut(&key.0) {
            usage.bytes -= size;
            usage.order.remove(&entry.seq);
            if usage.order.is_empty() {
                self.callers.remove(&key.0);
            }
        }
        Some(entry)
    }

    fn insert(&mut self, key: Key, entry: Entry) {
        let size = entry.artifact.bytes.len();
        self.order.insert(entry.seq, key.clone());
        self.total += size;
        let usage = self.callers.entry(key.0.clone()).or_default();
        usage.bytes += size;
        usage.order.insert(entry.seq, key.1.clone());
        self.entries.insert(key, entry);
    }

    fn caller_bytes(&self, caller: &CallerId) -> usize {
        self.callers.get(caller).map_or(0, |usage| usage.bytes)
    }

    /// `caller`'s oldest artifact.
    fn oldest_of(&self, caller: &CallerId) -> Option<Key> {
        let usage = self.callers.get(caller)?;
        let (_, id) = usage.order.first_key_value()?;
        Some((caller.clone(), id.clone()))
    }

    /// Drops what is older than `ttl`; returns how many.
    fn expire(&mut self, now: Instant, ttl: Duration) -> u64 {
        let mut expired = 0;
        while let Some((_, key)) = self.order.first_key_value() {
            let key = key.clone();
            let stored = self.entries.get(&key).map_or(now, |entry| entry.stored);
            if now.saturating_duration_since(stored) < ttl {
                break;
            }
            self.remove(&key);
            expired += 1;
        }
        expired
    }
}

/// The worker's artifacts; see the module documentation.
pub struct ArtifactStore {
    options: ArtifactOptions,
    /// Signs artifact URLs handed to model providers (per process: the
    /// artifacts are too).
    url_key: [u8; 32],
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for ArtifactStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArtifactStore")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Default for ArtifactStore {
    fn default() -> Self {
        ArtifactStore::new(ArtifactOptions::default())
    }
}

impl ArtifactStore {
    /// An empty store.
    pub fn new(options: ArtifactOptions) -> Self {
        ArtifactStore {
            options,
            url_key: rand::random(),
            inner: Mutex::default(),
        }
    }

    /// Its options.
    pub fn options(&self) -> &ArtifactOptions {
        &self.options
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores `bytes` for `owner`, evicting the oldest artifacts as needed.
    pub fn put(
        &self,
        owner: CallerId,
        mime_type: &str,
        bytes: Bytes,
    ) -> Result<Artifact, ArtifactError> {
        self.put_at(owner, mime_type, bytes, Instant::now())
    }

    fn put_at(
        &self,
        owner: CallerId,
        mime_type: &str,
        bytes: Bytes,
        now: Instant,
    ) -> Result<Artifact, ArtifactError> {
        let (limit, field) = self.options.item_limit();
        if bytes.len() > limit {
            return Err(ArtifactError::TooLarge {
                mime_type: mime_type.to_owned(),
                bytes: bytes.len(),
                limit,
                field,
            });
        }
        let artifact = Artifact {
            id: artifact_id(mime_type, &bytes),
            mime_type: mime_type.to_owned(),
            bytes,
        };
        let key = (owner.clone(), artifact.id.clone());
        let size = artifact.bytes.len();
        let share = self.options.caller_share();
        let mut inner = self.lock();
        let expired = inner.expire(now, self.options.ttl);
        inner.remove(&key);
        // Over its share, a caller makes room from its own artifacts only.
        let mut evicted_own = 0u64;
        while inner.caller_bytes(&owner) + size > share {
            let Some(oldest) = inner.oldest_of(&owner) else {
                break;
            };
            inner.remove(&oldest);
            evicted_own += 1;
        }
        // Within its share, the store's oldest go when it is full.
        let mut evicted = 0u64;
        while inner.total + size > self.options.max_total_bytes {
            let Some((_, oldest)) = inner.order.first_key_value() else {
                break;
            };
            let oldest = oldest.clone();
            inner.remove(&oldest);
            evicted += 1;
        }
        let seq = inner.next;
        inner.next += 1;
        inner.insert(
            key,
            Entry {
                artifact: artifact.clone(),
                stored: now,
                seq,
            },
        );
        let total = inner.total;
        drop(inner);
        metrics::counter!("quiver_artifacts_stored_total").increment(1);
        if evicted_own > 0 {
            metrics::counter!("quiver_artifacts_evicted_total", "reason" => "caller_share")
                .increment(evicted_own);
        }
        if evicted > 0 {
            metrics::counter!("quiver_artifacts_evicted_total", "reason" => "capacity")
                .increment(evicted);
        }
        if expired > 0 {
            metrics::counter!("quiver_artifacts_evicted_total", "reason" => "expired")
                .increment(expired);
        }
        metrics::gauge!("quiver_artifacts_bytes").set(total as f64);
        Ok(artifact)
    }

    /// `owner`'s artifact `id`, unless it expired or was evicted.
    pub fn get(&self, owner: CallerId, id: &str) -> Option<Artifact> {
        self.get_at(owner, id, Instant::now())
    }

    fn get_at(&self, owner: CallerId, id: &str, now: Instant) -> Option<Artifact> {
        let mut inner = self.lock();
        let expired = inner.expire(now, self.options.ttl);
        if expired > 0 {
            metrics::counter!("quiver_artifacts_evicted_total", "reason" => "expired")
                .increment(expired);
            metrics::gauge!("quiver_artifacts_bytes").set(inner.total as f64);
        }
        inner
            .entries
            .get(&(owner, id.to_owned()))
            .map(|entry| entry.artifact.clone())
    }

    /// Bytes stored now.
    pub fn total_bytes(&self) -> usize {
        self.lock().total
    }

    /// Moves the image and audio items of `result` into the store for
    /// `owner`: each is replaced by a text item saying what was produced
    /// (or, when it could not be kept, why). Returns the artifacts in
    /// order.
    pub fn take_from(&self, owner: CallerId, result: &mut CallToolResult) -> Vec<Artifact> {
        let mut artifacts = Vec::new();
        for item in &mut result.content {
            let (data, mime_type) = match item {
                ContentBlock::Image(image) => (&image.data, &image.mime_type),
                ContentBlock::Audio(audio) => (&audio.data, &audio.mime_type),
                _ => continue,
            };
            let note = match self
                .decode(data, mime_type)
                .and_then(|bytes| self.put(owner.clone(), mime_type, bytes))
            {
                Ok(artifact) => {
                    let note = artifact.note();
                    artifacts.push(artifact);
                    note
                }
                Err(err) => err.note(),
            };
            *item = ContentBlock::text(note);
        }
        artifacts
    }

    /// Replaces the image and audio items of `result` bigger than
    /// `max_item_bytes` by a note naming the limit; the others stay inline.
    pub fn limit_inline(&self, result: &mut CallToolResult) {
        for item in &mut result.content {
            let (data, mime_type) = match item {
                ContentBlock::Image(image) => (&image.data, &image.mime_type),
                ContentBlock::Audio(audio) => (&audio.data, &audio.mime_type),
                _ => continue,
            };
            if let Err(err) = self.check_size(data, mime_type) {
                *item = ContentBlock::text(err.note());
            }
        }
    }

    /// Refuses base64 `data` whose decoded size is over the item limit,
    /// without decoding it.
    fn check_size(&self, data: &str, mime_type: &str) -> Result<(), ArtifactError> {
        let estimate = data.len() / 4 * 3;
        let (limit, field) = self.options.item_limit();
        // Padding makes the estimate up to 2 bytes high.
        if estimate > limit + 2 {
            return Err(ArtifactError::TooLarge {
                mime_type: mime_type.to_owned(),
                bytes: estimate,
                limit,
                field,
            });
        }
        Ok(())
    }

    fn decode(&self, data: &str, mime_type: &str) -> Result<Bytes, ArtifactError> {
        self.check_size(data, mime_type)?;
        let data: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        BASE64
            .decode(data.as_bytes())
            .map(Bytes::from)
            .map_err(|_| ArtifactError::InvalidData {
                mime_type: mime_type.to_owned(),
            })
    }

    fn signature(&self, owner: &CallerId, id: &str) -> String {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.url_key)
            .expect("HMAC takes keys of any length");
        mac.update(owner.tag().as_bytes());
        mac.update(b"\0");
        mac.update(id.as_bytes());
        let tag = mac.finalize().into_bytes();
        hex::encode(tag)
    }

    /// The artifact's URL for a model provider, which has no caller token:
    /// `<base>/v1/artifacts/{id}?caller=…&sig=…`, valid while it is stored.
    pub fn signed_url(&self, base: &str, owner: CallerId, artifact: &Artifact) -> String {
        format!(
            "{}{}?caller={}&sig={}",
            base.trim_end_matches('/'),
            artifact.path(),
            owner.tag(),
            self.signature(&owner, &artifact.id)
        )
    }

    /// The caller a signed URL of `id` was made for, if `sig` is right.
    pub fn verify(&self, id: &str, caller: &str, sig: &str) -> Option<CallerId> {
        let owner = CallerId::from_tag(caller)?;
        let expected = self.signature(&owner, id);
        bool::from(subtle::ConstantTimeEq::ct_eq(
            expected.as_bytes(),
            sig.as_bytes(),
        ))
        .then_some(owner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(max_total_bytes: usize, max_item_bytes: usize, ttl: Duration) -> ArtifactStore {
        ArtifactStore::new(ArtifactOptions {
            max_total_bytes,
            max_item_bytes,
            ttl,
            ..Default::default()
        })
    }

    /// A store where one caller may fill everything.
    fn unshared(max_total_bytes: usize, max_item_bytes: usize) -> ArtifactStore {
        ArtifactStore::new(ArtifactOptions {
            max_total_bytes,
            max_caller_bytes: Some(max_total_bytes),
            max_item_bytes,
            ttl: Duration::from_secs(60),
            ..Default::default()
        })
    }

    fn caller(n: u32) -> CallerId {
        CallerId::from_tag(&format!("{n:016x}")).unwrap()
    }

    fn bytes(fill: u8, n: usize) -> Bytes {
        Bytes::from(vec![fill; n])
    }

    #[test]
    fn ids_are_the_sha256_of_the_type_and_the_bytes() {
        let store = ArtifactStore::default();
        let artifact = store
            .put(caller(0), "image/png", Bytes::from_static(b"abc"))
            .unwrap();
        let mut expected = Sha256::new();
        expected.update(9u64.to_be_bytes());
        expected.update(b"image/pngabc");
        assert_eq!(artifact.id, format!("{:x}", expected.finalize()));
        assert_eq!(artifact.path(), format!("/v1/artifacts/{}", artifact.id));
        // The same bytes again: one artifact, counted once.
        let again = store
            .put(caller(0), "image/png", Bytes::from_static(b"abc"))
            .unwrap();
        assert_eq!(again.id, artifact.id);
        assert_eq!(store.total_bytes(), 3);
        // Under another type: another artifact; the first keeps its type.
        let html = store
            .put(caller(0), "text/html", Bytes::from_static(b"abc"))
            .unwrap();
        assert_ne!(html.id, artifact.id);
        assert_eq!(
            store.get(caller(0), &artifact.id).unwrap().mime_type,
            "image/png"
        );
        assert_eq!(
            store.get(caller(0), &html.id).unwrap().mime_type,
            "text/html"
        );
        // The type's length is part of the digest: no shifting bytes
        // between type and content gives the same id.
        assert_ne!(artifact_id("a\0b", b"c"), artifact_id("a", b"\0bc"));
        assert_ne!(
            artifact_id("image/png", b"x"),
            artifact_id("image/pngx", b"")
        );
    }

    #[test]
    fn only_raster_images_and_audio_are_served_inline() {
        let artifact = |mime: &str| Artifact {
            id: String::new(),
            mime_type: mime.into(),
            bytes: Bytes::new(),
        };
        for mime in [
            "image/png",
            "IMAGE/PNG; x=y",
            "image/webp",
            "audio/wav",
            "audio/mpeg",
        ] {
            assert!(artifact(mime).served_inline(), "{mime}");
        }
        for mime in [
            "text/html",
            "image/svg+xml",
            "image/svg+xml; charset=utf-8",
            "application/xhtml+xml",
            "application/pdf",
            "text/xml",
            "image/png, text/html",
            "",
            "image/",
        ] {
            assert!(!artifact(mime).served_inline(), "{mime}");
        }
    }

    #[test]
    fn a_caller_over_its_share_evicts_only_its_own() {
        let store = ArtifactStore::new(ArtifactOptions {
            max_total_bytes: 40,
            max_caller_bytes: Some(20),
            max_item_bytes: 10,
            ttl: Duration::from_secs(60),
            ..Default::default()
        });
        let others: Vec<String> = (0..2)
            .map(|i| store.put(caller(1), "image/png", bytes(i, 10)).unwrap().id)
            .collect();
        let mine: Vec<String> = (10..20)
            .map(|i| store.put(caller(0), "image/png", bytes(i, 10)).unwrap().id)
            .collect();
        // The other caller's artifacts stay; of mine, the newest two.
        assert!(others.iter().all(|id| store.get(caller(1), id).is_some()));
        assert!(
            mine[..8]
                .iter()
                .all(|id| store.get(caller(0), id).is_none())
        );
        assert!(
            mine[8..]
                .iter()
                .all(|id| store.get(caller(0), id).is_some())
        );
        assert_eq!(store.total_bytes(), 40);
        // A third caller within its share: the store is full, its oldest
        // (the first caller's) go.
        store.put(caller(2), "image/png", bytes(30, 10)).unwrap();
        assert!(store.get(caller(1), &others[0]).is_none());
        assert!(store.get(caller(1), &others[1]).is_some());
        assert_eq!(store.total_bytes(), 40);
        // An item over the share is refused naming it.
        let narrow = ArtifactStore::new(ArtifactOptions {
            max_total_bytes: 40,
            max_caller_bytes: Some(5),
            max_item_bytes: 10,
            ..Default::default()
        });
        let err = narrow.put(caller(0), "image/png", bytes(1, 6)).unwrap_err();
        assert!(err.to_string().contains("max_caller_bytes"), "{err}");
    }

    #[test]
    fn the_default_share_is_a_quarter_but_at_least_one_item() {
        let share = |total, item, own| {
            ArtifactOptions {
                max_total_bytes: total,
                max_item_bytes: item,
                max_caller_bytes: own,
                ..Default::default()
            }
            .caller_share()
        };
        assert_eq!(ArtifactOptions::default().caller_share(), 16 * 1024 * 1024);
        assert_eq!(share(100, 10, None), 25);
        assert_eq!(share(100, 50, None), 50);
        assert_eq!(share(100, 500, None), 100);
        assert_eq!(share(100, 10, Some(60)), 60);
        assert_eq!(share(100, 10, Some(600)), 100);
    }

    #[test]
    fn artifacts_are_only_their_callers() {
        let store = ArtifactStore::default();
        let artifact = store.put(caller(0), "image/png", bytes(1, 10)).unwrap();
        assert_eq!(store.get(caller(0), &artifact.id), Some(artifact.clone()));
        assert_eq!(store.get(caller(1), &artifact.id), None);
        assert_eq!(store.get(CallerId::ANONYMOUS, &artifact.id), None);
        // The other caller's copy of the same bytes is its own.
        store.put(caller(1), "image/png", bytes(1, 10)).unwrap();
        assert_eq!(store.total_bytes(), 20);
        assert!(store.get(caller(1), &artifact.id).is_some());
    }

    #[test]
    fn items_over_the_item_limit_are_refused_naming_it() {
        let store = store(100, 10, Duration::from_secs(60));
        let err = store.put(caller(0), "image/png", bytes(1, 11)).unwrap_err();
        assert!(err.to_string().contains("max_item_bytes"), "{err}");
        assert!(err.to_string().contains("10 bytes"), "{err}");
        assert!(store.put(caller(0), "image/png", bytes(1, 10)).is_ok());
        // An item limit above the total: the total is the limit.
        let store = self::store(5, 10, Duration::from_secs(60));
        let err = store.put(caller(0), "image/png", bytes(1, 6)).unwrap_err();
        assert!(err.to_string().contains("max_total_bytes"), "{err}");
    }

    #[test]
    fn the_oldest_go_first_when_full() {
        let store = unshared(30, 10);
        let ids: Vec<String> = (0..3)
            .map(|i| store.put(caller(0), "image/png", bytes(i, 10)).unwrap().id)
            .collect();
        assert_eq!(store.total_bytes(), 30);
        // Storing the first again makes it the newest.
        store.put(caller(0), "image/png", bytes(0, 10)).unwrap();
        let fourth = store.put(caller(1), "image/png", bytes(3, 10)).unwrap();
        assert_eq!(store.total_bytes(), 30);
        assert!(store.get(caller(0), &ids[1]).is_none(), "oldest evicted");
        assert!(store.get(caller(0), &ids[0]).is_some());
        assert!(store.get(caller(0), &ids[2]).is_some());
        assert!(store.get(caller(1), &fourth.id).is_some());
        // A big one evicts as many as it needs, oldest first.
        let store2 = unshared(30, 30);
        let small: Vec<String> = (0..3)
            .map(|i| store2.put(caller(0), "image/png", bytes(i, 10)).unwrap().id)
            .collect();
        store2.put(caller(0), "image/png", bytes(9, 25)).unwrap();
        assert!(small.iter().all(|id| store2.get(caller(0), id).is_none()));
        assert_eq!(store2.total_bytes(), 25);
    }

    #[test]
    fn artifacts_expire_after_the_ttl() {
        let store = store(100, 10, Duration::from_secs(60));
        let t0 = Instant::now();
        let a = store
            .put_at(caller(0), "image/png", bytes(1, 10), t0)
            .unwrap();
        let b = store
            .put_at(
                caller(0),
                "image/png",
                bytes(2, 10),
                t0 + Duration::from_secs(30),
            )
            .unwrap();
        let at = |secs| t0 + Duration::from_secs(secs);
        assert!(store.get_at(caller(0), &a.id, at(59)).is_some());
        assert!(store.get_at(caller(0), &a.id, at(60)).is_none());
        assert!(store.get_at(caller(0), &b.id, at(60)).is_some());
        assert_eq!(store.total_bytes(), 10);
        assert!(store.get_at(caller(0), &b.id, at(90)).is_none());
        assert_eq!(store.total_bytes(), 0);
    }

    #[test]
    fn results_keep_a_note_in_place_of_each_binary_item() {
        let store = store(1000, 10, Duration::from_secs(60));
        let mut result = CallToolResult::success(vec![
            ContentBlock::text("here"),
            ContentBlock::image(BASE64.encode(b"png bytes"), "image/png"),
            ContentBlock::image(BASE64.encode(b"far too many bytes"), "image/png"),
            ContentBlock::audio("!!not base64!!", "audio/wav"),
        ]);
        let artifacts = store.take_from(caller(0), &mut result);
        assert_eq!(artifacts.len(), 1);
        assert_eq!(artifacts[0].bytes.as_ref(), b"png bytes");
        let texts: Vec<&str> = result
            .content
            .iter()
            .map(|c| c.as_text().unwrap().text.as_str())
            .collect();
        assert_eq!(texts[0], "here");
        assert!(
            texts[1].contains(&artifacts[0].id) && texts[1].contains("image/png, 9 bytes"),
            "{texts:?}"
        );
        assert!(texts[2].contains("max_item_bytes"), "{texts:?}");
        assert!(texts[3].contains("not valid base64"), "{texts:?}");

        let mut inline = CallToolResult::success(vec![
            ContentBlock::image(BASE64.encode(b"small"), "image/png"),
            ContentBlock::image(BASE64.encode(b"far too many bytes"), "image/png"),
        ]);
        store.limit_inline(&mut inline);
        assert!(inline.content[0].as_image().is_some());
        assert!(
            inline.content[1]
                .as_text()
                .unwrap()
                .text
                .contains("max_item_bytes")
        );
    }

    #[test]
    fn signed_urls_name_their_caller() {
        let store = ArtifactStore::default();
        let artifact = store.put(caller(3), "image/png", bytes(1, 4)).unwrap();
        let url = store.signed_url("https://w.example/", caller(3), &artifact);
        let query = url
            .strip_prefix(&format!("https://w.example/v1/artifacts/{}?", artifact.id))
            .unwrap();
        let (three, four) = (caller(3).tag(), caller(4).tag());
        let sig = query.strip_prefix(&format!("caller={three}&sig=")).unwrap();
        assert_eq!(store.verify(&artifact.id, &three, sig), Some(caller(3)));
        assert_eq!(store.verify(&artifact.id, &four, sig), None);
        assert_eq!(store.verify("other", &three, sig), None);
        assert_eq!(store.verify(&artifact.id, &three, "00"), None);
        // The same bytes as HTML are another id: the PNG's signature does
        // not fetch them.
        let html = store.put(caller(3), "text/html", bytes(1, 4)).unwrap();
        assert_eq!(store.verify(&html.id, &three, sig), None);
    }

    #[test]
    fn vision_types() {
        let artifact = |mime: &str| Artifact {
            id: String::new(),
            mime_type: mime.into(),
            bytes: Bytes::new(),
        };
        for mime in ["image/png", "image/JPEG", "image/gif", "image/webp"] {
            assert!(artifact(mime).is_vision_image(), "{mime}");
        }
        for mime in ["image/svg+xml", "audio/wav", "image/tiff"] {
            assert!(!artifact(mime).is_vision_image(), "{mime}");
        }
        assert_eq!(artifact("image/png").data_url(), "data:image/png;base64,");
    }
}
