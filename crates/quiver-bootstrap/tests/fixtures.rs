//! Fixture directories scanned and reconciled into an in-memory SQLite store.

use std::fs;
use std::path::Path;

use quiver_bootstrap::{Action, BootstrapError, Scan, apply, plan, reconcile, scan};
use quiver_model::{McpServerSpec, Source, StdioConfig, Strictness, Transport};
use quiver_store::{SqlStore, Store, UpsertRequest};
use tempfile::TempDir;

fn stdio_toml(id: &str, command: &str) -> String {
    format!(
        "server_id = \"{id}\"\ntransport = \"stdio\"\nallowed_tools = [\"*\"]\n\n[stdio]\ncommand = \"{command}\"\n"
    )
}

fn write(dir: &Path, name: &str, text: &str) {
    fs::write(dir.join(name), text).unwrap();
}

fn ids(scan: &Scan) -> Vec<&str> {
    scan.records
        .iter()
        .map(|r| r.spec.server_id.as_str())
        .collect()
}

fn command(spec: &McpServerSpec) -> &str {
    &spec.stdio.as_ref().unwrap().command
}

async fn store() -> SqlStore {
    SqlStore::open_sqlite("sqlite::memory:").await.unwrap()
}

async fn head(store: &SqlStore) -> u64 {
    store.head().await.unwrap().revision
}

async fn admin_upsert(store: &SqlStore, id: &str, command: &str) {
    let mut spec = McpServerSpec::new(id, Transport::Stdio);
    spec.stdio = Some(StdioConfig {
        command: command.into(),
        ..Default::default()
    });
    store
        .upsert(UpsertRequest {
            spec,
            expected_revision: None,
            actor: "admin-user".into(),
            source: Source::Admin,
        })
        .await
        .unwrap();
}

async fn reconcile_lenient(store: &SqlStore, dir: &Path) -> quiver_bootstrap::ApplyReport {
    reconcile(store, dir, Strictness::Lenient, "bootstrap")
        .await
        .unwrap()
        .1
}

#[test]
fn hidden_backup_swap_tmp_and_other_files_are_ignored() {
    let dir = TempDir::new().unwrap();
    let d = dir.path();
    write(d, "10-fs.toml", &stdio_toml("fs", "fs-server"));
    write(d, ".hidden.toml", &stdio_toml("hidden", "x"));
    write(d, "a.toml~", &stdio_toml("backup", "x"));
    write(d, "b.toml.swp", &stdio_toml("swap", "x"));
    write(d, "c.tmp", &stdio_toml("tmp", "x"));
    write(d, "readme.md", "# not a record\n");
    // Not recursive: a directory, even one named like a record file, is skipped.
    fs::create_dir(d.join("sub.toml")).unwrap();
    write(
        &d.join("sub.toml"),
        "20-nested.toml",
        &stdio_toml("nested", "x"),
    );

    let scanned = scan(d, Strictness::Strict).unwrap();
    assert_eq!(ids(&scanned), ["fs"]);
    assert_eq!(scanned.records[0].file, "10-fs.toml");
    assert_eq!(scanned.files, ["10-fs.toml"]);
    assert!(scanned.errors.is_empty(), "{:?}", scanned.errors);
    assert!(scanned.warnings.is_empty(), "{:?}", scanned.warnings);
}

#[cfg(unix)]
#[tokio::test]
async fn symlinks_are_skipped_with_a_warning() {
    let dir = TempDir::new().unwrap();
    let outside = TempDir::new().unwrap();
    write(outside.path(), "target.toml", &stdio_toml("linked", "x"));
    std::os::unix::fs::symlink(
        outside.path().join("target.toml"),
        dir.path().join("link.toml"),
    )
    .unwrap();
    write(dir.path(), "10-fs.toml", &stdio_toml("fs", "fs-server"));

    let scanned = scan(dir.path(), Strictness::Lenient).unwrap();
    assert_eq!(ids(&scanned), ["fs"]);
    assert!(scanned.errors.is_empty());
    assert_eq!(scanned.warnings.len(), 1, "{:?}", scanned.warnings);
    assert!(scanned.warnings[0].contains("link.toml"));
    assert!(scanned.warnings[0].contains("symlink"));

    let store = store().await;
    let report = reconcile_lenient(&store, dir.path()).await;
    assert_eq!(report.created, 1);
    assert!(store.get("linked").await.unwrap().is_none());
}

