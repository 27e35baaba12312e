//! Per-user OAuth grant benchmark (issue #24): what a warm call through a
//! principal's own grant adds over a call through the fleet's one grant.
//! Goal: ≤ 0.05 ms p50 added per call.
//!
//! Everything is real and in this process: the testkit's authorization
//! server and the MCP server it protects (`OAuthServer`, approving every
//! authorization at once), an in-process registry with OAuth keys and a
//! worker (`benches/support/stack.rs`) whose only callers are the
//! registry's API keys. Two records name the same MCP server: `bench-fleet`,
//! whose `auth_ref` is a fleet connection (one grant for everyone, connected
//! by an admin beforehand), and `bench-per-user`, whose `auth_ref` is a
//! per-user connection (one grant per principal). One API key, of a policy
//! allowing both, is the principal; its first call of `bench-per-user` is
//! refused with 403 `mcp_authorization_required`, and the benchmark follows
//! the link it carries as a browser would, so the key has its own grant
//! before anything is timed.
//!
//! `POST /v1/mcp/tools/call` of `echo` with the key, over one keep-alive
//! client, sequentially: `QUIVER_BENCH_CALLS` [3000] calls per route in
//! `QUIVER_BENCH_ROUNDS` [6] rounds of alternating order after
//! `QUIVER_BENCH_WARMUP` [200] untimed calls per route. Every answer is
//! checked. Routes: the fleet record (the baseline) and the per-user record;
//! only the tool name differs. The added cost is the per-user p50 minus the
//! fleet p50 of the same run; the ratio is per-user / fleet.
//!
//! Run: `CARGO_TARGET_DIR=target/bench cargo bench -p quiver-worker --bench oauth_grants`.

use std::time::{Duration, Instant};

use axum::serve::ListenerExt;
use quiver_model::{HttpConfig, McpServerSpec, Source, Transport};
use quiver_registry::oauth::seal::Keyring;
use quiver_store::{Store, UpsertRequest};
use quiver_testkit::bench::{Samples, env_usize, ms};
use quiver_testkit::oauth_server::{OAuthServer, OAuthServerOptions};
use quiver_testkit::registry::{ADMIN_TOKEN, InProcessRegistry};
use quiver_worker::auth::CallersConfig;
use reqwest::{Method, StatusCode, header};
use serde_json::{Value, json};

#[path = "support/registry_admin.rs"]
mod registry_admin;
#[path = "support/stack.rs"]
mod stack;
use registry_admin::{admin, create_key, poll_until};
use stack::{BenchResult, Stack};

/// The record whose connection keeps one grant for everyone.
const FLEET_ID: &str = "bench-fleet";
/// The record whose connection keeps one grant per principal.
const PER_USER_ID: &str = "bench-per-user";
const FLEET_CONNECTION: &str = "fleet";
const PER_USER_CONNECTION: &str = "per-user";
/// The registry policy of the API key.
const KEY_POLICY: &str = "bench-oauth";
/// The goal of the issue: added p50 per call, in milliseconds.
const GOAL_MS: f64 = 0.05;

/// Sizes, from the environment.
struct Config {
    calls: usize,
    rounds: usize,
    warmup: usize,
}

impl Config {
    fn from_env() -> Self {
        Config {
            calls: env_usize("QUIVER_BENCH_CALLS", 3000).max(1),
            rounds: env_usize("QUIVER_BENCH_ROUNDS", 6).max(1),
            warmup: env_usize("QUIVER_BENCH_WARMUP", 200),
        }
    }
}

/// The testkit's authorization server and the MCP server it protects,
/// served on loopback until the process ends: the MCP server's URL. Its
/// sockets have `TCP_NODELAY`, as the worker's do: with Nagle on, every
/// call waits out the peer's delayed ACK (about 40 ms), which would hide
/// what is measured.
async fn oauth_server() -> BenchResult<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let server = OAuthServer::new(
        &format!("http://{}", listener.local_addr()?),
        OAuthServerOptions::default(),
    );
    let mcp = server.resource_url().to_owned();
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, server.router()).await {
            eprintln!("the OAuth test server stopped: {err}");
        }
    });
    Ok(mcp)
}

/// A record of the MCP server at `url` whose OAuth connection is
/// `connection`.
fn record(server_id: &str, url: &str, connection: &str) -> McpServerSpec {
    let mut spec = McpServerSpec::new(server_id, Transport::StreamableHttp);
    spec.http = Some(HttpConfig {
        url: url.to_owned(),
        auth_ref: Some(connection.to_owned()),
        ..HttpConfig::default()
    });
    spec.allowed_tools = vec!["*".into()];
    spec
}

/// The authorization-code flow as a browser runs it, which must not follow
/// redirects itself: each hop is checked.
struct Browser {
    http: reqwest::Client,
}

