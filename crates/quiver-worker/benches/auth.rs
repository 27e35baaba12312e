//! Authentication benchmark (issue #22): what a caller's credential adds to
//! a tool call. Goal of the issue: ≤ 0.020 ms p50 added per call, for an API
//! key (a hash lookup) and for an OIDC JWT with the JWKS and the
//! verified-token cache warm.
//!
//! Everything is real and in this process: the testkit's MCP server over
//! streamable HTTP, the testkit's OIDC issuer (`OAuthServer::oidc()`: OpenID
//! discovery and a JWKS over loopback HTTP; tokens are minted by calling it
//! directly, before any timing), and an in-process registry and worker
//! (`benches/support/stack.rs`) whose callers are a static token, the
//! issuer as an identity provider (rule: `groups` contains `team-a` → task
//! `default`), `insecure_no_auth` (callers without a token are task
//! `default` too) and the registry's API keys: one key is created over the
//! registry's admin REST (`benches/support/registry_admin.rs`), of a policy
//! allowing the benchmark's server, and the benchmark waits until the
//! worker has applied it (`GET /v1/whoami` with it says `via: "key"`). So
//! one worker, one router and one tool serve every route; only the
//! `Authorization` header differs. `GET /v1/whoami` checks first that each
//! route authenticates the way it should (`anonymous`, `static`, `key`,
//! `oidc`). Every call is the server's `echo` and every answer is checked.
//!
//! 1. **End to end.** `POST /v1/mcp/tools/call` over one keep-alive client,
//!    sequentially, `QUIVER_BENCH_CALLS` [4000] calls per route in
//!    `QUIVER_BENCH_ROUNDS` [8] alternating rounds after
//!    `QUIVER_BENCH_WARMUP` [200] untimed calls. Routes: no token (the
//!    baseline, `--insecure-no-auth`), the static token, the API key, one
//!    ES256 JWT over and over (verified-token cache hit), and a fresh ES256
//!    JWT per call (cache miss: the signature is checked against the cached
//!    JWKS).
//! 2. **`Callers::identify` alone**, on a `Callers` built from the same
//!    configuration, with a `RegistryCallers` updated with the worker's
//!    access records (the policy and the key) as a worker wires it (its own
//!    caches, warmed first): `QUIVER_BENCH_IDENTIFY` [20000] calls per warm
//!    path and `QUIVER_BENCH_COLD` [1000] fresh tokens per cold path (ES256
//!    and RS256), each timed on its own, in alternating rounds.
//! 3. **A miss with the verified-token cache full** (for information): a
//!    new `Callers` whose cache is filled with
//!    `quiver_identity::MAX_VERIFIED_TOKENS` unexpired tokens, then
//!    `QUIVER_BENCH_COLD` more fresh tokens, against fresh tokens on an
//!    empty cache in the same rounds.
//! 4. **Many static tokens** (for information): `identify` on a `Callers`
//!    with 1 000 static caller tokens, presenting the last one, and a cached
//!    JWT (compared with every static token first).
//! 5. **Many API keys** (for information): the key on a `Callers` whose
//!    registry holds 10 000 keys, against the same key with one key held,
//!    in the same rounds (`QUIVER_BENCH_IDENTIFY` calls each).
//!
//! Added cost per path = its end-to-end p50 − the no-token p50, and its
//! `identify` p50 (the part of the call authentication is). Ratios are
//! against the no-token tool call of the same run.
//!
//! Run: `cargo bench -p quiver-worker --bench auth`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quiver_identity::MAX_VERIFIED_TOKENS;
use quiver_model::access::{AccessSpec, ClaimRule, IdentityProviderRecord, StoredAccess};
use quiver_model::token::TokenDigest;
use quiver_model::{HttpConfig, McpServerSpec, Transport};
use quiver_sync::{AccessMap, KeyUses};
use quiver_testkit::bench::{Samples, env_usize, ms};
use quiver_testkit::mcp_server::{ExampleServer, spawn_streamable_http};
use quiver_testkit::oauth_server::{OAuthServer, OAuthServerOptions};
use quiver_testkit::oidc_issuer::{MintAlg, MintRequest, OidcIssuer};
use quiver_worker::auth::{CallerToken, Callers, CallersConfig, Via};
use quiver_worker::registry_callers::RegistryCallers;
use serde_json::{Value, json};