#[tokio::test]
async fn same_server_id_in_two_files_last_file_wins() {
    let dir = TempDir::new().unwrap();
    write(dir.path(), "10-a.toml", &stdio_toml("a", "first"));
    write(dir.path(), "20-a.toml", &stdio_toml("a", "second"));

    let scanned = scan(dir.path(), Strictness::Strict).unwrap();
    assert_eq!(ids(&scanned), ["a"]);
    assert_eq!(scanned.records[0].file, "20-a.toml");
    assert_eq!(command(&scanned.records[0].spec), "second");
    assert_eq!(
        scanned.warnings,
        ["server_id \"a\" in 20-a.toml overrides 10-a.toml"]
    );
    assert_eq!(scanned.files, ["10-a.toml", "20-a.toml"]);

    let store = store().await;
    reconcile_lenient(&store, dir.path()).await;
    let stored = store.get("a").await.unwrap().unwrap();
    assert_eq!(command(&stored.spec), "second");
    assert_eq!(stored.source, Source::File("20-a.toml".into()));
}

#[test]
fn same_server_id_twice_in_one_file_is_an_error_for_that_file() {
    let dir = TempDir::new().unwrap();
    let text = format!(
        "[[servers]]\n{}\n[[servers]]\n{}",
        stdio_toml("a", "x").replace("[stdio]", "[servers.stdio]"),
        stdio_toml("a", "y").replace("[stdio]", "[servers.stdio]")
    );
    write(dir.path(), "10-twice.toml", &text);
    write(dir.path(), "20-b.toml", &stdio_toml("b", "x"));

    let scanned = scan(dir.path(), Strictness::Lenient).unwrap();
    assert_eq!(ids(&scanned), ["b"]);
    assert_eq!(scanned.errors.len(), 1);
    let error = &scanned.errors[0];
    assert_eq!(error.file, "10-twice.toml");
    assert_eq!(error.fields, ["servers[1].server_id"]);
    assert!(error.to_string().contains("10-twice.toml"), "{error}");
    assert!(
        error.to_string().contains("servers[1].server_id"),
        "{error}"
    );

    let err = scan(dir.path(), Strictness::Strict).unwrap_err();
    assert!(err.to_string().contains("10-twice.toml"), "{err}");
}

#[tokio::test]
async fn invalid_file_lenient_loads_the_rest_strict_writes_nothing() {
    let dir = TempDir::new().unwrap();
    write(dir.path(), "10-fs.toml", &stdio_toml("fs", "fs-server"));
    write(
        dir.path(),
        "20-bad.toml",
        &format!(
            "{}\n[budgets]\nmax_concurrency = 0\n",
            stdio_toml("bad", "x")
        ),
    );
    write(dir.path(), "30-git.toml", &stdio_toml("git", "git-server"));

    // Strict first, so the store is still empty afterwards.
    let store = store().await;
    let err = reconcile(&store, dir.path(), Strictness::Strict, "bootstrap")
        .await
        .unwrap_err();
    let BootstrapError::Invalid { errors, .. } = &err else {
        panic!("expected invalid files, got {err}");
    };
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].file, "20-bad.toml");
    assert_eq!(errors[0].fields, ["budgets.max_concurrency"]);
    assert!(err.to_string().contains("20-bad.toml"), "{err}");
    assert!(err.to_string().contains("budgets.max_concurrency"), "{err}");
    assert_eq!(head(&store).await, 0);
    assert!(store.list().await.unwrap().servers.is_empty());

    let (scanned, report) = reconcile(&store, dir.path(), Strictness::Lenient, "bootstrap")
        .await
        .unwrap();
    assert_eq!(ids(&scanned), ["fs", "git"]);
    assert_eq!(scanned.errors.len(), 1);
    let error = &scanned.errors[0];
    assert_eq!(error.file, "20-bad.toml");
    assert_eq!(error.fields, ["budgets.max_concurrency"]);
    let text = error.to_string();
    assert!(
        text.starts_with("20-bad.toml: budgets.max_concurrency: "),
        "{text}"
    );
    assert_eq!(report.created, 2);
    assert!(report.failed.is_empty());
    assert!(store.get("bad").await.unwrap().is_none());
    assert_eq!(head(&store).await, 2);
}

