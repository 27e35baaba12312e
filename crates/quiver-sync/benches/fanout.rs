//! Sync fan-out benchmark: how long after an upsert every worker serves it.
//!
//! One real in-process registry (`quiver_testkit::registry::InProcessRegistry`:
//! SQLite in a temporary directory, served by `Registry::run` on
//! `127.0.0.1:0`) and `QUIVER_BENCH_SYNCS` independent
//! `SyncService`s in this process, each on its own gRPC channel, as that many
//! workers would be. Upserts go one at a time through the admin gRPC API; for
//! each, the clock runs from just before the upsert RPC until the *last* sync
//! has swapped in a snapshot at the new revision (each sync's subscriber
//! timestamps the swap when it wakes).
//!
//! Baselines, measured in the same run on the same machine (the ratio is the
//! number to compare across runs; absolute numbers move with machine load):
//! - upsert → one raw `WatchMcpServers` stream receives the event, with no
//!   sync running (the registry's own delivery latency);
//! - the same raw stream during the fan-out phase, for the same upserts (what
//!   delivery costs while the registry also serves the syncs' fetches).
//!
//! Run with `cargo bench -p quiver-sync --bench fanout`. Sizes (defaults in
//! brackets): `QUIVER_BENCH_SYNCS` [100], `QUIVER_BENCH_UPSERTS` [200] timed
//! upserts per phase, `QUIVER_BENCH_WARMUP` [10] untimed upserts first.
//!
//! `QUIVER_BENCH_PROCESSES` [0]: when set, the syncs run in that many child
//! processes instead (this benchmark executes itself again, each child
//! holding its share of the syncs and reporting each swap with a wall-clock
//! timestamp on its stdout), so the registry process serves them over
//! loopback as it would separate workers. `QUIVER_BENCH_STREAMS` [0] more
//! bare `WatchMcpServers` streams are opened by the children (100 per
//! channel) to measure the registry's memory with that many open watches:
//! the parent, which holds only the registry, reports its resident set size
//! before and after.
//!
//! `QUIVER_BENCH_REPLICAS` [0]: when set (needs `QUIVER_BENCH_PROCESSES`),
//! that many registry replicas serve instead, each in its own process, all
//! on one fresh PostgreSQL database of the test server
//! (`QUIVER_TEST_DATABASE_URL`; SQLite cannot be shared: a replica learns of
//! another's commits only through PostgreSQL's notifications). Sync `i`
//! follows replica `i mod N` and fails over to the others. The RSS reported
//! is the replicas' together. `QUIVER_BENCH_KILL` [0]: with 2 or more
//! replicas, after the timed upserts the last replica is killed (SIGKILL)
//! and one more upsert is made through the first: the time until every sync
//! serves it, and the database's transactions (`pg_stat_database`, read with
//! `psql`) in a window after the kill against an idle window before it.

use quiver_testkit::bench::{Samples, env_usize, ms};
use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use quiver_model::{McpServerSpec, StdioConfig, Transport};
use quiver_proto::v1 as pb;
use quiver_store::SqlStore;
use quiver_sync::{SnapshotHandle, SyncOptions, SyncService};
use quiver_testkit::postgres::TestDatabase;
use quiver_testkit::registry::{ADMIN_TOKEN, InProcessRegistry, WORKER_TOKEN, test_options};
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

/// Records in the registry; upserts cycle through them.
const RECORDS: usize = 20;
/// Longest wait for one upsert to reach every sync before giving up.
const DEADLINE: Duration = Duration::from_secs(30);
/// Issue #28: after a replica is killed, every worker serves the head
/// within this long.
const FAILOVER_GOAL: Duration = Duration::from_secs(10);
/// Issue #28: the registry's memory with 10,000 watching workers.
const RSS_GOAL_MIB: f64 = 400.0;
/// How long PostgreSQL may hold a backend's statistics before publishing
/// them (`PGSTAT_IDLE_INTERVAL`, 10 s), plus a margin: the fan-out's own
/// transactions are published before the first count.
const PG_STATS_SETTLE: Duration = Duration::from_secs(11);
/// The database windows compared around a replica's kill (longer than the
/// statistics' lag).
const DB_WINDOW: Duration = Duration::from_secs(20);

type BenchResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

