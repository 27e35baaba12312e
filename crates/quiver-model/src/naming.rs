//! Names under which MCP tools are injected into chat requests (R-NAME-1/2, docs/reference.md §13.3).
//!
//! The injected name is `mcp__<b64(server_id)>__<b64(tool_name)>` (URL-safe
//! base64 without padding), so any raw tool name, whatever its characters,
//! becomes a valid LLM function name (`^[a-zA-Z0-9_-]{1,64}$`). The
//! compatibility form `mcp.<server_id>.<tool_name>` is accepted when routing.
//!
//! The `tool_name` encoded in an injected name is the *exposed* name, i.e. the
//! raw MCP name after the record's `transform` steps; without transforms the
//! two are the same. Routing therefore maps injected names back through the
//! table of names injected for the request, never by decoding alone.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::record::{PrefixOp, TransformStep};
use crate::validate::is_valid_server_id;

/// Longest injected name: the function-name limit shared by major LLM providers.
pub const MAX_INJECTED_NAME_LEN: usize = 64;

/// Longest raw (or transformed) MCP tool name accepted, in bytes.
///
/// The MCP specification recommends names of at most 128 characters; bytes
/// are used so the bound on the encoded size is exact.
pub const MAX_TOOL_NAME_LEN: usize = 128;

/// Prefix of every injected name.
pub const INJECTED_PREFIX: &str = "mcp__";

/// Prefix of the compatibility form `mcp.<server_id>.<tool_name>`.
pub const COMPAT_PREFIX: &str = "mcp.";

const SEPARATOR: &str = "__";

/// Longest text of a foreign value quoted in an error message.
const QUOTE_LIMIT: usize = 80;

/// One tool of one server: what an injected name resolves to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ToolRef {
    /// The record's `server_id`.
    pub server_id: String,
    /// The tool name as exposed (raw MCP name after the record's transforms).
    pub tool_name: String,
}

impl ToolRef {
    /// A reference to `tool_name` of `server_id`; nothing is validated.
    pub fn new(server_id: impl Into<String>, tool_name: impl Into<String>) -> Self {
        ToolRef {
            server_id: server_id.into(),
            tool_name: tool_name.into(),
        }
    }

    /// `<server_id>.<tool_name>`, the subject of task and session patterns (R-FILTER-2).
    pub fn qualified_name(&self) -> String {
        qualified_name(&self.server_id, &self.tool_name)
    }

    /// `mcp.<server_id>.<tool_name>`, the compatibility form.
    pub fn compat_name(&self) -> String {
        format!("{COMPAT_PREFIX}{}.{}", self.server_id, self.tool_name)
    }

    /// The injected name, see [`injected_name`].
    pub fn injected_name(&self) -> Result<String, NameError> {
        injected_name(&self.server_id, &self.tool_name)
    }
}

impl fmt::Display for ToolRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.server_id, self.tool_name)
    }
}

/// `<server_id>.<tool_name>`, the subject of task and session patterns (R-FILTER-2).
pub fn qualified_name(server_id: &str, tool_name: &str) -> String {
    format!("{server_id}.{tool_name}")
}

/// Why a tool name cannot be injected. See [`validate_tool_name`] for the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolNameError {
    /// The name is the empty string.
    #[error("tool name is empty")]
    Empty,
    /// The name is longer than [`MAX_TOOL_NAME_LEN`] bytes.
    #[error("tool name is {len} bytes long, at most {MAX_TOOL_NAME_LEN} are allowed")]
    TooLong {
        /// Length of the name in bytes.
        len: usize,
    },
    /// The name contains a control character.
    #[error("tool name contains a control character at byte {index}")]
    ControlCharacter {
        /// Byte offset of the first offending character.
        index: usize,
    },
    /// The name contains whitespace.
    #[error("tool name contains whitespace at byte {index}")]
    Whitespace {
        /// Byte offset of the first offending character.
        index: usize,
    },
    /// The name contains a character that renders as nothing or reorders
    /// the text around it (see [`is_invisible`]), so it could pass for
    /// another name (`ec\u{200b}ho` beside `echo`).
    #[error("tool name contains the invisible character U+{code_point:04X} at byte {index}")]
    InvisibleCharacter {
        /// Byte offset of the first offending character.
        index: usize,
        /// The character's code point.
        code_point: u32,
    },
}

