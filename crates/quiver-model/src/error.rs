//! Errors of parsing and validating records. Every error names a field.

use std::fmt;

/// One problem with one field, e.g. `budgets.max_concurrency: must be greater than 0`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path of the field (`stdio.command`, `allowed_tools[2]`, `servers[1].http.url`).
    pub field: String,
    /// What is wrong, lowercase, no trailing punctuation.
    pub message: String,
}

impl FieldError {
    /// An error about `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            message: message.into(),
        }
    }

    /// The same error about a field nested under `prefix`.
    pub fn nested(mut self, prefix: &str) -> Self {
        self.field = join_path(prefix, &self.field);
        self
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// `prefix.field`, or `prefix[0]` when `field` is an index.
pub(crate) fn join_path(prefix: &str, field: &str) -> String {
    match (prefix.is_empty(), field.is_empty()) {
        (true, _) => field.to_owned(),
        (false, true) => prefix.to_owned(),
        (false, false) if field.starts_with('[') => format!("{prefix}{field}"),
        (false, false) => format!("{prefix}.{field}"),
    }
}

/// Syntax of a record document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// TOML, the `mcp.d` file format.
    Toml,
    /// JSON, the REST body format.
    Json,
}

impl Format {
    /// The format of a file name by its extension, if it is one of ours.
    pub fn from_file_name(name: &str) -> Option<Self> {
        let (_, extension) = name.rsplit_once('.')?;
        match extension {
            "toml" => Some(Format::Toml),
            "json" => Some(Format::Json),
            _ => None,
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Toml => "toml",
            Format::Json => "json",
        })
    }
}

/// Why a record (or a document of records) was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// The text is not valid TOML/JSON at all.
    #[error("{format} syntax error: {message}")]
    Syntax {
        /// The expected syntax.
        format: Format,
        /// The parser's message (with line and column where known).
        message: String,
    },
    /// The document parsed but fields are wrong; never empty.
    #[error("{}", display_all(.0))]
    Invalid(Vec<FieldError>),
}

impl ModelError {
    /// The first field named by this error, if any.
    pub fn field(&self) -> Option<&str> {
        match self {
            ModelError::Syntax { .. } => None,
            ModelError::Invalid(errors) => errors.first().map(|e| e.field.as_str()),
        }
    }

    /// The field errors (empty for syntax errors).
    pub fn field_errors(&self) -> &[FieldError] {
        match self {
            ModelError::Syntax { .. } => &[],
            ModelError::Invalid(errors) => errors,
        }
    }
}

fn display_all(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}