#[test]
fn syntax_and_encoding_errors_name_the_file() {
    let dir = TempDir::new().unwrap();
    write(dir.path(), "10-syntax.toml", "server_id = ");
    fs::write(
        dir.path().join("20-latin1.json"),
        b"{\"server_id\": \"caf\xe9\"}",
    )
    .unwrap();
    write(dir.path(), "30-ok.toml", &stdio_toml("ok", "x"));

    let scanned = scan(dir.path(), Strictness::Lenient).unwrap();
    assert_eq!(ids(&scanned), ["ok"]);
    let files: Vec<&str> = scanned.errors.iter().map(|e| e.file.as_str()).collect();
    assert_eq!(files, ["10-syntax.toml", "20-latin1.json"]);
    assert!(scanned.errors[0].message.contains("toml syntax error"));
    assert!(scanned.errors[1].message.contains("utf-8"));
}

#[test]
fn unknown_field_warns_when_lenient_and_fails_when_strict() {
    let dir = TempDir::new().unwrap();
    write(
        dir.path(),
        "10-fs.toml",
        &stdio_toml("fs", "fs-server").replace("allowed_tools", "colour = \"red\"\nallowed_tools"),
    );

    let scanned = scan(dir.path(), Strictness::Lenient).unwrap();
    assert_eq!(ids(&scanned), ["fs"]);
    assert!(scanned.errors.is_empty());
    assert_eq!(scanned.warnings.len(), 1, "{:?}", scanned.warnings);
    assert!(scanned.warnings[0].contains("10-fs.toml"));
    assert!(scanned.warnings[0].contains("colour"));

    let err = scan(dir.path(), Strictness::Strict).unwrap_err();
    let BootstrapError::Invalid { errors, .. } = &err else {
        panic!("expected invalid files, got {err}");
    };
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].file, "10-fs.toml");
    assert_eq!(errors[0].fields, ["colour"]);
    assert!(err.to_string().contains("10-fs.toml"), "{err}");
    assert!(err.to_string().contains("colour"), "{err}");
}

