//! The gateway's rmcp [`SessionStore`]: how a worker re-creates a session it
//! does not hold (another worker opened it, or it expired here while idle).
//!
//! rmcp asks the store for a session's `initialize` parameters whenever a
//! request names a session that is not in memory, and replays the handshake
//! with them. The HTTP edge verifies every presented id (see
//! [`super::session_id`]) and tells the store what the id carries, just
//! before handing the request to rmcp; the store answers only for ids
//! verified that way (signed, unexpired, not deleted: the edge asks
//! `super::revoked` first and counts the restored session against the
//! caps), so an unsigned, expired or deleted id is never restored. The parameters of
//! sessions opened here are kept exactly (bounded); for the others the store
//! builds them from the signed protocol version.

use std::collections::HashMap;
use std::sync::Mutex;

use rmcp::model::{Implementation, InitializeRequestParams, ProtocolVersion};
use rmcp::transport::streamable_http_server::session::{
    SessionState, SessionStore, SessionStoreError,
};

/// Remembered sessions per map at most; a full map starts over (the
/// sessions are still restorable from their signed ids).
const REMEMBERED: usize = 16_384;

/// Sessions this worker may restore.
#[derive(Debug, Default)]
pub struct GatewaySessionStore {
    /// `initialize` parameters of sessions opened on this worker.
    opened: Mutex<HashMap<String, SessionState>>,
    /// Protocol versions of verified ids, by rmcp session id.
    verified: Mutex<HashMap<String, String>>,
}

fn bounded_insert<V>(map: &Mutex<HashMap<String, V>>, key: &str, value: V) {
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    if map.len() >= REMEMBERED && !map.contains_key(key) {
        map.clear();
    }
    map.insert(key.to_owned(), value);
}

impl GatewaySessionStore {
    /// Records that the id of session `inner` was verified, with the protocol
    /// version it carries.
    pub fn verified(&self, inner: &str, protocol_version: &str) {
        bounded_insert(&self.verified, inner, protocol_version.to_owned());
    }
}

/// The parameters a restored session of another worker gets: the signed
/// protocol version, and the client capabilities the gateway relays.
fn restored_params(protocol_version: &str) -> InitializeRequestParams {
    let version = serde_json::from_value(serde_json::Value::String(protocol_version.to_owned()))
        .unwrap_or(ProtocolVersion::LATEST_WITH_INITIALIZE);
    let capabilities = quiver_mcp::relay::relayed_capabilities();
    InitializeRequestParams::new(
        capabilities,
        Implementation::new("restored-session", env!("CARGO_PKG_VERSION")),
    )
    .with_protocol_version(version)
}

#[async_trait::async_trait]
impl SessionStore for GatewaySessionStore {
    async fn load(&self, session_id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        let version = self
            .verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(session_id)
            .cloned();
        let Some(version) = version else {
            return Ok(None);
        };
        let opened = self
            .opened
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(session_id)
            .cloned();
        Ok(Some(opened.unwrap_or_else(|| {
            SessionState::new(restored_params(&version))
        })))
    }

    async fn store(&self, session_id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        bounded_insert(&self.opened, session_id, state.clone());
        Ok(())
    }

    async fn delete(&self, session_id: &str) -> Result<(), SessionStoreError> {
        self.opened
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(session_id);
        self.verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(session_id);
        Ok(())
    }
}
