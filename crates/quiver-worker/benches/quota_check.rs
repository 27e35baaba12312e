//! Quota-check benchmark (issue #25): what a policy's `rate_limits` and
//! `max_concurrent_calls` add to a tool call while the worker holds budget.
//! Goal: ≤ 0.02 ms p50 added per call.
//!
//! Everything is real and in this process: the testkit's MCP server over
//! streamable HTTP and an in-process registry and worker
//! (`benches/support/stack.rs`) whose only callers are the registry's API
//! keys. Three policies allow the benchmark's server, each with one API key
//! (`benches/support/registry_admin.rs`): `unlimited` (no limit),
//! `metered` (one rate limit on the server's `echo`, [`LIMIT_CALLS`] calls
//! per [`LIMIT_PER_S`] s per principal: the worker leases shares of
//! `quota::lease_share` calls, 1000 here, and answers the calls from the
//! share it holds, asking the registry again once per share; the window
//! never runs out during the run) and `metered-capped` (the same rate
//! limit and `max_concurrent_calls` [`MAX_CONCURRENT`]). The benchmark
//! waits until the worker has applied the three keys (`GET /v1/whoami`
//! with each says `via: "key"` and its policy).
//!
//! 1. **End to end.** `POST /v1/mcp/tools/call` of `echo` over one
//!    keep-alive client, sequentially: `QUIVER_BENCH_CALLS` [6000] calls per
//!    route in `QUIVER_BENCH_ROUNDS` [12] rounds, the routes' order rotating
//!    each round, after `QUIVER_BENCH_WARMUP` [300] untimed calls per
//!    route. Every answer is checked. The routes differ only in the key
//!    (and so the policy). The added cost is a metered route's p50 minus the
//!    unlimited p50 of the same run; the ratio is metered / unlimited.
//!    Afterwards each metered counter's window at the registry must show
//!    the calls made (leased in whole shares): the route was metered.
//! 2. **`Quotas::admit` alone**, on a `Quotas` leasing from the same
//!    registry over gRPC as a worker's does: `QUIVER_BENCH_ADMIT` [200000]
//!    admissions per path, each timed on its own, in the same rotating
//!    rounds. Paths: no limit, the rate limit, the rate limit and the
//!    concurrency cap. One admission in `lease_share` asks the registry for
//!    the next share, which the mean includes.
//!
//! Run: `CARGO_TARGET_DIR=target/bench cargo bench -p quiver-worker --bench quota_check`.

use std::time::{Duration, Instant};

use quiver_model::rate_limit::{CompiledRateLimit, LimitScope, RateLimit, compile_rate_limits};
use quiver_model::{HttpConfig, McpServerSpec, Transport};
use quiver_store::Store;
use quiver_sync::{SyncOptions, SyncService};
use quiver_testkit::bench::{Samples, env_usize, ms};
use quiver_testkit::mcp_server::{ExampleServer, spawn_streamable_http};
use quiver_testkit::registry::WORKER_TOKEN;
use quiver_worker::auth::CallersConfig;
use quiver_worker::quota::{Quotas, lease_share};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

#[path = "support/registry_admin.rs"]
mod registry_admin;
#[path = "support/stack.rs"]
mod stack;
use registry_admin::{admin, create_key, poll_until};
use stack::{BenchResult, Stack};

const SERVER_ID: &str = "bench-quota";
/// The metered policies' limit: so large that the window never runs out.
const LIMIT_CALLS: u32 = 100_000_000;
/// The limit's window: longer than any run.
const LIMIT_PER_S: u32 = 3600;
/// `max_concurrent_calls` of the capped policy; the benchmark runs one call
/// at a time.
const MAX_CONCURRENT: u32 = 64;
/// The goal of the issue: added p50 per call, in milliseconds.
const GOAL_MS: f64 = 0.02;

