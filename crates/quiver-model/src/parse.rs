//! Reading records from TOML (`mcp.d` files) and JSON (REST bodies).
//!
//! Both syntaxes go through one path: text → `serde_json::Value` → record, so
//! TOML and JSON accept exactly the same fields and report errors the same way.
//! A document is one record, or `[[servers]]` / `{"servers": [...]}` / a JSON
//! array holding several.

use serde::Deserialize;
use serde_json::Value;

use crate::error::{FieldError, Format, ModelError, join_path};
use crate::record::McpServerSpec;
use crate::validate::validate;

/// Unknown fields: errors in strict mode, warnings otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Strictness {
    /// Unknown fields are ignored and reported back as warnings.
    #[default]
    Lenient,
    /// Unknown fields are errors.
    Strict,
}

/// A valid record read from a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedRecord {
    /// The record.
    pub spec: McpServerSpec,
    /// Unknown fields that were ignored (lenient mode only), as paths.
    pub ignored_fields: Vec<String>,
}

/// Parses and validates every record of a document.
pub fn parse_document(
    text: &str,
    format: Format,
    strictness: Strictness,
) -> Result<Vec<ParsedRecord>, ModelError> {
    let value = parse_value(text, format)?;
    match split_document(value) {
        Document::Single(value) => Ok(vec![parse_record_value(value, strictness)?]),
        Document::Many(values) => {
            let mut records = Vec::with_capacity(values.len());
            let mut errors = Vec::new();
            for (i, value) in values.into_iter().enumerate() {
                match parse_record_value(value, strictness) {
                    Ok(record) => records.push(record),
                    Err(err) => {
                        let prefix = format!("servers[{i}]");
                        errors.extend(
                            err.field_errors()
                                .iter()
                                .cloned()
                                .map(|e| e.nested(&prefix)),
                        );
                    }
                }
            }
            if errors.is_empty() {
                Ok(records)
            } else {
                Err(ModelError::Invalid(errors))
            }
        }
        Document::Malformed(error) => Err(ModelError::Invalid(vec![error])),
    }
}

/// Parses and validates exactly one record (a REST body, a CLI argument).
pub fn parse_record(
    text: &str,
    format: Format,
    strictness: Strictness,
) -> Result<ParsedRecord, ModelError> {
    parse_record_value(parse_value(text, format)?, strictness)
}

/// Deserialises and validates one record from an already parsed value.
pub fn parse_record_value(
    value: Value,
    strictness: Strictness,
) -> Result<ParsedRecord, ModelError> {
    if !value.is_object() {
        return Err(ModelError::Invalid(vec![FieldError::new(
            "",
            format!(
                "expected a record (a table/object), found {}",
                kind_of(&value)
            ),
        )]));
    }
    let mut ignored_fields = Vec::new();
    let mut track = serde_path_to_error::Track::new();
    let deserializer = serde_path_to_error::Deserializer::new(value, &mut track);
    let spec: McpServerSpec = match serde_ignored::deserialize(deserializer, |path| {
        ignored_fields.push(render_ignored(&path))
    }) {
        Ok(spec) => spec,
        Err(err) => {
            let path = track.path().to_string();
            return Err(ModelError::Invalid(vec![field_error_of(
                &path,
                &err.to_string(),
            )]));
        }
    };
    let mut errors = Vec::new();
    if strictness == Strictness::Strict {
        errors.extend(
            ignored_fields
                .iter()
                .map(|field| FieldError::new(field.clone(), "unknown field")),
        );
    }
    if let Err(err) = validate(&spec) {
        errors.extend(err.field_errors().iter().cloned());
    }
    if errors.is_empty() {
        Ok(ParsedRecord {
            spec,
            ignored_fields,
        })
    } else {
        Err(ModelError::Invalid(errors))
    }
}

/// A document's text as a JSON value (TOML is converted); a syntax error
/// names the format.
pub fn parse_value(text: &str, format: Format) -> Result<Value, ModelError> {
    let syntax = |message: String| ModelError::Syntax { format, message };
    match format {
        Format::Json => serde_json::from_str(text).map_err(|err| syntax(err.to_string())),
        Format::Toml => {
            let table: toml::Table = toml::from_str(text)
                .map_err(|err| syntax(err.to_string().trim_end().to_owned()))?;
            Value::deserialize(toml::Value::Table(table)).map_err(|err| syntax(err.to_string()))
        }
    }
}

enum Document {
    Single(Value),
    Many(Vec<Value>),
    Malformed(FieldError),
}

