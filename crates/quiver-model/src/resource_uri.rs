//! Resource URIs as `allowed_resources` judges them (docs/reference.md
//! §13.5).
//!
//! A glob such as `file:///data/*` says which resources a caller may use,
//! but `*` matches any substring: `file:///data/../secret/key.txt` matches
//! it as text, and the server resolves it outside `/data`. Normalising
//! (RFC 3986 §5.2.4) before matching would not close this: the server, not
//! the worker, decides how it decodes a URI (once or twice, `\` as `/`,
//! `;` parameters, a query read as part of a path), so the worker cannot
//! know which form the server will act on. URIs whose meaning depends on
//! such a choice are therefore **refused** ([`check`]), whatever the
//! patterns say, and only the others are matched ([`ResourcePatterns`]).
//!
//! A URI is refused when, as written or after any of up to
//! [`MAX_DECODINGS`] rounds of percent-decoding:
//!
//! - it has a **dot segment**: a `/`-separated part (the query and fragment
//!   included) made only of dots and spaces (`.`, `..`, `...`, `.. `),
//!   alone or before a `?`, `#` or `;` (`..;x`, `..?x`), so `%2e%2e`,
//!   `..%2f`, `%252e%252e` and a `..` in the query count;
//! - it has an **empty segment inside the path** (`//` after the authority,
//!   before any `?` or `#`): joined to a base directory, `/etc/passwd`
//!   replaces it;
//! - it has a **backslash** (read as `/` by WHATWG URL parsers and Windows);
//! - it has a **control character** (C0, DEL or C1);
//! - its bytes are **not UTF-8** (this refuses overlong forms such as
//!   `%c0%ae` for `.`);
//!
//! (full-width and other look-alike dots, slashes and backslashes, which
//! Windows "best fit" conversion and NFKC turn into ASCII, count as those),
//! or when, as written, a `%` is not followed by two hex digits (a
//! **malformed encoding**), or it still holds an encoding after
//! [`MAX_DECODINGS`] rounds.
//!
//! [`expand_template`] fills an RFC 6570 URI template, so that completion
//! values of a resource template can be judged as the URIs they make.

use std::borrow::Cow;
use std::fmt;

use crate::pattern::{PatternError, PatternSet};

/// How many rounds of percent-decoding [`check`] looks through; a URI
/// still encoded after them is refused.
pub const MAX_DECODINGS: usize = 4;

/// Why a resource URI is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UriRefusal {
    /// A `.` or `..` segment (or one of dots and spaces only).
    DotSegment,
    /// `//` inside the path.
    EmptySegment,
    /// A `\`.
    Backslash,
    /// A control character.
    ControlCharacter,
    /// A `%` without two hex digits, or decoded bytes that are not UTF-8.
    MalformedEncoding,
    /// Still percent-encoded after [`MAX_DECODINGS`] rounds.
    TooManyEncodings,
}

impl fmt::Display for UriRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UriRefusal::DotSegment => "it has a dot segment (`.` or `..`, decoded)",
            UriRefusal::EmptySegment => "its path has an empty segment (`//`, decoded)",
            UriRefusal::Backslash => "it has a backslash (decoded)",
            UriRefusal::ControlCharacter => "it has a control character (decoded)",
            UriRefusal::MalformedEncoding => {
                "its percent-encoding is malformed (`%` without two hex digits, or not UTF-8)"
            }
            UriRefusal::TooManyEncodings => "it is percent-encoded too many times",
        })
    }
}

impl std::error::Error for UriRefusal {}

/// Whether `uri` may be matched against `allowed_resources` at all; see the
/// module documentation for what is refused.
pub fn check(uri: &str) -> Result<(), UriRefusal> {
    if !well_formed(uri.as_bytes()) {
        return Err(UriRefusal::MalformedEncoding);
    }
    let mut layer: Cow<'_, str> = Cow::Borrowed(uri);
    for _ in 0..=MAX_DECODINGS {
        check_layer(&layer)?;
        match decode(layer.as_bytes()) {
            None => return Ok(()),
            Some(bytes) => {
                layer = Cow::Owned(
                    String::from_utf8(bytes).map_err(|_| UriRefusal::MalformedEncoding)?,
                );
            }
        }
    }
    Err(UriRefusal::TooManyEncodings)
}

