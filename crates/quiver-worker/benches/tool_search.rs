//! Tool search benchmark (issue #14), three parts in one run:
//!
//! 1. **Chat turn, 20 servers × 50 tools** (the setup of `benches/chat.rs`:
//!    testkit servers over streamable HTTP, in-process registry and worker,
//!    the scripted upstream answering at once): the body the worker sends
//!    upstream and the latency it adds, with every tool injected and with
//!    `mcp.tool_search` (8 tools; the user message matches all the generated
//!    tools, so the full 8 are offered — the largest search body). Baseline:
//!    the caller's body posted to the upstream directly, same run, rounds
//!    alternating. Goals: ≥ 10× fewer bytes of tool definitions, added p50
//!    still ≤ 1 ms.
//! 2. **Search latency over ≥ 10 000 tools**: `ToolIndex::search` (what a
//!    `quiver_search_tools` call costs once the catalog's index is built),
//!    p50/p99 over the labelled queries; the index build is timed too (once
//!    per catalog contents, then cached).
//! 3. **Retrieval quality**: recall@8 of the labelled queries
//!    (`benches/data/tool_queries.json`, 62 queries, each with the tools that
//!    answer it) over a catalog of the 118 real tools of the official MCP
//!    reference servers (`benches/data/reference_tools.json`, collected from
//!    the running servers by `benches/data/collect_tools.py`) plus generated
//!    look-alikes of business APIs (see [`generated_tools`]) to at least 500.
//!
//! `cargo bench -p quiver-worker --bench tool_search`. Sizes (defaults in
//! brackets): `QUIVER_BENCH_SERVERS` [20], `QUIVER_BENCH_TOOLS` [50],
//! `QUIVER_BENCH_CALLS` [1000] requests per route, `QUIVER_BENCH_ROUNDS` [8],
//! `QUIVER_BENCH_WARMUP` [50], `QUIVER_BENCH_SEARCH_TOOLS` [10000].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quiver_mcp::Tool;
use quiver_model::policy::CompiledTaskPolicy;
use quiver_model::{McpServerSpec, StoredServer, Transport};
use quiver_testkit::bench::{Samples, env_usize, ms};
use quiver_worker::catalog::Catalog;
use quiver_worker::tool_search::ToolIndex;
use serde::Deserialize;
use serde_json::{Value, json};

#[path = "support/chat_stack.rs"]
mod chat_stack;
#[path = "support/route.rs"]
mod route;
#[path = "support/stack.rs"]
mod stack;

use chat_stack::ChatStack;
use route::Route;
use stack::{BenchResult, CALLER_TOKEN};

const ANSWER: &str = "The answer is 42.";
const MAX_TOOLS: u32 = 8;

#[derive(Clone, Copy)]
struct Config {
    servers: usize,
    tools: usize,
    calls: usize,
    rounds: usize,
    warmup: usize,
    search_tools: usize,
}

impl Config {
    fn from_env() -> Config {
        Config {
            servers: env_usize("QUIVER_BENCH_SERVERS", 20),
            tools: env_usize("QUIVER_BENCH_TOOLS", 50),
            calls: env_usize("QUIVER_BENCH_CALLS", 1000),
            rounds: env_usize("QUIVER_BENCH_ROUNDS", 8).max(1),
            warmup: env_usize("QUIVER_BENCH_WARMUP", 50),
            search_tools: env_usize("QUIVER_BENCH_SEARCH_TOOLS", 10_000),
        }
    }
}

fn main() -> BenchResult<()> {
    let config = Config::from_env();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(chat_turns(config))?;
    let (tools, queries) = dataset()?;
    search_latency(config, &tools, &queries)?;
    recall(&tools, &queries);
    Ok(())
}

// ---------------------------------------------------------------------------
// 1. Chat turns

fn caller_body(mcp: Option<Value>) -> Vec<u8> {
    let mut body = json!({
        "model": "bench-model",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Run the generated tool for my query, please."},
        ],
        "temperature": 0.2,
    });
    if let Some(mcp) = mcp {
        body["mcp"] = mcp;
    }
    serde_json::to_vec(&body).unwrap_or_default()
}

