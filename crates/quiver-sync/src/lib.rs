//! The worker's view of the registry (docs/reference.md §6).
//!
//! [`SyncService`] lists the registry's records, then follows
//! `WatchMcpServers` from that revision, taking each upserted record from
//! its event (or, when the event does not carry it, fetching it with
//! `GetMcpServer`), and publishes every consistent state as an immutable
//! [`Snapshot`] swapped atomically behind a [`SnapshotHandle`]: readers call
//! [`SnapshotHandle::current`] per request without locking, and subscribers
//! learn which server ids changed so caches and connections of untouched
//! servers survive (R-SYNC-6).
//!
//! Failures never empty the snapshot. A failed call, a stream that ends, a
//! stream that goes silent for longer than `stream_idle_timeout`, or a
//! `FAILED_PRECONDITION` (the worker fell behind compaction) marks the sync
//! degraded, waits a capped, jittered exponential backoff and starts over
//! with a full list on a fresh channel; the first watch that opens again
//! clears the degraded flag. A jittered low-frequency poll lists the registry
//! next to the live stream as a safety net. Status reports carry the
//! snapshot revision, the degraded flag and per-server health from an
//! optional [`HealthSource`].
//!
//! ```no_run
//! # async fn example() -> Result<(), quiver_sync::SyncError> {
//! use quiver_sync::{SyncOptions, SyncService};
//! use tokio_util::sync::CancellationToken;
//!
//! let service = SyncService::new(SyncOptions {
//!     registry_urls: vec!["http://registry:50051".into()],
//!     token: Some("worker-token".into()),
//!     worker_id: "worker-1".into(),
//!     ..Default::default()
//! })?;
//! let snapshots = service.handle();
//! let shutdown = CancellationToken::new();
//! tokio::spawn(service.run(shutdown.clone()));
//! let first = snapshots.wait_ready().await;
//! println!("{} servers at revision {}", first.servers.len(), first.revision);
//! # Ok(())
//! # }
//! ```

mod approvals;
mod client;
mod error;
mod follow;
mod key_uses;
mod oauth;
mod options;
mod report;
mod service;
mod sessions;
mod snapshot;
mod usage;

pub use approvals::{CallBinding, RegistryApprovals};
pub use error::SyncError;
pub use key_uses::KeyUses;
pub use oauth::{ConsentLink, GrantStatus, IssuedToken, RegistryTokens, TokenAnswer};
pub use options::{SyncOptions, default_registry_url};
pub use report::HealthSource;
pub use service::SyncService;
pub use sessions::RegistrySessions;
pub use snapshot::{AccessMap, Snapshot, SnapshotHandle, SnapshotUpdate};
pub use usage::{LeasedCalls, RegistryUsage};

#[cfg(test)]
mod test_support {
    use quiver_model::{McpServerSpec, StoredServer, Transport};
    use quiver_proto::v1 as pb;

    /// A minimal valid record at `revision`.
    pub(crate) fn server(id: &str, revision: u64) -> StoredServer {
        let mut spec = McpServerSpec::new(id, Transport::StreamableHttp);
        spec.http = Some(quiver_model::HttpConfig {
            url: format!("http://{id}.example"),
            ..Default::default()
        });
        let record = pb::McpServer {
            spec: Some((&spec).into()),
            revision,
            created_at: Some(Default::default()),
            updated_at: Some(Default::default()),
            updated_by: "test".into(),
            source: "api".into(),
        };
        match StoredServer::try_from(record) {
            Ok(server) => server,
            Err(err) => panic!("test record: {err}"),
        }
    }
}
