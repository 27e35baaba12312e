//! A policy's limits on how often and how many at once its callers call
//! tools (docs/reference.md §12.3): `rate_limits` counted in tool calls
//! across the fleet, `max_concurrent_calls` per caller on each worker.
//!
//! A rate limit is a fixed window that opens at the first call it counts
//! (not at a wall-clock boundary, so a burst cannot straddle two windows
//! and double the limit) and lasts `per_s` seconds; within it at most
//! `calls` calls of the matching tools run. The workers count with the
//! registry ([`LimitKey`] names the counter; `quiver-registry` leases
//! shares of each window to them).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::naming::quote;
use crate::pattern::Pattern;
use crate::validate::is_valid_server_id;

/// The longest window of a rate limit: one day.
pub const MAX_WINDOW_SECS: u32 = 86_400;
/// The most rate limits one policy may carry.
pub const MAX_RATE_LIMITS: usize = 32;

/// Whose calls one counter counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitScope {
    /// Each caller (principal) has its own window.
    #[default]
    Principal,
    /// All callers of the policy share one window.
    Policy,
}

/// One rate limit as configured: `{tools, calls, per_s, per?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// A pattern over `<server_id>.<tool_name>` (e.g. `search.*`).
    pub tools: String,
    /// Calls allowed per window, at least 1.
    pub calls: u32,
    /// The window, in seconds (1 to a day).
    pub per_s: u32,
    /// Whose calls share a window.
    #[serde(default)]
    pub per: LimitScope,
}

/// A rate limit or `max_concurrent_calls` that is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct RateLimitError {
    /// The offending field, e.g. `rate_limits[1].per_s`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

fn invalid(field: String, message: impl Into<String>) -> RateLimitError {
    RateLimitError {
        field,
        message: message.into(),
    }
}

/// A checked [`RateLimit`], its pattern compiled.
#[derive(Debug, Clone)]
pub struct CompiledRateLimit {
    /// Its position in the policy's list (names it in refusals).
    pub index: usize,
    /// As configured.
    pub limit: RateLimit,
    pattern: Pattern,
}

impl CompiledRateLimit {
    /// Whether calls of `tool` at `server_id` count against this limit.
    pub fn applies(&self, server_id: &str, tool: &str) -> bool {
        self.pattern.matches(&format!("{server_id}.{tool}"))
    }

    /// The counter of `policy`'s calls by `principal` under this limit.
    pub fn key(&self, policy: &str, principal: &str) -> LimitKey {
        let who = match self.limit.per {
            LimitScope::Principal => principal,
            LimitScope::Policy => "",
        };
        LimitKey(format!(
            "{policy}\u{1f}{}\u{1f}{}\u{1f}{}\u{1f}{who}",
            self.limit.tools, self.limit.calls, self.limit.per_s
        ))
    }
}

impl fmt::Display for CompiledRateLimit {
    /// How a refusal names the limit: `rate_limits[0] (search.* 10 calls per 60 s per principal)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let per = match self.limit.per {
            LimitScope::Principal => "principal",
            LimitScope::Policy => "policy",
        };
        write!(
            f,
            "rate_limits[{}] ({} calls of {:?} per {} s per {per})",
            self.index,
            self.limit.calls,
            quote(&self.limit.tools),
            self.limit.per_s
        )
    }
}

/// The name of one fleet-wide counter: the policy, the limit as configured
/// (changing a limit starts a new counter) and, per principal, the caller.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LimitKey(pub String);

/// Checks and compiles a policy's rate limits; errors name the field.
pub fn compile_rate_limits(limits: &[RateLimit]) -> Result<Vec<CompiledRateLimit>, RateLimitError> {
    if limits.len() > MAX_RATE_LIMITS {
        return Err(invalid(
            "rate_limits".into(),
            format!("at most {MAX_RATE_LIMITS} rate limits per policy"),
        ));
    }
    limits
        .iter()
        .enumerate()
        .map(|(index, limit)| {
            let field = |name: &str| format!("rate_limits[{index}].{name}");
            if limit.calls == 0 {
                return Err(invalid(field("calls"), "must be at least 1"));
            }
            if limit.per_s == 0 || limit.per_s > MAX_WINDOW_SECS {
                return Err(invalid(
                    field("per_s"),
                    format!("must be between 1 and {MAX_WINDOW_SECS} seconds"),
                ));
            }
            let pattern = tools_pattern(&limit.tools).map_err(|m| invalid(field("tools"), m))?;
            Ok(CompiledRateLimit {
                index,
                limit: limit.clone(),
                pattern,
            })
        })
        .collect()
}

