//! What the audit log records about tool arguments (docs/reference.md §11): by default
//! only their keys, because values may be secrets; optionally the values,
//! with those under configured keys redacted at any depth.

use quiver_mcp::JsonObject;
use serde_json::Value;

/// Replaces a redacted value.
pub const REDACTED: &str = "[redacted]";

/// Audit settings of the worker (`[audit]` in its config).
#[derive(Debug, Clone)]
pub struct AuditOptions {
    /// Log argument values (redacted) instead of only their keys.
    pub log_arguments: bool,
    /// Keys whose values are never logged, compared case-insensitively at
    /// any depth.
    pub redact_keys: Vec<String>,
}

impl Default for AuditOptions {
    fn default() -> Self {
        AuditOptions {
            log_arguments: false,
            redact_keys: [
                "password",
                "secret",
                "token",
                "api_key",
                "apikey",
                "authorization",
                "credentials",
            ]
            .map(str::to_owned)
            .to_vec(),
        }
    }
}

impl AuditOptions {
    /// The audit form of `arguments`: the list of keys, or the redacted
    /// object when values are logged.
    pub fn arguments(&self, arguments: &JsonObject) -> Value {
        if !self.log_arguments {
            return Value::Array(arguments.keys().cloned().map(Value::String).collect());
        }
        let mut copy = Value::Object(arguments.clone());
        self.redact(&mut copy);
        copy
    }

    fn redact(&self, value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (key, value) in map.iter_mut() {
                    if self.redact_keys.iter().any(|k| k.eq_ignore_ascii_case(key)) {
                        *value = Value::String(REDACTED.to_owned());
                    } else {
                        self.redact(value);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|item| self.redact(item)),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(value: Value) -> JsonObject {
        match value {
            Value::Object(map) => map,
            _ => unreachable!(),
        }
    }

    #[test]
    fn keys_only_by_default() {
        let args = object(json!({"path": "/etc", "Token": "s3cret"}));
        let logged = AuditOptions::default().arguments(&args).to_string();
        assert!(logged.contains("path") && logged.contains("Token"));
        assert!(!logged.contains("s3cret") && !logged.contains("/etc"));
    }

    #[test]
    fn values_redacted_at_any_depth_when_logged() {
        let options = AuditOptions {
            log_arguments: true,
            ..AuditOptions::default()
        };
        let args = object(json!({
            "query": "rust",
            "auth": {"API_KEY": "k-1", "nested": [{"password": "p-2"}]},
        }));
        let logged = options.arguments(&args);
        assert_eq!(logged["query"], "rust");
        assert_eq!(logged["auth"]["API_KEY"], REDACTED);
        assert_eq!(logged["auth"]["nested"][0]["password"], REDACTED);
        assert!(!logged.to_string().contains("k-1"));
    }
}
