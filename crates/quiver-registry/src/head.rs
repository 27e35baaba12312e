//! The registry's in-memory head: every record as of one revision, kept by
//! the change feed's pump from the same feed that drives the watchers, so
//! every replica's head follows every replica's commits (docs/reference.md §3).
//!
//! Lists are served from it rather than from the database, and each list
//! encoding (the gRPC message, the REST body masked and unmasked) is made
//! once per revision and reused until the head moves on.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use quiver_model::StoredServer;
use quiver_model::access::{AccessKind, StoredAccess};
use quiver_proto::v1 as pb;
use serde::Serialize;

/// Access records by kind and name.
pub type AccessMap = BTreeMap<(AccessKind, String), Arc<StoredAccess>>;

/// Every record as of `revision`; immutable once published.
#[derive(Debug, Default)]
pub struct HeadView {
    /// The revision the records are as of.
    pub revision: u64,
    /// Every record, by id.
    pub servers: BTreeMap<String, Arc<StoredServer>>,
    /// Every access record, by kind and name.
    pub access: AccessMap,
    grpc: OnceLock<Bytes>,
    rest: [OnceLock<Bytes>; 2],
}

impl HeadView {
    /// A view of `servers` and `access` as of `revision`.
    pub fn new(
        revision: u64,
        servers: BTreeMap<String, Arc<StoredServer>>,
        access: AccessMap,
    ) -> Self {
        HeadView {
            revision,
            servers,
            access,
            grpc: OnceLock::new(),
            rest: [OnceLock::new(), OnceLock::new()],
        }
    }

    /// A view of a store's list.
    pub fn from_list(listed: quiver_store::Snapshot) -> Self {
        let servers = listed
            .servers
            .into_iter()
            .map(|s| (s.spec.server_id.clone(), Arc::new(s)))
            .collect();
        let access = listed
            .access
            .into_iter()
            .map(|a| ((a.spec.kind(), a.spec.name().to_owned()), Arc::new(a)))
            .collect();
        HeadView::new(listed.revision, servers, access)
    }

    /// One access record.
    pub fn access_record(&self, kind: AccessKind, name: &str) -> Option<&Arc<StoredAccess>> {
        self.access.get(&(kind, name.to_owned()))
    }

    /// The access records of one kind, by name.
    pub fn access_of(&self, kind: AccessKind) -> impl Iterator<Item = &Arc<StoredAccess>> {
        self.access
            .range((kind, String::new())..)
            .take_while(move |((k, _), _)| *k == kind)
            .map(|(_, record)| record)
    }

    /// The `ListMcpServersResponse` message, encoded once.
    pub fn grpc_list(&self) -> Bytes {
        self.grpc
            .get_or_init(|| {
                let started = std::time::Instant::now();
                let bytes = Bytes::from(prost::Message::encode_to_vec(&self.list_message()));
                metrics::histogram!("quiver_registry_list_encode_seconds", "api" => "grpc")
                    .record(started.elapsed().as_secs_f64());
                bytes
            })
            .clone()
    }

    /// The `ListMcpServersResponse` message with the access records (not
    /// cached: prefer [`Self::grpc_list`]).
    pub fn list_message(&self) -> pb::ListMcpServersResponse {
        pb::ListMcpServersResponse {
            revision: self.revision,
            servers: self.servers.values().map(|s| s.as_ref().into()).collect(),
            access: self.access.values().map(|a| a.as_ref().into()).collect(),
        }
    }

    /// The REST list body `{"revision": …, "servers": […]}`, with literal
    /// env/header values masked or not, encoded once per flavour.
    pub fn rest_list(&self, masked: bool) -> Bytes {
        self.rest[usize::from(masked)]
            .get_or_init(|| {
                let started = std::time::Instant::now();
                let body = RestList {
                    revision: self.revision,
                    servers: self
                        .servers
                        .values()
                        .map(|s| Presented { server: s, masked })
                        .collect(),
                };
                // Serialising plain data cannot fail.
                let bytes = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
                metrics::histogram!("quiver_registry_list_encode_seconds", "api" => "rest")
                    .record(started.elapsed().as_secs_f64());
                bytes
            })
            .clone()
    }
}

#[derive(Serialize)]
struct RestList<'a> {
    revision: u64,
    servers: Vec<Presented<'a>>,
}

/// One record as a REST read shows it.
struct Presented<'a> {
    server: &'a StoredServer,
    masked: bool,
}

impl Serialize for Presented<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.masked {
            StoredServer {
                spec: self.server.spec.masked(),
                ..self.server.clone()
            }
            .serialize(serializer)
        } else {
            self.server.serialize(serializer)
        }
    }
}

#[cfg(test)]
mod tests {
    use quiver_model::{McpServerSpec, Source, StdioConfig, Transport};

    use super::*;

    fn record(id: &str, revision: u64) -> StoredServer {
        let mut spec = McpServerSpec::new(id, Transport::Stdio);
        spec.stdio = Some(StdioConfig {
            command: "npx".into(),
            env: [("API_KEY".to_owned(), "sk-secret".to_owned())].into(),
            ..Default::default()
        });
        let at = chrono::DateTime::from_timestamp_millis(1_700_000_000_000).unwrap_or_default();
        StoredServer {
            spec,
            revision,
            created_at: at,
            updated_at: at,
            updated_by: "ann".into(),
            source: Source::Api,
        }
    }

    #[test]
    fn encodings_match_the_plain_ones_and_are_made_once() {
        let servers: BTreeMap<_, _> = [record("a", 1), record("b", 2)]
            .into_iter()
            .map(|s| (s.spec.server_id.clone(), Arc::new(s)))
            .collect();
        let view = HeadView::new(2, servers, AccessMap::new());
        let grpc = view.grpc_list();
        let decoded: pb::ListMcpServersResponse = prost::Message::decode(grpc.clone()).unwrap();
        assert_eq!(decoded, view.list_message());
        assert_eq!(grpc.as_ptr(), view.grpc_list().as_ptr(), "encoded once");

        let plain: serde_json::Value = serde_json::from_slice(&view.rest_list(false)).unwrap();
        let expected = serde_json::json!({
            "revision": 2,
            "servers": view.servers.values().map(|s| s.as_ref()).collect::<Vec<_>>(),
        });
        assert_eq!(plain, expected);
        let masked = String::from_utf8(view.rest_list(true).to_vec()).unwrap();
        assert!(!masked.contains("sk-secret"), "{masked}");
        assert!(
            String::from_utf8(view.rest_list(false).to_vec())
                .unwrap()
                .contains("sk-secret")
        );
    }
}
