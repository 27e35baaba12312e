//! Masking of literal secrets for reads without the admin credential (SPEC §12).
//!
//! References such as `${ENV:TOKEN}` are not secrets and stay visible; any
//! env or header value without a reference is treated as a literal secret.

use std::collections::BTreeMap;

use crate::env_ref::Template;
use crate::error::{FieldError, ModelError};
use crate::record::McpServerSpec;

/// What a masked value reads as.
pub const MASK: &str = "********";

fn mask_values(values: &mut BTreeMap<String, String>) {
    for value in values.values_mut() {
        // A malformed template cannot be stored (validation), but if one is,
        // masking it is the safe side.
        let literal = Template::parse(value).map_or(true, |t| t.is_literal());
        if literal && !value.is_empty() {
            *value = MASK.to_owned();
        }
    }
}

/// Puts the stored value back for every value that is exactly [`MASK`];
/// names each key that has no stored value to keep.
fn restore_values(
    table: &str,
    values: &mut BTreeMap<String, String>,
    stored: Option<&BTreeMap<String, String>>,
    server_id: &str,
    errors: &mut Vec<FieldError>,
) {
    for (key, value) in values.iter_mut().filter(|(_, value)| *value == MASK) {
        match stored.and_then(|stored| stored.get(key)) {
            Some(kept) => kept.clone_into(value),
            None => errors.push(FieldError::new(
                format!("{table}.{key}"),
                format!(
                    "is the mask {MASK:?}, which keeps the stored value, but mcp server {server_id:?} has no stored {table}.{key}; enter the value itself"
                ),
            )),
        }
    }
}

impl McpServerSpec {
    /// A copy with literal env and header values replaced by [`MASK`].
    pub fn masked(&self) -> McpServerSpec {
        let mut spec = self.clone();
        if let Some(stdio) = &mut spec.stdio {
            mask_values(&mut stdio.env);
        }
        if let Some(http) = &mut spec.http {
            mask_values(&mut http.headers);
        }
        spec
    }

    /// Whether any env or header value is exactly [`MASK`].
    pub fn has_masked_values(&self) -> bool {
        let env = self.stdio.iter().flat_map(|stdio| stdio.env.values());
        let headers = self.http.iter().flat_map(|http| http.headers.values());
        env.chain(headers).any(|value| value == MASK)
    }

    /// The inverse of [`McpServerSpec::masked`] for a record sent back by a
    /// client that only ever saw masked values: every `stdio.env` /
    /// `http.headers` value that is exactly [`MASK`] takes the value `stored`
    /// (the current record with the same id, `None` when there is none) has
    /// for the same key. Masked values stay masked unless changed, so the
    /// mask itself can never be stored as a value.
    ///
    /// Fails, naming every such field, when a masked key has no stored value
    /// (a new record, a new key, or a table the stored record lacks); the
    /// record is left partly restored then and must not be used.
    pub fn restore_masked(&mut self, stored: Option<&McpServerSpec>) -> Result<(), ModelError> {
        let mut errors = Vec::new();
        if let Some(stdio) = &mut self.stdio {
            let kept = stored.and_then(|s| s.stdio.as_ref()).map(|s| &s.env);
            restore_values(
                "stdio.env",
                &mut stdio.env,
                kept,
                &self.server_id,
                &mut errors,
            );
        }
        if let Some(http) = &mut self.http {
            let kept = stored.and_then(|s| s.http.as_ref()).map(|h| &h.headers);
            restore_values(
                "http.headers",
                &mut http.headers,
                kept,
                &self.server_id,
                &mut errors,
            );
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ModelError::Invalid(errors))
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::record::{HttpConfig, McpServerSpec, StdioConfig, Transport};

    #[test]
    fn literals_are_masked_references_are_not() {
        let mut spec = McpServerSpec::new("s", Transport::Stdio);
        spec.stdio = Some(StdioConfig {
            command: "x".into(),
            env: [
                ("API_KEY".to_owned(), "sk-live-123".to_owned()),
                ("TOKEN".to_owned(), "${ENV:TOKEN}".to_owned()),
                ("EMPTY".to_owned(), String::new()),
            ]
            .into(),
            ..Default::default()
        });
        let masked = spec.masked();
        let env = &masked.stdio.as_ref().unwrap().env;
        assert_eq!(env["API_KEY"], super::MASK);
        assert_eq!(env["TOKEN"], "${ENV:TOKEN}");
        assert_eq!(env["EMPTY"], "");

        let mut http = McpServerSpec::new("h", Transport::StreamableHttp);
        http.http = Some(HttpConfig {
            url: "https://x".into(),
            headers: [
                ("Authorization".to_owned(), "Bearer ${ENV:T}".to_owned()),
                ("X-Key".to_owned(), "abc".to_owned()),
            ]
            .into(),
            auth_ref: None,
        });
        let headers = http.masked().http.unwrap().headers;
        assert_eq!(headers["Authorization"], "Bearer ${ENV:T}");
        assert_eq!(headers["X-Key"], super::MASK);
    }

    #[test]
    fn masked_values_are_restored_from_the_stored_record() {
        let mut stored = McpServerSpec::new("s", Transport::Stdio);
        stored.stdio = Some(StdioConfig {
            command: "x".into(),
            env: [
                ("API_KEY".to_owned(), "sk-live-123".to_owned()),
                ("TOKEN".to_owned(), "${ENV:TOKEN}".to_owned()),
            ]
            .into(),
            ..Default::default()
        });
        let mut sent = stored.masked();
        assert!(sent.has_masked_values());
        sent.restore_masked(Some(&stored)).unwrap();
        assert_eq!(sent, stored);
        assert!(!sent.has_masked_values());

        let mut new_key = stored.masked();
        let env = &mut new_key.stdio.as_mut().unwrap().env;
        env.insert("OTHER".into(), super::MASK.into());
        env.insert("CHANGED".into(), "typed".into());
        let err = new_key.restore_masked(Some(&stored)).unwrap_err();
        assert_eq!(err.field(), Some("stdio.env.OTHER"));
        assert_eq!(err.field_errors().len(), 1);

        let mut http = McpServerSpec::new("s", Transport::StreamableHttp);
        http.http = Some(HttpConfig {
            url: "https://x".into(),
            headers: [("X-Key".to_owned(), super::MASK.to_owned())].into(),
            auth_ref: None,
        });
        // The stored record is stdio: it has no headers to keep.
        let err = http.clone().restore_masked(Some(&stored)).unwrap_err();
        assert_eq!(err.field(), Some("http.headers.X-Key"));
        let err = http.restore_masked(None).unwrap_err();
        assert!(err.to_string().contains("enter the value"), "{err}");
    }
}
