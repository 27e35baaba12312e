//! Behaviours a healthy registry does not produce on demand, against a
//! scripted registry: a real tonic server speaking `McpRegistryService`
//! whose answers each test dictates (a watch refused with
//! FAILED_PRECONDITION, a stream that goes silent, a record that moved on
//! before its event arrived).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::Stream;
use quiver_model::{McpServerSpec, Transport};
use quiver_proto::v1 as pb;
use quiver_proto::v1::mcp_registry_service_server::{McpRegistryService, McpRegistryServiceServer};
use quiver_sync::{SnapshotHandle, SyncOptions, SyncService};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

type Events = mpsc::Sender<Result<pb::WatchMcpServersResponse, Status>>;

#[derive(Default)]
struct Script {
    /// List answers in order; the last one repeats.
    lists: VecDeque<(u64, Vec<pb::McpServer>)>,
    /// What `GetMcpServer` finds.
    records: BTreeMap<String, pb::McpServer>,
    /// Errors for the next watch calls; once empty, watches open a stream
    /// the test feeds through `stream`.
    refusals: VecDeque<Status>,
    /// The most recently opened stream.
    stream: Option<Events>,
    list_calls: usize,
    get_calls: usize,
    watch_calls: Vec<u64>,
}

#[derive(Clone, Default)]
struct Fake(Arc<Mutex<Script>>);

impl Fake {
    fn with<T>(&self, f: impl FnOnce(&mut Script) -> T) -> T {
        f(&mut self.0.lock().unwrap())
    }

    fn stream(&self) -> Events {
        self.with(|s| s.stream.clone())
            .expect("no watch stream open")
    }
}

type WatchStream =
    std::pin::Pin<Box<dyn Stream<Item = Result<pb::WatchMcpServersResponse, Status>> + Send>>;

#[tonic::async_trait]
impl McpRegistryService for Fake {
    async fn list_mcp_servers(
        &self,
        _: Request<pb::ListMcpServersRequest>,
    ) -> Result<Response<pb::ListMcpServersResponse>, Status> {
        self.with(|s| {
            s.list_calls += 1;
            let (revision, servers) = if s.lists.len() > 1 {
                s.lists.pop_front()
            } else {
                s.lists.front().cloned()
            }
            .ok_or_else(|| Status::unavailable("nothing to list"))?;
            Ok(Response::new(pb::ListMcpServersResponse {
                revision,
                servers,
                access: Vec::new(),
            }))
        })
    }

    async fn get_mcp_server(
        &self,
        request: Request<pb::GetMcpServerRequest>,
    ) -> Result<Response<pb::GetMcpServerResponse>, Status> {
        self.with(|s| {
            s.get_calls += 1;
            let server = s
                .records
                .get(&request.get_ref().server_id)
                .cloned()
                .ok_or_else(|| Status::not_found("no such record"))?;
            Ok(Response::new(pb::GetMcpServerResponse {
                server: Some(server),
            }))
        })
    }

    type WatchMcpServersStream = WatchStream;

    async fn watch_mcp_servers(
        &self,
        request: Request<pb::WatchMcpServersRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        self.with(|s| {
            s.watch_calls.push(request.get_ref().since_revision);
            if let Some(status) = s.refusals.pop_front() {
                return Err(status);
            }
            let (tx, rx) = mpsc::channel(16);
            s.stream = Some(tx);
            let stream: WatchStream = Box::pin(tokio_stream_from(rx));
            Ok(Response::new(stream))
        })
    }

    async fn upsert_mcp_server(
        &self,
        _: Request<pb::UpsertMcpServerRequest>,
    ) -> Result<Response<pb::UpsertMcpServerResponse>, Status> {
        Err(Status::unimplemented("read-only fake"))
    }

    async fn apply_mcp_servers(
        &self,
        _: Request<pb::ApplyMcpServersRequest>,
    ) -> Result<Response<pb::ApplyMcpServersResponse>, Status> {
        Err(Status::unimplemented("read-only fake"))
    }

    async fn delete_mcp_server(
        &self,
        _: Request<pb::DeleteMcpServerRequest>,
    ) -> Result<Response<pb::DeleteMcpServerResponse>, Status> {
        Err(Status::unimplemented("read-only fake"))
    }

    async fn get_mcp_server_history(
        &self,
        _: Request<pb::GetMcpServerHistoryRequest>,
    ) -> Result<Response<pb::GetMcpServerHistoryResponse>, Status> {
        Err(Status::unimplemented("read-only fake"))
    }

    async fn report_worker_status(
        &self,
        _: Request<pb::ReportWorkerStatusRequest>,
    ) -> Result<Response<pb::ReportWorkerStatusResponse>, Status> {
        Ok(Response::new(pb::ReportWorkerStatusResponse::default()))
    }
}