impl Browser {
    fn new() -> BenchResult<Browser> {
        Ok(Browser {
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()?,
        })
    }

    /// `response`'s header `name`, which it must carry.
    fn header(response: &reqwest::Response, name: header::HeaderName) -> BenchResult<String> {
        Ok(response
            .headers()
            .get(&name)
            .and_then(|value| value.to_str().ok())
            .ok_or_else(|| format!("{} without {name}", response.url()))?
            .to_owned())
    }

    /// The flow's cookie (`name=value`) that `response` sets.
    fn flow_cookie(response: &reqwest::Response) -> BenchResult<String> {
        let set = Self::header(response, header::SET_COOKIE)?;
        Ok(set.split(';').next().unwrap_or_default().to_owned())
    }

    /// From the authorization server's URL, which approves at once, to the
    /// registry's callback (with the flow's `cookie`), which must answer
    /// 303 to the page saying the account is connected.
    async fn approve(&self, authorization_url: &str, cookie: &str) -> BenchResult<()> {
        let approved = self.http.get(authorization_url).send().await?;
        if approved.status() != StatusCode::FOUND {
            return Err(format!("authorization server: {}", approved.status()).into());
        }
        let callback = Self::header(&approved, header::LOCATION)?;
        let done = self
            .http
            .get(&callback)
            .header(header::COOKIE, cookie)
            .send()
            .await?;
        if done.status() != StatusCode::SEE_OTHER {
            return Err(format!("registry callback: {}", done.status()).into());
        }
        Ok(())
    }

    /// An admin connects fleet connection `name`.
    async fn connect_fleet(&self, registry: &InProcessRegistry, name: &str) -> BenchResult<()> {
        let response = self
            .http
            .post(registry.url(&format!("/admin/api/oauth/connections/{name}/connect")))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await?;
        let cookie = Self::flow_cookie(&response)?;
        let status = response.status();
        let answer: Value = response.json().await?;
        let url = answer["authorization_url"]
            .as_str()
            .ok_or_else(|| format!("connect {name}: {status}: {answer}"))?;
        self.approve(url, &cookie).await
    }

    /// A principal follows its consent link: 303 to the authorization
    /// server with the flow's cookie, then [`Browser::approve`].
    async fn consent(&self, link: &str) -> BenchResult<()> {
        let response = self.http.get(link).send().await?;
        if response.status() != StatusCode::SEE_OTHER {
            return Err(format!("consent link: {}", response.status()).into());
        }
        let cookie = Self::flow_cookie(&response)?;
        let to_server = Self::header(&response, header::LOCATION)?;
        self.approve(&to_server, &cookie).await
    }
}

/// One route: a record's `echo` and the samples of its calls.
struct Route {
    name: &'static str,
    injected: String,
    samples: Vec<Duration>,
}

impl Route {
    fn new(name: &'static str, server_id: &str) -> BenchResult<Route> {
        Ok(Route {
            name,
            injected: quiver_model::naming::injected_name(server_id, "echo")?,
            samples: Vec::new(),
        })
    }
}

/// The worker's tool API, called with the API key.
struct Api {
    http: reqwest::Client,
    url: String,
    key: String,
}

impl Api {
    /// `echo` of `text` on `injected`: status and answer.
    async fn call(&self, injected: &str, text: &str) -> BenchResult<(StatusCode, Value)> {
        let response = self
            .http
            .post(&self.url)
            .bearer_auth(&self.key)
            .json(&json!({"name": injected, "arguments": {"text": text}}))
            .send()
            .await?;
        let status = response.status();
        Ok((status, response.json().await?))
    }

    /// `calls` sequential calls on `route`; each answer checked, each timed
    /// and kept when `keep`.
    async fn sequential(&self, route: &mut Route, calls: usize, keep: bool) -> BenchResult<()> {
        for i in 0..calls {
            let text = format!("call {i}");
            let started = Instant::now();
            let (status, answer) = self.call(&route.injected, &text).await?;
            let elapsed = started.elapsed();
            if !status.is_success() || answer["content"][0]["text"] != text.as_str() {
                return Err(format!("{}: unexpected answer {status}: {answer}", route.name).into());
            }
            if keep {
                route.samples.push(elapsed);
            }
        }
        Ok(())
    }
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
    let mcp = oauth_server().await?;
    let keyring = Keyring::parse(&Keyring::generate_line("bench"))?;
    let registry = InProcessRegistry::sqlite(move |options| {
        options.oauth.keyring = Some(keyring);
    })
    .await;
    let browser = Browser::new()?;