/// Every `%` is followed by two hex digits.
fn well_formed(bytes: &[u8]) -> bool {
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            if at + 2 >= bytes.len() || hex(bytes[at + 1]).is_none() || hex(bytes[at + 2]).is_none()
            {
                return false;
            }
            at += 3;
        } else {
            at += 1;
        }
    }
    true
}

fn hex(byte: u8) -> Option<u8> {
    (byte as char).to_digit(16).map(|d| d as u8)
}

/// One round of percent-decoding (a `%` without two hex digits stays as
/// it is); `None` when there is nothing to decode.
fn decode(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut decoded = false;
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%'
            && at + 2 < bytes.len()
            && let (Some(high), Some(low)) = (hex(bytes[at + 1]), hex(bytes[at + 2]))
        {
            out.push(high << 4 | low);
            decoded = true;
            at += 3;
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    decoded.then_some(out)
}

/// Characters that "best fit" conversions (Windows ANSI code pages) and
/// NFKC turn into `.`, `/` or `\`, as those.
fn fold_lookalikes(layer: &str) -> Cow<'_, str> {
    if layer.is_ascii() {
        return Cow::Borrowed(layer);
    }
    Cow::Owned(
        layer
            .chars()
            .map(|c| match c {
                '\u{FF0E}' | '\u{2024}' | '\u{FE52}' => '.',
                '\u{FF0F}' | '\u{2215}' | '\u{2044}' => '/',
                '\u{FF3C}' | '\u{FE68}' | '\u{2216}' => '\\',
                c => c,
            })
            .collect(),
    )
}

fn check_layer(layer: &str) -> Result<(), UriRefusal> {
    if layer.chars().any(char::is_control) {
        return Err(UriRefusal::ControlCharacter);
    }
    let layer = fold_lookalikes(layer);
    let layer = layer.as_ref();
    if layer.contains('\\') {
        return Err(UriRefusal::Backslash);
    }
    for segment in layer.split('/') {
        let head = segment.split(['?', '#', ';']).next().unwrap_or_default();
        if is_dots(segment) || is_dots(head) {
            return Err(UriRefusal::DotSegment);
        }
    }
    if path(layer).contains("//") {
        return Err(UriRefusal::EmptySegment);
    }
    Ok(())
}

/// A segment of dots and spaces only, with at least one dot.
fn is_dots(segment: &str) -> bool {
    segment.contains('.') && segment.bytes().all(|b| b == b'.' || b == b' ')
}

/// The path of `uri`: after `scheme:` and `//authority`, before `?` or `#`.
fn path(uri: &str) -> &str {
    let rest = match uri.split_once(':') {
        Some((scheme, rest))
            if scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')) =>
        {
            rest
        }
        _ => uri,
    };
    let rest = match rest.strip_prefix("//") {
        Some(authority) => authority
            .find(['/', '?', '#'])
            .map_or("", |end| &authority[end..]),
        None => rest,
    };
    let end = rest.find(['?', '#']).unwrap_or(rest.len());
    &rest[..end]
}

/// `allowed_resources`, compiled: a URI matches when [`check`] accepts it
/// and a pattern matches it as written.
#[derive(Debug, Clone)]
pub struct ResourcePatterns {
    set: PatternSet,
}

impl ResourcePatterns {
    /// Compiles the patterns; the error names the first bad one.
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Self, PatternError> {
        Ok(ResourcePatterns {
            set: PatternSet::new(patterns)?,
        })
    }

    /// Why `uri` is refused whatever the patterns say, or whether a
    /// pattern matches it.
    pub fn judge(&self, uri: &str) -> Result<bool, UriRefusal> {
        check(uri)?;
        Ok(self.set.matches(uri))
    }

    /// Whether `uri` may be used.
    pub fn matches(&self, uri: &str) -> bool {
        self.judge(uri) == Ok(true)
    }
}