/// An mpsc receiver as a stream, without a tokio-stream dependency.
fn tokio_stream_from<T: Send + 'static>(
    rx: mpsc::Receiver<T>,
) -> impl Stream<Item = T> + Send + 'static {
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
}

fn record(id: &str, revision: u64) -> pb::McpServer {
    let mut spec = McpServerSpec::new(id, Transport::StreamableHttp);
    spec.http = Some(quiver_model::HttpConfig {
        url: format!("http://{id}.example/mcp?rev={revision}"),
        ..Default::default()
    });
    pb::McpServer {
        spec: Some((&spec).into()),
        revision,
        created_at: Some(Default::default()),
        updated_at: Some(Default::default()),
        updated_by: "test".into(),
        source: "api".into(),
    }
}

fn event(revision: u64, upserts: &[&str], deletes: &[&str]) -> pb::WatchMcpServersResponse {
    pb::WatchMcpServersResponse {
        revision,
        upserts: upserts.iter().map(|s| (*s).to_owned()).collect(),
        deletes: deletes.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    }
}

/// The fake served on loopback and a sync following it; both stop on drop.
struct Setup {
    fake: Fake,
    handle: SnapshotHandle,
    shutdown: CancellationToken,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn setup(fake: Fake, tweak: impl FnOnce(&mut SyncOptions)) -> Setup {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let server = tonic::transport::Server::builder()
        .add_service(McpRegistryServiceServer::new(fake.clone()))
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener),
            shutdown.clone().cancelled_owned(),
        );
    tokio::spawn(server);
    let mut options = SyncOptions {
        registry_urls: vec![format!("http://{addr}")],
        worker_id: "w1".into(),
        poll_interval: (Duration::from_secs(600), Duration::from_secs(600)),
        backoff_min: Duration::from_millis(10),
        backoff_max: Duration::from_millis(50),
        ..Default::default()
    };
    tweak(&mut options);
    let service = SyncService::new(options).unwrap();
    let handle = service.handle();
    tokio::spawn(service.run(shutdown.clone()));
    Setup {
        fake,
        handle,
        shutdown,
    }
}

async fn eventually(what: &str, within: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn failed_precondition_leads_to_a_full_resync() {
    let fake = Fake::default();
    fake.with(|s| {
        s.lists = [
            (5, vec![record("a", 5)]),
            (9, vec![record("a", 5), record("b", 9)]),
        ]
        .into();
        s.refusals = [Status::failed_precondition(
            "since_revision 5 is below the compaction floor 8; list again",
        )]
        .into();
    });
    let setup = setup(fake, |_| {}).await;
    let mut updates = setup.handle.subscribe();
    eventually("a resync at revision 9", Duration::from_secs(3), || {
        setup.handle.current().revision == 9 && !setup.handle.is_degraded()
    })
    .await;
    let (lists, watches) = setup.fake.with(|s| (s.list_calls, s.watch_calls.clone()));
    assert_eq!(lists, 2);
    assert_eq!(watches, [5, 9], "watches from each list's revision");
    let error = setup.handle.last_error().unwrap();
    assert!(error.contains("FailedPrecondition"), "{error}");
    let update = updates.borrow_and_update().clone();
    assert_eq!(update.changed.into_iter().collect::<Vec<_>>(), ["b"]);
}

#[tokio::test]
async fn a_silent_stream_is_replaced_but_heartbeats_keep_it() {
    let fake = Fake::default();
    fake.with(|s| s.lists = [(1, vec![record("a", 1)])].into());
    let setup = setup(fake, |o| o.stream_idle_timeout = Duration::from_millis(300)).await;
    eventually("the watch", Duration::from_secs(3), || {
        setup.fake.with(|s| s.watch_calls.len()) == 1
    })
    .await;

    // Heartbeats every 100 ms for a second: the stream stays.
    let stream = setup.fake.stream();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let heartbeat = pb::WatchMcpServersResponse {
            revision: 1,
            heartbeat: true,
            ..Default::default()
        };
        stream.send(Ok(heartbeat)).await.unwrap();
    }
    assert_eq!(setup.fake.with(|s| s.watch_calls.len()), 1);
    assert!(!setup.handle.is_degraded());

    // Silence (the stream is still open): given up after the idle timeout.
    let silent_since = Instant::now();
    eventually("a new watch", Duration::from_secs(3), || {
        setup.fake.with(|s| s.watch_calls.len()) == 2
    })
    .await;
    assert!(silent_since.elapsed() >= Duration::from_millis(250));
    let error = setup.handle.last_error().unwrap();
    assert!(error.contains("silent"), "{error}");
    assert_eq!(setup.handle.current().revision, 1);
    drop(stream);
}

