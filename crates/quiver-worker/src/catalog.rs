//! The tools one request may use: the registry snapshot, filtered by the
//! layered policy (registry → task → session), with the tools each selected
//! server lists (from the pool's cache), under their injected names.
//!
//! Routing resolves a model's tool name only against this catalog, so a name
//! that was not injected for this request — malformed, denied, or of a
//! server outside the policy — can never be executed (R-NAME-2).
//!
//! Evaluating a server's tools (patterns, name encoding, the function JSON
//! sent to models) is done once per record, tool list, task and session
//! patterns and kept in a [`CatalogCache`]: a chat request with a thousand
//! tools then costs a few lookups instead of a thousand evaluations.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quiver_mcp::{McpError, McpPool, Tool};
use quiver_model::naming::{parse_compat_name, parse_injected_name, transformed_tool_name};
use quiver_model::policy::{
    CompiledSessionFilter, CompiledTaskPolicy, Decision, ListedTool, RejectReason,
    ServerToolFilter, evaluate_tools, server_selected,
};
use quiver_model::{ApprovalMode, ApprovalPolicy, StoredServer};
use quiver_sync::Snapshot;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// Evaluated servers kept at most; the cache starts over when full.
const CACHE_LIMIT: usize = 4096;

/// One injected tool.
#[derive(Debug, Clone)]
pub struct CatalogTool {
    /// The function name the model sees (`mcp__…__…`).
    pub injected_name: String,
    /// The record of its server.
    pub server: Arc<StoredServer>,
    /// The tool as the server lists it (raw name).
    pub tool: Tool,
    /// The name after the record's transforms.
    pub exposed_name: String,
}

impl CatalogTool {
    /// The server id.
    pub fn server_id(&self) -> &str {
        &self.server.spec.server_id
    }

    /// The raw MCP tool name.
    pub fn tool_name(&self) -> &str {
        &self.tool.name
    }

    /// Whether the record requires an approval before this tool runs.
    pub fn needs_approval(&self) -> bool {
        let spec = &self.server.spec;
        match spec.approval_policy {
            ApprovalPolicy::Never => false,
            ApprovalPolicy::Always => true,
            ApprovalPolicy::Policy => spec.approval_tools.iter().any(|(pattern, mode)| {
                *mode == ApprovalMode::Always
                    && quiver_model::pattern::Pattern::new(pattern)
                        .is_ok_and(|p| p.matches(self.tool_name()))
            }),
        }
    }

    /// The OpenAI function definition: `{"type": "function", "function":
    /// {name, description, parameters}}`, the input schema unchanged.
    fn function(&self) -> Value {
        let mut function = Map::new();
        function.insert("name".into(), Value::String(self.injected_name.clone()));
        if let Some(description) = &self.tool.description {
            function.insert("description".into(), Value::String(description.to_string()));
        }
        function.insert(
            "parameters".into(),
            Value::Object((*self.tool.input_schema).clone()),
        );
        serde_json::json!({"type": "function", "function": function})
    }
}

/// A selected server whose tools are not offered, and why.
#[derive(Debug, Clone)]
pub struct Unavailable {
    /// The server.
    pub server_id: String,
    /// Why (unresolved `${ENV:…}`, failed start, …).
    pub error: McpError,
}

/// Where a catalog's tool lists come from: the pool, as the caller
/// `principal` gets them (a server whose OAuth connection is per user is
/// listed through the caller's own grant, see
/// [`McpPool::list_tools_for`]), waiting at most `wait` for any one server
/// (see [`McpPool::list_tools_within`]).
#[derive(Clone, Copy)]
pub struct Listing<'a> {
    /// The pool.
    pub pool: &'a McpPool,
    /// The caller's principal.
    pub principal: Option<&'a str>,
    /// How long one server's listing may take.
    pub wait: Option<Duration>,
}