/// Whether `c` is invisible or reorders text: format characters (Unicode
/// `Cf`: zero-width space/joiners, bidirectional marks, embeddings,
/// overrides and isolates, word joiner, byte-order mark, tags …), the other
/// default-ignorable code points (variation selectors, Hangul fillers,
/// Mongolian and Khmer invisibles, combining grapheme joiner) and blank
/// glyphs that are not `White_Space` (Braille pattern blank). Names holding
/// one can look exactly like another name in logs, patterns and the admin UI.
pub fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{034F}'
            | '\u{0600}'..='\u{0605}'
            | '\u{061C}'
            | '\u{06DD}'
            | '\u{070F}'
            | '\u{0890}'..='\u{0891}'
            | '\u{08E2}'
            | '\u{115F}'..='\u{1160}'
            | '\u{17B4}'..='\u{17B5}'
            | '\u{180B}'..='\u{180F}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{2800}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FEFF}'
            | '\u{FFA0}'
            | '\u{FFF0}'..='\u{FFFB}'
            | '\u{110BD}'
            | '\u{110CD}'
            | '\u{13430}'..='\u{1343F}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0000}'..='\u{E0FFF}'
    )
}

/// Checks the rule for raw (and transformed) MCP tool names.
///
/// A name is valid when it is 1 to [`MAX_TOOL_NAME_LEN`] bytes of UTF-8 with no
/// control character (Unicode `Cc`), no whitespace (Unicode `White_Space`,
/// which includes look-alike spaces such as U+00A0 and U+3000) and no
/// invisible or text-reordering character ([`is_invisible`]). Everything
/// else — non-ASCII letters, `.`, `/`, `-`, `_`, punctuation — is allowed:
/// base64 makes any such name a valid function name, and rejecting
/// invisible separators keeps names unambiguous in logs, patterns and the
/// admin UI.
pub fn validate_tool_name(name: &str) -> Result<(), ToolNameError> {
    if name.is_empty() {
        return Err(ToolNameError::Empty);
    }
    if name.len() > MAX_TOOL_NAME_LEN {
        return Err(ToolNameError::TooLong { len: name.len() });
    }
    for (index, c) in name.char_indices() {
        if c.is_control() {
            return Err(ToolNameError::ControlCharacter { index });
        }
        if c.is_whitespace() {
            return Err(ToolNameError::Whitespace { index });
        }
        if is_invisible(c) {
            return Err(ToolNameError::InvisibleCharacter {
                index,
                code_point: u32::from(c),
            });
        }
    }
    Ok(())
}

/// Why no injected name can be built for a tool.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The server id does not match `^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`.
    #[error("server id {server_id:?} is invalid: it must match ^[A-Za-z0-9][A-Za-z0-9_-]{{0,63}}$")]
    InvalidServerId {
        /// The id, shortened when very long.
        server_id: String,
    },
    /// The tool name breaks the rule of [`validate_tool_name`].
    #[error("invalid tool name: {0}")]
    InvalidToolName(#[from] ToolNameError),
    /// The encoded name is longer than [`MAX_INJECTED_NAME_LEN`] characters.
    #[error(
        "injected name would be {len} characters long, LLM function names allow at most {MAX_INJECTED_NAME_LEN}"
    )]
    TooLong {
        /// Length the injected name would have.
        len: usize,
    },
}

