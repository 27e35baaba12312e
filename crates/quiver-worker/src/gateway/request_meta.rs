//! What the gateway uses of a request's `_meta`, decoded once: the
//! capabilities a 2026-07-28 client declares, the log level and progress
//! token it opts in to, and the keys passed on to the server.
//!
//! rmcp hands a request's `_meta` over as a map of JSON values, whose
//! accessors decode a key each time they are asked ([`RequestMeta::of`]).
//! The lean edge (`crate::http::mcp`) reads a plain call's `_meta` straight
//! from the body instead ([`CurrentMeta`]): the keys it reads are not
//! copied, and what no part of the call uses (the client's `clientInfo`)
//! is skipped rather than built.

// SEP-2577 deprecates logging; clients still opt in to log messages.
#![expect(deprecated)]

use std::borrow::Cow;
use std::fmt;

use rmcp::model::{
    ClientCapabilities, JsonObject, LoggingLevel, MetaObject, ProgressToken, ProtocolVersion,
    RequestMetaObject,
};
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};

/// The `_meta` keys of the protocol the gateway reads (rmcp's names).
const PROGRESS_TOKEN: &str = "progressToken";
const PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
const CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
const LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";

/// A request's `_meta`, as the gateway uses it.
#[derive(Debug, Clone, Default)]
pub struct RequestMeta {
    /// What the client declared it can be asked (2026-07-28; `None` for a
    /// session's request, whose client declared it at `initialize`).
    pub client_capabilities: Option<ClientCapabilities>,
    /// The lowest level of log messages the request opts in to.
    pub log_level: Option<LoggingLevel>,
    /// The token the client's progress notifications carry.
    pub progress_token: Option<ProgressToken>,
    /// The keys passed on to the server
    /// ([`quiver_mcp::is_forwarded_meta_key`]); `None` when none.
    pub forwarded: Option<RequestMetaObject>,
}

impl RequestMeta {
    /// What the gateway uses of the `_meta` rmcp handed over. A value that
    /// does not decode counts as absent, as with rmcp's accessors.
    pub fn of(meta: &RequestMetaObject) -> Self {
        RequestMeta {
            client_capabilities: meta.client_capabilities(),
            log_level: meta.log_level(),
            progress_token: meta.get_progress_token(),
            forwarded: quiver_mcp::forwarded_meta(meta),
        }
    }
}

/// The `_meta` of a request of 2026-07-28 with every key that revision
/// requires, read straight from the request's body. It does not decode
/// otherwise (another revision, a key missing or not of its type, as rmcp's
/// `missing_required_keys` judges), so such a request goes the general way,
/// where rmcp refuses it.
pub struct CurrentMeta(pub RequestMeta);

impl<'de> Deserialize<'de> for CurrentMeta {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(CurrentMetaVisitor)
    }
}

/// A `_meta` key, borrowed from the body unless it has escapes.
#[derive(serde::Deserialize)]
struct Key<'a>(#[serde(borrow)] Cow<'a, str>);

struct CurrentMetaVisitor;

