//! Tool search (docs/reference.md §9 **R-CHAT-8**): ranks the tools of a request's
//! catalog for a free-text query, so a chat request can offer a search
//! function and a few tools instead of every definition of a large catalog.
//!
//! Ranking is BM25 (the `bm25` crate: Unicode segmentation, English
//! stemming and stop words) over each tool's name split into words, title,
//! description, argument names and server id. The index is built from the
//! catalog itself — what the request's policy lets it call — so a search
//! can never surface anything else. Indexes are built once per catalog
//! contents and shared (see [`ToolIndexCache`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use bm25::{Document, Language, SearchEngine, SearchEngineBuilder};
use quiver_mcp::output::truncate_utf8;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::catalog::{Catalog, CatalogKey, CatalogTool};

/// The function a chat request with tool search offers the model.
pub const SEARCH_FUNCTION: &str = "quiver_search_tools";

/// Indexes kept at most; the cache starts over when full. Every request
/// whose session patterns differ has a catalog (and an index) of its own,
/// so this bounds what callers churning patterns can make the worker hold
/// (an index keeps each tool's text, at most `MAX_DOCUMENT_BYTES`, and its
/// token weights).
const INDEX_CACHE_LIMIT: usize = 64;

/// Bytes of a query that are searched; the rest is ignored.
pub const MAX_QUERY_BYTES: usize = 1024;

/// Bytes of one tool's text that are indexed (a hostile description must
/// not make the index large).
const MAX_DOCUMENT_BYTES: usize = 4096;

/// Bytes of a description shown in a search answer.
const MAX_SHOWN_DESCRIPTION_BYTES: usize = 300;

/// The search index of one catalog.
pub struct ToolIndex {
    /// `None` for an empty catalog (nothing to fit BM25 to).
    engine: Option<SearchEngine<u32>>,
}

impl std::fmt::Debug for ToolIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolIndex").finish_non_exhaustive()
    }
}

impl ToolIndex {
    /// Indexes every tool of `catalog`; documents are identified by their
    /// position in [`Catalog::tools`].
    pub fn build(catalog: &Catalog) -> ToolIndex {
        let documents: Vec<Document<u32>> = catalog
            .tools()
            .enumerate()
            .map(|(position, tool)| Document::new(position as u32, document(tool)))
            .collect();
        let engine = (!documents.is_empty()).then(|| {
            SearchEngineBuilder::<u32>::with_documents(Language::English, documents).build()
        });
        ToolIndex { engine }
    }

    /// Positions (in [`Catalog::tools`] order) of the best `limit` matches
    /// of `query`, best first; equal scores in catalog order.
    pub fn search(&self, query: &str, limit: usize) -> Vec<usize> {
        let Some(engine) = &self.engine else {
            return Vec::new();
        };
        let query = words(truncate_utf8(query, MAX_QUERY_BYTES));
        let mut found: Vec<(f32, usize)> = engine
            .search(&query, None)
            .into_iter()
            .filter(|result| result.score > 0.0)
            .map(|result| (result.score, result.document.id as usize))
            .collect();
        found.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        found.truncate(limit);
        found.into_iter().map(|(_, position)| position).collect()
    }
}

/// Search indexes, shared by every request of a worker.
#[derive(Debug, Default)]
pub struct ToolIndexCache {
    entries: Mutex<HashMap<CatalogKey, Arc<ToolIndex>>>,
}

