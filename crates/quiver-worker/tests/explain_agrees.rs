//! Property (issue #22): the registry's explain and a worker's enforcement
//! never disagree. For random policies (allowed servers, tool allow- and
//! denylists), random server records (their own tool filters, enabled or
//! not) and random tool names, explain's decision for an API key equals
//! what the worker does with the same key: it authenticates the key through
//! its registry callers ([`RegistryCallers`]) and resolves the tool's
//! injected name in the catalog the key's policy gets ([`Catalog`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use quiver_model::access::{AccessKind, AccessSpec, ApiKeyRecord, PolicyRecord, StoredAccess};
use quiver_model::naming::injected_name;
use quiver_model::policy::TaskPolicy;
use quiver_model::token::TokenDigest;
use quiver_model::{McpServerSpec, Source, StoredServer, Transport};
use quiver_registry::explain::{ExplainRequest, explain};
use quiver_registry::head::HeadView;
use quiver_sync::{AccessMap, KeyUses};
use quiver_worker::catalog::Catalog;
use quiver_worker::registry_callers::RegistryCallers;
use rmcp::model::Tool;

const SERVERS: [&str; 3] = ["alpha", "beta", "gamma"];
const TOOLS: [&str; 5] = ["read", "write", "delete_all", "read_more", "list"];
const PATTERNS: [&str; 8] = [
    "alpha.*",
    "*.read",
    "*.delete_*",
    "beta.read*",
    "gamma.list",
    "*",
    "alpha.write",
    "*.read_more",
];
const SECRET: &str = "qk_property-test-secret";

fn patterns() -> impl Strategy<Value = Vec<String>> {
    proptest::collection::vec(proptest::sample::select(PATTERNS.to_vec()), 0..3)
        .prop_map(|p| p.into_iter().map(str::to_owned).collect())
}

fn tool_patterns() -> impl Strategy<Value = Vec<String>> {
    proptest::collection::vec(
        proptest::sample::select(vec!["*", "read*", "delete_*", "list", "write"]),
        0..3,
    )
    .prop_map(|p| p.into_iter().map(str::to_owned).collect())
}

fn policy() -> impl Strategy<Value = TaskPolicy> {
    (
        proptest::option::of(proptest::sample::subsequence(SERVERS.to_vec(), 0..=3)),
        patterns(),
        patterns(),
    )
        .prop_map(|(allowed, allowlist, denylist)| TaskPolicy {
            allowed_server_ids: allowed.map(|ids| ids.into_iter().map(str::to_owned).collect()),
            tool_allowlist: allowlist,
            tool_denylist: denylist,
            ..Default::default()
        })
}

fn server() -> impl Strategy<Value = (bool, Vec<String>, Vec<String>)> {
    (
        proptest::bool::weighted(0.85),
        tool_patterns(),
        tool_patterns(),
    )
}

fn stored_server(
    id: &str,
    (enabled, allowed, denied): &(bool, Vec<String>, Vec<String>),
) -> StoredServer {
    let mut spec = McpServerSpec::new(id, Transport::Stdio);
    spec.stdio = Some(Default::default());
    spec.enabled = *enabled;
    spec.allowed_tools = allowed.clone();
    spec.denied_tools = denied.clone();
    StoredServer::created(spec, 1, "test")
}

fn access(spec: AccessSpec) -> ((AccessKind, String), Arc<StoredAccess>) {
    (
        (spec.kind(), spec.name().to_owned()),
        Arc::new(StoredAccess {
            spec,
            revision: 2,
            created_at: Default::default(),
            updated_at: Default::default(),
            updated_by: "test".into(),
            source: Source::Admin,
        }),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn explain_and_enforcement_never_disagree(
        policy in policy(),
        servers in proptest::collection::vec(server(), 3),
        server_at in 0..3usize,
        tool in proptest::sample::select(TOOLS.to_vec()),
    ) {
        let access_map: AccessMap = [
            access(AccessSpec::Policy(PolicyRecord { name: "p".into(), policy })),
            access(AccessSpec::ApiKey(ApiKeyRecord {
                id: "k1".into(),
                name: "k".into(),
                policy: "p".into(),
                roles: vec![],
                expires_at: None,
                key_sha256: TokenDigest::of(SECRET).hex(),
            })),
        ]
        .into_iter()
        .collect();
        let servers: BTreeMap<String, Arc<StoredServer>> = SERVERS
            .iter()
            .zip(&servers)
            .map(|(id, filters)| ((*id).to_owned(), Arc::new(stored_server(id, filters))))
            .collect();
        let server_id = SERVERS[server_at];

        // The registry's answer.
        let head = HeadView::new(2, servers.clone(), access_map.clone());
        let explained = explain(&head, &ExplainRequest {
            key_id: Some("k1".into()),
            server_id: server_id.into(),
            tool: tool.into(),
            ..Default::default()
        }).expect("a well-formed request");

        // The worker's: its callers and its catalog, for a request naming the server.
        let callers = RegistryCallers::new(KeyUses::default());
        callers.update(&access_map);
        let caller = callers
            .key(&TokenDigest::of(SECRET))
            .expect("the key is known")
            .expect("the key is live");
        let tools: Vec<Tool> = TOOLS
            .iter()
            .map(|name| Tool::new(*name, "a tool", Arc::new(serde_json::Map::new())))
            .collect();
        let listings = vec![(servers[server_id].clone(), Arc::new(tools))];
        let catalog = Catalog::evaluated(&listings, &caller.task.policy, None);
        let enforced = catalog
            .resolve(&injected_name(server_id, tool).expect("a valid name"))
            .is_some();

        prop_assert_eq!(
            explained.allowed(),
            enforced,
            "explain said {:?} for {}.{}",
            explained,
            server_id,
            tool
        );
    }
}