type Client = quiver_proto::credentials::RegistryClient;

async fn client(url: &str, token: &str) -> BenchResult<Client> {
    let channel = Channel::from_shared(url.to_owned())?.connect().await?;
    Ok(quiver_proto::credentials::Credentials::new(Some(token), None)?.client(channel))
}

fn spec(n: usize, version: usize) -> McpServerSpec {
    let mut spec = McpServerSpec::new(format!("server-{}", n % RECORDS), Transport::Stdio);
    spec.stdio = Some(StdioConfig {
        command: format!("mcp-server-v{version}"),
        ..Default::default()
    });
    spec.allowed_tools = vec!["*".into()];
    spec
}

async fn upsert(admin: &mut Client, n: usize) -> BenchResult<u64> {
    let response = admin
        .upsert_mcp_server(pb::UpsertMcpServerRequest {
            server: Some((&spec(n, n)).into()),
            expected_revision: None,
        })
        .await?
        .into_inner();
    Ok(response.server.ok_or("upsert returned no record")?.revision)
}

/// A raw watch stream from head whose events are timestamped on receipt.
async fn raw_watch(
    url: &str,
    shutdown: CancellationToken,
) -> BenchResult<mpsc::UnboundedReceiver<(u64, Instant)>> {
    let mut client = client(url, WORKER_TOKEN).await?;
    let head = client
        .list_mcp_servers(pb::ListMcpServersRequest {})
        .await?
        .into_inner()
        .revision;
    let mut stream = client
        .watch_mcp_servers(pb::WatchMcpServersRequest {
            since_revision: head,
        })
        .await?
        .into_inner();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let message = tokio::select! {
                () = shutdown.cancelled() => return,
                message = stream.message() => message,
            };
            match message {
                Ok(Some(event)) if !event.heartbeat => {
                    if tx.send((event.revision, Instant::now())).is_err() {
                        return;
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return,
            }
        }
    });
    Ok(rx)
}

/// When `events` first reports `revision`.
async fn raw_arrival(
    events: &mut mpsc::UnboundedReceiver<(u64, Instant)>,
    revision: u64,
) -> BenchResult<Instant> {
    loop {
        let (got, at) = tokio::time::timeout(DEADLINE, events.recv())
            .await?
            .ok_or("raw watch stream ended")?;
        if got >= revision {
            return Ok(at);
        }
    }
}

/// Upsert → raw watch event, with nothing else subscribed.
async fn baseline(
    url: &str,
    admin: &mut Client,
    warmup: usize,
    upserts: usize,
    first: usize,
) -> BenchResult<Samples> {
    let shutdown = CancellationToken::new();
    let mut events = raw_watch(url, shutdown.clone()).await?;
    let mut samples = Vec::with_capacity(upserts);
    for n in first..first + warmup + upserts {
        let start = Instant::now();
        let revision = upsert(admin, n).await?;
        let at = raw_arrival(&mut events, revision).await?;
        if n >= first + warmup {
            samples.push(at - start);
        }
    }
    shutdown.cancel();
    Ok(Samples::new(samples))
}

/// Snapshot swaps as `(sync, revision, when)`.
type Swaps<T> = mpsc::UnboundedReceiver<(usize, u64, T)>;

/// Starts `syncs` sync services of the registry replicas at `urls` (worker
/// ids `<prefix>-<i>`; sync `i` follows replica `i mod N` first), each
/// reporting `(i, revision, now())` whenever it swaps its snapshot, until
/// `shutdown`.
fn start_syncs<T: Send + 'static>(
    urls: &[String],
    syncs: usize,
    prefix: &str,
    shutdown: &CancellationToken,
    now: fn() -> T,
) -> BenchResult<(Vec<SnapshotHandle>, Swaps<T>)> {
    let (swaps_tx, swaps) = mpsc::unbounded_channel();
    let mut handles = Vec::with_capacity(syncs);
    for i in 0..syncs {
        let mut registry_urls = urls.to_vec();
        registry_urls.rotate_left(i % urls.len());
        let service = SyncService::new(SyncOptions {
            registry_urls,
            token: Some(WORKER_TOKEN.into()),
            worker_id: format!("{prefix}-{i}"),
            ..Default::default()
        })?;
        let handle = service.handle();
        let mut updates = handle.subscribe();
        let swaps_tx = swaps_tx.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    changed = updates.changed() => if changed.is_err() { return },
                }
                let revision = updates.borrow_and_update().snapshot.revision;
                if swaps_tx.send((i, revision, now())).is_err() {
                    return;
                }
            }
        });
        tokio::spawn(service.run(shutdown.clone()));
        handles.push(handle);
    }
    Ok((handles, swaps))
}