/// Length of the injected name of a server id and tool name of these byte lengths.
pub fn injected_name_len(server_id_len: usize, tool_name_len: usize) -> usize {
    // Saturating so absurd inputs report a huge length instead of overflowing.
    let encoded = |len: usize| {
        (len / 3)
            .saturating_mul(4)
            .saturating_add([0, 2, 3][len % 3])
    };
    (INJECTED_PREFIX.len() + SEPARATOR.len())
        .saturating_add(encoded(server_id_len))
        .saturating_add(encoded(tool_name_len))
}

/// `mcp__<b64url(server_id)>__<b64url(tool_name)>`, always matching
/// `^[a-zA-Z0-9_-]{1,64}$` (R-NAME-1).
pub fn injected_name(server_id: &str, tool_name: &str) -> Result<String, NameError> {
    if !is_valid_server_id(server_id) {
        return Err(NameError::InvalidServerId {
            server_id: quote(server_id),
        });
    }
    validate_tool_name(tool_name)?;
    let len = injected_name_len(server_id.len(), tool_name.len());
    if len > MAX_INJECTED_NAME_LEN {
        return Err(NameError::TooLong { len });
    }
    Ok(encode(server_id, tool_name))
}

fn encode(server_id: &str, tool_name: &str) -> String {
    let mut name = String::with_capacity(injected_name_len(server_id.len(), tool_name.len()));
    name.push_str(INJECTED_PREFIX);
    URL_SAFE_NO_PAD.encode_string(server_id, &mut name);
    name.push_str(SEPARATOR);
    URL_SAFE_NO_PAD.encode_string(tool_name, &mut name);
    name
}

/// Every `(server_id, tool_name)` whose canonical injected name is exactly `name`.
///
/// Base64url uses `_` as a digit, so a split at the first `__` is not obviously
/// right; this tries the split at every `__`, decodes both sides, and keeps
/// the pairs that are valid and encode back to exactly `name`. With today's
/// rules the result has at most one element: server ids are ASCII letters,
/// digits, `-` and `_`, whose encodings contain only letters and digits, so
/// the separator is the first `_`; and no valid UTF-8 text encodes to `__`
/// (twelve consecutive one bits would need a byte `0xF8`–`0xFF`). Callers must
/// still not rely on that: routing resolves a model's tool call against the
/// map of names actually injected for the request (R-NAME-2), and uses this
/// function only for diagnostics. A name that is not in that map is refused.
pub fn parse_injected_name(name: &str) -> Vec<ToolRef> {
    let mut found = Vec::new();
    if name.len() > MAX_INJECTED_NAME_LEN {
        return found;
    }
    let Some(rest) = name.strip_prefix(INJECTED_PREFIX) else {
        return found;
    };
    for (at, _) in rest.char_indices() {
        if !rest[at..].starts_with(SEPARATOR) {
            continue;
        }
        let (server_part, tool_part) = (&rest[..at], &rest[at + SEPARATOR.len()..]);
        let (Some(server_id), Some(tool_name)) = (decode(server_part), decode(tool_part)) else {
            continue;
        };
        if injected_name(&server_id, &tool_name).as_deref() == Ok(name) {
            found.push(ToolRef {
                server_id,
                tool_name,
            });
        }
    }
    found
}

fn decode(encoded: &str) -> Option<String> {
    let bytes = URL_SAFE_NO_PAD.decode(encoded).ok()?;
    String::from_utf8(bytes).ok()
}

/// The pair named by the compatibility form `mcp.<server_id>.<tool_name>`.
///
/// Server ids contain no dot, so the id ends at the first `.` after `mcp.`;
/// the tool name may contain dots. Both parts must be valid.
pub fn parse_compat_name(name: &str) -> Option<ToolRef> {
    let rest = name.strip_prefix(COMPAT_PREFIX)?;
    let (server_id, tool_name) = rest.split_once('.')?;
    if !is_valid_server_id(server_id) || validate_tool_name(tool_name).is_err() {
        return None;
    }
    Some(ToolRef::new(server_id, tool_name))
}