/// Fills the RFC 6570 URI template `template` (levels 1–3 and the prefix
/// modifier of level 4; values are strings) with the values `value` gives.
/// An expression none of whose variables has a value is kept as written,
/// so the result can still be matched against patterns that cover it.
pub fn expand_template<'a>(template: &str, value: impl Fn(&str) -> Option<&'a str>) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let Some(close) = rest[open..].find('}') else {
            out.push_str(&rest[open..]);
            return out;
        };
        let expression = &rest[open + 1..open + close];
        match expand_expression(expression, &value) {
            Some(expanded) => out.push_str(&expanded),
            None => out.push_str(&rest[open..=open + close]),
        }
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    out
}

/// One `{…}` expression; `None` when none of its variables has a value.
fn expand_expression<'a>(
    expression: &str,
    value: &impl Fn(&str) -> Option<&'a str>,
) -> Option<String> {
    let (operator, list) = match expression.chars().next() {
        Some(op @ ('+' | '#' | '.' | '/' | ';' | '?' | '&')) => (Some(op), &expression[1..]),
        _ => (None, expression),
    };
    // (first, separator, named, if empty, reserved allowed)
    let (first, separator, named, if_empty, reserved) = match operator {
        None => ("", ",", false, "", false),
        Some('+') => ("", ",", false, "", true),
        Some('#') => ("#", ",", false, "", true),
        Some('.') => (".", ".", false, "", false),
        Some('/') => ("/", "/", false, "", false),
        Some(';') => (";", ";", true, "", false),
        Some('?') => ("?", "&", true, "=", false),
        _ => ("&", "&", true, "=", false),
    };
    let mut parts = Vec::new();
    for spec in list.split(',') {
        let spec = spec.trim_end_matches('*');
        let (name, prefix) = match spec.split_once(':') {
            Some((name, length)) => (name, length.parse::<usize>().ok()),
            None => (spec, None),
        };
        let Some(text) = value(name) else {
            continue;
        };
        let text = match prefix {
            Some(length) => text.chars().take(length).collect::<String>(),
            None => text.to_owned(),
        };
        let encoded = encode(&text, reserved);
        parts.push(if !named {
            encoded
        } else if encoded.is_empty() {
            format!("{name}{if_empty}")
        } else {
            format!("{name}={encoded}")
        });
    }
    if parts.is_empty() {
        return None;
    }
    Some(format!("{first}{}", parts.join(separator)))
}

