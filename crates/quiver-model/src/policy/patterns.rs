//! Tool patterns kept with their text, so a rejection can quote the pattern
//! that matched and a compile error can name the entry that failed.

use crate::naming::quote;
use crate::pattern::{PatternError, PatternSet};

use super::error::PolicyError;

/// Patterns together with their text, so a rejection can quote the pattern.
#[derive(Debug, Clone)]
pub(super) struct NamedPatterns {
    pub(super) patterns: Vec<String>,
    set: PatternSet,
}

impl NamedPatterns {
    pub(super) fn new(patterns: &[String]) -> Result<Self, PatternError> {
        Ok(NamedPatterns {
            patterns: patterns.to_vec(),
            set: PatternSet::new(patterns)?,
        })
    }

    /// Compiles one pattern at a time so the error names its index.
    pub(super) fn for_field(field: &str, patterns: &[String]) -> Result<Self, PolicyError> {
        for (i, pattern) in patterns.iter().enumerate() {
            if let Err(error) = PatternSet::new(std::slice::from_ref(pattern)) {
                return Err(PolicyError::InvalidPattern {
                    field: format!("{field}[{i}]"),
                    error,
                });
            }
        }
        NamedPatterns::new(patterns).map_err(|error| PolicyError::InvalidPattern {
            field: field.to_owned(),
            error,
        })
    }

    pub(super) fn empty() -> Self {
        NamedPatterns {
            patterns: Vec::new(),
            set: PatternSet::empty(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    pub(super) fn matches(&self, name: &str) -> bool {
        self.set.matches(name)
    }

    /// The first matching pattern as written.
    pub(super) fn first_match(&self, name: &str) -> Option<String> {
        if !self.set.matches(name) {
            return None;
        }
        let index = self.set.first_match(name)?;
        self.patterns.get(index).map(|p| quote(p))
    }
}
