//! One conformance suite, run unchanged against both backends: SQLite (a file
//! in a temporary directory) and PostgreSQL (a fresh database on the real
//! server of this machine, see `quiver_testkit::postgres`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use quiver_model::{ChangeKind, McpServerSpec, Source, StdioConfig, Transport};
use quiver_store::{
    DeleteRequest, HistoryPage, SqlStore, Store, StoreError, UpsertOutcome, UpsertRequest,
};
use quiver_testkit::postgres::TestDatabase;

/// A store plus whatever keeps its database alive, and a way to reopen it.
struct Fixture {
    store: Arc<SqlStore>,
    url: String,
    reopen: fn(String) -> futures_reopen::BoxFuture,
    _keep: Box<dyn std::any::Any + Send>,
}

mod futures_reopen {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Arc;

    pub type BoxFuture = Pin<Box<dyn Future<Output = Arc<quiver_store::SqlStore>> + Send>>;
}

impl Fixture {
    async fn reopen(&self) -> Arc<SqlStore> {
        (self.reopen)(self.url.clone()).await
    }
}

async fn sqlite() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("registry.db").display());
    fn open(url: String) -> futures_reopen::BoxFuture {
        Box::pin(async move { Arc::new(SqlStore::open_sqlite(&url).await.unwrap()) })
    }
    Fixture {
        store: open(url.clone()).await,
        url,
        reopen: open,
        _keep: Box::new(dir),
    }
}

async fn postgres() -> Fixture {
    let db = TestDatabase::create().await;
    let url = db.url().to_owned();
    fn open(url: String) -> futures_reopen::BoxFuture {
        Box::pin(async move { Arc::new(SqlStore::open_postgres(&url).await.unwrap()) })
    }
    Fixture {
        store: open(url.clone()).await,
        url,
        reopen: open,
        _keep: Box::new(db),
    }
}

fn spec(id: &str, command: &str) -> McpServerSpec {
    let mut spec = McpServerSpec::new(id, Transport::Stdio);
    spec.stdio = Some(StdioConfig {
        command: command.into(),
        ..Default::default()
    });
    spec.allowed_tools = vec!["*".into()];
    spec
}

fn upsert(spec: McpServerSpec) -> UpsertRequest {
    UpsertRequest {
        spec,
        expected_revision: None,
        actor: "tester".into(),
        source: Source::Api,
    }
}

fn delete(id: &str) -> DeleteRequest {
    DeleteRequest {
        server_id: id.into(),
        expected_revision: None,
        actor: "tester".into(),
        source: Source::Api,
    }
}

async fn empty_store(f: Fixture) {
    let head = f.store.head().await.unwrap();
    assert_eq!((head.revision, head.compaction_floor), (0, 0));
    let snapshot = f.store.list().await.unwrap();
    assert_eq!(snapshot.revision, 0);
    assert!(snapshot.servers.is_empty());
    assert!(f.store.get("nope").await.unwrap().is_none());
    assert!(f.store.changes_since(0, 10).await.unwrap().is_empty());
}

async fn create_update_and_read_back(f: Fixture) {
    let created = f.store.upsert(upsert(spec("fs", "npx"))).await.unwrap();
    let UpsertOutcome::Created(first) = created else {
        panic!("expected Created, got {created:?}");
    };
    assert_eq!(first.revision, 1);
    assert_eq!(first.updated_by, "tester");
    assert_eq!(first.source, Source::Api);
    assert_eq!(f.store.get("fs").await.unwrap().unwrap(), first);

    let mut changed = spec("fs", "uvx");
    changed.budgets.max_concurrency = 2;
    changed.labels.insert("team".into(), "infra".into());
    let updated = f.store.upsert(upsert(changed.clone())).await.unwrap();
    let UpsertOutcome::Updated(second) = updated else {
        panic!("expected Updated, got {updated:?}");
    };
    assert_eq!(second.revision, 2);
    assert_eq!(second.created_at, first.created_at);
    assert_eq!(second.spec, changed);

    let snapshot = f.store.list().await.unwrap();
    assert_eq!(snapshot.revision, 2);
    assert_eq!(snapshot.servers, vec![second.clone()]);

    let history = f.store.history("fs").await.unwrap();
    assert_eq!(
        history.iter().map(|h| h.revision).collect::<Vec<_>>(),
        [2, 1]
    );
    assert_eq!(history[0].spec.as_ref(), Some(&changed));
    assert_eq!(history[1].spec.as_ref(), Some(&first.spec));
    assert!(
        history
            .iter()
            .all(|h| h.kind == ChangeKind::Upsert && h.actor == "tester")
    );
}

