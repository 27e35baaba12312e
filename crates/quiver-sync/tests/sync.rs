//! The sync against a real registry served in-process on loopback (SQLite in
//! a temporary directory, admin and worker tokens). Records are written
//! through the registry's store handle, as an admin would through the API;
//! the sync only ever talks gRPC with the worker token.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use quiver_model::{McpServerSpec, Source, StdioConfig, Transport};
use quiver_proto::v1 as pb;
use quiver_store::{DeleteRequest, SqlStore, Store, UpsertRequest};
use quiver_sync::{Snapshot, SnapshotHandle, SyncOptions, SyncService};
use quiver_testkit::registry::{
    self, ADMIN_TOKEN as ADMIN, InProcessRegistry, WORKER_TOKEN as WORKER,
};
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A registry on `store` listening for gRPC on `grpc_listen`.
async fn serve(store: Arc<SqlStore>, grpc_listen: SocketAddr) -> InProcessRegistry {
    let mut options = registry::test_options();
    options.grpc_listen = grpc_listen;
    InProcessRegistry::start(store, options).await
}

/// A SQLite database in a temporary directory and the registry serving it.
struct Env {
    store: Arc<SqlStore>,
    registry: Option<InProcessRegistry>,
    _dir: tempfile::TempDir,
}

impl Env {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("registry.db").display());
        let store = Arc::new(SqlStore::open_sqlite(&url).await.unwrap());
        let registry = serve(store.clone(), "127.0.0.1:0".parse().unwrap()).await;
        Env {
            store,
            registry: Some(registry),
            _dir: dir,
        }
    }

    fn registry(&self) -> &InProcessRegistry {
        self.registry.as_ref().expect("registry is running")
    }

    fn grpc_addr(&self) -> SocketAddr {
        self.registry().grpc_addr()
    }

    async fn stop_registry(&mut self) -> SocketAddr {
        let registry = self.registry.take().expect("registry is running");
        let addr = registry.grpc_addr();
        registry.stop().await;
        addr
    }

    /// A new registry on the same database and the same gRPC address, as
    /// after a process restart.
    async fn restart_registry(&mut self, addr: SocketAddr) {
        assert!(self.registry.is_none(), "stop the registry first");
        self.registry = Some(serve(self.store.clone(), addr).await);
    }

    async fn upsert(&self, id: &str, command: &str) -> u64 {
        let mut spec = McpServerSpec::new(id, Transport::Stdio);
        spec.stdio = Some(StdioConfig {
            command: command.into(),
            ..Default::default()
        });
        spec.allowed_tools = vec!["*".into()];
        self.store
            .upsert(UpsertRequest {
                spec,
                expected_revision: None,
                actor: "test".into(),
                source: Source::Api,
            })
            .await
            .unwrap()
            .server()
            .revision
    }

    async fn delete(&self, id: &str) -> u64 {
        self.store
            .delete(DeleteRequest {
                server_id: id.into(),
                expected_revision: None,
                actor: "test".into(),
                source: Source::Api,
            })
            .await
            .unwrap()
    }

    async fn head(&self) -> u64 {
        self.store.head().await.unwrap().revision
    }

    /// The registry's records, as a snapshot to compare with.
    async fn expected(&self) -> Snapshot {
        let listed = self.store.list().await.unwrap();
        Snapshot {
            revision: listed.revision,
            servers: listed
                .servers
                .into_iter()
                .map(|s| (s.spec.server_id.clone(), Arc::new(s)))
                .collect(),
            access: listed
                .access
                .into_iter()
                .map(|a| ((a.spec.kind(), a.spec.name().to_owned()), Arc::new(a)))
                .collect(),
        }
    }

    fn sync_options(&self, worker_id: &str) -> SyncOptions {
        SyncOptions {
            registry_urls: vec![format!("http://{}", self.grpc_addr())],
            token: Some(WORKER.into()),
            worker_id: worker_id.into(),
            // Long enough never to fire unless a test asks for it.
            poll_interval: (Duration::from_secs(600), Duration::from_secs(600)),
            backoff_min: Duration::from_millis(20),
            backoff_max: Duration::from_millis(250),
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(2),
            ..Default::default()
        }
    }
}