impl Listing<'_> {
    /// What [`of`](Self::of) would answer at once, from the pool's cache
    /// (a listing or a recent failure); `None` when it would have to wait.
    /// Without a bound on the wait, `of` lists again for this caller
    /// rather than answer a cached failure: it is always asked then.
    fn cached(&self, server: &Arc<StoredServer>) -> Option<Result<Arc<Vec<Tool>>, McpError>> {
        self.wait?;
        self.pool.cached_tools(server)
    }

    /// `server`'s tool list.
    async fn of(&self, server: &Arc<StoredServer>) -> Result<Arc<Vec<Tool>>, McpError> {
        match self.wait {
            Some(wait) => {
                self.pool
                    .list_tools_within(server, self.principal, wait)
                    .await
            }
            None => self.pool.list_tools_for(server, self.principal).await,
        }
    }
}

/// The injected tools of one server for one task and session patterns.
#[derive(Debug)]
struct ServerTools {
    server_id: String,
    tools: Vec<CatalogTool>,
    /// Tools every policy layer allows whose injected name would be longer
    /// than models take (R-NAME-1): not offered to models, served under
    /// their own names where a server is served as itself (`/mcp/{id}`).
    long_named: Vec<CatalogTool>,
    by_injected: HashMap<String, usize>,
    /// `CatalogTool::function` of each tool, serialized once.
    functions: Vec<Box<RawValue>>,
}

impl ServerTools {
    fn evaluate(
        server: &Arc<StoredServer>,
        tools: &[Tool],
        task: &CompiledTaskPolicy,
        session: Option<&CompiledSessionFilter>,
    ) -> ServerTools {
        let mut evaluated = ServerTools {
            server_id: server.spec.server_id.clone(),
            tools: Vec::new(),
            long_named: Vec::new(),
            by_injected: HashMap::new(),
            functions: Vec::new(),
        };
        // Patterns are validated when the record is stored; one that does
        // not compile offers nothing rather than everything.
        let Ok(filter) = ServerToolFilter::new(&server.spec) else {
            return evaluated;
        };
        let by_name: HashMap<&str, &Tool> = tools.iter().map(|t| (t.name.as_ref(), t)).collect();
        let decisions = evaluate_tools(
            &server.spec,
            &filter,
            task,
            session,
            tools.iter().map(|t| ListedTool {
                name: &t.name,
                description: t.description.as_deref(),
                input_schema: Some(&t.input_schema),
            }),
        );
        for decision in decisions {
            let Some(tool) = by_name.get(decision.tool_name.as_str()) else {
                continue;
            };
            let (injected_name, exposed_name) = match decision.decision {
                Decision::Allowed {
                    injected_name,
                    exposed_name,
                } => (injected_name, exposed_name),
                // The name-length check comes after every policy layer.
                Decision::Rejected(RejectReason::InjectedNameTooLong { .. }) => {
                    let exposed =
                        transformed_tool_name(&server.spec.transform, &decision.tool_name);
                    evaluated.long_named.push(CatalogTool {
                        injected_name: format!("mcp.{}.{exposed}", server.spec.server_id),
                        server: server.clone(),
                        tool: (*tool).clone(),
                        exposed_name: exposed,
                    });
                    continue;
                }
                Decision::Rejected(_) => continue,
            };
            let tool = CatalogTool {
                injected_name,
                server: server.clone(),
                tool: (*tool).clone(),
                exposed_name,
            };
            let Ok(function) = serde_json::value::to_raw_value(&tool.function()) else {
                continue;
            };
            evaluated
                .by_injected
                .insert(tool.injected_name.clone(), evaluated.tools.len());
            evaluated.functions.push(function);
            evaluated.tools.push(tool);
        }
        evaluated
    }
}

/// What an evaluation depends on. Records, tool lists and task policies are
/// immutable and shared by `Arc`, so their addresses identify them; the
/// entry holds the `Arc`s, so an address cannot be reused while it lives.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct CacheKey {
    server: usize,
    tools: usize,
    task: usize,
    session: u64,
}