/// Percent-encodes `text` as RFC 6570 does: unreserved characters stay, and
/// with `reserved` also reserved characters and existing `%XX` triplets.
fn encode(text: &str, reserved: bool) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while at < bytes.len() {
        let byte = bytes[at];
        let keep = byte.is_ascii_alphanumeric()
            || matches!(byte, b'-' | b'.' | b'_' | b'~')
            || (reserved && b":/?#[]@!$&'()*+,;=".contains(&byte));
        if keep {
            out.push(byte as char);
        } else if reserved
            && byte == b'%'
            && at + 2 < bytes.len()
            && hex(bytes[at + 1]).is_some()
            && hex(bytes[at + 2]).is_some()
        {
            out.push_str(&text[at..at + 3]);
            at += 3;
            continue;
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
        at += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_probes_uris_are_refused() {
        let data = ResourcePatterns::new(&["file:///data/*"]).unwrap();
        assert!(data.matches("file:///data/notes.md"));
        assert!(data.matches("file:///data/sub/dir/notes.md"));
        assert!(data.matches("file:///data/dir/"));
        assert!(data.matches("file:///data/a%20b.md"));
        assert!(data.matches("file:///data/x.md?version=2"));
        assert!(data.matches("file:///data/...md"));
        assert!(data.matches("file:///data/.hidden"));
        for (uri, why) in [
            ("file:///data/../secret/key.txt", UriRefusal::DotSegment),
            ("file:///data/./notes.md", UriRefusal::DotSegment),
            ("file:///data/%2e%2e/secret/key.txt", UriRefusal::DotSegment),
            ("file:///data/%2E%2E/secret", UriRefusal::DotSegment),
            ("file:///data/.%2e/secret", UriRefusal::DotSegment),
            ("file:///data/..%2fsecret/key.txt", UriRefusal::DotSegment),
            ("file:///data/x%2f..%2f..%2fsecret", UriRefusal::DotSegment),
            ("file:///data/%252e%252e/secret", UriRefusal::DotSegment),
            ("file:///data//../secret/key.txt", UriRefusal::DotSegment),
            ("file:///data/x/..", UriRefusal::DotSegment),
            ("file:///data/..?x=1", UriRefusal::DotSegment),
            ("file:///data/..#frag", UriRefusal::DotSegment),
            ("file:///data/..;x/secret", UriRefusal::DotSegment),
            ("file:///data/x?p=/../../secret", UriRefusal::DotSegment),
            ("file:///data/.. /secret", UriRefusal::DotSegment),
            ("file:///data/.../secret", UriRefusal::DotSegment),
            ("file:///data//etc/passwd", UriRefusal::EmptySegment),
            ("file:///data/%2f%2fetc/passwd", UriRefusal::EmptySegment),
            ("file:///data/..\\secret", UriRefusal::Backslash),
            ("file:///data/%5c..%5csecret", UriRefusal::Backslash),
            ("file:///data/x\0.md", UriRefusal::ControlCharacter),
            ("file:///data/x%00.md", UriRefusal::ControlCharacter),
            ("file:///data/x%0a.md", UriRefusal::ControlCharacter),
            ("file:///data/x\u{85}.md", UriRefusal::ControlCharacter),
            ("file:///data/x%C2%85.md", UriRefusal::ControlCharacter),
            ("file:///data/x%7f.md", UriRefusal::ControlCharacter),
            ("file:///data/x%zz.md", UriRefusal::MalformedEncoding),
            ("file:///data/x%2", UriRefusal::MalformedEncoding),
            ("file:///data/x%", UriRefusal::MalformedEncoding),
            (
                "file:///data/%c0%ae%c0%ae/secret",
                UriRefusal::MalformedEncoding,
            ),
            ("file:///data/%ff", UriRefusal::MalformedEncoding),
            (
                "file:///data/\u{FF0E}\u{FF0E}/secret",
                UriRefusal::DotSegment,
            ),
            (
                "file:///data/%EF%BC%8E%EF%BC%8E/secret",
                UriRefusal::DotSegment,
            ),
            ("file:///data/..\u{FF0F}secret", UriRefusal::DotSegment),
            ("file:///data/..\u{FF3C}secret", UriRefusal::Backslash),
        ] {
            assert_eq!(check(uri), Err(why), "{uri}");
            assert_eq!(data.judge(uri), Err(why), "{uri}");
            assert!(!data.matches(uri), "{uri}");
        }
        // Deeper than MAX_DECODINGS.
        let mut deep = "%2e".to_owned();
        for _ in 0..MAX_DECODINGS {
            deep = deep.replace('%', "%25");
        }
        assert_eq!(
            check(&format!("file:///data/{deep}x")),
            Err(UriRefusal::TooManyEncodings)
        );
        // Authorities and the query may hold `//`; schemes without one too.
        assert_eq!(check("https://example.com/a?next=https://b/c"), Ok(()));
        assert_eq!(check("notes://public"), Ok(()));
        assert_eq!(check("ui://widget/card"), Ok(()));
        assert_eq!(check("urn:isbn:0451450523"), Ok(()));
        assert_eq!(check("100%25 sure"), Ok(()));
        assert_eq!(check("file:///data/{name}"), Ok(()));
    }

    #[test]
    fn templates_expand_as_rfc_6570_says() {
        let values = |name: &str| match name {
            "var" => Some("value"),
            "hello" => Some("Hello World!"),
            "path" => Some("/foo/bar"),
            "empty" => Some(""),
            "x" => Some("1024"),
            "y" => Some("768"),
            _ => None,
        };
        for (template, expanded) in [
            ("{var}", "value"),
            ("{hello}", "Hello%20World%21"),
            ("{+hello}", "Hello%20World!"),
            ("{+path}/here", "/foo/bar/here"),
            ("{#path}", "#/foo/bar"),
            ("map?{x,y}", "map?1024,768"),
            ("{x,hello,y}", "1024,Hello%20World%21,768"),
            ("X{.var}", "X.value"),
            ("{/var,x}/here", "/value/1024/here"),
            ("{;x,y,empty}", ";x=1024;y=768;empty"),
            ("{?x,y,empty}", "?x=1024&y=768&empty="),
            ("?fixed=yes{&x}", "?fixed=yes&x=1024"),
            ("{var:3}", "val"),
            ("{+path:6}/here", "/foo/b/here"),
            ("file:///data/{undef}", "file:///data/{undef}"),
            ("{var}{undef}/{", "value{undef}/{"),
        ] {
            assert_eq!(expand_template(template, values), expanded, "{template}");
        }
        // A value that would climb out is encoded ({name}) or kept ({+name}),
        // and either way refused.
        let climb = |name: &str| (name == "name").then_some("../secret");
        let simple = expand_template("file:///data/{name}", climb);
        assert_eq!(simple, "file:///data/..%2Fsecret");
        assert_eq!(check(&simple), Err(UriRefusal::DotSegment));
        let reserved = expand_template("file:///data/{+name}", climb);
        assert_eq!(check(&reserved), Err(UriRefusal::DotSegment));
    }

    /// A segment of a glob or URI without dots of its own meaning.
    fn segment() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9_-]{1,8}(\\.[a-z]{1,3})?"
    }

    /// A dot segment, written in one of the ways a server may decode.
    fn dot_segment() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("."),
            Just(".."),
            Just("%2e"),
            Just("%2e%2e"),
            Just("%2E%2e"),
            Just(".%2e"),
            Just("%2e."),
            Just("%252e%252e"),
            Just("%25252e%25252E"),
            Just("..;jsessionid=1"),
            Just("..?q"),
            Just("..#f"),
            Just(".. "),
            Just("..."),
        ]
        .prop_map(str::to_owned)
    }

    /// What follows a dot segment: a plain `/`, an encoded one.
    fn separator() -> impl Strategy<Value = &'static str> {
        prop_oneof![Just("/"), Just("%2f"), Just("%2F"), Just("%252f")]
    }

    /// A glob without a dot segment: segments, with `*`, `**` or `?`.
    fn glob() -> impl Strategy<Value = String> {
        (
            prop_oneof![Just("file:///"), Just("s3://bucket/"), Just("ui://")],
            prop::collection::vec(segment(), 0..3),
            prop_oneof![Just("*"), Just("**"), Just("*/*"), Just("*.md"), Just("?*")],
        )
            .prop_map(|(scheme, segments, tail)| {
                let mut glob = scheme.to_owned();
                for segment in segments {
                    glob.push_str(&segment);
                    glob.push('/');
                }
                glob.push_str(tail);
                glob
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// No URI with a dot segment matches a glob without one, however
        /// the glob's wildcards could stretch over it.
        #[test]
        fn no_uri_with_a_dot_segment_matches(
            glob in glob(),
            before in prop::collection::vec(segment(), 0..3),
            dots in dot_segment(),
            separator in separator(),
            after in prop::collection::vec(segment(), 1..3),
        ) {
            let patterns = ResourcePatterns::new(&[glob.as_str()]).unwrap();
            // The URI starts as the glob's literal prefix, so `*` would
            // take the rest.
            let prefix: String = glob.split(['*', '?']).next().unwrap_or_default().to_owned();
            let mut uri = prefix.clone();
            for segment in &before {
                uri.push_str(segment);
                uri.push('/');
            }
            uri.push_str(&dots);
            uri.push_str(separator);
            uri.push_str(&after.join("/"));
            uri.push_str(".md");
            prop_assert!(!patterns.matches(&uri), "{glob} matched {uri}");
            prop_assert!(check(&uri).is_err(), "{uri}");
            // The same URI without the dot segment is judged by the glob.
            let mut plain = prefix;
            for segment in before.iter().chain(&after) {
                plain.push_str(segment);
                plain.push('/');
            }
            plain.push_str("x.md");
            prop_assert!(check(&plain).is_ok(), "{plain}");
        }

        /// Whatever the URI, a refused one never matches, and a match
        /// means the URI passed [`check`].
        #[test]
        fn matches_imply_the_check_passed(uri in "[a-z:/.%2eEfF5c?#;\\\\ ]{0,24}") {
            let everything = ResourcePatterns::new(&["*"]).unwrap();
            prop_assert_eq!(everything.matches(&uri), check(&uri).is_ok());
        }
    }
}
