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

use quiver_testkit::bench::{Samples, env_usize, ms};
use std::collections::HashMap;
use std::time::{Duration, Instant};

use quiver_model::{McpServerSpec, StdioConfig, Transport};
use quiver_proto::v1 as pb;
use quiver_sync::{SyncOptions, SyncService};
use quiver_testkit::registry::{ADMIN_TOKEN, InProcessRegistry, WORKER_TOKEN};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

/// Records in the registry; upserts cycle through them.
const RECORDS: usize = 20;
/// Longest wait for one upsert to reach every sync before giving up.
const DEADLINE: Duration = Duration::from_secs(30);

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
    let (swaps_tx, mut swaps) = mpsc::unbounded_channel::<(usize, u64, Instant)>();
    let mut handles = Vec::with_capacity(syncs);
    for i in 0..syncs {
        let service = SyncService::new(SyncOptions {
            registry_urls: vec![url.to_owned()],
            token: Some(WORKER_TOKEN.into()),
            worker_id: format!("bench-worker-{i}"),
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
                if swaps_tx.send((i, revision, Instant::now())).is_err() {
                    return;
                }
            }
        });
        tokio::spawn(service.run(shutdown.clone()));
        handles.push(handle);
    }
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

#[tokio::main]
async fn main() -> BenchResult<()> {
    let syncs = env_usize("QUIVER_BENCH_SYNCS", 100).max(1);
    let upserts = env_usize("QUIVER_BENCH_UPSERTS", 200).max(1);
    let warmup = env_usize("QUIVER_BENCH_WARMUP", 10);

    let registry = InProcessRegistry::sqlite(|_| {}).await;
    let url = registry.grpc.clone();

    let mut admin = client(&url, ADMIN_TOKEN).await?;
    for n in 0..RECORDS {
        upsert(&mut admin, n).await?;
    }

    eprintln!("[baseline] upsert → raw watch event, {upserts} upserts");
    let base = baseline(&url, &mut admin, warmup, upserts, RECORDS).await?;
    eprintln!("[fanout] upsert → {syncs} snapshots swapped, {upserts} upserts");
    let next = RECORDS + warmup + upserts;
    let fan = fanout(&url, &mut admin, syncs, warmup, upserts, next).await?;
    registry.stop().await;

    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    println!(
        "quiver-sync fan-out: {syncs} syncs, {upserts} upserts (+{warmup} warm-up), SQLite, {cpus} CPUs"
    );
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
    let goal = Duration::from_millis(50);
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