impl<'de> Visitor<'de> for CurrentMetaVisitor {
    type Value = CurrentMeta;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("the _meta of a 2026-07-28 request")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<CurrentMeta, A::Error> {
        let mut current = false;
        let mut meta = RequestMeta::default();
        let mut forwarded = JsonObject::new();
        // A key sent twice counts as its last value, as in rmcp's map.
        while let Some(Key(key)) = map.next_key()? {
            match key.as_ref() {
                PROTOCOL_VERSION => {
                    let Key(version) = map.next_value()?;
                    current = version == ProtocolVersion::V_2026_07_28.as_str();
                }
                CLIENT_CAPABILITIES => meta.client_capabilities = Some(map.next_value()?),
                // Optional: a value that does not decode is ignored.
                LOG_LEVEL => meta.log_level = decoded(map.next_value()?),
                PROGRESS_TOKEN => meta.progress_token = decoded(map.next_value()?),
                key if quiver_mcp::is_forwarded_meta_key(key) => {
                    forwarded.insert(key.to_owned(), map.next_value()?);
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if !current {
            return Err(de::Error::custom("not a request of 2026-07-28"));
        }
        if meta.client_capabilities.is_none() {
            return Err(de::Error::missing_field(CLIENT_CAPABILITIES));
        }
        meta.forwarded =
            (!forwarded.is_empty()).then_some(RequestMetaObject(MetaObject(forwarded)));
        Ok(CurrentMeta(meta))
    }
}

fn decoded<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Option<T> {
    T::deserialize(value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{NumberOrString, ProgressToken};
    use serde_json::json;

    fn current(meta: serde_json::Value) -> Option<RequestMeta> {
        serde_json::from_value::<CurrentMeta>(meta)
            .ok()
            .map(|CurrentMeta(meta)| meta)
    }

    #[test]
    fn the_keys_are_the_ones_rmcp_names() {
        let mut meta = RequestMetaObject::default();
        meta.set_protocol_version(ProtocolVersion::V_2026_07_28);
        meta.set_client_capabilities(ClientCapabilities::default());
        meta.set_log_level(LoggingLevel::Warning);
        meta.set_progress_token(ProgressToken(NumberOrString::Number(3)));
        let read = current(serde_json::to_value(&meta).unwrap()).expect("current");
        assert_eq!(
            read.client_capabilities,
            Some(ClientCapabilities::default())
        );
        assert_eq!(read.log_level, Some(LoggingLevel::Warning));
        assert_eq!(
            read.progress_token,
            Some(ProgressToken(NumberOrString::Number(3)))
        );
        assert!(read.forwarded.is_none());
    }

    #[test]
    fn read_from_the_body_as_from_rmcp() {
        let body = json!({
            PROTOCOL_VERSION: "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
            CLIENT_CAPABILITIES: {"elicitation": {"form": {}}},
            LOG_LEVEL: "loud",
            PROGRESS_TOKEN: "p",
            "io.quiver/approval": "a1",
            "traceparent": "00-1-2-01",
        });
        let read = current(body.clone()).expect("current");
        let rmcp: RequestMetaObject = serde_json::from_value(body).unwrap();
        let of = RequestMeta::of(&rmcp);
        assert_eq!(read.client_capabilities, of.client_capabilities);
        assert!(read.client_capabilities.unwrap().elicitation.is_some());
        // An unknown level is no level, as rmcp's accessor has it.
        assert_eq!((read.log_level, of.log_level), (None, None));
        assert_eq!(read.progress_token, of.progress_token);
        assert_eq!(read.forwarded, of.forwarded);
        assert_eq!(
            read.forwarded
                .expect("passed on")
                .0
                .0
                .keys()
                .collect::<Vec<_>>(),
            ["io.quiver/approval", "traceparent"]
        );
    }

    #[test]
    fn only_a_complete_current_meta_decodes() {
        let complete = json!({PROTOCOL_VERSION: "2026-07-28", CLIENT_CAPABILITIES: {}});
        assert!(current(complete.clone()).is_some());
        for (case, meta) in [
            ("no version", json!({CLIENT_CAPABILITIES: {}})),
            (
                "an older version",
                json!({PROTOCOL_VERSION: "2025-11-25", CLIENT_CAPABILITIES: {}}),
            ),
            (
                "a version not text",
                json!({PROTOCOL_VERSION: 20260728, CLIENT_CAPABILITIES: {}}),
            ),
            ("no capabilities", json!({PROTOCOL_VERSION: "2026-07-28"})),
            (
                "capabilities not an object",
                json!({PROTOCOL_VERSION: "2026-07-28", CLIENT_CAPABILITIES: "all"}),
            ),
            ("not an object", json!(["2026-07-28"])),
        ] {
            assert!(current(meta.clone()).is_none(), "{case}");
            // rmcp would find the same keys missing.
            let rmcp: Option<RequestMetaObject> = serde_json::from_value(meta).ok();
            assert!(
                rmcp.is_none_or(|meta| {
                    meta.protocol_version() != Some(ProtocolVersion::V_2026_07_28)
                        || !meta
                            .missing_required_keys(&ProtocolVersion::V_2026_07_28)
                            .is_empty()
                }),
                "{case}"
            );
        }
    }
}
