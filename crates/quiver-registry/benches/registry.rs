//! Registry benchmark (issue #2): upsert throughput and upsert → watch-event
//! latency over real gRPC, on SQLite and on PostgreSQL.
//!
//! Each backend gets a real in-process registry (`quiver_testkit::registry::
//! InProcessRegistry`: `Registry::start` on `127.0.0.1:0` with the test
//! tokens, served by `Registry::run`) and tonic clients on loopback. Every figure is printed next to a baseline measured in the same
//! run on the same machine, and the ratio between the two is the number to
//! compare across runs (the absolute numbers move with the load of the shared
//! machine):
//!
//! - upsert throughput (1 client, and `QUIVER_BENCH_CLIENTS` clients on their
//!   own channels) against raw single-row `INSERT` + `COMMIT` transactions
//!   through sqlx on the same database engine and settings (1 and as many
//!   connections);
//! - upsert RPC latency against one raw `INSERT` + `COMMIT`;
//! - batch apply (`ApplyMcpServers`, `QUIVER_BENCH_BATCH` records per call,
//!   one client) in records/s against raw transactions of as many `INSERT`s
//!   and one `COMMIT`, and against single upserts from all clients;
//! - upsert → watch-event latency (from just before the upsert RPC to receipt
//!   of the matching event on an open `WatchMcpServers` stream, one upsert at
//!   a time) against a gRPC read that writes nothing (`GetMcpServer`);
//! - on PostgreSQL, the same latency with the watcher on a second registry
//!   replica sharing the database (woken by LISTEN/NOTIFY), against the
//!   same-replica latency.
//!
//! Run with `cargo bench -p quiver-registry --bench registry`. Sizes come from
//! environment variables (defaults in brackets): `QUIVER_BENCH_UPSERTS` [2000]
//! upserts per throughput phase, `QUIVER_BENCH_CLIENTS` [8] concurrent
//! clients, `QUIVER_BENCH_EVENTS` [1000] upserts timed to their watch event,
//! `QUIVER_BENCH_BASELINE` [1000] samples per baseline, `QUIVER_BENCH_WARMUP`
//! [20] untimed operations before each phase, `QUIVER_BENCH_BATCH` [100]
//! records per batch apply, `QUIVER_BENCH_BACKENDS`
//! [`sqlite,postgres`]. PostgreSQL comes from `QUIVER_TEST_DATABASE_URL`
//! (default `postgres://postgres@127.0.0.1:5432/postgres`); a fresh database
//! is created and dropped.

use quiver_testkit::bench::{Samples, env_usize, ms};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quiver_proto::v1 as pb;
use quiver_store::SqlStore;
use quiver_testkit::postgres::TestDatabase;
use quiver_testkit::registry::{self, ADMIN_TOKEN, InProcessRegistry};
use sqlx::Executor;
use sqlx::any::AnyPoolOptions;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tonic::transport::Channel;

/// Same pragmas as the registry's SQLite store (`quiver-store/src/sqlite.rs`).
const SQLITE_PRAGMAS: &str =
    "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA busy_timeout = 30000;";
const BASELINE_TABLE: &str = "CREATE TABLE bench_baseline \
     (id BIGINT PRIMARY KEY, payload TEXT NOT NULL, at_ms BIGINT NOT NULL)";
const BASELINE_INSERT: &str = "INSERT INTO bench_baseline (id, payload, at_ms) VALUES ($1, $2, $3)";

type BenchResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Benchmark sizes, from the environment.
#[derive(Debug, Clone, Copy)]
struct Config {
    upserts: usize,
    clients: usize,
    events: usize,
    baseline: usize,
    warmup: usize,
    batch: usize,
}

impl Config {
    fn from_env() -> Self {
        Config {
            upserts: env_usize("QUIVER_BENCH_UPSERTS", 2000).max(1),
            clients: env_usize("QUIVER_BENCH_CLIENTS", 8).max(1),
            events: env_usize("QUIVER_BENCH_EVENTS", 1000).max(1),
            baseline: env_usize("QUIVER_BENCH_BASELINE", 1000).max(1),
            warmup: env_usize("QUIVER_BENCH_WARMUP", 20),
            batch: env_usize("QUIVER_BENCH_BATCH", 100).max(1),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }

    /// How a raw write transaction starts, as the registry's store starts it.
    fn begin(self) -> &'static str {
        match self {
            Backend::Sqlite => "BEGIN IMMEDIATE",
            Backend::Postgres => "BEGIN ISOLATION LEVEL READ COMMITTED",
        }
    }
}