#[derive(Debug)]
struct CacheEntry {
    _pinned: (Arc<StoredServer>, Arc<Vec<Tool>>, Arc<CompiledTaskPolicy>),
    session: Option<(Vec<String>, Vec<String>)>,
    tools: Arc<ServerTools>,
}

/// Evaluated servers, shared by every request of a worker.
#[derive(Debug, Default)]
pub struct CatalogCache {
    entries: Mutex<HashMap<CacheKey, CacheEntry>>,
}

impl CatalogCache {
    fn get_or_evaluate(
        &self,
        server: &Arc<StoredServer>,
        tools: &Arc<Vec<Tool>>,
        task: &Arc<CompiledTaskPolicy>,
        session: Option<&CompiledSessionFilter>,
    ) -> Arc<ServerTools> {
        let patterns = session.map(|s| {
            let (allow, deny) = s.tool_patterns();
            (allow.to_vec(), deny.to_vec())
        });
        let key = CacheKey {
            server: Arc::as_ptr(server) as usize,
            tools: Arc::as_ptr(tools) as usize,
            task: Arc::as_ptr(task) as usize,
            session: {
                let mut hasher = DefaultHasher::new();
                patterns.hash(&mut hasher);
                hasher.finish()
            },
        };
        if let Some(entry) = self.lock().get(&key)
            && entry.session == patterns
        {
            return entry.tools.clone();
        }
        let evaluated = Arc::new(ServerTools::evaluate(server, tools, task, session));
        let mut entries = self.lock();
        if entries.len() >= CACHE_LIMIT {
            entries.clear();
        }
        entries.insert(
            key,
            CacheEntry {
                _pinned: (server.clone(), tools.clone(), task.clone()),
                session: patterns,
                tools: evaluated.clone(),
            },
        );
        evaluated
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<CacheKey, CacheEntry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The contents of a catalog, compared by address: evaluated servers are
/// shared through the [`CatalogCache`], so two requests of one task and
/// session patterns over one snapshot get equal keys. Holding the key keeps
/// the addresses from being reused.
#[derive(Debug, Clone)]
pub struct CatalogKey(Vec<Arc<ServerTools>>);

impl PartialEq for CatalogKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len() && self.0.iter().zip(&other.0).all(|(a, b)| Arc::ptr_eq(a, b))
    }
}

impl Eq for CatalogKey {}

impl Hash for CatalogKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        for server in &self.0 {
            (Arc::as_ptr(server) as usize).hash(state);
        }
    }
}

/// The tools of one request.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    servers: Vec<Arc<ServerTools>>,
    /// Selected servers whose tools could not be listed.
    pub unavailable: Vec<Unavailable>,
}

impl Catalog {
    /// Builds the catalog; tool lists of the selected servers are fetched
    /// concurrently, so one slow or broken server costs only its own share.
    /// `only` restricts it to some servers (resolving one call needs only the
    /// servers its name can refer to).
    ///
    /// With `wait`, a server whose tools are not listed by then (still
    /// connecting, or hung in its handshake) is left out of this catalog as
    /// unavailable, while its listing goes on in the background and serves
    /// later requests: one stuck server must not hold every request that
    /// selects it together with others for its whole connect timeout.
    pub async fn build(
        snapshot: &Snapshot,
        listing: Listing<'_>,
        cache: &CatalogCache,
        task: &Arc<CompiledTaskPolicy>,
        session: Option<&CompiledSessionFilter>,
        only: Option<&BTreeSet<String>>,
    ) -> Catalog {
        let selected: Vec<_> = snapshot
            .servers
            .values()
            .filter(|server| only.is_none_or(|ids| ids.contains(&server.spec.server_id)))
            .filter(|server| server_selected(&server.spec, task, session).is_ok())
            .collect();
        // The steady state, every list cached, is read without a listing's
        // future per server: that future is large, and `join_all` moves
        // each one whole to take its output (~19k instructions of a call,
        // BENCHMARKS.md "Work per call, counted").
        let cached: Vec<_> = selected
            .iter()
            .map(|server| listing.cached(server))
            .collect();
        let mut fetched = futures::future::join_all(
            selected
                .iter()
                .zip(&cached)
                .filter(|(_, hit)| hit.is_none())
                .map(|(server, _)| listing.of(server)),
        )
        .await
        .into_iter();
        let mut catalog = Catalog::default();
        for (server, hit) in selected.into_iter().zip(cached) {
            // One listing was fetched per server not cached, in order.
            let Some(listed) = hit.or_else(|| fetched.next()) else {
                continue;
            };
            match listed {
                Ok(tools) => catalog
                    .servers
                    .push(cache.get_or_evaluate(server, &tools, task, session)),
                Err(error) => catalog.unavailable.push(Unavailable {
                    server_id: server.spec.server_id.clone(),
                    error,
                }),
            }
        }
        catalog
    }