impl ToolIndexCache {
    /// The index of `catalog`, built on first use of its contents.
    pub fn get_or_build(&self, catalog: &Catalog) -> Arc<ToolIndex> {
        let key = catalog.key();
        if let Some(index) = self.lock().get(&key) {
            return index.clone();
        }
        // Built outside the lock: a large catalog must not hold up requests
        // of other catalogs.
        let index = Arc::new(ToolIndex::build(catalog));
        let mut entries = self.lock();
        if entries.len() >= INDEX_CACHE_LIMIT {
            entries.clear();
        }
        entries.insert(key, index.clone());
        index
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<CatalogKey, Arc<ToolIndex>>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The definition of [`SEARCH_FUNCTION`], serialized once.
pub fn search_function() -> &'static RawValue {
    static FUNCTION: OnceLock<Box<RawValue>> = OnceLock::new();
    FUNCTION.get_or_init(|| {
        let function = json!({
            "type": "function",
            "function": {
                "name": SEARCH_FUNCTION,
                "description": "Search the tools available to you by what they do. Only some \
                    tools are offered at first; this finds others. The tools found become \
                    callable in your next turn.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "query": {
                            "type": "string",
                            "description": "What you want to do, in a few words"
                        }
                    },
                    "required": ["query"],
                    "additionalProperties": false
                }
            }
        });
        serde_json::value::to_raw_value(&function).expect("a JSON value serializes")
    })
}

/// How a tool appears in search results: its name to call, what it is.
pub fn presented(tool: &CatalogTool) -> Value {
    let mut shown = json!({
        "name": tool.injected_name,
        "server_id": tool.server_id(),
        "tool_name": tool.exposed_name,
    });
    if let Some(title) = &tool.tool.title {
        shown["title"] = json!(truncate_utf8(title, MAX_SHOWN_DESCRIPTION_BYTES));
    }
    if let Some(description) = &tool.tool.description {
        shown["description"] = json!(truncate_utf8(description, MAX_SHOWN_DESCRIPTION_BYTES));
    }
    shown
}

/// The indexed text of a tool. Its name's words come twice: a tool named
/// for what it does is the best evidence there is.
fn document(tool: &CatalogTool) -> String {
    let name = words(&tool.exposed_name);
    let mut text = format!("{name} {name}");
    if let Some(title) = &tool.tool.title {
        text.push(' ');
        text.push_str(title);
    }
    if let Some(description) = &tool.tool.description {
        text.push(' ');
        text.push_str(description);
    }
    if let Some(Value::Object(properties)) = tool.tool.input_schema.get("properties") {
        for argument in properties.keys() {
            text.push(' ');
            text.push_str(&words(argument));
        }
    }
    text.push(' ');
    text.push_str(&words(tool.server_id()));
    truncate_utf8(&text, MAX_DOCUMENT_BYTES).to_owned()
}

