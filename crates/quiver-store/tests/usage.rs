//! Rate-limit windows and usage counts on both backends.

mod backends;

use std::sync::Arc;

use quiver_model::usage::{UsageCounts, UsageGroup, UsageKey, bucket_of};
use quiver_store::{MAX_USAGE_BATCH_ROWS, SqlStore, Store, StoreError, UsageBatch};

/// Concurrent leases never grant more than the limit; a window that ended
/// opens afresh; what is given back can be leased again.
async fn leases_hold_the_limit(store: Arc<SqlStore>) {
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.lease_calls("k", 10, 60, 3).await.unwrap() })
        })
        .collect();
    let mut granted = 0;
    let mut window = None;
    for task in tasks {
        let lease = task.await.unwrap();
        granted += lease.granted;
        assert!(lease.remaining_ms > 0 && lease.remaining_ms <= 60_000);
        assert_eq!(
            *window.get_or_insert(lease.window_start_ms),
            lease.window_start_ms
        );
    }
    assert_eq!(granted, 10);
    let used_up = store.lease_calls("k", 10, 60, 1).await.unwrap();
    assert_eq!(used_up.granted, 0);
    assert!(used_up.remaining_ms > 50_000, "{used_up:?}");
    // Given back into the same window, leased again; never more than held.
    store
        .give_back_calls("k", used_up.window_start_ms, 2)
        .await
        .unwrap();
    assert_eq!(store.lease_calls("k", 10, 60, 5).await.unwrap().granted, 2);
    store
        .give_back_calls("k", used_up.window_start_ms - 1, 5)
        .await
        .unwrap();
    assert_eq!(store.lease_calls("k", 10, 60, 5).await.unwrap().granted, 0);
    // Another key is another counter; a one-second window reopens.
    assert_eq!(
        store.lease_calls("other", 2, 1, 5).await.unwrap().granted,
        2
    );
    assert_eq!(
        store.lease_calls("other", 2, 1, 5).await.unwrap().granted,
        0
    );
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let reopened = store.lease_calls("other", 2, 1, 1).await.unwrap();
    assert_eq!(reopened.granted, 1);
    assert!(reopened.window_start_ms > used_up.window_start_ms);
}

fn key(principal: &str, policy: &str, server: &str, tool: &str, minute_ms: i64) -> UsageKey {
    UsageKey {
        principal: principal.into(),
        policy: policy.into(),
        server_id: server.into(),
        tool: tool.into(),
        minute_ms,
    }
}

fn counts(calls: u64, errors: u64, limited: u64, ms: f64) -> UsageCounts {
    let mut counts = UsageCounts {
        calls,
        errors,
        rate_limited: limited,
        ..UsageCounts::default()
    };
    counts.latency[bucket_of(ms)] = calls;
    counts
}

/// Batches add up exactly, a repeated batch counts once, groups and steps
/// sum the right rows, retention prunes old minutes.
async fn usage_adds_up(store: Arc<SqlStore>) {
    // A whole minute (1_700_000_040_000 is divisible by 60 000).
    let minute = 1_700_000_040_000_i64;
    let batch = |source: &str, id: u64, rows| UsageBatch {
        source: source.into(),
        batch_id: id,
        rows,
    };
    let first = batch(
        "w1",
        1,
        vec![
            (key("alice", "p", "s", "a", minute), counts(4, 1, 2, 3.0)),
            (key("bob", "p", "s", "b", minute), counts(2, 0, 0, 80.0)),
        ],
    );
    assert!(store.record_usage(&first).await.unwrap());
    assert!(
        !store.record_usage(&first).await.unwrap(),
        "a repeat counts once"
    );
    let second = batch(
        "w2",
        1,
        vec![
            (key("alice", "p", "s", "a", minute), counts(6, 0, 1, 3.0)),
            (
                key("alice", "q", "t", "a", minute + 60_000),
                counts(1, 1, 0, 500.0),
            ),
        ],
    );
    assert!(store.record_usage(&second).await.unwrap());

    let (rows, more) = store
        .usage(UsageGroup::Principal, minute, minute + 120_000, None)
        .await
        .unwrap();
    assert!(!more);
    let summary: Vec<_> = rows
        .iter()
        .map(|r| {
            (
                r.key.clone(),
                r.counts.calls,
                r.counts.errors,
                r.counts.rate_limited,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (vec!["alice".to_owned()], 11, 2, 3),
            (vec!["bob".to_owned()], 2, 0, 0)
        ]
    );
    let alice = &rows[0].counts;
    assert_eq!(alice.latency.iter().sum::<u64>(), 11);

    let (tools, _) = store
        .usage(UsageGroup::Tool, minute, minute + 120_000, None)
        .await
        .unwrap();
    let tool_keys: Vec<_> = tools
        .iter()
        .map(|r| (r.key.clone(), r.counts.calls))
        .collect();
    assert_eq!(
        tool_keys,
        [
            (vec!["s".to_owned(), "a".to_owned()], 10),
            (vec!["s".to_owned(), "b".to_owned()], 2),
            (vec!["t".to_owned(), "a".to_owned()], 1)
        ]
    );
    // Per minute, by policy; `until` is exclusive.
    let (stepped, _) = store
        .usage(UsageGroup::Policy, minute, minute + 120_000, Some(60_000))
        .await
        .unwrap();
    let stepped: Vec<_> = stepped
        .iter()
        .map(|r| (r.time_ms, r.key[0].clone(), r.counts.calls))
        .collect();
    assert_eq!(
        stepped,
        [
            (Some(minute), "p".to_owned(), 12),
            (Some(minute + 60_000), "q".to_owned(), 1)
        ]
    );
    let (early, _) = store
        .usage(UsageGroup::Server, minute, minute + 60_000, None)
        .await
        .unwrap();
    assert_eq!(early.len(), 1);
    assert_eq!(early[0].counts.calls, 12);

    let too_big = batch(
        "w3",
        1,
        (0..=MAX_USAGE_BATCH_ROWS as i64)
            .map(|i| (key("x", "p", "s", "a", i * 60_000), counts(1, 0, 0, 1.0)))
            .collect(),
    );
    assert!(matches!(
        store.record_usage(&too_big).await,
        Err(StoreError::Limit(_))
    ));

    store.prune_usage(minute + 60_000).await.unwrap();
    let (left, _) = store
        .usage(UsageGroup::Principal, 0, i64::MAX, None)
        .await
        .unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].counts.calls, 1);
}

suite!(sqlite, postgres; [leases_hold_the_limit, usage_adds_up]);