struct Fanout {
    /// Upsert → the last sync swapped.
    last: Samples,
    /// Upsert → the first sync swapped.
    first: Samples,
    /// Upsert → the raw stream got the event, same upserts.
    raw: Samples,
}

async fn fanout(
    url: &str,
    admin: &mut Client,
    syncs: usize,
    warmup: usize,
    upserts: usize,
    first: usize,
) -> BenchResult<Fanout> {
    let shutdown = CancellationToken::new();
    let (handles, mut swaps) = start_syncs(
        &[url.to_owned()],
        syncs,
        "bench-worker",
        &shutdown,
        Instant::now,
    )?;
    let ready = Instant::now();
    for handle in &handles {
        tokio::time::timeout(DEADLINE, handle.wait_ready()).await?;
    }
    eprintln!(
        "[fanout] {syncs} syncs ready in {:.0} ms",
        ms(ready.elapsed())
    );
    let mut raw_events = raw_watch(url, shutdown.clone()).await?;

    let (mut last, mut firsts, mut raw) = (Vec::new(), Vec::new(), Vec::new());
    for n in first..first + warmup + upserts {
        let start = Instant::now();
        let revision = upsert(admin, n).await?;
        let mut reached: HashMap<usize, Instant> = HashMap::with_capacity(syncs);
        while reached.len() < syncs {
            let (i, got, at) = tokio::time::timeout(DEADLINE, swaps.recv())
                .await
                .map_err(|_| format!("revision {revision} reached {} syncs", reached.len()))?
                .ok_or("sync observers stopped")?;
            if got >= revision {
                reached.entry(i).or_insert(at);
            }
        }
        let raw_at = raw_arrival(&mut raw_events, revision).await?;
        if n >= first + warmup {
            let times = reached.values();
            last.push(*times.clone().max().ok_or("no syncs")? - start);
            firsts.push(*times.min().ok_or("no syncs")? - start);
            raw.push(raw_at - start);
        }
    }
    let degraded = handles.iter().filter(|h| h.is_degraded()).count();
    if degraded > 0 {
        eprintln!("[fanout] warning: {degraded} syncs ended degraded");
    }
    shutdown.cancel();
    Ok(Fanout {
        last: Samples::new(last),
        first: Samples::new(firsts),
        raw: Samples::new(raw),
    })
}

