//! The fleet's memory of deleted gateway sessions (`McpSessionService`,
//! docs/reference.md §13.4) through the registry's real gRPC listener, on
//! both backends.

mod common;

use common::{TestRegistry, WORKER, postgres_registry, sqlite_registry};
use quiver_proto::credentials::{Credentials, SessionClient};
use quiver_proto::v1 as pb;
use tonic::transport::Channel;

async fn client(registry: &TestRegistry, token: Option<&str>) -> SessionClient {
    let channel = Channel::from_shared(registry.grpc.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    Credentials::new(token, None)
        .unwrap()
        .session_client(channel)
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn digest(n: u8) -> String {
    format!("{n:02x}").repeat(32)
}

async fn revoked(client: &mut SessionClient, session: &str) -> pb::IsSessionRevokedResponse {
    client
        .is_session_revoked(pb::IsSessionRevokedRequest {
            session_sha256: session.to_owned(),
        })
        .await
        .unwrap()
        .into_inner()
}

async fn deletions_are_remembered_until_the_ids_expire(registry: TestRegistry) {
    let mut a = client(&registry, Some(WORKER)).await;
    let mut b = client(&registry, Some(WORKER)).await;
    let until = now_ms() + 60_000;
    assert!(!revoked(&mut b, &digest(1)).await.revoked);
    for _ in 0..2 {
        // Idempotent.
        a.revoke_session(pb::RevokeSessionRequest {
            session_sha256: digest(1),
            expires_at_ms: until,
        })
        .await
        .unwrap();
    }
    let answer = revoked(&mut b, &digest(1)).await;
    assert!(answer.revoked);
    assert_eq!(answer.expires_at_ms, until);
    assert!(!revoked(&mut b, &digest(2)).await.revoked);
    // A revocation that ends soon is forgotten when it ends.
    a.revoke_session(pb::RevokeSessionRequest {
        session_sha256: digest(3),
        expires_at_ms: now_ms() + 300,
    })
    .await
    .unwrap();
    assert!(revoked(&mut b, &digest(3)).await.revoked);
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert!(!revoked(&mut b, &digest(3)).await.revoked);

    // Refusals name the field; no credential, no answer.
    let err = a
        .revoke_session(pb::RevokeSessionRequest {
            session_sha256: "not-a-digest".into(),
            expires_at_ms: until,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("session_sha256"),
        "{}",
        err.message()
    );
    let err = a
        .revoke_session(pb::RevokeSessionRequest {
            session_sha256: digest(4),
            expires_at_ms: now_ms() + 365 * 24 * 3600 * 1000,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("expires_at_ms"), "{}", err.message());
    let mut anonymous = client(&registry, None).await;
    let err = anonymous
        .is_session_revoked(pb::IsSessionRevokedRequest {
            session_sha256: digest(1),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
}

#[tokio::test]
async fn deletions_are_remembered_on_sqlite() {
    deletions_are_remembered_until_the_ids_expire(sqlite_registry(|_| {}).await).await;
}

#[tokio::test]
async fn deletions_are_remembered_on_postgres() {
    deletions_are_remembered_until_the_ids_expire(postgres_registry().await).await;
}
