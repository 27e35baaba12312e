//! OAuth connections and pending authorizations on both backends: SQLite (a
//! file in a temporary directory) and PostgreSQL (a fresh database on this
//! machine's server).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use quiver_store::{
    MAX_PENDING_OAUTH_AUTHORIZATIONS, OAuthAuthorizationRow, OAuthStatus, OAuthTokens,
    SecretUpdate, SqlStore, Store, StoreError,
};
use quiver_testkit::postgres::TestDatabase;

async fn sqlite() -> (Arc<SqlStore>, Box<dyn std::any::Any + Send>) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("registry.db").display());
    (
        Arc::new(SqlStore::open_sqlite(&url).await.unwrap()),
        Box::new(dir),
    )
}

async fn postgres() -> (Arc<SqlStore>, Box<dyn std::any::Any + Send>) {
    let db = TestDatabase::create().await;
    let store = Arc::new(SqlStore::open_postgres(db.url()).await.unwrap());
    (store, Box::new(db))
}

/// A time as the store keeps it (milliseconds).
fn ms(at: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(at.timestamp_millis()).unwrap()
}

fn tokens(credentials: &str, refreshed: bool) -> OAuthTokens {
    OAuthTokens {
        credentials: credentials.into(),
        expires_at: Some(Utc::now() + chrono::Duration::hours(1)),
        refreshed,
    }
}

fn authorization(state: &str, name: &str, expires_in_ms: i64) -> OAuthAuthorizationRow {
    let now = Utc::now();
    OAuthAuthorizationRow {
        state: state.into(),
        name: name.into(),
        generation: 1,
        payload: format!("sealed-{state}"),
        created_at: ms(now),
        expires_at: ms(now + chrono::Duration::milliseconds(expires_in_ms)),
        browser_hash: format!("browser-{state}"),
    }
}

