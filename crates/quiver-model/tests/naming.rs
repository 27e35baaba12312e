//! Property tests of injected tool names (R-NAME-1/2): every name built is a
//! valid LLM function name and routes back to exactly the pair it came from,
//! including when the base64 text contains `_`.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use proptest::prelude::*;
use quiver_model::is_valid_server_id;
use quiver_model::naming::{
    MAX_INJECTED_NAME_LEN, MAX_TOOL_NAME_LEN, NameError, ToolRef, injected_name, injected_name_len,
    is_invisible, is_valid_function_name, parse_compat_name, parse_injected_name,
    validate_tool_name,
};

fn b64(text: &str) -> String {
    URL_SAFE_NO_PAD.encode(text)
}

fn server_id() -> impl Strategy<Value = String> {
    "[A-Za-z0-9][A-Za-z0-9_-]{0,63}"
}

/// Characters allowed in tool names, weighted towards the ones whose UTF-8
/// bytes put `_` (63) or `-` (62) into the base64 text.
fn tool_char() -> impl Strategy<Value = char> {
    prop_oneof![
        3 => prop::sample::select(
            "abcXYZ019._-/:?~>".chars().collect::<Vec<_>>()
        ),
        2 => prop::sample::select(vec![
            'ÿ', 'ÿ', '¿', 'é', '日', '本', '\u{3FFF}', '\u{FFFD}', '\u{FFFF}', '\u{200B}',
            '\u{10FFFF}', '😀',
        ]),
        2 => any::<char>(),
    ]
    .prop_filter("no control, whitespace or invisible character", |c| {
        !c.is_control() && !c.is_whitespace() && !is_invisible(*c)
    })
}

/// Valid raw tool names: 1 to 128 bytes, any length in characters.
fn tool_name() -> impl Strategy<Value = String> {
    prop::collection::vec(tool_char(), 1..=128).prop_map(|chars| {
        let mut name = String::new();
        for c in chars {
            if name.len() + c.len_utf8() > MAX_TOOL_NAME_LEN {
                break;
            }
            name.push(c);
        }
        name
    })
}

/// Mostly short names, so that most pairs fit in 64 characters.
fn short_tool_name() -> impl Strategy<Value = String> {
    prop::collection::vec(tool_char(), 1..=12).prop_map(|chars| chars.into_iter().collect())
}