#[tokio::test]
async fn rescan_follows_the_ownership_rules() {
    let dir = TempDir::new().unwrap();
    let d = dir.path();
    let store = store().await;
    admin_upsert(&store, "admin-only", "admin-command").await;
    admin_upsert(&store, "owned", "admin-command").await;
    write(d, "10-fs.toml", &stdio_toml("fs", "old"));
    write(d, "20-gone.toml", &stdio_toml("gone", "x"));
    write(d, "30-owned.toml", &stdio_toml("owned", "file-command"));

    // First scan: files create their records; the admin record wins over its file.
    let report = reconcile_lenient(&store, d).await;
    assert_eq!(
        (
            report.created,
            report.updated,
            report.deleted,
            report.skipped
        ),
        (2, 0, 0, 1)
    );
    assert!(report.failed.is_empty(), "{report}");
    let owned = store.get("owned").await.unwrap().unwrap();
    assert_eq!(owned.source, Source::Admin);
    assert_eq!(command(&owned.spec), "admin-command");
    let fs_record = store.get("fs").await.unwrap().unwrap();
    assert_eq!(fs_record.source, Source::File("10-fs.toml".into()));
    assert_eq!(head(&store).await, 4);

    let scanned = scan(d, Strictness::Lenient).unwrap();
    let planned = plan(&store, &scanned).await.unwrap();
    let skipped = planned
        .actions
        .iter()
        .find(|a| a.server_id() == "owned")
        .unwrap();
    let Action::Skipped { file, reason, .. } = skipped else {
        panic!("expected skipped, got {skipped:?}");
    };
    assert_eq!(file, "30-owned.toml");
    assert_eq!(
        reason,
        "server_id owned is managed by admin; 30-owned.toml ignored"
    );

    // No change: everything unchanged, no new revision.
    let report = reconcile_lenient(&store, d).await;
    assert_eq!(
        (
            report.created,
            report.updated,
            report.deleted,
            report.unchanged,
            report.skipped
        ),
        (0, 0, 0, 2, 1)
    );
    assert_eq!(head(&store).await, 4);

    // A changed file updates its record with one new revision; a removed file
    // deletes its record; the admin record stays untouched.
    write(d, "10-fs.toml", &stdio_toml("fs", "new"));
    fs::remove_file(d.join("20-gone.toml")).unwrap();
    let report = reconcile_lenient(&store, d).await;
    assert_eq!(
        (
            report.created,
            report.updated,
            report.deleted,
            report.unchanged
        ),
        (0, 1, 1, 0)
    );
    assert_eq!(head(&store).await, 6);
    let fs_record = store.get("fs").await.unwrap().unwrap();
    assert_eq!(command(&fs_record.spec), "new");
    assert_eq!(store.history("fs").await.unwrap().len(), 2);
    assert!(store.get("gone").await.unwrap().is_none());
    let admin_only = store.get("admin-only").await.unwrap().unwrap();
    assert_eq!(admin_only.source, Source::Admin);
    assert_eq!(admin_only.revision, 1);

    // A file that becomes invalid keeps its records.
    write(
        d,
        "10-fs.toml",
        &format!(
            "{}\n[budgets]\nmax_concurrency = 0\n",
            stdio_toml("fs", "new")
        ),
    );
    let (scanned, report) = reconcile(&store, d, Strictness::Lenient, "bootstrap")
        .await
        .unwrap();
    assert_eq!(scanned.errors.len(), 1);
    assert_eq!(scanned.errors[0].file, "10-fs.toml");
    assert_eq!((report.deleted, report.kept), (0, 1));
    assert_eq!(head(&store).await, 6);
    assert_eq!(
        store.get("fs").await.unwrap().unwrap().revision,
        fs_record.revision
    );

    // Fixed again: nothing to do.
    write(d, "10-fs.toml", &stdio_toml("fs", "new"));
    let report = reconcile_lenient(&store, d).await;
    assert_eq!((report.unchanged, report.kept), (1, 0));
    assert_eq!(head(&store).await, 6);
}

#[tokio::test]
async fn record_moving_to_another_file_changes_its_source() {
    let dir = TempDir::new().unwrap();
    let store = store().await;
    write(dir.path(), "10-fs.toml", &stdio_toml("fs", "x"));
    reconcile_lenient(&store, dir.path()).await;

    fs::rename(dir.path().join("10-fs.toml"), dir.path().join("15-fs.toml")).unwrap();
    let scanned = scan(dir.path(), Strictness::Lenient).unwrap();
    let planned = plan(&store, &scanned).await.unwrap();
    assert!(
        planned
            .render()
            .contains("~ update fs (15-fs.toml, was file:10-fs.toml)"),
        "{}",
        planned.render()
    );
    let report = apply(&store, &planned, "bootstrap").await.unwrap();
    assert_eq!((report.updated, report.deleted), (1, 0));
    let stored = store.get("fs").await.unwrap().unwrap();
    assert_eq!(stored.source, Source::File("15-fs.toml".into()));
    assert_eq!(stored.revision, 2);
}