async fn identical_upsert_is_a_no_op(f: Fixture) {
    f.store.upsert(upsert(spec("a", "x"))).await.unwrap();
    let again = f.store.upsert(upsert(spec("a", "x"))).await.unwrap();
    assert!(
        matches!(again, UpsertOutcome::Unchanged(ref s) if s.revision == 1),
        "{again:?}"
    );
    assert_eq!(f.store.head().await.unwrap().revision, 1);
    assert_eq!(f.store.history("a").await.unwrap().len(), 1);
    assert_eq!(f.store.changes_since(0, 10).await.unwrap().len(), 1);
}

async fn file_sources_adopt_identical_records(f: Fixture) {
    let from_file = |name: &str| UpsertRequest {
        source: Source::File(name.into()),
        ..upsert(spec("a", "x"))
    };
    f.store.upsert(from_file("10-a.toml")).await.unwrap();
    // Same content from another file: ownership moves, which is a change.
    let moved = f.store.upsert(from_file("20-a.toml")).await.unwrap();
    assert!(
        matches!(moved, UpsertOutcome::Updated(ref s) if s.revision == 2 && s.source == Source::File("20-a.toml".into()))
    );
    // Same content from an admin: no-op, the file keeps ownership.
    let admin = UpsertRequest {
        source: Source::Admin,
        ..upsert(spec("a", "x"))
    };
    let unchanged = f.store.upsert(admin).await.unwrap();
    assert!(
        matches!(unchanged, UpsertOutcome::Unchanged(ref s) if s.source == Source::File("20-a.toml".into()))
    );
}

async fn expected_revision_is_enforced(f: Fixture) {
    let must_not_exist = |spec| UpsertRequest {
        expected_revision: Some(0),
        ..upsert(spec)
    };
    f.store
        .upsert(must_not_exist(spec("a", "x")))
        .await
        .unwrap();
    let err = f
        .store
        .upsert(must_not_exist(spec("a", "y")))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Conflict {
                expected: 0,
                current: 1,
                ..
            }
        ),
        "{err}"
    );
    let stale = UpsertRequest {
        expected_revision: Some(7),
        ..upsert(spec("a", "y"))
    };
    assert!(matches!(
        f.store.upsert(stale).await.unwrap_err(),
        StoreError::Conflict {
            expected: 7,
            current: 1,
            ..
        }
    ));
    assert_eq!(
        f.store
            .get("a")
            .await
            .unwrap()
            .unwrap()
            .spec
            .stdio
            .unwrap()
            .command,
        "x"
    );
    assert_eq!(f.store.head().await.unwrap().revision, 1);

    let current = UpsertRequest {
        expected_revision: Some(1),
        ..upsert(spec("a", "y"))
    };
    assert_eq!(f.store.upsert(current).await.unwrap().server().revision, 2);
    let stale_delete = DeleteRequest {
        expected_revision: Some(1),
        ..delete("a")
    };
    assert!(matches!(
        f.store.delete(stale_delete).await.unwrap_err(),
        StoreError::Conflict {
            expected: 1,
            current: 2,
            ..
        }
    ));
    assert!(f.store.get("a").await.unwrap().is_some());
}