fn split_document(value: Value) -> Document {
    match value {
        Value::Array(values) => Document::Many(values),
        Value::Object(mut map) if map.contains_key("servers") && !map.contains_key("server_id") => {
            let Some(servers) = map.remove("servers") else {
                return Document::Many(Vec::new());
            };
            if let Some(other) = map.keys().next() {
                return Document::Malformed(FieldError::new(
                    other.clone(),
                    "unexpected beside a [[servers]] list",
                ));
            }
            match servers {
                Value::Array(values) => Document::Many(values),
                other => Document::Malformed(FieldError::new(
                    "servers",
                    format!("expected an array of records, found {}", kind_of(&other)),
                )),
            }
        }
        other => Document::Single(other),
    }
}

/// serde reports a missing field at its parent; name the field itself.
fn field_error_of(path: &str, message: &str) -> FieldError {
    let parent = if path == "." { "" } else { path };
    let missing = message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split('`').next());
    match missing {
        Some(name) => FieldError::new(join_path(parent, name), "missing required field"),
        None => FieldError::new(parent, message),
    }
}

/// The field path (`a.b[2].c`) of a field `serde_ignored` reports.
pub fn render_ignored(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", render_ignored(parent)),
        Path::Map { parent, key } => join_path(&render_ignored(parent), key),
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => render_ignored(parent),
    }
}

/// What a value is, in words (`a string`, `a table`), for errors.
pub fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "a table",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Transport;

    const FULL: &str = r#"
server_id = "fs"
display_name = "Files"
transport = "stdio"
allowed_tools = ["read_*"]
denied_tools = ["read_secret*"]
allowed_resources = ["file:///data/*.md", "ui://*"]
allowed_prompts = ["summarize*"]
approval_policy = "policy"
approval_tools = { "write_*" = "always" }
isolation = "per_session"
protocol = "2025-11-25"
enabled = false
labels = { team = "infra" }
transform = [{ prefix = "fs_" }, { prefix = { remove = "a", add = "b" } }, { suffix = "_v2" }]

[stdio]
command = "npx"
args = ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]
env = { LOG = "${ENV:LOG_LEVEL:-info}" }
env_from = ["HOME"]
cwd = "/tmp"

