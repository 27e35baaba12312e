//! Tool search in the tool loop (docs/reference.md §9 **R-CHAT-8**): instead of every
//! tool of the catalog, a request offers [`SEARCH_FUNCTION`] and at most
//! `max_tools` tools — those that best match the caller's last user message.
//! Each search the model makes answers with the best `max_tools` matches and
//! adds them to what the following requests offer, for the rest of the loop.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use crate::call::{CallError, arguments_object};
use crate::catalog::Catalog;
use crate::tool_search::{SEARCH_FUNCTION, ToolIndex, presented, search_function};

/// The tool search state of one chat request.
#[derive(Debug)]
pub struct ToolSearch {
    index: Arc<ToolIndex>,
    max_tools: usize,
    /// Positions in [`Catalog::tools`] offered so far.
    offered: Mutex<BTreeSet<usize>>,
}

/// The arguments of a search call.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchArguments {
    query: String,
}

impl ToolSearch {
    /// Starts with the tools that match the last user message of `body`.
    pub fn start(index: Arc<ToolIndex>, max_tools: u32, body: &Map<String, Value>) -> ToolSearch {
        let max_tools = max_tools as usize;
        let offered = last_user_text(body)
            .map(|text| index.search(&text, max_tools))
            .unwrap_or_default();
        ToolSearch {
            index,
            max_tools,
            offered: Mutex::new(offered.into_iter().collect()),
        }
    }

    /// The functions of the next request: the search function, then the
    /// tools offered so far in catalog order.
    pub fn functions<'a>(&self, catalog: &'a Catalog) -> Vec<&'a RawValue> {
        let offered = self.lock().clone();
        std::iter::once(search_function())
            .chain(
                catalog
                    .functions()
                    .enumerate()
                    .filter(|(position, _)| offered.contains(position))
                    .map(|(_, function)| function),
            )
            .collect()
    }

    /// Whether `name` is the search function.
    pub fn is_search(name: &str) -> bool {
        name == SEARCH_FUNCTION
    }

    /// Runs the model's search call: the content of its tool message, the
    /// matches offered from the next request on.
    pub fn answer(&self, catalog: &Catalog, arguments: &Value) -> Result<String, CallError> {
        let arguments = arguments_object(Some(arguments.clone()))?;
        let arguments = SearchArguments::deserialize(Value::Object(arguments)).map_err(|err| {
            CallError::InvalidArguments(format!(
                "{SEARCH_FUNCTION} takes {{\"query\": string}}: {err}"
            ))
        })?;
        let found = self.index.search(&arguments.query, self.max_tools);
        let all: Vec<_> = catalog.tools().collect();
        let tools: Vec<Value> = found
            .iter()
            .filter_map(|position| all.get(*position))
            .map(|tool| presented(tool))
            .collect();
        self.lock().extend(found.iter().copied());
        let note = if tools.is_empty() {
            "no tool matches; try other words"
        } else {
            "these tools can be called from your next turn"
        };
        Ok(json!({"tools": tools, "note": note}).to_string())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<usize>> {
        self.offered.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The text of the last `role: "user"` message: its string content, or its
/// text parts joined.
fn last_user_text(body: &Map<String, Value>) -> Option<String> {
    let messages = body.get("messages")?.as_array()?;
    let message = messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))?;
    match message.get("content")? {
        Value::String(text) => Some(text.clone()),
        Value::Array(parts) => Some(
            parts
                .iter()
                .filter_map(|part| part.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(" "),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_user_message_is_the_first_query() {
        let body = json!({"messages": [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "text", "text": "add"}, {"type": "image_url"}, {"type": "text", "text": "numbers"}]},
        ]});
        assert_eq!(
            last_user_text(body.as_object().unwrap()).as_deref(),
            Some("add numbers")
        );
        assert_eq!(last_user_text(&Map::new()), None);
    }
}