#[tokio::test]
async fn record_dropped_from_a_valid_file_is_deleted() {
    let dir = TempDir::new().unwrap();
    let store = store().await;
    let pair = "[[servers]]\nserver_id = \"a\"\ntransport = \"stdio\"\nstdio = { command = \"x\" }\n\n\
                [[servers]]\nserver_id = \"b\"\ntransport = \"stdio\"\nstdio = { command = \"y\" }\n";
    write(dir.path(), "40-pair.toml", pair);
    reconcile_lenient(&store, dir.path()).await;

    write(dir.path(), "40-pair.toml", &stdio_toml("a", "x"));
    let scanned = scan(dir.path(), Strictness::Lenient).unwrap();
    let planned = plan(&store, &scanned).await.unwrap();
    assert!(
        planned
            .render()
            .contains("- delete b (no longer declared by 40-pair.toml)"),
        "{}",
        planned.render()
    );
    let report = apply(&store, &planned, "bootstrap").await.unwrap();
    assert_eq!(report.deleted, 1);
    assert!(store.get("b").await.unwrap().is_none());
    assert!(store.get("a").await.unwrap().is_some());
}

#[tokio::test]
async fn invalid_owning_file_that_takes_precedence_keeps_its_record() {
    let dir = TempDir::new().unwrap();
    let store = store().await;
    write(dir.path(), "10-x.toml", &stdio_toml("x", "early"));
    write(dir.path(), "20-x.toml", &stdio_toml("x", "late"));
    reconcile_lenient(&store, dir.path()).await;
    assert_eq!(
        command(&store.get("x").await.unwrap().unwrap().spec),
        "late"
    );

    // A typo in the winning file must not hand the record to the losing one.
    write(dir.path(), "20-x.toml", "server_id = ");
    let scanned = scan(dir.path(), Strictness::Lenient).unwrap();
    let planned = plan(&store, &scanned).await.unwrap();
    let [Action::Skipped { file, reason, .. }] = planned.actions.as_slice() else {
        panic!("expected one skip, got {:?}", planned.actions);
    };
    assert_eq!(file, "10-x.toml");
    assert!(reason.contains("20-x.toml"), "{reason}");
    let before = head(&store).await;
    apply(&store, &planned, "bootstrap").await.unwrap();
    assert_eq!(head(&store).await, before);
    assert_eq!(
        command(&store.get("x").await.unwrap().unwrap().spec),
        "late"
    );
}

#[tokio::test]
async fn dry_run_renders_a_diff_and_writes_nothing() {
    let dir = TempDir::new().unwrap();
    let d = dir.path();
    let store = store().await;
    write(d, "10-fs.toml", &stdio_toml("fs", "old"));
    write(d, "30-old.toml", &stdio_toml("old", "x"));
    write(d, "40-same.toml", &stdio_toml("same", "x"));
    reconcile_lenient(&store, d).await;
    admin_upsert(&store, "admin", "x").await;
    let before = head(&store).await;

    write(d, "10-fs.toml", &stdio_toml("fs", "new"));
    write(d, "20-web.toml", &stdio_toml("web", "web-server"));
    write(d, "50-admin.toml", &stdio_toml("admin", "y"));
    fs::remove_file(d.join("30-old.toml")).unwrap();
    let scanned = scan(d, Strictness::Lenient).unwrap();
    let planned = plan(&store, &scanned).await.unwrap();
    let text = planned.render();

    assert_eq!(planned.revision, before);
    assert!(text.contains("+ create web (20-web.toml)\n"), "{text}");
    assert!(text.contains("\n+server_id = \"web\"\n"), "{text}");
    assert!(text.contains("\n+command = \"web-server\"\n"), "{text}");
    assert!(text.contains("~ update fs (10-fs.toml)\n"), "{text}");
    assert!(text.contains("\n-command = \"old\"\n"), "{text}");
    assert!(text.contains("\n+command = \"new\"\n"), "{text}");
    assert!(text.contains("\n@@ "), "{text}");
    assert!(
        text.contains("- delete old (file 30-old.toml removed)\n"),
        "{text}"
    );
    assert!(text.contains("= unchanged same (40-same.toml)\n"), "{text}");
    assert!(
        text.contains(
            "! skipped admin (50-admin.toml): server_id admin is managed by admin; 50-admin.toml ignored\n"
        ),
        "{text}"
    );
    assert!(
        text.ends_with(&format!(
            "plan against revision {before}: 1 to create, 1 to update, 1 to delete, 1 unchanged, 1 skipped, 0 kept\n"
        )),
        "{text}"
    );
    assert_eq!(head(&store).await, before);
    assert!(store.get("web").await.unwrap().is_none());
    assert!(store.get("old").await.unwrap().is_some());
}