/// Whether `name` matches `^[a-zA-Z0-9_-]{1,64}$`, the function-name rule
/// every injected name satisfies.
pub fn is_valid_function_name(name: &str) -> bool {
    (1..=MAX_INJECTED_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The exposed name of raw tool `raw`: the record's `transform` steps applied
/// in order (docs/reference.md §13.3).
///
/// `prefix = "x_"` always prepends; `prefix = { remove, add }` strips a
/// leading `remove` when present and then always prepends `add`;
/// `suffix = "_x"` always appends. The result may be invalid (for instance
/// too long); callers check it with [`validate_tool_name`].
pub fn transformed_tool_name(steps: &[TransformStep], raw: &str) -> String {
    let mut name = raw.to_owned();
    for step in steps {
        name = match step {
            TransformStep::Prefix(PrefixOp::Add(add)) => format!("{add}{name}"),
            TransformStep::Prefix(PrefixOp::Replace(replace)) => {
                let kept = name.strip_prefix(replace.remove.as_str()).unwrap_or(&name);
                format!("{}{kept}", replace.add)
            }
            TransformStep::Suffix(suffix) => format!("{name}{suffix}"),
        };
    }
    name
}

/// `value` for an error message, cut after [`QUOTE_LIMIT`] characters so
/// hostile input cannot blow up logs.
pub(crate) fn quote(value: &str) -> String {
    match value.char_indices().nth(QUOTE_LIMIT) {
        Some((cut, _)) => format!("{}…", &value[..cut]),
        None => value.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::PrefixReplace;

    #[test]
    fn encodes_known_names() {
        assert_eq!(
            injected_name("fs", "read_file").unwrap(),
            "mcp__ZnM__cmVhZF9maWxl"
        );
        assert_eq!(
            parse_injected_name("mcp__ZnM__cmVhZF9maWxl"),
            [ToolRef::new("fs", "read_file")]
        );
    }

    #[test]
    fn length_formula_matches_the_encoder() {
        for s in 1..=20 {
            for t in 1..=60 {
                let server = "s".repeat(s);
                let tool = "t".repeat(t);
                assert_eq!(encode(&server, &tool).len(), injected_name_len(s, t));
            }
        }
    }

    #[test]
    fn longest_names_fit_exactly() {
        // 5 + 4 + 2 + 52 = 63 with a 3-byte server id and a 39-byte tool name;
        // a 40th byte needs two more characters (54 + 11 = 65).
        let server = "abc";
        assert_eq!(injected_name(server, &"t".repeat(39)).unwrap().len(), 63);
        assert_eq!(
            injected_name(server, &"t".repeat(40)).unwrap_err(),
            NameError::TooLong { len: 65 }
        );
    }

    #[test]
    fn invalid_inputs_are_errors() {
        assert!(matches!(
            injected_name("a.b", "x"),
            Err(NameError::InvalidServerId { .. })
        ));
        assert!(matches!(
            injected_name("", "x"),
            Err(NameError::InvalidServerId { .. })
        ));
        assert_eq!(
            injected_name("fs", ""),
            Err(NameError::InvalidToolName(ToolNameError::Empty))
        );
        assert_eq!(
            injected_name("fs", "a b"),
            Err(NameError::InvalidToolName(ToolNameError::Whitespace {
                index: 1
            }))
        );
        assert_eq!(
            injected_name("fs", "a\u{7}"),
            Err(NameError::InvalidToolName(
                ToolNameError::ControlCharacter { index: 1 }
            ))
        );
        assert_eq!(
            validate_tool_name(&"x".repeat(129)),
            Err(ToolNameError::TooLong { len: 129 })
        );
        validate_tool_name(&"x".repeat(128)).unwrap();
        validate_tool_name("é.日本/x-y_z?").unwrap();
        for (name, index, code_point) in [
            ("ec\u{200b}ho", 2, 0x200B),
            ("echo\u{202e}", 4, 0x202E),
            ("\u{2066}echo\u{2069}", 0, 0x2066),
            ("e\u{00ad}cho", 1, 0x00AD),
            ("echo\u{FEFF}", 4, 0xFEFF),
            ("ech\u{E0041}o", 3, 0xE0041),
            ("e\u{3164}cho", 1, 0x3164),
            ("ec\u{2060}ho", 2, 0x2060),
            ("ec\u{FE0F}ho", 2, 0xFE0F),
        ] {
            assert_eq!(
                validate_tool_name(name),
                Err(ToolNameError::InvisibleCharacter { index, code_point }),
                "{name:?}"
            );
        }
        // Look-alike spaces are whitespace.
        for name in ["ec\u{00a0}ho", "ec\u{3000}ho", "ec\u{2009}ho"] {
            assert_eq!(
                validate_tool_name(name),
                Err(ToolNameError::Whitespace { index: 2 }),
                "{name:?}"
            );
        }
        // Visible non-ASCII stays allowed (emoji, accents, CJK, RTL letters).
        for name in ["café", "工具", "אקו", "🔧fix", "naïve-é"] {
            validate_tool_name(name).unwrap();
        }
        let long = "x".repeat(10_000);
        let message = injected_name(&long, "t").unwrap_err().to_string();
        assert!(message.len() < 300, "{message}");
    }

    #[test]
    fn parse_rejects_foreign_and_non_canonical_names() {
        for name in [
            "",
            "mcp__",
            "mcp____",
            "read_file",
            "mcp__ZnM",
            "mcp__ZnM__",
            "mcp__ZnM__cmVhZF9maWxl__eA",
            "mcp__ZnM_cmVhZF9maWxl",
            // Non-canonical trailing bits: "ZnN" decodes like "ZnM" but is not its encoding.
            "mcp__ZnN__cmVhZF9maWxl",
            // 0xFF 0xFF: "__8" is base64 of invalid UTF-8.
            "mcp__ZnM____8",
            // "ZS4x" is "e.1", not a valid server id.
            "mcp__ZS4x__eA",
            // "IA" is " ", not a valid tool name.
            "mcp__ZnM__IA",
            "mcp__ZnM__cmVhZF9maWxl=",
        ] {
            assert_eq!(parse_injected_name(name), [], "{name}");
        }
        let too_long = format!("mcp__ZnM__{}", "dGVzdA".repeat(20));
        assert_eq!(parse_injected_name(&too_long), []);
    }

    #[test]
    fn compat_form() {
        assert_eq!(
            parse_compat_name("mcp.fs.read.file.v2"),
            Some(ToolRef::new("fs", "read.file.v2"))
        );
        assert_eq!(
            ToolRef::new("fs", "a.b").compat_name(),
            "mcp.fs.a.b".to_owned()
        );
        for name in [
            "mcp.fs",
            "mcp.fs.",
            "mcp..x",
            "mcp.-a.x",
            "fs.x",
            "mcp.fs.a b",
        ] {
            assert_eq!(parse_compat_name(name), None, "{name}");
        }
    }

    #[test]
    fn function_name_rule() {
        assert!(is_valid_function_name("mcp__ZnM__eA"));
        assert!(is_valid_function_name("a-b_c"));
        assert!(!is_valid_function_name(""));
        assert!(!is_valid_function_name("a.b"));
        assert!(!is_valid_function_name(&"a".repeat(65)));
    }

    #[test]
    fn transforms_apply_in_order() {
        let steps = vec![
            TransformStep::Prefix(PrefixOp::Add("playwright_".into())),
            TransformStep::Prefix(PrefixOp::Replace(PrefixReplace {
                remove: "playwright_stock_".into(),
                add: "my_".into(),
            })),
            TransformStep::Suffix("_v2".into()),
        ];
        assert_eq!(transformed_tool_name(&steps, "stock_click"), "my_click_v2");
        // `remove` absent: `add` is still prepended.
        assert_eq!(
            transformed_tool_name(&steps, "click"),
            "my_playwright_click_v2"
        );
        assert_eq!(transformed_tool_name(&[], "click"), "click");
    }
}
