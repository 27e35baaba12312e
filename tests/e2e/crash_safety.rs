//! SIGKILL during concurrent writes: after a restart on the same database,
//! every acknowledged write is there with exactly its acknowledged revision,
//! the change log has no gap, and new writes continue after the old head.

use std::collections::BTreeSet;
use std::time::Duration;

use quiver_proto::v1 as pb;
use quiver_testkit::postgres::TestDatabase;

use crate::harness::{RegistryProcess, WriteLoad, stdio_spec, upsert, upserted_revision};

const ADMIN: &str = "admin-secret";
const WRITERS: usize = 4;

async fn crash_and_recover(database_url: &str, backend: &str) {
    let mut registry = RegistryProcess::with_admin(database_url, ADMIN).await;

    let load = WriteLoad::start(&registry, ADMIN, WRITERS, "c", |id| stdio_spec(id, "v1")).await;

    tokio::time::sleep(Duration::from_millis(300)).await;
    let acked_before_kill = load.acknowledged_count();
    registry.kill_hard();
    let (attempted, acknowledged) = load.join_after_crash().await;
    let in_doubt = attempted - acknowledged.len();
    assert!(acked_before_kill > 0, "no write was acknowledged in 300 ms");
    let max_acked = acknowledged.values().copied().max().unwrap();
    let acked_revisions: BTreeSet<u64> = acknowledged.values().copied().collect();
    assert_eq!(
        acked_revisions.len(),
        acknowledged.len(),
        "a revision was acknowledged twice"
    );
    drop(registry);

    let registry = RegistryProcess::with_admin(database_url, ADMIN).await;
    let mut client = registry.client(Some(ADMIN)).await;
    for (id, revision) in &acknowledged {
        let server = client
            .get_mcp_server(pb::GetMcpServerRequest {
                server_id: id.clone(),
            })
            .await
            .unwrap_or_else(|status| {
                panic!("acknowledged {id} (revision {revision}) lost: {status}")
            })
            .into_inner()
            .server
            .expect("record");
        assert_eq!(
            server.revision, *revision,
            "{id} must keep its acknowledged revision"
        );
    }

    // Consistency of the store: every record is a distinct create, so the
    // records' revisions are exactly 1..=head, and the change log replays
    // the same revisions without a gap.
    let list = client
        .list_mcp_servers(pb::ListMcpServersRequest {})
        .await
        .expect("list after restart")
        .into_inner();
    let head = list.revision;
    assert!(
        head >= max_acked,
        "head {head} is behind acknowledged revision {max_acked}"
    );
    let stored: BTreeSet<u64> = list.servers.iter().map(|s| s.revision).collect();
    assert_eq!(
        stored,
        (1..=head).collect(),
        "records must hold exactly revisions 1..={head}"
    );
    let committed_unacknowledged = head as usize - acknowledged.len();
    assert!(
        committed_unacknowledged <= in_doubt,
        "{committed_unacknowledged} records committed without acknowledgement, but only {in_doubt} writes were in doubt"
    );
    let mut watch = client
        .watch_mcp_servers(pb::WatchMcpServersRequest { since_revision: 0 })
        .await
        .expect("watch after restart")
        .into_inner();
    let mut replayed = Vec::new();
    while replayed.last().copied().unwrap_or(0) < head {
        let event = tokio::time::timeout(Duration::from_secs(10), watch.message())
            .await
            .expect("replay event")
            .expect("replay")
            .expect("stream open");
        if !event.heartbeat {
            assert_eq!(event.upserts.len(), 1);
            replayed.push(event.revision);
        }
    }
    assert_eq!(
        replayed,
        (1..=head).collect::<Vec<_>>(),
        "change log must replay 1..={head}"
    );

    let response = upsert(&mut client, stdio_spec("after-crash", "v1"))
        .await
        .expect("upsert after restart");
    let next = upserted_revision(&response);
    assert_eq!(
        next,
        head + 1,
        "the first write after restart takes head + 1"
    );

    println!(
        "{backend}: {attempted} writes attempted, {} acknowledged before SIGKILL (max revision {max_acked}), \
         {in_doubt} in doubt of which {committed_unacknowledged} committed; all acknowledged writes intact, \
         head {head}, next write got {next}",
        acknowledged.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_survives_sigkill_during_writes() {
    let db = TestDatabase::create().await;
    crash_and_recover(db.url(), "postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_survives_sigkill_during_writes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("quiver.db").display());
    crash_and_recover(&url, "sqlite").await;
}
