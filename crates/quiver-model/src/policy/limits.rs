//! The size limits on what is injected of a tool besides its name, and how a
//! schema is measured against them without serializing all of it.

/// Longest tool description injected, in bytes: descriptions go into every
/// request's prompt, so one server must not fill the model's context.
pub const MAX_TOOL_DESCRIPTION_BYTES: usize = 8 * 1024;

/// Largest tool input schema injected, in bytes of compact JSON.
pub const MAX_TOOL_SCHEMA_BYTES: usize = 64 * 1024;

/// Deepest nesting of arrays and objects in an injected input schema (the
/// schema object itself is level 1).
pub const MAX_TOOL_SCHEMA_DEPTH: usize = 32;

/// Nesting depth of arrays and objects under `schema` (itself level 1),
/// walked without recursion.
pub(super) fn nesting_depth(schema: &serde_json::Map<String, serde_json::Value>) -> usize {
    use serde_json::Value;
    let mut deepest = 1;
    let mut stack: Vec<(&Value, usize)> = schema.values().map(|v| (v, 2)).collect();
    while let Some((value, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match value {
            Value::Object(map) => Box::new(map.values()),
            Value::Array(items) => Box::new(items.iter()),
            _ => continue,
        };
        deepest = deepest.max(depth);
        if deepest > MAX_TOOL_SCHEMA_DEPTH {
            break;
        }
        stack.extend(children.map(|child| (child, depth + 1)));
    }
    deepest
}

/// Whether `schema` serializes as compact JSON in at most `limit` bytes.
/// Counting stops at the limit: a huge schema is not serialized whole.
pub(super) fn serialized_within(
    schema: &serde_json::Map<String, serde_json::Value>,
    limit: usize,
) -> bool {
    let mut counter = ByteCounter { remaining: limit };
    serde_json::to_writer(&mut counter, schema).is_ok()
}

/// A writer that fails once more than `remaining` bytes are written.
struct ByteCounter {
    remaining: usize,
}

impl std::io::Write for ByteCounter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.remaining = self
            .remaining
            .checked_sub(buf.len())
            .ok_or_else(|| std::io::Error::other("limit exceeded"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
