//! The admin API the web UI is built on: `whoami`, the record defaults,
//! masked reads and writes that keep masked values, tool preview (the
//! registry connecting to a real MCP server over stdio, streamable HTTP and
//! legacy SSE), policy evaluation and the workers view. The registry runs in-process on loopback ports and
//! is driven by real HTTP and gRPC clients.
//!
//! The stdio previews start the `quiver-testkit-mcp` binary; build it first
//! with `cargo build -p quiver-testkit` (the workspace test run does).

mod common;

use std::future::IntoFuture;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{
    ADMIN, TestRegistry, WORKER, postgres_registry, rest, rest_at, spec, sqlite_registry,
};
use quiver_model::naming::injected_name;
use quiver_model::{Budgets, HttpConfig, MASK, McpServerSpec, StdioConfig, Transport};
use quiver_proto::v1 as pb;
use quiver_registry::auth::{AuthConfig, Authenticator};
use quiver_registry::feed::{ChangeFeed, FeedOptions};
use quiver_registry::http_router;
use quiver_registry::state::RegistryState;
use quiver_store::{SqlStore, Store};
use quiver_testkit::legacy_sse;
use quiver_testkit::mcp_server::{
    ExampleServer, FULL_TOOL_NAMES, LONG_TOOL_NAME, SERVER_NAME, spawn_streamable_http,
    testkit_mcp_bin,
};
use reqwest::Method;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const SERVERS: &str = "/admin/api/mcp/servers";
const PREVIEW: &str = "/admin/api/mcp/preview";
const EVALUATE: &str = "/admin/api/mcp/evaluate";

/// A stdio record running `program args…` through `sh`, which writes the
/// server's pid (`exec` keeps it) to `<dir>/pid` first; `dir` is the cwd.
fn stdio_record(id: &str, dir: &Path, program: &str, args: &[&str]) -> McpServerSpec {
    let mut spec = McpServerSpec::new(id, Transport::Stdio);
    let mut sh_args = vec![
        "-c".to_owned(),
        r#"echo $$ > "$0"; exec "$@""#.to_owned(),
        dir.join("pid").display().to_string(),
        program.to_owned(),
    ];
    sh_args.extend(args.iter().map(|arg| (*arg).to_owned()));
    spec.stdio = Some(StdioConfig {
        command: "sh".into(),
        args: sh_args,
        cwd: Some(dir.display().to_string()),
        ..Default::default()
    });
    spec
}

