//! A person consents for a principal in Chromium (docs/reference.md
//! R-OAUTH-8, issue #24): a registry on SQLite, an authorization server that
//! asks who is consenting (`quiver-testkit-oauth --consent-page`), a
//! per-user connection, an API key of the registry as the principal and a
//! worker.
//!
//! What it shows: the principal's call is refused with a link; the callback
//! that link's flow comes back to does nothing without the cookie of the
//! browser that followed the link; in Chromium (tests/web/consent.spec.mjs)
//! the person follows a fresh link, types their user and approves, lands on
//! the registry's "connected" page, and a second visit of the link is
//! refused; from then on the principal's calls act as that person.

use std::time::Duration;

use reqwest::StatusCode;

use crate::harness::{WORKER, WorkerProcess};
use crate::oauth::{OAuthServer, callback_with, client, sqlite_registry};
use crate::oauth_per_user::{call_as, consent_link, create_key, per_user_server};

const CONNECTION: &str = "tracker";
const USER: &str = "carol";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_consents_in_chromium_and_the_principal_acts_as_them() {
    let (_dir, registry) = sqlite_registry().await;
    let server = OAuthServer::start(&["--consent-page"]).await;
    per_user_server(&registry, &server).await;
    let (carol, revision) = create_key(&registry, USER, "team").await;
    let no_args: [&str; 0] = [];
    let worker = WorkerProcess::start_without_callers(&registry.grpc_url(), WORKER, &no_args).await;
    worker.synced(revision, Duration::from_secs(10)).await;

    // Someone else holding the callback URL of a link's flow, without the
    // cookie of the browser that followed the link, stores nothing.
    let stolen = callback_of(&consent_link(&worker, &carol).await).await;
    let response = callback_with(&stolen, "").await;
    assert_eq!(response.status(), StatusCode::FORBIDDEN, "{response:?}");
    let page = response.text().await.unwrap_or_default();
    assert!(
        page.contains("oauth-error") && page.contains("did not start the authorization"),
        "{page}"
    );
    assert_eq!(server.stats().await["authorization_code_grants"], 0);

    // The person follows a fresh link in Chromium and consents as carol.
    let link = consent_link(&worker, &carol).await;
    crate::web_admin::run_browser_script(
        "consent.spec.mjs",
        &[
            ("QUIVER_CONSENT_URL", link.clone()),
            ("QUIVER_CONSENT_USER", USER.to_owned()),
            ("QUIVER_CONSENT_CONNECTION", CONNECTION.to_owned()),
        ],
    )
    .await;
    let (status, body) = call_as(&worker, &carol).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["content"][0]["text"], USER, "{body}");
    assert_eq!(server.stats().await["authorization_code_grants"], 1);

    // No token the server issued, nor the link's secret, in either log.
    let mut secrets = server.issued_tokens().await;
    assert!(!secrets.is_empty(), "the server issued tokens");
    secrets.push(link.rsplit('/').next().unwrap_or_default().to_owned());
    for log in [registry.log_tail(), worker.log_tail()] {
        for secret in &secrets {
            assert!(!log.contains(secret.as_str()), "a secret is in a log");
        }
    }
}

/// Follows `link` without a browser, approving on the consent page as
/// another user: the callback URL the authorization server sends back to.
async fn callback_of(link: &str) -> String {
    let to_server = location(client().get(link).send().await.expect("GET link"));
    let page = client()
        .get(&to_server)
        .send()
        .await
        .expect("GET consent page")
        .text()
        .await
        .expect("consent page");
    let request = page
        .split("name=\"request\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no request id on the consent page: {page}"));
    location(
        client()
            .post(to_server.split('?').next().unwrap_or_default())
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            // The id is base64url: nothing in it needs escaping.
            .body(format!("request={request}&user=mallory"))
            .send()
            .await
            .expect("POST consent"),
    )
}

fn location(response: reqwest::Response) -> String {
    assert!(response.status().is_redirection(), "{response:?}");
    response
        .headers()
        .get(reqwest::header::LOCATION)
        .and_then(|value| value.to_str().ok())
        .expect("redirect location")
        .to_owned()
}