async fn chat_turns(config: Config) -> BenchResult<()> {
    let setup = ChatStack::start(config.servers, config.tools, ANSWER).await?;
    let (stack, upstream) = (&setup.stack, &setup.upstream);
    let expected_tools = config.servers * config.tools;
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let worker = format!("{}/v1/chat/completions", stack.worker_url);
    let route = |url: &str, bearer, mcp| Route {
        client: client.clone(),
        url: url.to_owned(),
        bearer,
        body: caller_body(mcp),
        answer: ANSWER,
    };
    let direct = route(
        &format!("{}/chat/completions", upstream.base_url()),
        None,
        None,
    );
    let every_tool = route(&worker, Some(CALLER_TOKEN), Some(json!({"enabled": true})));
    let searching = route(
        &worker,
        Some(CALLER_TOKEN),
        Some(json!({"enabled": true, "tool_search": {"max_tools": MAX_TOOLS}})),
    );
    let routes = [&direct, &every_tool, &searching];
    // What each route sends upstream, measured on its last warm-up request.
    let mut sizes = [0usize; 3];
    for (i, route) in routes.iter().enumerate() {
        for _ in 0..config.warmup.max(1) {
            route.call().await?;
        }
        sizes[i] = upstream.requests().last().map_or(0, |r| r.size);
    }
    let per_round = config.calls.div_ceil(config.rounds);
    let mut samples: [Vec<Duration>; 3] = Default::default();
    for _ in 0..config.rounds {
        for (i, route) in routes.iter().enumerate() {
            for _ in 0..per_round {
                let t = Instant::now();
                route.call().await?;
                samples[i].push(t.elapsed());
            }
        }
    }
    let [direct_s, every_s, search_s] = samples.map(Samples::new);
    let definitions = |size: usize| size.saturating_sub(sizes[0]);
    println!(
        "\ntool search, chat turn: {} servers × {} tools = {expected_tools} tools; {} requests per route in {} rounds (after {} warm-up)\n",
        config.servers,
        config.tools,
        per_round * config.rounds,
        config.rounds,
        config.warmup
    );
    println!(
        "| route | body upstream | tool definitions | p50 | p99 | added p50 vs direct | goal |"
    );
    println!("|---|---:|---:|---:|---:|---:|---|");
    let row = |name: &str, size: usize, s: &Samples, goal: &str| {
        println!(
            "| {name} | {size} B | {} B | {:.3} ms | {:.3} ms | {:+.3} ms | {goal} |",
            definitions(size),
            ms(s.p50()),
            ms(s.p99()),
            ms(s.p50()) - ms(direct_s.p50()),
        );
    };
    row("direct to the upstream (baseline)", sizes[0], &direct_s, "");
    row(
        &format!("worker, every tool ({expected_tools})"),
        sizes[1],
        &every_s,
        "",
    );
    let fewer = definitions(sizes[1]) as f64 / definitions(sizes[2]).max(1) as f64;
    let added = ms(search_s.p50()) - ms(direct_s.p50());
    row(
        &format!("worker, tool_search (search + {MAX_TOOLS} tools)"),
        sizes[2],
        &search_s,
        &format!(
            "≥ 10× fewer definition bytes: {} ({fewer:.0}×); added p50 ≤ 1 ms: {}",
            verdict(fewer >= 10.0),
            verdict(added <= 1.0)
        ),
    );
    println!(
        "\nratio p50 tool_search / direct: {:.2}×; every tool / direct: {:.2}×",
        ms(search_s.p50()) / ms(direct_s.p50()),
        ms(every_s.p50()) / ms(direct_s.p50())
    );
    setup.stop().await;
    Ok(())
}

fn verdict(met: bool) -> &'static str {
    if met { "MET" } else { "MISSED" }
}

// ---------------------------------------------------------------------------
// The labelled dataset

/// A tool of `benches/data/reference_tools.json`.
#[derive(Deserialize, Clone)]
struct DataTool {
    server: String,
    name: String,
    title: Option<String>,
    description: String,
    arguments: Vec<String>,
}

