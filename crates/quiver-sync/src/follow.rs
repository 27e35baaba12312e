//! Applying watch events to the published snapshot (R-SYNC-2, R-SYNC-5).
//!
//! Events carry the upserted records as of their revision; from a registry
//! that sends ids only (an older one, or a replay older than its cache) the
//! records are fetched one by one with `GetMcpServer`. A fetch returns the
//! record as it is *now*, which may
//! be newer than the event being applied (a later change is already
//! committed, its event still on the way). Publishing such a record under
//! the event's revision would show a state the registry never had, so the
//! follower keeps applying events without publishing until it has reached
//! every revision it has fetched (`target`) and seen the delete of every
//! record it found missing (`awaiting_delete`). Only then is the working set
//! exactly the registry at `applied`, and it is swapped in as one snapshot.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use quiver_model::StoredServer;
use quiver_proto::v1 as pb;

use crate::SyncError;
use crate::client::{Listed, convert_access};
use crate::snapshot::{AccessMap, Shared, Snapshot, same};

/// Events applied without reaching a publishable state before the follower
/// gives up chasing a write storm and lists instead.
pub(crate) const MAX_DEFERRED_EVENTS: usize = 256;

/// What to do with a watch event.
pub(crate) enum Plan {
    /// Already covered (by a list taken after it was committed).
    Skip,
    /// Apply it after fetching these ids.
    Fetch(Vec<String>),
}

pub(crate) struct Follower {
    shared: Arc<Shared>,
    published: Arc<Snapshot>,
    working: BTreeMap<String, Arc<StoredServer>>,
    working_access: AccessMap,
    /// Last revision whose change is in `working`.
    applied: u64,
    /// Highest revision of any record in `working`.
    target: u64,
    /// Records fetched as missing whose delete event has not been applied.
    awaiting_delete: BTreeSet<String>,
    /// Ids changed in `working` since the last publish.
    touched: BTreeSet<String>,
    /// Events applied since the last publish.
    deferred: usize,
}

impl Follower {
    /// Starts from a full list (every (re)connect). The list is
    /// authoritative, so it is adopted even if its revision is lower than the
    /// published one: the registry's database was restored from a backup or
    /// replaced, and keeping the newer snapshot would serve records that
    /// registry no longer has, with a watch that can never resume. This is
    /// the one way a snapshot revision moves backwards; within one
    /// connection an older list is ignored ([`Follower::offer`]).
    pub(crate) fn from_list(shared: Arc<Shared>, listed: Listed) -> Self {
        let published = shared.current();
        if shared.is_ready() && listed.revision < published.revision {
            tracing::warn!(
                listed = listed.revision,
                published = published.revision,
                "registry revision went backwards; adopting the registry's state"
            );
        }
        let mut follower = Follower::resume(shared);
        follower.adopt(listed);
        follower
    }

    /// Continues from the published snapshot (a watch resumed after it).
    pub(crate) fn resume(shared: Arc<Shared>) -> Self {
        let published = shared.current();
        Follower {
            shared,
            working: published.servers.clone(),
            working_access: published.access.clone(),
            applied: published.revision,
            target: published.revision,
            published,
            awaiting_delete: BTreeSet::new(),
            touched: BTreeSet::new(),
            deferred: 0,
        }
    }

    pub(crate) fn applied(&self) -> u64 {
        self.applied
    }

    /// Whether the follower has chased newer records for too long.
    pub(crate) fn is_stuck(&self) -> bool {
        self.deferred > MAX_DEFERRED_EVENTS
    }

    /// A list taken while following (the safety-net poll, or a way out of a
    /// long deferral). Adopted only if at least as new as everything the
    /// follower has seen; an older one raced with the stream and is ignored.
    pub(crate) fn offer(&mut self, listed: Listed) {
        if listed.revision < self.applied.max(self.target) {
            tracing::debug!(
                listed = listed.revision,
                applied = self.applied,
                "poll returned an older revision than the watch; ignored"
            );
            return;
        }
        self.adopt(listed);
    }