    /// The catalog of servers whose tools are already listed, evaluated as
    /// [`Catalog::build`] does, without a pool (tests and benchmarks of what
    /// uses catalogs).
    pub fn evaluated(
        listings: &[(Arc<StoredServer>, Arc<Vec<Tool>>)],
        task: &Arc<CompiledTaskPolicy>,
        session: Option<&CompiledSessionFilter>,
    ) -> Catalog {
        let cache = CatalogCache::default();
        Catalog {
            servers: listings
                .iter()
                .filter(|(server, _)| server_selected(&server.spec, task, session).is_ok())
                .map(|(server, tools)| cache.get_or_evaluate(server, tools, task, session))
                .collect(),
            unavailable: Vec::new(),
        }
    }

    /// The servers a model-supplied name can refer to.
    pub fn candidate_servers(name: &str) -> BTreeSet<String> {
        parse_injected_name(name)
            .into_iter()
            .chain(parse_compat_name(name))
            .map(|reference| reference.server_id)
            .collect()
    }

    /// Every injected tool, by server then listing order.
    pub fn tools(&self) -> impl Iterator<Item = &CatalogTool> {
        self.servers.iter().flat_map(|server| server.tools.iter())
    }

    /// Every tool the caller may use where servers are served as
    /// themselves (`/mcp/{id}`, under their own names): the injected ones
    /// and those whose injected name would be too long for models.
    pub fn own_named(&self) -> impl Iterator<Item = &CatalogTool> {
        self.servers
            .iter()
            .flat_map(|server| server.tools.iter().chain(server.long_named.iter()))
    }

    /// How many tools are injected.
    pub fn len(&self) -> usize {
        self.servers.iter().map(|server| server.tools.len()).sum()
    }

    /// Whether no tool is injected.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The function definitions of [`tools`](Self::tools), as JSON, in the
    /// same order.
    pub fn functions(&self) -> impl Iterator<Item = &RawValue> {
        self.servers
            .iter()
            .flat_map(|server| server.functions.iter().map(AsRef::as_ref))
    }

    /// What identifies this catalog's contents (see [`CatalogKey`]).
    pub fn key(&self) -> CatalogKey {
        CatalogKey(self.servers.clone())
    }

    /// The tool a model-supplied name refers to: an injected name, or the
    /// compatibility form `mcp.<server_id>.<tool_name>` of an injected tool.
    pub fn resolve(&self, name: &str) -> Option<&CatalogTool> {
        let server = |id: &str| self.servers.iter().find(|s| s.server_id == id);
        for reference in parse_injected_name(name) {
            if let Some(server) = server(&reference.server_id)
                && let Some(&index) = server.by_injected.get(name)
            {
                return server.tools.get(index);
            }
        }
        let reference = parse_compat_name(name)?;
        server(&reference.server_id)?
            .tools
            .iter()
            .find(|tool| tool.exposed_name == reference.tool_name)
    }
}

#[cfg(test)]
mod tests {
    use quiver_model::policy::{SessionFilter, TaskPolicy};
    use quiver_model::{McpServerSpec, Transport};

