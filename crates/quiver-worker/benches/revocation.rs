//! Revocation benchmark (issue #22): how long a revoked API key keeps
//! working. Goal of the issue: revoked → refused by every worker within
//! 1 s p99.
//!
//! Everything is real and in this process: a registry (the testkit's
//! `InProcessRegistry`, on SQLite in a temporary directory, or on a fresh
//! PostgreSQL database when `QUIVER_TEST_DATABASE_URL` is set) and two
//! workers following its watch stream, each on its own loopback listener and
//! with no caller tokens of their own, so every key they take comes from the
//! registry. One policy, `bench`, is stored first.
//!
//! `QUIVER_BENCH_ROUNDS` [100] rounds, after `QUIVER_BENCH_WARMUP` [3]
//! untimed ones; each round takes one sample of each kind, in alternating
//! order:
//!
//! - **Revocation.** `POST /admin/api/keys` (policy `bench`), then wait until
//!   both workers answer `GET /v1/whoami` with that key 200 `via: "key"`;
//!   then `DELETE /admin/api/keys/{id}` and, from its 200, poll both workers
//!   concurrently (every 2 ms) until each answers 401. The sample is the
//!   later of the two.
//! - **Record propagation** (the baseline: the same watch stream, without
//!   the callers being rebuilt). `POST /admin/api/mcp/servers` of a disabled
//!   stdio record (nothing is spawned) that changes every round, then, from
//!   its 200, poll both workers' `GET /readyz` the same way until each
//!   reports a snapshot revision at least the record's. The sample is the
//!   later of the two.
//!
//! The machine is shared, so the result is a ratio: revocation p99 / record
//! propagation p99 of the same run. For information, both are also given
//! from the moment the admin request was sent. The process fails when the
//! revocation p99 is over the goal.
//!
//! Run: `cargo bench -p quiver-worker --bench revocation`.

use std::fmt;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::future::try_join_all;
use quiver_sync::SyncOptions;
use quiver_testkit::bench::{Samples, env_usize, ms};
use quiver_testkit::postgres::DATABASE_URL_ENV;
use quiver_testkit::registry::{InProcessRegistry, WORKER_TOKEN};
use quiver_worker::{Worker, WorkerOptions};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

#[path = "support/registry_admin.rs"]
mod registry_admin;
use registry_admin::{GIVE_UP, POLL, admin, create_key, create_policy, poll_until};

/// A benchmark's error.
type BenchResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The goal of the issue: revocation p99, in milliseconds.
const GOAL_MS: f64 = 1000.0;
/// How many workers follow the registry.
const WORKERS: usize = 2;
/// The policy of every key.
const POLICY: &str = "bench";
/// The record the baseline changes.
const RECORD: &str = "bench-record";

/// What a worker is waited for.
enum Probe<'a> {
    /// `GET /v1/whoami` with this key answers 200 `via: "key"`.
    Accepts(&'a str),
    /// `GET /v1/whoami` with this key answers 401.
    Refuses(&'a str),
    /// `GET /readyz` reports a snapshot revision at least this one.
    AtRevision(u64),
}

impl fmt::Display for Probe<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Probe::Accepts(_) => f.write_str("the new key accepted"),
            Probe::Refuses(_) => f.write_str("the revoked key refused"),
            Probe::AtRevision(revision) => write!(f, "snapshot revision {revision}"),
        }
    }
}

/// A change's propagation to every worker.
struct Sample {
    /// From the admin request's 200.
    from_ok: Duration,
    /// From the moment the admin request was sent.
    from_sent: Duration,
}

/// The registry, the workers, and one keep-alive client for both.
struct Bench {
    http: reqwest::Client,
    registry: InProcessRegistry,
    /// `http://<address>` of each worker.
    workers: Vec<String>,
    shutdown: CancellationToken,
    running: Vec<JoinHandle<()>>,
}