async fn delete_keeps_history(f: Fixture) {
    f.store.upsert(upsert(spec("a", "x"))).await.unwrap();
    assert_eq!(f.store.delete(delete("a")).await.unwrap(), 2);
    assert!(f.store.get("a").await.unwrap().is_none());
    assert!(matches!(
        f.store.delete(delete("a")).await.unwrap_err(),
        StoreError::NotFound(ref id) if id == "a"
    ));
    assert_eq!(
        f.store.head().await.unwrap().revision,
        2,
        "a failed delete takes no revision"
    );
    let history = f.store.history("a").await.unwrap();
    assert_eq!(history.len(), 2);
    assert_eq!(history[0].kind, ChangeKind::Delete);
    assert!(history[0].spec.is_none());
    // Re-creating after a delete is a fresh record with a new creation time.
    let again = f.store.upsert(upsert(spec("a", "x"))).await.unwrap();
    assert!(matches!(again, UpsertOutcome::Created(ref s) if s.revision == 3));
}

async fn invalid_records_are_rejected(f: Fixture) {
    let err = f.store.upsert(upsert(spec("a", " "))).await.unwrap_err();
    match err {
        StoreError::Invalid(err) => assert_eq!(err.field(), Some("stdio.command")),
        other => panic!("expected Invalid, got {other}"),
    }
    assert_eq!(f.store.head().await.unwrap().revision, 0);
}

async fn change_log_is_consecutive(f: Fixture) {
    for i in 0..5 {
        f.store
            .upsert(upsert(spec(&format!("s{i}"), "x")))
            .await
            .unwrap();
    }
    f.store.delete(delete("s1")).await.unwrap();
    let changes = f.store.changes_since(0, 100).await.unwrap();
    assert_eq!(
        changes.iter().map(|c| c.revision).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6]
    );
    assert_eq!(changes[5].kind, ChangeKind::Delete);
    assert_eq!(changes[5].server_id, "s1");
    let page = f.store.changes_since(2, 2).await.unwrap();
    assert_eq!(page.iter().map(|c| c.revision).collect::<Vec<_>>(), [3, 4]);
}

async fn compaction_moves_the_floor_only(f: Fixture) {
    for i in 0..6 {
        f.store
            .upsert(upsert(spec("a", &format!("cmd{i}"))))
            .await
            .unwrap();
    }
    let head = f.store.compact(4).await.unwrap();
    assert_eq!((head.revision, head.compaction_floor), (6, 4));
    let changes = f.store.changes_since(4, 100).await.unwrap();
    assert_eq!(
        changes.iter().map(|c| c.revision).collect::<Vec<_>>(),
        [5, 6]
    );
    assert!(
        f.store
            .changes_since(0, 100)
            .await
            .unwrap()
            .iter()
            .all(|c| c.revision > 4)
    );
    // The floor never moves back and never passes head.
    assert_eq!(f.store.compact(2).await.unwrap().compaction_floor, 4);
    assert_eq!(f.store.compact(100).await.unwrap().compaction_floor, 6);
    assert_eq!(f.store.head().await.unwrap().compaction_floor, 6);
    // History is never compacted.
    assert_eq!(f.store.history("a").await.unwrap().len(), 6);
}

async fn concurrent_writers_get_consecutive_revisions(f: Fixture) {
    const WRITERS: usize = 8;
    const PER_WRITER: usize = 25;
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let store = f.store.clone();
        tasks.push(tokio::spawn(async move {
            let mut revisions = Vec::new();
            for i in 0..PER_WRITER {
                let outcome = store
                    .upsert(upsert(spec(&format!("w{w}"), &format!("cmd{i}"))))
                    .await
                    .unwrap();
                revisions.push(outcome.server().revision);
            }
            revisions
        }));
    }
    let mut all = BTreeSet::new();
    for task in tasks {
        for revision in task.await.unwrap() {
            assert!(all.insert(revision), "revision {revision} handed out twice");
        }
    }
    let total = (WRITERS * PER_WRITER) as u64;
    assert_eq!(all, (1..=total).collect());
    let logged: Vec<u64> = f
        .store
        .changes_since(0, 10_000)
        .await
        .unwrap()
        .iter()
        .map(|c| c.revision)
        .collect();
    assert_eq!(logged, (1..=total).collect::<Vec<_>>());
}

