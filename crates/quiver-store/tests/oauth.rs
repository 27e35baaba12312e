//! OAuth connections and pending authorizations on both backends: SQLite (a
//! file in a temporary directory) and PostgreSQL (a fresh database on this
//! machine's server).

mod backends;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use quiver_store::{
    GrantKey, MAX_OAUTH_TICKETS_PER_GRANT, MAX_PENDING_OAUTH_AUTHORIZATIONS, OAuthAuthorizationRow,
    OAuthStatus, OAuthTicketRow, OAuthTokens, SecretUpdate, SqlStore, Store, StoreError,
};

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
        principal: None,
    }
}

fn ticket(sha: &str, name: &str, principal: &str, age_ms: i64) -> OAuthTicketRow {
    let now = Utc::now();
    OAuthTicketRow {
        ticket_sha256: sha.into(),
        name: name.into(),
        principal: principal.into(),
        sealed_secret: format!("sealed-{sha}"),
        created_at: ms(now - chrono::Duration::milliseconds(age_ms)),
        expires_at: ms(now + chrono::Duration::minutes(10)),
    }
}

/// Principals' grants of a per-user connection: each its own row, tokens,
/// generation and lease; the connection's own row untouched; a settings
/// change or a deletion takes them all.
async fn user_grants(store: Arc<SqlStore>) {
    let connection = store
        .put_oauth_connection("gh", r#"{"per_user":true}"#.into(), SecretUpdate::Keep)
        .await
        .unwrap();
    let alice = GrantKey::user("gh", "key:alice");
    let bob = GrantKey::user("gh", "key:bob");
    assert!(store.get_oauth_grant(alice).await.unwrap().is_none());
    // A first grant is conditional on the connection's generation.
    assert!(
        store
            .store_oauth_tokens(alice, connection.generation + 1, tokens("a-1", false))
            .await
            .unwrap()
            .is_none()
    );
    let granted = store
        .store_oauth_tokens(alice, connection.generation, tokens("a-1", false))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(granted.principal.as_deref(), Some("key:alice"));
    assert_eq!(granted.config, r#"{"per_user":true}"#);
    assert_eq!(granted.credentials.as_deref(), Some("a-1"));
    assert_eq!(granted.status, OAuthStatus::Connected);
    assert!(granted.connected_at.is_some());
    // The connection's own row holds no tokens.
    let own = store
        .get_oauth_grant(GrantKey::fleet("gh"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((own.credentials, own.principal), (None, None));
    // A refresh is conditional on the grant's own generation.
    assert!(
        store
            .store_oauth_tokens(alice, granted.generation + 5, tokens("a-2", true))
            .await
            .unwrap()
            .is_none()
    );
    let refreshed = store
        .store_oauth_tokens(alice, granted.generation, tokens("a-2", true))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (refreshed.credentials.as_deref(), refreshed.refresh_count),
        (Some("a-2"), 1)
    );
    // A new consent replaces the grant.
    let again = store
        .store_oauth_tokens(alice, connection.generation, tokens("a-3", false))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.credentials.as_deref(), Some("a-3"));
    assert!(again.generation > refreshed.generation);
    store
        .store_oauth_tokens(bob, connection.generation, tokens("b-1", false))
        .await
        .unwrap()
        .unwrap();
    // Leases are per grant.
    let ttl = Duration::from_secs(60);
    assert!(store.acquire_oauth_lease(alice, "r1", ttl).await.unwrap());
    assert!(!store.acquire_oauth_lease(alice, "r2", ttl).await.unwrap());
    assert!(store.acquire_oauth_lease(bob, "r2", ttl).await.unwrap());
    store.release_oauth_lease(alice, "r1").await.unwrap();
    assert!(store.acquire_oauth_lease(alice, "r2", ttl).await.unwrap());
    store.set_oauth_error(bob, "boom").await.unwrap();
    let bob_row = store.get_oauth_grant(bob).await.unwrap().unwrap();
    assert_eq!(bob_row.last_error.as_deref(), Some("boom"));
    let reconsent = store
        .set_oauth_needs_reconsent(bob, bob_row.generation, "invalid_grant")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reconsent.status, OAuthStatus::NeedsReconsent);
    assert_eq!(reconsent.credentials, None);

    let principals = |rows: Vec<quiver_store::OAuthConnectionRow>| -> Vec<String> {
        rows.into_iter().filter_map(|row| row.principal).collect()
    };
    assert_eq!(
        principals(
            store
                .list_oauth_user_grants(Some("gh"), None)
                .await
                .unwrap()
        ),
        ["key:alice", "key:bob"]
    );
    assert_eq!(
        principals(
            store
                .list_oauth_user_grants(None, Some("key:bob"))
                .await
                .unwrap()
        ),
        ["key:bob"]
    );
    assert!(
        store
            .list_oauth_user_grants(Some("gh"), Some("key:carol"))
            .await
            .unwrap()
            .is_empty()
    );

    // Revoking one principal's grant leaves the other's.
    assert!(
        store
            .delete_oauth_user_grant("gh", "key:bob")
            .await
            .unwrap()
    );
    assert!(
        !store
            .delete_oauth_user_grant("gh", "key:bob")
            .await
            .unwrap()
    );
    assert!(store.get_oauth_grant(bob).await.unwrap().is_none());
    assert!(store.get_oauth_grant(alice).await.unwrap().is_some());

    // Changed settings drop every principal's grant; so does deleting.
    store
        .put_oauth_connection(
            "gh",
            r#"{"per_user":true,"scopes":["x"]}"#.into(),
            SecretUpdate::Keep,
        )
        .await
        .unwrap();
    assert!(
        store
            .list_oauth_user_grants(None, None)
            .await
            .unwrap()
            .is_empty()
    );
    let current = store.get_oauth_connection("gh").await.unwrap().unwrap();
    store
        .store_oauth_tokens(alice, current.generation, tokens("a-4", false))
        .await
        .unwrap()
        .unwrap();
    assert!(store.delete_oauth_connection("gh").await.unwrap());
    assert!(store.get_oauth_grant(alice).await.unwrap().is_none());
}

/// Authorization links: taken once, capped per principal and connection
/// (the oldest go), dropped with the principal's grant.
async fn tickets(store: Arc<SqlStore>) {
    store
        .put_oauth_connection("gh", r#"{"per_user":true}"#.into(), SecretUpdate::Keep)
        .await
        .unwrap();
    let cap = i64::try_from(MAX_OAUTH_TICKETS_PER_GRANT).unwrap();
    for age in 0..=cap {
        // Oldest first: t-{cap} is the oldest.
        store
            .create_oauth_ticket(ticket(&format!("t-{age}"), "gh", "key:alice", age * 1000))
            .await
            .unwrap();
    }
    store
        .create_oauth_ticket(ticket("b-0", "gh", "key:bob", 0))
        .await
        .unwrap();
    // The oldest of alice's went; the others are there, once each.
    assert!(
        store
            .take_oauth_ticket(&format!("t-{cap}"))
            .await
            .unwrap()
            .is_none()
    );
    let taken = store.take_oauth_ticket("t-0").await.unwrap().unwrap();
    assert_eq!(
        (taken.name.as_str(), taken.principal.as_str()),
        ("gh", "key:alice")
    );
    assert!(store.take_oauth_ticket("t-0").await.unwrap().is_none());
    // Concurrent takers: exactly one wins.
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.take_oauth_ticket("t-1").await.unwrap().is_some() })
        })
        .collect();
    let mut winners = 0;
    for handle in handles {
        winners += usize::from(handle.await.unwrap());
    }
    assert_eq!(winners, 1);
    // Revoking bob's grant (he has none yet) takes his links.
    assert!(
        !store
            .delete_oauth_user_grant("gh", "key:bob")
            .await
            .unwrap()
    );
    assert!(store.take_oauth_ticket("b-0").await.unwrap().is_none());
    assert!(store.take_oauth_ticket("t-2").await.unwrap().is_some());
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
        .store_oauth_tokens(GrantKey::fleet("gh"), 1, tokens("tok", false))
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
        .store_oauth_tokens(GrantKey::fleet("c"), 2, tokens("tok", false))
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
            .store_oauth_tokens(GrantKey::fleet("missing"), 1, tokens("t", false))
            .await
            .unwrap()
            .is_none()
    );
    // A stale generation writes nothing.
    assert!(
        store
            .store_oauth_tokens(GrantKey::fleet("c"), 7, tokens("t", false))
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .store_oauth_tokens(GrantKey::fleet("c"), u64::MAX, tokens("t", false))
            .await
            .unwrap()
            .is_none()
    );
    let untouched = store.get_oauth_connection("c").await.unwrap().unwrap();
    assert_eq!(untouched.generation, 1);
    assert_eq!(untouched.credentials, None);

    store
        .set_oauth_error(GrantKey::fleet("c"), "boom")
        .await
        .unwrap();
    let expires = Utc::now() + chrono::Duration::minutes(30);
    let granted = store
        .store_oauth_tokens(
            GrantKey::fleet("c"),
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
    store
        .set_oauth_error(GrantKey::fleet("c"), "timeout")
        .await
        .unwrap();
    let errored = store.get_oauth_connection("c").await.unwrap().unwrap();
    assert_eq!(errored.last_error.as_deref(), Some("timeout"));
    assert_eq!(errored.generation, 2);
    assert_eq!(errored.status, OAuthStatus::Connected);
    assert_eq!(errored.credentials.as_deref(), Some("tok-1"));
    store
        .set_oauth_error(GrantKey::fleet("missing"), "x")
        .await
        .unwrap();

    tokio::time::sleep(Duration::from_millis(5)).await;
    let refreshed = store
        .store_oauth_tokens(
            GrantKey::fleet("c"),
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
            .store_oauth_tokens(GrantKey::fleet("c"), 2, tokens("tok-3", true))
            .await
            .unwrap()
            .is_none()
    );

    // A new grant moves connected_at and keeps the refresh count.
    let regranted = store
        .store_oauth_tokens(GrantKey::fleet("c"), 3, tokens("tok-4", false))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(regranted.refresh_count, 1);
    assert!(regranted.connected_at.unwrap() > connected_at);

    // Needs reconsent: tokens cleared, error recorded, conditional too.
    assert!(
        store
            .set_oauth_needs_reconsent(GrantKey::fleet("c"), 3, "stale")
            .await
            .unwrap()
            .is_none()
    );
    let revoked = store
        .set_oauth_needs_reconsent(GrantKey::fleet("c"), 4, "invalid_grant")
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
            .acquire_oauth_lease(GrantKey::fleet("missing"), "a", Duration::from_secs(60))
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
                    .acquire_oauth_lease(GrantKey::fleet("c"), &holder, Duration::from_secs(60))
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
            .acquire_oauth_lease(GrantKey::fleet("c"), &winner, Duration::from_secs(60))
            .await
            .unwrap()
    );
    assert!(
        !store
            .acquire_oauth_lease(GrantKey::fleet("c"), "intruder", Duration::from_secs(60))
            .await
            .unwrap()
    );
    // Release by a non-holder does nothing.
    store
        .release_oauth_lease(GrantKey::fleet("c"), "intruder")
        .await
        .unwrap();
    assert!(
        !store
            .acquire_oauth_lease(GrantKey::fleet("c"), "intruder", Duration::from_secs(60))
            .await
            .unwrap()
    );
    // Release by the holder frees it.
    store
        .release_oauth_lease(GrantKey::fleet("c"), &winner)
        .await
        .unwrap();
    assert!(
        store
            .acquire_oauth_lease(GrantKey::fleet("c"), "next", Duration::from_millis(300))
            .await
            .unwrap()
    );
    assert!(
        !store
            .acquire_oauth_lease(GrantKey::fleet("c"), "late", Duration::from_secs(60))
            .await
            .unwrap()
    );
    // An expired lease can be taken over.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        store
            .acquire_oauth_lease(GrantKey::fleet("c"), "late", Duration::from_secs(60))
            .await
            .unwrap()
    );
    assert!(
        !store
            .acquire_oauth_lease(GrantKey::fleet("c"), "next", Duration::from_secs(60))
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

suite!(sqlite, postgres; [
    crud,
    config_change_starts_afresh,
    secret_updates,
    token_writes,
    lease,
    authorization_taken_once,
    expired_authorizations_purged,
    pending_authorizations_capped,
    concurrent_config_writes,
    user_grants,
    tickets
]);
