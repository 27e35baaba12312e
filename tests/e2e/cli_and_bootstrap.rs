//! The admin CLI against a real registry, and `mcp.d` bootstrap: start-up
//! load, `--dry-run`, SIGHUP reloads (create and delete) and the REST rescan.

use std::path::Path;
use std::time::Duration;

use quiver_proto::v1 as pb;
use quiver_testkit::postgres::TestDatabase;
use reqwest::StatusCode;
use serde_json::Value;

use crate::harness::{Client, Finished, RegistryProcess, eventually, run_quiver};

const ADMIN: &str = "admin-secret";
const CLI_TIMEOUT: Duration = Duration::from_secs(15);
const RELOAD_TIMEOUT: Duration = Duration::from_secs(5);

fn record_toml(server_id: &str, display_name: &str) -> String {
    format!(
        r#"server_id = "{server_id}"
display_name = "{display_name}"
transport = "stdio"
allowed_tools = ["echo"]

[stdio]
command = "mcp-test-server"
args = ["--name", "{server_id}"]
"#
    )
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).expect("write record file");
}

/// Runs `quiver servers --registry URL --token ADMIN ARGS`; asserts success.
async fn servers(registry: &RegistryProcess, args: &[&str]) -> String {
    let finished = servers_raw(registry, args).await;
    assert!(
        finished.status.success(),
        "`quiver servers {}` failed: {finished:?}",
        args.join(" ")
    );
    finished.stdout
}

async fn servers_raw(registry: &RegistryProcess, args: &[&str]) -> Finished {
    let url = registry.grpc_url();
    let mut all = vec!["servers", "--registry", &url, "--token", ADMIN];
    all.extend_from_slice(args);
    run_quiver(&all, CLI_TIMEOUT).await
}

async fn get(client: &mut Client, id: &str) -> Result<pb::McpServer, tonic::Status> {
    client
        .get_mcp_server(pb::GetMcpServerRequest {
            server_id: id.to_owned(),
        })
        .await
        .map(|response| response.into_inner().server.expect("record"))
}