/// Resident set size of process `pid` (`self` for this one), from
/// `/proc/<pid>/status` (Linux).
fn rss_mib(pid: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn unix_nanos(at: SystemTime) -> u128 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

/// Resolves when this process's stdin closes (how a parent stops a child).
fn stdin_closed() -> tokio::task::JoinHandle<()> {
    tokio::task::spawn_blocking(|| {
        let mut sink = String::new();
        while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
    })
}

/// A child process: `QUIVER_BENCH_CHILD_SYNCS` syncs of the registry
/// replicas at `urls` (comma-separated) and `QUIVER_BENCH_CHILD_STREAMS`
/// bare watch streams of the first; prints `ready` once every sync is, then
/// `<sync> <revision> <unix nanos>` per swap, until its stdin closes.
async fn child(urls: String) -> BenchResult<()> {
    let urls: Vec<String> = urls.split(',').map(str::to_owned).collect();
    let syncs = env_usize("QUIVER_BENCH_CHILD_SYNCS", 0);
    let streams = env_usize("QUIVER_BENCH_CHILD_STREAMS", 0);
    let shutdown = CancellationToken::new();
    let worker_prefix = format!("bench-worker-{}", std::process::id());
    let (handles, mut swaps) =
        start_syncs(&urls, syncs, &worker_prefix, &shutdown, SystemTime::now)?;
    let mut held = Vec::new();
    for chunk in 0..streams.div_ceil(100) {
        let client = client(&urls[0], WORKER_TOKEN).await?;
        for _ in 0..(streams - chunk * 100).min(100) {
            let mut client = client.clone();
            let mut stream = client
                .watch_mcp_servers(pb::WatchMcpServersRequest { since_revision: 0 })
                .await?
                .into_inner();
            held.push(tokio::spawn(async move {
                while let Ok(Some(_)) = stream.message().await {}
            }));
        }
    }
    for handle in &handles {
        tokio::time::timeout(DEADLINE, handle.wait_ready()).await?;
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    writeln!(out, "ready")?;
    out.flush()?;
    let mut stdin_closed = stdin_closed();
    loop {
        tokio::select! {
            _ = &mut stdin_closed => break,
            swap = swaps.recv() => {
                let Some((i, revision, at)) = swap else { break };
                writeln!(out, "{i} {revision} {}", unix_nanos(at))?;
                while let Ok((i, revision, at)) = swaps.try_recv() {
                    writeln!(out, "{i} {revision} {}", unix_nanos(at))?;
                }
                out.flush()?;
            }
        }
    }
    shutdown.cancel();
    Ok(())
}

/// A replica process: a registry on the PostgreSQL database at `db_url`;
/// prints its gRPC URL, then serves until its stdin closes (or it is
/// killed).
async fn replica(db_url: String) -> BenchResult<()> {
    let store = SqlStore::open_postgres(&db_url).await?;
    let registry = InProcessRegistry::start(Arc::new(store), test_options()).await;
    println!("{}", registry.grpc);
    std::io::stdout().flush()?;
    let _ = stdin_closed().await;
    registry.stop().await;
    Ok(())
}

/// The registry replicas the syncs follow.
enum Registries {
    /// One replica in this process, on SQLite.
    InProcess(InProcessRegistry),
    /// Replica processes on one PostgreSQL database.
    Processes {
        replicas: Vec<Child>,
        db: TestDatabase,
    },
}

impl Registries {
    async fn start(replicas: usize) -> BenchResult<(Registries, Vec<String>)> {
        if replicas == 0 {
            let registry = InProcessRegistry::sqlite(|_| {}).await;
            let url = registry.grpc.clone();
            return Ok((Registries::InProcess(registry), vec![url]));
        }
        let db = TestDatabase::create().await;
        // Migrate once, before replicas race to.
        drop(SqlStore::open_postgres(db.url()).await?);
        let exe = std::env::current_exe()?;
        let (mut children, mut urls) = (Vec::new(), Vec::new());
        for _ in 0..replicas {
            let mut child = Command::new(&exe)
                .env("QUIVER_BENCH_REPLICA_DB", db.url())
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()?;
            let stdout = child.stdout.take().ok_or("replica stdout")?;
            let url = tokio::time::timeout(
                DEADLINE,
                tokio::io::BufReader::new(stdout).lines().next_line(),
            )
            .await??
            .ok_or("a replica stopped before serving")?;
            urls.push(url);
            children.push(child);
        }
        Ok((
            Registries::Processes {
                replicas: children,
                db,
            },
            urls,
        ))
    }

    /// The replicas' resident set size together, in MiB.
    fn rss_mib(&self) -> f64 {
        match self {
            Registries::InProcess(_) => rss_mib("self"),
            Registries::Processes { replicas, .. } => replicas
                .iter()
                .filter_map(Child::id)
                .map(|pid| rss_mib(&pid.to_string()))
                .sum(),
        }
    }

    /// Transactions of the shared database so far (PostgreSQL's statistics,
    /// which lag by up to [`PG_STATS_SETTLE`]).
    fn db_transactions(&self) -> BenchResult<u64> {
        let Registries::Processes { db, .. } = self else {
            return Err("database statistics need PostgreSQL replicas".into());
        };
        let output = std::process::Command::new("psql")
            .args([
                db.url(),
                "-Atc",
                "select xact_commit + xact_rollback from pg_stat_database where datname = current_database()",
            ])
            .output()?;
        Ok(String::from_utf8(output.stdout)?.trim().parse()?)
    }

    /// Kills the last replica (SIGKILL: no goodbye to its clients).
    async fn kill_last(&mut self) -> BenchResult<()> {
        let Registries::Processes { replicas, .. } = self else {
            return Err("killing a replica needs replica processes".into());
        };
        let mut last = replicas.pop().ok_or("no replica")?;
        last.kill().await?;
        Ok(())
    }

    async fn stop(self) {
        match self {
            Registries::InProcess(registry) => registry.stop().await,
            Registries::Processes { replicas, db } => {
                for mut replica in replicas {
                    drop(replica.stdin.take());
                    let _ = tokio::time::timeout(Duration::from_secs(10), replica.wait()).await;
                }
                drop(db);
            }
        }
    }
}

/// Syncs in child processes, and their swaps as `(key, revision, unix nanos)`.
struct Fleet {
    children: Vec<Child>,
    swaps: Swaps<u128>,
    syncs: usize,
}

impl Fleet {
    async fn start(
        urls: &[String],
        syncs: usize,
        streams: usize,
        processes: usize,
    ) -> BenchResult<Fleet> {
        let exe = std::env::current_exe()?;
        let (swaps_tx, swaps) = mpsc::unbounded_channel::<(usize, u64, u128)>();
        let (ready_tx, mut ready) = mpsc::unbounded_channel::<usize>();
        let mut children = Vec::with_capacity(processes);
        let started = Instant::now();
        for p in 0..processes {
            let share = |total: usize| total / processes + usize::from(p < total % processes);
            // Each child's syncs are spread over the replicas from its own
            // offset, so every replica gets its share of every child.
            let mut child_urls = urls.to_vec();
            child_urls.rotate_left(p % urls.len());
            let mut child = Command::new(&exe)
                .env("QUIVER_BENCH_CHILD_URL", child_urls.join(","))
                .env("QUIVER_BENCH_CHILD_SYNCS", share(syncs).to_string())
                .env("QUIVER_BENCH_CHILD_STREAMS", share(streams).to_string())
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()?;
            let stdout = child.stdout.take().ok_or("child stdout")?;
            let (swaps_tx, ready_tx) = (swaps_tx.clone(), ready_tx.clone());
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if line == "ready" {
                        let _ = ready_tx.send(p);
                        continue;
                    }
                    let mut fields = line.split(' ').map(str::parse::<u128>);
                    if let (Some(Ok(i)), Some(Ok(revision)), Some(Ok(at))) =
                        (fields.next(), fields.next(), fields.next())
                    {
                        let key = p * 1_000_000 + i as usize;
                        if swaps_tx.send((key, revision as u64, at)).is_err() {
                            return;
                        }
                    }
                }
            });
            children.push(child);
        }
        for _ in 0..processes {
            tokio::time::timeout(DEADLINE * 4, ready.recv())
                .await?
                .ok_or("a child stopped")?;
        }
        eprintln!(
            "[fanout] {syncs} syncs and {streams} streams in {processes} processes ready in {:.0} ms",
            ms(started.elapsed())
        );
        Ok(Fleet {
            children,
            swaps,
            syncs,
        })
    }

    /// When each sync first served `revision` (unix nanos), waiting at most
    /// `deadline` for the next swap.
    async fn reach(
        &mut self,
        revision: u64,
        deadline: Duration,
    ) -> BenchResult<HashMap<usize, u128>> {
        let mut reached: HashMap<usize, u128> = HashMap::with_capacity(self.syncs);
        while reached.len() < self.syncs {
            let (key, got, at) = tokio::time::timeout(deadline, self.swaps.recv())
                .await
                .map_err(|_| format!("revision {revision} reached {} syncs", reached.len()))?
                .ok_or("children stopped")?;
            if got >= revision {
                reached.entry(key).or_insert(at);
            }
        }
        Ok(reached)
    }

    async fn stop(self) {
        for mut child in self.children {
            drop(child.stdin.take());
            let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
        }
    }
}