/// A query of `benches/data/tool_queries.json`: `server/name` of the tools
/// that answer it.
#[derive(Deserialize)]
struct DataQuery {
    query: String,
    relevant: Vec<String>,
}

fn dataset() -> BenchResult<(Vec<DataTool>, Vec<DataQuery>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/data");
    let tools: Vec<DataTool> =
        serde_json::from_slice(&std::fs::read(dir.join("reference_tools.json"))?)?;
    let queries: Vec<DataQuery> =
        serde_json::from_slice(&std::fs::read(dir.join("tool_queries.json"))?)?;
    Ok((tools, queries))
}

/// Look-alikes of business APIs, so the catalog is large and its words
/// overlap the real tools' (files, issues, messages, search …): every action
/// of every object of every domain below, e.g. `create_invoice` of server
/// `gen-billing`, "Create a new invoice in the billing system."
fn generated_tools() -> Vec<DataTool> {
    const DOMAINS: &[(&str, &str, &[&str])] = &[
        (
            "billing",
            "the billing system",
            &["invoice", "payment", "refund"],
        ),
        ("crm", "the CRM", &["contact", "lead", "deal"]),
        (
            "calendar",
            "the team calendar",
            &["event", "meeting", "reminder"],
        ),
        (
            "helpdesk",
            "the help desk",
            &["ticket", "ticket comment", "agent"],
        ),
        (
            "inventory",
            "the inventory service",
            &["product", "warehouse", "stock level"],
        ),
        (
            "hr",
            "the HR system",
            &["employee", "leave request", "payroll run"],
        ),
        (
            "analytics",
            "the analytics platform",
            &["dashboard", "report", "metric"],
        ),
        (
            "storage",
            "cloud object storage",
            &["bucket", "stored object", "volume snapshot"],
        ),
        (
            "devops",
            "the deployment platform",
            &["deployment", "pipeline", "alert"],
        ),
        ("wiki", "the company wiki", &["page", "space", "template"]),
        (
            "mailing",
            "the email marketing tool",
            &["campaign", "mailing list", "subscriber"],
        ),
        (
            "chat",
            "the team chat",
            &["chat room", "chat message", "bot"],
        ),
        (
            "tasks",
            "the project tracker",
            &["task", "sprint", "milestone"],
        ),
        ("shop", "the online shop", &["order", "cart", "coupon"]),
        (
            "identity",
            "the identity provider",
            &["user account", "group", "api key"],
        ),
        (
            "db",
            "the managed database service",
            &["database", "backup", "replica"],
        ),
        (
            "forms",
            "the survey tool",
            &["form", "form response", "question"],
        ),
    ];
    const ACTIONS: &[(&str, &str)] = &[
        ("create", "Create a new {o} in {d}."),
        ("get", "Get the details of one {o} from {d}."),
        ("list", "List every {o} in {d}, with paging."),
        ("update", "Update the fields of an existing {o} in {d}."),
        ("delete", "Delete a {o} from {d}; this cannot be undone."),
        ("search", "Search {d} for {o}s matching a text query."),
        ("export", "Export {o}s from {d} as CSV."),
        ("archive", "Archive a {o} in {d} so it no longer shows up."),
    ];
    let mut tools = Vec::new();
    for (domain, system, objects) in DOMAINS {
        for object in *objects {
            for (action, template) in ACTIONS {
                let snake = object.replace(' ', "_");
                tools.push(DataTool {
                    server: format!("gen-{domain}"),
                    name: format!("{action}_{snake}"),
                    title: None,
                    description: template.replace("{o}", object).replace("{d}", system),
                    arguments: match *action {
                        "create" | "update" => vec!["fields".into(), format!("{snake}_id")],
                        "list" | "export" => vec!["cursor".into(), "limit".into()],
                        "search" => vec!["query".into(), "limit".into()],
                        _ => vec![format!("{snake}_id")],
                    },
                });
            }
        }
    }
    tools
}

