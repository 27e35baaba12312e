//! Signals: SIGTERM with an open, idle watch stream ends the stream (instead
//! of leaving it hanging) and the process exits 0 promptly; SIGHUP never
//! stops the registry.

use std::time::Duration;

use quiver_proto::v1 as pb;
use quiver_testkit::postgres::TestDatabase;

use crate::harness::{RegistryProcess, stdio_spec, upsert, upserted_revision};

async fn next(
    stream: &mut tonic::Streaming<pb::WatchMcpServersResponse>,
) -> Result<Option<pb::WatchMcpServersResponse>, tonic::Status> {
    tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("watch event within 5 s")
}

const ADMIN: &str = "admin-secret";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_watch_streams_and_exits_zero() {
    let db = TestDatabase::create().await;
    let mut registry = RegistryProcess::start(&[
        "--database-url",
        db.url(),
        "--admin-token",
        ADMIN,
        "--heartbeat-secs",
        "1",
    ])
    .await;
    let mut client = registry.client(Some(ADMIN)).await;
    let revision = upserted_revision(
        &upsert(&mut client, stdio_spec("watched", "1"))
            .await
            .expect("upsert"),
    );

    let mut stream = client
        .watch_mcp_servers(pb::WatchMcpServersRequest { since_revision: 0 })
        .await
        .expect("watch")
        .into_inner();
    let event = next(&mut stream)
        .await
        .expect("replayed event")
        .expect("open");
    assert_eq!((event.revision, event.heartbeat), (revision, false));
    // The stream is live and idle: a heartbeat carries the last revision.
    let event = next(&mut stream).await.expect("heartbeat").expect("open");
    assert_eq!((event.revision, event.heartbeat), (revision, true));

    let (status, took) = registry.terminate(Duration::from_secs(5)).await;
    assert_eq!(
        status.code(),
        Some(0),
        "registry must exit 0 on SIGTERM; log:\n{}",
        registry.log_tail()
    );
    assert!(
        registry.logged("quiver registry stopped"),
        "log:\n{}",
        registry.log_tail()
    );

    // The watcher learns that the stream is over instead of hanging.
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match stream.message().await {
                Ok(Some(event)) if event.heartbeat => {}
                other => return other,
            }
        }
    })
    .await
    .expect("the watch stream must end when the registry stops");
    match ended {
        Ok(None) => {}
        Ok(Some(event)) => panic!("unexpected event after shutdown: {event:?}"),
        Err(ref status) => assert!(
            matches!(
                status.code(),
                tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
            ),
            "unexpected end of stream: {status}"
        ),
    }
    println!(
        "registry exited 0 {took:?} after SIGTERM with an open watch stream; stream ended with {ended:?}"
    );
}

#[tokio::test]
async fn sighup_without_mcp_dir_does_not_stop_the_registry() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("quiver.db").display());
    let mut registry = RegistryProcess::with_admin(&url, ADMIN).await;
    registry.sighup();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        registry.is_running(),
        "SIGHUP killed a registry without --mcp-dir; log:\n{}",
        registry.log_tail()
    );
    let mut client = registry.client(Some(ADMIN)).await;
    let revision = upserted_revision(
        &upsert(&mut client, stdio_spec("after-hup", "1"))
            .await
            .expect("upsert"),
    );
    assert_eq!(revision, 1);
    let (status, _) = registry.terminate(Duration::from_secs(5)).await;
    assert_eq!(status.code(), Some(0));
}
