//! Concurrent writers on PostgreSQL: revisions are exactly 1..=N with no gap
//! or duplicate (R-STORE-2), and watchers started before, during and late in
//! the write storm each see every later revision exactly once, in order
//! (R-WATCH-1).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use quiver_proto::v1 as pb;
use quiver_testkit::postgres::TestDatabase;
use tokio::task::JoinHandle;

use crate::harness::{Client, RegistryProcess, stdio_spec, upsert, upserted_revision};

const ADMIN: &str = "admin-secret";
const WRITERS: usize = 8;
const WRITES_PER_WRITER: usize = 200;
const TOTAL: u64 = (WRITERS * WRITES_PER_WRITER) as u64;

/// Collects the change events of a watch from `since` until revision `TOTAL`.
fn spawn_watcher(mut client: Client, since: u64) -> JoinHandle<Vec<pb::WatchMcpServersResponse>> {
    tokio::spawn(async move {
        let mut stream = client
            .watch_mcp_servers(pb::WatchMcpServersRequest {
                since_revision: since,
            })
            .await
            .unwrap_or_else(|status| panic!("watch since {since}: {status}"))
            .into_inner();
        let mut events = Vec::new();
        let mut last = since;
        while last < TOTAL {
            let event = tokio::time::timeout(Duration::from_secs(15), stream.message())
                .await
                .unwrap_or_else(|_| {
                    panic!("watch since {since}: no event after revision {last} for 15 s")
                })
                .unwrap_or_else(|status| {
                    panic!("watch since {since}: stream error after {last}: {status}")
                })
                .unwrap_or_else(|| panic!("watch since {since}: stream ended after {last}"));
            if event.heartbeat {
                continue;
            }
            last = event.revision;
            events.push(event);
        }
        events
    })
}

/// Every revision in `(since, TOTAL]` exactly once, in order, each naming the
/// record that was written at that revision.
fn check_events(
    since: u64,
    events: &[pb::WatchMcpServersResponse],
    written: &BTreeMap<u64, String>,
) {
    let revisions: Vec<u64> = events.iter().map(|e| e.revision).collect();
    let expected: Vec<u64> = (since + 1..=TOTAL).collect();
    assert_eq!(
        revisions, expected,
        "watcher since {since} must see every revision after {since} exactly once, in order"
    );
    for event in events {
        let id = &written[&event.revision];
        assert_eq!(
            event.upserts,
            vec![id.clone()],
            "watcher since {since}: revision {} must carry the upsert of {id}",
            event.revision
        );
        assert!(event.deletes.is_empty(), "unexpected deletes in {event:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_get_consecutive_revisions_and_watchers_miss_nothing() {
    let db = TestDatabase::create().await;
    let registry = RegistryProcess::with_admin(db.url(), ADMIN).await;
    let started = std::time::Instant::now();

    // Watcher 1: from the very beginning, before any write.
    let early = spawn_watcher(registry.client(Some(ADMIN)).await, 0);

    let acknowledged = Arc::new(AtomicUsize::new(0));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let mut client = registry.client(Some(ADMIN)).await;
        let acknowledged = acknowledged.clone();
        writers.push(tokio::spawn(async move {
            let mut written = Vec::with_capacity(WRITES_PER_WRITER);
            for i in 0..WRITES_PER_WRITER {
                let id = format!("w{w}-{}", i % 10);
                let response = upsert(&mut client, stdio_spec(&id, &format!("write-{i}")))
                    .await
                    .unwrap_or_else(|status| panic!("writer {w} upsert {i}: {status}"));
                let revision = upserted_revision(&response);
                let server = response.server.expect("record");
                assert_eq!(server.spec.expect("spec").server_id, id);
                written.push((revision, id));
                acknowledged.fetch_add(1, Ordering::SeqCst);
            }
            written
        }));
    }

    // Watchers 2 and 3: started from a revision observed while writes are in flight.
    let mut late_watchers = Vec::new();
    for threshold in [300, 1000] {
        while acknowledged.load(Ordering::SeqCst) < threshold {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let mut client = registry.client(Some(ADMIN)).await;
        let since = client
            .list_mcp_servers(pb::ListMcpServersRequest {})
            .await
            .expect("list during writes")
            .into_inner()
            .revision;
        assert!(
            since >= threshold as u64,
            "list revision {since} below {threshold} acknowledged writes"
        );
        late_watchers.push((since, spawn_watcher(client, since)));
    }
    let in_flight = acknowledged.load(Ordering::SeqCst);

    let mut written: BTreeMap<u64, String> = BTreeMap::new();
    for writer in writers {
        for (revision, id) in writer.await.expect("writer task") {
            if let Some(other) = written.insert(revision, id.clone()) {
                panic!("revision {revision} handed out twice: to {other} and {id}");
            }
        }
    }
    let write_time = started.elapsed();
    let revisions: Vec<u64> = written.keys().copied().collect();
    assert_eq!(
        revisions,
        (1..=TOTAL).collect::<Vec<_>>(),
        "revisions must be exactly 1..={TOTAL}"
    );

    let list = registry
        .client(Some(ADMIN))
        .await
        .list_mcp_servers(pb::ListMcpServersRequest {})
        .await
        .expect("list")
        .into_inner();
    assert_eq!(list.revision, TOTAL);
    assert_eq!(list.servers.len(), WRITERS * 10);
    // Each record holds its last write: the highest revision that named it.
    for server in &list.servers {
        let id = &server.spec.as_ref().expect("spec").server_id;
        let last = written
            .iter()
            .rev()
            .find(|(_, w)| *w == id)
            .map(|(r, _)| *r);
        assert_eq!(
            Some(server.revision),
            last,
            "{id} must be at its last written revision"
        );
        let args = &server.spec.as_ref().unwrap().stdio.as_ref().unwrap().args;
        let i: usize = args[1].strip_prefix("write-").unwrap().parse().unwrap();
        assert_eq!(
            i,
            WRITES_PER_WRITER - 10 + id.rsplit('-').next().unwrap().parse::<usize>().unwrap()
        );
    }

    let early = early.await.expect("watcher since 0");
    check_events(0, &early, &written);
    let mut starts = vec![0];
    for (since, watcher) in late_watchers {
        let events = watcher.await.expect("late watcher");
        check_events(since, &events, &written);
        starts.push(since);
    }
    println!(
        "{TOTAL} upserts by {WRITERS} writers in {write_time:?}; watchers started at revisions {starts:?} \
         (the last after {in_flight} acknowledged writes) all saw every later revision once"
    );
}