async fn head(client: &mut Client) -> u64 {
    client
        .list_mcp_servers(pb::ListMcpServersRequest {})
        .await
        .expect("list")
        .into_inner()
        .revision
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_dry_run_sighup_and_rescan() {
    let db = TestDatabase::create().await;
    let work = tempfile::tempdir().expect("temp dir");
    let mcp_dir = work.path().join("mcp.d");
    std::fs::create_dir(&mcp_dir).expect("mcp.d");
    let mcp_dir_arg = mcp_dir.to_str().expect("utf-8 path");
    write(&mcp_dir, "alpha.toml", &record_toml("alpha", "Alpha"));

    let registry = RegistryProcess::start(&[
        "--database-url",
        db.url(),
        "--admin-token",
        ADMIN,
        "--mcp-dir",
        mcp_dir_arg,
        "--rescan-interval-secs",
        "0",
    ])
    .await;
    let mut client = registry.client(Some(ADMIN)).await;

    // Start-up load.
    let listed = servers(&registry, &["list"]).await;
    let rows: Vec<&str> = listed.lines().collect();
    assert!(rows[0].starts_with("SERVER_ID"), "{listed}");
    assert!(rows[1].starts_with("alpha "), "{listed}");
    assert!(rows[1].contains("file:alpha.toml"), "{listed}");
    assert_eq!(rows.last(), Some(&"(1 servers at revision 1)"), "{listed}");

    let shown = servers(&registry, &["get", "alpha"]).await;
    assert!(shown.starts_with("# revision 1 "), "{shown}");
    assert!(shown.contains("source file:alpha.toml"), "{shown}");
    assert!(shown.contains("server_id = \"alpha\""), "{shown}");
    assert!(shown.contains("display_name = \"Alpha\""), "{shown}");

    // apply / unchanged / history / delete of an admin-made record.
    let beta = work.path().join("beta.toml");
    std::fs::write(&beta, record_toml("beta", "Beta")).expect("beta.toml");
    let beta_arg = beta.to_str().expect("utf-8 path");
    assert_eq!(
        servers(&registry, &["apply", "-f", beta_arg]).await,
        "beta: applied at revision 2\n"
    );
    assert_eq!(
        servers(&registry, &["apply", "-f", beta_arg]).await,
        "beta: unchanged at revision 2\n"
    );
    let listed = servers(&registry, &["list"]).await;
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with("beta ") && l.contains(" api ")),
        "{listed}"
    );
    assert!(listed.ends_with("(2 servers at revision 2)\n"), "{listed}");

    let stale = servers_raw(
        &registry,
        &["apply", "-f", beta_arg, "--expected-revision", "1"],
    )
    .await;
    assert!(
        !stale.status.success(),
        "a stale expected revision must fail: {stale:?}"
    );
    assert!(stale.stderr.contains("Aborted"), "{}", stale.stderr);

    assert_eq!(
        servers(&registry, &["delete", "beta"]).await,
        "beta: deleted at revision 3\n"
    );
    let history = servers(&registry, &["history", "beta"]).await;
    let entries: Vec<Vec<&str>> = history
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(entries.len(), 2, "{history}");
    assert_eq!(&entries[0][..2], ["3", "delete"], "{history}");
    assert_eq!(&entries[1][..2], ["2", "upsert"], "{history}");
    let missing = servers_raw(&registry, &["get", "beta"]).await;
    assert!(
        !missing.status.success(),
        "deleted record still readable: {missing:?}"
    );
    assert!(missing.stderr.contains("NotFound"), "{}", missing.stderr);

    // --dry-run shows the plan and writes nothing.
    write(&mcp_dir, "gamma.toml", &record_toml("gamma", "Gamma"));
    let dry = run_quiver(
        &[
            "registry",
            "--dry-run",
            "--mcp-dir",
            mcp_dir_arg,
            "--database-url",
            db.url(),
        ],
        CLI_TIMEOUT,
    )
    .await;
    assert!(dry.status.success(), "dry run failed: {dry:?}");
    assert!(
        dry.stdout.contains("+ create gamma (gamma.toml)"),
        "{}",
        dry.stdout
    );
    assert!(
        dry.stdout.contains("= unchanged alpha (alpha.toml)"),
        "{}",
        dry.stdout
    );
    assert!(
        dry.stdout.contains(
            "plan against revision 3: 1 to create, 0 to update, 0 to delete, 1 unchanged"
        ),
        "{}",
        dry.stdout
    );
    assert_eq!(head(&mut client).await, 3, "--dry-run must not write");
    assert_eq!(
        get(&mut client, "gamma")
            .await
            .map(|_| ())
            .unwrap_err()
            .code(),
        tonic::Code::NotFound
    );

    // SIGHUP picks up a new file…
    registry.sighup();
    let gamma = eventually(RELOAD_TIMEOUT, "gamma after SIGHUP", || {
        let mut client = client.clone();
        async move { get(&mut client, "gamma").await.ok() }
    })
    .await;
    assert_eq!(gamma.source, "file:gamma.toml");
    assert_eq!(gamma.revision, 4);
    assert_eq!(gamma.updated_by, "mcp.d");

    // …and deletes the record of a removed file.
    std::fs::remove_file(mcp_dir.join("gamma.toml")).expect("remove gamma.toml");
    registry.sighup();
    eventually(RELOAD_TIMEOUT, "gamma deleted after SIGHUP", || {
        let mut client = client.clone();
        async move {
            match get(&mut client, "gamma").await {
                Err(status) if status.code() == tonic::Code::NotFound => Some(()),
                _ => None,
            }
        }
    })
    .await;
    assert_eq!(head(&mut client).await, 5);
    assert!(
        get(&mut client, "alpha").await.is_ok(),
        "alpha must survive rescans"
    );

    // The REST rescan action.
    write(&mcp_dir, "delta.toml", &record_toml("delta", "Delta"));
    write(&mcp_dir, "alpha.toml", &record_toml("alpha", "Alpha v2"));
    let response = reqwest::Client::new()
        .post(format!("{}/admin/api/mcp/rescan", registry.http_url()))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("POST rescan");
    assert_eq!(response.status(), StatusCode::OK);
    let report: Value = response.json().await.expect("JSON rescan report");
    assert_eq!(report["created"], 1, "{report}");
    assert_eq!(report["updated"], 1, "{report}");
    assert_eq!(report["deleted"], 0, "{report}");
    assert_eq!(report["unchanged"], 0, "{report}");
    assert_eq!(
        report["records"].as_array().map(Vec::len),
        Some(2),
        "{report}"
    );
    assert_eq!(
        report["errors"].as_array().map(Vec::len),
        Some(0),
        "{report}"
    );
    assert_eq!(head(&mut client).await, 7);
    let alpha = get(&mut client, "alpha").await.expect("alpha");
    assert_eq!(
        alpha.spec.expect("spec").display_name.as_deref(),
        Some("Alpha v2")
    );
    let shown = servers(&registry, &["get", "delta"]).await;
    assert!(shown.contains("source file:delta.toml"), "{shown}");
}