/// A catalog of `tools`, all allowed.
fn catalog_of(tools: &[DataTool]) -> Catalog {
    let mut by_server: BTreeMap<String, Vec<Tool>> = BTreeMap::new();
    for tool in tools {
        let mut schema = serde_json::Map::new();
        schema.insert("type".into(), json!("object"));
        schema.insert(
            "properties".into(),
            Value::Object(
                tool.arguments
                    .iter()
                    .map(|a| (a.clone(), json!({"type": "string"})))
                    .collect(),
            ),
        );
        let mut listed = Tool::new(
            tool.name.clone(),
            tool.description.clone(),
            Arc::new(schema),
        );
        listed.title = tool.title.clone();
        by_server
            .entry(tool.server.clone())
            .or_default()
            .push(listed);
    }
    let listings: Vec<_> = by_server
        .into_iter()
        .map(|(id, tools)| {
            let mut spec = McpServerSpec::new(id, Transport::Stdio);
            spec.allowed_tools = vec!["*".into()];
            let server = StoredServer::created(spec, 1, "bench");
            (Arc::new(server), Arc::new(tools))
        })
        .collect();
    Catalog::evaluated(
        &listings,
        &Arc::new(CompiledTaskPolicy::unrestricted()),
        None,
    )
}

// ---------------------------------------------------------------------------
// 2. Search latency

fn search_latency(config: Config, real: &[DataTool], queries: &[DataQuery]) -> BenchResult<()> {
    let mut one: Vec<DataTool> = real.to_vec();
    one.extend(generated_tools());
    // Copies of the dataset under other server ids until there are enough.
    let copies = config.search_tools.div_ceil(one.len());
    let many: Vec<DataTool> = (0..copies)
        .flat_map(|copy| {
            one.iter().map(move |tool| DataTool {
                server: format!("{}-{copy}", tool.server),
                ..tool.clone()
            })
        })
        .collect();
    let catalog = catalog_of(&many);
    let built = Instant::now();
    let index = ToolIndex::build(&catalog);
    let build = built.elapsed();
    let mut samples = Vec::new();
    for _ in 0..20 {
        for query in queries {
            let t = Instant::now();
            let found = index.search(&query.query, MAX_TOOLS as usize);
            samples.push(t.elapsed());
            if found.len() > MAX_TOOLS as usize {
                return Err("search returned more than asked".into());
            }
        }
    }
    let samples = Samples::new(samples);
    println!(
        "\ntool search latency over {} tools ({} queries × 20): p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms; index build {:.1} ms (once per catalog contents)",
        catalog.len(),
        queries.len(),
        ms(samples.p50()),
        ms(samples.p99()),
        ms(samples.max()),
        ms(build)
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// 3. Recall

fn recall(real: &[DataTool], queries: &[DataQuery]) {
    let mut tools: Vec<DataTool> = real.to_vec();
    tools.extend(generated_tools());
    let catalog = catalog_of(&tools);
    let index = ToolIndex::build(&catalog);
    let listed: Vec<String> = catalog
        .tools()
        .map(|tool| format!("{}/{}", tool.server_id(), tool.tool_name()))
        .collect();
    let mut hits = 0;
    let mut reciprocal = 0.0;
    let mut misses = Vec::new();
    for query in queries {
        let found: Vec<&str> = index
            .search(&query.query, MAX_TOOLS as usize)
            .into_iter()
            .map(|position| listed[position].as_str())
            .collect();
        match found
            .iter()
            .position(|name| query.relevant.iter().any(|r| r == name))
        {
            Some(rank) => {
                hits += 1;
                reciprocal += 1.0 / (rank + 1) as f64;
            }
            None => misses.push(format!(
                "{:?} (wanted {}; got {})",
                query.query,
                query.relevant.join(", "),
                found.first().copied().unwrap_or("nothing")
            )),
        }
    }
    println!(
        "\nrecall@{MAX_TOOLS}: {hits}/{} = {:.2}; MRR@{MAX_TOOLS} {:.2}; catalog {} tools ({} real from the reference servers, {} generated)",
        queries.len(),
        hits as f64 / queries.len() as f64,
        reciprocal / queries.len() as f64,
        catalog.len(),
        real.len(),
        catalog.len() - real.len(),
    );
    for miss in misses {
        println!("  missed: {miss}");
    }
}
