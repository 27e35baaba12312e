//! Whether the chat tool loop offers tool search instead of the whole
//! catalog (docs/reference.md §9 **R-CHAT-8**): a task default and a per-request
//! choice, written `true`, `false` or `{max_tools = k}`.

use serde::{Deserialize, Serialize};

/// Tools offered with the search function when a setting does not say.
pub const DEFAULT_MAX_TOOLS: u32 = 8;

/// The most tools one setting may offer up front (and one search return).
pub const MAX_TOOLS_LIMIT: u32 = 128;

/// Tool search: off, on with [`DEFAULT_MAX_TOOLS`], or on with `max_tools`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ToolSearchSetting {
    /// `true` or `false`.
    Switch(bool),
    /// `{"max_tools": k}`: on, offering at most `k` tools.
    Limited {
        /// Tools offered up front, and matches one search returns.
        max_tools: u32,
    },
}

impl Default for ToolSearchSetting {
    fn default() -> Self {
        ToolSearchSetting::Switch(false)
    }
}

/// A setting whose `max_tools` is out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0} is not between 1 and {MAX_TOOLS_LIMIT}")]
pub struct ToolSearchError(pub u32);

impl ToolSearchSetting {
    /// `Some(max_tools)` when search is on; the limit checked.
    pub fn max_tools(self) -> Result<Option<u32>, ToolSearchError> {
        match self {
            ToolSearchSetting::Switch(false) => Ok(None),
            ToolSearchSetting::Switch(true) => Ok(Some(DEFAULT_MAX_TOOLS)),
            ToolSearchSetting::Limited { max_tools }
                if (1..=MAX_TOOLS_LIMIT).contains(&max_tools) =>
            {
                Ok(Some(max_tools))
            }
            ToolSearchSetting::Limited { max_tools } => Err(ToolSearchError(max_tools)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> ToolSearchSetting {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn written_as_a_switch_or_with_a_limit() {
        assert_eq!(parse("false").max_tools(), Ok(None));
        assert_eq!(parse("true").max_tools(), Ok(Some(DEFAULT_MAX_TOOLS)));
        assert_eq!(parse(r#"{"max_tools": 3}"#).max_tools(), Ok(Some(3)));
        assert_eq!(
            parse(r#"{"max_tools": 0}"#).max_tools(),
            Err(ToolSearchError(0))
        );
        assert!(serde_json::from_str::<ToolSearchSetting>(r#"{"max": 3}"#).is_err());
        assert!(serde_json::from_str::<ToolSearchSetting>(r#""yes""#).is_err());
    }
}
