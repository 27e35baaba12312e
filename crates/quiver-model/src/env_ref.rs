//! `${ENV:VAR}` and `${ENV:VAR:-default}` references in env and header values.
//!
//! The registry only checks their syntax and stores them unresolved (R-BOOT-6);
//! workers resolve them in their own environment when a server starts.

use std::fmt;

const OPEN: &str = "${ENV:";

/// One piece of a value: literal text or an environment reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment<'a> {
    /// Text copied as is.
    Literal(&'a str),
    /// `${ENV:name}` or `${ENV:name:-default}`.
    Reference {
        /// Variable name.
        name: &'a str,
        /// Used when the variable is unset.
        default: Option<&'a str>,
    },
}

/// A value split into literal text and references.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template<'a> {
    segments: Vec<Segment<'a>>,
}

/// Why a value is not a well-formed template.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// `${ENV:` without a closing `}`.
    #[error("unterminated ${{ENV:...}} reference at byte {0}")]
    Unterminated(usize),
    /// The reference does not name a valid variable.
    #[error("invalid environment variable name {0:?} in ${{ENV:...}} reference")]
    BadName(String),
}

/// A reference whose variable is unset and that has no default.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("environment variable {name} is not set")]
pub struct Unresolved {
    /// The missing variable.
    pub name: String,
}

impl<'a> Template<'a> {
    /// Splits `value` into segments.
    pub fn parse(value: &'a str) -> Result<Self, TemplateError> {
        let mut segments = Vec::new();
        let mut rest = value;
        let mut offset = 0;
        while let Some(start) = rest.find(OPEN) {
            if start > 0 {
                segments.push(Segment::Literal(&rest[..start]));
            }
            let body_start = start + OPEN.len();
            let Some(close) = rest[body_start..].find('}') else {
                return Err(TemplateError::Unterminated(offset + start));
            };
            let body = &rest[body_start..body_start + close];
            let (name, default) = match body.split_once(":-") {
                Some((name, default)) => (name, Some(default)),
                None => (body, None),
            };
            if !is_env_name(name) {
                return Err(TemplateError::BadName(name.to_owned()));
            }
            segments.push(Segment::Reference { name, default });
            let consumed = body_start + close + 1;
            rest = &rest[consumed..];
            offset += consumed;
        }
        if !rest.is_empty() {
            segments.push(Segment::Literal(rest));
        }
        Ok(Template { segments })
    }

    /// The segments in order.
    pub fn segments(&self) -> &[Segment<'a>] {
        &self.segments
    }

    /// Whether the value holds no reference at all (a literal, possibly a secret).
    pub fn is_literal(&self) -> bool {
        self.segments
            .iter()
            .all(|segment| matches!(segment, Segment::Literal(_)))
    }

    /// Substitutes every reference using `lookup`.
    pub fn resolve(&self, lookup: impl Fn(&str) -> Option<String>) -> Result<String, Unresolved> {
        let mut out = String::new();
        for segment in &self.segments {
            match segment {
                Segment::Literal(text) => out.push_str(text),
                Segment::Reference { name, default } => match (lookup(name), default) {
                    (Some(value), _) => out.push_str(&value),
                    (None, Some(default)) => out.push_str(default),
                    (None, None) => {
                        return Err(Unresolved {
                            name: (*name).to_owned(),
                        });
                    }
                },
            }
        }
        Ok(out)
    }
}

impl fmt::Display for Template<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for segment in &self.segments {
            match segment {
                Segment::Literal(text) => f.write_str(text)?,
                Segment::Reference {
                    name,
                    default: None,
                } => write!(f, "${{ENV:{name}}}")?,
                Segment::Reference {
                    name,
                    default: Some(default),
                } => write!(f, "${{ENV:{name}:-{default}}}")?,
            }
        }
        Ok(())
    }
}

/// The reference `env_from = ["X"]` stands for.
pub fn reference_to(name: &str) -> String {
    format!("{OPEN}{name}}}")
}

/// `^[A-Za-z_][A-Za-z0-9_]*$`, the portable environment variable name.
pub fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "SET").then(|| "value".to_owned())
    }

    #[test]
    fn resolves_references_and_defaults() {
        let template = Template::parse("Bearer ${ENV:SET}/${ENV:UNSET:-fallback}").unwrap();
        assert!(!template.is_literal());
        assert_eq!(template.resolve(env).unwrap(), "Bearer value/fallback");
        assert_eq!(
            template.to_string(),
            "Bearer ${ENV:SET}/${ENV:UNSET:-fallback}"
        );
    }

    #[test]
    fn empty_default_is_allowed() {
        let template = Template::parse("${ENV:UNSET:-}").unwrap();
        assert_eq!(template.resolve(env).unwrap(), "");
    }

    #[test]
    fn missing_required_variable_is_named() {
        let template = Template::parse("x${ENV:UNSET}").unwrap();
        assert_eq!(
            template.resolve(env).unwrap_err(),
            Unresolved {
                name: "UNSET".into()
            }
        );
    }

    #[test]
    fn literal_values_and_plain_dollars() {
        let template = Template::parse("sk-123 $HOME ${OTHER}").unwrap();
        assert!(template.is_literal());
        assert_eq!(template.resolve(env).unwrap(), "sk-123 $HOME ${OTHER}");
    }

    #[test]
    fn malformed_references_are_rejected() {
        assert_eq!(
            Template::parse("a${ENV:X").unwrap_err(),
            TemplateError::Unterminated(1)
        );
        assert_eq!(
            Template::parse("${ENV:1X}").unwrap_err(),
            TemplateError::BadName("1X".into())
        );
        assert_eq!(
            Template::parse("${ENV:}").unwrap_err(),
            TemplateError::BadName(String::new())
        );
    }
}
