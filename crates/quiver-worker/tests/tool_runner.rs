//! `ToolRunner::call` in process, the one path every surface runs tools by:
//! a real `McpPool` running the `quiver-testkit-mcp` binary over stdio (build
//! it first: `cargo build -p quiver-testkit`), a registry snapshot of its
//! records, and the callers' compiled policies. Names are looked up the way
//! each surface looks them up; the policy, an approval, the server's
//! `tool_timeout_ms` and its output budget each refuse or bound a call.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quiver_mcp::{McpError, McpPool, PoolOptions};
use quiver_model::policy::TaskPolicy;
use quiver_model::rate_limit::{LimitScope, RateLimit};
use quiver_model::{
    ApprovalMode, ApprovalPolicy, McpServerSpec, StdioConfig, StoredServer, Transport,
};
use quiver_sync::Snapshot;
use quiver_testkit::mcp_server::testkit_mcp_bin;
use quiver_worker::approval::ApprovalFlow;
use quiver_worker::audit::AuditOptions;
use quiver_worker::auth::Task;
use quiver_worker::call::{Call, CallContext, CallDone, CallError, Lookup, ToolRunner};
use serde_json::{Value, json};

/// How long a test waits for anything the runner does.
const BOUND: Duration = Duration::from_secs(20);

/// A stdio record of the test server, changed by `edit`.
fn record(server_id: &str, edit: impl FnOnce(&mut McpServerSpec)) -> Arc<StoredServer> {
    let mut spec = McpServerSpec::new(server_id, Transport::Stdio);
    spec.stdio = Some(StdioConfig {
        command: testkit_mcp_bin().display().to_string(),
        ..Default::default()
    });
    spec.allowed_tools = vec!["*".into()];
    edit(&mut spec);
    Arc::new(StoredServer::created(spec, 1, "test"))
}

/// A task named `name` under `policy`.
fn task(name: &str, policy: TaskPolicy) -> Task {
    Task {
        name: name.into(),
        policy: Arc::new(policy.compile().expect("a valid policy")),
    }
}

/// A runner over its own pool, and the snapshot holding `records`.
struct Runner {
    runner: ToolRunner,
    snapshot: Arc<Snapshot>,
}

impl Runner {
    fn new(records: Vec<Arc<StoredServer>>) -> Runner {
        let pool = McpPool::new(PoolOptions::default());
        Runner {
            runner: ToolRunner::new(pool, AuditOptions::default(), BOUND),
            snapshot: Arc::new(Snapshot {
                revision: 1,
                servers: records
                    .into_iter()
                    .map(|server| (server.spec.server_id.clone(), server))
                    .collect(),
                access: BTreeMap::new(),
            }),
        }
    }

    /// Calls `name` with `arguments` as the tool API does: looked up among
    /// the injected names, approvals refused.
    async fn call(&self, task: &Task, name: &str, arguments: Value) -> Result<CallDone, CallError> {
        self.call_by(task, name, arguments, self.injected(), ApprovalFlow::Refuse)
            .await
    }

    async fn call_by(
        &self,
        task: &Task,
        name: &str,
        arguments: Value,
        lookup: Lookup<'_>,
        approval: ApprovalFlow<'_>,
    ) -> Result<CallDone, CallError> {
        let call = Call {
            name,
            arguments: Some(arguments),
            lookup,
            approval,
        };
        tokio::time::timeout(BOUND, self.runner.call(task, &CallContext::default(), call))
            .await
            .unwrap_or_else(|_| panic!("{name} answered within {BOUND:?}"))
    }

    fn injected(&self) -> Lookup<'_> {
        Lookup::Injected {
            snapshot: &self.snapshot,
            session: None,
        }
    }

    /// The injected name of `server_id`'s `tool`, as `task`'s catalog
    /// lists it.
    async fn injected_name(&self, task: &Task, server_id: &str, tool: &str) -> String {
        let catalog = self
            .runner
            .catalog(&self.snapshot, task, None, None, None)
            .await;
        catalog
            .tools()
            .find(|listed| listed.server_id() == server_id && listed.tool_name() == tool)
            .unwrap_or_else(|| panic!("{server_id}.{tool} listed"))
            .injected_name
            .clone()
    }

    /// Tool calls `server_id`'s process received (`stats` excluded).
    async fn calls_received(&self, task: &Task, server_id: &str) -> u64 {
        let done = self
            .call(task, &format!("mcp.{server_id}.stats"), json!({}))
            .await
            .expect("stats");
        let stats: Value = serde_json::from_str(&text(&done)).expect("stats JSON");
        stats["calls"].as_u64().expect("calls")
    }
}