    fn adopt(&mut self, listed: Listed) {
        let published = &self.published;
        let servers: BTreeMap<String, Arc<StoredServer>> = listed
            .servers
            .into_iter()
            .map(|server| {
                let id = server.spec.server_id.clone();
                // Unchanged records keep their allocation: consumers may
                // compare by pointer and keep whatever they built from it.
                let server = match published.servers.get(&id) {
                    Some(old) if **old == server => old.clone(),
                    _ => Arc::new(server),
                };
                (id, server)
            })
            .collect();
        let access: AccessMap = listed
            .access
            .into_iter()
            .map(|record| {
                let key = (record.spec.kind(), record.spec.name().to_owned());
                let record = match published.access.get(&key) {
                    Some(old) if **old == record => old.clone(),
                    _ => Arc::new(record),
                };
                (key, record)
            })
            .collect();
        let access_changed = access != published.access;
        let snapshot = Snapshot {
            revision: listed.revision,
            servers,
            access,
        };
        let changed = snapshot.changed_since(published);
        self.working = snapshot.servers.clone();
        self.working_access = snapshot.access.clone();
        self.applied = snapshot.revision;
        self.target = snapshot.revision;
        self.awaiting_delete.clear();
        self.touched.clear();
        self.deferred = 0;
        if changed.is_empty()
            && !access_changed
            && snapshot.revision == published.revision
            && self.shared.is_ready()
        {
            return;
        }
        if !changed.is_empty() && snapshot.revision == published.revision {
            tracing::warn!(
                revision = snapshot.revision,
                changed = changed.len(),
                "full list differs from the snapshot at the same revision; republishing"
            );
        }
        tracing::debug!(
            revision = snapshot.revision,
            changed = changed.len(),
            "full resync"
        );
        self.published = self.shared.publish(snapshot, changed);
    }

    /// What an event needs; an error when it does not follow `applied`.
    pub(crate) fn plan(&self, event: &pb::WatchMcpServersResponse) -> Result<Plan, SyncError> {
        if event.heartbeat {
            // A heartbeat repeats the last revision the stream sent; one
            // beyond what was applied means an event went missing.
            return if event.revision > self.applied {
                Err(SyncError::RevisionGap {
                    after: self.applied,
                    got: event.revision,
                })
            } else {
                Ok(Plan::Skip)
            };
        }
        if event.revision <= self.applied {
            return Ok(Plan::Skip);
        }
        if event.revision != self.applied + 1 {
            return Err(SyncError::RevisionGap {
                after: self.applied,
                got: event.revision,
            });
        }
        let fetch = event
            .upserts
            .iter()
            .filter(|id| {
                // A copy at least as new as this event is already held.
                self.working
                    .get(*id)
                    .is_none_or(|held| held.revision < event.revision)
            })
            .cloned()
            .collect::<BTreeSet<_>>();
        Ok(Plan::Fetch(fetch.into_iter().collect()))
    }

    /// Applies an event planned with [`Self::plan`] and the records fetched
    /// for it (`None`: not found).
    /// Applies the access records an event carries (always whole: no
    /// fetch). Called with [`Self::apply`] for the same event.
    pub(crate) fn apply_access(
        &mut self,
        event: &pb::WatchMcpServersResponse,
    ) -> Result<(), SyncError> {
        for deleted in &event.access_deletes {
            let kind = quiver_proto::access::access_kind_from(deleted.kind).map_err(|source| {
                SyncError::Conversion {
                    server_id: format!("access record {:?}", deleted.name),
                    source,
                }
            })?;
            self.working_access.remove(&(kind, deleted.name.clone()));
        }
        for record in &event.access_upserts {
            let record = convert_access(record.clone())?;
            let key = (record.spec.kind(), record.spec.name().to_owned());
            self.working_access.insert(key, Arc::new(record));
        }
        Ok(())
    }

    pub(crate) fn apply(
        &mut self,
        event: &pb::WatchMcpServersResponse,
        fetched: Vec<(String, Option<StoredServer>)>,
    ) {
        for id in &event.deletes {
            self.awaiting_delete.remove(id);
            // A copy newer than the delete is a later re-create, already
            // fetched; its own event is still to come.
            if self
                .working
                .get(id)
                .is_none_or(|held| held.revision <= event.revision)
            {
                self.working.remove(id);
            }
            self.touched.insert(id.clone());
        }
        for (id, server) in fetched {
            match server {
                Some(server) => {
                    self.awaiting_delete.remove(&id);
                    self.target = self.target.max(server.revision);
                    let server = match self.working.get(&id) {
                        Some(held) if **held == server => held.clone(),
                        _ => Arc::new(server),
                    };
                    self.working.insert(id.clone(), server);
                }
                None => {
                    // Deleted after this event: its delete event is coming.
                    self.working.remove(&id);
                    self.awaiting_delete.insert(id.clone());
                }
            }
            self.touched.insert(id);
        }
        self.applied = event.revision;
        self.deferred += 1;
    }