#[tokio::test]
async fn concurrent_admin_edit_between_plan_and_apply_is_a_conflict() {
    let dir = TempDir::new().unwrap();
    let store = store().await;
    write(dir.path(), "10-fs.toml", &stdio_toml("fs", "old"));
    reconcile_lenient(&store, dir.path()).await;

    write(dir.path(), "10-fs.toml", &stdio_toml("fs", "new"));
    write(dir.path(), "20-web.toml", &stdio_toml("web", "x"));
    let scanned = scan(dir.path(), Strictness::Lenient).unwrap();
    let planned = plan(&store, &scanned).await.unwrap();
    admin_upsert(&store, "fs", "admin-edit").await;

    let report = apply(&store, &planned, "bootstrap").await.unwrap();
    assert_eq!(report.created, 1);
    assert_eq!(report.updated, 0);
    assert_eq!(report.failed.len(), 1);
    assert_eq!(report.failed[0].0, "fs");
    assert!(report.failed[0].1.contains("conflict"), "{report}");
    assert!(report.to_string().contains("1 failed (fs: "), "{report}");
    let stored = store.get("fs").await.unwrap().unwrap();
    assert_eq!(command(&stored.spec), "admin-edit");
    assert_eq!(stored.source, Source::Admin);
}

#[tokio::test]
async fn servers_list_file_loads_every_record_with_that_file_as_source() {
    let dir = TempDir::new().unwrap();
    let text = "[[servers]]\nserver_id = \"a\"\ntransport = \"stdio\"\nstdio = { command = \"x\" }\n\n\
                [[servers]]\nserver_id = \"b\"\ntransport = \"streamable_http\"\nhttp = { url = \"http://127.0.0.1:9/mcp\" }\n";
    write(dir.path(), "40-pair.toml", text);
    let scanned = scan(dir.path(), Strictness::Strict).unwrap();
    assert_eq!(ids(&scanned), ["a", "b"]);
    assert!(scanned.records.iter().all(|r| r.file == "40-pair.toml"));

    let store = store().await;
    let report = reconcile_lenient(&store, dir.path()).await;
    assert_eq!(report.created, 2);
    for id in ["a", "b"] {
        let stored = store.get(id).await.unwrap().unwrap();
        assert_eq!(stored.source, Source::File("40-pair.toml".into()));
        assert_eq!(stored.updated_by, "bootstrap");
    }
}

#[tokio::test]
async fn json_file_loads() {
    let dir = TempDir::new().unwrap();
    write(
        dir.path(),
        "30-web.json",
        r#"{"server_id": "web", "transport": "streamable_http", "http": {"url": "https://example.com/mcp"}, "allowed_tools": ["search*"]}"#,
    );
    let scanned = scan(dir.path(), Strictness::Strict).unwrap();
    assert_eq!(ids(&scanned), ["web"]);

    let store = store().await;
    reconcile_lenient(&store, dir.path()).await;
    let stored = store.get("web").await.unwrap().unwrap();
    assert_eq!(stored.source, Source::File("30-web.json".into()));
    assert_eq!(stored.spec.transport, Transport::StreamableHttp);
    assert_eq!(stored.spec.allowed_tools, ["search*"]);
}

#[test]
fn missing_directory_is_an_io_error_naming_it() {
    let dir = TempDir::new().unwrap();
    let missing = dir.path().join("mcp.d");
    let err = scan(&missing, Strictness::Lenient).unwrap_err();
    assert!(matches!(&err, BootstrapError::Io { path, .. } if path == &missing));
    assert!(err.to_string().contains("mcp.d"), "{err}");
}

/// A stdio record with the given `allowed_resources` and `allowed_prompts`
/// (TOML arrays as text).
fn content_toml(id: &str, resources: &str, prompts: &str) -> String {
    format!(
        "server_id = \"{id}\"\ntransport = \"stdio\"\nallowed_resources = {resources}\nallowed_prompts = {prompts}\n\n[stdio]\ncommand = \"docs-server\"\n"
    )
}