#[path = "support/registry_admin.rs"]
mod registry_admin;
#[path = "support/stack.rs"]
mod stack;
use registry_admin::{create_key, create_policy, poll_until};
use stack::{BenchResult, CALLER_TOKEN, Stack};

const SERVER_ID: &str = "bench-http";
/// The registry policy of the API key.
const KEY_POLICY: &str = "bench-key";
/// The goal of the issue: added p50 per call, in milliseconds.
const GOAL_MS: f64 = 0.020;
/// Static caller tokens of part 4.
const MANY_TOKENS: usize = 1000;
/// Registry API keys of part 5.
const MANY_KEYS: usize = 10_000;

/// Sizes, from the environment.
struct Config {
    calls: usize,
    rounds: usize,
    warmup: usize,
    identify: usize,
    cold: usize,
}

impl Config {
    fn from_env() -> Self {
        Config {
            calls: env_usize("QUIVER_BENCH_CALLS", 4000).max(1),
            rounds: env_usize("QUIVER_BENCH_ROUNDS", 8).max(1),
            warmup: env_usize("QUIVER_BENCH_WARMUP", 200),
            identify: env_usize("QUIVER_BENCH_IDENTIFY", 20_000).max(1),
            cold: env_usize("QUIVER_BENCH_COLD", 1000).max(1),
        }
    }
}

/// The testkit's OIDC issuer, served on loopback until the process ends.
async fn issuer() -> BenchResult<Arc<OidcIssuer>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let server = OAuthServer::new(
        &format!("http://{}", listener.local_addr()?),
        OAuthServerOptions::default(),
    );
    let oidc = server.oidc().clone();
    tokio::spawn(async move {
        if let Err(err) = server.serve(listener).await {
            eprintln!("the OIDC issuer stopped: {err:#}");
        }
    });
    Ok(oidc)
}

/// Mints `n` distinct tokens (a `jti` each) of a caller that the rule
/// admits, signed with the issuer's current `alg` key; as header values.
fn mint(issuer: &OidcIssuer, alg: MintAlg, n: usize, tag: &str) -> BenchResult<Vec<String>> {
    (0..n)
        .map(|i| {
            let claims =
                json!({"sub": "bench-user", "groups": ["team-a"], "jti": format!("{tag}-{i}")});
            let token = issuer.mint(MintRequest {
                claims: claims.as_object().cloned().unwrap_or_default(),
                alg: Some(alg),
                ttl_secs: Some(3600),
                ..MintRequest::default()
            })?;
            Ok(format!("Bearer {token}"))
        })
        .collect()
}

/// How a route authenticates.
enum Credential {
    /// No `Authorization` header.
    None,
    /// The same header value on every call.
    Same(String),
    /// A fresh header value per call, each used once.
    Fresh(std::vec::IntoIter<String>),
}

impl Credential {
    fn next(&mut self) -> BenchResult<Option<String>> {
        match self {
            Credential::None => Ok(None),
            Credential::Same(value) => Ok(Some(value.clone())),
            Credential::Fresh(values) => Ok(Some(
                values.next().ok_or("ran out of fresh tokens (a bug)")?,
            )),
        }
    }
}

/// One end-to-end route: a name, its credential and its samples.
struct Route {
    name: &'static str,
    credential: Credential,
    samples: Vec<Duration>,
}

/// The worker's tool API.
struct Api {
    http: reqwest::Client,
    url: String,
    injected: String,
}