    /// Publishes the working set if it is exactly the registry at `applied`.
    pub(crate) fn publish_if_consistent(&mut self) {
        if self.applied <= self.published.revision
            || self.applied < self.target
            || !self.awaiting_delete.is_empty()
        {
            return;
        }
        let changed: BTreeSet<String> = std::mem::take(&mut self.touched)
            .into_iter()
            .filter(
                |id| match (self.published.servers.get(id), self.working.get(id)) {
                    (Some(old), Some(new)) => !same(old, new),
                    (None, None) => false,
                    _ => true,
                },
            )
            .collect();
        let snapshot = Snapshot {
            revision: self.applied,
            servers: self.working.clone(),
            access: self.working_access.clone(),
        };
        self.deferred = 0;
        self.published = self.shared.publish(snapshot, changed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::server;

    fn event(revision: u64, upserts: &[&str], deletes: &[&str]) -> pb::WatchMcpServersResponse {
        pb::WatchMcpServersResponse {
            revision,
            upserts: upserts.iter().map(|s| (*s).to_owned()).collect(),
            deletes: deletes.iter().map(|s| (*s).to_owned()).collect(),
            ..Default::default()
        }
    }

    fn follower(revision: u64, records: &[(&str, u64)]) -> (Follower, Arc<Shared>) {
        let shared = Shared::new();
        let listed = Listed {
            revision,
            servers: records.iter().map(|(id, rev)| server(id, *rev)).collect(),
            access: vec![],
        };
        (Follower::from_list(shared.clone(), listed), shared)
    }

    fn fetch_ids(plan: Plan) -> Vec<String> {
        match plan {
            Plan::Fetch(ids) => ids,
            Plan::Skip => panic!("expected a fetch"),
        }
    }

    #[test]
    fn a_fetch_newer_than_the_event_waits_for_its_event() {
        let (mut f, shared) = follower(1, &[("a", 1), ("b", 1)]);
        let e2 = event(2, &["a"], &[]);
        assert_eq!(fetch_ids(f.plan(&e2).unwrap()), ["a"]);
        f.apply(&e2, vec![("a".into(), Some(server("a", 3)))]);
        f.publish_if_consistent();
        assert_eq!(shared.current().revision, 1, "a@3 must not be labelled 2");

        let e3 = event(3, &["a"], &[]);
        assert!(fetch_ids(f.plan(&e3).unwrap()).is_empty(), "a@3 is held");
        f.apply(&e3, vec![]);
        f.publish_if_consistent();
        let snap = shared.current();
        assert_eq!(snap.revision, 3);
        assert_eq!(snap.get("a").unwrap().revision, 3);
    }

    #[test]
    fn a_record_found_missing_waits_for_its_delete() {
        let (mut f, shared) = follower(1, &[("a", 1), ("b", 1)]);
        let before = shared.current();
        let e2 = event(2, &["b"], &[]);
        f.apply(&e2, vec![("b".into(), None)]);
        f.publish_if_consistent();
        assert_eq!(shared.current().revision, 1);
        let e3 = event(3, &[], &["b"]);
        f.apply(&e3, vec![]);
        f.publish_if_consistent();
        let snap = shared.current();
        assert_eq!(snap.revision, 3);
        assert!(snap.get("b").is_none());
        assert!(Arc::ptr_eq(
            snap.get("a").unwrap(),
            before.get("a").unwrap()
        ));
    }

    #[test]
    fn access_records_follow_events_and_are_published_with_the_revision() {
        use quiver_model::Source;
        use quiver_model::access::{AccessKind, AccessSpec, PolicyRecord, StoredAccess};
        let (mut f, shared) = follower(1, &[("a", 1)]);
        let record = StoredAccess {
            spec: AccessSpec::Policy(PolicyRecord {
                name: "team-a".into(),
                policy: Default::default(),
            }),
            revision: 2,
            created_at: Default::default(),
            updated_at: Default::default(),
            updated_by: "admin".into(),
            source: Source::Admin,
        };
        let upsert = pb::WatchMcpServersResponse {
            revision: 2,
            access_upserts: vec![(&record).into()],
            ..Default::default()
        };
        assert!(fetch_ids(f.plan(&upsert).unwrap()).is_empty());
        f.apply_access(&upsert).unwrap();
        f.apply(&upsert, vec![]);
        f.publish_if_consistent();
        let key = (AccessKind::Policy, "team-a".to_owned());
        assert_eq!(shared.current().revision, 2);
        assert_eq!(
            shared.current().access.get(&key).map(|r| r.revision),
            Some(2)
        );
        let delete = pb::WatchMcpServersResponse {
            revision: 3,
            access_deletes: vec![(AccessKind::Policy, "team-a").into()],
            ..Default::default()
        };
        f.apply_access(&delete).unwrap();
        f.apply(&delete, vec![]);
        f.publish_if_consistent();
        assert!(shared.current().access.is_empty());
        let broken = pb::WatchMcpServersResponse {
            revision: 4,
            access_upserts: vec![pb::AccessRecord {
                spec_json: "{}".into(),
                ..(&record).into()
            }],
            ..Default::default()
        };
        assert!(f.apply_access(&broken).is_err());
    }

    #[test]
    fn gaps_and_duplicates() {
        let (f, _) = follower(5, &[]);
        assert!(matches!(f.plan(&event(4, &["x"], &[])), Ok(Plan::Skip)));
        assert!(matches!(
            f.plan(&event(7, &["x"], &[])),
            Err(SyncError::RevisionGap { after: 5, got: 7 })
        ));
        let heartbeat = pb::WatchMcpServersResponse {
            revision: 6,
            heartbeat: true,
            ..Default::default()
        };
        assert!(f.plan(&heartbeat).is_err());
    }

    #[test]
    fn an_unchanged_list_publishes_nothing() {
        let (mut f, shared) = follower(2, &[("a", 1), ("b", 2)]);
        let mut updates = crate::SnapshotHandle {
            shared: shared.clone(),
        }
        .subscribe();
        updates.mark_unchanged();
        f.offer(Listed {
            revision: 2,
            servers: vec![server("a", 1), server("b", 2)],
            access: vec![],
        });
        assert!(!updates.has_changed().unwrap());
        f.offer(Listed {
            revision: 3,
            servers: vec![server("a", 1), server("b", 3)],
            access: vec![],
        });
        let update = updates.borrow_and_update().clone();
        assert_eq!(update.snapshot.revision, 3);
        assert_eq!(update.changed, BTreeSet::from(["b".to_owned()]));
    }

    #[test]
    fn a_list_ahead_of_the_stream_covers_the_events_in_between() {
        let (mut f, shared) = follower(3, &[("a", 3)]);
        f.offer(Listed {
            revision: 5,
            servers: vec![server("a", 5)],
            access: vec![],
        });
        assert_eq!(shared.current().revision, 5);
        assert!(matches!(f.plan(&event(4, &["a"], &[])), Ok(Plan::Skip)));
        assert!(matches!(f.plan(&event(5, &["a"], &[])), Ok(Plan::Skip)));
        assert_eq!(fetch_ids(f.plan(&event(6, &["a"], &[])).unwrap()), ["a"]);
        // An older list (taken before the stream moved on) is ignored.
        f.offer(Listed {
            revision: 4,
            servers: vec![],
            access: vec![],
        });
        assert_eq!(shared.current().revision, 5);
    }

    #[test]
    fn a_registry_restored_from_a_backup_is_adopted_at_its_lower_revision() {
        let (_, shared) = follower(7, &[("a", 7), ("b", 5)]);
        let mut updates = crate::SnapshotHandle {
            shared: shared.clone(),
        }
        .subscribe();
        updates.mark_unchanged();
        // Reconnected to the registry restored as of revision 4.
        let restored = Listed {
            revision: 4,
            servers: vec![server("a", 4)],
            access: vec![],
        };
        let f = Follower::from_list(shared.clone(), restored);
        let snap = shared.current();
        assert_eq!((snap.revision, f.applied()), (4, 4));
        assert_eq!(snap.get("a").unwrap().revision, 4);
        assert!(snap.get("b").is_none());
        let update = updates.borrow_and_update().clone();
        assert_eq!(
            update.changed,
            BTreeSet::from(["a".to_owned(), "b".to_owned()])
        );
        // The restored registry's next change follows from there.
        assert_eq!(fetch_ids(f.plan(&event(5, &["c"], &[])).unwrap()), ["c"]);
    }

    #[test]
    fn chasing_newer_records_for_too_long_asks_for_a_list() {
        let (mut f, shared) = follower(1, &[]);
        let mut revision = 1;
        while !f.is_stuck() {
            revision += 1;
            let e = event(revision, &["hot"], &[]);
            // Each fetch is already one revision ahead of its event.
            f.apply(&e, vec![("hot".into(), Some(server("hot", revision + 1)))]);
            f.publish_if_consistent();
        }
        assert_eq!(shared.current().revision, 1, "never consistent");
        assert_eq!(revision as usize, MAX_DEFERRED_EVENTS + 2);
    }
}