fn assert_round_trip(server_id: &str, tool_name: &str) -> Result<(), TestCaseError> {
    match injected_name(server_id, tool_name) {
        Ok(name) => {
            prop_assert!(is_valid_function_name(&name), "{name}");
            prop_assert!(name.len() <= MAX_INJECTED_NAME_LEN);
            prop_assert!(
                name.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            );
            prop_assert_eq!(
                name.len(),
                injected_name_len(server_id.len(), tool_name.len())
            );
            // Exactly one pair: see the doc of `parse_injected_name` for why
            // today's rules leave no ambiguity.
            prop_assert_eq!(
                parse_injected_name(&name),
                vec![ToolRef::new(server_id, tool_name)]
            );
        }
        Err(NameError::TooLong { len }) => {
            let actual = "mcp__".len() + b64(server_id).len() + "__".len() + b64(tool_name).len();
            prop_assert_eq!(len, actual);
            prop_assert!(len > MAX_INJECTED_NAME_LEN);
        }
        Err(other) => {
            return Err(TestCaseError::fail(format!(
                "valid inputs {server_id:?}/{tool_name:?} rejected: {other}"
            )));
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn injected_names_are_valid_and_round_trip(server_id in server_id(), tool_name in tool_name()) {
        assert_round_trip(&server_id, &tool_name)?;
    }

    #[test]
    fn short_injected_names_round_trip(
        server_id in "[A-Za-z0-9][A-Za-z0-9_-]{0,8}",
        tool_name in short_tool_name(),
    ) {
        assert_round_trip(&server_id, &tool_name)?;
    }

    #[test]
    fn encodings_leave_the_separator_unambiguous(server_id in server_id(), tool_name in tool_name()) {
        // The server part never contains `_` and the tool part never `__`,
        // which is what makes the first `__` after `mcp__` the separator.
        prop_assert!(b64(&server_id).bytes().all(|b| b.is_ascii_alphanumeric()));
        prop_assert!(!b64(&tool_name).contains("__"));
    }

    #[test]
    fn compat_form_round_trips(server_id in server_id(), tool_name in tool_name()) {
        let tool = ToolRef::new(&server_id, &tool_name);
        prop_assert_eq!(parse_compat_name(&tool.compat_name()), Some(tool));
    }

    #[test]
    fn dotted_tool_names_round_trip(
        server_id in server_id(),
        parts in prop::collection::vec("[a-z_-]{1,6}", 1..5),
    ) {
        let tool_name = parts.join(".");
        let tool = ToolRef::new(&server_id, &tool_name);
        prop_assert_eq!(parse_compat_name(&tool.compat_name()), Some(tool));
        assert_round_trip(&server_id, &tool_name)?;
    }

    #[test]
    fn parsing_arbitrary_text_only_returns_exact_encodings(
        name in prop_oneof![
            "mcp__[A-Za-z0-9_-]{0,59}",
            "[A-Za-z0-9_.-]{0,80}",
            any::<String>(),
        ]
    ) {
        for tool in parse_injected_name(&name) {
            prop_assert_eq!(tool.injected_name(), Ok(name.clone()));
        }
        if let Some(tool) = parse_compat_name(&name) {
            prop_assert!(is_valid_server_id(&tool.server_id));
            prop_assert!(validate_tool_name(&tool.tool_name).is_ok());
            prop_assert_eq!(tool.compat_name(), name);
        }
    }
}

#[test]
fn encodings_with_underscore_and_dash_round_trip() {
    // Each of these tool names has `_` or `-` in its base64url text, next to
    // the separator where possible.
    let cases = [
        ("fs", "???", "Pz8_"),
        ("fs", "~~~", "fn5-"),
        ("fs", "ab?", "YWI_"),
        ("fs", "aÿ", "YcO_"),
        ("fs", "\u{FFFF}", "77-_"),
        ("a", "x.?", "eC4_"),
        ("a", "???~~~", "Pz8_fn5-"),
        ("a_b-c", "?.?", "Py4_"),
    ];
    for (server_id, tool_name, encoded) in cases {
        assert_eq!(b64(tool_name), encoded, "{tool_name:?}");
        assert!(encoded.contains(['_', '-']), "{encoded}");
        let name = injected_name(server_id, tool_name).unwrap();
        assert_eq!(name, format!("mcp__{}__{encoded}", b64(server_id)));
        assert_eq!(
            parse_injected_name(&name),
            [ToolRef::new(server_id, tool_name)],
            "{name}"
        );
    }
    // "mcp__ZnM__Pz8_" ends in `_`; "mcp__YQ__Pz8_fn5-" has `_` after the separator's `__`.
    assert_eq!(injected_name("fs", "???").unwrap(), "mcp__ZnM__Pz8_");
}

#[test]
fn search_for_double_underscore_encodings() {
    // Look for tool names whose encoding contains "__", at each of the three
    // byte alignments, over every character of the Basic Multilingual Plane
    // and a sample beyond, alone and after characters ending in one bits.
    let mut with_underscore = 0;
    let tails = ['?', '\u{7F}', 'ÿ', '\u{FFFF}', '\u{3FFF}'];
    let chars = (0..=0xFFFF_u32)
        .chain((0x10000..=0x10FFFF).step_by(97))
        .chain([0x10FFFF, 0x1FFFF, 0xFFFFF])
        .filter_map(char::from_u32);
    for c in chars {
        for prefix in ["", "a", "ab"] {
            for tail in std::iter::once(None).chain(tails.iter().copied().map(Some)) {
                let mut text = String::from(prefix);
                text.extend(tail);
                text.push(c);
                let encoded = b64(&text);
                assert!(!encoded.contains("__"), "{text:?} encodes to {encoded}");
                if encoded.contains('_') {
                    with_underscore += 1;
                    if validate_tool_name(&text).is_ok() && text.len() <= 30 {
                        let name = injected_name("s", &text).unwrap();
                        assert_eq!(parse_injected_name(&name), [ToolRef::new("s", &text)]);
                    }
                }
            }
        }
    }
    assert!(with_underscore > 1_000, "{with_underscore}");
    // "__" needs twelve consecutive one bits, i.e. bytes UTF-8 never uses:
    // 0xFF 0xFF encodes to "__8" but is not a string, so it names no tool.
    assert_eq!(URL_SAFE_NO_PAD.encode([0xFF, 0xFF]), "__8");
    assert_eq!(parse_injected_name("mcp__ZnM____8"), []);
}

#[test]
fn no_utf8_byte_pair_has_twelve_consecutive_one_bits() {
    // A run of twelve one bits spanning three bytes covers the middle byte
    // (0xFF, never in UTF-8), so checking adjacent pairs proves that no valid
    // string's base64 can contain "__" at any alignment.
    let utf8_bytes: Vec<u8> = (0..=0xF4_u8)
        .filter(|b| !matches!(b, 0xC0 | 0xC1))
        .collect();
    let mut longest = 0;
    for &a in &utf8_bytes {
        for &b in &utf8_bytes {
            let window = u16::from_be_bytes([a, b]);
            let mut run = 0;
            for bit in (0..16).rev() {
                run = if window >> bit & 1 == 1 { run + 1 } else { 0 };
                longest = longest.max(run);
            }
        }
    }
    assert_eq!(longest, 11);
}

#[test]
fn too_long_is_reported_with_the_real_length() {
    let server_id = "s".repeat(64);
    let err = injected_name(&server_id, "t").unwrap_err();
    assert_eq!(
        err,
        NameError::TooLong {
            len: 5 + 86 + 2 + 2
        }
    );
    assert!(err.to_string().contains("95"), "{err}");
}