    // Both connections, the fleet one connected by an admin; the per-user
    // record stored here, since the stack's warm-up lists tools without a
    // caller, which a per-user connection refuses.
    for (name, per_user) in [(FLEET_CONNECTION, false), (PER_USER_CONNECTION, true)] {
        admin(
            &browser.http,
            &registry,
            Method::PUT,
            &format!("/admin/api/oauth/connections/{name}"),
            Some(json!({"server_url": mcp, "per_user": per_user})),
            StatusCode::OK,
        )
        .await?;
    }
    browser.connect_fleet(&registry, FLEET_CONNECTION).await?;
    registry
        .store
        .upsert(UpsertRequest {
            spec: record(PER_USER_ID, &mcp, PER_USER_CONNECTION),
            expected_revision: None,
            actor: "bench".into(),
            source: Source::Api,
        })
        .await?;
    let stack = Stack::start_on(
        registry,
        vec![record(FLEET_ID, &mcp, FLEET_CONNECTION)],
        None,
        CallersConfig::default(),
    )
    .await?;

    // The principal: an API key allowed both records, once the worker has
    // applied it and has the per-user record.
    let http = reqwest::Client::builder().tcp_nodelay(true).build()?;
    admin(
        &http,
        &stack.registry,
        Method::PUT,
        &format!("/admin/api/policies/{KEY_POLICY}"),
        Some(json!({"allowed_server_ids": [FLEET_ID, PER_USER_ID]})),
        StatusCode::CREATED,
    )
    .await?;
    let (_, key) = create_key(&http, &stack.registry, "bench", KEY_POLICY).await?;
    let whoami = format!("{}/v1/whoami", stack.worker_url);
    poll_until(
        "the API key and the per-user record applied by the worker",
        Instant::now(),
        || async {
            let answer: Value = http
                .get(&whoami)
                .bearer_auth(&key)
                .send()
                .await?
                .json()
                .await?;
            Ok(answer["via"] == "key" && stack.server(PER_USER_ID).is_ok())
        },
    )
    .await?;
    let api = Api {
        http,
        url: format!("{}/v1/mcp/tools/call", stack.worker_url),
        key,
    };

    // Its first per-user call asks for its consent; it gives it.
    let mut fleet = Route::new("fleet grant", FLEET_ID)?;
    let mut per_user = Route::new("per-user grant", PER_USER_ID)?;
    let (status, refused) = api.call(&per_user.injected, "before consent").await?;
    let link = match refused["error"]["authorization_url"].as_str() {
        Some(link)
            if status == StatusCode::FORBIDDEN
                && refused["error"]["code"] == "mcp_authorization_required" =>
        {
            link.to_owned()
        }
        _ => return Err(format!("per-user call before consent: {status}: {refused}").into()),
    };
    browser.consent(&link).await?;
    let set_up = started.elapsed();

    let per_round = config.calls / config.rounds;
    api.sequential(&mut fleet, config.warmup, false).await?;
    api.sequential(&mut per_user, config.warmup, false).await?;
    for round in 0..config.rounds {
        // Alternating order, so neither route always follows the other.
        if round % 2 == 0 {
            api.sequential(&mut fleet, per_round, true).await?;
            api.sequential(&mut per_user, per_round, true).await?;
        } else {
            api.sequential(&mut per_user, per_round, true).await?;
            api.sequential(&mut fleet, per_round, true).await?;
        }
    }
    stack.stop().await;

    let baseline = Samples::new(fleet.samples);
    let measured = Samples::new(per_user.samples);
    println!(
        "quiver per-user OAuth grant benchmark: `echo` through POST /v1/mcp/tools/call with one API key, {} calls per route in {} alternating rounds after {} untimed; {} cores; set up in {:.1} s, {:.1} s in all",
        per_round * config.rounds,
        config.rounds,
        config.warmup,
        std::thread::available_parallelism().map_or(0, usize::from),
        set_up.as_secs_f64(),
        started.elapsed().as_secs_f64(),
    );
    println!();
    println!("| route | p50 ms | p90 ms | p99 ms | added p50 ms | p50 / fleet |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, samples) in [(fleet.name, &baseline), (per_user.name, &measured)] {
        println!(
            "| {name} | {:.3} | {:.3} | {:.3} | {:+.3} | {:.3}× |",
            ms(samples.p50()),
            ms(samples.percentile(0.9)),
            ms(samples.p99()),
            ms(samples.p50()) - ms(baseline.p50()),
            ms(samples.p50()) / ms(baseline.p50()),
        );
    }
    println!();
    let added = ms(measured.p50()) - ms(baseline.p50());
    println!(
        "Goal ≤ {GOAL_MS:.3} ms p50 added — per-user minus fleet p50 {added:+.3} ms ({}); ratio p50 per-user/fleet {:.3}× (p99 {:.3}×)",
        if added <= GOAL_MS { "met" } else { "NOT met" },
        ms(measured.p50()) / ms(baseline.p50()),
        ms(measured.p99()) / ms(baseline.p99()),
    );
    Ok(())
}
