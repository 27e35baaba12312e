//! Fuzz-style property tests (proptest; `cargo fuzz` needs a nightly
//! toolchain) of the REST JSON bodies: arbitrary bytes and arbitrary JSON
//! values sent to `POST /admin/api/mcp/servers`, `/mcp/evaluate` and
//! `/mcp/import` of a registry served in-process (the real axum router) are
//! answered 2xx or 4xx, never 5xx, and every 4xx body is
//! `{"error": {"code", "message"}}`.
//!
//! Longer runs: `PROPTEST_CASES=100000 cargo test -p quiver-registry --test
//! fuzz_rest` (see RELIABILITY.md, "Fuzzing").

mod common;

use std::sync::OnceLock;

use common::{ADMIN, TestRegistry, rest, sqlite_registry};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use quiver_testkit::fuzz::{self, cases};
use serde_json::{Value, json};

/// One runtime and one registry per test binary process.
fn registry() -> &'static (tokio::runtime::Runtime, TestRegistry) {
    static REGISTRY: OnceLock<(tokio::runtime::Runtime, TestRegistry)> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let registry = runtime.block_on(sqlite_registry(|_| {}));
        (runtime, registry)
    })
}

const PATHS: &[&str] = &[
    "/admin/api/mcp/servers",
    "/admin/api/mcp/evaluate",
    "/admin/api/mcp/import",
];

/// Field names the endpoints know, so generated objects reach deep checks.
const KEYS: &[&str] = &[
    "record",
    "tools",
    "servers",
    "server_id",
    "transport",
    "stdio",
    "command",
    "args",
    "env",
    "http",
    "url",
    "headers",
    "allowed_tools",
    "denied_tools",
    "budgets",
    "max_concurrency",
    "tool_timeout_ms",
    "approval_policy",
    "isolation",
    "enabled",
    "transform",
    "labels",
];

/// String values the record parser gives meaning to.
const WORDS: &[&str] = &["stdio", "streamable_http", "*", "${ENV:X}"];

fn json_value() -> BoxedStrategy<Value> {
    fuzz::json_value(KEYS, fuzz::words(WORDS), 4)
}

/// Sends `body` to `path` as the admin; the answer must be 2xx or 4xx, and
/// a 4xx must carry the error object.
fn check(path: &str, body: &[u8]) -> Result<(), TestCaseError> {
    let (runtime, registry) = registry();
    // Bodies that are not UTF-8 go through lossily: reqwest sends text.
    let text = String::from_utf8_lossy(body);
    let (status, answer) = runtime.block_on(rest(
        registry,
        reqwest::Method::POST,
        path,
        Some(ADMIN),
        Some(&text),
    ));
    prop_assert!(
        (200..300).contains(&status) || (400..500).contains(&status),
        "POST {} {:?}: {} {}",
        path,
        text,
        status,
        answer
    );
    if (400..500).contains(&status) {
        let error = &answer["error"];
        prop_assert!(
            error["code"].as_str().is_some_and(|c| !c.is_empty())
                && error["message"].as_str().is_some_and(|m| !m.is_empty()),
            "POST {} {:?}: {} without an error object: {}",
            path,
            text,
            status,
            answer
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(cases(100))]

    /// Arbitrary bytes.
    #[test]
    fn arbitrary_bytes_are_answered_2xx_or_4xx(
        path in proptest::sample::select(PATHS),
        body in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        check(path, &body)?;
    }

    /// Arbitrary JSON values, shaped by the endpoints' field names.
    #[test]
    fn arbitrary_json_is_answered_2xx_or_4xx(
        path in proptest::sample::select(PATHS),
        value in json_value(),
    ) {
        check(path, value.to_string().as_bytes())?;
    }

}

proptest! {
    #![proptest_config(cases(40))]

    /// Records whose fields hold arbitrary values, wrapped as each endpoint
    /// expects (`{"record", "tools"}` for evaluate, `{"servers": [...]}` for
    /// import).
    #[test]
    fn arbitrary_record_fields_are_answered_2xx_or_4xx(
        fields in proptest::collection::btree_map(
            proptest::sample::select(KEYS).prop_map(str::to_owned),
            json_value(),
            0..6,
        ),
        tools in proptest::collection::vec(any::<String>(), 0..4),
    ) {
        let mut record: serde_json::Map<String, Value> = fields.into_iter().collect();
        record.insert("server_id".into(), json!("fuzz-record"));
        let record = Value::Object(record);
        check(PATHS[0], record.to_string().as_bytes())?;
        check(PATHS[1], json!({"record": record, "tools": tools}).to_string().as_bytes())?;
        check(PATHS[2], json!({"servers": [record]}).to_string().as_bytes())?;
    }
}