async fn apply_takes_one_contiguous_range(f: Fixture) {
    f.store.upsert(upsert(spec("a", "x"))).await.unwrap();
    f.store.upsert(upsert(spec("b", "x"))).await.unwrap();
    let mut head = f.store.subscribe();
    let outcomes = f
        .store
        .apply(vec![
            upsert(spec("a", "changed")),
            upsert(spec("b", "x")),
            upsert(spec("c", "new")),
            UpsertRequest {
                expected_revision: Some(0),
                ..upsert(spec("d", "new"))
            },
        ])
        .await
        .unwrap();
    assert!(matches!(&outcomes[0], UpsertOutcome::Updated(s) if s.revision == 3));
    assert!(matches!(&outcomes[1], UpsertOutcome::Unchanged(s) if s.revision == 2));
    assert!(
        matches!(&outcomes[2], UpsertOutcome::Created(s) if s.revision == 4 && s.spec == spec("c", "new"))
    );
    assert!(matches!(&outcomes[3], UpsertOutcome::Created(s) if s.revision == 5));
    assert_eq!(
        f.store.get("c").await.unwrap().unwrap(),
        *outcomes[2].server()
    );
    assert_eq!(f.store.head().await.unwrap().revision, 5);
    // Every revision of the batch is in the change log (watchers see each).
    let changes = f.store.changes_since(2, 100).await.unwrap();
    assert_eq!(
        changes
            .iter()
            .map(|c| (c.revision, c.server_id.as_str()))
            .collect::<Vec<_>>(),
        [(3, "a"), (4, "c"), (5, "d")]
    );
    assert_eq!(f.store.history("a").await.unwrap().len(), 2);
    tokio::time::timeout(Duration::from_secs(5), head.wait_for(|r| *r >= 5))
        .await
        .expect("no head notification")
        .unwrap();
    // A batch that changes nothing takes no revision; an empty one is fine.
    let again = f
        .store
        .apply(vec![upsert(spec("a", "changed")), upsert(spec("c", "new"))])
        .await
        .unwrap();
    assert!(
        again
            .iter()
            .all(|o| matches!(o, UpsertOutcome::Unchanged(_)))
    );
    assert!(f.store.apply(Vec::new()).await.unwrap().is_empty());
    assert_eq!(f.store.head().await.unwrap().revision, 5);
}

async fn apply_is_all_or_nothing(f: Fixture) {
    f.store
        .apply(vec![upsert(spec("a", "x")), upsert(spec("b", "x"))])
        .await
        .unwrap();
    // A conflict on the third record: the first two are not written either.
    let err = f
        .store
        .apply(vec![
            upsert(spec("new1", "x")),
            upsert(spec("a", "changed")),
            UpsertRequest {
                expected_revision: Some(1),
                ..upsert(spec("b", "y"))
            },
        ])
        .await
        .unwrap_err();
    match &err {
        StoreError::InRecord { index: 2, source } => assert!(
            matches!(**source, StoreError::Conflict { expected: 1, current: 2, ref server_id } if server_id == "b"),
            "{source}"
        ),
        other => panic!("expected a conflict of record 2, got {other}"),
    }
    assert!(err.to_string().starts_with("record 2: "), "{err}");
    let unchanged = |store: Arc<SqlStore>| async move {
        assert_eq!(store.head().await.unwrap().revision, 2);
        let snapshot = store.list().await.unwrap();
        assert_eq!(
            snapshot
                .servers
                .iter()
                .map(|s| s.spec.clone())
                .collect::<Vec<_>>(),
            [spec("a", "x"), spec("b", "x")]
        );
        assert_eq!(store.changes_since(0, 100).await.unwrap().len(), 2);
    };
    unchanged(f.store.clone()).await;

    // Invalid records and repeated ids are refused before anything is written.
    let err = f
        .store
        .apply(vec![upsert(spec("new2", "x")), upsert(spec("bad", " "))])
        .await
        .unwrap_err();
    match &err {
        StoreError::InRecord { index: 1, source } => match &**source {
            StoreError::Invalid(err) => assert_eq!(err.field(), Some("stdio.command")),
            other => panic!("expected Invalid, got {other}"),
        },
        other => panic!("expected an invalid record 1, got {other}"),
    }
    let err = f
        .store
        .apply(vec![
            upsert(spec("new3", "x")),
            upsert(spec("new4", "x")),
            upsert(spec("new3", "y")),
        ])
        .await
        .unwrap_err();
    match &err {
        StoreError::InRecord { index: 2, source } => match &**source {
            StoreError::Invalid(err) => assert_eq!(err.field(), Some("server_id")),
            other => panic!("expected Invalid, got {other}"),
        },
        other => panic!("expected a repeated record 2, got {other}"),
    }
    unchanged(f.store.clone()).await;
}

