//! The body sent upstream: the caller's fields, with the offered function
//! definitions (the catalog's, or with tool search the search function and
//! the tools offered so far) appended to its own tools. The definitions are spliced in as
//! JSON serialized once per catalog entry, so a request that offers a
//! thousand tools does not rebuild and re-encode a thousand schemas.

use serde::{Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// Encodes `body` with `functions` after the caller's tools.
pub fn encode<'a>(
    body: &Map<String, Value>,
    functions: impl Iterator<Item = &'a RawValue>,
) -> serde_json::Result<Vec<u8>> {
    let mut functions = functions.peekable();
    if functions.peek().is_none() {
        return serde_json::to_vec(body);
    }
    let mut out = serde_json::to_vec(&WithoutTools(body))?;
    // serde_json writes an object as `{…}`: reopen it to add `tools`.
    out.pop();
    if out.len() > 1 {
        out.push(b',');
    }
    out.extend_from_slice(br#""tools":["#);
    let own = match body.get("tools") {
        Some(Value::Array(own)) => own.as_slice(),
        _ => &[],
    };
    let mut first = true;
    let mut separate = |out: &mut Vec<u8>| {
        if !std::mem::take(&mut first) {
            out.push(b',');
        }
    };
    for tool in own {
        separate(&mut out);
        serde_json::to_writer(&mut out, tool)?;
    }
    for function in functions {
        separate(&mut out);
        out.extend_from_slice(function.get().as_bytes());
    }
    out.extend_from_slice(b"]}");
    Ok(out)
}

/// A body's fields but `tools`.
struct WithoutTools<'a>(&'a Map<String, Value>);

impl Serialize for WithoutTools<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().filter(|(key, _)| key.as_str() != "tools"))
    }
}
