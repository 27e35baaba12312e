//! Property tests: arbitrary input never panics the record parser or the
//! validator, and every rejection names a field of the record.

use std::collections::BTreeMap;

use proptest::prelude::*;
use quiver_model::{
    ApprovalMode, ApprovalPolicy, Budgets, Format, HttpConfig, Isolation, McpServerSpec,
    ModelError, PrefixOp, Protocol, StdioConfig, Strictness, TransformStep, Transport,
    parse_document, parse_record_value, validate,
};
use quiver_testkit::fuzz::{self, cases};

/// Top-level fields of a record: every error must be about one of them.
const FIELDS: &[&str] = &[
    "server_id",
    "display_name",
    "transport",
    "stdio",
    "http",
    "tool_namespace",
    "allowed_tools",
    "denied_tools",
    "allowed_resources",
    "allowed_prompts",
    "approval_policy",
    "approval_tools",
    "budgets",
    "isolation",
    "protocol",
    "enabled",
    "transform",
    "labels",
];

fn names_a_record_field(field: &str) -> bool {
    let field = field
        .strip_prefix("servers[")
        .and_then(|rest| rest.split_once("]."))
        .map_or(field, |(_, rest)| rest);
    FIELDS.iter().any(|known| {
        field == *known
            || field.starts_with(&format!("{known}."))
            || field.starts_with(&format!("{known}["))
    })
}

fn assert_errors_name_fields(err: &ModelError) -> Result<(), TestCaseError> {
    match err {
        ModelError::Syntax { message, .. } => prop_assert!(!message.is_empty()),
        ModelError::Invalid(errors) => {
            prop_assert!(!errors.is_empty());
            for error in errors {
                prop_assert!(
                    error.field.is_empty()
                        || names_a_record_field(&error.field)
                        || error.message == "unknown field",
                    "error names no record field: {error}"
                );
                prop_assert!(!error.message.is_empty());
            }
        }
    }
    Ok(())
}

/// Strings biased towards the characters that matter to the rules.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z0-9_-]{0,70}",
        "[a-z*.\\[\\]{},?-]{0,12}",
        "(\\$\\{ENV:[A-Z_0-9]{0,5}(:-[a-z]{0,3})?\\}?|[a-z ]){0,4}",
        "(https?|ftp)://[a-z.]{0,10}(:[0-9]{1,5})?/[a-z]{0,5}",
        any::<String>(),
    ]
}

fn map() -> impl Strategy<Value = BTreeMap<String, String>> {
    proptest::collection::btree_map(text(), text(), 0..3)
}

fn spec() -> impl Strategy<Value = McpServerSpec> {
    let transport = prop_oneof![
        Just(Transport::Stdio),
        Just(Transport::StreamableHttp),
        Just(Transport::HttpSseLegacy)
    ];
    let stdio = proptest::option::of(
        (
            text(),
            proptest::collection::vec(text(), 0..3),
            map(),
            proptest::collection::vec(text(), 0..2),
            proptest::option::of(text()),
            any::<bool>(),
        )
            .prop_map(
                |(command, args, env, env_from, cwd, inherit_env)| StdioConfig {
                    command,
                    args,
                    env,
                    env_from,
                    cwd,
                    inherit_env,
                },
            ),
    );
    let http = proptest::option::of((text(), map(), proptest::option::of(text())).prop_map(
        |(url, headers, auth_ref)| HttpConfig {
            url,
            headers,
            auth_ref,
        },
    ));
    let budgets =
        (0u64..5_000_000, 0u32..10_000, 0u64..100_000_000).prop_map(|(t, c, o)| Budgets {
            tool_timeout_ms: t,
            max_concurrency: c,
            max_tool_output_bytes: o,
            session_idle_ms: None,
        });
    let transform = proptest::collection::vec(
        prop_oneof![
            text().prop_map(|p| TransformStep::Prefix(PrefixOp::Add(p))),
            text().prop_map(TransformStep::Suffix),
        ],
        0..2,
    );
    let approval = (
        prop_oneof![
            Just(ApprovalPolicy::Never),
            Just(ApprovalPolicy::Always),
            Just(ApprovalPolicy::Policy)
        ],
        proptest::collection::btree_map(
            text(),
            prop_oneof![Just(ApprovalMode::Never), Just(ApprovalMode::Always)],
            0..2,
        ),
    );
    (
        (
            text(),
            proptest::option::of(text()),
            transport,
            stdio,
            http,
            proptest::option::of(text()),
        ),
        (
            proptest::collection::vec(text(), 0..3),
            proptest::collection::vec(text(), 0..2),
            (
                proptest::collection::vec(text(), 0..2),
                proptest::collection::vec(text(), 0..2),
            ),
            approval,
            budgets,
        ),
        (
            any::<bool>(),
            transform,
            map(),
            any::<bool>(),
            proptest::sample::select(Protocol::ALL.to_vec()),
        ),
    )
        .prop_map(
            |(
                (server_id, display_name, transport, stdio, http, tool_namespace),
                (
                    allowed_tools,
                    denied_tools,
                    (allowed_resources, allowed_prompts),
                    (approval_policy, approval_tools),
                    budgets,
                ),
                (enabled, transform, labels, per_session, protocol),
            )| McpServerSpec {
                server_id,
                display_name,
                transport,
                stdio,
                http,
                tool_namespace,
                allowed_tools,
                denied_tools,
                allowed_resources,
                allowed_prompts,
                approval_policy,
                approval_tools,
                budgets,
                isolation: if per_session {
                    Isolation::PerSession
                } else {
                    Isolation::Shared
                },
                protocol,
                enabled,
                transform,
                labels,
            },
        )
}

proptest! {
    #![proptest_config(cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic_the_parser(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let text = String::from_utf8_lossy(&bytes);
        for format in [Format::Toml, Format::Json] {
            for strictness in [Strictness::Lenient, Strictness::Strict] {
                if let Err(err) = parse_document(&text, format, strictness) {
                    assert_errors_name_fields(&err)?;
                }
            }
        }
    }

    #[test]
    fn arbitrary_records_validate_without_panic(spec in spec()) {
        match validate(&spec) {
            Ok(()) => {
                // A valid record survives its own TOML and JSON forms unchanged.
                let toml = parse_document(&spec.to_toml(), Format::Toml, Strictness::Strict);
                prop_assert_eq!(toml.map(|r| r[0].spec.clone()), Ok(spec.clone()));
                let json = serde_json::to_string(&spec).unwrap();
                let json = parse_document(&json, Format::Json, Strictness::Strict);
                prop_assert_eq!(json.map(|r| r[0].spec.clone()), Ok(spec));
            }
            Err(err) => assert_errors_name_fields(&err)?,
        }
    }

    #[test]
    fn arbitrary_json_values_are_rejected_with_fields(value in json_value(3)) {
        if let Err(err) = parse_record_value(value, Strictness::Strict) {
            assert_errors_name_fields(&err)?;
        }
    }
}

/// JSON documents shaped like records: real field names with random values.
fn json_value(depth: u32) -> BoxedStrategy<serde_json::Value> {
    fuzz::json_value(FIELDS, text(), depth)
}
