//! `policies.d` (issue #22, docs/reference.md §4): policies and identity
//! providers loaded from files at start, rescanned after edits, taken over
//! by REST edits, planned by `--dry-run`, and refused with the file and
//! field named, on SQLite and PostgreSQL.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{ADMIN, TestRegistry, rest};
use quiver_model::Strictness;
use quiver_registry::state::BootstrapDir;
use quiver_registry::{Registry, RegistryOptions};
use quiver_store::{SqlStore, Store};
use quiver_testkit::postgres::TestDatabase;
use quiver_testkit::registry::test_options;
use reqwest::Method;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const TEAMS: &str = r#"
[policies.team-a]
allowed_server_ids = ["github"]
tool_denylist = ["github.*delete*"]

[policies.team-b]
allowed_server_ids = ["example"]

[[identity_providers]]
name = "corp"
issuer = "https://idp.example.com"
audiences = ["quiver"]
rules = [
  { claim = "groups", contains = "team-a", policy = "team-a" },
  { claim = "groups", contains = "team-b", policy = "team-b" },
]
"#;

const OPS: &str = "{\"policies\": {\"ops\": {\"tool_allowlist\": [\"*.get_*\"]}}}";

/// A `policies.d` in a temporary directory.
struct Dir {
    _root: tempfile::TempDir,
    path: PathBuf,
}

impl Dir {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("policies.d");
        std::fs::create_dir(&path).unwrap();
        Dir { _root: root, path }
    }

    fn write(&self, name: &str, text: &str) {
        std::fs::write(self.path.join(name), text).unwrap();
    }

    fn options(&self, strictness: Strictness) -> impl FnOnce(&mut RegistryOptions) + use<> {
        let dir = BootstrapDir {
            path: self.path.clone(),
            strictness,
        };
        move |options| options.policies_dir = Some(dir)
    }
}

async fn get(r: &TestRegistry, path: &str) -> (u16, Value) {
    rest(r, Method::GET, path, Some(ADMIN), None).await
}

async fn rescan(r: &TestRegistry) -> (u16, Value) {
    rest(r, Method::POST, "/admin/api/mcp/rescan", Some(ADMIN), None).await
}

async fn policy(r: &TestRegistry, name: &str) -> Value {
    let (status, body) = get(r, &format!("/admin/api/policies/{name}")).await;
    assert_eq!(status, 200, "{name}: {body}");
    body
}