fn http_record(id: &str, transport: Transport, url: &str) -> McpServerSpec {
    let mut spec = McpServerSpec::new(id, transport);
    spec.http = Some(HttpConfig {
        url: url.into(),
        headers: [("X-Api-Key".to_owned(), "hdr-literal".to_owned())].into(),
        auth_ref: None,
    });
    spec
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// `/proc/<pid>/stat`'s state letter, `None` once the process is reaped.
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name in parentheses may contain spaces; the state follows the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Waits until `pid` is reaped (`zombie_ok`: or is a zombie, for a
/// grandchild whose reaper is not this process).
async fn assert_gone(pid: u32, zombie_ok: bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match process_state(pid) {
            None => return,
            Some('Z') if zombie_ok => return,
            state if Instant::now() > deadline => {
                panic!("process {pid} was left behind (state {state:?})")
            }
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Pids of live processes whose working directory is `dir`.
fn processes_in(dir: &Path) -> Vec<u32> {
    let dir = dir.canonicalize().unwrap();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd == dir))
        .collect()
}

fn pid_in(dir: &Path, name: &str) -> u32 {
    let text = std::fs::read_to_string(dir.join(name))
        .unwrap_or_else(|err| panic!("{name} not written by the child: {err}"));
    text.trim().parse().unwrap()
}

/// Verdicts of a preview or evaluation, by tool name.
fn by_name(body: &Value) -> std::collections::BTreeMap<String, Value> {
    body["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools in {body}"))
        .iter()
        .map(|tool| (tool["name"].as_str().unwrap().to_owned(), tool.clone()))
        .collect()
}

fn reason_code(tool: &Value) -> &str {
    tool["reason"]["code"].as_str().unwrap_or("")
}

#[tokio::test]
async fn whoami_names_the_role_of_the_token() {
    let r = sqlite_registry(|_| {}).await;
    let path = "/admin/api/whoami";
    assert_eq!(
        rest(&r, Method::GET, path, Some(ADMIN), None).await,
        (
            200,
            json!({"role": "admin", "principal": null, "via": "token"})
        )
    );
    assert_eq!(
        rest(&r, Method::GET, path, Some(WORKER), None).await,
        (
            200,
            json!({"role": "worker", "principal": null, "via": "token"})
        )
    );
    for token in [None, Some("wrong")] {
        let (status, err) = rest(&r, Method::GET, path, token, None).await;
        assert_eq!(
            (status, &err["error"]["code"]),
            (401, &json!("unauthenticated"))
        );
    }
}

/// The web admin's form shows the defaults the registry serves, so they
/// must be the model's own.
#[tokio::test]
async fn record_defaults_are_the_models_defaults() {
    let r = sqlite_registry(|_| {}).await;
    let path = "/admin/api/record-defaults";
    let (status, body) = rest(&r, Method::GET, path, Some(WORKER), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({ "budgets": Budgets::default() }));
    let served: Budgets = serde_json::from_value(body["budgets"].clone()).expect("budgets");
    assert_eq!(served, Budgets::default());
    let (status, err) = rest(&r, Method::GET, path, None, None).await;
    assert_eq!(
        (status, &err["error"]["code"]),
        (401, &json!("unauthenticated"))
    );
}

#[tokio::test]
async fn masked_reads_hide_literals_from_the_admin_too() {
    let r = sqlite_registry(|_| {}).await;
    let body = json!(spec("fs", "npx")).to_string();
    let (status, _) = rest(&r, Method::POST, SERVERS, Some(ADMIN), Some(&body)).await;
    assert_eq!(status, 201);
    let http = json!(http_record(
        "web",
        Transport::StreamableHttp,
        "https://mcp.example.com/mcp"
    ))
    .to_string();
    let (status, _) = rest(&r, Method::POST, SERVERS, Some(ADMIN), Some(&http)).await;
    assert_eq!(status, 201);

    let (status, list) = rest(
        &r,
        Method::GET,
        &format!("{SERVERS}?masked=true"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let fs = &list["servers"][0];
    assert_eq!(fs["stdio"]["env"]["API_KEY"], MASK);
    assert_eq!(
        fs["stdio"]["env"]["TOKEN"], "${ENV:TOKEN}",
        "references stay"
    );
    assert_eq!(list["servers"][1]["http"]["headers"]["X-Api-Key"], MASK);

    let (_, one) = rest(
        &r,
        Method::GET,
        &format!("{SERVERS}/fs?masked=true"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(one["stdio"]["env"]["API_KEY"], MASK);
    let (_, history) = rest(
        &r,
        Method::GET,
        &format!("{SERVERS}/fs/history?masked=true"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(
        history["entries"][0]["spec"]["stdio"]["env"]["API_KEY"],
        MASK
    );

    // Without the parameter (or with false) the admin reads literals as before.
    for query in ["", "?masked=false"] {
        let (_, one) = rest(
            &r,
            Method::GET,
            &format!("{SERVERS}/fs{query}"),
            Some(ADMIN),
            None,
        )
        .await;
        assert_eq!(one["stdio"]["env"]["API_KEY"], "sk-literal");
    }
    // The worker token cannot unmask.
    let (_, one) = rest(
        &r,
        Method::GET,
        &format!("{SERVERS}/fs?masked=false"),
        Some(WORKER),
        None,
    )
    .await;
    assert_eq!(one["stdio"]["env"]["API_KEY"], MASK);
    let (status, err) = rest(
        &r,
        Method::GET,
        &format!("{SERVERS}?masked=yes"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!((status, &err["error"]["field"]), (400, &json!("masked")));
}

/// GET masked → POST it back → the stored literal is unchanged; then the
/// error cases of masked values that have nothing to keep.
async fn masked_round_trip(r: TestRegistry) {
    let created = json!(spec("fs", "npx")).to_string();
    let (status, _) = rest(&r, Method::POST, SERVERS, Some(ADMIN), Some(&created)).await;
    assert_eq!(status, 201);
    let (_, mut form) = rest(
        &r,
        Method::GET,
        &format!("{SERVERS}/fs?masked=true"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(form["stdio"]["env"]["API_KEY"], MASK);
    let revision = form["revision"].as_u64().unwrap();
    // The UI sends the record fields back, without the stored metadata.
    let record = |form: &Value| {
        let mut record = form.clone();
        for key in [
            "revision",
            "created_at",
            "updated_at",
            "updated_by",
            "source",
        ] {
            record.as_object_mut().unwrap().remove(key);
        }
        record.to_string()
    };

    // Sent back unchanged: nothing to write at all.
    let (status, same) = rest(&r, Method::POST, SERVERS, Some(ADMIN), Some(&record(&form))).await;
    assert_eq!((status, &same["unchanged"]), (200, &json!(true)), "{same}");
    assert_eq!(same["stdio"]["env"]["API_KEY"], "sk-literal");

    // Another field changed, with the right expected revision: the masked
    // value keeps the stored literal.
    form["stdio"]["command"] = json!("uvx");
    form["stdio"]["env"]["NEW_LITERAL"] = json!("typed-in");
    let (status, updated) = rest(
        &r,
        Method::POST,
        &format!("{SERVERS}?expected_revision={revision}"),
        Some(ADMIN),
        Some(&record(&form)),
    )
    .await;
    assert_eq!(status, 200, "{updated}");
    let (_, stored) = rest(&r, Method::GET, &format!("{SERVERS}/fs"), Some(ADMIN), None).await;
    assert_eq!(stored["stdio"]["command"], "uvx");
    assert_eq!(stored["stdio"]["env"]["API_KEY"], "sk-literal");
    assert_eq!(stored["stdio"]["env"]["NEW_LITERAL"], "typed-in");
    assert_eq!(stored["stdio"]["env"]["TOKEN"], "${ENV:TOKEN}");
    // Workers (gRPC) read the literal too: the mask was never stored.
    let over_grpc = r
        .client(Some(WORKER))
        .await
        .get_mcp_server(pb::GetMcpServerRequest {
            server_id: "fs".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .server
        .unwrap()
        .spec
        .unwrap()
        .stdio
        .unwrap()
        .env;
    assert_eq!(over_grpc["API_KEY"], "sk-literal");
    assert!(!over_grpc.values().any(|value| value == MASK));

    // A stale form hears about the conflict, even with a masked key that has
    // nothing to keep; nothing changes.
    form["stdio"]["env"]["UNKNOWN"] = json!(MASK);
    let (status, conflict) = rest(
        &r,
        Method::POST,
        &format!("{SERVERS}?expected_revision={revision}"),
        Some(ADMIN),
        Some(&record(&form)),
    )
    .await;
    assert_eq!(status, 409, "{conflict}");
    assert_eq!(conflict["error"]["current_revision"], revision + 1);
    // Up to date: the masked key without a stored value is named.
    let (status, err) = rest(
        &r,
        Method::POST,
        &format!("{SERVERS}?expected_revision={}", revision + 1),
        Some(ADMIN),
        Some(&record(&form)),
    )
    .await;
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["code"], "invalid_argument");
    assert_eq!(err["error"]["field"], "stdio.env.UNKNOWN");
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.contains("enter the value"), "{message}");

    // A new record has nothing to keep.
    let mut new = spec("other", "npx");
    new.stdio
        .as_mut()
        .unwrap()
        .env
        .insert("API_KEY".into(), MASK.into());
    let (status, err) = rest(
        &r,
        Method::POST,
        SERVERS,
        Some(ADMIN),
        Some(&json!(new).to_string()),
    )
    .await;
    assert_eq!(
        (status, &err["error"]["field"]),
        (400, &json!("stdio.env.API_KEY"))
    );
    // Switching to an HTTP transport: the stdio record has no headers to keep.
    let mut switched = http_record("fs", Transport::StreamableHttp, "https://x.example/mcp");
    switched
        .http
        .as_mut()
        .unwrap()
        .headers
        .insert("X-Api-Key".into(), MASK.into());
    let (status, err) = rest(
        &r,
        Method::POST,
        SERVERS,
        Some(ADMIN),
        Some(&json!(switched).to_string()),
    )
    .await;
    assert_eq!(
        (status, &err["error"]["field"]),
        (400, &json!("http.headers.X-Api-Key"))
    );

    // Import: a masked value keeps the stored one; a masked value with
    // nothing to keep fails the whole document before anything is written.
    let head = r.store.head().await.unwrap().revision;
    let toml = format!(
        r#"
[[servers]]
server_id = "fs"
transport = "stdio"
allowed_tools = ["*"]
stdio = {{ command = "imported", env = {{ API_KEY = "{MASK}" }} }}

[[servers]]
server_id = "brand-new"
transport = "stdio"
stdio = {{ command = "x", env = {{ SECRET = "{MASK}" }} }}
"#
    );
    let import = |body: String| {
        reqwest::Client::new()
            .post(r.url("/admin/api/mcp/import"))
            .bearer_auth(ADMIN)
            .header("content-type", "application/toml")
            .body(body)
            .send()
    };
    let response = import(toml.clone()).await.unwrap();
    assert_eq!(response.status(), 400);
    let err: Value = response.json().await.unwrap();
    assert_eq!(err["error"]["field"], "servers[1].stdio.env.SECRET");
    assert_eq!(r.store.head().await.unwrap().revision, head);
    let fixed = toml.replace(&format!("SECRET = \"{MASK}\""), "SECRET = \"s3\"");
    let response = import(fixed).await.unwrap();
    assert_eq!(response.status(), 200);
    let result: Value = response.json().await.unwrap();
    assert_eq!(result["results"][0]["outcome"], "updated", "{result}");
    let (_, stored) = rest(&r, Method::GET, &format!("{SERVERS}/fs"), Some(ADMIN), None).await;
    assert_eq!(stored["stdio"]["command"], "imported");
    assert_eq!(
        stored["stdio"]["env"],
        json!({"API_KEY": "sk-literal"}),
        "the imported record replaces the env; the masked key keeps its value"
    );
}

#[tokio::test]
async fn masked_values_stay_unless_changed_on_sqlite() {
    masked_round_trip(sqlite_registry(|_| {}).await).await;
}

#[tokio::test]
async fn masked_values_stay_unless_changed_on_postgres() {
    masked_round_trip(postgres_registry().await).await;
}

#[tokio::test]
async fn preview_lists_and_judges_the_tools_of_a_stdio_server() {
    let r = sqlite_registry(|_| {}).await;
    let dir = tempfile::tempdir().unwrap();
    let bin = testkit_mcp_bin();
    let mut record = stdio_record(
        "tk",
        dir.path(),
        bin.to_str().unwrap(),
        &["--page-size", "3"],
    );
    record.allowed_tools = strings(&["*"]);
    record.denied_tools = strings(&["crash", "fail*"]);
    let (status, preview) = rest(
        &r,
        Method::POST,
        PREVIEW,
        Some(ADMIN),
        Some(&json!(record).to_string()),
    )
    .await;
    assert_eq!(status, 200, "{preview}");
    assert_eq!(preview["server_info"]["name"], SERVER_NAME);
    assert!(preview["server_info"]["version"].is_string());
    assert!(preview["duration_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(preview["note"], Value::Null);
    let names: Vec<_> = preview["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, FULL_TOOL_NAMES, "every page of tools/list");
    let tools = by_name(&preview);
    let add = &tools["add"];
    assert_eq!(add["allowed"], true);
    assert_eq!(add["injected_name"], injected_name("tk", "add").unwrap());
    assert_eq!(add["reason"], Value::Null);
    assert_eq!(add["input_schema"]["type"], "object");
    assert!(add["description"].is_string());
    assert_eq!(tools["ünïcödé_tool"]["allowed"], true);
    assert_eq!(tools["dotted.name"]["allowed"], true);
    for denied in ["crash", "fail"] {
        assert_eq!(tools[denied]["allowed"], false);
        assert_eq!(tools[denied]["injected_name"], Value::Null);
        assert_eq!(reason_code(&tools[denied]), "denied_by_server");
    }
    let long = &tools[LONG_TOOL_NAME];
    assert_eq!(long["allowed"], false);
    assert_eq!(reason_code(long), "injected_name_too_long");
    assert!(
        long["reason"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 64"),
        "{long}"
    );
    // The child is gone once the answer is there.
    assert_gone(pid_in(dir.path(), "pid"), false).await;
    assert_eq!(processes_in(dir.path()), Vec::<u32>::new());
}

#[tokio::test]
async fn preview_over_streamable_http_and_legacy_sse() {
    let r = sqlite_registry(|_| {}).await;
    let http_server = spawn_streamable_http(ExampleServer::full()).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sse_url = format!("http://{}/sse", listener.local_addr().unwrap());
    let sse_shutdown = CancellationToken::new();
    tokio::spawn(legacy_sse::serve(
        listener,
        ExampleServer::example,
        sse_shutdown.clone(),
    ));
    let _stop_sse = sse_shutdown.drop_guard();

    let mut streamable = http_record("web", Transport::StreamableHttp, http_server.url());
    streamable.allowed_tools = strings(&["echo", "add", LONG_TOOL_NAME]);
    let (status, preview) = rest(
        &r,
        Method::POST,
        PREVIEW,
        Some(ADMIN),
        Some(&json!(streamable).to_string()),
    )
    .await;
    assert_eq!(status, 200, "{preview}");
    assert_eq!(preview["server_info"]["name"], SERVER_NAME);
    let tools = by_name(&preview);
    assert_eq!(tools.len(), FULL_TOOL_NAMES.len());
    assert_eq!(tools["echo"]["allowed"], true);
    assert_eq!(reason_code(&tools["sleep"]), "not_in_allowed_tools");
    assert_eq!(
        reason_code(&tools[LONG_TOOL_NAME]),
        "injected_name_too_long",
        "allowed by the patterns, still too long"
    );

    let mut legacy = http_record("old", Transport::HttpSseLegacy, &sse_url);
    legacy.allowed_tools = strings(&["*"]);
    legacy.enabled = false;
    let (status, preview) = rest(
        &r,
        Method::POST,
        PREVIEW,
        Some(ADMIN),
        Some(&json!(legacy).to_string()),
    )
    .await;
    assert_eq!(status, 200, "{preview}");
    let tools = by_name(&preview);
    assert_eq!(tools.len(), 5, "the example profile");
    assert!(
        tools.values().all(|tool| tool["allowed"] == true),
        "a disabled record is judged as if enabled: {preview}"
    );
    assert!(
        preview["note"].as_str().unwrap().contains("disabled"),
        "{preview}"
    );
}

#[tokio::test]
async fn preview_restores_masked_values_of_the_stored_record() {
    let r = sqlite_registry(|_| {}).await;
    let server = spawn_streamable_http(ExampleServer::example())
        .await
        .unwrap();
    let record = http_record("web", Transport::StreamableHttp, server.url());
    let (status, _) = rest(
        &r,
        Method::POST,
        SERVERS,
        Some(ADMIN),
        Some(&json!(record).to_string()),
    )
    .await;
    assert_eq!(status, 201);
    let (status, preview) = rest(
        &r,
        Method::POST,
        PREVIEW,
        Some(ADMIN),
        Some(&json!(record.masked()).to_string()),
    )
    .await;
    assert_eq!(status, 200, "{preview}");
    assert_eq!(
        reason_code(&by_name(&preview)["echo"]),
        "not_in_allowed_tools",
        "default deny"
    );
    let mut unknown = record.masked();
    unknown.server_id = "unsaved".into();
    let (status, err) = rest(
        &r,
        Method::POST,
        PREVIEW,
        Some(ADMIN),
        Some(&json!(unknown).to_string()),
    )
    .await;
    assert_eq!(
        (status, &err["error"]["field"]),
        (400, &json!("http.headers.X-Api-Key"))
    );
}

#[tokio::test]
async fn preview_failures_are_502_and_leave_no_process() {
    let r = sqlite_registry(|_| {}).await;
    let dir = tempfile::tempdir().unwrap();
    let preview = |record: McpServerSpec, token: &'static str| {
        let r = &r;
        async move {
            rest(
                r,
                Method::POST,
                PREVIEW,
                Some(token),
                Some(&json!(record).to_string()),
            )
            .await
        }
    };

    let mut missing = McpServerSpec::new("missing", Transport::Stdio);
    missing.stdio = Some(StdioConfig {
        command: "/nonexistent/quiver-no-such-server".into(),
        cwd: Some(dir.path().display().to_string()),
        ..Default::default()
    });
    let (status, err) = preview(missing.clone(), ADMIN).await;
    assert_eq!(status, 502, "{err}");
    assert_eq!(err["error"]["code"], "mcp_unavailable");
    let message = err["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("/nonexistent/quiver-no-such-server"),
        "{message}"
    );
    assert!(err["error"]["stderr_tail"].is_array(), "{err}");
    assert_eq!(processes_in(dir.path()), Vec::<u32>::new());

    // A server that dies at once: its stderr is reported, it is reaped.
    let crashing = stdio_record(
        "crashing",
        dir.path(),
        "sh",
        &["-c", "echo 'fatal: no config' >&2; exit 3"],
    );
    let (status, err) = preview(crashing, ADMIN).await;
    assert_eq!(status, 502, "{err}");
    assert_eq!(
        err["error"]["stderr_tail"],
        json!(["fatal: no config"]),
        "{err}"
    );
    assert_gone(pid_in(dir.path(), "pid"), false).await;

    // References resolve in the registry's environment.
    let mut unresolved = http_record(
        "unresolved",
        Transport::StreamableHttp,
        "http://127.0.0.1:1/mcp",
    );
    unresolved.http.as_mut().unwrap().headers.insert(
        "Authorization".into(),
        "Bearer ${ENV:QUIVER_TEST_SURELY_UNSET_VARIABLE}".into(),
    );
    let (status, err) = preview(unresolved, ADMIN).await;
    assert_eq!(status, 502, "{err}");
    let message = err["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("QUIVER_TEST_SURELY_UNSET_VARIABLE")
            && message.contains("registry's environment"),
        "{message}"
    );
    let refused = McpServerSpec {
        http: Some(HttpConfig {
            url: "http://127.0.0.1:1/mcp".into(),
            ..Default::default()
        }),
        ..McpServerSpec::new("refused", Transport::StreamableHttp)
    };
    let (status, err) = preview(refused, ADMIN).await;
    assert_eq!(
        (status, &err["error"]["code"]),
        (502, &json!("mcp_unavailable"))
    );

    // Only the admin may make the registry start commands.
    let (status, err) = preview(missing.clone(), WORKER).await;
    assert_eq!(
        (status, &err["error"]["code"]),
        (403, &json!("permission_denied"))
    );
    // The body is a record like the upsert's, strictly parsed.
    let mut invalid = json!(missing);
    invalid["budgets"] = json!({"max_concurrency": 0});
    invalid["colour"] = json!("red");
    let (status, err) = rest(
        &r,
        Method::POST,
        PREVIEW,
        Some(ADMIN),
        Some(&invalid.to_string()),
    )
    .await;
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["field"], "colour");
}

#[tokio::test]
async fn preview_timeout_is_504_and_kills_the_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("registry.db");
    let store = Arc::new(
        SqlStore::open_sqlite(&format!("sqlite://{}", db.display()))
            .await
            .unwrap(),
    );
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let feed = ChangeFeed::start(store.clone(), FeedOptions::default(), shutdown.clone())
        .await
        .unwrap();
    let auth = Authenticator::new(
        &AuthConfig {
            admin_token: Some(ADMIN.into()),
            ..Default::default()
        },
        &[],
    )
    .unwrap();
    let state = RegistryState::new(store, feed, auth, None)
        .with_preview_timeout(Duration::from_millis(700));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        axum::serve(listener, http_router(state, None))
            .with_graceful_shutdown(shutdown.clone().cancelled_owned())
            .into_future(),
    );

    // Never answers `initialize`, and leaves a grandchild in its group.
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let silent = stdio_record(
        "silent",
        &work,
        "sh",
        &[
            "-c",
            r#"sleep 300 & echo $! > grandchild; echo 'starting slowly' >&2; wait"#,
        ],
    );
    let started = Instant::now();
    let (status, err) = rest_at(
        &base,
        Method::POST,
        PREVIEW,
        Some(ADMIN),
        Some(&json!(silent).to_string()),
    )
    .await;
    assert_eq!(status, 504, "{err}");
    assert_eq!(err["error"]["code"], "mcp_timeout");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("initialize did not complete within 700 ms"),
        "{err}"
    );
    assert_eq!(err["error"]["stderr_tail"], json!(["starting slowly"]));
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_gone(pid_in(&work, "pid"), false).await;
    assert_gone(pid_in(&work, "grandchild"), true).await;
    assert!(processes_in(&work).is_empty(), "{:?}", processes_in(&work));
}

#[tokio::test]
async fn evaluate_follows_the_patterns_being_edited() {
    let r = sqlite_registry(|_| {}).await;
    let names = ["add", "echo", "crash", "bad name", LONG_TOOL_NAME, "add"];
    let evaluate = |record: &McpServerSpec, token: &'static str| {
        let body = json!({"record": record, "tools": names}).to_string();
        let r = &r;
        async move { rest(r, Method::POST, EVALUATE, Some(token), Some(&body)).await }
    };
    let mut record = spec("fs", "npx");
    let (status, all) = evaluate(&record, WORKER).await;
    assert_eq!(status, 200, "{all}");
    assert_eq!(all["note"], Value::Null);
    let listed: Vec<_> = all["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        listed,
        &names[..5],
        "one verdict per distinct name, in order"
    );
    let tools = by_name(&all);
    assert_eq!(tools["add"]["allowed"], true);
    assert_eq!(
        tools["add"]["injected_name"],
        injected_name("fs", "add").unwrap()
    );
    assert_eq!(tools["crash"]["allowed"], true);
    assert_eq!(reason_code(&tools["bad name"]), "invalid_tool_name");
    assert_eq!(
        reason_code(&tools[LONG_TOOL_NAME]),
        "injected_name_too_long"
    );
    assert!(tools["add"].get("input_schema").is_none());

    record.denied_tools = strings(&["cr*"]);
    let (_, denied) = evaluate(&record, ADMIN).await;
    let crash = &by_name(&denied)["crash"];
    assert_eq!(
        (crash["allowed"].clone(), reason_code(crash)),
        (json!(false), "denied_by_server")
    );
    assert!(
        crash["reason"]["message"].as_str().unwrap().contains("cr*"),
        "{crash}"
    );
    record.allowed_tools = Vec::new();
    let (_, none) = evaluate(&record, ADMIN).await;
    assert_eq!(reason_code(&by_name(&none)["add"]), "not_in_allowed_tools");

    record.allowed_tools = strings(&["*"]);
    record.enabled = false;
    let (_, disabled) = evaluate(&record, ADMIN).await;
    assert_eq!(by_name(&disabled)["add"]["allowed"], true);
    assert!(disabled["note"].is_string(), "{disabled}");

    // Two raw names that one transform maps to the same name: neither is injected.
    let collision = json!({
        "record": {
            "server_id": "fs", "transport": "stdio", "stdio": {"command": "x"},
            "allowed_tools": ["*"],
            "transform": [{"prefix": {"remove": "a_", "add": ""}}, {"prefix": {"remove": "b_", "add": ""}}],
        },
        "tools": ["a_read", "b_read", "c_read"],
    });
    let (status, collided) = rest(
        &r,
        Method::POST,
        EVALUATE,
        Some(ADMIN),
        Some(&collision.to_string()),
    )
    .await;
    assert_eq!(status, 200, "{collided}");
    let tools = by_name(&collided);
    assert_eq!(reason_code(&tools["a_read"]), "name_collision");
    assert_eq!(reason_code(&tools["b_read"]), "name_collision");
    assert_eq!(
        tools["c_read"]["injected_name"],
        injected_name("fs", "c_read").unwrap()
    );
}

#[tokio::test]
async fn evaluate_errors_name_the_field() {
    let r = sqlite_registry(|_| {}).await;
    let record = json!({"server_id": "fs", "transport": "stdio", "stdio": {"command": "x"}});
    let mut bad_pattern = record.clone();
    bad_pattern["allowed_tools"] = json!(["read_*", "[oops"]);
    let mut unknown = record.clone();
    unknown["colour"] = json!(1);
    let cases = [
        (
            json!({"record": bad_pattern, "tools": []}),
            "record.allowed_tools[1]",
        ),
        (json!({"record": unknown, "tools": []}), "record.colour"),
        (
            json!({"record": {"transport": "stdio"}, "tools": []}),
            "record.server_id",
        ),
        (json!({"record": [], "tools": []}), "record"),
        (json!({"tools": []}), "record"),
        (json!({"record": record}), "tools"),
        (json!({"record": record, "tools": "add"}), "tools"),
        (json!({"record": record, "tools": ["add", 3]}), "tools[1]"),
        (
            json!({"record": record, "tools": [], "extra": true}),
            "extra",
        ),
    ];
    for (body, field) in cases {
        let (status, err) = rest(
            &r,
            Method::POST,
            EVALUATE,
            Some(WORKER),
            Some(&body.to_string()),
        )
        .await;
        assert_eq!(status, 400, "{body}: {err}");
        assert_eq!(err["error"]["code"], "invalid_argument", "{body}");
        assert_eq!(err["error"]["field"], field, "{body}: {err}");
    }
    for body in ["{not json", "[]", ""] {
        let (status, err) = rest(&r, Method::POST, EVALUATE, Some(WORKER), Some(body)).await;
        assert_eq!(status, 400, "{body:?}: {err}");
    }
    let (status, _) = rest(&r, Method::POST, EVALUATE, None, Some("{}")).await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn workers_show_their_lag_behind_head() {
    let r = sqlite_registry(|_| {}).await;
    for id in ["a", "b", "c"] {
        let body = json!(spec(id, "x")).to_string();
        let (status, _) = rest(&r, Method::POST, SERVERS, Some(ADMIN), Some(&body)).await;
        assert_eq!(status, 201);
    }
    let (_, empty) = rest(&r, Method::GET, "/admin/api/workers", Some(WORKER), None).await;
    assert_eq!(empty, json!({"head_revision": 3, "workers": []}));

    let mut client = r.client(Some(WORKER)).await;
    for (worker_id, snapshot_revision) in [("w-behind", 1), ("w-level", 3), ("w-ahead", 4)] {
        client
            .report_worker_status(pb::ReportWorkerStatusRequest {
                worker_id: worker_id.into(),
                snapshot_revision,
                degraded: snapshot_revision == 1,
                servers: vec![pb::ServerHealth {
                    server_id: "a".into(),
                    state: pb::ServerHealthState::Degraded.into(),
                    last_error: Some("boom".into()),
                    reconnect_count: 2,
                    tool_count: Some(7),
                    p50_latency_ms: Some(1.5),
                    session_connections: 4,
                }],
                key_uses: vec![],
            })
            .await
            .unwrap();
    }
    let (status, workers) = rest(&r, Method::GET, "/admin/api/workers", Some(ADMIN), None).await;
    assert_eq!(status, 200);
    assert_eq!(workers["head_revision"], 3);
    let lags: Vec<_> = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["worker_id"].as_str().unwrap(), w["lag"].as_u64().unwrap()))
        .collect();
    assert_eq!(lags, [("w-ahead", 0), ("w-behind", 2), ("w-level", 0)]);
    let behind = &workers["workers"][1];
    assert_eq!(behind["snapshot_revision"], 1);
    assert_eq!(behind["degraded"], true);
    assert!(behind["reported_at"].is_string());
    assert_eq!(
        behind["servers"][0],
        json!({
            "server_id": "a", "state": "degraded", "last_error": "boom",
            "reconnect_count": 2, "tool_count": 7, "p50_latency_ms": 1.5,
            "session_connections": 4,
        })
    );
}

/// A URL the registry's egress allowlist refuses is the same answer a worker
/// gives, 403 `mcp_policy_denied`, whether the host decides by itself (an IP
/// literal) or only once resolved.
#[tokio::test]
async fn preview_refused_by_egress_is_policy_denied() {
    let r = sqlite_registry(|options| {
        options.preview_egress =
            quiver_mcp::egress::EgressPolicy::new(&["allowed.example"], &["10.0.0.0/8"]).unwrap();
    })
    .await;
    for url in ["http://127.0.0.1:1/mcp", "http://localhost:1/mcp"] {
        let record = http_record("refused", Transport::StreamableHttp, url);
        let (status, err) = rest(
            &r,
            Method::POST,
            PREVIEW,
            Some(ADMIN),
            Some(&json!(record).to_string()),
        )
        .await;
        assert_eq!(
            (status, &err["error"]["code"]),
            (403, &json!("mcp_policy_denied")),
            "{url}: {err}"
        );
        let message = err["error"]["message"].as_str().unwrap();
        assert!(message.contains("egress"), "{url}: {message}");
    }
}
