//! Tests of `broker`: refused links and per-principal links, against a real SQLite store.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use quiver_mcp::credentials::{Renewal, token_fingerprint};
use quiver_store::{OAuthTicketRow, SecretUpdate, SqlStore, Store};

use super::connections::sealing_owner;
use super::*;
use crate::error::RegistryError;
use crate::oauth::seal::Keyring;
use crate::oauth::spec::OAuthConnectionSpec;

async fn broker() -> (OAuthBroker, Arc<dyn Store>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("registry.db").display());
    let store: Arc<dyn Store> = Arc::new(SqlStore::open_sqlite(&url).await.expect("store"));
    let spec = json_spec(true);
    store
        .put_oauth_connection("gh", spec, SecretUpdate::Keep)
        .await
        .expect("connection");
    let broker = OAuthBroker::new(
        store.clone(),
        Some(Keyring::ephemeral("test")),
        "http://registry.test",
        "replica".into(),
    );
    (broker, store, dir)
}

fn json_spec(per_user: bool) -> String {
    OAuthConnectionSpec {
        server_url: "http://127.0.0.1:9/mcp".into(),
        per_user,
        ..Default::default()
    }
    .config_json()
}

fn link_error(result: Result<ConnectOutcome, RegistryError>) -> String {
    match result {
        Err(err) => err.to_string(),
        Ok(outcome) => panic!("the link was followed: {outcome:?}"),
    }
}

/// A link whose ticket is stored as the broker would, expiring at
/// `expires_at`.
async fn stored_link(
    broker: &OAuthBroker,
    store: &Arc<dyn Store>,
    expires_at: DateTime<Utc>,
) -> String {
    let secret = "ab".repeat(32);
    store
        .create_oauth_ticket(OAuthTicketRow {
            ticket_sha256: token_fingerprint(&secret),
            name: "gh".into(),
            principal: "key:alice".into(),
            sealed_secret: broker
                .seal(&sealing_owner("gh", Some("key:alice")), "link", &secret)
                .expect("seal"),
            created_at: Utc::now() - chrono::Duration::minutes(20),
            expires_at,
        })
        .await
        .expect("ticket");
    secret
}

#[tokio::test]
async fn bad_links_are_refused_naming_the_step_and_start_nothing() {
    let (broker, store, _dir) = broker().await;
    // Malformed and unknown secrets.
    for secret in ["", "xyz", &"0".repeat(64), &"g".repeat(64)] {
        let error = link_error(broker.follow_link(secret).await);
        assert!(error.contains("oauth link"), "{secret:?}: {error}");
    }
    // Expired: refused, and taken (a second try finds nothing either).
    let expired = stored_link(&broker, &store, Utc::now() - chrono::Duration::seconds(1)).await;
    let error = link_error(broker.follow_link(&expired).await);
    assert!(error.contains("has expired"), "{error}");
    assert!(
        store
            .live_oauth_ticket("gh", "key:alice", Utc::now() - chrono::Duration::hours(1))
            .await
            .expect("read")
            .is_none()
    );
    // A connection turned fleet-wide since: the link starts nothing.
    let live = stored_link(&broker, &store, Utc::now() + chrono::Duration::minutes(5)).await;
    store
        .put_oauth_connection("gh", json_spec(false), SecretUpdate::Keep)
        .await
        .expect("settings");
    let error = link_error(broker.follow_link(&live).await);
    assert!(error.contains("oauth link"), "{error}");
    assert!(
        store
            .list_oauth_user_grants(Some("gh"), None)
            .await
            .expect("grants")
            .is_empty()
    );
}

#[tokio::test]
async fn a_principal_without_a_grant_gets_its_own_lasting_link() {
    let (broker, _store, _dir) = broker().await;
    let asked = |principal: &'static str| {
        let broker = broker.clone();
        async move {
            match broker
                .access_token_for("gh", Some(principal), Renewal::Current, "worker")
                .await
                .expect("answer")
            {
                Issued::Consent(link) => link.url,
                other => panic!("not a consent link: {other:?}"),
            }
        }
    };
    let alice = asked("key:alice").await;
    assert!(
        alice.starts_with("http://registry.test/oauth/authorize/"),
        "{alice}"
    );
    assert_eq!(
        asked("key:alice").await,
        alice,
        "the same link while it lasts"
    );
    assert_ne!(asked("key:bob").await, alice, "bob's own");
    // Without a principal a per-user connection serves nobody.
    assert!(matches!(
        broker
            .access_token_for("gh", None, Renewal::Current, "worker")
            .await,
        Ok(Issued::NoPrincipal)
    ));
}
