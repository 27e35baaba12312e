//! Approvals on both backends: SQLite (a file in a temporary directory) and
//! PostgreSQL (a fresh database on this machine's server).

mod backends;

use std::sync::Arc;

use quiver_model::approval::{
    ApprovalBinding, ApprovalDecision, ApprovalState, BindingField, UseOutcome,
    canonical_arguments_hash,
};
use quiver_store::{DecideOutcome, NewApproval, SqlStore, Store};
use serde_json::json;

fn binding() -> ApprovalBinding {
    ApprovalBinding {
        task: "task-1".into(),
        server_id: "files".into(),
        tool: "delete".into(),
        arguments_hash: canonical_arguments_hash(&json!({"path": "/tmp/x"})),
        record_revision: 3,
    }
}

fn request(ttl_ms: i64) -> NewApproval {
    NewApproval {
        binding: binding(),
        arguments: json!({"path": "/tmp/x", "api_key": "s3cret"}),
        requested_by: "worker".into(),
        ttl: chrono::Duration::milliseconds(ttl_ms),
        max_pending: 100,
    }
}

async fn approved(store: &SqlStore) -> String {
    let created = store
        .create_approval(request(60_000))
        .await
        .unwrap()
        .approval;
    let outcome = store
        .decide_approval(
            &created.approval_id,
            ApprovalDecision::Approve,
            "admin",
            None,
        )
        .await
        .unwrap();
    assert!(matches!(outcome, DecideOutcome::Decided(_)));
    created.approval_id
}

async fn lifecycle(store: Arc<SqlStore>) {
    let created = store
        .create_approval(request(60_000))
        .await
        .unwrap()
        .approval;
    assert_eq!(created.state, ApprovalState::Pending);
    assert!(created.approval_id.starts_with("apr_") && created.approval_id.len() == 36);
    assert_eq!(created.binding, binding());
    let (outcome, _) = store
        .use_approval(&created.approval_id, &binding(), "w")
        .await
        .unwrap();
    assert_eq!(outcome, UseOutcome::Pending);

    let DecideOutcome::Decided(decided) = store
        .decide_approval(
            &created.approval_id,
            ApprovalDecision::Approve,
            "admin",
            Some("ok".into()),
        )
        .await
        .unwrap()
    else {
        panic!("not decided")
    };
    assert_eq!(decided.state, ApprovalState::Approved);
    assert_eq!(decided.decided_by.as_deref(), Some("admin"));
    assert_eq!(decided.note.as_deref(), Some("ok"));
    // A second decision is refused.
    assert!(matches!(
        store
            .decide_approval(&created.approval_id, ApprovalDecision::Deny, "admin", None)
            .await
            .unwrap(),
        DecideOutcome::NotPending(a) if a.state == ApprovalState::Approved
    ));

    // Mismatches name the field and leave it usable.
    for (field, call) in [
        (
            BindingField::Task,
            ApprovalBinding {
                task: "other".into(),
                ..binding()
            },
        ),
        (
            BindingField::Tool,
            ApprovalBinding {
                tool: "other".into(),
                ..binding()
            },
        ),
        (
            BindingField::ArgumentsHash,
            ApprovalBinding {
                arguments_hash: canonical_arguments_hash(&json!({})),
                ..binding()
            },
        ),
        (
            BindingField::RecordRevision,
            ApprovalBinding {
                record_revision: 4,
                ..binding()
            },
        ),
    ] {
        let (outcome, _) = store
            .use_approval(&created.approval_id, &call, "w")
            .await
            .unwrap();
        assert_eq!(outcome, UseOutcome::Mismatch(field));
    }
    let (outcome, used) = store
        .use_approval(&created.approval_id, &binding(), "worker-b")
        .await
        .unwrap();
    assert_eq!(outcome, UseOutcome::Used);
    let used = used.unwrap();
    assert_eq!(used.state, ApprovalState::Used);
    assert_eq!(used.used_by.as_deref(), Some("worker-b"));
    let (outcome, _) = store
        .use_approval(&created.approval_id, &binding(), "worker-b")
        .await
        .unwrap();
    assert_eq!(outcome, UseOutcome::AlreadyUsed);
    let (outcome, none) = store
        .use_approval("apr_nope", &binding(), "w")
        .await
        .unwrap();
    assert_eq!((outcome, none), (UseOutcome::NotFound, None));
}