/// The text of a result's first item.
fn text(done: &CallDone) -> String {
    let value = serde_json::to_value(&done.outcome.result).expect("result JSON");
    value["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The error of a refused call, which must not have run.
#[track_caller]
fn refused(result: Result<CallDone, CallError>) -> CallError {
    match result {
        Err(err) => err,
        Ok(done) => panic!("the call ran: {:?}", done.outcome.result),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_are_looked_up_where_each_surface_looks() {
    let kit = Runner::new(vec![record("kit", |_| {}), record("other", |_| {})]);
    let default = task("default", TaskPolicy::default());
    let echo = kit.injected_name(&default, "kit", "echo").await;
    let hi = json!({"text": "hi"});

    // The tool API and `/mcp`: the injected name, or `mcp.<server>.<tool>`.
    for name in [echo.as_str(), "mcp.kit.echo"] {
        let done = kit.call(&default, name, hi.clone()).await.expect(name);
        assert_eq!(text(&done), "hi");
        assert_eq!(done.tool.server_id(), "kit");
        assert!(!done.is_error() && done.error_object().is_none());
    }
    // `/mcp/{server_id}`: the tool's own name at that server only.
    let own = |server_id| Lookup::OwnName {
        snapshot: &kit.snapshot,
        server_id,
    };
    let done = kit
        .call_by(
            &default,
            "echo",
            hi.clone(),
            own("other"),
            ApprovalFlow::Refuse,
        )
        .await
        .expect("own name");
    assert_eq!(done.tool.server_id(), "other");
    // Chat: an injected name in the catalog the request built.
    let catalog = kit
        .runner
        .catalog(&kit.snapshot, &default, None, None, None)
        .await;
    let done = kit
        .call_by(
            &default,
            &echo,
            hi.clone(),
            Lookup::In(&catalog),
            ApprovalFlow::Refuse,
        )
        .await
        .expect("in the catalog");
    assert_eq!(text(&done), "hi");

    // A name of one lookup is not a name of the others, and unknown names
    // and servers are refused naming what was asked for.
    let misses: [(&str, Lookup<'_>); 5] = [
        ("echo", kit.injected()),
        (echo.as_str(), own("kit")),
        ("mcp.kit.echo", own("kit")),
        ("mcp.ghost.echo", kit.injected()),
        ("mcp.kit.nope", Lookup::In(&catalog)),
    ];
    for (name, lookup) in misses {
        let err = refused(
            kit.call_by(&default, name, hi.clone(), lookup, ApprovalFlow::Refuse)
                .await,
        );
        assert!(matches!(err, CallError::PolicyDenied(_)), "{name}: {err:?}");
        assert_eq!(err.code().as_str(), "mcp_policy_denied");
        assert!(err.to_string().contains(name), "{name}: {err}");
    }
    // Arguments that are not an object, and arguments the schema refuses.
    for arguments in [json!("[1]"), json!({"text": 7})] {
        let err = refused(kit.call(&default, "mcp.kit.echo", arguments).await);
        assert!(matches!(err, CallError::InvalidArguments(_)), "{err:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_refuses_naming_its_rule() {
    let kit = Runner::new(vec![record("kit", |_| {}), record("other", |_| {})]);
    let hi = json!({"text": "hi"});

    // Servers and tools the task does not allow are not its tools.
    let narrow = task(
        "narrow",
        TaskPolicy {
            allowed_server_ids: Some(vec!["other".into()]),
            tool_denylist: vec!["other.add".into()],
            ..Default::default()
        },
    );
    for name in ["mcp.kit.echo", "mcp.other.add"] {
        let err = refused(kit.call(&narrow, name, json!({"a": 1, "b": 2})).await);
        assert!(matches!(err, CallError::PolicyDenied(_)), "{name}: {err:?}");
    }
    kit.call(&narrow, "mcp.other.echo", hi.clone())
        .await
        .expect("allowed");

    // A rate limit: the calls beyond it are refused naming the rule, and
    // tools it does not cover still run.
    let limited = task(
        "limited",
        TaskPolicy {
            rate_limits: vec![RateLimit {
                tools: "kit.echo".into(),
                calls: 2,
                per_s: 3600,
                per: LimitScope::Policy,
            }],
            ..Default::default()
        },
    );
    for _ in 0..2 {
        kit.call(&limited, "mcp.kit.echo", hi.clone())
            .await
            .expect("within the limit");
    }
    let err = refused(kit.call(&limited, "mcp.kit.echo", hi.clone()).await);
    let CallError::RateLimited {
        message,
        retry_after,
    } = &err
    else {
        panic!("not a rate limit: {err:?}");
    };
    assert!(message.contains("rate_limits[0]"), "{message}");
    assert!(retry_after > &Duration::ZERO);
    assert_eq!(err.code().as_str(), "mcp_rate_limited");
    assert!(err.retryable());
    kit.call(&limited, "mcp.kit.add", json!({"a": 1, "b": 2}))
        .await
        .expect("not covered by the limit");

    // `max_concurrent_calls`: a second call while one runs is refused.
    let single = task(
        "single",
        TaskPolicy {
            max_concurrent_calls: Some(1),
            ..Default::default()
        },
    );
    kit.call(&single, "mcp.kit.echo", hi.clone())
        .await
        .expect("warm");
    // Two calls at once: one runs, the other is refused naming the cap.
    let sleep = || {
        let (runner, snapshot, single) = (kit.runner.clone(), kit.snapshot.clone(), single.clone());
        tokio::spawn(async move {
            let call = Call {
                name: "mcp.kit.sleep",
                arguments: Some(json!({"ms": 3000})),
                lookup: Lookup::Injected {
                    snapshot: &snapshot,
                    session: None,
                },
                approval: ApprovalFlow::Refuse,
            };
            runner
                .call(&single, &CallContext::default(), call)
                .await
                .map(|done| text(&done))
        })
    };
    let (first, second) = (sleep(), sleep());
    let mut outcomes = [
        first.await.expect("first sleep"),
        second.await.expect("second sleep"),
    ];
    outcomes.sort_by_key(Result::is_err);
    let [Ok(slept), Err(CallError::RateLimited { message, .. })] = &outcomes else {
        panic!("not one run and one refused: {outcomes:?}");
    };
    assert_eq!(slept, "slept 3000ms");
    assert!(message.contains("max_concurrent_calls (1)"), "{message}");
    kit.call(&single, "mcp.kit.echo", hi)
        .await
        .expect("the slot is free again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_needs_an_approval_is_refused_where_none_can_be_given() {
    let kit = Runner::new(vec![record("kit", |spec| {
        spec.approval_policy = ApprovalPolicy::Policy;
        spec.approval_tools = BTreeMap::from([("echo".to_owned(), ApprovalMode::Always)]);
    })]);
    let default = task("default", TaskPolicy::default());
    // `Refuse` says where approvals are given; asking for one without a
    // registry says there is none to ask. Neither runs the call.
    for approval in [ApprovalFlow::Refuse, ApprovalFlow::RequestOrUse(None)] {
        let err = refused(
            kit.call_by(
                &default,
                "mcp.kit.echo",
                json!({"text": "hi"}),
                kit.injected(),
                approval,
            )
            .await,
        );
        let CallError::ApprovalRequired {
            message,
            approval_id,
        } = &err
        else {
            panic!("not an approval refusal: {err:?}");
        };
        assert!(message.contains("kit.echo"), "{message}");
        assert_eq!(approval_id, &None);
        assert_eq!(err.code().as_str(), "mcp_approval_required");
    }
    assert!(
        refused(
            kit.call_by(
                &default,
                "mcp.kit.echo",
                json!({"text": "hi"}),
                kit.injected(),
                ApprovalFlow::Refuse,
            )
            .await
        )
        .to_string()
        .contains("/v1/mcp/tools/call")
    );
    // The server's other tools need none; its process never saw an echo.
    kit.call(&default, "mcp.kit.add", json!({"a": 1, "b": 2}))
        .await
        .expect("no approval needed");
    assert_eq!(kit.calls_received(&default, "kit").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_timeout_fails_and_the_server_serves_the_next() {
    const TIMEOUT_MS: u64 = 1000;
    let kit = Runner::new(vec![record("kit", |spec| {
        spec.budgets.tool_timeout_ms = TIMEOUT_MS;
    })]);
    let default = task("default", TaskPolicy::default());
    // Started and listed first: the timeout bounds the call, not the start.
    kit.call(&default, "mcp.kit.echo", json!({"text": "warm"}))
        .await
        .expect("warm");
    let started = Instant::now();
    let err = refused(
        kit.call(&default, "mcp.kit.sleep", json!({"ms": 60_000}))
            .await,
    );
    let took = started.elapsed();
    assert!(
        matches!(err, CallError::Mcp(McpError::Timeout(TIMEOUT_MS))),
        "{err:?}"
    );
    assert_eq!(err.code().as_str(), "mcp_timeout");
    assert!(err.retryable());
    assert!(
        took >= Duration::from_millis(TIMEOUT_MS) && took < Duration::from_secs(10),
        "timed out after {took:?}"
    );
    let done = kit
        .call(&default, "mcp.kit.echo", json!({"text": "after"}))
        .await
        .expect("the next call");
    assert_eq!(text(&done), "after");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_beyond_the_budget_is_cut_and_marked() {
    const CAP: u64 = 1000;
    let kit = Runner::new(vec![record("kit", |spec| {
        spec.budgets.max_tool_output_bytes = CAP;
    })]);
    let default = task("default", TaskPolicy::default());
    let long = "x".repeat(20_000);
    let done = kit
        .call(&default, "mcp.kit.echo", json!({"text": long}))
        .await
        .expect("a cut answer is still an answer");
    let output = done.outcome.output;
    assert!(output.truncated(), "{output:?}");
    assert!(output.original >= long.len(), "{output:?}");
    assert!(output.kept <= CAP as usize, "{output:?}");
    assert!(text(&done).len() < long.len());
    assert!(!done.is_error());
    let error = done.error_object().expect("marked");
    assert_eq!(error["code"], "mcp_output_too_large", "{error}");
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains(&output.original.to_string())),
        "{error}"
    );
    // Within the budget: nothing is cut.
    let done = kit
        .call(&default, "mcp.kit.echo", json!({"text": "short"}))
        .await
        .expect("short");
    assert!(!done.outcome.output.truncated());
    assert!(done.error_object().is_none());
}