/// `quiver servers apply -f DIR`: every `*.toml`/`*.json` record file of the
/// directory in one batch (issue #16): one contiguous revision range, each
/// revision seen by a watch, and all or nothing when one record is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_applies_a_directory_in_one_batch() {
    let db = TestDatabase::create().await;
    let work = tempfile::tempdir().expect("temp dir");
    let dir = work.path().join("records");
    std::fs::create_dir(&dir).expect("records dir");
    let dir_arg = dir.to_str().expect("utf-8 path");
    write(&dir, "a.toml", &record_toml("alpha", "Alpha"));
    write(
        &dir,
        "b.toml",
        &format!(
            "[[servers]]\n{}\n[[servers]]\n{}",
            record_toml("beta", "Beta").replace("[stdio]", "[servers.stdio]"),
            record_toml("gamma", "Gamma").replace("[stdio]", "[servers.stdio]")
        ),
    );
    write(
        &dir,
        "c.json",
        r#"{"server_id": "delta", "transport": "streamable_http", "http": {"url": "https://mcp.example.com/mcp"}}"#,
    );
    write(&dir, "notes.txt", "not a record");

    let registry =
        RegistryProcess::start(&["--database-url", db.url(), "--admin-token", ADMIN]).await;
    let mut client = registry.client(Some(ADMIN)).await;
    let mut stream = client
        .watch_mcp_servers(pb::WatchMcpServersRequest { since_revision: 0 })
        .await
        .expect("watch")
        .into_inner();

    let applied = servers(&registry, &["apply", "-f", dir_arg]).await;
    assert_eq!(
        applied,
        "alpha: applied at revision 1\nbeta: applied at revision 2\ngamma: applied at revision 3\n\
         delta: applied at revision 4\n4 records from 3 files: 4 applied at revisions 1..=4\n"
    );
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let event = tokio::time::timeout(RELOAD_TIMEOUT, stream.message())
            .await
            .expect("watch event in time")
            .expect("watch")
            .expect("stream open");
        if !event.heartbeat {
            seen.push((event.revision, event.upserts.join(",")));
        }
    }
    assert_eq!(
        seen,
        [
            (1, "alpha".to_owned()),
            (2, "beta".to_owned()),
            (3, "gamma".to_owned()),
            (4, "delta".to_owned())
        ]
    );
    assert_eq!(
        servers(&registry, &["apply", "-f", dir_arg]).await,
        "alpha: unchanged at revision 1\nbeta: unchanged at revision 2\ngamma: unchanged at revision 3\n\
         delta: unchanged at revision 4\n4 records from 3 files: nothing changed\n"
    );

    // A record the registry refuses (beta twice): nothing of the batch is
    // written, and the error names the file of the refused record.
    write(&dir, "a.toml", &record_toml("alpha", "Alpha v2"));
    write(
        &dir,
        "d.json",
        r#"{"server_id": "beta", "transport": "streamable_http", "http": {"url": "https://mcp.example.com/b"}}"#,
    );
    let refused = servers_raw(&registry, &["apply", "-f", dir_arg]).await;
    assert!(!refused.status.success(), "{refused:?}");
    assert!(refused.stderr.contains("d.json"), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("servers[4].server_id"),
        "{}",
        refused.stderr
    );
    assert_eq!(head(&mut client).await, 4);
    assert_eq!(
        get(&mut client, "alpha")
            .await
            .expect("alpha")
            .spec
            .expect("spec")
            .display_name
            .as_deref(),
        Some("Alpha")
    );
    std::fs::remove_file(dir.join("d.json")).expect("remove d.json");
    assert!(
        servers(&registry, &["apply", "-f", dir_arg])
            .await
            .ends_with("4 records from 3 files: 1 applied at revisions 5..=5\n")
    );
}