/// The timed upserts with the syncs of `fleet`.
async fn fanout_processes(
    url: &str,
    admin: &mut Client,
    fleet: &mut Fleet,
    warmup: usize,
    upserts: usize,
    first: usize,
) -> BenchResult<Fanout> {
    let shutdown = CancellationToken::new();
    let mut raw_events = raw_watch(url, shutdown.clone()).await?;
    let (mut last, mut firsts, mut raw) = (Vec::new(), Vec::new(), Vec::new());
    for n in first..first + warmup + upserts {
        let start = Instant::now();
        let start_wall = unix_nanos(SystemTime::now());
        let revision = upsert(admin, n).await?;
        let reached = fleet.reach(revision, DEADLINE).await?;
        let raw_at = raw_arrival(&mut raw_events, revision).await?;
        if n >= first + warmup {
            let since = |at: u128| Duration::from_nanos(at.saturating_sub(start_wall) as u64);
            last.push(since(*reached.values().max().ok_or("no syncs")?));
            firsts.push(since(*reached.values().min().ok_or("no syncs")?));
            raw.push(raw_at - start);
        }
    }
    shutdown.cancel();
    Ok(Fanout {
        last: Samples::new(last),
        first: Samples::new(firsts),
        raw: Samples::new(raw),
    })
}

