//! The tools one request may use: the registry snapshot, filtered by the
//! layered policy (registry → task → session), with the tools each selected
//! server lists (from the pool's cache), under their injected names.
//!
//! Routing resolves a model's tool name only against this catalog, so a name
//! that was not injected for this request — malformed, denied, or of a
//! server outside the policy — can never be executed (R-NAME-2).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, LazyLock, Mutex};

use quiver_mcp::{McpError, McpPool, Tool};
use quiver_model::naming::{parse_compat_name, parse_injected_name};
use quiver_model::pattern::PatternError;
use quiver_model::policy::{
    CompiledSessionFilter, CompiledTaskPolicy, Decision, RejectReason, ServerToolFilter,
    evaluate_tools, server_selected,
};
use quiver_model::{ApprovalMode, ApprovalPolicy, McpServerSpec, StoredServer};
use quiver_sync::Snapshot;

/// Compiled filters kept at most; the cache starts over when full.
const FILTER_CACHE_LIMIT: usize = 4096;

/// A record's compiled `allowed_tools` / `denied_tools`, with the lists it
/// was compiled from.
struct CachedFilter {
    allowed: Vec<String>,
    denied: Vec<String>,
    filter: Arc<ServerToolFilter>,
}

/// Compiled server tool filters by server id. Compiling the patterns builds
/// a regex and costs far more than the rest of a catalog (tens of
/// microseconds per server and request), while the lists change only when
/// the record does; an entry is used only while the record's lists are
/// exactly the ones it was compiled from.
static FILTERS: LazyLock<Mutex<HashMap<String, CachedFilter>>> = LazyLock::new(Mutex::default);

/// `ServerToolFilter::new(spec)`, compiled once per distinct lists.
fn server_filter(spec: &McpServerSpec) -> Result<Arc<ServerToolFilter>, PatternError> {
    let cached = FILTERS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&spec.server_id)
        .filter(|c| c.allowed == spec.allowed_tools && c.denied == spec.denied_tools)
        .map(|c| c.filter.clone());
    if let Some(filter) = cached {
        return Ok(filter);
    }
    let filter = Arc::new(ServerToolFilter::new(spec)?);
    let mut filters = FILTERS.lock().unwrap_or_else(|p| p.into_inner());
    if filters.len() >= FILTER_CACHE_LIMIT {
        filters.clear();
    }
    filters.insert(
        spec.server_id.clone(),
        CachedFilter {
            allowed: spec.allowed_tools.clone(),
            denied: spec.denied_tools.clone(),
            filter: filter.clone(),
        },
    );
    Ok(filter)
}

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
}

/// A server that was selected but whose tools are not offered, and why.
#[derive(Debug, Clone)]
pub struct Unavailable {
    /// The server.
    pub server_id: String,
    /// Why (unresolved `${ENV:…}`, failed start, …).
    pub error: McpError,
}

/// The tools of one request.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    tools: Vec<CatalogTool>,
    by_injected: HashMap<String, usize>,
    /// Selected servers whose tools could not be listed.
    pub unavailable: Vec<Unavailable>,
    /// Tools a selected server lists that the policy rejects, with the reason.
    pub rejected: Vec<(String, String, RejectReason)>,
}

impl Catalog {
    /// Builds the catalog; tool lists of the selected servers are fetched
    /// concurrently, so one slow or broken server costs only its own share.
    /// `only` restricts it to some servers (resolving one call needs only the
    /// servers its name can refer to).
    pub async fn build(
        snapshot: &Snapshot,
        pool: &McpPool,
        task: &CompiledTaskPolicy,
        session: Option<&CompiledSessionFilter>,
        only: Option<&BTreeSet<String>>,
    ) -> Catalog {
        let selected: Vec<_> = snapshot
            .servers
            .values()
            .filter(|server| only.is_none_or(|ids| ids.contains(&server.spec.server_id)))
            .filter(|server| server_selected(&server.spec, task, session).is_ok())
            .cloned()
            .collect();
        let listings =
            futures::future::join_all(selected.iter().map(|server| pool.list_tools(server))).await;
        let mut catalog = Catalog::default();
        for (server, listing) in selected.into_iter().zip(listings) {
            let tools = match listing {
                Ok(tools) => tools,
                Err(error) => {
                    catalog.unavailable.push(Unavailable {
                        server_id: server.spec.server_id.clone(),
                        error,
                    });
                    continue;
                }
            };
            let Ok(filter) = server_filter(&server.spec) else {
                continue;
            };
            let by_name: HashMap<&str, &Tool> =
                tools.iter().map(|t| (t.name.as_ref(), t)).collect();
            let decisions = evaluate_tools(
                &server.spec,
                &filter,
                task,
                session,
                tools.iter().map(|t| t.name.as_ref()),
            );
            for decision in decisions {
                match decision.decision {
                    Decision::Allowed {
                        injected_name,
                        exposed_name,
                    } => {
                        let Some(tool) = by_name.get(decision.tool_name.as_str()) else {
                            continue;
                        };
                        catalog
                            .by_injected
                            .insert(injected_name.clone(), catalog.tools.len());
                        catalog.tools.push(CatalogTool {
                            injected_name,
                            server: server.clone(),
                            tool: (*tool).clone(),
                            exposed_name,
                        });
                    }
                    Decision::Rejected(reason) => {
                        catalog.rejected.push((
                            server.spec.server_id.clone(),
                            decision.tool_name,
                            reason,
                        ));
                    }
                }
            }
        }
        catalog
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
    pub fn tools(&self) -> &[CatalogTool] {
        &self.tools
    }

    /// The tool a model-supplied name refers to: an injected name, or the
    /// compatibility form `mcp.<server_id>.<tool_name>` of an injected tool.
    pub fn resolve(&self, name: &str) -> Option<&CatalogTool> {
        if let Some(&index) = self.by_injected.get(name) {
            return self.tools.get(index);
        }
        let reference = parse_compat_name(name)?;
        self.tools.iter().find(|tool| {
            tool.server_id() == reference.server_id && tool.exposed_name == reference.tool_name
        })
    }
}

#[cfg(test)]
mod tests {
    use quiver_model::Transport;

    use super::*;

    #[test]
    fn compiled_filters_are_reused_only_for_the_same_lists() {
        let mut spec = McpServerSpec::new("filter-cache-test", Transport::Stdio);
        spec.allowed_tools = vec!["read_*".into()];
        let first = server_filter(&spec).unwrap();
        assert!(Arc::ptr_eq(&first, &server_filter(&spec).unwrap()));
        assert!(first.check("read_file").is_ok());
        assert!(first.check("write_file").is_err());

        spec.allowed_tools = vec!["write_*".into()];
        let second = server_filter(&spec).unwrap();
        assert!(!Arc::ptr_eq(&first, &second));
        assert!(second.check("read_file").is_err());
        assert!(second.check("write_file").is_ok());

        spec.denied_tools = vec!["write_secret".into()];
        let third = server_filter(&spec).unwrap();
        assert!(third.check("write_secret").is_err());
        assert!(third.check("write_file").is_ok());
    }
}
