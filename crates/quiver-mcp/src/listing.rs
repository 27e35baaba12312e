//! Paged MCP listings (`tools/list`, and `resources/list` or `prompts/list`
//! alike) under bounds: a server that always returns a `nextCursor`, or
//! pages without end, or never answers, costs one bounded listing and an
//! error naming the limit it hit, not a loop that pages forever.

use std::future::Future;
use std::time::Duration;

use rmcp::RoleClient;
use rmcp::model::{PaginatedRequestParams, Tool};
use rmcp::service::{Peer, ServiceError};
use serde::Serialize;

use crate::error::McpError;

/// Bounds of one listing (from [`crate::PoolOptions`]).
#[derive(Debug, Clone, Copy)]
pub struct ListLimits {
    /// Pages followed at most (`max_list_pages`).
    pub max_pages: usize,
    /// Items kept at most, over all pages (`max_list_items`).
    pub max_items: usize,
    /// Bytes of the items (as JSON) at most, over all pages (`max_list_bytes`).
    pub max_bytes: usize,
    /// The whole listing, every page, within this (`list_timeout`).
    pub timeout: Duration,
}

impl ListLimits {
    /// The defaults of the pool's options (and of the registry's preview).
    pub const DEFAULT: ListLimits = ListLimits {
        max_pages: 100,
        max_items: 10_000,
        max_bytes: 32 << 20,
        timeout: Duration::from_secs(30),
    };

    /// Every page of `tools/list` from `peer`, within these limits.
    pub async fn list_tools(
        &self,
        peer: &Peer<RoleClient>,
        map_error: impl Fn(ServiceError) -> McpError,
    ) -> Result<Vec<Tool>, McpError> {
        list_paged("tools/list", self, |cursor| {
            let request =
                peer.list_tools(Some(PaginatedRequestParams::default().with_cursor(cursor)));
            let map_error = &map_error;
            async move {
                let page = request.await.map_err(map_error)?;
                Ok((page.tools, page.next_cursor))
            }
        })
        .await
    }
}

/// One page of a listing: its items and the cursor of the next page.
pub type Page<T> = (Vec<T>, Option<String>);

/// Follows the pages of listing `method` (fetched by `page` from a cursor)
/// until the last, within `limits`.
pub async fn list_paged<T, F, Fut>(
    method: &str,
    limits: &ListLimits,
    mut page: F,
) -> Result<Vec<T>, McpError>
where
    T: Serialize,
    F: FnMut(Option<String>) -> Fut,
    Fut: Future<Output = Result<Page<T>, McpError>>,
{
    let exceeded = |limit: &str, value: usize| {
        McpError::Unavailable(format!("{method} exceeded {limit} = {value}"))
    };
    let paging = async {
        let mut items = Vec::new();
        let mut bytes = 0_usize;
        let mut cursor = None;
        for _ in 0..limits.max_pages {
            let (listed, next) = page(cursor).await?;
            if items.len() + listed.len() > limits.max_items {
                return Err(exceeded("max_list_items", limits.max_items));
            }
            bytes += listed.iter().map(crate::output::json_len).sum::<usize>();
            if bytes > limits.max_bytes {
                return Err(exceeded("max_list_bytes", limits.max_bytes));
            }
            items.extend(listed);
            match next {
                Some(next) => cursor = Some(next),
                None => return Ok(items),
            }
        }
        Err(McpError::Unavailable(format!(
            "{method} exceeded max_list_pages = {} (the server kept returning a nextCursor)",
            limits.max_pages
        )))
    };
    tokio::time::timeout(limits.timeout, paging)
        .await
        .unwrap_or_else(|_| {
            Err(McpError::Unavailable(format!(
                "{method} did not complete within list_timeout = {} ms",
                limits.timeout.as_millis()
            )))
        })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    const LIMITS: ListLimits = ListLimits {
        max_pages: 10,
        max_items: 50,
        max_bytes: 10_000,
        timeout: Duration::from_secs(5),
    };

    /// A listing of `pages` pages of `per_page` strings of `len` bytes
    /// (`pages` = `None`: endless); counts the pages fetched.
    async fn list(
        limits: ListLimits,
        pages: Option<usize>,
        per_page: usize,
        len: usize,
        fetched: &AtomicUsize,
    ) -> Result<Vec<String>, McpError> {
        list_paged("tools/list", &limits, |cursor| {
            let n = fetched.fetch_add(1, Ordering::SeqCst);
            assert_eq!(cursor, (n > 0).then(|| format!("c{n}")));
            let last = pages.is_some_and(|pages| n + 1 == pages);
            async move {
                Ok((
                    vec!["x".repeat(len); per_page],
                    (!last).then(|| format!("c{}", n + 1)),
                ))
            }
        })
        .await
    }

    #[tokio::test]
    async fn follows_cursors_to_the_last_page() {
        let fetched = AtomicUsize::new(0);
        let items = list(LIMITS, Some(3), 2, 10, &fetched).await.unwrap();
        assert_eq!((items.len(), fetched.load(Ordering::SeqCst)), (6, 3));
    }

    #[tokio::test]
    async fn every_bound_ends_the_listing_with_an_error_naming_it() {
        let fetched = AtomicUsize::new(0);
        let err = list(LIMITS, None, 1, 10, &fetched).await.unwrap_err();
        assert!(
            err.to_string()
                .starts_with("tools/list exceeded max_list_pages = 10"),
            "{err}"
        );
        assert_eq!(fetched.load(Ordering::SeqCst), 10);

        let err = list(LIMITS, None, 20, 10, &AtomicUsize::new(0))
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "tools/list exceeded max_list_items = 50");

        let err = list(LIMITS, None, 1, 4_000, &AtomicUsize::new(0))
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "tools/list exceeded max_list_bytes = 10000"
        );
    }

    #[tokio::test]
    async fn a_page_never_answered_ends_at_the_timeout() {
        let limits = ListLimits {
            timeout: Duration::from_millis(50),
            ..LIMITS
        };
        let err = list_paged("prompts/list", &limits, |_| {
            futures::future::pending::<Result<Page<String>, McpError>>()
        })
        .await
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "prompts/list did not complete within list_timeout = 50 ms"
        );
    }
}