#[tokio::test]
async fn records_newer_than_their_event_are_published_at_their_own_revision() {
    let fake = Fake::default();
    fake.with(|s| s.lists = [(1, vec![record("a", 1), record("b", 1)])].into());
    let setup = setup(fake, |_| {}).await;
    eventually("ready and watching", Duration::from_secs(3), || {
        setup.handle.is_ready() && setup.fake.with(|s| s.stream.is_some())
    })
    .await;
    let stream = setup.fake.stream();
    let quiet = || tokio::time::sleep(Duration::from_millis(200));

    // Revision 2 changed `a`, but `a` changed again at 3 before the fetch.
    setup
        .fake
        .with(|s| s.records.insert("a".into(), record("a", 3)));
    stream.send(Ok(event(2, &["a"], &[]))).await.unwrap();
    quiet().await;
    assert_eq!(setup.handle.current().revision, 1, "a@3 labelled 2");
    stream.send(Ok(event(3, &["a"], &[]))).await.unwrap();
    eventually("revision 3", Duration::from_secs(1), || {
        setup.handle.current().revision == 3
    })
    .await;
    assert_eq!(setup.handle.current().get("a").unwrap().revision, 3);
    assert_eq!(setup.fake.with(|s| s.get_calls), 1, "a@3 was not refetched");

    // Revision 4 changed `b`, which was deleted at 5 before the fetch.
    stream.send(Ok(event(4, &["b"], &[]))).await.unwrap();
    quiet().await;
    let snapshot = setup.handle.current();
    assert_eq!(snapshot.revision, 3);
    assert!(snapshot.get("b").is_some(), "b still exists at 4");
    stream.send(Ok(event(5, &[], &["b"]))).await.unwrap();
    eventually("revision 5", Duration::from_secs(1), || {
        setup.handle.current().revision == 5
    })
    .await;
    assert!(setup.handle.current().get("b").is_none());
    assert!(!setup.handle.is_degraded());
}

#[tokio::test]
async fn a_gap_in_the_stream_triggers_a_full_resync() {
    let fake = Fake::default();
    fake.with(|s| s.lists = [(1, vec![record("a", 1)]), (4, vec![record("a", 4)])].into());
    let setup = setup(fake, |_| {}).await;
    eventually("watching", Duration::from_secs(3), || {
        setup.fake.with(|s| s.stream.is_some())
    })
    .await;
    setup
        .fake
        .stream()
        .send(Ok(event(3, &["a"], &[])))
        .await
        .unwrap();
    eventually("a resync at 4", Duration::from_secs(3), || {
        setup.handle.current().revision == 4
    })
    .await;
    // The resync publishes the listed snapshot before it watches again.
    eventually("watching again from 4", Duration::from_secs(3), || {
        setup.fake.with(|s| s.watch_calls.len() == 2)
    })
    .await;
    assert_eq!(setup.fake.with(|s| s.watch_calls.clone()), [1, 4]);
    let error = setup.handle.last_error().unwrap();
    assert!(error.contains("jumped from revision 1 to 3"), "{error}");
}

#[tokio::test]
async fn records_carried_in_events_need_no_fetch() {
    let fake = Fake::default();
    fake.with(|s| s.lists = [(1, vec![record("a", 1)])].into());
    let setup = setup(fake, |_| {}).await;
    eventually("ready and watching", Duration::from_secs(3), || {
        setup.handle.is_ready() && setup.fake.with(|s| s.stream.is_some())
    })
    .await;
    let stream = setup.fake.stream();
    // What `GetMcpServer` would answer differs: a fetch would show.
    setup.fake.with(|s| {
        s.records.insert("a".into(), record("a", 9));
        s.records.insert("b".into(), record("b", 9));
    });
    let mut carried = event(2, &["a"], &[]);
    carried.servers = vec![record("a", 2)];
    stream.send(Ok(carried)).await.unwrap();
    let mut created = event(3, &["b"], &[]);
    created.servers = vec![record("b", 3)];
    stream.send(Ok(created)).await.unwrap();
    stream.send(Ok(event(4, &[], &["a"]))).await.unwrap();
    eventually("revision 4", Duration::from_secs(3), || {
        setup.handle.current().revision == 4
    })
    .await;
    let snapshot = setup.handle.current();
    assert!(snapshot.get("a").is_none());
    assert_eq!(snapshot.get("b").unwrap().revision, 3);
    assert_eq!(setup.fake.with(|s| s.get_calls), 0, "no GetMcpServer");

    // An event without its record (an older registry): fetched as before.
    setup
        .fake
        .with(|s| s.records.insert("c".into(), record("c", 5)));
    stream.send(Ok(event(5, &["c"], &[]))).await.unwrap();
    eventually("revision 5", Duration::from_secs(3), || {
        setup.handle.current().revision == 5
    })
    .await;
    assert_eq!(setup.handle.current().get("c").unwrap().revision, 5);
    assert_eq!(setup.fake.with(|s| s.get_calls), 1);
    assert!(!setup.handle.is_degraded());
}