impl Api {
    /// `calls` sequential `echo` calls on `route`; each timed, each answer
    /// checked.
    async fn sequential(&self, route: &mut Route, calls: usize, keep: bool) -> BenchResult<()> {
        for i in 0..calls {
            let text = format!("call {i}");
            let body = json!({"name": self.injected, "arguments": {"text": text}});
            let authorization = route.credential.next()?;
            let started = Instant::now();
            let mut request = self.http.post(&self.url).json(&body);
            if let Some(value) = authorization {
                request = request.header("authorization", value);
            }
            let response = request.send().await?;
            let status = response.status();
            let answer: Value = response.json().await?;
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

    /// `GET /v1/whoami` with `authorization`: `(principal, via)`.
    async fn whoami(
        &self,
        base: &str,
        authorization: Option<&str>,
    ) -> BenchResult<(String, String)> {
        let mut request = self.http.get(format!("{base}/v1/whoami"));
        if let Some(value) = authorization {
            request = request.header("authorization", value);
        }
        let answer: Value = request.send().await?.error_for_status()?.json().await?;
        let field = |name: &str| answer[name].as_str().unwrap_or_default().to_owned();
        Ok((field("principal"), field("via")))
    }
}

/// One `identify` path: a name, the `Callers` it asks, how its callers
/// must authenticate, the header values it presents (each used once when
/// `fresh`), its calls per round and its samples.
struct Path<'a> {
    name: &'static str,
    callers: &'a Callers,
    via: Via,
    headers: Vec<Option<String>>,
    fresh: bool,
    per_round: usize,
    at: usize,
    samples: Vec<Duration>,
}

impl<'a> Path<'a> {
    /// The same header on every call.
    fn same(
        name: &'static str,
        callers: &'a Callers,
        via: Via,
        header: Option<String>,
        per_round: usize,
    ) -> Self {
        Path {
            name,
            callers,
            via,
            headers: vec![header],
            fresh: false,
            per_round,
            at: 0,
            samples: Vec::new(),
        }
    }

    /// Each of `headers` once: one to warm, then `per_round` a round.
    fn fresh(
        name: &'static str,
        callers: &'a Callers,
        headers: Vec<String>,
        per_round: usize,
    ) -> Self {
        Path {
            headers: headers.into_iter().map(Some).collect(),
            fresh: true,
            ..Path::same(name, callers, Via::Oidc, None, per_round)
        }
    }