/// What a replica's death cost.
struct Failover {
    /// Kill → the last sync served the upsert made right after it.
    all_at_head: Duration,
    /// Database transactions in a window before the kill (both replicas
    /// idle) and in one as long after it.
    idle_transactions: u64,
    failover_transactions: u64,
}

/// Kills the last replica under the fleet, upserts through the first, and
/// counts what it took for every sync to serve the change.
async fn kill_replica(
    registries: &mut Registries,
    admin: &mut Client,
    fleet: &mut Fleet,
    n: usize,
) -> BenchResult<Failover> {
    tokio::time::sleep(PG_STATS_SETTLE).await;
    let before_idle = registries.db_transactions()?;
    tokio::time::sleep(DB_WINDOW).await;
    let before_kill = registries.db_transactions()?;
    let killed = Instant::now();
    let killed_wall = unix_nanos(SystemTime::now());
    registries.kill_last().await?;
    let revision = upsert(admin, n).await?;
    let reached = fleet.reach(revision, DEADLINE).await?;
    let last = *reached.values().max().ok_or("no syncs")?;
    let all_at_head = Duration::from_nanos(last.saturating_sub(killed_wall) as u64);
    // Both windows are read with the same lag: the burst right after the
    // kill is in the second once it is longer than the lag.
    tokio::time::sleep(DB_WINDOW.saturating_sub(killed.elapsed())).await;
    let after = registries.db_transactions()?;
    Ok(Failover {
        all_at_head,
        idle_transactions: before_kill - before_idle,
        failover_transactions: after - before_kill,
    })
}