/// A running sync; cancelled when dropped.
struct TestSync {
    handle: SnapshotHandle,
    shutdown: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl TestSync {
    fn start(service: SyncService) -> Self {
        let handle = service.handle();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(service.run(shutdown.clone()));
        TestSync {
            handle,
            shutdown,
            task: Some(task),
        }
    }

    async fn ready(options: SyncOptions) -> Self {
        let sync = TestSync::start(SyncService::new(options).unwrap());
        tokio::time::timeout(Duration::from_secs(5), sync.handle.wait_ready())
            .await
            .expect("sync not ready within 5 s");
        sync
    }
}

impl Drop for TestSync {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Polls `condition` every 10 ms until it holds or `within` runs out.
async fn eventually(what: &str, within: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn ids(set: &BTreeSet<String>) -> Vec<&str> {
    set.iter().map(String::as_str).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_snapshot_is_the_registry_at_its_revision() {
    let env = Env::new().await;
    for id in ["a", "b", "c"] {
        env.upsert(id, "x").await;
    }
    env.delete("b").await;
    let service = SyncService::new(env.sync_options("w1")).unwrap();
    let handle = service.handle();
    assert!(!handle.is_ready());
    assert_eq!(handle.current().revision, 0);

    let mut sync = TestSync::start(service);
    let snapshot = tokio::time::timeout(Duration::from_secs(5), handle.wait_ready())
        .await
        .expect("not ready within 5 s");
    assert!(handle.is_ready());
    assert_eq!(snapshot.revision, 4);
    assert_eq!(*snapshot, env.expected().await);
    assert!(!handle.is_degraded());
    assert_eq!(handle.last_error(), None);
    let first = handle.subscribe().borrow().clone();
    assert_eq!(ids(&first.changed), ["a", "c"]);

    sync.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(1), sync.task.take().unwrap())
        .await
        .expect("run did not return within 1 s of cancellation")
        .unwrap();
    assert_eq!(
        handle.current().revision,
        4,
        "the last snapshot stays readable"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_replaces_only_the_changed_record() {
    let env = Env::new().await;
    for id in ["a", "b", "c"] {
        env.upsert(id, "x").await;
    }
    let sync = TestSync::ready(env.sync_options("w1")).await;
    let mut updates = sync.handle.subscribe();
    let before = sync.handle.current();

    let steps: [(&str, Option<&str>); 3] = [("b", Some("y")), ("c", None), ("d", Some("x"))];
    for (id, command) in steps {
        let revision = match command {
            Some(command) => env.upsert(id, command).await,
            None => env.delete(id).await,
        };
        let update = tokio::time::timeout(
            Duration::from_secs(1),
            updates.wait_for(|u| u.snapshot.revision >= revision),
        )
        .await
        .unwrap_or_else(|_| panic!("no snapshot for revision {revision} within 1 s"))
        .unwrap()
        .clone();
        assert_eq!(update.snapshot.revision, revision);
        assert_eq!(ids(&update.changed), [id]);
        match command {
            Some(_) => assert_eq!(update.snapshot.get(id).unwrap().revision, revision),
            None => assert!(update.snapshot.get(id).is_none()),
        }
        // Untouched records are the same allocation as before.
        assert!(Arc::ptr_eq(
            update.snapshot.get("a").unwrap(),
            before.get("a").unwrap()
        ));
    }
    assert_eq!(*sync.handle.current(), env.expected().await);
    assert!(!sync.handle.is_degraded());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readers_only_ever_see_whole_registry_states_in_order() {
    let env = Arc::new(Env::new().await);
    // Which revision wrote which record, seeds included.
    let mut written: Vec<(u64, String)> = Vec::new();
    for i in 0..10 {
        let id = format!("s{i}");
        written.push((env.upsert(&id, "seed").await, id));
    }
    let sync = TestSync::ready(env.sync_options("w1")).await;

    // An OS thread, not a task: it spins on `current()` as request handlers
    // would, without starving the runtime that applies the updates.
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let handle = sync.handle.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut seen: Vec<Arc<Snapshot>> = vec![handle.current()];
            let mut loads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let snapshot = handle.current();
                loads += 1;
                let last = seen.last().unwrap();
                if Arc::ptr_eq(&snapshot, last) {
                    continue;
                }
                assert!(
                    snapshot.revision >= last.revision,
                    "revision went back from {} to {}",
                    last.revision,
                    snapshot.revision
                );
                for server in snapshot.servers.values() {
                    assert!(
                        server.revision <= snapshot.revision,
                        "{} at revision {} in snapshot {}",
                        server.spec.server_id,
                        server.revision,
                        snapshot.revision
                    );
                }
                seen.push(snapshot);
            }
            (seen, loads)
        })
    };

    let writers: Vec<_> = (0..4)
        .map(|w| {
            let env = env.clone();
            tokio::spawn(async move {
                let mut written = Vec::new();
                for n in 0..50 {
                    let id = format!("s{}", (w * 7 + n * 3) % 10);
                    written.push((env.upsert(&id, &format!("w{w}-{n}")).await, id));
                }
                written
            })
        })
        .collect();
    for writer in writers {
        written.extend(writer.await.unwrap());
    }
    let head = env.head().await;
    assert_eq!(head, 210);
    eventually("the sync to reach head", Duration::from_secs(5), || {
        sync.handle.current().revision == head
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let (seen, loads) = reader.join().expect("reader assertions");
    assert!(
        seen.len() > 2,
        "only {} snapshots in {loads} loads",
        seen.len()
    );

    // Every snapshot observed is exactly the registry at its revision.
    written.sort();
    for snapshot in &seen[1..] {
        let mut expected: BTreeMap<&str, u64> = BTreeMap::new();
        for (revision, id) in written.iter().take_while(|(r, _)| *r <= snapshot.revision) {
            expected.insert(id, *revision);
        }
        let actual: BTreeMap<&str, u64> = snapshot
            .servers
            .iter()
            .map(|(id, s)| (id.as_str(), s.revision))
            .collect();
        assert_eq!(actual, expected, "snapshot {}", snapshot.revision);
    }
    assert_eq!(*sync.handle.current(), env.expected().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_outage_degrades_then_resyncs_on_restart() {
    let mut env = Env::new().await;
    env.upsert("a", "x").await;
    env.upsert("b", "x").await;
    let sync = TestSync::ready(env.sync_options("w1")).await;
    let before = sync.handle.current();
    assert_eq!(before.revision, 2);

    let addr = env.stop_registry().await;
    eventually("degraded", Duration::from_secs(5), || {
        sync.handle.is_degraded()
    })
    .await;
    assert!(sync.handle.last_error().is_some());
    assert!(
        Arc::ptr_eq(&sync.handle.current(), &before),
        "the last snapshot is still served"
    );

    // Changes the worker cannot see while the registry is down.
    let mut updates = sync.handle.subscribe();
    updates.mark_unchanged();
    env.upsert("a", "y").await;
    env.upsert("c", "x").await;
    env.delete("b").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(sync.handle.is_degraded());

    env.restart_registry(addr).await;
    let head = env.head().await;
    eventually("recovery at head", Duration::from_secs(5), || {
        !sync.handle.is_degraded() && sync.handle.current().revision == head
    })
    .await;
    assert_eq!(*sync.handle.current(), env.expected().await);
    let update = updates.borrow_and_update().clone();
    assert_eq!(update.snapshot.revision, head);
    assert_eq!(ids(&update.changed_since(&before)), ["a", "b", "c"]);

    // And it follows the new registry's watch again.
    let revision = env.upsert("d", "x").await;
    eventually("the next change", Duration::from_secs(1), || {
        sync.handle.current().revision == revision
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_past_the_snapshot_ends_in_a_full_resync_at_head() {
    let mut env = Env::new().await;
    env.upsert("a", "x").await;
    let sync = TestSync::ready(env.sync_options("w1")).await;
    assert_eq!(sync.handle.current().revision, 1);

    let addr = env.stop_registry().await;
    for i in 0..5 {
        env.upsert("a", &format!("v{i}")).await;
        env.upsert(&format!("n{i}"), "x").await;
    }
    env.delete("n0").await;
    let head = env.head().await;
    let compacted = env.store.compact(head).await.unwrap();
    assert_eq!(compacted.compaction_floor, head);
    env.restart_registry(addr).await;

    eventually("a full resync at head", Duration::from_secs(5), || {
        !sync.handle.is_degraded() && sync.handle.current().revision == head
    })
    .await;
    assert_eq!(*sync.handle.current(), env.expected().await);
    let revision = env.upsert("after", "x").await;
    eventually("the watch from head", Duration::from_secs(1), || {
        sync.handle.current().revision == revision
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_reach_the_worker_board() {
    let env = Env::new().await;
    env.upsert("a", "x").await;
    let health = || {
        vec![pb::ServerHealth {
            server_id: "a".into(),
            state: pb::ServerHealthState::Connected.into(),
            tool_count: Some(3),
            ..Default::default()
        }]
    };
    let service = SyncService::new(env.sync_options("worker-7"))
        .unwrap()
        .with_health_source(Arc::new(health));
    let _sync = TestSync::start(service);

    let http = reqwest::Client::new();
    let url = format!("{}/admin/api/workers", env.registry().http);
    let board = |revision: u64| {
        let request = http.get(&url).bearer_auth(ADMIN);
        async move {
            let deadline = Instant::now() + Duration::from_secs(3);
            loop {
                let body: Value = request
                    .try_clone()
                    .unwrap()
                    .send()
                    .await
                    .unwrap()
                    .error_for_status()
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                let worker = body["workers"]
                    .as_array()
                    .and_then(|w| w.iter().find(|w| w["worker_id"] == "worker-7"))
                    .cloned();
                if let Some(worker) = worker
                    && worker["snapshot_revision"] == revision
                {
                    return worker;
                }
                assert!(
                    Instant::now() < deadline,
                    "board never showed revision {revision}: {body}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };

    let worker = board(1).await;
    assert_eq!(worker["degraded"], false);
    assert_eq!(worker["servers"][0]["server_id"], "a");
    assert_eq!(worker["servers"][0]["state"], "connected");
    assert_eq!(worker["servers"][0]["tool_count"], 3);

    // A new snapshot is reported without waiting for the 10 s period.
    let revision = env.upsert("b", "x").await;
    board(revision).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polls_and_resyncs_that_find_nothing_new_publish_nothing() {
    let mut env = Env::new().await;
    env.upsert("a", "x").await;
    env.upsert("b", "x").await;
    let mut options = env.sync_options("w1");
    options.poll_interval = (Duration::from_millis(20), Duration::from_millis(40));
    let sync = TestSync::ready(options).await;
    let mut updates = sync.handle.subscribe();
    updates.mark_unchanged();
    let before = sync.handle.current();

    // About 15 polls, all at the snapshot's revision.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!updates.has_changed().unwrap(), "a poll published");

    // A reconnect whose full list finds the same records.
    let addr = env.stop_registry().await;
    eventually("degraded", Duration::from_secs(5), || {
        sync.handle.is_degraded()
    })
    .await;
    env.restart_registry(addr).await;
    eventually("recovery", Duration::from_secs(5), || {
        !sync.handle.is_degraded()
    })
    .await;
    assert!(!updates.has_changed().unwrap(), "an empty resync published");
    assert!(Arc::ptr_eq(&sync.handle.current(), &before));

    // Real changes still come through, alone.
    let revision = env.upsert("b", "y").await;
    let update = tokio::time::timeout(
        Duration::from_secs(1),
        updates.wait_for(|u| u.snapshot.revision == revision),
    )
    .await
    .expect("no snapshot within 1 s")
    .unwrap()
    .clone();
    assert_eq!(ids(&update.changed), ["b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_token_is_reported_and_never_ready() {
    let env = Env::new().await;
    env.upsert("a", "x").await;
    let mut options = env.sync_options("w1");
    options.token = Some("wrong".into());
    let sync = TestSync::start(SyncService::new(options).unwrap());
    eventually("degraded", Duration::from_secs(5), || {
        sync.handle.is_degraded()
    })
    .await;
    let error = sync.handle.last_error().unwrap();
    assert!(error.contains("Unauthenticated"), "{error}");
    assert!(!sync.handle.is_ready());
}

#[test]
fn options_that_cannot_work_are_refused() {
    let valid = SyncOptions {
        worker_id: "w".into(),
        token: Some("secret-token".into()),
        ..Default::default()
    };
    SyncService::new(valid.clone()).unwrap();
    let cases = [
        SyncOptions {
            worker_id: " ".into(),
            ..valid.clone()
        },
        SyncOptions {
            registry_urls: vec!["not a url".into()],
            ..valid.clone()
        },
        SyncOptions {
            token: Some("line\nbreak".into()),
            ..valid.clone()
        },
        SyncOptions {
            poll_interval: (Duration::from_secs(2), Duration::from_secs(1)),
            ..valid.clone()
        },
        SyncOptions {
            report_interval: Duration::ZERO,
            ..valid.clone()
        },
    ];
    for options in cases {
        assert!(SyncService::new(options.clone()).is_err(), "{options:?}");
    }
    assert!(
        !format!("{valid:?}").contains("secret"),
        "token in debug output"
    );
}
