//! Changes made over the in-process registry's admin REST, and waiting for
//! workers to apply them. Included by the benchmarks that use the
//! registry's callers (`auth`, `revocation`) with
//! `#[path = "support/registry_admin.rs"] mod registry_admin;`; each has
//! its `BenchResult` at its root.

use std::fmt::Display;
use std::time::{Duration, Instant};

use quiver_testkit::registry::{ADMIN_TOKEN, InProcessRegistry};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::BenchResult;

/// How often a worker is asked whether it has applied a change.
pub const POLL: Duration = Duration::from_millis(2);
/// Bound on any one wait (a worker's first snapshot, a change reaching it):
/// past it the benchmark stops with an error rather than hang.
pub const GIVE_UP: Duration = Duration::from_secs(30);

/// An admin request (the admin token) on `registry`, which must answer
/// `expected`: its JSON answer.
pub async fn admin(
    http: &reqwest::Client,
    registry: &InProcessRegistry,
    method: Method,
    path: &str,
    body: Option<Value>,
    expected: StatusCode,
) -> BenchResult<Value> {
    let mut request = http
        .request(method.clone(), registry.url(path))
        .bearer_auth(ADMIN_TOKEN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await?;
    let status = response.status();
    let answer: Value = response.json().await?;
    if status != expected {
        return Err(format!("{method} {path}: {status} (expected {expected}): {answer}").into());
    }
    Ok(answer)
}

/// Stores policy `name` allowing only `server_id`; 201 (it must be new).
#[allow(dead_code)] // the oauth_grants benchmark's policy allows two records
pub async fn create_policy(
    http: &reqwest::Client,
    registry: &InProcessRegistry,
    name: &str,
    server_id: &str,
) -> BenchResult<()> {
    admin(
        http,
        registry,
        Method::PUT,
        &format!("/admin/api/policies/{name}"),
        Some(json!({"allowed_server_ids": [server_id]})),
        StatusCode::CREATED,
    )
    .await?;
    Ok(())
}

/// A new API key named `name` of `policy`: its id and its secret.
pub async fn create_key(
    http: &reqwest::Client,
    registry: &InProcessRegistry,
    name: &str,
    policy: &str,
) -> BenchResult<(String, String)> {
    let created = admin(
        http,
        registry,
        Method::POST,
        "/admin/api/keys",
        Some(json!({"name": name, "policy": policy})),
        StatusCode::CREATED,
    )
    .await?;
    match (created["id"].as_str(), created["key"].as_str()) {
        (Some(id), Some(key)) => Ok((id.to_owned(), key.to_owned())),
        _ => Err(format!("POST /admin/api/keys: no id or key in {created}").into()),
    }
}

/// Runs `check` every [`POLL`] until it answers `true`: the time since
/// `from`. Past [`GIVE_UP`] an error saying `what` was not seen.
pub async fn poll_until<F, Fut>(
    what: impl Display,
    from: Instant,
    mut check: F,
) -> BenchResult<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = BenchResult<bool>>,
{
    let mut ticks = tokio::time::interval(POLL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if check().await? {
            return Ok(from.elapsed());
        }
        if from.elapsed() > GIVE_UP {
            return Err(format!("no {what} within {GIVE_UP:?}").into());
        }
    }
}