async fn crud(store: Arc<SqlStore>) {
    assert!(store.get_oauth_connection("gh").await.unwrap().is_none());
    assert!(store.list_oauth_connections().await.unwrap().is_empty());

    let before = ms(Utc::now());
    let created = store
        .put_oauth_connection("gh", r#"{"issuer":"a"}"#.into(), SecretUpdate::Keep)
        .await
        .unwrap();
    assert_eq!(created.name, "gh");
    assert_eq!(created.config, r#"{"issuer":"a"}"#);
    assert_eq!(created.status, OAuthStatus::NotConnected);
    assert_eq!(created.generation, 1);
    assert_eq!(created.refresh_count, 0);
    assert_eq!(created.client_secret, None);
    assert_eq!(created.credentials, None);
    assert_eq!(created.expires_at, None);
    assert_eq!(created.connected_at, None);
    assert_eq!(created.last_error, None);
    assert!(created.updated_at >= before);
    assert_eq!(
        store.get_oauth_connection("gh").await.unwrap().as_ref(),
        Some(&created)
    );

    let other = store
        .put_oauth_connection("atlassian", "{}".into(), SecretUpdate::Set("s1".into()))
        .await
        .unwrap();
    assert_eq!(other.client_secret.as_deref(), Some("s1"));
    let names: Vec<String> = store
        .list_oauth_connections()
        .await
        .unwrap()
        .into_iter()
        .map(|row| row.name)
        .collect();
    assert_eq!(names, ["atlassian", "gh"]);

    // Secrets never show in Debug output.
    let debug = format!("{other:?}");
    assert!(
        !debug.contains("s1") && debug.contains("[sealed]"),
        "{debug}"
    );
    let debug = format!("{:?}", authorization("st", "gh", 1000));
    assert!(
        !debug.contains("sealed-st") && debug.contains("[sealed]"),
        "{debug}"
    );

    store
        .create_oauth_authorization(authorization("st-1", "gh", 60_000))
        .await
        .unwrap();
    assert!(store.delete_oauth_connection("gh").await.unwrap());
    assert!(!store.delete_oauth_connection("gh").await.unwrap());
    assert!(store.get_oauth_connection("gh").await.unwrap().is_none());
    // Its pending authorizations went with it.
    assert!(
        store
            .take_oauth_authorization("st-1")
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(store.list_oauth_connections().await.unwrap().len(), 1);
}

async fn config_change_starts_afresh(store: Arc<SqlStore>) {
    store
        .put_oauth_connection("gh", "{}".into(), SecretUpdate::Set("s".into()))
        .await
        .unwrap();
    let connected = store
        .store_oauth_tokens("gh", 1, tokens("tok", false))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(connected.status, OAuthStatus::Connected);
    assert_eq!(connected.generation, 2);
    store
        .create_oauth_authorization(authorization("st-1", "gh", 60_000))
        .await
        .unwrap();
    store
        .create_oauth_authorization(authorization("st-other", "other", 60_000))
        .await
        .unwrap();

    // Same config, secret kept: nothing written.
    let same = store
        .put_oauth_connection("gh", "{}".into(), SecretUpdate::Keep)
        .await
        .unwrap();
    assert_eq!(same, connected);
    // Setting the same secret again changes nothing either.
    let same = store
        .put_oauth_connection("gh", "{}".into(), SecretUpdate::Set("s".into()))
        .await
        .unwrap();
    assert_eq!(same, connected);

    let changed = store
        .put_oauth_connection("gh", r#"{"scopes":["repo"]}"#.into(), SecretUpdate::Keep)
        .await
        .unwrap();
    assert_eq!(changed.config, r#"{"scopes":["repo"]}"#);
    assert_eq!(changed.status, OAuthStatus::NotConnected);
    assert_eq!(changed.generation, 3);
    assert_eq!(changed.client_secret.as_deref(), Some("s"));
    assert_eq!(changed.credentials, None);
    assert_eq!(changed.expires_at, None);
    assert_eq!(changed.connected_at, None);
    assert_eq!(changed.last_error, None);
    assert!(changed.updated_at >= connected.updated_at);
    assert_eq!(
        store.get_oauth_connection("gh").await.unwrap(),
        Some(changed)
    );
    // The flow started under the old settings is gone; others' are not.
    assert!(
        store
            .take_oauth_authorization("st-1")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .take_oauth_authorization("st-other")
            .await
            .unwrap()
            .is_some()
    );
}

async fn secret_updates(store: Arc<SqlStore>) {
    let row = store
        .put_oauth_connection("c", "{}".into(), SecretUpdate::Keep)
        .await
        .unwrap();
    assert_eq!((row.client_secret.as_deref(), row.generation), (None, 1));
    // Clearing an absent secret changes nothing.
    let row = store
        .put_oauth_connection("c", "{}".into(), SecretUpdate::Clear)
        .await
        .unwrap();
    assert_eq!((row.client_secret.as_deref(), row.generation), (None, 1));

    let row = store
        .put_oauth_connection("c", "{}".into(), SecretUpdate::Set("a".into()))
        .await
        .unwrap();
    assert_eq!(
        (row.client_secret.as_deref(), row.generation),
        (Some("a"), 2)
    );
    let row = store
        .put_oauth_connection("c", "{}".into(), SecretUpdate::Keep)
        .await
        .unwrap();
    assert_eq!(
        (row.client_secret.as_deref(), row.generation),
        (Some("a"), 2)
    );
    let row = store
        .put_oauth_connection("c", "{}".into(), SecretUpdate::Set("a".into()))
        .await
        .unwrap();
    assert_eq!(
        (row.client_secret.as_deref(), row.generation),
        (Some("a"), 2)
    );

    // A new secret drops the tokens.
    store
        .store_oauth_tokens("c", 2, tokens("tok", false))
        .await
        .unwrap()
        .unwrap();
    let row = store
        .put_oauth_connection("c", "{}".into(), SecretUpdate::Set("b".into()))
        .await
        .unwrap();
    assert_eq!(
        (row.client_secret.as_deref(), row.generation),
        (Some("b"), 4)
    );
    assert_eq!(row.credentials, None);
    assert_eq!(row.status, OAuthStatus::NotConnected);

    let row = store
        .put_oauth_connection("c", "{}".into(), SecretUpdate::Clear)
        .await
        .unwrap();
    assert_eq!((row.client_secret.as_deref(), row.generation), (None, 5));
    // A config change with Keep keeps the secret (here: none); with Set it
    // takes the new one in the same write.
    let row = store
        .put_oauth_connection("c", "{\"x\":1}".into(), SecretUpdate::Set("d".into()))
        .await
        .unwrap();
    assert_eq!(
        (row.client_secret.as_deref(), row.generation),
        (Some("d"), 6)
    );
    assert_eq!(
        store.get_oauth_connection("c").await.unwrap(),
        Some(row.clone())
    );
}

async fn token_writes(store: Arc<SqlStore>) {
    store
        .put_oauth_connection("c", "{}".into(), SecretUpdate::Keep)
        .await
        .unwrap();
    assert!(
        store
            .store_oauth_tokens("missing", 1, tokens("t", false))
            .await
            .unwrap()
            .is_none()
    );
    // A stale generation writes nothing.
    assert!(
        store
            .store_oauth_tokens("c", 7, tokens("t", false))
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .store_oauth_tokens("c", u64::MAX, tokens("t", false))
            .await
            .unwrap()
            .is_none()
    );
    let untouched = store.get_oauth_connection("c").await.unwrap().unwrap();
    assert_eq!(untouched.generation, 1);
    assert_eq!(untouched.credentials, None);

    store.set_oauth_error("c", "boom").await.unwrap();
    let expires = Utc::now() + chrono::Duration::minutes(30);
    let granted = store
        .store_oauth_tokens(
            "c",
            1,
            OAuthTokens {
                credentials: "tok-1".into(),
                expires_at: Some(expires),
                refreshed: false,
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(granted.status, OAuthStatus::Connected);
    assert_eq!(granted.credentials.as_deref(), Some("tok-1"));
    assert_eq!(granted.expires_at, Some(ms(expires)));
    assert_eq!(granted.generation, 2);
    assert_eq!(granted.refresh_count, 0);
    assert_eq!(granted.last_error, None);
    let connected_at = granted.connected_at.expect("connected_at set");

    // A transient error: only last_error (and updated_at) change.
    store.set_oauth_error("c", "timeout").await.unwrap();
    let errored = store.get_oauth_connection("c").await.unwrap().unwrap();
    assert_eq!(errored.last_error.as_deref(), Some("timeout"));
    assert_eq!(errored.generation, 2);
    assert_eq!(errored.status, OAuthStatus::Connected);
    assert_eq!(errored.credentials.as_deref(), Some("tok-1"));
    store.set_oauth_error("missing", "x").await.unwrap();

    tokio::time::sleep(Duration::from_millis(5)).await;
    let refreshed = store
        .store_oauth_tokens(
            "c",
            2,
            OAuthTokens {
                expires_at: None,
                ..tokens("tok-2", true)
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(refreshed.credentials.as_deref(), Some("tok-2"));
    assert_eq!(refreshed.expires_at, None);
    assert_eq!(refreshed.refresh_count, 1);
    assert_eq!(refreshed.generation, 3);
    assert_eq!(refreshed.connected_at, Some(connected_at));
    assert_eq!(refreshed.last_error, None);
    assert!(refreshed.updated_at > granted.updated_at);
    // The old generation is stale now.
    assert!(
        store
            .store_oauth_tokens("c", 2, tokens("tok-3", true))
            .await
            .unwrap()
            .is_none()
    );

    // A new grant moves connected_at and keeps the refresh count.
    let regranted = store
        .store_oauth_tokens("c", 3, tokens("tok-4", false))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(regranted.refresh_count, 1);
    assert!(regranted.connected_at.unwrap() > connected_at);

    // Needs reconsent: tokens cleared, error recorded, conditional too.
    assert!(
        store
            .set_oauth_needs_reconsent("c", 3, "stale")
            .await
            .unwrap()
            .is_none()
    );
    let revoked = store
        .set_oauth_needs_reconsent("c", 4, "invalid_grant")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(revoked.status, OAuthStatus::NeedsReconsent);
    assert_eq!(revoked.credentials, None);
    assert_eq!(revoked.expires_at, None);
    assert_eq!(revoked.last_error.as_deref(), Some("invalid_grant"));
    assert_eq!(revoked.generation, 5);
    assert_eq!(
        store.get_oauth_connection("c").await.unwrap(),
        Some(revoked)
    );
}

async fn lease(store: Arc<SqlStore>) {
    store
        .put_oauth_connection("c", "{}".into(), SecretUpdate::Keep)
        .await
        .unwrap();
    assert!(
        !store
            .acquire_oauth_lease("missing", "a", Duration::from_secs(60))
            .await
            .unwrap()
    );

    // Eight holders race for the lease: exactly one wins.
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let holder = format!("replica-{i}");
                let won = store
                    .acquire_oauth_lease("c", &holder, Duration::from_secs(60))
                    .await
                    .unwrap();
                (holder, won)
            })
        })
        .collect();
    let mut winners = Vec::new();
    for handle in handles {
        let (holder, won) = handle.await.unwrap();
        if won {
            winners.push(holder);
        }
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    let winner = winners.pop().unwrap();
    // The holder may extend it; others may not take it.
    assert!(
        store
            .acquire_oauth_lease("c", &winner, Duration::from_secs(60))
            .await
            .unwrap()
    );
    assert!(
        !store
            .acquire_oauth_lease("c", "intruder", Duration::from_secs(60))
            .await
            .unwrap()
    );
    // Release by a non-holder does nothing.
    store.release_oauth_lease("c", "intruder").await.unwrap();
    assert!(
        !store
            .acquire_oauth_lease("c", "intruder", Duration::from_secs(60))
            .await
            .unwrap()
    );
    // Release by the holder frees it.
    store.release_oauth_lease("c", &winner).await.unwrap();
    assert!(
        store
            .acquire_oauth_lease("c", "next", Duration::from_millis(300))
            .await
            .unwrap()
    );
    assert!(
        !store
            .acquire_oauth_lease("c", "late", Duration::from_secs(60))
            .await
            .unwrap()
    );
    // An expired lease can be taken over.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        store
            .acquire_oauth_lease("c", "late", Duration::from_secs(60))
            .await
            .unwrap()
    );
    assert!(
        !store
            .acquire_oauth_lease("c", "next", Duration::from_secs(60))
            .await
            .unwrap()
    );
    // Leases are no change of the connection.
    let row = store.get_oauth_connection("c").await.unwrap().unwrap();
    assert_eq!(row.generation, 1);
}

async fn authorization_taken_once(store: Arc<SqlStore>) {
    let created = authorization("st-1", "c", 60_000);
    store
        .create_oauth_authorization(created.clone())
        .await
        .unwrap();
    // The state is the key.
    assert!(matches!(
        store
            .create_oauth_authorization(authorization("st-1", "c", 60_000))
            .await,
        Err(StoreError::Database(_))
    ));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.take_oauth_authorization("st-1").await.unwrap() })
        })
        .collect();
    let mut taken = Vec::new();
    for handle in handles {
        if let Some(row) = handle.await.unwrap() {
            taken.push(row);
        }
    }
    assert_eq!(taken, [created]);
    assert!(
        store
            .take_oauth_authorization("st-1")
            .await
            .unwrap()
            .is_none()
    );

    // An expired one is still returned (the caller checks expires_at).
    let expired = authorization("st-2", "c", -1);
    store
        .create_oauth_authorization(expired.clone())
        .await
        .unwrap();
    assert_eq!(
        store.take_oauth_authorization("st-2").await.unwrap(),
        Some(expired)
    );
}

async fn expired_authorizations_purged(store: Arc<SqlStore>) {
    store
        .create_oauth_authorization(authorization("old", "c", 30))
        .await
        .unwrap();
    store
        .create_oauth_authorization(authorization("live", "c", 60_000))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(60)).await;
    store
        .create_oauth_authorization(authorization("new", "c", 60_000))
        .await
        .unwrap();
    assert!(
        store
            .take_oauth_authorization("old")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .take_oauth_authorization("live")
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        store
            .take_oauth_authorization("new")
            .await
            .unwrap()
            .is_some()
    );
}