// ---------------------------------------------------------------- statistics

/// Operations per second of `ops` operations in `elapsed`.
fn rate(ops: usize, elapsed: Duration) -> f64 {
    ops as f64 / elapsed.as_secs_f64()
}

/// A finished phase: throughput and per-operation latencies.
struct Phase {
    ops_per_sec: f64,
    latency: Samples,
}

// ---------------------------------------------------------------- report

struct Row {
    backend: &'static str,
    metric: String,
    value: String,
    baseline: String,
    ratio: String,
}

#[derive(Default)]
struct Report {
    rows: Vec<Row>,
}

impl Report {
    fn add(
        &mut self,
        backend: Backend,
        metric: impl Into<String>,
        value: String,
        baseline: String,
        ratio: Option<f64>,
    ) {
        self.rows.push(Row {
            backend: backend.name(),
            metric: metric.into(),
            value,
            baseline,
            ratio: ratio.map_or_else(|| "—".to_owned(), |r| format!("{r:.2}×")),
        });
    }

    /// A latency row: `value / baseline`.
    fn latency(
        &mut self,
        backend: Backend,
        metric: impl Into<String>,
        value: Duration,
        baseline_name: &str,
        baseline: Option<Duration>,
    ) {
        let ratio = baseline.map(|b| value.as_secs_f64() / b.as_secs_f64());
        self.add(
            backend,
            metric,
            format!("{:.3} ms", ms(value)),
            baseline.map_or_else(
                || "—".to_owned(),
                |b| format!("{baseline_name}: {:.3} ms", ms(b)),
            ),
            ratio,
        );
    }

    /// A throughput row: `value / baseline`.
    fn throughput(
        &mut self,
        backend: Backend,
        metric: impl Into<String>,
        value: f64,
        baseline_name: &str,
        baseline: f64,
    ) {
        self.add(
            backend,
            metric,
            format!("{value:.0} ops/s"),
            format!("{baseline_name}: {baseline:.0} ops/s"),
            Some(value / baseline),
        );
    }

    fn print(&self) {
        println!("| backend | metric | value | baseline (same run) | ratio |");
        println!("|---|---|---:|---|---:|");
        for row in &self.rows {
            println!(
                "| {} | {} | {} | {} | {} |",
                row.backend, row.metric, row.value, row.baseline, row.ratio
            );
        }
    }
}

// ---------------------------------------------------------------- gRPC client

type Client = quiver_proto::credentials::RegistryClient;

/// A client on its own HTTP/2 connection.
async fn connect(addr: SocketAddr) -> BenchResult<Client> {
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    Ok(quiver_proto::credentials::Credentials::new(Some(ADMIN_TOKEN), None)?.client(channel))
}

/// A valid record; `version` goes into a label so every upsert changes the
/// content (an identical upsert is a no-op without a revision).
fn spec(server_id: &str, version: usize) -> pb::McpServerSpec {
    pb::McpServerSpec {
        server_id: server_id.to_owned(),
        display_name: Some(format!("Benchmark server {server_id}")),
        transport: pb::Transport::StreamableHttp.into(),
        http: Some(pb::HttpConfig {
            url: format!("https://mcp.example.com/{server_id}"),
            headers: [("X-Bench".to_owned(), "1".to_owned())].into(),
            auth_ref: None,
        }),
        tool_namespace: Some("bench".to_owned()),
        allowed_tools: vec!["read_*".to_owned(), "list_*".to_owned()],
        labels: [
            ("team".to_owned(), "bench".to_owned()),
            ("version".to_owned(), version.to_string()),
        ]
        .into(),
        ..Default::default()
    }
}

