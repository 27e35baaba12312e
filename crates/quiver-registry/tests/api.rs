//! The registry's gRPC and REST APIs, served in-process on loopback ports and
//! exercised through real clients (tonic, reqwest). Process-level behaviour
//! (crashes, replicas, the CLI) is covered by the end-to-end tests in
//! `tests/e2e`.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{ADMIN, TestRegistry, WORKER, postgres_registry, rest, spec, sqlite_registry};
use quiver_model::{McpServerSpec, Source};
use quiver_proto::v1 as pb;
use quiver_registry::feed::{ChangeFeed, FeedOptions, WatchEvent};
use quiver_store::{SqlStore, Store, UpsertRequest};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::transport::Channel;

fn upsert_request(
    spec: &McpServerSpec,
    expected_revision: Option<u64>,
) -> pb::UpsertMcpServerRequest {
    pb::UpsertMcpServerRequest {
        server: Some(spec.into()),
        expected_revision,
    }
}

async fn store_upsert(store: &SqlStore, id: &str, command: &str) -> u64 {
    store
        .upsert(UpsertRequest {
            spec: spec(id, command),
            expected_revision: None,
            actor: "test".into(),
            source: Source::Api,
        })
        .await
        .unwrap()
        .server()
        .revision
}

/// Next non-heartbeat event of a gRPC watch stream, with a deadline.
async fn next_change(
    stream: &mut tonic::Streaming<pb::WatchMcpServersResponse>,
) -> pb::WatchMcpServersResponse {
    loop {
        let event = tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await
            .expect("no watch event within 5 s")
            .unwrap()
            .expect("watch stream ended");
        if !event.heartbeat {
            return event;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_replays_then_follows_live_changes() {
    for registry in [sqlite_registry(|_| {}).await, postgres_registry().await] {
        let mut client = registry.client(Some(WORKER)).await;
        for i in 0..3 {
            store_upsert(&registry.store, &format!("s{i}"), "x").await;
        }
        let mut stream = client
            .watch_mcp_servers(pb::WatchMcpServersRequest { since_revision: 1 })
            .await
            .unwrap()
            .into_inner();
        let replayed = [
            next_change(&mut stream).await,
            next_change(&mut stream).await,
        ];
        assert_eq!(
            replayed.iter().map(|e| e.revision).collect::<Vec<_>>(),
            [2, 3]
        );
        assert_eq!(replayed[0].upserts, ["s1"]);
        let mut admin = registry.client(Some(ADMIN)).await;
        admin
            .upsert_mcp_server(upsert_request(&spec("live", "x"), None))
            .await
            .unwrap();
        admin
            .delete_mcp_server(pb::DeleteMcpServerRequest {
                server_id: "s0".into(),
                expected_revision: None,
            })
            .await
            .unwrap();
        let live = next_change(&mut stream).await;
        assert_eq!(
            (live.revision, live.upserts.as_slice()),
            (4, ["live".to_owned()].as_slice())
        );
        let deleted = next_change(&mut stream).await;
        assert_eq!(
            (deleted.revision, deleted.deletes.as_slice()),
            (5, ["s0".to_owned()].as_slice())
        );
        assert!(deleted.upserts.is_empty());
    }
}

#[tokio::test]
async fn watch_outside_the_change_log_is_failed_precondition() {
    let registry = sqlite_registry(|_| {}).await;
    for i in 0..5 {
        store_upsert(&registry.store, "a", &format!("cmd{i}")).await;
    }
    registry.store.compact(3).await.unwrap();
    let mut client = registry.client(Some(WORKER)).await;
    for since in [0, 2, 6, 100] {
        let status = client
            .watch_mcp_servers(pb::WatchMcpServersRequest {
                since_revision: since,
            })
            .await
            .expect_err("watch outside the log must fail");
        assert_eq!(
            status.code(),
            Code::FailedPrecondition,
            "since {since}: {status:?}"
        );
        assert!(
            status.message().contains("list again"),
            "{}",
            status.message()
        );
    }
    let mut stream = client
        .watch_mcp_servers(pb::WatchMcpServersRequest { since_revision: 3 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next_change(&mut stream).await.revision, 4);
    assert_eq!(next_change(&mut stream).await.revision, 5);
}

#[tokio::test]
async fn idle_watch_streams_get_heartbeats() {
    let registry = sqlite_registry(|options| {
        options.feed.heartbeat = Duration::from_millis(100);
    })
    .await;
    store_upsert(&registry.store, "a", "x").await;
    let mut client = registry.client(Some(WORKER)).await;
    let mut stream = client
        .watch_mcp_servers(pb::WatchMcpServersRequest { since_revision: 0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next_change(&mut stream).await.revision, 1);
    for _ in 0..2 {
        let event = tokio::time::timeout(Duration::from_secs(2), stream.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(event.heartbeat, "{event:?}");
        assert_eq!(
            event.revision, 1,
            "a heartbeat carries the last delivered revision"
        );
        assert!(event.upserts.is_empty() && event.deletes.is_empty());
    }
}

/// Drains a feed receiver until `last` arrives; returns the revisions seen.
async fn drain_feed(
    rx: &mut tokio::sync::mpsc::Receiver<Result<WatchEvent, quiver_registry::error::RegistryError>>,
    last: u64,
) -> Vec<u64> {
    let mut seen = Vec::new();
    while seen.last() != Some(&last) {
        match tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("feed stalled")
        {
            Some(Ok(WatchEvent::Change(change))) => seen.push(change.change.revision),
            Some(Ok(WatchEvent::Heartbeat(_))) => {}
            Some(Err(err)) => panic!("stream ended with {err}"),
            None => panic!("stream closed"),
        }
    }
    seen
}

/// A change feed over a fresh SQLite store, without the gRPC layer.
struct FeedFixture {
    store: Arc<dyn Store>,
    feed: ChangeFeed,
    shutdown: CancellationToken,
    _dir: tempfile::TempDir,
}

impl FeedFixture {
    /// A tiny `ring_capacity` forces stalled watchers to lag off the ring.
    async fn new(ring_capacity: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("feed.db").display());
        let store: Arc<dyn Store> = Arc::new(SqlStore::open_sqlite(&url).await.unwrap());
        let shutdown = CancellationToken::new();
        let options = FeedOptions {
            heartbeat: Duration::from_secs(60),
            ring_capacity,
        };
        let feed = ChangeFeed::start(store.clone(), options, shutdown.clone())
            .await
            .unwrap();
        FeedFixture {
            store,
            feed,
            shutdown,
            _dir: dir,
        }
    }
}

impl Drop for FeedFixture {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// `count` changes of record `a`.
async fn write_changes(store: Arc<dyn Store>, count: u64) {
    for i in 0..count {
        store
            .upsert(UpsertRequest {
                spec: spec("a", &format!("cmd{i}")),
                expected_revision: None,
                actor: "test".into(),
                source: Source::Api,
            })
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_watcher_delays_nobody_and_catches_up_from_the_log() {
    let FeedFixture { store, feed, .. } = &FeedFixture::new(4).await;
    let mut stalled = feed.watch(0).await.unwrap();
    let mut reader = feed.watch(0).await.unwrap();

    const CHANGES: u64 = 150; // far more than the ring plus the stalled watcher's buffer
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            write_changes(store, CHANGES).await;
            Instant::now()
        })
    };
    let seen = drain_feed(&mut reader, CHANGES).await;
    let reader_done = Instant::now();
    let writer_done = writer.await.unwrap();
    assert_eq!(
        seen,
        (1..=CHANGES).collect::<Vec<_>>(),
        "the reading watcher saw every change once, in order"
    );
    assert!(
        reader_done.saturating_duration_since(writer_done) < Duration::from_secs(1),
        "the reader finished {:?} after the last write",
        reader_done.saturating_duration_since(writer_done)
    );
    // The stalled watcher resumes and gets everything, in order, exactly once.
    assert_eq!(
        drain_feed(&mut stalled, CHANGES).await,
        (1..=CHANGES).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_behind_a_compaction_is_told_to_resync() {
    let FeedFixture { store, feed, .. } = &FeedFixture::new(2).await;
    let mut stalled = feed.watch(0).await.unwrap();
    write_changes(store.clone(), 100).await;
    store.compact(90).await.unwrap();
    let mut last = 0;
    let err = loop {
        match tokio::time::timeout(Duration::from_secs(5), stalled.recv())
            .await
            .unwrap()
        {
            Some(Ok(WatchEvent::Change(change))) => {
                assert_eq!(change.change.revision, last + 1, "no gap before the error");
                last = change.change.revision;
            }
            Some(Ok(WatchEvent::Heartbeat(_))) => {}
            Some(Err(err)) => break err,
            None => panic!("stream closed without an error"),
        }
    };
    assert!(
        last < 90,
        "only the buffered prefix was delivered (got to {last})"
    );
    assert_eq!(
        err.code(),
        quiver_registry::error::ErrorCode::FailedPrecondition,
        "{err}"
    );
}

#[tokio::test]
async fn grpc_errors_name_fields_and_map_codes() {
    let registry = sqlite_registry(|_| {}).await;
    let mut admin = registry.client(Some(ADMIN)).await;
    let bad = admin
        .upsert_mcp_server(upsert_request(&spec("has.dot", "x"), None))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(bad.message().starts_with("server_id"), "{}", bad.message());
    let missing_transport = admin
        .upsert_mcp_server(pb::UpsertMcpServerRequest {
            server: Some(pb::McpServerSpec {
                server_id: "a".into(),
                ..Default::default()
            }),
            expected_revision: None,
        })
        .await
        .unwrap_err();
    assert_eq!(missing_transport.code(), Code::InvalidArgument);
    assert!(
        missing_transport.message().contains("transport"),
        "{}",
        missing_transport.message()
    );

    let created = admin
        .upsert_mcp_server(upsert_request(&spec("a", "x"), Some(0)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(created.server.unwrap().revision, 1);
    let unchanged = admin
        .upsert_mcp_server(upsert_request(&spec("a", "x"), None))
        .await
        .unwrap()
        .into_inner();
    assert!(unchanged.unchanged);
    let conflict = admin
        .upsert_mcp_server(upsert_request(&spec("a", "y"), Some(0)))
        .await
        .unwrap_err();
    assert_eq!(conflict.code(), Code::Aborted);
    assert!(
        conflict.message().contains("current revision 1"),
        "{}",
        conflict.message()
    );

    let not_found = admin
        .get_mcp_server(pb::GetMcpServerRequest {
            server_id: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(not_found.code(), Code::NotFound);
    let no_history = admin
        .get_mcp_server_history(pb::GetMcpServerHistoryRequest {
            server_id: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(no_history.code(), Code::NotFound);

    // Worker reads are not masked: workers start servers with these values.
    let mut worker = registry.client(Some(WORKER)).await;
    let server = worker
        .get_mcp_server(pb::GetMcpServerRequest {
            server_id: "a".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .server
        .unwrap();
    assert_eq!(
        server.spec.unwrap().stdio.unwrap().env["API_KEY"],
        "sk-literal"
    );
}

#[tokio::test]
async fn worker_reports_are_listed() {
    let registry = sqlite_registry(|_| {}).await;
    store_upsert(&registry.store, "a", "x").await;
    let mut worker = registry.client(Some(WORKER)).await;
    let response = worker
        .report_worker_status(pb::ReportWorkerStatusRequest {
            worker_id: "w-1".into(),
            snapshot_revision: 1,
            degraded: false,
            servers: vec![pb::ServerHealth {
                server_id: "a".into(),
                state: pb::ServerHealthState::Connected.into(),
                tool_count: Some(3),
                ..Default::default()
            }],
            key_uses: vec![],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.head_revision, 1);
    let empty_id = worker
        .report_worker_status(pb::ReportWorkerStatusRequest::default())
        .await
        .unwrap_err();
    assert_eq!(empty_id.code(), Code::InvalidArgument);
    let workers: Value = reqwest::Client::new()
        .get(registry.url("/admin/api/workers"))
        .bearer_auth(WORKER)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(workers["workers"][0]["worker_id"], "w-1");
    assert_eq!(workers["workers"][0]["servers"][0]["state"], "connected");
}

#[tokio::test]
async fn health_and_reflection_are_served() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let registry = sqlite_registry(|_| {}).await;
    let channel = Channel::from_shared(registry.grpc.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let status = HealthClient::new(channel.clone())
        .check(tonic_health::pb::HealthCheckRequest {
            service: "quiver.registry.v1.McpRegistryService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        status.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    let request = tonic_reflection::pb::v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let response = responses.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected reflection response {response:?}");
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert!(
        names.contains(&"quiver.registry.v1.McpRegistryService"),
        "{names:?}"
    );
    assert!(names.contains(&"grpc.health.v1.Health"), "{names:?}");

    let http = reqwest::Client::new();
    assert_eq!(
        http.get(registry.url("/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let ready: Value = http
        .get(registry.url("/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ready, json!({"ready": true, "revision": 0}));
}

#[tokio::test]
async fn rest_crud_conflicts_and_errors() {
    use reqwest::Method;
    let r = sqlite_registry(|_| {}).await;
    let body = json!(spec("fs", "npx")).to_string();

    let (status, created) = rest(
        &r,
        Method::POST,
        "/admin/api/mcp/servers?expected_revision=0",
        Some(ADMIN),
        Some(&body),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["revision"], 1);
    assert_eq!(created["source"], "admin");
    assert_eq!(created["updated_by"], "admin");
    let (status, same) = rest(
        &r,
        Method::POST,
        "/admin/api/mcp/servers",
        Some(ADMIN),
        Some(&body),
    )
    .await;
    assert_eq!((status, &same["unchanged"]), (200, &json!(true)));

    let changed = json!(spec("fs", "uvx")).to_string();
    let (status, conflict) = rest(
        &r,
        Method::POST,
        "/admin/api/mcp/servers?expected_revision=0",
        Some(ADMIN),
        Some(&changed),
    )
    .await;
    assert_eq!(status, 409, "{conflict}");
    assert_eq!(conflict["error"]["code"], "conflict");
    assert_eq!(conflict["error"]["current_revision"], 1);
    // If-Match carries the expected revision too.
    let response = reqwest::Client::new()
        .post(r.url("/admin/api/mcp/servers"))
        .bearer_auth(ADMIN)
        .header("if-match", "\"1\"")
        .body(changed.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["etag"], "\"2\"");

    // Validation errors name the field; unknown fields are rejected.
    let mut invalid = json!(spec("fs", "x"));
    invalid["budgets"]["max_concurrency"] = json!(0);
    let (status, err) = rest(
        &r,
        Method::POST,
        "/admin/api/mcp/servers",
        Some(ADMIN),
        Some(&invalid.to_string()),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(err["error"]["field"], "budgets.max_concurrency");
    let mut unknown = json!(spec("fs", "x"));
    unknown["stdio"]["shell"] = json!(true);
    let (status, err) = rest(
        &r,
        Method::POST,
        "/admin/api/mcp/servers",
        Some(ADMIN),
        Some(&unknown.to_string()),
    )
    .await;
    assert_eq!(
        (status, &err["error"]["field"]),
        (400, &json!("stdio.shell"))
    );
    let (status, err) = rest(
        &r,
        Method::POST,
        "/admin/api/mcp/servers",
        Some(ADMIN),
        Some("{not json"),
    )
    .await;
    assert_eq!(
        (status, &err["error"]["code"]),
        (400, &json!("invalid_argument"))
    );
    let (status, err) = rest(
        &r,
        Method::POST,
        "/admin/api/mcp/servers?expected_revision=abc",
        Some(ADMIN),
        Some(&body),
    )
    .await;
    assert_eq!(
        (status, &err["error"]["field"]),
        (400, &json!("expected_revision"))
    );

    // Reads mask literal values without the admin token.
    let (_, as_worker) = rest(
        &r,
        Method::GET,
        "/admin/api/mcp/servers/fs",
        Some(WORKER),
        None,
    )
    .await;
    assert_eq!(as_worker["stdio"]["env"]["API_KEY"], "********");
    assert_eq!(as_worker["stdio"]["env"]["TOKEN"], "${ENV:TOKEN}");
    let (_, as_admin) = rest(&r, Method::GET, "/admin/api/mcp/servers", Some(ADMIN), None).await;
    assert_eq!(
        as_admin["servers"][0]["stdio"]["env"]["API_KEY"],
        "sk-literal"
    );
    assert_eq!(as_admin["revision"], 2);

    // Credentials: 401 without, 403 with the worker token for writes.
    let (status, err) = rest(&r, Method::GET, "/admin/api/mcp/servers", None, None).await;
    assert_eq!(
        (status, &err["error"]["code"]),
        (401, &json!("unauthenticated"))
    );
    let (status, err) = rest(
        &r,
        Method::DELETE,
        "/admin/api/mcp/servers/fs",
        Some(WORKER),
        None,
    )
    .await;
    assert_eq!(
        (status, &err["error"]["code"]),
        (403, &json!("permission_denied"))
    );

    let (status, _) = rest(
        &r,
        Method::DELETE,
        "/admin/api/mcp/servers/fs?expected_revision=1",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, 409);
    let (status, deleted) = rest(
        &r,
        Method::DELETE,
        "/admin/api/mcp/servers/fs",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!((status, &deleted["revision"]), (200, &json!(3)));
    let (status, _) = rest(
        &r,
        Method::GET,
        "/admin/api/mcp/servers/fs",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = rest(
        &r,
        Method::DELETE,
        "/admin/api/mcp/servers/fs",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn rest_history_and_rollback() {
    use reqwest::Method;
    let r = sqlite_registry(|_| {}).await;
    for command in ["v1", "v2", "v3"] {
        store_upsert(&r.store, "fs", command).await;
    }
    let (status, history) = rest(
        &r,
        Method::GET,
        "/admin/api/mcp/servers/fs/history",
        Some(WORKER),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let revisions: Vec<_> = history["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["revision"].clone())
        .collect();
    assert_eq!(revisions, [json!(3), json!(2), json!(1)]);
    assert_eq!(
        history["entries"][2]["spec"]["stdio"]["env"]["API_KEY"],
        "********"
    );

    let (status, rolled) = rest(
        &r,
        Method::POST,
        "/admin/api/mcp/servers/fs/rollback",
        Some(ADMIN),
        Some(r#"{"revision": 1}"#),
    )
    .await;
    assert_eq!(status, 200, "{rolled}");
    assert_eq!(rolled["revision"], 4, "a rollback is a new revision");
    assert_eq!(rolled["stdio"]["command"], "v1");

    let (status, err) = rest(
        &r,
        Method::POST,
        "/admin/api/mcp/servers/fs/rollback",
        Some(ADMIN),
        Some(r#"{"revision": 99}"#),
    )
    .await;
    assert_eq!((status, &err["error"]["code"]), (404, &json!("not_found")));
    let (status, err) = rest(
        &r,
        Method::POST,
        "/admin/api/mcp/servers/fs/rollback",
        Some(ADMIN),
        Some(r#"{"rev": 1}"#),
    )
    .await;
    assert_eq!((status, &err["error"]["field"]), (400, &json!("revision")));
    let (status, _) = rest(
        &r,
        Method::DELETE,
        "/admin/api/mcp/servers/fs",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let (status, err) = rest(
        &r,
        Method::POST,
        "/admin/api/mcp/servers/fs/rollback",
        Some(ADMIN),
        Some(r#"{"revision": 5}"#),
    )
    .await;
    assert_eq!(
        (status, &err["error"]["field"]),
        (400, &json!("revision")),
        "{err}"
    );
    let (status, _) = rest(
        &r,
        Method::POST,
        "/admin/api/mcp/servers/fs/rollback",
        Some(ADMIN),
        Some(r#"{"revision": 2}"#),
    )
    .await;
    assert_eq!(status, 201, "rolling back a deleted record re-creates it");
}

#[tokio::test]
async fn rest_import_validates_everything_first() {
    use reqwest::Method;
    let r = sqlite_registry(|_| {}).await;
    let toml = r#"
[[servers]]
server_id = "a"
transport = "stdio"
stdio = { command = "x" }

[[servers]]
server_id = "b"
transport = "streamable_http"
http = { url = "ftp://nope" }
"#;
    let import = |body: String, content_type: &'static str| {
        reqwest::Client::new()
            .post(r.url("/admin/api/mcp/import"))
            .bearer_auth(ADMIN)
            .header("content-type", content_type)
            .body(body)
            .send()
    };
    let response = import(toml.to_owned(), "application/toml").await.unwrap();
    assert_eq!(response.status(), 400);
    let err: Value = response.json().await.unwrap();
    assert_eq!(err["error"]["field"], "servers[1].http.url");
    assert_eq!(
        r.store.head().await.unwrap().revision,
        0,
        "nothing is written when any record is invalid"
    );

    let fixed = toml.replace("ftp://nope", "https://mcp.example.com/mcp");
    let response = import(fixed, "application/toml").await.unwrap();
    assert_eq!(response.status(), 200);
    let result: Value = response.json().await.unwrap();
    assert_eq!(result["results"][0]["outcome"], "created");
    assert_eq!(result["results"][1]["revision"], 2);

    let json_body =
        json!({"server_id": "c", "transport": "stdio", "stdio": {"command": "y"}}).to_string();
    let response = import(json_body, "application/json").await.unwrap();
    assert_eq!(response.status(), 200);
    let (status, err) = rest(&r, Method::POST, "/admin/api/mcp/rescan", Some(ADMIN), None).await;
    assert_eq!(
        (status, &err["error"]["code"]),
        (412, &json!("failed_precondition")),
        "no mcp.d configured"
    );
}

/// `allowed_resources` / `allowed_prompts` through every API and both
/// stores: REST bodies and gRPC messages carry them, the store keeps them,
/// the same lists again are a no-op, an edit of them is audited by path, and
/// a malformed pattern is refused naming its index.
async fn resource_and_prompt_lists_round_trip(r: TestRegistry) {
    use reqwest::Method;
    const SERVERS: &str = "/admin/api/mcp/servers";
    let mut record = json!(spec("files", "npx"));
    record["allowed_resources"] = json!(["file:///data/*.md", "ui://*"]);
    record["allowed_prompts"] = json!(["summarize*"]);
    let post = async |body: &Value| {
        rest(
            &r,
            Method::POST,
            SERVERS,
            Some(ADMIN),
            Some(&body.to_string()),
        )
        .await
    };
    let read_files = async |token: &str| {
        rest(
            &r,
            Method::GET,
            &format!("{SERVERS}/files"),
            Some(token),
            None,
        )
        .await
        .1
    };
    let (status, created) = post(&record).await;
    assert_eq!(status, 201, "{created}");
    let read = read_files(WORKER).await;
    assert_eq!(
        read["allowed_resources"],
        json!(["file:///data/*.md", "ui://*"])
    );
    assert_eq!(read["allowed_prompts"], json!(["summarize*"]));
    let (status, same) = post(&record).await;
    assert_eq!((status, &same["unchanged"]), (200, &json!(true)));

    // gRPC reads what REST wrote, and writes what REST reads.
    let mut admin = r.client(Some(ADMIN)).await;
    let server = admin
        .get_mcp_server(pb::GetMcpServerRequest {
            server_id: "files".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .server
        .unwrap();
    let mut wire = server.spec.unwrap();
    assert_eq!(wire.allowed_resources, ["file:///data/*.md", "ui://*"]);
    assert_eq!(wire.allowed_prompts, ["summarize*"]);
    wire.allowed_prompts.push("greet".into());
    admin
        .upsert_mcp_server(pb::UpsertMcpServerRequest {
            server: Some(wire.clone()),
            expected_revision: Some(server.revision),
        })
        .await
        .unwrap();
    let read = read_files(ADMIN).await;
    assert_eq!(read["allowed_prompts"], json!(["summarize*", "greet"]));
    let (_, audit) = rest(&r, Method::GET, "/admin/api/audit", Some(ADMIN), None).await;
    // The gRPC write also moved the record from source `admin` to `api`.
    assert_eq!(
        audit["entries"][0]["changed_fields"],
        json!(["allowed_prompts", "(source)"])
    );

    // Malformed patterns: 400 naming the index, nothing stored.
    let mut bad = record.clone();
    bad["allowed_resources"] = json!(["file:///my notes/*", "ui://*"]);
    let (status, err) = post(&bad).await;
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["field"], "allowed_resources[0]");
    assert!(
        err["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("whitespace")),
        "{err}"
    );
    bad["allowed_resources"] = json!(["ui://*", "ui://{a"]);
    let (status, err) = post(&bad).await;
    assert_eq!(
        (status, &err["error"]["field"]),
        (400, &json!("allowed_resources[1]"))
    );
    wire.allowed_prompts = vec!["[".into()];
    let refused = admin
        .upsert_mcp_server(pb::UpsertMcpServerRequest {
            server: Some(wire),
            expected_revision: None,
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused.message().starts_with("allowed_prompts[0]"),
        "{}",
        refused.message()
    );
    let stored = r.store.get("files").await.unwrap().unwrap();
    assert_eq!(stored.spec.allowed_prompts, ["summarize*", "greet"]);
    assert_eq!(
        stored.spec.allowed_resources,
        ["file:///data/*.md", "ui://*"]
    );
}

#[tokio::test]
async fn resource_and_prompt_lists_round_trip_on_sqlite() {
    resource_and_prompt_lists_round_trip(sqlite_registry(|_| {}).await).await;
}

#[tokio::test]
async fn resource_and_prompt_lists_round_trip_on_postgres() {
    resource_and_prompt_lists_round_trip(postgres_registry().await).await;
}