/// Sizes, from the environment.
struct Config {
    calls: usize,
    rounds: usize,
    warmup: usize,
    admit: usize,
}

impl Config {
    fn from_env() -> Self {
        Config {
            calls: env_usize("QUIVER_BENCH_CALLS", 6000).max(1),
            rounds: env_usize("QUIVER_BENCH_ROUNDS", 12).max(1),
            warmup: env_usize("QUIVER_BENCH_WARMUP", 300),
            admit: env_usize("QUIVER_BENCH_ADMIT", 200_000).max(1),
        }
    }
}

/// The rate limit of both metered policies, on the benchmark's `echo`.
fn echo_limit() -> RateLimit {
    RateLimit {
        tools: format!("{SERVER_ID}.echo"),
        calls: LIMIT_CALLS,
        per_s: LIMIT_PER_S,
        per: LimitScope::Principal,
    }
}

/// What one route's policy limits.
#[derive(Clone, Copy)]
struct Limits {
    rate_limited: bool,
    max_concurrent: Option<u32>,
}

impl Limits {
    /// The registry policy allowing the benchmark's server with these
    /// limits.
    fn policy(self) -> BenchResult<Value> {
        let mut policy = json!({"allowed_server_ids": [SERVER_ID]});
        if self.rate_limited {
            policy["rate_limits"] = json!([serde_json::to_value(echo_limit())?]);
        }
        if let Some(max) = self.max_concurrent {
            policy["max_concurrent_calls"] = json!(max);
        }
        Ok(policy)
    }
}

/// The three paths, the baseline first.
const PATHS: [(&str, &str, Limits); 3] = [
    (
        "unlimited (baseline)",
        "unlimited",
        Limits {
            rate_limited: false,
            max_concurrent: None,
        },
    ),
    (
        "rate limit",
        "metered",
        Limits {
            rate_limited: true,
            max_concurrent: None,
        },
    ),
    (
        "rate limit + max_concurrent_calls",
        "metered-capped",
        Limits {
            rate_limited: true,
            max_concurrent: Some(MAX_CONCURRENT),
        },
    ),
];

/// One route: a policy, its API key, the calls made with it and the
/// samples of the timed ones.
struct Route {
    name: &'static str,
    policy: &'static str,
    limits: Limits,
    key: String,
    /// The key's principal, as the worker names it (`whoami`).
    principal: String,
    made: usize,
    samples: Vec<Duration>,
}

/// The worker's tool API.
struct Api {
    http: reqwest::Client,
    url: String,
    injected: String,
}

impl Api {
    /// `calls` sequential calls of `echo` with `route`'s key; each answer
    /// checked, each timed and kept when `keep`.
    async fn sequential(&self, route: &mut Route, calls: usize, keep: bool) -> BenchResult<()> {
        for _ in 0..calls {
            let text = format!("call {}", route.made);
            let started = Instant::now();
            let response = self
                .http
                .post(&self.url)
                .bearer_auth(&route.key)
                .json(&json!({"name": self.injected, "arguments": {"text": text}}))
                .send()
                .await?;
            let status = response.status();
            let answer: Value = response.json().await?;
            let elapsed = started.elapsed();
            if !status.is_success() || answer["content"][0]["text"] != text.as_str() {
                return Err(format!("{}: unexpected answer {status}: {answer}", route.name).into());
            }
            route.made += 1;
            if keep {
                route.samples.push(elapsed);
            }
        }
        Ok(())
    }
}

/// The order paths run in: `rounds` rounds of each of `paths` paths, the
/// order rotating each round, so no path always follows another.
fn rotating(paths: usize, rounds: usize) -> impl Iterator<Item = usize> {
    (0..rounds).flat_map(move |round| (0..paths).map(move |step| (round + step) % paths))
}

