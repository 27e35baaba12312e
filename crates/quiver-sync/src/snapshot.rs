//! Immutable snapshots of the registry and the handle that reads them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::{ArcSwap, ArcSwapOption};
use quiver_model::StoredServer;
use quiver_model::access::{AccessKind, StoredAccess};
use tokio::sync::{Notify, watch};

/// The registry's records as of one revision. Never mutated once published:
/// a change produces a new snapshot that shares the untouched records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Registry revision this snapshot reflects: every record is exactly as
    /// stored at this revision.
    pub revision: u64,
    /// Records by `server_id`.
    pub servers: BTreeMap<String, Arc<StoredServer>>,
    /// Who may call (policies, API keys, identity providers), by kind and
    /// name, exactly as of `revision`.
    pub access: AccessMap,
}

/// Access records by kind and name.
pub type AccessMap = BTreeMap<(AccessKind, String), Arc<StoredAccess>>;

impl Snapshot {
    /// One record.
    pub fn get(&self, server_id: &str) -> Option<&Arc<StoredServer>> {
        self.servers.get(server_id)
    }

    /// Ids whose record differs between `older` and `self`: upserted,
    /// changed or deleted.
    pub fn changed_since(&self, older: &Snapshot) -> BTreeSet<String> {
        let mut changed: BTreeSet<String> = self
            .servers
            .iter()
            .filter(|(id, new)| !older.servers.get(*id).is_some_and(|old| same(old, new)))
            .map(|(id, _)| id.clone())
            .collect();
        changed.extend(
            older
                .servers
                .keys()
                .filter(|id| !self.servers.contains_key(*id))
                .cloned(),
        );
        changed
    }
}

/// Equal records, cheaply when they are the same allocation.
pub(crate) fn same(a: &Arc<StoredServer>, b: &Arc<StoredServer>) -> bool {
    Arc::ptr_eq(a, b) || a == b
}

/// One published snapshot and what it changed.
#[derive(Debug, Clone, Default)]
pub struct SnapshotUpdate {
    /// The new snapshot.
    pub snapshot: Arc<Snapshot>,
    /// The snapshot it replaced.
    pub previous: Arc<Snapshot>,
    /// Ids whose record differs between `previous` and `snapshot`. Empty
    /// when only the revision moved (e.g. a record created and deleted).
    pub changed: BTreeSet<String>,
    /// Whether the access records differ between `previous` and `snapshot`.
    pub access_changed: bool,
}

impl SnapshotUpdate {
    /// What changed since `seen`, the last snapshot a consumer processed. A
    /// `watch` receiver only keeps the latest update, so a consumer that
    /// skipped some gets the full difference instead of `changed` alone.
    pub fn changed_since(&self, seen: &Arc<Snapshot>) -> BTreeSet<String> {
        if Arc::ptr_eq(seen, &self.previous) {
            self.changed.clone()
        } else {
            self.snapshot.changed_since(seen)
        }
    }

    /// Whether the access records changed since `seen` (see
    /// [`Self::changed_since`]).
    pub fn access_changed_since(&self, seen: &Arc<Snapshot>) -> bool {
        if Arc::ptr_eq(seen, &self.previous) {
            self.access_changed
        } else {
            seen.access != self.snapshot.access
        }
    }
}

/// State shared by the service and its handles.
pub(crate) struct Shared {
    current: ArcSwap<Snapshot>,
    updates: watch::Sender<SnapshotUpdate>,
    ready: watch::Sender<bool>,
    degraded: AtomicBool,
    last_error: ArcSwapOption<String>,
    /// The registry replica being followed.
    registry: ArcSwapOption<String>,
    /// Wakes the status reporter: a new snapshot or a degraded flip.
    pub(crate) status_changed: Notify,
}