/// Upserts and returns the new revision.
async fn upsert(client: &mut Client, server_id: &str, version: usize) -> BenchResult<u64> {
    let response = client
        .upsert_mcp_server(pb::UpsertMcpServerRequest {
            server: Some(spec(server_id, version)),
            expected_revision: None,
        })
        .await?
        .into_inner();
    if response.unchanged {
        return Err(format!("upsert of {server_id} v{version} was a no-op").into());
    }
    Ok(response.server.ok_or("upsert returned no record")?.revision)
}

// ---------------------------------------------------------------- registry phases

async fn upsert_phase(
    client: &mut Client,
    prefix: &str,
    records: usize,
    count: usize,
) -> BenchResult<Phase> {
    let mut latencies = Vec::with_capacity(count);
    let started = Instant::now();
    for i in 0..count {
        let id = format!("{prefix}-{}", i % records);
        let t0 = Instant::now();
        upsert(client, &id, i).await?;
        latencies.push(t0.elapsed());
    }
    Ok(Phase {
        ops_per_sec: rate(count, started.elapsed()),
        latency: Samples::new(latencies),
    })
}

/// `count` upserts spread over `clients` clients, each on its own channel,
/// all writing at once (each client its own records).
async fn concurrent_upserts(
    addr: SocketAddr,
    prefix: &str,
    clients: usize,
    count: usize,
) -> BenchResult<Phase> {
    let mut connected = Vec::with_capacity(clients);
    for _ in 0..clients {
        connected.push(connect(addr).await?);
    }
    let per_client = count.div_ceil(clients);
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for (c, mut client) in connected.into_iter().enumerate() {
        let prefix = format!("{prefix}-c{c}");
        tasks.spawn(async move { upsert_phase(&mut client, &prefix, 8, per_client).await });
    }
    let mut latencies = Vec::with_capacity(per_client * clients);
    while let Some(joined) = tasks.join_next().await {
        latencies.extend(joined??.latency.sorted().iter().copied());
    }
    Ok(Phase {
        ops_per_sec: rate(per_client * clients, started.elapsed()),
        latency: Samples::new(latencies),
    })
}

