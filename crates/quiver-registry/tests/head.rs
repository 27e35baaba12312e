//! Reads served from the registry's in-memory head (docs/reference.md §3):
//! lists follow writes on every replica of one database, never go back to
//! an older revision than a client saw on that replica, and equal what the
//! database holds; watch events carry their records, so a change costs the
//! registry the same database reads however many workers watch.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::{ADMIN, TestRegistry, WORKER, spec};
use quiver_model::access::{AccessKind, StoredAccess};
use quiver_model::approval::{
    Approval, ApprovalBinding, ApprovalDecision, ApprovalState, UseOutcome,
};
use quiver_model::{Change, HistoryEntry, StoredServer};
use quiver_proto::credentials::Credentials;
use quiver_proto::v1 as pb;
use quiver_registry::Registry;
use quiver_store::{AccessDelete, AccessHistoryEntry, AccessOutcome, AccessPut};
use quiver_store::{
    DecideOutcome, DeleteRequest, Head, HistoryPage, HistoryRow, NewApproval, RequestedApproval,
    Snapshot, SqlStore, Store, StoreError, UpsertOutcome, UpsertRequest,
};
use quiver_testkit::postgres::TestDatabase;
use quiver_testkit::registry::test_options;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

fn upsert(id: &str, command: &str) -> pb::UpsertMcpServerRequest {
    pb::UpsertMcpServerRequest {
        server: Some((&spec(id, command)).into()),
        expected_revision: None,
    }
}

