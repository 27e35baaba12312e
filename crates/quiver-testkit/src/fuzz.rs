//! Property-test support (proptest) shared by the parsers' fuzz-style tests:
//! the number of cases, and arbitrary JSON shaped like a domain's documents.

use proptest::prelude::*;
use serde_json::Value;

/// `default` cases per property unless the environment variable
/// `PROPTEST_CASES` sets the number (longer runs: `PROPTEST_CASES=100000`).
pub fn cases(default: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    ProptestConfig::with_cases(cases)
}

/// Strings for JSON leaves: a word of `vocabulary` (values the parser gives
/// meaning to, such as `"stdio"` or `"*"`), a short identifier-like string,
/// or any string at all.
///
/// # Panics
/// When `vocabulary` is empty.
pub fn words(vocabulary: &'static [&'static str]) -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        proptest::sample::select(vocabulary).prop_map(str::to_owned),
        "[a-z0-9_.*-]{0,12}",
        any::<String>(),
    ]
}

/// Arbitrary JSON up to `depth` levels deep whose objects use the field
/// names in `keys` (or short random ones) and whose strings come from
/// `strings`: random documents that get past a parser's first "unknown
/// field" check and exercise what lies behind it.
///
/// # Panics
/// When `keys` is empty.
pub fn json_value(
    keys: &'static [&'static str],
    strings: impl Strategy<Value = String> + 'static,
    depth: u32,
) -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        strings.prop_map(Value::String),
    ];
    leaf.prop_recursive(depth, 48, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map(
                prop_oneof![
                    proptest::sample::select(keys).prop_map(str::to_owned),
                    "[a-z_]{1,8}"
                ],
                inner,
                0..6
            )
            .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
    .boxed()
}