/// `count` upserts straight into the store (no gRPC, no registry) from
/// `tasks` concurrent tasks, each writing its own records: what the store's
/// write path (on PostgreSQL, the head-row critical section) allows.
async fn store_upserts(store: Arc<SqlStore>, tasks: usize, count: usize) -> BenchResult<Phase> {
    use quiver_store::{Store, UpsertRequest};
    let per_task = count.div_ceil(tasks);
    let started = Instant::now();
    let mut set = JoinSet::new();
    for t in 0..tasks {
        let store = store.clone();
        set.spawn(async move {
            let mut latencies = Vec::with_capacity(per_task);
            for i in 0..per_task {
                let spec = quiver_model::McpServerSpec::try_from(spec(
                    &format!("store-t{t}-{}", i % 8),
                    i,
                ))?;
                let t0 = Instant::now();
                store
                    .upsert(UpsertRequest {
                        spec,
                        expected_revision: None,
                        actor: "bench".into(),
                        source: quiver_model::Source::Api,
                    })
                    .await?;
                latencies.push(t0.elapsed());
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(latencies)
        });
    }
    let mut latencies = Vec::with_capacity(per_task * tasks);
    while let Some(joined) = set.join_next().await {
        latencies.extend(joined??);
    }
    Ok(Phase {
        ops_per_sec: rate(per_task * tasks, started.elapsed()),
        latency: Samples::new(latencies),
    })
}

/// `count` records (rounded up to whole batches) applied with
/// `ApplyMcpServers` in batches of `batch` from one client; every batch
/// changes every record. Throughput in records/s.
async fn batch_phase(
    client: &mut Client,
    prefix: &str,
    batch: usize,
    count: usize,
) -> BenchResult<Phase> {
    let batches = count.div_ceil(batch);
    let mut latencies = Vec::with_capacity(batches);
    let started = Instant::now();
    for b in 0..batches {
        let servers = (0..batch)
            .map(|i| pb::UpsertMcpServerRequest {
                server: Some(spec(&format!("{prefix}-{i}"), b)),
                expected_revision: None,
            })
            .collect();
        let t0 = Instant::now();
        let response = client
            .apply_mcp_servers(pb::ApplyMcpServersRequest { servers })
            .await?
            .into_inner();
        latencies.push(t0.elapsed());
        let taken = response.last_revision + 1 - response.first_revision;
        if response.first_revision == 0 || taken != batch as u64 {
            return Err(format!(
                "batch {b} took revisions {}..={}, expected {batch} consecutive ones",
                response.first_revision, response.last_revision
            )
            .into());
        }
    }
    Ok(Phase {
        ops_per_sec: rate(batches * batch, started.elapsed()),
        latency: Samples::new(latencies),
    })
}

/// Upsert → watch-event latencies, one upsert at a time, plus how long after
/// the upsert reply the event arrived.
struct EventLatency {
    to_event: Samples,
    after_reply: Samples,
}

/// `writer` upserts records named `prefix-…`; the watcher connects to
/// `watch_addr` (the writer's registry, or another replica on the same
/// database).
async fn event_phase(
    watch_addr: SocketAddr,
    writer: &mut Client,
    prefix: &str,
    count: usize,
    warmup: usize,
) -> BenchResult<EventLatency> {
    let mut watcher = connect(watch_addr).await?;
    let since = watcher
        .list_mcp_servers(pb::ListMcpServersRequest {})
        .await?
        .into_inner()
        .revision;
    let mut stream = watcher
        .watch_mcp_servers(pb::WatchMcpServersRequest {
            since_revision: since,
        })
        .await?
        .into_inner();
    // Receipt times are taken by a task that only reads the stream.
    let (tx, mut events) = mpsc::unbounded_channel::<(u64, Instant)>();
    let reader = tokio::spawn(async move {
        while let Ok(Some(event)) = stream.message().await {
            let at = Instant::now();
            if !event.heartbeat && tx.send((event.revision, at)).is_err() {
                break;
            }
        }
    });
    let mut to_event = Vec::with_capacity(count);
    let mut after_reply = Vec::with_capacity(count);
    for i in 0..warmup + count {
        let id = format!("{prefix}-{}", i % 16);
        let t0 = Instant::now();
        let revision = upsert(writer, &id, i).await?;
        let replied = Instant::now();
        let received = loop {
            let (event_revision, at) = tokio::time::timeout(Duration::from_secs(30), events.recv())
                .await?
                .ok_or("watch stream ended")?;
            if event_revision == revision {
                break at;
            }
            if event_revision > revision {
                return Err(format!("watch skipped revision {revision}").into());
            }
        };
        if i >= warmup {
            to_event.push(received - t0);
            after_reply.push(received.saturating_duration_since(replied));
        }
    }
    reader.abort();
    Ok(EventLatency {
        to_event: Samples::new(to_event),
        after_reply: Samples::new(after_reply),
    })
}

/// List latencies with `QUIVER_BENCH_LIST_RECORDS` records stored.
struct ListLatency {
    records: usize,
    /// `ListMcpServers` over gRPC, served from the registry's in-memory head.
    grpc: Samples,
    /// `GET /admin/api/mcp/servers` (admin token, unmasked), likewise.
    rest: Samples,
    /// The previous path, in process: the store's consistent list, the
    /// conversion to the message and its encoding (no transport).
    database: Samples,
}

/// Tops the store up to `QUIVER_BENCH_LIST_RECORDS` [10000] records, waits
/// for the registry's head to reach the store's, then times
/// `QUIVER_BENCH_LIST_SAMPLES` [50] lists of each kind.
async fn list_phase(
    registry: &InProcessRegistry,
    store: &Arc<SqlStore>,
    warmup: usize,
) -> BenchResult<ListLatency> {
    use quiver_store::Store;
    let records = env_usize("QUIVER_BENCH_LIST_RECORDS", 10_000);
    let samples = env_usize("QUIVER_BENCH_LIST_SAMPLES", 50).max(1);
    let held = store.list().await?.servers.len();
    let mut chunk = Vec::new();
    for i in held..records {
        chunk.push(quiver_store::UpsertRequest {
            spec: quiver_model::McpServerSpec::try_from(spec(&format!("list-{i}"), i))?,
            expected_revision: None,
            actor: "bench".to_owned(),
            source: quiver_model::Source::Api,
        });
        if chunk.len() == 500 || i + 1 == records {
            store.apply(std::mem::take(&mut chunk)).await?;
        }
    }
    let head = store.head().await?.revision;
    let channel = Channel::from_shared(format!("http://{}", registry.grpc_addr()))?
        .connect()
        .await?;
    let mut client = quiver_proto::credentials::Credentials::new(Some(ADMIN_TOKEN), None)?
        .client(channel)
        .max_decoding_message_size(256 * 1024 * 1024);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let listed = client
            .list_mcp_servers(pb::ListMcpServersRequest {})
            .await?
            .into_inner();
        if listed.revision >= head {
            if listed.servers.len() < records {
                return Err(format!("listed {} records", listed.servers.len()).into());
            }
            break;
        }
        if Instant::now() > deadline {
            return Err("the registry's head did not reach the store's".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let http = reqwest::Client::new();
    let url = format!("http://{}/admin/api/mcp/servers", registry.http_addr());
    let (mut grpc, mut rest, mut database) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..warmup.min(5) + samples {
        let t0 = Instant::now();
        let listed = client
            .list_mcp_servers(pb::ListMcpServersRequest {})
            .await?
            .into_inner();
        let grpc_took = t0.elapsed();
        let t0 = Instant::now();
        let body = http
            .get(&url)
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await?
            .error_for_status()?
            .bytes()
            .await?;
        let rest_took = t0.elapsed();
        let t0 = Instant::now();
        let snapshot = store.list().await?;
        let message = pb::ListMcpServersResponse {
            revision: snapshot.revision,
            servers: snapshot.servers.iter().map(Into::into).collect(),
            access: snapshot.access.iter().map(Into::into).collect(),
        };
        let encoded = prost::Message::encode_to_vec(&message);
        let database_took = t0.elapsed();
        if listed.servers.len() != message.servers.len() || body.is_empty() || encoded.is_empty() {
            return Err("lists disagree".into());
        }
        if i >= warmup.min(5) {
            grpc.push(grpc_took);
            rest.push(rest_took);
            database.push(database_took);
        }
    }
    Ok(ListLatency {
        records,
        grpc: Samples::new(grpc),
        rest: Samples::new(rest),
        database: Samples::new(database),
    })
}

/// `count` sequential `GetMcpServer` calls of an existing record.
async fn read_phase(client: &mut Client, server_id: &str, count: usize) -> BenchResult<Samples> {
    let mut latencies = Vec::with_capacity(count);
    for _ in 0..count {
        let t0 = Instant::now();
        client
            .get_mcp_server(pb::GetMcpServerRequest {
                server_id: server_id.to_owned(),
            })
            .await?;
        latencies.push(t0.elapsed());
    }
    Ok(Samples::new(latencies))
}

// ---------------------------------------------------------------- raw baseline

/// Raw single-row `INSERT` + `COMMIT` transactions through sqlx.
async fn raw_insert_phase(
    pool: &sqlx::AnyPool,
    backend: Backend,
    first_id: i64,
    connections: usize,
    count: usize,
) -> BenchResult<Phase> {
    let payload = record_sized_payload();
    let per_connection = count.div_ceil(connections);
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for c in 0..connections {
        let pool = pool.clone();
        let payload = payload.clone();
        let base = first_id + (c * per_connection) as i64;
        tasks.spawn(async move {
            let mut latencies = Vec::with_capacity(per_connection);
            for i in 0..per_connection {
                let t0 = Instant::now();
                let mut tx = pool.begin_with(backend.begin()).await?;
                sqlx::query(BASELINE_INSERT)
                    .bind(base + i as i64)
                    .bind(payload.clone())
                    .bind(i as i64)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                latencies.push(t0.elapsed());
            }
            Ok::<_, sqlx::Error>(latencies)
        });
    }
    let mut latencies = Vec::with_capacity(per_connection * connections);
    while let Some(joined) = tasks.join_next().await {
        latencies.extend(joined??);
    }
    Ok(Phase {
        ops_per_sec: rate(per_connection * connections, started.elapsed()),
        latency: Samples::new(latencies),
    })
}

/// Raw transactions of `batch` single-row `INSERT`s and one `COMMIT`, one
/// connection; throughput in rows/s.
async fn raw_batch_phase(
    pool: &sqlx::AnyPool,
    backend: Backend,
    first_id: i64,
    batch: usize,
    count: usize,
) -> BenchResult<Phase> {
    let payload = record_sized_payload();
    let batches = count.div_ceil(batch);
    let mut latencies = Vec::with_capacity(batches);
    let started = Instant::now();
    for b in 0..batches {
        let t0 = Instant::now();
        let mut tx = pool.begin_with(backend.begin()).await?;
        for i in 0..batch {
            sqlx::query(BASELINE_INSERT)
                .bind(first_id + (b * batch + i) as i64)
                .bind(payload.clone())
                .bind(i as i64)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        latencies.push(t0.elapsed());
    }
    Ok(Phase {
        ops_per_sec: rate(batches * batch, started.elapsed()),
        latency: Samples::new(latencies),
    })
}

/// A payload the size of a stored record's JSON.
fn record_sized_payload() -> String {
    "x".repeat(400)
}

/// Baseline pool: SQLite in its own file with the registry's pragmas, or
/// the benchmark's PostgreSQL database.
async fn baseline_pool(
    backend: Backend,
    url: &str,
    connections: usize,
) -> BenchResult<sqlx::AnyPool> {
    sqlx::any::install_default_drivers();
    let mut options = AnyPoolOptions::new().max_connections(connections as u32);
    if backend == Backend::Sqlite {
        options = options.after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute(SQLITE_PRAGMAS).await?;
                Ok(())
            })
        });
    }
    let pool = options.connect(url).await?;
    pool.execute(BASELINE_TABLE).await?;
    Ok(pool)
}

