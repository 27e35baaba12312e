//! `policies.d` directories scanned, planned and reconciled into an
//! in-memory SQLite store.

use std::fs;
use std::path::{Path, PathBuf};

use quiver_bootstrap::policies::{AccessAction, PolicyScan, apply, plan, reconcile, scan};
use quiver_bootstrap::{ApplyReport, BootstrapError};
use quiver_model::Source;
use quiver_model::Strictness::{Lenient, Strict};
use quiver_model::access::{
    AccessKind, AccessSpec, ApiKeyRecord, ClaimRule, IdentityProviderRecord, PolicyRecord,
};
use quiver_model::policy::TaskPolicy;
use quiver_store::{AccessPut, SqlStore, Store};
use tempfile::TempDir;

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

/// A temporary `policies.d`.
struct Dir {
    _root: TempDir,
    path: PathBuf,
}

impl Dir {
    fn new() -> Self {
        let root = TempDir::new().unwrap();
        let path = root.path().join("policies.d");
        fs::create_dir(&path).unwrap();
        Dir { _root: root, path }
    }

    fn write(&self, name: &str, text: &str) {
        fs::write(self.path.join(name), text).unwrap();
    }

    fn remove(&self, name: &str) {
        fs::remove_file(self.path.join(name)).unwrap();
    }
}

fn names(scan: &PolicyScan) -> Vec<(AccessKind, &str, &str, &str)> {
    scan.records
        .iter()
        .map(|r| (r.spec.kind(), r.spec.name(), r.file.as_str(), r.at.as_str()))
        .collect()
}

async fn store() -> SqlStore {
    SqlStore::open_sqlite("sqlite::memory:").await.unwrap()
}

async fn head(store: &SqlStore) -> u64 {
    store.head().await.unwrap().revision
}

async fn stored(store: &SqlStore, kind: AccessKind, name: &str) -> Option<(Source, u64)> {
    store
        .get_access(kind, name)
        .await
        .unwrap()
        .map(|r| (r.source, r.revision))
}

async fn reconcile_lenient(store: &SqlStore, dir: &Path) -> ApplyReport {
    let (_, report) = reconcile(store, dir, Lenient, "policies.d").await.unwrap();
    assert!(report.failed.is_empty(), "{report}");
    report
}

async fn admin_put(store: &SqlStore, spec: AccessSpec) {
    store
        .put_access(AccessPut {
            spec,
            expected_revision: None,
            actor: "ann".into(),
            source: Source::Admin,
        })
        .await
        .unwrap();
}

fn policy(name: &str, servers: &[&str]) -> AccessSpec {
    AccessSpec::Policy(PolicyRecord {
        name: name.into(),
        policy: TaskPolicy {
            allowed_server_ids: Some(servers.iter().map(|s| (*s).to_owned()).collect()),
            ..Default::default()
        },
    })
}

fn invalid(err: &BootstrapError) -> &[quiver_bootstrap::FileError] {
    match err {
        BootstrapError::Invalid { errors, .. } => errors,
        other => panic!("expected invalid files, got {other}"),
    }
}

#[test]
fn toml_and_json_files_declare_policies_and_providers() {
    let dir = Dir::new();
    dir.write("10-teams.toml", TEAMS);
    dir.write(
        "20-ops.json",
        r#"{"policies": {"ops": {"tool_allowlist": ["*.get_*"], "budgets": {"max_iterations": 4}}}}"#,
    );
    dir.write("30-empty.toml", "# nothing yet\n");

    let scanned = scan(&dir.path, Strict).unwrap();
    assert_eq!(
        names(&scanned),
        [
            (AccessKind::Policy, "ops", "20-ops.json", "policies.ops"),
            (
                AccessKind::Policy,
                "team-a",
                "10-teams.toml",
                "policies.team-a"
            ),
            (
                AccessKind::Policy,
                "team-b",
                "10-teams.toml",
                "policies.team-b"
            ),
            (
                AccessKind::IdentityProvider,
                "corp",
                "10-teams.toml",
                "identity_providers[0]"
            ),
        ]
    );
    assert_eq!(
        scanned.files,
        ["10-teams.toml", "20-ops.json", "30-empty.toml"]
    );
    assert!(scanned.warnings.is_empty(), "{:?}", scanned.warnings);
    let AccessSpec::Policy(ops) = &scanned.records[0].spec else {
        panic!("a policy");
    };
    assert_eq!(ops.policy.budgets.max_iterations, Some(4));
}