/// 8 writers, half of them single upserts and half batches of 4, while a
/// reader checks that no revision is ever visible before every revision
/// below it (commit order) and, at the end, that revisions are 1…N without
/// a gap or a duplicate.
async fn concurrent_batches_keep_revisions_gap_free(f: Fixture) {
    const WRITERS: usize = 8;
    const ROUNDS: usize = 15;
    const BATCH: usize = 4;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let store = f.store.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut observations = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let logged = store.changes_since(0, 100_000).await.unwrap();
                for (i, change) in logged.iter().enumerate() {
                    assert_eq!(
                        change.revision,
                        i as u64 + 1,
                        "revision {} visible before an older one",
                        change.revision
                    );
                }
                observations += 1;
            }
            observations
        })
    };
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let store = f.store.clone();
        tasks.push(tokio::spawn(async move {
            let mut revisions = Vec::new();
            for round in 0..ROUNDS {
                if w % 2 == 0 {
                    let outcome = store
                        .upsert(upsert(spec(&format!("w{w}"), &format!("cmd{round}"))))
                        .await
                        .unwrap();
                    revisions.push(outcome.server().revision);
                } else {
                    let batch = (0..BATCH)
                        .map(|b| upsert(spec(&format!("w{w}-{b}"), &format!("cmd{round}"))))
                        .collect();
                    let outcomes = store.apply(batch).await.unwrap();
                    let batch_revisions: Vec<u64> =
                        outcomes.iter().map(|o| o.server().revision).collect();
                    let first = batch_revisions[0];
                    assert_eq!(
                        batch_revisions,
                        (first..first + BATCH as u64).collect::<Vec<_>>(),
                        "a batch's revisions are one contiguous range"
                    );
                    revisions.extend(batch_revisions);
                }
            }
            revisions
        }));
    }
    let mut all = BTreeSet::new();
    for task in tasks {
        for revision in task.await.unwrap() {
            assert!(all.insert(revision), "revision {revision} handed out twice");
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(reader.await.unwrap() > 0);
    let total = (WRITERS / 2 * ROUNDS + WRITERS / 2 * ROUNDS * BATCH) as u64;
    assert_eq!(all, (1..=total).collect());
    let logged: Vec<u64> = f
        .store
        .changes_since(0, 100_000)
        .await
        .unwrap()
        .iter()
        .map(|c| c.revision)
        .collect();
    assert_eq!(logged, (1..=total).collect::<Vec<_>>());
    assert_eq!(f.store.head().await.unwrap().revision, total);
}

async fn list_is_a_consistent_snapshot(f: Fixture) {
    // Revision r creates server r, so a snapshot at revision r holds exactly r servers.
    let writer = {
        let store = f.store.clone();
        tokio::spawn(async move {
            for i in 1..=60 {
                store
                    .upsert(upsert(spec(&format!("s{i:03}"), "x")))
                    .await
                    .unwrap();
            }
        })
    };
    let mut seen = 0;
    while !writer.is_finished() || seen == 0 {
        let snapshot = f.store.list().await.unwrap();
        assert_eq!(snapshot.servers.len() as u64, snapshot.revision);
        assert!(
            snapshot
                .servers
                .iter()
                .all(|s| s.revision <= snapshot.revision)
        );
        seen += 1;
    }
    writer.await.unwrap();
}

async fn subscribers_see_new_revisions(f: Fixture) {
    let mut head = f.store.subscribe();
    assert_eq!(*head.borrow_and_update(), 0);
    f.store.upsert(upsert(spec("a", "x"))).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), head.wait_for(|r| *r >= 1))
        .await
        .expect("no head notification")
        .unwrap();
}