async fn loads_rescans_and_yields_to_admin(r: TestRegistry, dir: Dir) {
    // Loaded at start: policies, then the provider naming them.
    let team_a = policy(&r, "team-a").await;
    assert_eq!(team_a["source"], "file:10-teams.toml");
    assert_eq!(
        team_a["policy"]["tool_denylist"],
        json!(["github.*delete*"])
    );
    assert_eq!(policy(&r, "ops").await["source"], "file:20-ops.json");
    let (status, corp) = get(&r, "/admin/api/identity/providers/corp").await;
    assert_eq!(status, 200, "{corp}");
    assert_eq!(
        (corp["source"].clone(), corp["revision"].clone()),
        (json!("file:10-teams.toml"), json!(4))
    );
    assert_eq!(corp["updated_by"], "policies.d");

    // The dry-run plan of an edit, against the registry's store.
    dir.write(
        "10-teams.toml",
        &TEAMS.replace("github.*delete*", "github.*remove*"),
    );
    let scanned = quiver_bootstrap::policies::scan(&dir.path, Strictness::Lenient).unwrap();
    let plan = quiver_bootstrap::policies::plan(r.store.as_ref(), &scanned)
        .await
        .unwrap();
    let text = plan.render();
    assert!(
        text.contains("~ update policy team-a (10-teams.toml)"),
        "{text}"
    );
    assert!(
        text.contains("-tool_denylist = [\"github.*delete*\"]"),
        "{text}"
    );
    assert!(
        text.contains("+tool_denylist = [\"github.*remove*\"]"),
        "{text}"
    );
    assert!(
        text.contains("= unchanged identity_provider corp (10-teams.toml)"),
        "{text}"
    );
    assert!(
        text.ends_with("plan against revision 4: 0 to create, 1 to update, 0 to delete, 3 unchanged, 0 skipped, 0 kept\n"),
        "{text}"
    );
    assert_eq!(
        r.store.head().await.unwrap().revision,
        4,
        "a plan writes nothing"
    );

    // The rescan applies it; with no mcp.d, only `policies` is reported.
    let (status, body) = rescan(&r).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.get("records").is_none(), "{body}");
    let policies = &body["policies"];
    assert_eq!(
        (policies["updated"].clone(), policies["unchanged"].clone()),
        (json!(1), json!(3))
    );
    assert_eq!(
        policies["records"][0],
        json!({"kind": "policy", "name": "ops", "file": "20-ops.json"})
    );
    assert_eq!(
        policy(&r, "team-a").await["policy"]["tool_denylist"],
        json!(["github.*remove*"])
    );

    // An edit over REST takes team-b over: the file no longer changes it,
    // and dropping it from the file does not delete it.
    let (status, body) = rest(
        &r,
        Method::PUT,
        "/admin/api/policies/team-b",
        Some(ADMIN),
        Some(&json!({"allowed_server_ids": ["example", "github"]}).to_string()),
    )
    .await;
    assert_eq!(
        (status, body["source"].clone()),
        (200, json!("admin")),
        "{body}"
    );
    dir.write(
        "10-teams.toml",
        &TEAMS.replace("[\"example\"]", "[\"other\"]"),
    );
    let (_, body) = rescan(&r).await;
    assert_eq!(body["policies"]["skipped"], 1, "{body}");
    let team_b = policy(&r, "team-b").await;
    assert_eq!(
        team_b["policy"]["allowed_server_ids"],
        json!(["example", "github"])
    );
    assert_eq!(team_b["source"], "admin");

    // A removed file deletes what it owns.
    std::fs::remove_file(dir.path.join("20-ops.json")).unwrap();
    let (_, body) = rescan(&r).await;
    assert_eq!(body["policies"]["deleted"], 1, "{body}");
    let (status, _) = get(&r, "/admin/api/policies/ops").await;
    assert_eq!(status, 404);

    // An invalid file (lenient): reported with its file and field, its
    // records kept as they are.
    let before = r.store.head().await.unwrap().revision;
    dir.write(
        "10-teams.toml",
        &TEAMS.replace("github.*delete*", "github.[x"),
    );
    let (status, body) = rescan(&r).await;
    assert_eq!(status, 200, "{body}");
    let error = &body["policies"]["errors"][0];
    assert_eq!(error["file"], "10-teams.toml");
    assert_eq!(error["fields"], json!(["policies.team-a.tool_denylist[0]"]));
    assert_eq!(body["policies"]["kept"], 2, "{body}");
    assert_eq!(r.store.head().await.unwrap().revision, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_d_loads_rescans_and_yields_to_admin_on_sqlite() {
    let dir = Dir::new();
    dir.write("10-teams.toml", TEAMS);
    dir.write("20-ops.json", OPS);
    let r = TestRegistry::sqlite(dir.options(Strictness::Lenient)).await;
    loads_rescans_and_yields_to_admin(r, dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_d_loads_rescans_and_yields_to_admin_on_postgres() {
    let dir = Dir::new();
    dir.write("10-teams.toml", TEAMS);
    dir.write("20-ops.json", OPS);
    let r = TestRegistry::postgres(dir.options(Strictness::Lenient)).await;
    loads_rescans_and_yields_to_admin(r, dir).await;
}

/// Strict mode: an invalid file stops start-up naming the file and the
/// field, with nothing stored; a file broken later fails the rescan the
/// same way and changes nothing.
async fn strict_errors_name_file_and_field(store: Arc<SqlStore>) {
    let dir = Dir::new();
    dir.write(
        "10-teams.toml",
        &TEAMS.replace("github.*delete*", "github.[x"),
    );
    dir.write("05-ops.json", OPS);
    dir.write("20-again.toml", "[policies.ops]\nallowed_server_ids = []\n");
    let mut options = test_options();
    dir.options(Strictness::Strict)(&mut options);
    let err = Registry::start(store.clone(), options.clone(), CancellationToken::new())
        .await
        .err()
        .expect("strict start-up refuses invalid files");
    let text = err.to_string();
    let path = |file: &str| dir.path.join(file).display().to_string();
    assert!(
        text.contains(&format!(
            "{}: policies.team-a.tool_denylist[0]: ",
            path("10-teams.toml")
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "{}: policies.ops: policy \"ops\" is already defined by 05-ops.json (policies.ops)",
            path("20-again.toml")
        )),
        "{text}"
    );
    assert!(text.contains("policies.d/10-teams.toml"), "{text}");
    assert_eq!(store.head().await.unwrap().revision, 0, "nothing stored");
    assert!(store.list().await.unwrap().access.is_empty());

    // Fixed, it starts; broken again, a rescan is refused and writes nothing.
    dir.write("10-teams.toml", TEAMS);
    std::fs::remove_file(dir.path.join("20-again.toml")).unwrap();
    let r = TestRegistry::start(store.clone(), options).await;
    assert_eq!(store.head().await.unwrap().revision, 4);
    dir.write(
        "10-teams.toml",
        &TEAMS.replace("audiences = [\"quiver\"]\n", ""),
    );
    let (status, body) = rescan(&r).await;
    assert_eq!(status, 412, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("10-teams.toml: identity_providers[0].audiences: missing required field"),
        "{message}"
    );
    assert_eq!(store.head().await.unwrap().revision, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_errors_name_file_and_field_on_sqlite() {
    let root = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", root.path().join("registry.db").display());
    let store = SqlStore::open_sqlite(&url).await.unwrap();
    strict_errors_name_file_and_field(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_errors_name_file_and_field_on_postgres() {
    let db = TestDatabase::create().await;
    let store = SqlStore::open_postgres(db.url()).await.unwrap();
    strict_errors_name_file_and_field(Arc::new(store)).await;
}

/// The shipped example loads strictly next to the shipped `mcp.d`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shipped_examples_load_together() {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config");
    let r = TestRegistry::sqlite(|options| {
        options.mcp_dir = Some(BootstrapDir {
            path: config.join("mcp.d"),
            strictness: Strictness::Strict,
        });
        options.policies_dir = Some(BootstrapDir {
            path: config.join("policies.d"),
            strictness: Strictness::Strict,
        });
    })
    .await;
    let (status, body) = rescan(&r).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["records"].as_array().is_some_and(|r| !r.is_empty()),
        "{body}"
    );
    assert!(
        body["policies"]["records"]
            .as_array()
            .is_some_and(|r| !r.is_empty()),
        "{body}"
    );
    assert_eq!(
        body["policies"]["unchanged"],
        body["policies"]["records"].as_array().unwrap().len()
    );
}