/// A `tools` glob: `<server>.<tool>` where the server part is a server id
/// or a pattern over ids (`*`, `web-*`) and the tool part any pattern; a
/// glob without the dot, or with a server part no server id could match,
/// would silently limit nothing, so it is refused.
fn tools_pattern(tools: &str) -> Result<Pattern, String> {
    let Some((server, tool)) = tools.split_once('.') else {
        return Err(format!(
            "{:?} is not a `<server_id>.<tool>` pattern (e.g. `search.*`, `*.web_*`)",
            quote(tools)
        ));
    };
    if server.is_empty() || tool.is_empty() {
        return Err(format!(
            "{}: both the server and the tool part must be given",
            quote(tools)
        ));
    }
    let literal_chars = server.chars().filter(|c| *c != '*').collect::<String>();
    if !(server.contains('*') || is_valid_server_id(server))
        || literal_chars
            .chars()
            .any(|c| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
    {
        return Err(format!(
            "{:?}: the server part {:?} matches no server id (letters, digits, `-`, `_`, and `*`)",
            quote(tools),
            quote(server)
        ));
    }
    Pattern::new(tools).map_err(|error| error.to_string())
}

/// Checks `max_concurrent_calls`.
pub fn check_max_concurrent(max: Option<u32>) -> Result<Option<u32>, RateLimitError> {
    match max {
        Some(0) => Err(invalid(
            "max_concurrent_calls".into(),
            "must be at least 1 (omit it for no limit)",
        )),
        other => Ok(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(tools: &str, calls: u32, per_s: u32) -> RateLimit {
        RateLimit {
            tools: tools.into(),
            calls,
            per_s,
            per: LimitScope::Principal,
        }
    }

    #[test]
    fn limits_match_server_dot_tool_and_key_by_scope() {
        let compiled =
            compile_rate_limits(&[limit("search.web_*", 10, 60), limit("*.*", 5, 1)]).unwrap();
        assert!(compiled[0].applies("search", "web_fetch"));
        assert!(!compiled[0].applies("search", "images"));
        assert!(!compiled[0].applies("searcher", "web_fetch"));
        assert!(compiled[1].applies("anything", "at_all"));
        assert_ne!(compiled[0].key("p", "alice"), compiled[0].key("p", "bob"));
        let mut shared = compiled[0].clone();
        shared.limit.per = LimitScope::Policy;
        assert_eq!(shared.key("p", "alice"), shared.key("p", "bob"));
        assert_ne!(shared.key("p", "alice"), shared.key("q", "alice"));
        assert_eq!(
            compiled[0].to_string(),
            "rate_limits[0] (10 calls of \"search.web_*\" per 60 s per principal)"
        );
    }

    #[test]
    fn bad_limits_name_their_field() {
        let field = |limits: &[RateLimit]| compile_rate_limits(limits).unwrap_err().field;
        assert_eq!(field(&[limit("a.b", 0, 60)]), "rate_limits[0].calls");
        assert_eq!(
            field(&[limit("a.b", 1, 60), limit("a.b", 1, 0)]),
            "rate_limits[1].per_s"
        );
        assert_eq!(field(&[limit("a.b", 1, 86_401)]), "rate_limits[0].per_s");
        for glob in [
            "no_dot",
            ".tool",
            "server.",
            "bad server.x",
            "a/b.c",
            "a.[",
            "",
        ] {
            assert_eq!(
                field(&[limit(glob, 1, 1)]),
                "rate_limits[0].tools",
                "{glob}"
            );
        }
        let many = vec![limit("a.b", 1, 1); MAX_RATE_LIMITS + 1];
        assert_eq!(field(&many), "rate_limits");
        assert_eq!(
            check_max_concurrent(Some(0)).unwrap_err().field,
            "max_concurrent_calls"
        );
        assert_eq!(check_max_concurrent(Some(3)), Ok(Some(3)));
    }
}