[budgets]
max_concurrency = 2
"#;

    fn field_list(err: &ModelError) -> Vec<&str> {
        err.field_errors()
            .iter()
            .map(|e| e.field.as_str())
            .collect()
    }

    #[test]
    fn toml_and_json_read_the_same_record() {
        let toml = parse_record(FULL, Format::Toml, Strictness::Strict).unwrap();
        let json_text = serde_json::to_string(&toml.spec).unwrap();
        let json = parse_record(&json_text, Format::Json, Strictness::Strict).unwrap();
        assert_eq!(toml.spec, json.spec);
        let spec = toml.spec;
        assert_eq!(spec.transport, Transport::Stdio);
        assert!(!spec.enabled);
        assert_eq!(spec.budgets.max_concurrency, 2);
        assert_eq!(spec.budgets.tool_timeout_ms, 30_000);
        assert_eq!(spec.transform.len(), 3);
        assert_eq!(spec.allowed_resources, ["file:///data/*.md", "ui://*"]);
        assert_eq!(spec.allowed_prompts, ["summarize*"]);
        assert_eq!(spec.protocol, crate::record::Protocol::V2025_11_25);
        // TOML rendering round-trips too.
        let again = parse_record(&spec.to_toml(), Format::Toml, Strictness::Strict).unwrap();
        assert_eq!(again.spec, spec);
    }

    #[test]
    fn defaults_apply() {
        let spec = parse_record(
            r#"{"server_id":"a","transport":"streamable_http","http":{"url":"http://127.0.0.1:1/mcp"}}"#,
            Format::Json,
            Strictness::Strict,
        )
        .unwrap()
        .spec;
        assert!(spec.enabled);
        assert!(spec.allowed_tools.is_empty());
        assert!(spec.allowed_resources.is_empty());
        assert!(spec.allowed_prompts.is_empty());
        // Empty resource and prompt lists are left out; allowed_tools is not.
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(json["allowed_tools"], serde_json::json!([]));
        assert!(json.get("allowed_resources").is_none());
        assert!(json.get("allowed_prompts").is_none());
        // `protocol` is `auto`, left out likewise.
        assert_eq!(spec.protocol, crate::record::Protocol::Auto);
        assert!(json.get("protocol").is_none());
        assert_eq!(spec.effective_tool_namespace(), "mcp.a");
        assert_eq!(spec.budgets, crate::record::Budgets::default());
    }

    #[test]
    fn unknown_fields_strict_and_lenient() {
        let text = "server_id = \"a\"\ntransport = \"stdio\"\ncolour = 1\n[stdio]\ncommand = \"x\"\nshell = true\n";
        let lenient = parse_record(text, Format::Toml, Strictness::Lenient).unwrap();
        assert_eq!(lenient.ignored_fields, ["colour", "stdio.shell"]);
        let err = parse_record(text, Format::Toml, Strictness::Strict).unwrap_err();
        assert_eq!(field_list(&err), ["colour", "stdio.shell"]);
        // A misspelt list is not silently an empty (deny-all) one in strict mode.
        let typo = "server_id = \"a\"\ntransport = \"stdio\"\nallowed_resource = [\"ui://*\"]\nallowed_prompts = [\"greet\"]\n[stdio]\ncommand = \"x\"\n";
        let lenient = parse_record(typo, Format::Toml, Strictness::Lenient).unwrap();
        assert_eq!(lenient.ignored_fields, ["allowed_resource"]);
        assert!(lenient.spec.allowed_resources.is_empty());
        assert_eq!(lenient.spec.allowed_prompts, ["greet"]);
        let err = parse_record(typo, Format::Toml, Strictness::Strict).unwrap_err();
        assert_eq!(field_list(&err), ["allowed_resource"]);
    }

    #[test]
    fn type_errors_name_the_field() {
        let cases = [
            (
                "server_id = \"a\"\ntransport = \"carrier_pigeon\"",
                "transport",
            ),
            ("server_id = \"a\"", "transport"),
            ("transport = \"stdio\"", "server_id"),
            (
                "server_id = \"a\"\ntransport = \"stdio\"\n[stdio]\nargs = []",
                "stdio.command",
            ),
            (
                "server_id = \"a\"\ntransport = \"stdio\"\nallowed_tools = [\"x\", 3]\n[stdio]\ncommand = \"x\"",
                "allowed_tools[1]",
            ),
            (
                "server_id = \"a\"\ntransport = \"stdio\"\nallowed_resources = [\"ui://*\", false]\n[stdio]\ncommand = \"x\"",
                "allowed_resources[1]",
            ),
            (
                "server_id = \"a\"\ntransport = \"stdio\"\nallowed_prompts = \"greet\"\n[stdio]\ncommand = \"x\"",
                "allowed_prompts",
            ),
            (
                "server_id = \"a\"\ntransport = \"stdio\"\nallowed_resources = [\"ui://*\", \"ui://[\"]\n[stdio]\ncommand = \"x\"",
                "allowed_resources[1]",
            ),
            (
                "server_id = \"a\"\ntransport = \"stdio\"\n[stdio]\ncommand = \"x\"\n[budgets]\nmax_concurrency = -1",
                "budgets.max_concurrency",
            ),
            (
                "server_id = \"a\"\ntransport = \"stdio\"\nprotocol = \"2025-03-26\"\n[stdio]\ncommand = \"x\"",
                "protocol",
            ),
            (
                "server_id = \"a\"\ntransport = \"stdio\"\nprotocol = 2026\n[stdio]\ncommand = \"x\"",
                "protocol",
            ),
        ];
        for (text, field) in cases {
            let err = parse_record(text, Format::Toml, Strictness::Lenient).unwrap_err();
            assert_eq!(err.field(), Some(field), "{text}: {err}");
        }
    }

    #[test]
    fn syntax_errors_are_reported_as_such() {
        let err = parse_record("server_id = ", Format::Toml, Strictness::Lenient).unwrap_err();
        assert!(
            matches!(
                err,
                ModelError::Syntax {
                    format: Format::Toml,
                    ..
                }
            ),
            "{err}"
        );
        let err = parse_record("[1,", Format::Json, Strictness::Lenient).unwrap_err();
        assert!(
            matches!(
                err,
                ModelError::Syntax {
                    format: Format::Json,
                    ..
                }
            ),
            "{err}"
        );
        let err = parse_record("[]", Format::Json, Strictness::Lenient).unwrap_err();
        assert_eq!(err.field(), Some(""));
    }

    #[test]
    fn servers_array_form() {
        let text = r#"
[[servers]]
server_id = "a"
transport = "stdio"
stdio = { command = "x" }

[[servers]]
server_id = "b.bad"
transport = "stdio"
stdio = { command = "x" }
"#;
        let err = parse_document(text, Format::Toml, Strictness::Lenient).unwrap_err();
        assert_eq!(field_list(&err), ["servers[1].server_id"]);
        let ok = parse_document(
            &text.replace("b.bad", "b"),
            Format::Toml,
            Strictness::Lenient,
        )
        .unwrap();
        assert_eq!(ok.len(), 2);
        let json = r#"[{"server_id":"a","transport":"stdio","stdio":{"command":"x"}}]"#;
        assert_eq!(
            parse_document(json, Format::Json, Strictness::Strict)
                .unwrap()
                .len(),
            1
        );
    }
}
