//! The per-server `tools/list` cache (R-MCP-4): results live for a TTL,
//! failures for a short negative TTL (so a broken server is not hammered by
//! every request), and concurrent misses share one fetch.

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::Tool;

use crate::error::McpError;

#[derive(Default)]
enum State {
    #[default]
    Empty,
    Fresh(Listed, Instant),
    Failed(McpError, Instant),
}

/// A cached list, and the names of its tools a call of which needs no
/// `Mcp-Param-*` headers (found once per list, not per call).
struct Listed {
    tools: Arc<Vec<Tool>>,
    plain: HashSet<String>,
}

impl Listed {
    fn new(tools: Arc<Vec<Tool>>) -> Self {
        let plain = tools
            .iter()
            .filter(|tool| !names_key(&tool.input_schema, "x-mcp-header"))
            .map(|tool| tool.name.to_string())
            .collect();
        Listed { tools, plain }
    }
}

/// Cache of one server's tool list.
#[derive(Default)]
pub struct ToolsCache {
    state: Mutex<State>,
    /// Held while fetching: the single flight.
    flight: tokio::sync::Mutex<()>,
    /// Bumped by [`ToolsCache::clear`], so a fetch that started before an
    /// invalidation does not store its stale result.
    generation: AtomicU64,
}

impl ToolsCache {
    /// The cached answer (a fresh list, or a recent failure), if any.
    pub fn lookup(
        &self,
        ttl: Duration,
        negative_ttl: Duration,
    ) -> Option<Result<Arc<Vec<Tool>>, McpError>> {
        match &*self.state.lock().unwrap_or_else(|p| p.into_inner()) {
            State::Fresh(listed, at) if at.elapsed() < ttl => Some(Ok(listed.tools.clone())),
            State::Failed(err, at) if at.elapsed() < negative_ttl => Some(Err(err.clone())),
            _ => None,
        }
    }

    /// The cached list, or the result of `fetch` (run by one caller at a time).
    pub async fn get_or_fetch(
        &self,
        ttl: Duration,
        negative_ttl: Duration,
        fetch: impl Future<Output = Result<Arc<Vec<Tool>>, McpError>>,
    ) -> Result<Arc<Vec<Tool>>, McpError> {
        if let Some(hit) = self.lookup(ttl, negative_ttl) {
            return hit;
        }
        let _flight = self.flight.lock().await;
        // Whoever held the flight before us may have filled the cache.
        if let Some(hit) = self.lookup(ttl, negative_ttl) {
            return hit;
        }
        let generation = self.generation.load(Ordering::Acquire);
        let result = fetch.await;
        if self.generation.load(Ordering::Acquire) == generation {
            *self.state.lock().unwrap_or_else(|p| p.into_inner()) = match &result {
                Ok(tools) => State::Fresh(Listed::new(tools.clone()), Instant::now()),
                Err(err) => State::Failed(err.clone(), Instant::now()),
            };
        }
        result
    }

    /// Drops whatever is cached.
    pub fn clear(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = State::Empty;
    }

    /// Whether a call of `name` needs no `Mcp-Param-*` headers: the tool is
    /// in the cached list (however old) and its input schema annotates no
    /// argument with `x-mcp-header` (see [`crate::direct_call`]).
    pub fn plain_call(&self, name: &str) -> bool {
        match &*self.state.lock().unwrap_or_else(|p| p.into_inner()) {
            State::Fresh(listed, _) => listed.plain.contains(name),
            _ => false,
        }
    }

    /// Number of cached tools, when a list is cached.
    pub fn cached_len(&self) -> Option<usize> {
        match &*self.state.lock().unwrap_or_else(|p| p.into_inner()) {
            State::Fresh(listed, _) => Some(listed.tools.len()),
            _ => None,
        }
    }
}

/// Whether `key` is a key anywhere in `object`.
fn names_key(object: &serde_json::Map<String, serde_json::Value>, key: &str) -> bool {
    fn within(value: &serde_json::Value, key: &str) -> bool {
        match value {
            serde_json::Value::Object(object) => names_key(object, key),
            serde_json::Value::Array(items) => items.iter().any(|item| within(item, key)),
            _ => false,
        }
    }
    object
        .iter()
        .any(|(name, value)| name == key || within(value, key))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    const TTL: Duration = Duration::from_secs(60);
    const NEGATIVE: Duration = Duration::from_millis(100);

    #[tokio::test]
    async fn concurrent_misses_share_one_fetch() {
        let cache = Arc::new(ToolsCache::default());
        let fetches = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..20)
            .map(|_| {
                let (cache, fetches) = (cache.clone(), fetches.clone());
                tokio::spawn(async move {
                    cache
                        .get_or_fetch(TTL, NEGATIVE, async {
                            fetches.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            Ok(Arc::new(Vec::new()))
                        })
                        .await
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
        assert_eq!(cache.cached_len(), Some(0));
    }

    #[tokio::test]
    async fn failures_are_cached_briefly_and_clear_invalidates() {
        let cache = ToolsCache::default();
        let fail = || async { Err(McpError::Unavailable("down".into())) };
        assert!(cache.get_or_fetch(TTL, NEGATIVE, fail()).await.is_err());
        // Within the negative TTL the fetch is not attempted again.
        let hit = cache
            .get_or_fetch(TTL, NEGATIVE, async { panic!("must not fetch") })
            .await;
        assert!(hit.is_err());
        tokio::time::sleep(NEGATIVE).await;
        let ok = cache
            .get_or_fetch(TTL, NEGATIVE, async { Ok(Arc::new(Vec::new())) })
            .await;
        assert!(ok.is_ok());
        cache.clear();
        assert_eq!(cache.cached_len(), None);
    }
}
