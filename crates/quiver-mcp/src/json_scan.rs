//! A streaming scan of the top level of one JSON-RPC message: its `id`, and
//! whether it has a `method` (a request or notification, not an answer).
//!
//! The stdio transport runs it over a message it cannot take — too large to
//! buffer, or not parsable (nested deeper than serde_json allows) — to find
//! which request the message answered and fail that request at once instead
//! of leaving it waiting. It holds no more than a few bytes whatever it is
//! fed: the `id` may come after a 24 MB `result`, and the message may never
//! be buffered whole. It recovers the id only; it does not validate JSON.

use rmcp::model::RequestId;

/// Longest raw `id` value kept (an id is a number or a short string).
const ID_MAX: usize = 256;
/// Longest key kept: enough to tell `id` and `method` from other keys.
const KEY_MAX: usize = 8;

/// Which top-level key's value is being read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Key {
    #[default]
    Other,
    Id,
}

/// Scan state; feed bytes with [`TopLevelScan::feed`] in any chunks.
#[derive(Debug, Default)]
pub struct TopLevelScan {
    /// Open objects and arrays.
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// At the top level, the next string is a key.
    expect_key: bool,
    /// Reading a top-level key into `key`.
    in_key: bool,
    key: Vec<u8>,
    /// The key whose value is being read.
    value_of: Key,
    /// Raw bytes of the `id` value read so far.
    id_raw: Vec<u8>,
    id_overflow: bool,
    /// The first complete top-level `id` value.
    id: Option<Vec<u8>>,
    has_method: bool,
}

impl TopLevelScan {
    /// The scan of a whole message.
    pub fn of(message: &[u8]) -> Self {
        let mut scan = TopLevelScan::default();
        scan.feed(message);
        scan
    }

    /// Scans the next bytes of the message.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while let Some((&byte, rest)) = bytes.split_first() {
            self.step(byte);
            bytes = rest;
            // Inside a string nobody needs (a payload, most of a huge
            // message), only a quote or a backslash changes anything.
            if self.in_string && !self.in_key && !self.escaped && self.value_of != Key::Id {
                let skip = bytes
                    .iter()
                    .position(|&b| b == b'"' || b == b'\\')
                    .unwrap_or(bytes.len());
                bytes = &bytes[skip..];
            }
        }
    }

    /// The message's `id`, when it has a complete top-level one that is a
    /// number or a string.
    pub fn id(&self) -> Option<RequestId> {
        serde_json::from_slice(self.id.as_deref()?).ok()
    }

    /// Whether the message has a top-level `method` (it is a request or a
    /// notification of the server, not an answer to the client).
    pub fn has_method(&self) -> bool {
        self.has_method
    }

    fn step(&mut self, byte: u8) {
        if self.in_string {
            if self.in_key {
                if byte == b'"' && !self.escaped {
                    self.end_key();
                } else if self.key.len() <= KEY_MAX {
                    self.key.push(byte);
                }
            } else {
                self.capture(byte);
            }
            if self.escaped {
                self.escaped = false;
            } else if byte == b'\\' {
                self.escaped = true;
            } else if byte == b'"' {
                self.in_string = false;
            }
            return;
        }
        match byte {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.expect_key {
                    self.expect_key = false;
                    self.in_key = true;
                    self.key.clear();
                } else {
                    self.capture(byte);
                }
            }
            b'{' | b'[' => {
                self.depth += 1;
                if self.depth == 1 {
                    self.expect_key = byte == b'{';
                } else {
                    self.capture(byte);
                }
            }
            b'}' | b']' => {
                if self.depth == 1 {
                    self.end_value();
                } else {
                    self.capture(byte);
                }
                self.depth = self.depth.saturating_sub(1);
            }
            b',' if self.depth == 1 => {
                self.end_value();
                self.expect_key = true;
            }
            b':' if self.depth == 1 => {}
            _ => self.capture(byte),
        }
    }

    fn end_key(&mut self) {
        self.in_key = false;
        self.value_of = Key::Other;
        match self.key.as_slice() {
            b"id" if self.id.is_none() => {
                self.value_of = Key::Id;
                self.id_raw.clear();
                self.id_overflow = false;
            }
            b"method" => self.has_method = true,
            _ => {}
        }
    }

    /// Keeps a byte of the `id` value being read, if one is.
    fn capture(&mut self, byte: u8) {
        if self.value_of != Key::Id || self.depth == 0 {
            return;
        }
        if self.id_raw.len() < ID_MAX {
            self.id_raw.push(byte);
        } else {
            self.id_overflow = true;
        }
    }

    fn end_value(&mut self) {
        if self.value_of == Key::Id && !self.id_overflow {
            self.id = Some(std::mem::take(&mut self.id_raw));
        }
        self.value_of = Key::Other;
    }
}

#[cfg(test)]
mod tests {
    use rmcp::model::NumberOrString;

    use super::*;

    fn id_of(message: &str) -> Option<RequestId> {
        TopLevelScan::of(message.as_bytes()).id()
    }

    #[test]
    fn finds_the_top_level_id_wherever_it_is() {
        assert_eq!(
            id_of(r#"{"jsonrpc":"2.0","id":7,"result":{}}"#),
            Some(NumberOrString::Number(7))
        );
        assert_eq!(
            id_of(r#"{"result":{"id":1,"tools":[{"id":2}]}, "id" : "req-9" }"#),
            Some(NumberOrString::String("req-9".into()))
        );
        // Keys and values that only look like the id: in strings, nested,
        // escaped quotes.
        assert_eq!(
            id_of(r#"{"result":"\"id\":3,","x":{"id":4},"id":5}"#),
            Some(NumberOrString::Number(5))
        );
        assert_eq!(id_of(r#"{"result":{"id":1}}"#), None);
        assert_eq!(id_of(r#"{"id":{"nested":1}}"#), None);
        assert_eq!(id_of(r#"[{"id":1}]"#), None);
        assert_eq!(id_of("not json"), None);
        assert_eq!(id_of(r#"{"id":12"#), None, "an id cut off is not recovered");
    }

    #[test]
    fn tells_answers_from_requests() {
        let answer = TopLevelScan::of(br#"{"id":1,"result":{"method":"x"}}"#);
        assert!(!answer.has_method());
        let request = TopLevelScan::of(br#"{"id":1,"method":"sampling/createMessage"}"#);
        assert!(request.has_method());
        assert_eq!(request.id(), Some(NumberOrString::Number(1)));
    }

    #[test]
    fn scans_in_chunks_past_a_huge_payload_and_deep_nesting() {
        let payload = "x".repeat(3 << 20);
        let deep = format!("{}1{}", "[".repeat(10_000), "]".repeat(10_000));
        let message = format!(
            r#"{{"jsonrpc":"2.0","result":{{"text":"{payload}","deep":{deep}}},"id":"abc"}}"#
        );
        let mut scan = TopLevelScan::default();
        for chunk in message.as_bytes().chunks(4093) {
            scan.feed(chunk);
        }
        assert_eq!(scan.id(), Some(NumberOrString::String("abc".into())));
        // What it keeps stays tiny whatever it read.
        assert!(scan.id_raw.capacity() <= ID_MAX && scan.key.capacity() <= 4 * KEY_MAX);
    }

    #[test]
    fn an_overlong_id_is_not_recovered() {
        let message = format!(r#"{{"id":"{}","result":{{}}}}"#, "9".repeat(ID_MAX * 2));
        assert_eq!(id_of(&message), None);
    }
}