async fn list(registry: &TestRegistry) -> pb::ListMcpServersResponse {
    let mut client = registry.client(Some(WORKER)).await;
    client
        .list_mcp_servers(pb::ListMcpServersRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// The records of the store at its head, as the gRPC list shows them.
async fn database_list(store: &SqlStore) -> pb::ListMcpServersResponse {
    let snapshot = store.list().await.unwrap();
    pb::ListMcpServersResponse {
        revision: snapshot.revision,
        servers: snapshot.servers.iter().map(Into::into).collect(),
        access: snapshot.access.iter().map(Into::into).collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_follow_writes_on_every_replica_of_one_database() {
    let db = TestDatabase::create().await;
    let open = || async { Arc::new(SqlStore::open_postgres(db.url()).await.unwrap()) };
    let a = TestRegistry::start(open().await, test_options()).await;
    let b = TestRegistry::start(open().await, test_options()).await;
    let mut admin_a = a.client(Some(ADMIN)).await;
    let mut admin_b = b.client(Some(ADMIN)).await;
    let mut reader_b = b.client(Some(WORKER)).await;
    let mut seen_on_b = 0;
    for i in 0..12 {
        // Writes alternate between the replicas; a record is deleted and
        // created again (its `created_at` starts over).
        let (admin, id) = if i % 2 == 0 {
            (&mut admin_a, format!("s{}", i % 5))
        } else {
            (&mut admin_b, format!("s{}", i % 3))
        };
        let written = admin
            .upsert_mcp_server(upsert(&id, &format!("cmd{i}")))
            .await
            .unwrap()
            .into_inner()
            .server
            .unwrap();
        if i == 6 {
            admin
                .delete_mcp_server(pb::DeleteMcpServerRequest {
                    server_id: "s0".into(),
                    expected_revision: None,
                })
                .await
                .unwrap();
        }
        // Read your write, on the replica written to.
        let own = if i % 2 == 0 {
            list(&a).await
        } else {
            list(&b).await
        };
        assert!(own.revision >= written.revision, "{i}: stale list");
        if i != 6 || id != "s0" {
            assert!(own.servers.contains(&written), "{i}: {id} missing");
        }
        // The other replica never goes back.
        let other = reader_b
            .list_mcp_servers(pb::ListMcpServersRequest {})
            .await
            .unwrap()
            .into_inner();
        assert!(other.revision >= seen_on_b, "{i}: b went backwards");
        seen_on_b = other.revision;
    }
    admin_a
        .upsert_mcp_server(upsert("s0", "again"))
        .await
        .unwrap();
    // Both replicas converge on exactly what the database holds.
    let expected = database_list(&a.store).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    for registry in [&a, &b] {
        loop {
            let listed = list(registry).await;
            if listed == expected {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{} at {} never matched the database at {}",
                registry.grpc,
                listed.revision,
                expected.revision
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The REST list is the same head.
        let (status, body) = common::rest(
            registry,
            reqwest::Method::GET,
            "/admin/api/mcp/servers",
            Some(ADMIN),
            None,
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["revision"], expected.revision);
        assert_eq!(
            body["servers"].as_array().unwrap().len(),
            expected.servers.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_events_carry_their_records_as_of_their_revision() {
    let registry = TestRegistry::sqlite(|_| {}).await;
    let mut admin = registry.client(Some(ADMIN)).await;
    let mut worker = registry.client(Some(WORKER)).await;
    let mut stream = worker
        .watch_mcp_servers(pb::WatchMcpServersRequest { since_revision: 0 })
        .await
        .unwrap()
        .into_inner();
    let first = admin
        .upsert_mcp_server(upsert("a", "one"))
        .await
        .unwrap()
        .into_inner()
        .server
        .unwrap();
    let second = admin
        .upsert_mcp_server(upsert("a", "two"))
        .await
        .unwrap()
        .into_inner()
        .server
        .unwrap();
    admin
        .delete_mcp_server(pb::DeleteMcpServerRequest {
            server_id: "a".into(),
            expected_revision: None,
        })
        .await
        .unwrap();
    let mut events = Vec::new();
    while events.len() < 3 {
        let event = tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if !event.heartbeat {
            events.push(event);
        }
    }
    // Each event holds the record as of its own revision, not the newest.
    assert_eq!(events[0].servers, [first]);
    assert_eq!(events[1].servers, [second]);
    assert_eq!(events[2].deletes, ["a"]);
    assert!(events[2].servers.is_empty());
}

/// A store that counts the reads reaching the database.
struct CountingStore {
    inner: SqlStore,
    reads: AtomicUsize,
}

impl CountingStore {
    fn read(&self) {
        self.reads.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl Store for CountingStore {
    async fn list(&self) -> Result<Snapshot, StoreError> {
        self.read();
        self.inner.list().await
    }
    async fn get(&self, server_id: &str) -> Result<Option<StoredServer>, StoreError> {
        self.read();
        self.inner.get(server_id).await
    }
    async fn upsert(&self, request: UpsertRequest) -> Result<UpsertOutcome, StoreError> {
        self.inner.upsert(request).await
    }
    async fn apply(&self, requests: Vec<UpsertRequest>) -> Result<Vec<UpsertOutcome>, StoreError> {
        self.inner.apply(requests).await
    }
    async fn delete(&self, request: DeleteRequest) -> Result<u64, StoreError> {
        self.inner.delete(request).await
    }
    async fn history(&self, server_id: &str) -> Result<Vec<HistoryEntry>, StoreError> {
        self.read();
        self.inner.history(server_id).await
    }
    async fn history_page(&self, page: HistoryPage<'_>) -> Result<Vec<HistoryRow>, StoreError> {
        self.read();
        self.inner.history_page(page).await
    }
    async fn changes_since(&self, after: u64, limit: u32) -> Result<Vec<Change>, StoreError> {
        self.read();
        self.inner.changes_since(after, limit).await
    }
    async fn head(&self) -> Result<Head, StoreError> {
        self.read();
        self.inner.head().await
    }
    async fn compact(&self, floor: u64) -> Result<Head, StoreError> {
        self.inner.compact(floor).await
    }
    async fn put_access(&self, request: AccessPut) -> Result<AccessOutcome, StoreError> {
        self.inner.put_access(request).await
    }
    async fn delete_access(&self, request: AccessDelete) -> Result<u64, StoreError> {
        self.inner.delete_access(request).await
    }
    async fn get_access(
        &self,
        kind: AccessKind,
        name: &str,
    ) -> Result<Option<StoredAccess>, StoreError> {
        self.read();
        self.inner.get_access(kind, name).await
    }
    async fn access_history(
        &self,
        kind: AccessKind,
        name: &str,
    ) -> Result<Vec<AccessHistoryEntry>, StoreError> {
        self.read();
        self.inner.access_history(kind, name).await
    }
    async fn access_at(&self, revision: u64) -> Result<Option<AccessHistoryEntry>, StoreError> {
        self.read();
        self.inner.access_at(revision).await
    }
    async fn touch_api_keys(
        &self,
        used: &[(String, chrono::DateTime<chrono::Utc>)],
    ) -> Result<(), StoreError> {
        self.inner.touch_api_keys(used).await
    }
    async fn api_keys_last_used(
        &self,
    ) -> Result<std::collections::BTreeMap<String, chrono::DateTime<chrono::Utc>>, StoreError> {
        self.read();
        self.inner.api_keys_last_used().await
    }
    fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.subscribe()
    }
    async fn create_approval(&self, request: NewApproval) -> Result<RequestedApproval, StoreError> {
        self.inner.create_approval(request).await
    }
    async fn purge_approvals(
        &self,
        before: chrono::DateTime<chrono::Utc>,
        limit: u32,
    ) -> Result<u64, StoreError> {
        self.inner.purge_approvals(before, limit).await
    }
    async fn get_approval(&self, approval_id: &str) -> Result<Option<Approval>, StoreError> {
        self.inner.get_approval(approval_id).await
    }
    async fn list_approvals(
        &self,
        state: Option<ApprovalState>,
        limit: u32,
    ) -> Result<Vec<Approval>, StoreError> {
        self.inner.list_approvals(state, limit).await
    }
    async fn expire_approvals(&self) -> Result<Vec<Approval>, StoreError> {
        self.inner.expire_approvals().await
    }
    async fn decide_approval(
        &self,
        approval_id: &str,
        decision: ApprovalDecision,
        decided_by: &str,
        note: Option<String>,
    ) -> Result<DecideOutcome, StoreError> {
        self.inner
            .decide_approval(approval_id, decision, decided_by, note)
            .await
    }
    async fn use_approval(
        &self,
        approval_id: &str,
        call: &ApprovalBinding,
        used_by: &str,
    ) -> Result<(UseOutcome, Option<Approval>), StoreError> {
        self.inner.use_approval(approval_id, call, used_by).await
    }
    async fn put_oauth_connection(
        &self,
        name: &str,
        config: String,
        secret: quiver_store::SecretUpdate,
    ) -> Result<quiver_store::OAuthConnectionRow, StoreError> {
        self.inner.put_oauth_connection(name, config, secret).await
    }
    async fn get_oauth_connection(
        &self,
        name: &str,
    ) -> Result<Option<quiver_store::OAuthConnectionRow>, StoreError> {
        self.inner.get_oauth_connection(name).await
    }
    async fn list_oauth_connections(
        &self,
    ) -> Result<Vec<quiver_store::OAuthConnectionRow>, StoreError> {
        self.inner.list_oauth_connections().await
    }
    async fn delete_oauth_connection(&self, name: &str) -> Result<bool, StoreError> {
        self.inner.delete_oauth_connection(name).await
    }
    async fn store_oauth_tokens(
        &self,
        grant: quiver_store::GrantKey<'_>,
        expected_generation: u64,
        tokens: quiver_store::OAuthTokens,
    ) -> Result<Option<quiver_store::OAuthConnectionRow>, StoreError> {
        self.inner
            .store_oauth_tokens(grant, expected_generation, tokens)
            .await
    }
    async fn set_oauth_needs_reconsent(
        &self,
        grant: quiver_store::GrantKey<'_>,
        expected_generation: u64,
        error: &str,
    ) -> Result<Option<quiver_store::OAuthConnectionRow>, StoreError> {
        self.inner
            .set_oauth_needs_reconsent(grant, expected_generation, error)
            .await
    }
    async fn set_oauth_error(
        &self,
        grant: quiver_store::GrantKey<'_>,
        error: &str,
    ) -> Result<(), StoreError> {
        self.inner.set_oauth_error(grant, error).await
    }
    async fn acquire_oauth_lease(
        &self,
        grant: quiver_store::GrantKey<'_>,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.inner.acquire_oauth_lease(grant, holder, ttl).await
    }
    async fn release_oauth_lease(
        &self,
        grant: quiver_store::GrantKey<'_>,
        holder: &str,
    ) -> Result<(), StoreError> {
        self.inner.release_oauth_lease(grant, holder).await
    }
    async fn get_oauth_grant(
        &self,
        grant: quiver_store::GrantKey<'_>,
    ) -> Result<Option<quiver_store::OAuthConnectionRow>, StoreError> {
        self.inner.get_oauth_grant(grant).await
    }
    async fn list_oauth_user_grants(
        &self,
        connection: Option<&str>,
        principal: Option<&str>,
    ) -> Result<Vec<quiver_store::OAuthConnectionRow>, StoreError> {
        self.inner
            .list_oauth_user_grants(connection, principal)
            .await
    }
    async fn delete_oauth_user_grant(
        &self,
        connection: &str,
        principal: &str,
    ) -> Result<bool, StoreError> {
        self.inner
            .delete_oauth_user_grant(connection, principal)
            .await
    }
    async fn create_oauth_ticket(
        &self,
        row: quiver_store::OAuthTicketRow,
    ) -> Result<(), StoreError> {
        self.inner.create_oauth_ticket(row).await
    }
    async fn live_oauth_ticket(
        &self,
        connection: &str,
        principal: &str,
        live_at: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<quiver_store::OAuthTicketRow>, StoreError> {
        self.inner
            .live_oauth_ticket(connection, principal, live_at)
            .await
    }
    async fn take_oauth_ticket(
        &self,
        ticket_sha256: &str,
    ) -> Result<Option<quiver_store::OAuthTicketRow>, StoreError> {
        self.inner.take_oauth_ticket(ticket_sha256).await
    }
    async fn create_oauth_authorization(
        &self,
        row: quiver_store::OAuthAuthorizationRow,
    ) -> Result<(), StoreError> {
        self.inner.create_oauth_authorization(row).await
    }
    async fn get_oauth_authorization(
        &self,
        state: &str,
    ) -> Result<Option<quiver_store::OAuthAuthorizationRow>, StoreError> {
        self.inner.get_oauth_authorization(state).await
    }
    async fn take_oauth_authorization(
        &self,
        state: &str,
    ) -> Result<Option<quiver_store::OAuthAuthorizationRow>, StoreError> {
        self.inner.take_oauth_authorization(state).await
    }
    async fn revoke_gateway_session(
        &self,
        session_sha256: &str,
        expires_at: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), StoreError> {
        self.inner
            .revoke_gateway_session(session_sha256, expires_at)
            .await
    }
    async fn gateway_session_revocation(
        &self,
        session_sha256: &str,
    ) -> Result<Option<chrono::DateTime<chrono::Utc>>, StoreError> {
        self.inner.gateway_session_revocation(session_sha256).await
    }
    async fn lease_calls(
        &self,
        key: &str,
        limit: u32,
        per_s: u32,
        want: u32,
    ) -> Result<quiver_store::CallsLease, StoreError> {
        self.inner.lease_calls(key, limit, per_s, want).await
    }
    async fn give_back_calls(
        &self,
        key: &str,
        window_start_ms: i64,
        calls: u32,
    ) -> Result<(), StoreError> {
        self.inner
            .give_back_calls(key, window_start_ms, calls)
            .await
    }
    async fn record_usage(&self, batch: &quiver_store::UsageBatch) -> Result<bool, StoreError> {
        self.inner.record_usage(batch).await
    }
    async fn usage(
        &self,
        group: quiver_model::usage::UsageGroup,
        since_ms: i64,
        until_ms: i64,
        step_ms: Option<i64>,
    ) -> Result<(Vec<quiver_model::usage::UsageTotal>, bool), StoreError> {
        self.inner.usage(group, since_ms, until_ms, step_ms).await
    }
    async fn prune_usage(&self, before_ms: i64) -> Result<u64, StoreError> {
        self.inner.prune_usage(before_ms).await
    }
}

/// Database reads of one write while `watchers` streams follow it, each
/// receiving the change with its record.
async fn reads_per_change(watchers: usize) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("registry.db").display());
    let store = Arc::new(CountingStore {
        inner: SqlStore::open_sqlite(&url).await.unwrap(),
        reads: AtomicUsize::new(0),
    });
    let shutdown = CancellationToken::new();
    let registry = Registry::start(store.clone(), test_options(), shutdown.clone())
        .await
        .unwrap();
    let grpc = format!("http://{}", registry.grpc_addr());
    let serving = tokio::spawn(registry.run());
    let channel = tonic::transport::Channel::from_shared(grpc)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let client = Credentials::new(Some(WORKER), None)
        .unwrap()
        .client(channel);
    let mut streams = Vec::new();
    for _ in 0..watchers {
        let mut client = client.clone();
        streams.push(
            client
                .watch_mcp_servers(pb::WatchMcpServersRequest { since_revision: 0 })
                .await
                .unwrap()
                .into_inner(),
        );
    }
    // Let every watcher finish its (empty) catch-up first.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = store.reads.load(Ordering::SeqCst);
    store
        .upsert(UpsertRequest {
            spec: spec("a", "x"),
            expected_revision: None,
            actor: "test".into(),
            source: quiver_model::Source::Api,
        })
        .await
        .unwrap();
    for stream in &mut streams {
        let event = loop {
            let event = tokio::time::timeout(Duration::from_secs(5), stream.message())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            if !event.heartbeat {
                break event;
            }
        };
        assert_eq!(event.revision, 1);
        assert_eq!(event.servers.len(), 1, "the record is carried");
    }
    let reads = store.reads.load(Ordering::SeqCst) - before;
    shutdown.cancel();
    let _ = serving.await;
    reads
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_costs_the_same_database_reads_for_any_number_of_watchers() {
    let one = reads_per_change(1).await;
    let many = reads_per_change(40).await;
    assert!(one <= 2, "one watcher: {one} reads");
    assert_eq!(one, many, "40 watchers cost more reads than one");
}