async fn denial_and_listing(store: Arc<SqlStore>) {
    let denied = store
        .create_approval(request(60_000))
        .await
        .unwrap()
        .approval;
    store
        .decide_approval(&denied.approval_id, ApprovalDecision::Deny, "admin", None)
        .await
        .unwrap();
    let (outcome, _) = store
        .use_approval(&denied.approval_id, &binding(), "w")
        .await
        .unwrap();
    assert_eq!(outcome, UseOutcome::Denied);
    let pending = store
        .create_approval(request(60_000))
        .await
        .unwrap()
        .approval;
    let all = store.list_approvals(None, 100).await.unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].approval_id, pending.approval_id, "pending first");
    let only_denied = store
        .list_approvals(Some(ApprovalState::Denied), 100)
        .await
        .unwrap();
    assert_eq!(only_denied.len(), 1);
    assert_eq!(only_denied[0].approval_id, denied.approval_id);
    assert_eq!(
        only_denied[0].arguments["api_key"], "s3cret",
        "stored unmasked"
    );
}

async fn expiry(store: Arc<SqlStore>) {
    let pending = store.create_approval(request(150)).await.unwrap().approval;
    let approved_id = {
        let other_caller = NewApproval {
            requested_by: "worker-2".into(),
            ..request(150)
        };
        let created = store.create_approval(other_caller).await.unwrap().approval;
        store
            .decide_approval(&created.approval_id, ApprovalDecision::Approve, "a", None)
            .await
            .unwrap();
        created.approval_id
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (outcome, approval) = store
        .use_approval(&approved_id, &binding(), "w")
        .await
        .unwrap();
    assert_eq!(outcome, UseOutcome::Expired);
    assert_eq!(approval.unwrap().state, ApprovalState::Expired);
    assert!(matches!(
        store
            .decide_approval(&pending.approval_id, ApprovalDecision::Approve, "a", None)
            .await
            .unwrap(),
        DecideOutcome::NotPending(a) if a.state == ApprovalState::Expired
    ));
    let swept = store.expire_approvals().await.unwrap();
    assert_eq!(swept.len(), 2);
    assert!(swept.iter().all(|a| a.state == ApprovalState::Expired));
    assert!(
        store.expire_approvals().await.unwrap().is_empty(),
        "reported once"
    );
}

async fn used_exactly_once_under_concurrency(store: Arc<SqlStore>) {
    for _ in 0..5 {
        let id = approved(&store).await;
        let uses = (0..8).map(|i| {
            let store = store.clone();
            let id = id.clone();
            tokio::spawn(async move {
                store
                    .use_approval(&id, &binding(), &format!("worker-{i}"))
                    .await
                    .unwrap()
                    .0
            })
        });
        let outcomes = futures_join(uses).await;
        let used = outcomes.iter().filter(|o| **o == UseOutcome::Used).count();
        assert_eq!(used, 1, "{outcomes:?}");
        assert!(
            outcomes
                .iter()
                .all(|o| matches!(o, UseOutcome::Used | UseOutcome::AlreadyUsed))
        );
    }
}

/// Finished approvals past `before` are purged, at most `limit` at once;
/// live ones never.
async fn purge(store: Arc<SqlStore>) {
    let denied = store.create_approval(request(100)).await.unwrap().approval;
    store
        .decide_approval(&denied.approval_id, ApprovalDecision::Deny, "a", None)
        .await
        .unwrap();
    let other = NewApproval {
        requested_by: "worker-2".into(),
        ..request(100)
    };
    let expired = store.create_approval(other).await.unwrap().approval;
    let live = NewApproval {
        requested_by: "worker-3".into(),
        ..request(60_000)
    };
    let live = store.create_approval(live).await.unwrap().approval;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    store.expire_approvals().await.unwrap();
    let now = chrono::Utc::now();
    assert_eq!(store.purge_approvals(now, 1).await.unwrap(), 1, "bounded");
    assert_eq!(store.purge_approvals(now, 10).await.unwrap(), 1);
    assert_eq!(store.purge_approvals(now, 10).await.unwrap(), 0);
    for gone in [&denied, &expired] {
        assert!(
            store
                .get_approval(&gone.approval_id)
                .await
                .unwrap()
                .is_none()
        );
    }
    assert!(
        store
            .get_approval(&live.approval_id)
            .await
            .unwrap()
            .is_some()
    );
}

async fn futures_join(
    handles: impl Iterator<Item = tokio::task::JoinHandle<UseOutcome>>,
) -> Vec<UseOutcome> {
    let mut outcomes = Vec::new();
    for handle in handles.collect::<Vec<_>>() {
        outcomes.push(handle.await.unwrap());
    }
    outcomes
}

suite!(sqlite, postgres; [
    lifecycle,
    denial_and_listing,
    expiry,
    used_exactly_once_under_concurrency,
    purge
]);