async fn pending_authorizations_capped(store: Arc<SqlStore>) {
    let max = usize::try_from(MAX_PENDING_OAUTH_AUTHORIZATIONS).unwrap();
    for i in 1..max {
        store
            .create_oauth_authorization(authorization(&format!("st-{i}"), "c", 600_000))
            .await
            .unwrap();
    }
    // The last place goes to one that expires soon.
    store
        .create_oauth_authorization(authorization("short", "c", 1_000))
        .await
        .unwrap();
    let refused = store
        .create_oauth_authorization(authorization("one-too-many", "c", 600_000))
        .await;
    match refused {
        Err(err @ StoreError::Limit(_)) => {
            assert!(err.to_string().contains("1000"), "{err}")
        }
        other => panic!("expected a limit error, got {other:?}"),
    }
    assert!(
        store
            .take_oauth_authorization("one-too-many")
            .await
            .unwrap()
            .is_none()
    );
    // Once one expires (and is purged), there is room again.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    store
        .create_oauth_authorization(authorization("fits", "c", 600_000))
        .await
        .unwrap();
    // Taking one frees a place too.
    assert!(
        store
            .create_oauth_authorization(authorization("again", "c", 600_000))
            .await
            .is_err()
    );
    assert!(
        store
            .take_oauth_authorization("st-1")
            .await
            .unwrap()
            .is_some()
    );
    store
        .create_oauth_authorization(authorization("again", "c", 600_000))
        .await
        .unwrap();
}

