//! What the API test files share (each file is its own crate and uses part
//! of this): the in-process registry of `quiver-testkit` under the names
//! these tests use, a record, and one REST request.
#![allow(dead_code, unused_imports)]

use quiver_model::{McpServerSpec, StdioConfig, Transport};
use quiver_registry::RegistryOptions;
use serde_json::Value;

pub use quiver_testkit::registry::{
    ADMIN_TOKEN as ADMIN, InProcessRegistry as TestRegistry, WORKER_TOKEN as WORKER,
};

/// A registry on a fresh SQLite file; `tweak` changes the test options.
pub async fn sqlite_registry(tweak: impl FnOnce(&mut RegistryOptions)) -> TestRegistry {
    TestRegistry::sqlite(tweak).await
}

/// A registry on a fresh PostgreSQL database.
pub async fn postgres_registry() -> TestRegistry {
    TestRegistry::postgres(|_| {}).await
}

/// A stdio record with one literal env value (`API_KEY`) and one reference
/// (`TOKEN`), allowing every tool.
pub fn spec(id: &str, command: &str) -> McpServerSpec {
    let mut spec = McpServerSpec::new(id, Transport::Stdio);
    spec.stdio = Some(StdioConfig {
        command: command.into(),
        env: [
            ("API_KEY".to_owned(), "sk-literal".to_owned()),
            ("TOKEN".to_owned(), "${ENV:TOKEN}".to_owned()),
        ]
        .into(),
        ..Default::default()
    });
    spec.allowed_tools = vec!["*".into()];
    spec
}

/// One REST request: status and JSON body (a string when not JSON).
pub async fn rest(
    registry: &TestRegistry,
    method: reqwest::Method,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, Value) {
    rest_at(&registry.http, method, path, token, body).await
}

/// [`rest`] against any registry HTTP address (`http://host:port`).
pub async fn rest_at(
    base: &str,
    method: reqwest::Method,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new().request(method, format!("{base}{path}"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_owned());
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}
