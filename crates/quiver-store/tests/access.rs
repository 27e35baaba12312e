//! Access records (policies, API keys, identity providers) on both
//! backends: SQLite (a file in a temporary directory) and PostgreSQL (a
//! fresh database on this machine's server). They share the server records'
//! revision space, so these tests interleave both.

mod backends;

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use quiver_model::access::{
    AccessKind, AccessSpec, ApiKeyRecord, ClaimRule, IdentityProviderRecord, PolicyRecord,
};
use quiver_model::policy::TaskPolicy;
use quiver_model::{ChangeKind, McpServerSpec, Source, StdioConfig, Transport};
use quiver_store::{
    AccessDelete, AccessOutcome, AccessPut, HistoryPage, SqlStore, Store, StoreError, UpsertRequest,
};

/// A time as the store keeps it (milliseconds).
fn ms(at: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(at.timestamp_millis()).unwrap()
}

fn policy(name: &str) -> AccessSpec {
    AccessSpec::Policy(PolicyRecord {
        name: name.into(),
        policy: TaskPolicy::default(),
    })
}

fn key(id: &str, policy: &str) -> AccessSpec {
    AccessSpec::ApiKey(ApiKeyRecord {
        id: id.into(),
        name: format!("key {id}"),
        policy: policy.into(),
        roles: vec![],
        expires_at: None,
        key_sha256: "a".repeat(64),
    })
}