    use super::*;

    fn server(allowed: &[&str], revision: u64) -> Arc<StoredServer> {
        let mut spec = McpServerSpec::new("cache-test", Transport::Stdio);
        spec.allowed_tools = allowed.iter().map(|s| (*s).to_owned()).collect();
        Arc::new(StoredServer::created(spec, revision, "test"))
    }

    fn tools(names: &[&str]) -> Arc<Vec<Tool>> {
        Arc::new(
            names
                .iter()
                .map(|name| {
                    Tool::new(
                        name.to_string(),
                        "a tool",
                        Arc::new(serde_json::Map::from_iter([(
                            "type".to_owned(),
                            Value::String("object".into()),
                        )])),
                    )
                })
                .collect(),
        )
    }

    fn names(evaluated: &ServerTools) -> Vec<&str> {
        evaluated.tools.iter().map(|t| t.tool_name()).collect()
    }

    #[test]
    fn a_tool_whose_injected_name_is_too_long_is_served_only_as_itself() {
        let task = Arc::new(CompiledTaskPolicy::unrestricted());
        let long = "a_tool_name_long_enough_that_its_injected_name_exceeds_64";
        let record = server(&["*"], 1);
        let evaluated = ServerTools::evaluate(&record, &tools(&["short", long]), &task, None);
        assert_eq!(names(&evaluated), ["short"], "offered to models");
        assert_eq!(evaluated.long_named.len(), 1);
        assert_eq!(evaluated.long_named[0].exposed_name, long);
        assert_eq!(
            evaluated.long_named[0].injected_name,
            format!("mcp.cache-test.{long}")
        );
        // A tool the record does not allow is not served either way.
        let denied = server(&["short"], 2);
        let evaluated = ServerTools::evaluate(&denied, &tools(&["short", long]), &task, None);
        assert!(evaluated.long_named.is_empty());
    }

    #[test]
    fn evaluations_are_reused_only_for_the_same_inputs() {
        let cache = CatalogCache::default();
        let task = Arc::new(CompiledTaskPolicy::unrestricted());
        let record = server(&["read_*"], 1);
        let listed = tools(&["read_file", "write_file"]);
        let first = cache.get_or_evaluate(&record, &listed, &task, None);
        assert_eq!(names(&first), ["read_file"]);
        assert!(Arc::ptr_eq(
            &first,
            &cache.get_or_evaluate(&record, &listed, &task, None)
        ));
        // The function JSON is the one sent to models.
        let function: Value = serde_json::from_str(first.functions[0].get()).unwrap();
        assert_eq!(function["function"]["name"], first.tools[0].injected_name);
        assert_eq!(function["function"]["parameters"]["type"], "object");

        // A new record (new revision), a new tool list, another task or
        // other session patterns are evaluated afresh.
        let changed = server(&["write_*"], 2);
        assert_eq!(
            names(&cache.get_or_evaluate(&changed, &listed, &task, None)),
            ["write_file"]
        );
        let relisted = tools(&["read_file", "read_dir"]);
        assert_eq!(
            names(&cache.get_or_evaluate(&record, &relisted, &task, None)),
            ["read_file", "read_dir"]
        );
        let narrow = Arc::new(
            TaskPolicy {
                tool_denylist: vec!["*.read_file".into()],
                ..TaskPolicy::default()
            }
            .compile()
            .unwrap(),
        );
        assert!(names(&cache.get_or_evaluate(&record, &listed, &narrow, None)).is_empty());
        let session = SessionFilter {
            tool_denylist: vec!["cache-test.read_*".into()],
            ..SessionFilter::default()
        }
        .compile()
        .unwrap();
        assert!(names(&cache.get_or_evaluate(&record, &listed, &task, Some(&session))).is_empty());
        let other = SessionFilter::default().compile().unwrap();
        assert_eq!(
            names(&cache.get_or_evaluate(&record, &listed, &task, Some(&other))),
            ["read_file"]
        );
    }
}
