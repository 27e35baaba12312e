//! Masking of literal secrets for reads without the admin credential (SPEC §12).
//!
//! References such as `${ENV:TOKEN}` are not secrets and stay visible; any
//! env or header value without a reference is treated as a literal secret.

use std::collections::BTreeMap;

use crate::env_ref::Template;
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
}