impl Shared {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Shared {
            current: ArcSwap::from_pointee(Snapshot::default()),
            updates: watch::Sender::new(SnapshotUpdate::default()),
            ready: watch::Sender::new(false),
            degraded: AtomicBool::new(false),
            last_error: ArcSwapOption::empty(),
            registry: ArcSwapOption::empty(),
            status_changed: Notify::new(),
        })
    }

    pub(crate) fn current(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    pub(crate) fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    pub(crate) fn is_degraded(&self) -> bool {
        self.degraded.load(Ordering::Acquire)
    }

    /// Swaps in `snapshot`; only the sync task calls this, so `previous` is
    /// exactly what readers saw before.
    pub(crate) fn publish(&self, snapshot: Snapshot, changed: BTreeSet<String>) -> Arc<Snapshot> {
        let snapshot = Arc::new(snapshot);
        let previous = self.current.swap(snapshot.clone());
        // `current()` is updated first so a subscriber woken by this update
        // never reads an older snapshot than the one it was told about.
        let access_changed = previous.access != snapshot.access;
        self.updates.send_replace(SnapshotUpdate {
            snapshot: snapshot.clone(),
            previous,
            changed,
            access_changed,
        });
        self.ready
            .send_if_modified(|ready| !std::mem::replace(ready, true));
        metrics::gauge!("quiver_worker_snapshot_revision").set(snapshot.revision as f64);
        self.status_changed.notify_one();
        snapshot
    }

    pub(crate) fn set_degraded(&self, error: &crate::SyncError) {
        self.last_error.store(Some(Arc::new(error.to_string())));
        if !self.degraded.swap(true, Ordering::AcqRel) {
            metrics::gauge!("quiver_worker_registry_degraded").set(1.0);
            self.status_changed.notify_one();
        }
    }

    pub(crate) fn set_registry(&self, url: &str) {
        self.registry.store(Some(Arc::new(url.to_owned())));
    }

    pub(crate) fn clear_degraded(&self) {
        if self.degraded.swap(false, Ordering::AcqRel) {
            tracing::info!(
                revision = self.current().revision,
                "registry sync recovered"
            );
            metrics::gauge!("quiver_worker_registry_degraded").set(0.0);
            self.status_changed.notify_one();
        }
    }
}

/// Read side of the sync; cheap to clone, never blocks.
#[derive(Clone)]
pub struct SnapshotHandle {
    pub(crate) shared: Arc<Shared>,
}

impl SnapshotHandle {
    /// The latest snapshot (an empty one at revision 0 until ready). A
    /// lock-free load: call it per request.
    pub fn current(&self) -> Arc<Snapshot> {
        self.shared.current()
    }

    /// Every published snapshot with its changed ids. The receiver holds the
    /// latest update only; see [`SnapshotUpdate::changed_since`].
    pub fn subscribe(&self) -> watch::Receiver<SnapshotUpdate> {
        self.shared.updates.subscribe()
    }

    /// Whether a first snapshot was loaded from the registry.
    pub fn is_ready(&self) -> bool {
        self.shared.is_ready()
    }

    /// Waits for the first snapshot and returns the current one. Waits
    /// forever if the registry is never reached: bound it with a timeout.
    pub async fn wait_ready(&self) -> Arc<Snapshot> {
        let mut ready = self.shared.ready.subscribe();
        // The sender lives in `Shared`, which `self` keeps alive, so this
        // only returns once ready.
        let _ = ready.wait_for(|ready| *ready).await;
        self.current()
    }

    /// Whether the last attempt to refresh from the registry failed: the
    /// current snapshot may be stale.
    pub fn is_degraded(&self) -> bool {
        self.shared.is_degraded()
    }

    /// The URL of the registry replica being followed (or tried next).
    pub fn registry(&self) -> Option<String> {
        self.shared
            .registry
            .load_full()
            .map(|url| url.as_ref().clone())
    }

    /// The most recent refresh failure, kept after recovery so flapping
    /// connections stay visible; [`Self::is_degraded`] says whether it still
    /// applies.
    pub fn last_error(&self) -> Option<String> {
        self.shared
            .last_error
            .load_full()
            .map(|e| e.as_ref().clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::server;

    fn snapshot(revision: u64, records: &[(&str, u64)]) -> Snapshot {
        Snapshot {
            revision,
            servers: records
                .iter()
                .map(|(id, rev)| ((*id).to_owned(), Arc::new(server(id, *rev))))
                .collect(),
            access: AccessMap::new(),
        }
    }

    #[test]
    fn changed_since_names_upserts_and_deletes() {
        let old = snapshot(3, &[("a", 1), ("b", 2), ("c", 3)]);
        let new = snapshot(5, &[("a", 1), ("b", 4), ("d", 5)]);
        let ids: Vec<_> = new.changed_since(&old).into_iter().collect();
        assert_eq!(ids, ["b", "c", "d"]);
        assert!(new.changed_since(&new.clone()).is_empty());
    }

    #[test]
    fn update_diffs_against_a_skipped_snapshot() {
        let first = Arc::new(snapshot(1, &[("a", 1)]));
        let second = Arc::new(snapshot(2, &[("a", 1), ("b", 2)]));
        let third = Arc::new(snapshot(3, &[("a", 3), ("b", 2)]));
        let update = SnapshotUpdate {
            snapshot: third.clone(),
            previous: second.clone(),
            changed: ["a".to_owned()].into(),
            access_changed: false,
        };
        assert_eq!(update.changed_since(&second), update.changed);
        let skipped: Vec<_> = update.changed_since(&first).into_iter().collect();
        assert_eq!(skipped, ["a", "b"]);
    }
}