impl Bench {
    /// Starts the registry, stores the policy, and starts the workers;
    /// returns once each has its first snapshot.
    async fn start(registry: InProcessRegistry) -> BenchResult<Bench> {
        let shutdown = CancellationToken::new();
        let mut bench = Bench {
            http: reqwest::Client::new(),
            registry,
            workers: Vec::new(),
            shutdown: shutdown.clone(),
            running: Vec::new(),
        };
        create_policy(&bench.http, &bench.registry, POLICY, RECORD).await?;
        for at in 0..WORKERS {
            let worker = Worker::start(
                WorkerOptions {
                    http_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
                    sync: SyncOptions {
                        registry_urls: vec![bench.registry.grpc.clone()],
                        token: Some(WORKER_TOKEN.into()),
                        worker_id: format!("bench-revocation-{at}"),
                        ..SyncOptions::default()
                    },
                    shutdown_grace: Duration::from_secs(1),
                    ..WorkerOptions::default()
                },
                shutdown.clone(),
            )
            .await?;
            let snapshot = worker.snapshot();
            bench.workers.push(format!("http://{}", worker.http_addr()));
            bench.running.push(tokio::spawn(async move {
                if let Err(err) = worker.run().await {
                    eprintln!("worker stopped with an error: {err}");
                }
            }));
            tokio::time::timeout(GIVE_UP, snapshot.wait_ready())
                .await
                .map_err(|_| format!("worker {at} had no snapshot within {GIVE_UP:?}"))?;
        }
        Ok(bench)
    }

    /// Whether `worker` shows `probe` now.
    async fn check(&self, worker: &str, probe: &Probe<'_>) -> BenchResult<bool> {
        let (path, key) = match probe {
            Probe::Accepts(key) | Probe::Refuses(key) => ("/v1/whoami", Some(*key)),
            Probe::AtRevision(_) => ("/readyz", None),
        };
        let mut request = self.http.get(format!("{worker}{path}"));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await?;
        let status = response.status();
        let answer: Value = response.json().await?;
        match (probe, status) {
            (Probe::Accepts(_), StatusCode::OK) if answer["via"] == "key" => Ok(true),
            (Probe::Accepts(_), StatusCode::UNAUTHORIZED) | (Probe::Refuses(_), StatusCode::OK) => {
                Ok(false)
            }
            (Probe::Refuses(_), StatusCode::UNAUTHORIZED) => Ok(true),
            (Probe::AtRevision(revision), StatusCode::OK) => Ok(answer["revision"]
                .as_u64()
                .is_some_and(|seen| seen >= *revision)),
            _ => {
                Err(format!("{worker}{path} while waiting for {probe}: {status}: {answer}").into())
            }
        }
    }

    /// Polls `worker` every [`POLL`] until it shows `probe`: the time since
    /// `from`.
    async fn poll(&self, worker: &str, probe: &Probe<'_>, from: Instant) -> BenchResult<Duration> {
        poll_until(format!("{probe} on {worker}"), from, || {
            self.check(worker, probe)
        })
        .await
    }

    /// Polls every worker concurrently until each shows `probe`: the time
    /// since `from` until the last one did.
    async fn all_show(&self, probe: &Probe<'_>, from: Instant) -> BenchResult<Duration> {
        let each = try_join_all(
            self.workers
                .iter()
                .map(|worker| self.poll(worker, probe, from)),
        )
        .await?;
        Ok(each.into_iter().max().unwrap_or_default())
    }

    /// A fresh key, accepted by every worker, then revoked: until every
    /// worker refuses it.
    async fn revocation(&self, round: usize) -> BenchResult<Sample> {
        let (id, key) = create_key(
            &self.http,
            &self.registry,
            &format!("bench-{round}"),
            POLICY,
        )
        .await?;
        self.all_show(&Probe::Accepts(&key), Instant::now()).await?;
        let sent = Instant::now();
        admin(
            &self.http,
            &self.registry,
            Method::DELETE,
            &format!("/admin/api/keys/{id}"),
            None,
            StatusCode::OK,
        )
        .await?;
        let ok = Instant::now();
        let from_ok = self.all_show(&Probe::Refuses(&key), ok).await?;
        Ok(Sample {
            from_ok,
            from_sent: from_ok + (ok - sent),
        })
    }

