//! Which servers an MCP endpoint serves: `/mcp` (the caller's catalog,
//! optionally narrowed by `?server_ids=a,b`) or `/mcp/{server_id}` (one
//! server as itself).

use std::collections::BTreeSet;

/// The servers one gateway endpoint serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// `/mcp`: every server the caller's task selects, narrowed to
    /// `server_ids` when given; tools under their injected names.
    Catalog {
        /// `?server_ids=a,b`.
        server_ids: Option<BTreeSet<String>>,
    },
    /// `/mcp/{server_id}`: one server, its tools under their own names.
    Server(String),
}

impl Scope {
    /// The scope of `/mcp` with the query string `query`.
    pub fn catalog(query: Option<&str>) -> Scope {
        let server_ids = query.and_then(|query| {
            url::form_urlencoded::parse(query.as_bytes())
                .filter(|(key, _)| key == "server_ids")
                .map(|(_, ids)| {
                    ids.split(',')
                        .filter(|id| !id.is_empty())
                        .map(str::to_owned)
                        .collect::<BTreeSet<_>>()
                })
                .reduce(|mut all, more| {
                    all.extend(more);
                    all
                })
        });
        Scope::Catalog { server_ids }
    }

    /// The endpoint as a session is bound to it (the same for every
    /// spelling of the same scope).
    pub fn endpoint(&self) -> String {
        match self {
            Scope::Catalog { server_ids: None } => "/mcp".to_owned(),
            Scope::Catalog {
                server_ids: Some(ids),
            } => format!(
                "/mcp?server_ids={}",
                ids.iter().cloned().collect::<Vec<_>>().join(",")
            ),
            Scope::Server(id) => format!("/mcp/{id}"),
        }
    }

    /// Whether the endpoint may serve `server_id` (the caller's policy
    /// decides the rest).
    pub fn covers(&self, server_id: &str) -> bool {
        match self {
            Scope::Catalog { server_ids: None } => true,
            Scope::Catalog {
                server_ids: Some(ids),
            } => ids.contains(server_id),
            Scope::Server(id) => id == server_id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_of_one_scope_bind_the_same_endpoint() {
        assert_eq!(Scope::catalog(None).endpoint(), "/mcp");
        assert_eq!(
            Scope::catalog(Some("server_ids=b,a")).endpoint(),
            Scope::catalog(Some("server_ids=a&server_ids=b,")).endpoint()
        );
        let narrowed = Scope::catalog(Some("server_ids=a,b"));
        assert!(narrowed.covers("a") && !narrowed.covers("c"));
        assert!(Scope::Server("x".into()).covers("x"));
        assert!(!Scope::Server("x".into()).covers("y"));
    }
}