async fn history_page_spans_records(f: Fixture) {
    let by = |actor: &str, request: UpsertRequest| UpsertRequest {
        actor: actor.into(),
        ..request
    };
    f.store
        .upsert(by("ann", upsert(spec("a", "x"))))
        .await
        .unwrap(); // 1
    f.store
        .upsert(by("bob", upsert(spec("b", "x"))))
        .await
        .unwrap(); // 2
    let mut changed = spec("a", "y");
    changed.budgets.max_concurrency = 3;
    f.store
        .upsert(by("bob", upsert(changed.clone())))
        .await
        .unwrap(); // 3
    f.store.delete(delete("b")).await.unwrap(); // 4
    let from_file = UpsertRequest {
        source: Source::File("10-b.toml".into()),
        ..by("mcp.d", upsert(spec("b", "z")))
    };
    f.store.upsert(from_file).await.unwrap(); // 5
    // The change log may be compacted; the history page is not affected.
    f.store.compact(5).await.unwrap();

    let revisions = |rows: &[quiver_store::HistoryRow]| {
        rows.iter().map(|r| r.entry.revision).collect::<Vec<_>>()
    };
    let newest = |server_id, limit| HistoryPage::Newest { server_id, limit };
    let after = |after, server_id, limit| HistoryPage::After {
        after,
        server_id,
        limit,
    };

    let all = f.store.history_page(newest(None, 10)).await.unwrap();
    assert_eq!(revisions(&all), [5, 4, 3, 2, 1]);
    let ids: Vec<&str> = all.iter().map(|r| r.server_id.as_str()).collect();
    assert_eq!(ids, ["b", "b", "a", "b", "a"]);
    let actors: Vec<&str> = all.iter().map(|r| r.entry.actor.as_str()).collect();
    assert_eq!(actors, ["mcp.d", "tester", "bob", "bob", "ann"]);
    // Each row carries the same record's previous row.
    let previous: Vec<Option<u64>> = all
        .iter()
        .map(|r| r.previous.as_ref().map(|p| p.revision))
        .collect();
    assert_eq!(previous, [Some(4), Some(2), Some(1), None, None]);
    assert_eq!(all[0].entry.source, Source::File("10-b.toml".into()));
    assert_eq!(all[0].previous.as_ref().unwrap().kind, ChangeKind::Delete);
    assert!(all[0].previous.as_ref().unwrap().spec.is_none());
    assert_eq!(all[1].entry.kind, ChangeKind::Delete);
    assert!(all[1].entry.spec.is_none());
    assert_eq!(all[2].entry.spec.as_ref(), Some(&changed));
    assert_eq!(
        all[2].previous.as_ref().unwrap().spec.as_ref(),
        Some(&spec("a", "x"))
    );
    assert_eq!(all[2].previous.as_ref().unwrap().actor, "ann");

    assert_eq!(
        revisions(&f.store.history_page(newest(None, 2)).await.unwrap()),
        [5, 4]
    );
    // Paging forward through everything, oldest first.
    let mut pages = Vec::new();
    let mut cursor = 0;
    loop {
        let page = f.store.history_page(after(cursor, None, 2)).await.unwrap();
        let Some(last) = page.last() else { break };
        cursor = last.entry.revision;
        pages.push(revisions(&page));
    }
    assert_eq!(pages, [vec![1, 2], vec![3, 4], vec![5]]);
    // One record only; its previous rows are found whatever the page holds.
    assert_eq!(
        revisions(&f.store.history_page(newest(Some("a"), 10)).await.unwrap()),
        [3, 1]
    );
    let b = f.store.history_page(after(2, Some("b"), 10)).await.unwrap();
    assert_eq!(revisions(&b), [4, 5]);
    assert_eq!(b[0].previous.as_ref().map(|p| p.revision), Some(2));
    assert!(
        f.store
            .history_page(newest(Some("nope"), 10))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        f.store
            .history_page(after(5, None, 10))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        f.store
            .history_page(newest(None, 0))
            .await
            .unwrap()
            .is_empty()
    );
}

