//! The record's patterns: tool names (`allowed_tools`, `denied_tools`, task
//! and session lists), prompt names (`allowed_prompts`) and resource URIs
//! (`allowed_resources`).
//!
//! A pattern matches the whole subject, case-sensitively. `*` matches any
//! substring (dots and slashes included, so `*.search*` spans server ids and
//! `file:///data/*` spans directories); the other glob syntax of `globset`
//! (`?`, `[abc]`, `{a,b}`) is accepted too, and a backslash makes the next
//! character literal (`\?` for a URI's query mark).

use globset::{Glob, GlobBuilder, GlobMatcher, GlobSet, GlobSetBuilder};

/// A pattern that failed to compile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid pattern {pattern:?}: {reason}")]
pub struct PatternError {
    /// The pattern as written.
    pub pattern: String,
    /// What is wrong with it.
    pub reason: String,
}

fn compile(pattern: &str) -> Result<Glob, PatternError> {
    let error = |reason: String| PatternError {
        pattern: pattern.to_owned(),
        reason,
    };
    if pattern.is_empty() {
        return Err(error("pattern is empty".into()));
    }
    if pattern.chars().any(char::is_control) {
        return Err(error("pattern contains a control character".into()));
    }
    GlobBuilder::new(pattern)
        .literal_separator(false)
        .backslash_escape(true)
        .build()
        .map_err(|err| error(err.kind().to_string()))
}

/// One compiled pattern.
#[derive(Debug, Clone)]
pub struct Pattern {
    matcher: GlobMatcher,
}

impl Pattern {
    /// Compiles `pattern`.
    pub fn new(pattern: &str) -> Result<Self, PatternError> {
        Ok(Pattern {
            matcher: compile(pattern)?.compile_matcher(),
        })
    }

    /// Whether `name` matches.
    pub fn matches(&self, name: &str) -> bool {
        self.matcher.is_match(name)
    }
}

/// A list of patterns; a name matches when any pattern does.
#[derive(Debug, Clone)]
pub struct PatternSet {
    set: GlobSet,
}

impl PatternSet {
    /// Compiles every pattern; the error names the first bad one.
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Self, PatternError> {
        let mut builder = GlobSetBuilder::new();
        for pattern in patterns {
            builder.add(compile(pattern.as_ref())?);
        }
        let set = builder.build().map_err(|err| PatternError {
            pattern: String::new(),
            reason: err.to_string(),
        })?;
        Ok(PatternSet { set })
    }

    /// A set without patterns: it matches nothing.
    pub fn empty() -> Self {
        PatternSet {
            set: GlobSet::empty(),
        }
    }

    /// Whether the set holds no pattern.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// Whether any pattern matches `name`.
    pub fn matches(&self, name: &str) -> bool {
        self.set.is_match(name)
    }

    /// Index of the first pattern, in the order given, that matches `name`.
    pub fn first_match(&self, name: &str) -> Option<usize> {
        self.set.matches(name).into_iter().min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn star_matches_any_substring_including_dots() {
        let set = PatternSet::new(&["read_*", "*.search*"]).unwrap();
        assert!(set.matches("read_file"));
        assert!(set.matches("fs.search_files"));
        assert!(set.matches("web.deep.searcher"));
        assert!(!set.matches("write_file"));
        assert_eq!(set.first_match("read_search"), Some(0));
        assert_eq!(set.first_match("fs.search"), Some(1));
        assert_eq!(set.first_match("write_file"), None);
        assert!(Pattern::new("*").unwrap().matches("a/b.c"));
    }

    #[test]
    fn malformed_patterns_are_rejected() {
        assert!(Pattern::new("").is_err());
        assert!(Pattern::new("[abc").is_err());
        assert!(Pattern::new("a\nb").is_err());
        let err = PatternSet::new(&["ok", "{a"]).unwrap_err();
        assert_eq!(err.pattern, "{a");
    }
}