    /// `n` calls of `identify`, each timed; each must be `self.via`.
    async fn run(&mut self, n: usize) -> BenchResult<()> {
        for _ in 0..n {
            let header = if self.fresh {
                self.at += 1;
                self.headers
                    .get(self.at - 1)
                    .ok_or("ran out of fresh tokens (a bug)")?
            } else {
                &self.headers[0]
            };
            let started = Instant::now();
            let caller = self.callers.identify(header.as_deref()).await;
            let elapsed = started.elapsed();
            match caller {
                Ok(caller) if caller.via == self.via => self.samples.push(elapsed),
                Ok(caller) => {
                    return Err(format!("{}: authenticated via {:?}", self.name, caller.via).into());
                }
                Err(refusal) => {
                    return Err(format!("{}: refused: {}", self.name, refusal.message()).into());
                }
            }
        }
        Ok(())
    }
}

/// Runs `paths` in `rounds` alternating rounds (`per_round` calls each),
/// after one untimed call each (which fetches the JWKS on the first JWT and
/// fills the caches): each path's name and samples, in order.
async fn alternate(
    mut paths: Vec<Path<'_>>,
    rounds: usize,
) -> BenchResult<Vec<(&'static str, Samples)>> {
    for path in &mut paths {
        path.run(1).await?;
        path.samples.clear();
    }
    for _ in 0..rounds {
        for path in &mut paths {
            path.run(path.per_round).await?;
        }
    }
    Ok(paths
        .into_iter()
        .map(|path| (path.name, Samples::new(path.samples)))
        .collect())
}

/// `callers_config`'s `Callers` serving the registry's callers of `access`,
/// as a worker wires them.
fn with_registry(
    callers_config: &CallersConfig,
    listen: SocketAddr,
    access: &AccessMap,
) -> BenchResult<Callers> {
    let registry = RegistryCallers::new(KeyUses::default());
    registry.update(access);
    Ok(Callers::new(callers_config, listen)?.with_registry(Arc::new(registry)))
}

/// `access` with more API keys beside its own, `total` in all: copies of
/// its key `key_id` under other ids and secrets.
fn with_more_keys(access: &AccessMap, key_id: &str, total: usize) -> BenchResult<AccessMap> {
    let template = access
        .values()
        .find(|record| matches!(&record.spec, AccessSpec::ApiKey(key) if key.id == key_id))
        .ok_or_else(|| format!("key {key_id} is not in the worker's access records"))?;
    let AccessSpec::ApiKey(key) = &template.spec else {
        return Err("the template is not an API key (a bug)".into());
    };
    let mut more = access.clone();
    for i in 1..total {
        let mut copy = key.clone();
        copy.id = format!("{key_id}-copy-{i}");
        copy.key_sha256 = TokenDigest::of(&format!("qk_bench-copy-{i}")).hex();
        let spec = AccessSpec::ApiKey(copy);
        more.insert(
            (spec.kind(), spec.name().to_owned()),
            Arc::new(StoredAccess {
                spec,
                ..StoredAccess::clone(template)
            }),
        );
    }
    Ok(more)
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
    let issuer = issuer().await?;
    let callers_config = CallersConfig {
        callers: vec![CallerToken {
            token: CALLER_TOKEN.into(),
            task: "default".into(),
        }],
        identity_providers: vec![IdentityProviderRecord {
            name: "bench-idp".into(),
            issuer: issuer.issuer().into(),
            audiences: vec!["quiver".into()],
            rules: vec![ClaimRule {
                claim: "groups".into(),
                contains: Some("team-a".into()),
                policy: Some("default".into()),
                ..Default::default()
            }],
            ..Default::default()
        }],
        insecure_no_auth: true,
        ..CallersConfig::default()
    };

    // Tokens, minted before anything is timed (the first mint generates
    // the issuer's keys).
    let per_round = config.calls / config.rounds;
    let warm_jwt = mint(&issuer, MintAlg::Es256, 1, "warm")?.remove(0);
    let mut e2e_fresh = mint(
        &issuer,
        MintAlg::Es256,
        per_round * config.rounds + config.warmup + 1,
        "e2e",
    )?;
    // One of its own for the check below, so every timed one is new.
    let checked_jwt = e2e_fresh.pop().ok_or("no token minted")?;
    let cold_per_round = config.cold / config.rounds;
    let cold_n = cold_per_round * config.rounds + 1;
    let cold_es = mint(&issuer, MintAlg::Es256, cold_n, "cold-es")?;
    let cold_rs = mint(&issuer, MintAlg::Rs256, cold_n, "cold-rs")?;
    let full_fill = mint(&issuer, MintAlg::Es256, MAX_VERIFIED_TOKENS, "fill")?;
    let full_cold = mint(&issuer, MintAlg::Es256, cold_n, "full")?;
    let empty_cold = mint(&issuer, MintAlg::Es256, cold_n, "empty")?;
    let static_header = format!("Bearer {CALLER_TOKEN}");
    let minted_in = started.elapsed();

    // 1. End to end.
    let server = spawn_streamable_http(ExampleServer::full()).await?;
    let mut spec = McpServerSpec::new(SERVER_ID, Transport::StreamableHttp);
    spec.http = Some(HttpConfig {
        url: server.url().to_owned(),
        ..HttpConfig::default()
    });
    spec.allowed_tools = vec!["*".into()];
    let stack = Stack::start_with_callers(vec![spec], None, callers_config.clone()).await?;
    let api = Api {
        http: reqwest::Client::new(),
        url: format!("{}/v1/mcp/tools/call", stack.worker_url),
        injected: quiver_model::naming::injected_name(SERVER_ID, "echo")?,
    };
    // An API key, created over the registry's REST; until the worker has
    // applied it, the key is no caller and `whoami` answers anonymous.
    create_policy(&api.http, &stack.registry, KEY_POLICY, SERVER_ID).await?;
    let (key_id, key) = create_key(&api.http, &stack.registry, "bench", KEY_POLICY).await?;
    let key_header = format!("Bearer {key}");
    poll_until(
        "the API key applied by the worker",
        Instant::now(),
        || async {
            let (_, via) = api.whoami(&stack.worker_url, Some(&key_header)).await?;
            Ok(via == "key")
        },
    )
    .await?;
    // The worker's access records, for `identify` alone.
    let access = stack.snapshot.current().access.clone();
    // Each route is what it claims to be.
    let key_principal = format!("key:{key_id}");
    for (authorization, principal, via) in [
        (None, Some("anonymous"), "static"),
        (Some(static_header.as_str()), None, "static"),
        (
            Some(key_header.as_str()),
            Some(key_principal.as_str()),
            "key",
        ),
        (Some(warm_jwt.as_str()), None, "oidc"),
        (Some(checked_jwt.as_str()), None, "oidc"),
    ] {
        let (got_principal, got_via) = api.whoami(&stack.worker_url, authorization).await?;
        let principal_ok = match principal {
            Some(principal) => got_principal == principal,
            None => got_principal != "anonymous",
        };
        if got_via != via || !principal_ok {
            return Err(
                format!("whoami: {got_principal} via {got_via}, expected via {via}").into(),
            );
        }
    }
    let mut routes = [
        Route {
            name: "no token (--insecure-no-auth): baseline",
            credential: Credential::None,
            samples: Vec::new(),
        },
        Route {
            name: "static caller token (hash lookup)",
            credential: Credential::Same(static_header.clone()),
            samples: Vec::new(),
        },
        Route {
            name: "API key (registry, SHA-256 map lookup)",
            credential: Credential::Same(key_header.clone()),
            samples: Vec::new(),
        },
        Route {
            name: "OIDC JWT ES256, verified-token cache hit",
            credential: Credential::Same(warm_jwt.clone()),
            samples: Vec::new(),
        },
        Route {
            name: "OIDC JWT ES256, fresh token per call (signature check)",
            credential: Credential::Fresh(e2e_fresh.into_iter()),
            samples: Vec::new(),
        },
    ];
    for route in &mut routes {
        api.sequential(route, config.warmup, false).await?;
    }
    for _ in 0..config.rounds {
        for route in &mut routes {
            api.sequential(route, per_round, true).await?;
        }
    }
    stack.stop().await;
    server.shutdown().await?;
    let e2e: Vec<(&str, Samples)> = routes
        .into_iter()
        .map(|route| (route.name, Samples::new(route.samples)))
        .collect();
    let baseline = e2e[0].1.p50();

    // 2. `Callers::identify` alone.
    let listen = SocketAddr::from(([127, 0, 0, 1], 0));
    let callers = with_registry(&callers_config, listen, &access)?;
    let warm_per_round = config.identify / config.rounds;
    let alone = alternate(
        vec![
            Path::same(
                "no token (--insecure-no-auth)",
                &callers,
                Via::Static,
                None,
                warm_per_round,
            ),
            Path::same(
                "static caller token",
                &callers,
                Via::Static,
                Some(static_header),
                warm_per_round,
            ),
            Path::same(
                "API key (registry)",
                &callers,
                Via::Key,
                Some(key_header.clone()),
                warm_per_round,
            ),
            Path::same(
                "OIDC JWT ES256, cache hit",
                &callers,
                Via::Oidc,
                Some(warm_jwt.clone()),
                warm_per_round,
            ),
            Path::fresh(
                "OIDC JWT ES256, cache miss",
                &callers,
                cold_es,
                cold_per_round,
            ),
            Path::fresh(
                "OIDC JWT RS256, cache miss",
                &callers,
                cold_rs,
                cold_per_round,
            ),
        ],
        config.rounds,
    )
    .await?;

    // 3. A miss with the verified-token cache full, against one on an
    // empty cache.
    let full = Callers::new(&callers_config, listen)?;
    let empty = Callers::new(&callers_config, listen)?;
    let fill_started = Instant::now();
    for header in &full_fill {
        full.identify(Some(header)).await.map_err(|r| r.message())?;
    }
    let fill = fill_started.elapsed();
    let [(_, on_full), (_, on_empty)]: [(&str, Samples); 2] = alternate(
        vec![
            Path::fresh("cache full", &full, full_cold, cold_per_round),
            Path::fresh("cache empty", &empty, empty_cold, cold_per_round),
        ],
        config.rounds,
    )
    .await?
    .try_into()
    .map_err(|_| "two paths, two results (a bug)")?;

    // 4. Many static tokens: the presented one is the last configured, and
    // a JWT is compared with every configured token before it is verified.
    let many_config = CallersConfig {
        callers: (0..MANY_TOKENS)
            .map(|i| CallerToken {
                token: format!("bench-caller-token-{i:04}"),
                task: "default".into(),
            })
            .collect(),
        ..callers_config.clone()
    };
    let many = Callers::new(&many_config, listen)?;
    let last = format!("Bearer bench-caller-token-{:04}", MANY_TOKENS - 1);
    let many_per_round = (config.identify / 10).max(config.rounds) / config.rounds;
    let many = alternate(
        vec![
            Path::same(
                "static caller token",
                &many,
                Via::Static,
                Some(last),
                many_per_round,
            ),
            Path::same(
                "OIDC JWT ES256, cache hit",
                &many,
                Via::Oidc,
                Some(warm_jwt.clone()),
                many_per_round,
            ),
        ],
        config.rounds,
    )
    .await?;

    // 5. Many API keys: the same key, with 10 000 keys held and with one.
    let many_keys = with_registry(
        &callers_config,
        listen,
        &with_more_keys(&access, &key_id, MANY_KEYS)?,
    )?;
    let [(_, keys_many), (_, keys_one)]: [(&str, Samples); 2] = alternate(
        vec![
            Path::same(
                "10 000 keys",
                &many_keys,
                Via::Key,
                Some(key_header.clone()),
                warm_per_round,
            ),
            Path::same(
                "one key",
                &callers,
                Via::Key,
                Some(key_header),
                warm_per_round,
            ),
        ],
        config.rounds,
    )
    .await?
    .try_into()
    .map_err(|_| "two paths, two results (a bug)")?;

    // Report.
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "quiver worker authentication benchmark: `echo` through POST /v1/mcp/tools/call, {} calls per route in {} alternating rounds after {} untimed; identify: {} calls per warm path, {} fresh tokens per cold path; {} cores; tokens minted in {:.1} s, {:.1} s in all",
        per_round * config.rounds,
        config.rounds,
        config.warmup,
        config.identify / config.rounds * config.rounds,
        cold_per_round * config.rounds,
        std::thread::available_parallelism().map_or(0, usize::from),
        minted_in.as_secs_f64(),
        started.elapsed().as_secs_f64(),
    );
    println!();
    println!("End to end (same worker, router and tool; only the Authorization header differs):");
    println!();
    println!("| route | p50 ms | p90 ms | p99 ms | added p50 ms | p50 / baseline |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, samples) in &e2e {
        println!(
            "| {name} | {:.3} | {:.3} | {:.3} | {:+.3} | {:.3}× |",
            ms(samples.p50()),
            ms(samples.percentile(0.9)),
            ms(samples.p99()),
            ms(samples.p50()) - ms(baseline),
            ms(samples.p50()) / ms(baseline),
        );
    }
    println!();
    println!("`Callers::identify` alone (each call timed on its own):");
    println!();
    println!("| path | p50 µs | p90 µs | p99 µs | p50 / baseline tool call p50 |");
    println!("|---|---:|---:|---:|---:|");
    for (name, samples) in &alone {
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {:.2} % |",
            us(samples.p50()),
            us(samples.percentile(0.9)),
            us(samples.p99()),
            100.0 * ms(samples.p50()) / ms(baseline),
        );
    }
    println!();
    println!(
        "Cache miss (ES256) with the verified-token cache full ({MAX_VERIFIED_TOKENS} unexpired tokens; filling it took {:.2} s, {:.1} µs per token): p50 {:.2} µs, p90 {:.2} µs, p99 {:.2} µs; on an empty cache in the same rounds: p50 {:.2} µs, p90 {:.2} µs, p99 {:.2} µs ({:.2}×)",
        fill.as_secs_f64(),
        us(fill) / MAX_VERIFIED_TOKENS as f64,
        us(on_full.p50()),
        us(on_full.percentile(0.9)),
        us(on_full.p99()),
        us(on_empty.p50()),
        us(on_empty.percentile(0.9)),
        us(on_empty.p99()),
        ms(on_full.p50()) / ms(on_empty.p50()),
    );
    println!();
    for (name, samples) in &many {
        println!(
            "With {MANY_TOKENS} static caller tokens configured: identify, {name}: p50 {:.2} µs, p99 {:.2} µs",
            us(samples.p50()),
            us(samples.p99()),
        );
    }
    println!();
    println!(
        "With {MANY_KEYS} registry API keys held: identify, API key: p50 {:.2} µs, p99 {:.2} µs; with one key held, same rounds: p50 {:.2} µs, p99 {:.2} µs ({:.2}×)",
        us(keys_many.p50()),
        us(keys_many.p99()),
        us(keys_one.p50()),
        us(keys_one.p99()),
        ms(keys_many.p50()) / ms(keys_one.p50()),
    );
    println!();
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    // The same credential is at the same index in both tables.
    let goal = |at: usize| {
        let added = ms(e2e[at].1.p50()) - ms(baseline);
        let identify = ms(alone[at].1.p50());
        format!(
            "{}: end-to-end added p50 {added:+.3} ms ({}), identify p50 {identify:.4} ms ({})",
            alone[at].0,
            verdict(added <= GOAL_MS),
            verdict(identify <= GOAL_MS),
        )
    };
    println!(
        "Goal ≤ {GOAL_MS:.3} ms p50 added — {}; {}; also {}; for information, {}",
        goal(2),
        goal(3),
        goal(1),
        goal(4)
    );
    Ok(())
}