#[tokio::test]
async fn resource_and_prompt_lists_load_plan_and_refuse_bad_patterns() {
    let dir = TempDir::new().unwrap();
    let d = dir.path();
    let store = store().await;
    write(
        d,
        "10-docs.toml",
        &content_toml(
            "docs",
            r#"["file:///data/*.md", "ui://*"]"#,
            r#"["summarize*"]"#,
        ),
    );
    let scanned = scan(d, Strictness::Strict).unwrap();
    assert_eq!(
        scanned.records[0].spec.allowed_resources,
        ["file:///data/*.md", "ui://*"]
    );
    let report = reconcile_lenient(&store, d).await;
    assert_eq!(report.created, 1);
    let stored = store.get("docs").await.unwrap().unwrap();
    assert_eq!(stored.spec.allowed_prompts, ["summarize*"]);

    // The same file again is unchanged; another prompt list is an update
    // whose diff shows that list.
    let planned = plan(&store, &scan(d, Strictness::Strict).unwrap())
        .await
        .unwrap();
    assert!(
        matches!(planned.actions.as_slice(), [Action::Unchanged { .. }]),
        "{}",
        planned.render()
    );
    write(
        d,
        "10-docs.toml",
        &content_toml(
            "docs",
            r#"["file:///data/*.md", "ui://*"]"#,
            r#"["summarize*", "greet"]"#,
        ),
    );
    let planned = plan(&store, &scan(d, Strictness::Strict).unwrap())
        .await
        .unwrap();
    let text = planned.render();
    assert!(text.contains("~ update docs (10-docs.toml)\n"), "{text}");
    let changed: Vec<&str> = text
        .lines()
        .filter(|l| (l.starts_with('+') || l.starts_with('-')) && !l.starts_with("+++"))
        .filter(|l| !l.starts_with("---"))
        .collect();
    assert!(
        changed
            .iter()
            .any(|l| l.starts_with('+') && l.contains("\"greet\"")),
        "{text}"
    );
    assert!(
        changed.iter().all(|l| !l.contains("ui://")),
        "the unchanged resource list is no part of the diff: {text}"
    );
    apply(&store, &planned, "bootstrap").await.unwrap();
    assert_eq!(
        store
            .get("docs")
            .await
            .unwrap()
            .unwrap()
            .spec
            .allowed_prompts,
        ["summarize*", "greet"]
    );

    // A malformed URI pattern names the file and the index; lenient keeps
    // the stored record, strict writes nothing.
    write(
        d,
        "10-docs.toml",
        &content_toml("docs", r#"["ui://*", "file:///my notes/*"]"#, "[]"),
    );
    let err = scan(d, Strictness::Strict).unwrap_err();
    let BootstrapError::Invalid { errors, .. } = &err else {
        panic!("expected invalid files, got {err}");
    };
    assert_eq!(errors[0].file, "10-docs.toml");
    assert_eq!(errors[0].fields, ["allowed_resources[1]"]);
    let before = head(&store).await;
    reconcile_lenient(&store, d).await;
    assert_eq!(head(&store).await, before);
    assert_eq!(
        store
            .get("docs")
            .await
            .unwrap()
            .unwrap()
            .spec
            .allowed_prompts,
        ["summarize*", "greet"]
    );
}

#[tokio::test]
async fn shipped_examples_load_strictly() {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/mcp.d");
    let scanned = scan(&shipped, Strictness::Strict).unwrap();
    assert!(scanned.warnings.is_empty(), "{:?}", scanned.warnings);
    let legacy = scanned
        .records
        .iter()
        .find(|r| r.spec.server_id == "legacy-sse")
        .expect("the legacy-sse example");
    assert!(!legacy.spec.allowed_resources.is_empty());
    assert!(!legacy.spec.allowed_prompts.is_empty());
    let report = reconcile_lenient(&store().await, &shipped).await;
    assert_eq!(report.created, scanned.records.len());
}