/// A provider with one rule per policy.
fn provider(name: &str, policies: &[&str]) -> AccessSpec {
    AccessSpec::IdentityProvider(IdentityProviderRecord {
        name: name.into(),
        issuer: "https://idp.example.com".into(),
        audiences: vec!["quiver".into()],
        rules: policies
            .iter()
            .map(|policy| ClaimRule {
                claim: "groups".into(),
                contains: Some((*policy).into()),
                policy: Some((*policy).into()),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    })
}

fn put(spec: AccessSpec) -> AccessPut {
    AccessPut {
        spec,
        expected_revision: None,
        actor: "tester".into(),
        source: Source::Api,
    }
}

fn delete(kind: AccessKind, name: &str) -> AccessDelete {
    AccessDelete {
        kind,
        name: name.into(),
        expected_revision: None,
        actor: "tester".into(),
        source: Source::Api,
    }
}

fn server(id: &str) -> UpsertRequest {
    let mut spec = McpServerSpec::new(id, Transport::Stdio);
    spec.stdio = Some(StdioConfig {
        command: "npx".into(),
        ..Default::default()
    });
    spec.allowed_tools = vec!["*".into()];
    UpsertRequest {
        spec,
        expected_revision: None,
        actor: "tester".into(),
        source: Source::Api,
    }
}

async fn head(store: &SqlStore) -> u64 {
    store.head().await.unwrap().revision
}

async fn lifecycle_shares_the_revision_space(store: Arc<SqlStore>) {
    let empty = store.list().await.unwrap();
    assert!(empty.access.is_empty());

    let created = store.put_access(put(policy("team-a"))).await.unwrap();
    let AccessOutcome::Created(first) = created else {
        panic!("expected Created, got {created:?}");
    };
    assert_eq!(first.revision, 1);
    assert_eq!(
        (first.updated_by.as_str(), &first.source),
        ("tester", &Source::Api)
    );
    assert_eq!(
        store
            .get_access(AccessKind::Policy, "team-a")
            .await
            .unwrap(),
        Some(first.clone())
    );
    assert_eq!(
        store.upsert(server("fs")).await.unwrap().server().revision,
        2
    );
    let key_put = store.put_access(put(key("k1", "team-a"))).await.unwrap();
    assert!(matches!(key_put, AccessOutcome::Created(ref r) if r.revision == 3));
    let provider_put = store
        .put_access(put(provider("corp", &["team-a"])))
        .await
        .unwrap();
    assert!(matches!(provider_put, AccessOutcome::Created(ref r) if r.revision == 4));

    let narrower = AccessSpec::Policy(PolicyRecord {
        name: "team-a".into(),
        policy: TaskPolicy {
            tool_denylist: vec!["*.delete_*".into()],
            ..Default::default()
        },
    });
    let updated = store.put_access(put(narrower.clone())).await.unwrap();
    let AccessOutcome::Updated(second) = updated else {
        panic!("expected Updated, got {updated:?}");
    };
    assert_eq!(second.revision, 5);
    assert_eq!(second.created_at, first.created_at);
    assert_eq!(store.subscribe().borrow().to_owned(), 5);

    // Identical content takes no revision, unless a file adopts it.
    let again = store.put_access(put(narrower.clone())).await.unwrap();
    assert_eq!(again, AccessOutcome::Unchanged(second.clone()));
    assert_eq!(head(&store).await, 5);
    let adopted = store
        .put_access(AccessPut {
            source: Source::File("access.toml".into()),
            ..put(narrower.clone())
        })
        .await
        .unwrap();
    assert!(matches!(adopted, AccessOutcome::Updated(ref r) if r.revision == 6));

    let changes = store.changes_since(0, 100).await.unwrap();
    let seen: Vec<_> = changes
        .iter()
        .map(|c| (c.revision, c.server_id.as_str(), c.access, c.kind))
        .collect();
    let upsert = ChangeKind::Upsert;
    assert_eq!(
        seen,
        [
            (1, "team-a", Some(AccessKind::Policy), upsert),
            (2, "fs", None, upsert),
            (3, "k1", Some(AccessKind::ApiKey), upsert),
            (4, "corp", Some(AccessKind::IdentityProvider), upsert),
            (5, "team-a", Some(AccessKind::Policy), upsert),
            (6, "team-a", Some(AccessKind::Policy), upsert),
        ]
    );

    let snapshot = store.list().await.unwrap();
    assert_eq!(snapshot.revision, 6);
    assert_eq!(snapshot.servers.len(), 1);
    let listed: Vec<_> = snapshot
        .access
        .iter()
        .map(|r| (r.spec.kind(), r.spec.name(), r.revision))
        .collect();
    assert_eq!(
        listed,
        [
            (AccessKind::Policy, "team-a", 6),
            (AccessKind::ApiKey, "k1", 3),
            (AccessKind::IdentityProvider, "corp", 4),
        ]
    );

    assert_eq!(
        store
            .delete_access(delete(AccessKind::ApiKey, "k1"))
            .await
            .unwrap(),
        7
    );
    assert_eq!(
        store.get_access(AccessKind::ApiKey, "k1").await.unwrap(),
        None
    );
    let deleted = store.changes_since(6, 10).await.unwrap();
    assert_eq!(deleted.len(), 1);
    assert_eq!(
        (deleted[0].kind, deleted[0].access),
        (ChangeKind::Delete, Some(AccessKind::ApiKey))
    );
    assert!(matches!(
        store.delete_access(delete(AccessKind::ApiKey, "k1")).await,
        Err(StoreError::AccessNotFound { kind: AccessKind::ApiKey, ref name }) if name == "k1"
    ));
    assert_eq!(head(&store).await, 7);

    let history = store
        .access_history(AccessKind::ApiKey, "k1")
        .await
        .unwrap();
    let rows: Vec<_> = history
        .iter()
        .map(|h| (h.revision, h.kind, h.spec.is_some()))
        .collect();
    assert_eq!(
        rows,
        [
            (7, ChangeKind::Delete, false),
            (3, ChangeKind::Upsert, true)
        ]
    );
    assert!(
        history
            .iter()
            .all(|h| h.access == AccessKind::ApiKey && h.name == "k1")
    );
    let policy_history = store
        .access_history(AccessKind::Policy, "team-a")
        .await
        .unwrap();
    assert_eq!(
        policy_history
            .iter()
            .map(|h| h.revision)
            .collect::<Vec<_>>(),
        [6, 5, 1]
    );
    assert_eq!(policy_history[1].spec.as_ref(), Some(&narrower));
    assert_eq!(policy_history[0].source, Source::File("access.toml".into()));

    let at_3 = store.access_at(3).await.unwrap().unwrap();
    assert_eq!(
        (at_3.access, at_3.name.as_str(), at_3.spec),
        (AccessKind::ApiKey, "k1", Some(key("k1", "team-a")))
    );
    // Revision 2 changed a server; nothing is beyond the head.
    for revision in [0, 2, 8, u64::MAX] {
        assert_eq!(store.access_at(revision).await.unwrap(), None, "{revision}");
    }

    // Server history holds server rows only.
    let page = store
        .history_page(HistoryPage::Newest {
            server_id: None,
            limit: 100,
        })
        .await
        .unwrap();
    assert_eq!(
        page.iter()
            .map(|r| (r.server_id.as_str(), r.entry.revision))
            .collect::<Vec<_>>(),
        [("fs", 2)]
    );
    assert!(store.history("team-a").await.unwrap().is_empty());
}

async fn references_are_checked(store: Arc<SqlStore>) {
    match store.put_access(put(key("k1", "missing"))).await {
        Err(StoreError::MissingReference { field, kind, name }) => {
            assert_eq!(
                (field.as_str(), kind, name.as_str()),
                ("policy", AccessKind::Policy, "missing")
            );
        }
        other => panic!("expected MissingReference, got {other:?}"),
    }
    assert_eq!(head(&store).await, 0);
    assert_eq!(
        store.get_access(AccessKind::ApiKey, "k1").await.unwrap(),
        None
    );

    store.put_access(put(policy("a"))).await.unwrap(); // 1
    match store.put_access(put(provider("corp", &["a", "b"]))).await {
        Err(StoreError::MissingReference { field, kind, name }) => {
            assert_eq!(
                (field.as_str(), kind, name.as_str()),
                ("rules[1].policy", AccessKind::Policy, "b")
            );
        }
        other => panic!("expected MissingReference, got {other:?}"),
    }
    assert_eq!(head(&store).await, 1);

    store.put_access(put(key("k1", "a"))).await.unwrap(); // 2
    store
        .put_access(put(provider("corp", &["a"])))
        .await
        .unwrap(); // 3
    match store.delete_access(delete(AccessKind::Policy, "a")).await {
        Err(StoreError::InUse {
            kind,
            name,
            used_by,
        }) => {
            assert_eq!((kind, name.as_str()), (AccessKind::Policy, "a"));
            assert_eq!(used_by, ["api_key:k1", "identity_provider:corp"]);
        }
        other => panic!("expected InUse, got {other:?}"),
    }
    assert_eq!(head(&store).await, 3);
    assert!(
        store
            .get_access(AccessKind::Policy, "a")
            .await
            .unwrap()
            .is_some()
    );

    store
        .delete_access(delete(AccessKind::ApiKey, "k1"))
        .await
        .unwrap();
    store
        .delete_access(delete(AccessKind::IdentityProvider, "corp"))
        .await
        .unwrap();
    assert_eq!(
        store
            .delete_access(delete(AccessKind::Policy, "a"))
            .await
            .unwrap(),
        6
    );
}

/// The conflict a write was refused with: (record, expected, current).
fn conflict<T: std::fmt::Debug>(result: Result<T, StoreError>) -> (String, u64, u64) {
    match result {
        Err(StoreError::Conflict {
            server_id,
            expected,
            current,
        }) => (server_id, expected, current),
        other => panic!("expected Conflict, got {other:?}"),
    }
}

async fn expected_revision_is_enforced(store: Arc<SqlStore>) {
    let expecting = |spec: AccessSpec, expected: u64| AccessPut {
        expected_revision: Some(expected),
        ..put(spec)
    };
    let a = || policy("a");
    assert_eq!(
        conflict(store.put_access(expecting(a(), 1)).await),
        ("policy/a".into(), 1, 0)
    );
    let created = store.put_access(expecting(a(), 0)).await.unwrap();
    assert!(matches!(created, AccessOutcome::Created(ref r) if r.revision == 1));
    assert_eq!(
        conflict(store.put_access(expecting(key("k", "a"), 1)).await),
        ("api_key/k".into(), 1, 0)
    );
    let changed = AccessSpec::Policy(PolicyRecord {
        name: "a".into(),
        policy: TaskPolicy {
            vision: true,
            ..Default::default()
        },
    });
    assert_eq!(
        conflict(store.put_access(expecting(changed.clone(), 0)).await),
        ("policy/a".into(), 0, 1)
    );
    let updated = store.put_access(expecting(changed, 1)).await.unwrap();
    assert!(matches!(updated, AccessOutcome::Updated(ref r) if r.revision == 2));

    let delete_at = |expected: u64| AccessDelete {
        expected_revision: Some(expected),
        ..delete(AccessKind::Policy, "a")
    };
    assert_eq!(
        conflict(store.delete_access(delete_at(1)).await),
        ("policy/a".into(), 1, 2)
    );
    assert_eq!(head(&store).await, 2);
    assert_eq!(store.delete_access(delete_at(2)).await.unwrap(), 3);
}

async fn invalid_records_are_rejected(store: Arc<SqlStore>) {
    let field_of = |result: Result<AccessOutcome, StoreError>| match result {
        Err(StoreError::Invalid(err)) => err.field().map(str::to_owned),
        other => panic!("expected Invalid, got {other:?}"),
    };
    store.put_access(put(policy("a"))).await.unwrap(); // 1
    let AccessSpec::ApiKey(mut bad_key) = key("k1", "a") else {
        unreachable!()
    };
    bad_key.key_sha256 = "not hex".into();
    assert_eq!(
        field_of(store.put_access(put(AccessSpec::ApiKey(bad_key))).await).as_deref(),
        Some("key_sha256")
    );
    let AccessSpec::IdentityProvider(mut bad_provider) = provider("corp", &["a"]) else {
        unreachable!()
    };
    bad_provider.issuer = "http://idp.example.com".into();
    assert_eq!(
        field_of(
            store
                .put_access(put(AccessSpec::IdentityProvider(bad_provider)))
                .await
        )
        .as_deref(),
        Some("issuer")
    );
    assert_eq!(
        field_of(store.put_access(put(policy("no spaces"))).await).as_deref(),
        Some("name")
    );
    assert_eq!(head(&store).await, 1);
    assert_eq!(store.list().await.unwrap().access.len(), 1);
}

async fn api_key_use_only_moves_forward(store: Arc<SqlStore>) {
    store.put_access(put(policy("p"))).await.unwrap();
    store.put_access(put(key("k1", "p"))).await.unwrap();
    store.put_access(put(key("k2", "p"))).await.unwrap();
    let t = ms(Utc::now());

    store.touch_api_keys(&[]).await.unwrap();
    store
        .touch_api_keys(&[("k1".into(), t), ("no-such-key".into(), t)])
        .await
        .unwrap();
    let last_used = store.api_keys_last_used().await.unwrap();
    assert_eq!(
        last_used.into_iter().collect::<Vec<_>>(),
        [("k1".to_owned(), t)]
    );

    store
        .touch_api_keys(&[("k1".into(), t - Duration::hours(1))])
        .await
        .unwrap();
    assert_eq!(store.api_keys_last_used().await.unwrap()["k1"], t);

    let later = t + Duration::seconds(2);
    store
        .touch_api_keys(&[
            ("k1".into(), later),
            ("k2".into(), t),
            ("k1".into(), t + Duration::seconds(1)),
        ])
        .await
        .unwrap();
    let last_used = store.api_keys_last_used().await.unwrap();
    assert_eq!(
        last_used.into_iter().collect::<Vec<_>>(),
        [("k1".to_owned(), later), ("k2".to_owned(), t)]
    );
    // Use is not configuration: no revision.
    assert_eq!(head(&store).await, 3);

    let too_many = vec![("k1".to_owned(), t); 10_001];
    assert!(matches!(
        store.touch_api_keys(&too_many).await,
        Err(StoreError::Limit(_))
    ));

    // A deleted key's use goes with it, also when a key of that id returns.
    store
        .delete_access(delete(AccessKind::ApiKey, "k1"))
        .await
        .unwrap();
    store.put_access(put(key("k1", "p"))).await.unwrap();
    let last_used = store.api_keys_last_used().await.unwrap();
    assert_eq!(last_used.keys().collect::<Vec<_>>(), ["k2"]);
}

suite!(sqlite, postgres; [
    lifecycle_shares_the_revision_space,
    references_are_checked,
    expected_revision_is_enforced,
    invalid_records_are_rejected,
    api_key_use_only_moves_forward
]);