/// `getTinyImage`, `get_tiny-image.v2` → `get tiny image v2`: identifiers
/// split into the words the tokenizer can match.
fn words(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    let mut previous: Option<char> = None;
    for c in text.chars() {
        if c.is_alphanumeric() {
            let boundary = previous.is_some_and(|p| {
                (p.is_lowercase() && c.is_uppercase())
                    || (p.is_alphabetic() && c.is_numeric())
                    || (p.is_numeric() && c.is_alphabetic())
            });
            if boundary {
                out.push(' ');
            }
            out.push(c);
        } else if c.is_whitespace() || !out.ends_with(' ') {
            out.push(' ');
        }
        previous = Some(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;
    use quiver_mcp::Tool;
    use quiver_model::policy::{SessionFilter, TaskPolicy};
    use quiver_model::{McpServerSpec, StoredServer, Transport};

    use super::*;

    /// Tool names and descriptions the generated catalogs draw from.
    const TOOLS: &[(&str, &str)] = &[
        ("get_sum", "Returns the sum of two numbers"),
        ("add", "Adds two numbers"),
        ("read_file", "Read the contents of a file"),
        ("write_file", "Write text to a file"),
        ("search_issues", "Search issues of a repository"),
        ("delete_repo", "Delete a repository"),
        ("send_email", "Send an email message"),
        ("list_users", "List the users of a workspace"),
    ];
    const SERVERS: &[&str] = &["alpha", "beta", "gamma"];
    const WORDS: &[&str] = &[
        "sum",
        "numbers",
        "add",
        "file",
        "read",
        "issues",
        "repository",
        "delete",
        "email",
        "users",
        "alpha",
        "beta",
        "two",
        "zzz",
    ];

    fn server(id: &str, allowed: &[String], denied: &[String]) -> Arc<StoredServer> {
        let mut spec = McpServerSpec::new(id, Transport::Stdio);
        spec.allowed_tools = allowed.to_vec();
        spec.denied_tools = denied.to_vec();
        Arc::new(StoredServer::created(spec, 1, "test"))
    }

    fn listing() -> Arc<Vec<Tool>> {
        let schema = serde_json::Map::from_iter([("type".to_owned(), json!("object"))]);
        Arc::new(
            TOOLS
                .iter()
                .map(|(name, description)| {
                    Tool::new(name.to_string(), *description, Arc::new(schema.clone()))
                })
                .collect(),
        )
    }

    /// Whether the layered policy allows `server.tool`, decided here from
    /// the generated lists (exact names only), not by the product's code.
    fn allowed(
        server: &str,
        tool: &str,
        (allowed, denied): &(Vec<String>, Vec<String>),
        task_denied: &[String],
        session_servers: &Option<Vec<String>>,
    ) -> bool {
        allowed.iter().any(|a| a == tool || a == "*")
            && !denied.iter().any(|d| d == tool)
            && !task_denied.contains(&format!("{server}.{tool}"))
            && session_servers
                .as_ref()
                .is_none_or(|ids| ids.iter().any(|id| id == server))
    }

    fn names() -> impl Strategy<Value = Vec<String>> {
        proptest::collection::vec(
            prop_oneof![
                Just("*".to_owned()),
                proptest::sample::select(TOOLS).prop_map(|(n, _)| n.to_owned())
            ],
            0..4,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// A search can only surface tools the request's policy allows.
        #[test]
        fn search_never_surfaces_a_tool_outside_the_policy(
            records in proptest::collection::vec((names(), names()), SERVERS.len()),
            task_denied in proptest::collection::vec(
                (proptest::sample::select(SERVERS), proptest::sample::select(TOOLS))
                    .prop_map(|(s, (t, _))| format!("{s}.{t}")),
                0..6,
            ),
            session_servers in proptest::option::of(
                proptest::sample::subsequence(SERVERS.to_vec(), 0..=SERVERS.len())
                    .prop_map(|ids| ids.into_iter().map(str::to_owned).collect::<Vec<_>>()),
            ),
            query in proptest::collection::vec(proptest::sample::select(WORDS), 1..4),
            limit in 1usize..20,
        ) {
            let listings: Vec<_> = SERVERS
                .iter()
                .zip(&records)
                .map(|(id, (allowed, denied))| (server(id, allowed, denied), listing()))
                .collect();
            let task = Arc::new(
                TaskPolicy { tool_denylist: task_denied.clone(), ..Default::default() }
                    .compile()
                    .unwrap(),
            );
            let session = SessionFilter { server_ids: session_servers.clone(), ..Default::default() }
                .compile()
                .unwrap();
            let catalog = Catalog::evaluated(&listings, &task, Some(&session));
            let tools: Vec<_> = catalog.tools().collect();
            let found = ToolIndex::build(&catalog).search(&query.join(" "), limit);
            prop_assert!(found.len() <= limit);
            prop_assert_eq!(found.iter().collect::<BTreeSet<_>>().len(), found.len());
            for position in found {
                let tool = tools[position];
                let record = &records[SERVERS.iter().position(|s| *s == tool.server_id()).unwrap()];
                prop_assert!(
                    allowed(tool.server_id(), tool.tool_name(), record, &task_denied, &session_servers),
                    "{}.{} found by {:?}", tool.server_id(), tool.tool_name(), query
                );
            }
        }
    }

    #[test]
    fn identifiers_are_split_into_words() {
        assert_eq!(words("getTinyImage"), "get Tiny Image");
        assert_eq!(words("get-sum"), "get sum");
        assert_eq!(words("read_file.v2"), "read file v 2");
        assert_eq!(words("HTTPServer"), "HTTPServer");
    }
}
