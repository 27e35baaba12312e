//! Checking call arguments against the tool's `inputSchema` before the call
//! is sent (docs/reference.md §10: arguments "not matching the schema" are
//! `mcp_invalid_arguments`, and the server never sees them).
//!
//! Compiled validators are cached per schema object. The cache holds the
//! schema `Arc` itself, so the address it is keyed by cannot be reused by
//! another schema while the entry lives. Remote `$ref`s are never fetched
//! (the crate's HTTP resolver is compiled out).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use quiver_mcp::JsonObject;

/// Validators kept at most; the cache starts over when full.
const CACHE_LIMIT: usize = 4096;

type Compiled = Result<Arc<jsonschema::Validator>, String>;

/// Cache of compiled input schemas.
#[derive(Default)]
pub struct SchemaCache {
    validators: Mutex<HashMap<usize, (Arc<JsonObject>, Compiled)>>,
}

impl SchemaCache {
    fn validator(&self, schema: &Arc<JsonObject>) -> Compiled {
        let key = Arc::as_ptr(schema) as usize;
        let mut validators = self.validators.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, compiled)) = validators.get(&key) {
            return compiled.clone();
        }
        let compiled = jsonschema::validator_for(&serde_json::Value::Object((**schema).clone()))
            .map(Arc::new)
            .map_err(|err| err.to_string());
        if validators.len() >= CACHE_LIMIT {
            validators.clear();
        }
        validators.insert(key, (schema.clone(), compiled.clone()));
        compiled
    }

    /// `Err` with the first violation (path and message) when `arguments`
    /// do not match. A schema that does not compile is not enforced here:
    /// the server remains the judge of its own odd schema.
    pub fn check(&self, schema: &Arc<JsonObject>, arguments: &JsonObject) -> Result<(), String> {
        let Ok(validator) = self.validator(schema) else {
            return Ok(());
        };
        let instance = serde_json::Value::Object(arguments.clone());
        match validator.iter_errors(&instance).next() {
            None => Ok(()),
            Some(error) => {
                let path = error.instance_path().to_string();
                let at = if path.is_empty() {
                    "arguments".to_owned()
                } else {
                    format!("arguments{path}")
                };
                Err(format!("{at}: {error}"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(value: serde_json::Value) -> JsonObject {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn arguments_are_checked_against_the_schema() {
        let cache = SchemaCache::default();
        let schema = Arc::new(object(json!({
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"]
        })));
        cache
            .check(&schema, &object(json!({"a": 1, "b": 2})))
            .unwrap();
        let err = cache
            .check(&schema, &object(json!({"a": "one", "b": 2})))
            .unwrap_err();
        assert!(err.starts_with("arguments/a"), "{err}");
        let err = cache.check(&schema, &object(json!({"a": 1}))).unwrap_err();
        assert!(err.contains("\"b\""), "{err}");
    }

    #[test]
    fn uncompilable_schemas_are_left_to_the_server() {
        let cache = SchemaCache::default();
        let schema = Arc::new(object(json!({"type": "no-such-type"})));
        cache.check(&schema, &object(json!({"x": 1}))).unwrap();
    }
}