#[test]
fn errors_name_the_file_and_the_field() {
    let dir = Dir::new();
    dir.write(
        "10-teams.toml",
        &TEAMS.replace("github.*delete*", "github.[delete"),
    );
    dir.write(
        "20-idp.toml",
        "[[identity_providers]]\nname = \"x\"\naudiences = [\"q\"]\nrules = []\n\n\
         [[identity_providers]]\nname = \"y\"\nissuer = \"http://idp.example.com\"\naudiences = [\"q\"]\n\
         rules = [{ claim = \"groups\", contains = \"a\", equals = \"b\", policy = \"p\" }]\n",
    );
    dir.write("30-syntax.toml", "[policies.a\n");
    dir.write(
        "40-shape.json",
        r#"{"policies": ["a"], "identity_providers": {}}"#,
    );
    dir.write("50-name.toml", "[policies.\"a b\"]\n");
    dir.write("60-ok.toml", "[policies.fine]\n");

    let err = scan(&dir.path, Strict).unwrap_err();
    let errors = invalid(&err);
    let fields: Vec<(&str, Vec<&str>)> = errors
        .iter()
        .map(|e| {
            (
                e.file.as_str(),
                e.fields.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(
        fields,
        [
            ("10-teams.toml", vec!["policies.team-a.tool_denylist[0]"]),
            (
                "20-idp.toml",
                vec![
                    "identity_providers[0].issuer",
                    "identity_providers[1].issuer"
                ]
            ),
            ("30-syntax.toml", vec![]),
            ("40-shape.json", vec!["identity_providers", "policies"]),
            ("50-name.toml", vec!["policies.a b"]),
        ]
    );
    let text = err.to_string();
    assert!(text.starts_with("5 invalid file(s): "), "{text}");
    assert!(
        text.contains(
            "policies.d/10-teams.toml: policies.team-a.tool_denylist[0]: invalid pattern \"github.[delete\""
        ),
        "{text}"
    );
    assert!(
        text.contains("identity_providers[0].issuer: missing required field"),
        "{text}"
    );
    assert!(
        errors[2].message.contains("toml syntax error"),
        "{errors:?}"
    );

    // Lenient: the valid file loads, the others are reported.
    let scanned = scan(&dir.path, Lenient).unwrap();
    assert_eq!(
        names(&scanned),
        [(AccessKind::Policy, "fine", "60-ok.toml", "policies.fine")]
    );
    assert_eq!(scanned.errors.len(), 5);

    // A rule's own error names the rule.
    dir.write(
        "20-idp.toml",
        "[[identity_providers]]\nname = \"y\"\nissuer = \"https://idp.example.com\"\naudiences = [\"q\"]\n\
         rules = [{ claim = \"groups\", contains = \"a\", equals = \"b\", policy = \"p\" }]\n",
    );
    let scanned = scan(&dir.path, Lenient).unwrap();
    let idp = scanned
        .errors
        .iter()
        .find(|e| e.file == "20-idp.toml")
        .unwrap();
    assert_eq!(idp.fields, ["identity_providers[0].rules[0].contains"]);
}

#[test]
fn unknown_fields_warn_when_lenient_and_fail_when_strict() {
    let dir = Dir::new();
    dir.write(
        "10-teams.toml",
        &(TEAMS
            .replace(
                "[policies.team-b]",
                "[policies.team-b]\ncolour = \"red\"\nbudgets = { max_iterations = 3, max_hops = 2 }",
            )
            .replace(
                "policy = \"team-b\" }",
                "policy = \"team-b\", weight = 2 }",
            )
            + "\n[[api_keys]]\nname = \"ci\"\n"),
    );

    let scanned = scan(&dir.path, Lenient).unwrap();
    assert!(scanned.errors.is_empty(), "{:?}", scanned.errors);
    assert_eq!(scanned.records.len(), 3);
    let mut warnings = scanned.warnings.clone();
    warnings.sort();
    assert_eq!(
        warnings,
        [
            "10-teams.toml: unknown field \"api_keys\" ignored",
            "10-teams.toml: unknown field \"identity_providers[0].rules[1].weight\" ignored",
            "10-teams.toml: unknown field \"policies.team-b.budgets.max_hops\" ignored",
            "10-teams.toml: unknown field \"policies.team-b.colour\" ignored",
        ]
    );
    let team_b = scanned
        .records
        .iter()
        .find(|r| r.spec.name() == "team-b")
        .unwrap();
    let AccessSpec::Policy(team_b) = &team_b.spec else {
        panic!("a policy");
    };
    assert_eq!(team_b.policy.budgets.max_iterations, Some(3));

    let err = scan(&dir.path, Strict).unwrap_err();
    let mut fields = invalid(&err)[0].fields.clone();
    fields.sort();
    assert_eq!(
        fields,
        [
            "api_keys",
            "identity_providers[0].rules[1].weight",
            "policies.team-b.budgets.max_hops",
            "policies.team-b.colour",
        ]
    );
}

#[test]
fn a_name_or_issuer_defined_twice_is_an_error_naming_both_files() {
    let dir = Dir::new();
    dir.write("10-teams.toml", TEAMS);
    dir.write(
        "20-again.toml",
        "[policies.team-a]\n\n[[identity_providers]]\nname = \"other\"\n\
         issuer = \"https://idp.example.com\"\naudiences = [\"q\"]\n\
         rules = [{ claim = \"sub\", equals = \"x\", roles = [\"viewer\"] }]\n",
    );
    dir.write(
        "30-twice.toml",
        "[[identity_providers]]\nname = \"solo\"\nissuer = \"https://solo.example.com\"\naudiences = [\"q\"]\n\
         rules = [{ claim = \"sub\", equals = \"x\", roles = [\"viewer\"] }]\n\n\
         [[identity_providers]]\nname = \"solo\"\nissuer = \"https://solo2.example.com\"\naudiences = [\"q\"]\n\
         rules = [{ claim = \"sub\", equals = \"x\", roles = [\"viewer\"] }]\n",
    );

    let scanned = scan(&dir.path, Lenient).unwrap();
    assert_eq!(scanned.files, ["10-teams.toml"]);
    let again = &scanned.errors[0];
    assert_eq!(again.file, "20-again.toml");
    assert_eq!(
        again.fields,
        ["identity_providers[0].issuer", "policies.team-a"]
    );
    assert!(
        again.message.contains(
            "policies.team-a: policy \"team-a\" is already defined by 10-teams.toml (policies.team-a)"
        ),
        "{}",
        again.message
    );
    assert!(
        again
            .message
            .contains("identity provider \"corp\" of 10-teams.toml (identity_providers[0]) has this issuer already"),
        "{}",
        again.message
    );
    let twice = &scanned.errors[1];
    assert_eq!(twice.fields, ["identity_providers[1].name"]);
    assert!(
        twice
            .message
            .contains("is already defined by identity_providers[0] in this file"),
        "{}",
        twice.message
    );
}

#[tokio::test]
async fn rescans_follow_the_ownership_rules() {
    let dir = Dir::new();
    let store = store().await;
    dir.write("10-teams.toml", TEAMS);
    dir.write("20-ops.toml", "[policies.ops]\nallowed_server_ids = []\n");

    let report = reconcile_lenient(&store, &dir.path).await;
    assert_eq!((report.created, report.updated), (4, 0));
    assert_eq!(
        stored(&store, AccessKind::Policy, "team-a").await,
        Some((Source::File("10-teams.toml".into()), 2))
    );
    assert_eq!(
        stored(&store, AccessKind::IdentityProvider, "corp").await,
        Some((Source::File("10-teams.toml".into()), 4)),
        "providers are written after the policies they name"
    );

    // Nothing changed: no revision.
    let report = reconcile_lenient(&store, &dir.path).await;
    assert_eq!((report.unchanged, report.created), (4, 0));
    assert_eq!(head(&store).await, 4);

    // An admin edit takes team-b over: rescans leave it alone.
    admin_put(&store, policy("team-b", &["example", "github"])).await;
    dir.write(
        "10-teams.toml",
        &TEAMS.replace("\"example\"]", "\"other\"]"),
    );
    let scanned = scan(&dir.path, Lenient).unwrap();
    let planned = plan(&store, &scanned).await.unwrap();
    let skipped = planned
        .actions
        .iter()
        .find(|a| a.name() == "team-b")
        .unwrap();
    assert_eq!(
        skipped,
        &AccessAction::Skipped {
            kind: AccessKind::Policy,
            name: "team-b".into(),
            file: "10-teams.toml".into(),
            reason: "policy team-b is managed by admin; 10-teams.toml ignored".into(),
        }
    );
    let report = apply(&store, &planned, "policies.d").await.unwrap();
    assert_eq!((report.skipped, report.updated), (1, 0));
    assert_eq!(
        stored(&store, AccessKind::Policy, "team-b").await,
        Some((Source::Admin, 5))
    );

    // A changed file updates; a removed file deletes what it still owns.
    dir.write(
        "10-teams.toml",
        &TEAMS.replace("github.*delete*", "github.*remove*"),
    );
    dir.remove("20-ops.toml");
    let scanned = scan(&dir.path, Lenient).unwrap();
    let planned = plan(&store, &scanned).await.unwrap();
    let text = planned.render();
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
        text.contains("- delete policy ops (file 20-ops.toml removed)"),
        "{text}"
    );
    assert!(text.contains("\n-[policies.ops]\n"), "{text}");
    assert!(
        text.ends_with(
            "plan against revision 5: 0 to create, 1 to update, 1 to delete, 1 unchanged, 1 skipped, 0 kept\n"
        ),
        "{text}"
    );
    let report = apply(&store, &planned, "policies.d").await.unwrap();
    assert_eq!((report.updated, report.deleted), (1, 1), "{report}");
    assert_eq!(stored(&store, AccessKind::Policy, "ops").await, None);

    // A file that becomes invalid keeps its records.
    dir.write(
        "10-teams.toml",
        &TEAMS.replace("github.*delete*", "github.[x"),
    );
    let (scanned, report) = reconcile(&store, &dir.path, Lenient, "policies.d")
        .await
        .unwrap();
    assert_eq!(scanned.errors.len(), 1);
    assert_eq!((report.deleted, report.kept), (0, 2), "{report}");

    // Its file removed, the provider goes before the policies it names;
    // team-b stays the admin's.
    dir.remove("10-teams.toml");
    let report = reconcile_lenient(&store, &dir.path).await;
    assert_eq!(report.deleted, 2, "{report}");
    assert_eq!(
        stored(&store, AccessKind::IdentityProvider, "corp").await,
        None
    );
    assert_eq!(stored(&store, AccessKind::Policy, "team-a").await, None);
    assert_eq!(
        stored(&store, AccessKind::Policy, "team-b").await,
        Some((Source::Admin, 5))
    );
}

#[tokio::test]
async fn references_the_store_would_refuse_are_planned_around() {
    let dir = Dir::new();
    let store = store().await;
    dir.write("10-teams.toml", TEAMS);
    reconcile_lenient(&store, &dir.path).await;
    // Keys and admin providers name file policies.
    admin_put(
        &store,
        AccessSpec::ApiKey(ApiKeyRecord {
            id: "0123456789abcdef".into(),
            name: "ci".into(),
            policy: "team-a".into(),
            roles: vec![],
            expires_at: None,
            key_sha256: "a".repeat(64),
        }),
    )
    .await;
    admin_put(
        &store,
        AccessSpec::IdentityProvider(IdentityProviderRecord {
            name: "partner".into(),
            issuer: "https://partner.example.com".into(),
            audiences: vec!["quiver".into()],
            rules: vec![ClaimRule {
                claim: "sub".into(),
                equals: Some("x".into()),
                policy: Some("team-b".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
    )
    .await;

    // The file drops both policies, and its provider now names a policy
    // nothing defines and the partner's issuer.
    dir.write(
        "10-teams.toml",
        "[[identity_providers]]\nname = \"corp\"\nissuer = \"https://partner.example.com\"\n\
         audiences = [\"quiver\"]\nrules = [{ claim = \"groups\", contains = \"x\", policy = \"nobody\" }]\n",
    );
    let scanned = scan(&dir.path, Strict).unwrap();
    let planned = plan(&store, &scanned).await.unwrap();
    let text = planned.render();
    assert!(
        text.contains("! skipped identity_provider corp (10-teams.toml): identity_providers[0].rules[0].policy: no such policy \"nobody\""),
        "{text}"
    );
    assert!(
        text.contains("! kept policy team-a (10-teams.toml): still used by api_key:0123456789abcdef, identity_provider:corp"),
        "{text}"
    );
    assert!(
        text.contains("! kept policy team-b (10-teams.toml): still used by identity_provider:corp, identity_provider:partner"),
        "{text}"
    );
    let before = head(&store).await;
    let report = apply(&store, &planned, "policies.d").await.unwrap();
    assert!(report.failed.is_empty(), "{report}");
    assert_eq!(
        head(&store).await,
        before,
        "nothing the store refuses is tried"
    );

    // Naming a policy again, only the issuer is in the way.
    dir.write(
        "10-teams.toml",
        &TEAMS.replace("idp.example.com", "partner.example.com"),
    );
    let planned = plan(&store, &scan(&dir.path, Strict).unwrap())
        .await
        .unwrap();
    assert!(
        planned.render().contains(
            "identity_providers[0].issuer: identity provider \"partner\" has this issuer already"
        ),
        "{}",
        planned.render()
    );
}

#[tokio::test]
async fn a_provider_stops_naming_a_policy_the_same_rescan_deletes() {
    let dir = Dir::new();
    let store = store().await;
    dir.write("10-teams.toml", TEAMS);
    reconcile_lenient(&store, &dir.path).await;

    // Deleting team-b first would be refused (corp still names it): the
    // provider is written before the policy goes.
    dir.write(
        "10-teams.toml",
        &TEAMS
            .replace(
                "  { claim = \"groups\", contains = \"team-b\", policy = \"team-b\" },\n",
                "",
            )
            .replace(
                "[policies.team-b]\nallowed_server_ids = [\"example\"]\n",
                "",
            ),
    );
    let report = reconcile_lenient(&store, &dir.path).await;
    assert_eq!((report.updated, report.deleted), (1, 1), "{report}");
    assert_eq!(stored(&store, AccessKind::Policy, "team-b").await, None);
}

#[tokio::test]
async fn the_shipped_example_loads_strictly() {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/policies.d");
    let scanned = scan(&shipped, Strict).unwrap();
    assert!(scanned.warnings.is_empty(), "{:?}", scanned.warnings);
    assert!(!scanned.records.is_empty());
    let store = store().await;
    let report = reconcile_lenient(&store, &shipped).await;
    assert_eq!(report.created, scanned.records.len());
}