async fn concurrent_config_writes(store: Arc<SqlStore>) {
    // Racing creators: one row, generation 1, every caller sees it.
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .put_oauth_connection("c", "{}".into(), SecretUpdate::Keep)
                    .await
                    .unwrap()
            })
        })
        .collect();
    for handle in handles {
        assert_eq!(handle.await.unwrap().generation, 1);
    }
    // Racing distinct changes: each takes its own generation.
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .put_oauth_connection("c", format!("{{\"v\":{i}}}"), SecretUpdate::Keep)
                    .await
                    .unwrap()
                    .generation
            })
        })
        .collect();
    let mut generations = Vec::new();
    for handle in handles {
        generations.push(handle.await.unwrap());
    }
    generations.sort_unstable();
    assert_eq!(generations, (2..=9).collect::<Vec<u64>>());
}

macro_rules! suite {
    ($($backend:ident),*; $tests:tt) => {
        $(suite!(@backend $backend $tests);)*
    };
    (@backend $backend:ident [$($test:ident),*]) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $test() {
                    let (store, _keep) = super::$backend().await;
                    super::$test(store).await;
                }
            )*
        }
    };
}

suite!(sqlite, postgres; [
    crud,
    config_change_starts_afresh,
    secret_updates,
    token_writes,
    lease,
    authorization_taken_once,
    expired_authorizations_purged,
    pending_authorizations_capped,
    concurrent_config_writes
]);