#[tokio::main]
async fn main() -> BenchResult<()> {
    if let Ok(urls) = std::env::var("QUIVER_BENCH_CHILD_URL") {
        return child(urls).await;
    }
    if let Ok(db_url) = std::env::var("QUIVER_BENCH_REPLICA_DB") {
        return replica(db_url).await;
    }
    let syncs = env_usize("QUIVER_BENCH_SYNCS", 100).max(1);
    let processes = env_usize("QUIVER_BENCH_PROCESSES", 0);
    let streams = env_usize("QUIVER_BENCH_STREAMS", 0);
    let upserts = env_usize("QUIVER_BENCH_UPSERTS", 200).max(1);
    let warmup = env_usize("QUIVER_BENCH_WARMUP", 10);
    let replicas = env_usize("QUIVER_BENCH_REPLICAS", 0);
    let kill = env_usize("QUIVER_BENCH_KILL", 0) > 0;
    if replicas > 0 && processes == 0 {
        return Err("QUIVER_BENCH_REPLICAS needs QUIVER_BENCH_PROCESSES".into());
    }
    if kill && replicas < 2 {
        return Err("QUIVER_BENCH_KILL needs QUIVER_BENCH_REPLICAS of 2 or more".into());
    }

    let (mut registries, urls) = Registries::start(replicas).await?;
    let url = urls[0].clone();

    let mut admin = client(&url, ADMIN_TOKEN).await?;
    for n in 0..RECORDS {
        upsert(&mut admin, n).await?;
    }

    eprintln!("[baseline] upsert → raw watch event, {upserts} upserts");
    let base = baseline(&url, &mut admin, warmup, upserts, RECORDS).await?;
    eprintln!("[fanout] upsert → {syncs} snapshots swapped, {upserts} upserts");
    let next = RECORDS + warmup + upserts;
    let mut rss = None;
    let mut failover = None;
    let fan = if processes > 0 {
        let rss_before = registries.rss_mib();
        let mut fleet = Fleet::start(&urls, syncs, streams, processes).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        rss = Some((rss_before, registries.rss_mib()));
        let fan = fanout_processes(&url, &mut admin, &mut fleet, warmup, upserts, next).await?;
        if kill {
            eprintln!("[failover] killing replica {}", urls.len() - 1);
            failover = Some(
                kill_replica(
                    &mut registries,
                    &mut admin,
                    &mut fleet,
                    next + warmup + upserts,
                )
                .await?,
            );
        }
        fleet.stop().await;
        fan
    } else {
        fanout(&url, &mut admin, syncs, warmup, upserts, next).await?
    };
    registries.stop().await;

    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    let placement = if processes > 0 {
        format!("in {processes} child processes")
    } else {
        "in this process".to_owned()
    };
    let serving = if replicas > 0 {
        format!("{replicas} replica process(es) on PostgreSQL")
    } else {
        "one in-process registry on SQLite".to_owned()
    };
    println!(
        "quiver-sync fan-out: {syncs} syncs {placement}, {upserts} upserts (+{warmup} warm-up), {serving}, {cpus} CPUs"
    );
    if let Some((before, after)) = rss {
        let watches = syncs + streams;
        println!(
            "registry RSS: {before:.1} MiB before the children, {after:.1} MiB with {syncs} syncs + {streams} bare streams open ({watches} watch streams, {:.1} KiB each)",
            (after - before) * 1024.0 / watches as f64
        );
        if watches >= 10_000 {
            println!(
                "goal registry RSS ≤ {RSS_GOAL_MIB:.0} MiB with {watches} watch streams: {}",
                if after <= RSS_GOAL_MIB {
                    "met"
                } else {
                    "NOT met"
                }
            );
        }
    }
    println!();
    println!("| metric | p50 ms | p99 ms | max ms | p50 ratio | p99 ratio |");
    println!("|---|---:|---:|---:|---:|---:|");
    let row = |name: &str, s: &Samples, base: Option<&Samples>| {
        let ratio = |a: Duration, b: Duration| format!("{:.2}×", ms(a) / ms(b).max(1e-6));
        let (r50, r99) = base.map_or_else(
            || ("—".to_owned(), "—".to_owned()),
            |b| (ratio(s.p50(), b.p50()), ratio(s.p99(), b.p99())),
        );
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {r50} | {r99} |",
            ms(s.p50()),
            ms(s.p99()),
            ms(s.max())
        );
    };
    row("baseline: upsert → raw watch event (no syncs)", &base, None);
    row(
        "baseline: upsert → raw watch event (during fan-out)",
        &fan.raw,
        None,
    );
    row(
        &format!("upsert → first of {syncs} syncs swapped"),
        &fan.first,
        Some(&base),
    );
    row(
        &format!("upsert → last of {syncs} syncs swapped (vs no-sync baseline)"),
        &fan.last,
        Some(&base),
    );
    row(
        &format!("upsert → last of {syncs} syncs swapped (vs in-run raw stream)"),
        &fan.last,
        Some(&fan.raw),
    );
    println!();
    if let Some(failover) = failover {
        println!(
            "replica killed under {syncs} syncs: every sync served the next upsert {:.0} ms after the kill; goal ≤ {} s: {}",
            ms(failover.all_at_head),
            FAILOVER_GOAL.as_secs(),
            if failover.all_at_head <= FAILOVER_GOAL {
                "met"
            } else {
                "NOT met"
            }
        );
        println!(
            "database transactions in {} s: {} idle before the kill (both replicas), {} from the kill (the survivor: its workers' moves, 1 upsert, idle)",
            DB_WINDOW.as_secs(),
            failover.idle_transactions,
            failover.failover_transactions,
        );
        println!();
    }
    // Issue #3: 100 syncs within 50 ms; issue #16: 1 000 within 100 ms;
    // issue #28: 10 000 within 1 s.
    let goal = Duration::from_millis(match syncs {
        0..1000 => 50,
        1000..10_000 => 100,
        _ => 1000,
    });
    println!(
        "goal p99 ≤ {} ms for the last of {syncs}: {}",
        goal.as_millis(),
        if fan.last.p99() <= goal {
            "met"
        } else {
            "NOT met"
        }
    );
    Ok(())
}