    /// The baseline record changed: until every worker's snapshot has it.
    async fn record(&self, round: usize) -> BenchResult<Sample> {
        let record = json!({
            "server_id": RECORD,
            "transport": "stdio",
            "enabled": false,
            "stdio": {"command": "true", "args": [format!("round-{round}")]},
        });
        let sent = Instant::now();
        // 201 the first time, 200 after.
        let expected = if round == 0 {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        let stored = admin(
            &self.http,
            &self.registry,
            Method::POST,
            "/admin/api/mcp/servers",
            Some(record),
            expected,
        )
        .await?;
        let ok = Instant::now();
        let revision = stored["revision"]
            .as_u64()
            .ok_or_else(|| format!("POST /admin/api/mcp/servers: no revision in {stored}"))?;
        let from_ok = self.all_show(&Probe::AtRevision(revision), ok).await?;
        Ok(Sample {
            from_ok,
            from_sent: from_ok + (ok - sent),
        })
    }

    /// Stops the workers, then the registry.
    async fn stop(self) {
        self.shutdown.cancel();
        for running in self.running {
            let _ = running.await;
        }
        self.registry.stop().await;
    }
}

/// Samples of one kind, both ways of timing them.
#[derive(Default)]
struct Series {
    from_ok: Vec<Duration>,
    from_sent: Vec<Duration>,
}

impl Series {
    fn push(&mut self, sample: Sample) {
        self.from_ok.push(sample.from_ok);
        self.from_sent.push(sample.from_sent);
    }
}

fn main() -> BenchResult<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

async fn run() -> BenchResult<()> {
    let rounds = env_usize("QUIVER_BENCH_ROUNDS", 100).max(1);
    let warmup = env_usize("QUIVER_BENCH_WARMUP", 3);
    let started = Instant::now();
    let (registry, store) = if std::env::var_os(DATABASE_URL_ENV).is_some() {
        (InProcessRegistry::postgres(|_| {}).await, "PostgreSQL")
    } else {
        (InProcessRegistry::sqlite(|_| {}).await, "SQLite")
    };
    let bench = Bench::start(registry).await?;

    let (mut revocation, mut record) = (Series::default(), Series::default());
    for round in 0..warmup + rounds {
        // Alternating order, so neither kind always follows the other.
        let (revoked, recorded) = if round % 2 == 0 {
            let revoked = bench.revocation(round).await?;
            (revoked, bench.record(round).await?)
        } else {
            let recorded = bench.record(round).await?;
            (bench.revocation(round).await?, recorded)
        };
        if round >= warmup {
            revocation.push(revoked);
            record.push(recorded);
        }
    }
    bench.stop().await;

    let revoked = Samples::new(revocation.from_ok);
    let recorded = Samples::new(record.from_ok);
    let revoked_sent = Samples::new(revocation.from_sent);
    let recorded_sent = Samples::new(record.from_sent);
    println!(
        "quiver revocation benchmark: {rounds} interleaved rounds after {warmup} untimed, {WORKERS} workers, registry on {store}, each worker polled every {} ms; {} cores; {:.1} s in all",
        POLL.as_millis(),
        std::thread::available_parallelism().map_or(0, usize::from),
        started.elapsed().as_secs_f64(),
    );
    println!(
        "revocation p50 {:.1} ms p99 {:.1} ms max {:.1} ms; record propagation p50 {:.1} ms p99 {:.1} ms max {:.1} ms; ratio p99 revocation/record {:.2} (p50 {:.2})",
        ms(revoked.p50()),
        ms(revoked.p99()),
        ms(revoked.max()),
        ms(recorded.p50()),
        ms(recorded.p99()),
        ms(recorded.max()),
        ms(revoked.p99()) / ms(recorded.p99()),
        ms(revoked.p50()) / ms(recorded.p50()),
    );
    println!(
        "from the admin request sent (for information): revocation p50 {:.1} ms p99 {:.1} ms max {:.1} ms; record propagation p50 {:.1} ms p99 {:.1} ms max {:.1} ms",
        ms(revoked_sent.p50()),
        ms(revoked_sent.p99()),
        ms(revoked_sent.max()),
        ms(recorded_sent.p50()),
        ms(recorded_sent.p99()),
        ms(recorded_sent.max()),
    );
    let met = ms(revoked.p99()) <= GOAL_MS;
    println!(
        "Goal: revoked → refused by every worker within {GOAL_MS:.0} ms p99 — {}",
        if met { "met" } else { "NOT met" }
    );
    if !met {
        return Err(format!(
            "revocation p99 {:.1} ms is over the goal of {GOAL_MS:.0} ms",
            ms(revoked.p99())
        )
        .into());
    }
    Ok(())
}