/// Cursors beyond the signed 64-bit range the database stores revisions in
/// are input, not corruption: nothing lies after them.
async fn cursors_beyond_i64_find_nothing(f: Fixture) {
    f.store.upsert(upsert(spec("a", "x"))).await.unwrap();
    for cursor in [i64::MAX as u64, i64::MAX as u64 + 1, u64::MAX] {
        let page = f
            .store
            .history_page(HistoryPage::After {
                after: cursor,
                server_id: None,
                limit: 10,
            })
            .await;
        assert!(page.unwrap().is_empty(), "history after {cursor}");
        let changes = f.store.changes_since(cursor, 10).await;
        assert!(changes.unwrap().is_empty(), "changes after {cursor}");
    }
}

async fn data_survives_reopen(f: Fixture) {
    f.store.upsert(upsert(spec("a", "x"))).await.unwrap();
    f.store.upsert(upsert(spec("b", "x"))).await.unwrap();
    f.store.delete(delete("a")).await.unwrap();
    let reopened = f.reopen().await;
    assert_eq!(reopened.head().await.unwrap().revision, 3);
    assert_eq!(reopened.list().await.unwrap().servers.len(), 1);
    let next = reopened.upsert(upsert(spec("c", "x"))).await.unwrap();
    assert_eq!(next.server().revision, 4);
}

macro_rules! conformance_suite {
    ($backend:ident: $($test:ident),* $(,)?) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $test() {
                    super::$test(super::$backend().await).await;
                }
            )*
        }
    };
}

macro_rules! conformance {
    ($($backend:ident),*) => {
        $(
            conformance_suite!($backend:
                empty_store,
                create_update_and_read_back,
                identical_upsert_is_a_no_op,
                file_sources_adopt_identical_records,
                expected_revision_is_enforced,
                delete_keeps_history,
                invalid_records_are_rejected,
                change_log_is_consecutive,
                compaction_moves_the_floor_only,
                concurrent_writers_get_consecutive_revisions,
                apply_takes_one_contiguous_range,
                apply_is_all_or_nothing,
                concurrent_batches_keep_revisions_gap_free,
                list_is_a_consistent_snapshot,
                subscribers_see_new_revisions,
                history_page_spans_records,
                cursors_beyond_i64_find_nothing,
                data_survives_reopen,
            );
        )*
    };
}

conformance!(sqlite, postgres);

/// Only PostgreSQL can be shared between processes: a change committed through
/// one store reaches the subscribers of another store on the same database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_changes_reach_other_stores() {
    let f = postgres().await;
    let other = f.reopen().await;
    let mut head = other.subscribe();
    f.store.upsert(upsert(spec("a", "x"))).await.unwrap();
    tokio::time::timeout(Duration::from_secs(3), head.wait_for(|r| *r >= 1))
        .await
        .expect("the other store was not notified")
        .unwrap();
}