/// Checks that `route`'s counter at the registry counted its calls: the
/// worker leases whole shares, so the window has given out at least the
/// calls made and less than one share more. Takes what is left of the
/// window to learn what was given out, so it runs after the last call.
async fn check_metered(stack: &Stack, limit: &CompiledRateLimit, route: &Route) -> BenchResult<()> {
    let key = limit.key(route.policy, &route.principal);
    let rest = stack
        .registry
        .store
        .lease_calls(&key.0, LIMIT_CALLS, LIMIT_PER_S, LIMIT_CALLS)
        .await?;
    let leased = (LIMIT_CALLS - rest.granted) as usize;
    let share = lease_share(LIMIT_CALLS) as usize;
    if leased < route.made || leased >= route.made + share {
        return Err(format!(
            "{}: the registry leased {leased} calls of its window for {} calls made (shares of {share})",
            route.name, route.made
        )
        .into());
    }
    Ok(())
}

/// Part 2: `Quotas::admit` alone, leasing from `stack`'s registry; samples
/// per path, in [`PATHS`] order.
async fn admit_alone(
    stack: &Stack,
    limit: &CompiledRateLimit,
    config: &Config,
) -> BenchResult<Vec<Samples>> {
    let usage = SyncService::new(SyncOptions {
        registry_urls: vec![stack.registry.grpc.clone()],
        token: Some(WORKER_TOKEN.into()),
        worker_id: "bench-admit".into(),
        ..SyncOptions::default()
    })?
    .usage();
    let quotas = Quotas::new(Some(usage));
    let admit = |i: usize| {
        let (_, policy, path) = PATHS[i];
        let limits = if path.rate_limited {
            std::slice::from_ref(limit)
        } else {
            &[]
        };
        quotas.admit(
            policy,
            "key:bench-admit",
            limits,
            path.max_concurrent,
            (SERVER_ID, "echo"),
        )
    };
    let mut samples = vec![Vec::new(); PATHS.len()];
    let per_round = config.admit / config.rounds;
    // Warm: each counter's first share leased, each semaphore made.
    for i in 0..PATHS.len() {
        for _ in 0..config.warmup {
            admit(i).await.map_err(|refusal| refusal.message)?;
        }
    }
    for i in rotating(PATHS.len(), config.rounds) {
        for _ in 0..per_round {
            let started = Instant::now();
            let admission = admit(i).await;
            let elapsed = started.elapsed();
            admission.map_err(|refusal| refusal.message)?;
            samples[i].push(elapsed);
        }
    }
    Ok(samples.into_iter().map(Samples::new).collect())
}

/// `GET /v1/whoami` with `key`: its answer.
async fn whoami(http: &reqwest::Client, url: &str, key: &str) -> BenchResult<Value> {
    Ok(http.get(url).bearer_auth(key).send().await?.json().await?)
}

fn main() -> BenchResult<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

