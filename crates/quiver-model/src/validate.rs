//! Validation of a parsed record (R-REC-1): every rule names the field it checks.

use crate::env_ref::{Template, is_env_name};
use crate::error::{FieldError, ModelError};
use crate::pattern::Pattern;
use crate::record::{ApprovalPolicy, McpServerSpec, PrefixOp, Protocol, TransformStep, Transport};

/// Longest `server_id`.
pub const MAX_SERVER_ID_LEN: usize = 64;
/// Longest accepted `tool_timeout_ms` (one hour).
pub const MAX_TOOL_TIMEOUT_MS: u64 = 3_600_000;
/// Largest accepted `max_concurrency`.
pub const MAX_CONCURRENCY: u32 = 4_096;
/// Smallest accepted `budgets.session_idle_ms` (1 s).
pub const MIN_SESSION_IDLE_MS: u64 = 1_000;
/// Largest accepted `budgets.session_idle_ms` (one day).
pub const MAX_SESSION_IDLE_MS: u64 = 86_400_000;
/// Largest accepted `max_tool_output_bytes` (64 MiB).
pub const MAX_TOOL_OUTPUT_BYTES: u64 = 64 * 1024 * 1024;
const MAX_TEXT_LEN: usize = 1_024;

/// Whether `id` is a valid `server_id` (`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`).
pub fn is_valid_server_id(id: &str) -> bool {
    let mut chars = id.chars();
    id.len() <= MAX_SERVER_ID_LEN
        && matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Whether `name` can name a credential (`http.auth_ref`, the registry's
/// OAuth connections): letters, digits, `_`, `.` or `-`, not empty.
pub fn is_valid_credential_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
}

/// Checks every rule; returns all problems found, each naming its field.
pub fn validate(spec: &McpServerSpec) -> Result<(), ModelError> {
    let mut v = Validator::default();
    v.server_id(&spec.server_id);
    if let Some(name) = &spec.display_name {
        v.text("display_name", name);
    }
    v.transport_tables(spec);
    // 2026-07-28 has no HTTP+SSE transport: the servers behind one are of
    // the `initialize` era.
    if spec.transport == Transport::HttpSseLegacy && spec.protocol == Protocol::V2026_07_28 {
        v.error(
            "protocol",
            "\"2026-07-28\" has no http_sse_legacy transport: use \"auto\" or \"2025-11-25\"",
        );
    }
    if let Some(ns) = &spec.tool_namespace
        && (ns.is_empty() || ns.chars().any(|c| c.is_whitespace() || c.is_control()))
    {
        v.error(
            "tool_namespace",
            "must be non-empty and contain no whitespace",
        );
    }
    v.patterns("allowed_tools", &spec.allowed_tools);
    v.patterns("denied_tools", &spec.denied_tools);
    v.resource_patterns(&spec.allowed_resources);
    v.patterns("allowed_prompts", &spec.allowed_prompts);
    v.approval(spec);
    v.budgets(spec);
    v.transforms(&spec.transform);
    for (key, value) in &spec.labels {
        let field = format!("labels.{key}");
        if key.is_empty() || key.len() > 63 {
            v.error(&field, "label keys must be 1 to 63 characters");
        }
        v.text(&field, value);
    }
    v.finish()
}

#[derive(Default)]
struct Validator {
    errors: Vec<FieldError>,
}

impl Validator {
    fn error(&mut self, field: &str, message: impl Into<String>) {
        self.errors.push(FieldError::new(field, message));
    }

    fn finish(self) -> Result<(), ModelError> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(ModelError::Invalid(self.errors))
        }
    }

    fn server_id(&mut self, id: &str) {
        if !is_valid_server_id(id) {
            self.error(
                "server_id",
                format!(
                    "{id:?} must match ^[A-Za-z0-9][A-Za-z0-9_-]{{0,63}}$ (letters, digits, '_' and '-', at most 64, no dots)"
                ),
            );
        }
    }

    fn text(&mut self, field: &str, value: &str) {
        if value.len() > MAX_TEXT_LEN {
            self.error(field, format!("must be at most {MAX_TEXT_LEN} bytes"));
        }
        if value.chars().any(|c| c.is_control() && c != '\t') {
            self.error(field, "must not contain control characters");
        }
    }

    fn template(&mut self, field: &str, value: &str) {
        if let Err(err) = Template::parse(value) {
            self.error(field, err.to_string());
        }
    }

    fn transport_tables(&mut self, spec: &McpServerSpec) {
        let transport = spec.transport.as_str();
        match (spec.transport, &spec.stdio) {
            (Transport::Stdio, None) => {
                self.error("stdio", "required for transport \"stdio\"");
            }
            (Transport::Stdio, Some(stdio)) => {
                if stdio.command.trim().is_empty() {
                    self.error("stdio.command", "must not be empty");
                }
                self.text("stdio.command", &stdio.command);
                for (i, arg) in stdio.args.iter().enumerate() {
                    if arg.contains('\0') {
                        self.error(&format!("stdio.args[{i}]"), "must not contain NUL");
                    }
                }
                for (key, value) in &stdio.env {
                    let field = format!("stdio.env.{key}");
                    if !is_env_name(key) {
                        self.error(&field, "is not a valid environment variable name");
                    }
                    if value.contains('\0') {
                        self.error(&field, "must not contain NUL");
                    }
                    self.template(&field, value);
                }
                for (i, name) in stdio.env_from.iter().enumerate() {
                    let field = format!("stdio.env_from[{i}]");
                    if !is_env_name(name) {
                        self.error(
                            &field,
                            format!("{name:?} is not a valid environment variable name"),
                        );
                    } else if stdio.env.contains_key(name) {
                        self.error(&field, format!("{name} is also set in stdio.env"));
                    }
                }
                if let Some(cwd) = &stdio.cwd
                    && cwd.trim().is_empty()
                {
                    self.error("stdio.cwd", "must not be empty when set");
                }
            }
            (_, Some(_)) => {
                self.error("stdio", format!("not allowed for transport {transport:?}"));
            }
            (_, None) => {}
        }
        match (spec.transport.is_http(), &spec.http) {
            (true, None) => self.error("http", format!("required for transport {transport:?}")),
            (true, Some(http)) => {
                match url::Url::parse(&http.url) {
                    Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => {}
                    Ok(url) => self.error(
                        "http.url",
                        format!(
                            "must be an http(s) URL with a host, got scheme {:?}",
                            url.scheme()
                        ),
                    ),
                    Err(err) => self.error("http.url", format!("is not a valid URL: {err}")),
                }
                for (name, value) in &http.headers {
                    let field = format!("http.headers.{name}");
                    let valid_name = !name.is_empty()
                        && name
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
                    if !valid_name {
                        self.error(&field, "is not a valid HTTP header name");
                    }
                    if value.contains(['\r', '\n', '\0']) {
                        self.error(&field, "must not contain CR, LF or NUL");
                    }
                    self.template(&field, value);
                }
                if let Some(auth_ref) = &http.auth_ref
                    && !is_valid_credential_name(auth_ref)
                {
                    self.error(
                        "http.auth_ref",
                        "must be a credential name of letters, digits, '_', '.' or '-'",
                    );
                }
            }
            (false, Some(_)) => {
                self.error("http", format!("not allowed for transport {transport:?}"))
            }
            (false, None) => {}
        }
    }

    fn patterns(&mut self, field: &str, patterns: &[String]) {
        for (i, pattern) in patterns.iter().enumerate() {
            if let Err(err) = Pattern::new(pattern) {
                self.error(&format!("{field}[{i}]"), err.to_string());
            }
        }
    }

    /// URI patterns: the tool-pattern syntax, and no whitespace, which no
    /// URI holds, so such a pattern could never match.
    fn resource_patterns(&mut self, patterns: &[String]) {
        const FIELD: &str = "allowed_resources";
        for (i, pattern) in patterns.iter().enumerate() {
            let field = format!("{FIELD}[{i}]");
            if pattern.chars().any(char::is_whitespace) {
                self.error(
                    &field,
                    format!("invalid pattern {pattern:?}: a URI pattern contains no whitespace"),
                );
            } else if let Err(err) = Pattern::new(pattern) {
                self.error(&field, err.to_string());
            }
        }
    }

    fn approval(&mut self, spec: &McpServerSpec) {
        if spec.approval_policy != ApprovalPolicy::Policy && !spec.approval_tools.is_empty() {
            self.error(
                "approval_tools",
                "only used with approval_policy = \"policy\"",
            );
        }
        for pattern in spec.approval_tools.keys() {
            if let Err(err) = Pattern::new(pattern) {
                self.error(&format!("approval_tools.{pattern}"), err.to_string());
            }
        }
    }

    fn budgets(&mut self, spec: &McpServerSpec) {
        let b = &spec.budgets;
        if b.tool_timeout_ms == 0 || b.tool_timeout_ms > MAX_TOOL_TIMEOUT_MS {
            self.error(
                "budgets.tool_timeout_ms",
                format!("must be between 1 and {MAX_TOOL_TIMEOUT_MS}"),
            );
        }
        if b.max_concurrency == 0 || b.max_concurrency > MAX_CONCURRENCY {
            self.error(
                "budgets.max_concurrency",
                format!("must be between 1 and {MAX_CONCURRENCY}"),
            );
        }
        if b.max_tool_output_bytes == 0 || b.max_tool_output_bytes > MAX_TOOL_OUTPUT_BYTES {
            self.error(
                "budgets.max_tool_output_bytes",
                format!("must be between 1 and {MAX_TOOL_OUTPUT_BYTES}"),
            );
        }
        if b.session_idle_ms
            .is_some_and(|ms| !(MIN_SESSION_IDLE_MS..=MAX_SESSION_IDLE_MS).contains(&ms))
        {
            self.error(
                "budgets.session_idle_ms",
                format!("must be between {MIN_SESSION_IDLE_MS} and {MAX_SESSION_IDLE_MS}"),
            );
        }
    }

    fn transforms(&mut self, steps: &[TransformStep]) {
        let valid = |s: &str| {
            s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        };
        for (i, step) in steps.iter().enumerate() {
            let (field, parts): (String, Vec<&str>) = match step {
                TransformStep::Prefix(PrefixOp::Add(add)) => {
                    (format!("transform[{i}].prefix"), vec![add])
                }
                TransformStep::Prefix(PrefixOp::Replace(r)) => {
                    (format!("transform[{i}].prefix"), vec![&r.remove, &r.add])
                }
                TransformStep::Suffix(suffix) => (format!("transform[{i}].suffix"), vec![suffix]),
            };
            if parts.iter().all(|p| p.is_empty()) {
                self.error(&field, "must not be empty");
            }
            if !parts.iter().all(|p| valid(p)) {
                self.error(&field, "may only contain letters, digits, '_', '-' and '.'");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{HttpConfig, StdioConfig};

    fn stdio(command: &str) -> McpServerSpec {
        let mut spec = McpServerSpec::new("fs", Transport::Stdio);
        spec.stdio = Some(StdioConfig {
            command: command.into(),
            ..Default::default()
        });
        spec
    }

    fn fields(spec: &McpServerSpec) -> Vec<String> {
        validate(spec)
            .unwrap_err()
            .field_errors()
            .iter()
            .map(|e| e.field.clone())
            .collect()
    }

    #[test]
    fn minimal_stdio_record_is_valid() {
        validate(&stdio("npx")).unwrap();
    }

    #[test]
    fn server_id_rules() {
        for good in ["a", "A9", "fs-server_2", &"x".repeat(64)] {
            assert!(is_valid_server_id(good), "{good}");
        }
        for bad in ["", "-a", "_a", "a.b", "a b", "é", &"x".repeat(65)] {
            assert!(!is_valid_server_id(bad), "{bad}");
        }
        let mut spec = stdio("npx");
        spec.server_id = "has.dot".into();
        assert_eq!(fields(&spec), ["server_id"]);
    }

    #[test]
    fn transport_tables_must_match() {
        let mut spec = stdio("npx");
        spec.transport = Transport::StreamableHttp;
        assert_eq!(fields(&spec), ["stdio", "http"]);
        assert_eq!(fields(&stdio("  ")), ["stdio.command"]);
    }

    #[test]
    fn http_url_must_be_http() {
        let mut spec = McpServerSpec::new("web", Transport::HttpSseLegacy);
        spec.http = Some(HttpConfig {
            url: "ftp://example.com".into(),
            ..Default::default()
        });
        assert_eq!(fields(&spec), ["http.url"]);
        spec.http.as_mut().unwrap().url = "not a url".into();
        assert_eq!(fields(&spec), ["http.url"]);
        spec.http.as_mut().unwrap().url = "https://mcp.example.com/sse".into();
        validate(&spec).unwrap();
    }

    #[test]
    fn protocol_2026_has_no_legacy_sse() {
        let mut spec = McpServerSpec::new("web", Transport::HttpSseLegacy);
        spec.http = Some(HttpConfig {
            url: "https://mcp.example.com/sse".into(),
            ..Default::default()
        });
        for protocol in [Protocol::Auto, Protocol::V2025_11_25] {
            spec.protocol = protocol;
            validate(&spec).unwrap();
        }
        spec.protocol = Protocol::V2026_07_28;
        assert_eq!(fields(&spec), ["protocol"]);
        spec.transport = Transport::StreamableHttp;
        validate(&spec).unwrap();
    }

    #[test]
    fn budgets_patterns_env_and_headers() {
        let mut spec = stdio("npx");
        spec.budgets.max_concurrency = 0;
        spec.budgets.tool_timeout_ms = 0;
        spec.allowed_tools = vec!["ok_*".into(), "[bad".into()];
        let stdio = spec.stdio.as_mut().unwrap();
        stdio.env.insert("TOKEN".into(), "${ENV:TOKEN".into());
        stdio.env_from = vec!["TOKEN".into(), "9BAD".into()];
        assert_eq!(
            fields(&spec),
            [
                "stdio.env.TOKEN",
                "stdio.env_from[0]",
                "stdio.env_from[1]",
                "allowed_tools[1]",
                "budgets.tool_timeout_ms",
                "budgets.max_concurrency",
            ]
        );
    }

    #[test]
    fn resource_and_prompt_patterns_name_their_index() {
        let mut spec = stdio("npx");
        spec.allowed_resources = vec![
            "file:///data/*.md".into(),
            "ui://*".into(),
            "file:///my notes/*".into(),
            "file:///{a".into(),
            String::new(),
        ];
        spec.allowed_prompts = vec!["summarize*".into(), "[".into()];
        assert_eq!(
            fields(&spec),
            [
                "allowed_resources[2]",
                "allowed_resources[3]",
                "allowed_resources[4]",
                "allowed_prompts[1]",
            ]
        );
        spec.allowed_resources.truncate(2);
        spec.allowed_prompts.truncate(1);
        validate(&spec).unwrap();
    }

    #[test]
    fn approval_tools_need_policy() {
        let mut spec = stdio("npx");
        spec.approval_tools
            .insert("delete_*".into(), crate::record::ApprovalMode::Always);
        assert_eq!(fields(&spec), ["approval_tools"]);
        spec.approval_policy = ApprovalPolicy::Policy;
        validate(&spec).unwrap();
    }
}