// ---------------------------------------------------------------- one backend

async fn bench_backend(backend: Backend, config: Config, report: &mut Report) -> BenchResult<()> {
    let scratch = tempfile::tempdir()?;
    // Keeps the PostgreSQL database alive until the end of this function.
    let mut database = None;
    let (store, baseline_url): (Arc<SqlStore>, String) = match backend {
        Backend::Sqlite => {
            let registry_url = format!("sqlite://{}", scratch.path().join("registry.db").display());
            let baseline_url = format!(
                "sqlite://{}?mode=rwc",
                scratch.path().join("baseline.db").display()
            );
            (
                Arc::new(SqlStore::open_sqlite(&registry_url).await?),
                baseline_url,
            )
        }
        Backend::Postgres => {
            let db = TestDatabase::create().await;
            let url = db.url().to_owned();
            database = Some(db);
            (Arc::new(SqlStore::open_postgres(&url).await?), url)
        }
    };
    let name = backend.name();
    eprintln!("[{name}] starting registry");
    // Heartbeats and fan-out sizes as deployed; the watch reader skips
    // heartbeats.
    let registry = InProcessRegistry::start(store.clone(), registry::test_options()).await;
    let pool = baseline_pool(backend, &baseline_url, config.clients).await?;
    let mut client = connect(registry.grpc_addr()).await?;

    // Baseline (a): raw INSERT + COMMIT, 1 connection and `clients` connections.
    eprintln!("[{name}] raw insert baseline");
    raw_insert_phase(&pool, backend, 0, 1, config.warmup).await?;
    let raw_seq = raw_insert_phase(&pool, backend, 1_000_000, 1, config.baseline).await?;
    let raw_conc =
        raw_insert_phase(&pool, backend, 2_000_000, config.clients, config.baseline).await?;

    // Upsert throughput, 1 client.
    eprintln!("[{name}] sequential upserts");
    upsert_phase(&mut client, "warm", 16, config.warmup).await?;
    let seq = upsert_phase(&mut client, "seq", 64, config.upserts).await?;

    // Upsert throughput, `clients` clients.
    eprintln!("[{name}] {} concurrent clients", config.clients);
    let conc =
        concurrent_upserts(registry.grpc_addr(), "conc", config.clients, config.upserts).await?;

    // The store alone, as many tasks as clients.
    eprintln!("[{name}] store upserts, {} tasks", config.clients);
    let store_conc = store_upserts(store.clone(), config.clients, config.upserts).await?;

    // Batch apply against raw batched inserts.
    eprintln!("[{name}] batch apply, {} records per batch", config.batch);
    let batch = config.batch;
    raw_batch_phase(&pool, backend, 3_000_000, batch, batch).await?;
    let raw_batch =
        raw_batch_phase(&pool, backend, 4_000_000, batch, config.upserts.max(batch)).await?;
    batch_phase(&mut client, "warm-batch", batch, batch).await?;
    let batched = batch_phase(&mut client, "batch", batch, config.upserts.max(batch)).await?;

    // Upsert → watch event.
    eprintln!("[{name}] upsert → watch event");
    let events = event_phase(
        registry.grpc_addr(),
        &mut client,
        "watched",
        config.events,
        config.warmup,
    )
    .await?;

    // PostgreSQL: the same through a second replica on the same database,
    // woken by LISTEN/NOTIFY (R-STORE-7).
    let replica_events = match &database {
        Some(db) => {
            eprintln!("[{name}] upsert → watch event on a second replica");
            let replica_store = Arc::new(SqlStore::open_postgres(db.url()).await?);
            let replica = InProcessRegistry::start(replica_store, registry::test_options()).await;
            let events = event_phase(
                replica.grpc_addr(),
                &mut client,
                "replicated",
                config.events,
                config.warmup,
            )
            .await?;
            replica.stop().await;
            Some(events)
        }
        None => None,
    };

    // Lists of many records from the in-memory head, against the database path.
    eprintln!("[{name}] list from the in-memory head");
    let lists = list_phase(&registry, &store, config.warmup).await?;

    // Baseline (b): a gRPC read that writes nothing.
    eprintln!("[{name}] gRPC read baseline");
    read_phase(&mut client, "seq-0", config.warmup).await?;
    let reads = read_phase(&mut client, "seq-0", config.baseline).await?;

    let clients = config.clients;
    report.throughput(
        backend,
        "upsert throughput, 1 client",
        seq.ops_per_sec,
        "raw INSERT+COMMIT, 1 conn",
        raw_seq.ops_per_sec,
    );
    report.throughput(
        backend,
        format!("upsert throughput, {clients} clients"),
        conc.ops_per_sec,
        &format!("raw INSERT+COMMIT, {clients} conns"),
        raw_conc.ops_per_sec,
    );
    report.throughput(
        backend,
        format!("upsert throughput, {clients} clients vs 1 client"),
        conc.ops_per_sec,
        "upsert, 1 client",
        seq.ops_per_sec,
    );
    report.throughput(
        backend,
        format!("store upsert throughput (no gRPC), {clients} tasks"),
        store_conc.ops_per_sec,
        &format!("raw INSERT+COMMIT, {clients} conns"),
        raw_conc.ops_per_sec,
    );
    report.throughput(
        backend,
        format!("batch apply records/s, {batch} per batch, 1 client"),
        batched.ops_per_sec,
        &format!("raw {batch}×INSERT+COMMIT, 1 conn"),
        raw_batch.ops_per_sec,
    );
    report.throughput(
        backend,
        format!("batch apply records/s, {batch} per batch, 1 client"),
        batched.ops_per_sec,
        &format!("single upserts, {clients} clients"),
        conc.ops_per_sec,
    );
    report.latency(
        backend,
        format!("batch apply latency p50, {batch} per batch"),
        batched.latency.p50(),
        &format!("raw {batch}×INSERT+COMMIT p50"),
        Some(raw_batch.latency.p50()),
    );
    report.latency(
        backend,
        "upsert RPC latency p50, 1 client",
        seq.latency.p50(),
        "raw INSERT+COMMIT p50",
        Some(raw_seq.latency.p50()),
    );
    report.latency(
        backend,
        "upsert RPC latency p99, 1 client",
        seq.latency.p99(),
        "raw INSERT+COMMIT p99",
        Some(raw_seq.latency.p99()),
    );
    report.latency(
        backend,
        format!("upsert RPC latency p50, {clients} clients"),
        conc.latency.p50(),
        &format!("raw INSERT+COMMIT p50, {clients} conns"),
        Some(raw_conc.latency.p50()),
    );
    report.latency(
        backend,
        format!("upsert RPC latency p99, {clients} clients"),
        conc.latency.p99(),
        &format!("raw INSERT+COMMIT p99, {clients} conns"),
        Some(raw_conc.latency.p99()),
    );
    report.latency(
        backend,
        format!("upsert RPC latency max, {clients} clients"),
        conc.latency.max(),
        &format!("raw INSERT+COMMIT max, {clients} conns"),
        Some(raw_conc.latency.max()),
    );
    report.latency(
        backend,
        "upsert → watch event p50",
        events.to_event.p50(),
        "gRPC GetMcpServer p50",
        Some(reads.p50()),
    );
    report.latency(
        backend,
        "upsert → watch event p99",
        events.to_event.p99(),
        "gRPC GetMcpServer p99",
        Some(reads.p99()),
    );
    report.latency(
        backend,
        "upsert → watch event max",
        events.to_event.max(),
        "gRPC GetMcpServer max",
        Some(reads.max()),
    );
    if let Some(replica) = &replica_events {
        report.latency(
            backend,
            "upsert → watch event on 2nd replica p50",
            replica.to_event.p50(),
            "same replica p50",
            Some(events.to_event.p50()),
        );
        report.latency(
            backend,
            "upsert → watch event on 2nd replica p99",
            replica.to_event.p99(),
            "same replica p99",
            Some(events.to_event.p99()),
        );
    }
    report.latency(
        backend,
        "watch event after upsert reply p50",
        events.after_reply.p50(),
        "gRPC GetMcpServer p50",
        Some(reads.p50()),
    );
    report.latency(
        backend,
        "watch event after upsert reply p99",
        events.after_reply.p99(),
        "gRPC GetMcpServer p99",
        Some(reads.p99()),
    );

    let n = lists.records;
    for (metric, value, baseline) in [
        ("p50", lists.grpc.p50(), lists.database.p50()),
        ("p99", lists.grpc.p99(), lists.database.p99()),
    ] {
        report.latency(
            backend,
            format!("gRPC ListMcpServers of {n} records {metric}"),
            value,
            &format!("store list + encode {metric} (previous path)"),
            Some(baseline),
        );
    }
    for (metric, value, baseline) in [
        ("p50", lists.rest.p50(), lists.database.p50()),
        ("p99", lists.rest.p99(), lists.database.p99()),
    ] {
        report.latency(
            backend,
            format!("REST list of {n} records {metric}"),
            value,
            &format!("store list + encode {metric} (previous path)"),
            Some(baseline),
        );
    }

    drop(client);
    pool.close().await;
    registry.stop().await;
    drop(store);
    drop(database);
    Ok(())
}

fn main() -> BenchResult<()> {
    let config = Config::from_env();
    let backends = std::env::var("QUIVER_BENCH_BACKENDS")
        .unwrap_or_else(|_| "sqlite,postgres".to_owned())
        .split(',')
        .map(|name| match name.trim() {
            "sqlite" => Ok(Backend::Sqlite),
            "postgres" => Ok(Backend::Postgres),
            other => Err(format!(
                "unknown backend {other:?} in QUIVER_BENCH_BACKENDS"
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let started = Instant::now();
    let mut report = Report::default();
    runtime.block_on(async {
        for backend in backends {
            bench_backend(backend, config, &mut report).await?;
        }
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    })?;
    println!(
        "\nquiver registry benchmark: {} upserts per throughput phase, {} clients, {} records per batch, {} timed watch events, {} samples per baseline, {} warm-up ops; {} cores; {:.1} s",
        config.upserts,
        config.clients,
        config.batch,
        config.events,
        config.baseline,
        config.warmup,
        std::thread::available_parallelism().map_or(0, usize::from),
        started.elapsed().as_secs_f64(),
    );
    println!();
    report.print();
    Ok(())
}