async fn run() -> BenchResult<()> {
    let config = Config::from_env();
    let started = Instant::now();
    let server = spawn_streamable_http(ExampleServer::full()).await?;
    let mut spec = McpServerSpec::new(SERVER_ID, Transport::StreamableHttp);
    spec.http = Some(HttpConfig {
        url: server.url().to_owned(),
        ..HttpConfig::default()
    });
    spec.allowed_tools = vec!["*".into()];
    let stack = Stack::start_with_callers(vec![spec], None, CallersConfig::default()).await?;
    let limit = compile_rate_limits(&[echo_limit()])?
        .pop()
        .ok_or("no rate limit compiled")?;

    // The policies and their keys, once the worker has applied them.
    let http = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let whoami_url = format!("{}/v1/whoami", stack.worker_url);
    let mut routes = Vec::new();
    for (name, policy, limits) in PATHS {
        admin(
            &http,
            &stack.registry,
            Method::PUT,
            &format!("/admin/api/policies/{policy}"),
            Some(limits.policy()?),
            StatusCode::CREATED,
        )
        .await?;
        let (_, key) = create_key(&http, &stack.registry, policy, policy).await?;
        poll_until(
            format_args!("the key of policy {policy} applied by the worker"),
            Instant::now(),
            || async {
                let answer = whoami(&http, &whoami_url, &key).await?;
                Ok(answer["via"] == "key" && answer["policy"] == policy)
            },
        )
        .await?;
        let principal = whoami(&http, &whoami_url, &key).await?["principal"]
            .as_str()
            .ok_or("whoami without a principal")?
            .to_owned();
        routes.push(Route {
            name,
            policy,
            limits,
            key,
            principal,
            made: 0,
            samples: Vec::new(),
        });
    }
    let api = Api {
        http,
        url: format!("{}/v1/mcp/tools/call", stack.worker_url),
        injected: quiver_model::naming::injected_name(SERVER_ID, "echo")?,
    };
    let set_up = started.elapsed();

    // 1. End to end.
    for route in &mut routes {
        api.sequential(route, config.warmup, false).await?;
    }
    let per_round = config.calls / config.rounds;
    for i in rotating(routes.len(), config.rounds) {
        api.sequential(&mut routes[i], per_round, true).await?;
    }
    for route in routes.iter().filter(|r| r.limits.rate_limited) {
        check_metered(&stack, &limit, route).await?;
    }

    // 2. `Quotas::admit` alone.
    let alone = admit_alone(&stack, &limit, &config).await?;
    stack.stop().await;
    drop(server);

    let end_to_end: Vec<(&str, Samples)> = routes
        .into_iter()
        .map(|route| (route.name, Samples::new(route.samples)))
        .collect();
    let baseline = ms(end_to_end[0].1.p50());
    println!(
        "quiver quota-check benchmark: `echo` through POST /v1/mcp/tools/call, one API key per policy, {} calls per route in {} rotating rounds after {} untimed; {} admissions per path alone; rate limit {LIMIT_CALLS} calls per {LIMIT_PER_S} s (shares of {}); {} cores; set up in {:.1} s, {:.1} s in all",
        per_round * config.rounds,
        config.rounds,
        config.warmup,
        config.admit / config.rounds * config.rounds,
        lease_share(LIMIT_CALLS),
        std::thread::available_parallelism().map_or(0, usize::from),
        set_up.as_secs_f64(),
        started.elapsed().as_secs_f64(),
    );
    println!();
    println!(
        "End to end (same worker, server and tool; only the key, and so the policy, differs):"
    );
    println!();
    println!("| route | p50 ms | p95 ms | p99 ms | added p50 ms | p50 / unlimited |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, samples) in &end_to_end {
        println!(
            "| {name} | {:.3} | {:.3} | {:.3} | {:+.3} | {:.3}× |",
            ms(samples.p50()),
            ms(samples.percentile(0.95)),
            ms(samples.p99()),
            ms(samples.p50()) - baseline,
            ms(samples.p50()) / baseline,
        );
    }
    println!();
    println!("`Quotas::admit` alone (each admission timed on its own):");
    println!();
    println!("| path | p50 µs | p95 µs | p99 µs | p99.9 µs | mean µs | max µs |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    for ((name, _, _), samples) in PATHS.iter().zip(&alone) {
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} |",
            us(samples.p50()),
            us(samples.percentile(0.95)),
            us(samples.p99()),
            us(samples.percentile(0.999)),
            us(samples.mean()),
            us(samples.max()),
        );
    }
    println!();
    for (name, samples) in &end_to_end[1..] {
        let added = ms(samples.p50()) - baseline;
        println!(
            "Goal ≤ {GOAL_MS:.3} ms p50 added — {name}: {added:+.3} ms ({}); ratio p50 {:.3}× (p99 {:.3}×)",
            if added <= GOAL_MS { "met" } else { "NOT met" },
            ms(samples.p50()) / baseline,
            ms(samples.p99()) / ms(end_to_end[0].1.p99()),
        );
    }
    Ok(())
}
