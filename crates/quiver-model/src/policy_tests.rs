//! Tests of `policy`: the registry, task and session layers, the injected names and every reason a tool is left out.

use std::collections::BTreeSet;

use super::*;
use crate::naming::ToolNameError;
use crate::record::{
    McpServerSpec, PrefixOp, PrefixReplace, StdioConfig, TransformStep, Transport,
};
use crate::resource_uri::UriRefusal;

fn spec(server_id: &str, allowed: &[&str], denied: &[&str]) -> McpServerSpec {
    let mut spec = McpServerSpec::new(server_id, Transport::Stdio);
    spec.stdio = Some(StdioConfig {
        command: "server".into(),
        ..Default::default()
    });
    spec.allowed_tools = allowed.iter().map(|s| s.to_string()).collect();
    spec.denied_tools = denied.iter().map(|s| s.to_string()).collect();
    spec
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn task(allow: &[&str], deny: &[&str]) -> CompiledTaskPolicy {
    TaskPolicy {
        tool_allowlist: strings(allow),
        tool_denylist: strings(deny),
        ..Default::default()
    }
    .compile()
    .unwrap()
}

fn session(server_ids: Option<&[&str]>, allow: &[&str], deny: &[&str]) -> CompiledSessionFilter {
    SessionFilter {
        server_ids: server_ids.map(strings),
        tool_allowlist: strings(allow),
        tool_denylist: strings(deny),
    }
    .compile()
    .unwrap()
}

fn decide_one(
    spec: &McpServerSpec,
    task: &CompiledTaskPolicy,
    session: Option<&CompiledSessionFilter>,
    tool: &str,
) -> Decision {
    let filter = ServerToolFilter::new(spec).unwrap();
    evaluate(spec, &filter, task, session, tool)
}

fn reason(
    spec: &McpServerSpec,
    task: &CompiledTaskPolicy,
    session: Option<&CompiledSessionFilter>,
    tool: &str,
) -> RejectReason {
    match decide_one(spec, task, session, tool) {
        Decision::Rejected(reason) => reason,
        allowed => panic!("{tool} unexpectedly allowed: {allowed:?}"),
    }
}

fn allowed(
    spec: &McpServerSpec,
    task: &CompiledTaskPolicy,
    session: Option<&CompiledSessionFilter>,
    tool: &str,
) -> bool {
    decide_one(spec, task, session, tool).is_allowed()
}

#[test]
fn allowed_tools_get_their_injected_name() {
    let fs = spec("fs", &["read_*"], &[]);
    assert_eq!(
        decide_one(&fs, &CompiledTaskPolicy::unrestricted(), None, "read_file"),
        Decision::Allowed {
            injected_name: "mcp__ZnM__cmVhZF9maWxl".into(),
            exposed_name: "read_file".into(),
        }
    );
}

#[test]
fn registry_layer_is_default_deny_and_deny_wins() {
    let open = CompiledTaskPolicy::unrestricted();
    let nothing = spec("fs", &[], &[]);
    assert_eq!(
        reason(&nothing, &open, None, "read_file"),
        RejectReason::NotInAllowedTools
    );
    let fs = spec("fs", &["*"], &["write_*", "delete_*"]);
    assert!(allowed(&fs, &open, None, "read_file"));
    assert_eq!(
        reason(&fs, &open, None, "delete_file"),
        RejectReason::DeniedByServer {
            pattern: "delete_*".into()
        }
    );
    // Registry patterns see the raw name only, not `<server_id>.<tool>`.
    let qualified = spec("fs", &["fs.*"], &[]);
    assert_eq!(
        reason(&qualified, &open, None, "read_file"),
        RejectReason::NotInAllowedTools
    );
}

fn content(resources: &[&str], prompts: &[&str]) -> ServerContentFilter {
    let mut spec = spec("fs", &["*"], &[]);
    spec.allowed_resources = strings(resources);
    spec.allowed_prompts = strings(prompts);
    ServerContentFilter::new(&spec).unwrap()
}

#[test]
fn resources_and_prompts_are_default_deny_whatever_the_tools_allow() {
    let nothing = content(&[], &[]);
    assert!(!nothing.allows_resource("file:///data/a.md"));
    assert!(!nothing.allows_resource(""));
    assert!(!nothing.allows_prompt("summarize"));
}

#[test]
fn resource_patterns_match_the_whole_uri() {
    let filter = content(&["file:///data/*.md", "ui://*"], &[]);
    for uri in [
        "file:///data/a.md",
        // `*` spans path segments.
        "file:///data/2025/notes.md",
        "ui://widget/chart",
        "ui://",
    ] {
        assert!(filter.allows_resource(uri), "{uri}");
    }
    for uri in [
        "file:///data/a.mdx",
        "file:///other/data/a.md",
        "FILE:///data/a.md",
        "uix://widget",
        "https://example.com/ui://x",
    ] {
        assert!(!filter.allows_resource(uri), "{uri}");
    }
    // Dot segments are refused before the patterns are asked.
    let data = content(&["file:///data/*"], &[]);
    for uri in [
        "file:///data/../secret/key.txt",
        "file:///data/%2e%2e/secret/key.txt",
        "file:///data/..%2fsecret/key.txt",
    ] {
        assert!(!data.allows_resource(uri), "{uri}");
        assert_eq!(data.judge_resource(uri), Err(UriRefusal::DotSegment));
    }
    assert_eq!(data.judge_resource("file:///data/key.txt"), Ok(true));
    assert_eq!(data.judge_resource("file:///etc/key.txt"), Ok(false));
}

#[test]
fn uri_question_marks_need_escaping_to_be_literal() {
    let escaped = content(&[r"https://api.example.com/items\?page=*"], &[]);
    assert!(escaped.allows_resource("https://api.example.com/items?page=2"));
    assert!(!escaped.allows_resource("https://api.example.com/itemsXpage=2"));
    // Unescaped, `?` is any one character: the literal URI still matches.
    let loose = content(&["https://api.example.com/items?page=*"], &[]);
    assert!(loose.allows_resource("https://api.example.com/items?page=2"));
    assert!(loose.allows_resource("https://api.example.com/itemsXpage=2"));
}

#[test]
fn prompt_patterns_match_names() {
    let filter = content(&[], &["summarize*", "greet"]);
    assert!(filter.allows_prompt("summarize_pr"));
    assert!(filter.allows_prompt("greet"));
    assert!(!filter.allows_prompt("greeting"));
    assert!(!filter.allows_prompt("Summarize"));
    assert!(!filter.allows_resource("greet"));
}

#[test]
fn server_level_reasons() {
    let open = CompiledTaskPolicy::unrestricted();
    let mut disabled = spec("fs", &["*"], &[]);
    disabled.enabled = false;
    assert_eq!(
        reason(&disabled, &open, None, "x"),
        RejectReason::ServerDisabled
    );

    let bad_id = spec("has.dot", &["*"], &[]);
    assert_eq!(
        reason(&bad_id, &open, None, "x"),
        RejectReason::InvalidServerId
    );

    let only_web = TaskPolicy {
        allowed_server_ids: Some(strings(&["web"])),
        ..Default::default()
    }
    .compile()
    .unwrap();
    let fs = spec("fs", &["*"], &[]);
    let web = spec("web", &["*"], &[]);
    assert_eq!(
        reason(&fs, &only_web, None, "x"),
        RejectReason::ServerNotAllowedForTask
    );
    assert!(allowed(&web, &only_web, None, "x"));
    assert_eq!(
        server_selected(&fs, &only_web, None),
        Err(RejectReason::ServerNotAllowedForTask)
    );

    let pick_web = session(Some(&["web"]), &[], &[]);
    assert_eq!(
        reason(&fs, &open, Some(&pick_web), "x"),
        RejectReason::ServerNotSelected
    );
    assert!(allowed(&web, &open, Some(&pick_web), "x"));

    let pick_none = session(Some(&[]), &[], &[]);
    assert_eq!(
        server_selected(&web, &open, Some(&pick_none)),
        Err(RejectReason::ServerNotSelected)
    );

    let no_servers = TaskPolicy {
        allowed_server_ids: Some(Vec::new()),
        ..Default::default()
    }
    .compile()
    .unwrap();
    assert_eq!(
        server_selected(&web, &no_servers, None),
        Err(RejectReason::ServerNotAllowedForTask)
    );
}

#[test]
fn task_defaults_apply_only_when_the_request_names_no_server() {
    let task = TaskPolicy {
        allowed_server_ids: Some(strings(&["fs", "web", "db"])),
        default_server_ids: Some(strings(&["fs"])),
        ..Default::default()
    }
    .compile()
    .unwrap();
    let fs = spec("fs", &["*"], &[]);
    let web = spec("web", &["*"], &[]);
    let db = spec("db", &["*"], &[]);
    assert_eq!(server_selected(&fs, &task, None), Ok(()));
    assert_eq!(
        server_selected(&web, &task, None),
        Err(RejectReason::ServerNotSelected)
    );
    let unspecified = session(None, &[], &[]);
    assert_eq!(
        server_selected(&web, &task, Some(&unspecified)),
        Err(RejectReason::ServerNotSelected)
    );
    let picked = session(Some(&["web", "db"]), &[], &[]);
    assert_eq!(server_selected(&web, &task, Some(&picked)), Ok(()));
    assert_eq!(server_selected(&db, &task, Some(&picked)), Ok(()));
    assert_eq!(
        server_selected(&fs, &task, Some(&picked)),
        Err(RejectReason::ServerNotSelected)
    );

    // Without defaults, everything the task allows.
    let all = TaskPolicy {
        allowed_server_ids: Some(strings(&["fs", "web"])),
        ..Default::default()
    }
    .compile()
    .unwrap();
    assert_eq!(server_selected(&web, &all, None), Ok(()));
    assert_eq!(
        server_selected(&db, &all, None),
        Err(RejectReason::ServerNotAllowedForTask)
    );
}

#[test]
fn session_cannot_widen_the_task() {
    let task = TaskPolicy {
        allowed_server_ids: Some(strings(&["fs", "web"])),
        ..Default::default()
    }
    .compile()
    .unwrap();
    check_session_within_task(&task, &session(None, &[], &[])).unwrap();
    check_session_within_task(&task, &session(Some(&["web"]), &[], &[])).unwrap();
    let err = check_session_within_task(&task, &session(Some(&["shell", "fs", "db"]), &[], &[]))
        .unwrap_err();
    assert_eq!(
        err,
        PolicyError::ServersNotAllowed {
            server_ids: strings(&["db", "shell"])
        }
    );
    assert_eq!(err.field(), "server_ids");
    let message = err.to_string();
    assert!(
        message.contains("\"db\"") && message.contains("\"shell\""),
        "{message}"
    );
    assert!(message.contains("cannot widen"), "{message}");

    // Even if the caller ignores the error, the server stays out.
    let shell = spec("shell", &["*"], &[]);
    let widen = session(Some(&["shell"]), &[], &[]);
    assert_eq!(
        reason(&shell, &task, Some(&widen), "run"),
        RejectReason::ServerNotAllowedForTask
    );
    check_session_within_task(
        &CompiledTaskPolicy::unrestricted(),
        &session(Some(&["anything"]), &[], &[]),
    )
    .unwrap();
}

#[test]
fn task_and_session_layers() {
    let fs = spec("fs", &["*"], &["format_disk"]);
    let web = spec("web", &["*"], &[]);

    let task_deny = task(&[], &["*.delete*"]);
    assert_eq!(
        reason(&fs, &task_deny, None, "delete_file"),
        RejectReason::DeniedByTask {
            pattern: "*.delete*".into()
        }
    );
    assert!(allowed(&fs, &task_deny, None, "read_file"));

    let task_allow = task(&["fs.read_*", "*.search*"], &[]);
    assert!(allowed(&fs, &task_allow, None, "read_file"));
    assert!(allowed(&fs, &task_allow, None, "search_files"));
    assert!(allowed(&web, &task_allow, None, "search"));
    assert!(allowed(&web, &task_allow, None, "search_news"));
    // `*.search*` needs `.search`: a tool merely containing "search" is out.
    assert_eq!(
        reason(&web, &task_allow, None, "deep_searcher"),
        RejectReason::NotInTaskAllowlist
    );
    assert_eq!(
        reason(&fs, &task_allow, None, "write_file"),
        RejectReason::NotInTaskAllowlist
    );
    assert_eq!(
        reason(&web, &task_allow, None, "read_page"),
        RejectReason::NotInTaskAllowlist
    );

    let s_deny = session(None, &[], &["web.*"]);
    assert_eq!(
        reason(&web, &task_allow, Some(&s_deny), "search"),
        RejectReason::DeniedBySession {
            pattern: "web.*".into()
        }
    );
    assert!(allowed(&fs, &task_allow, Some(&s_deny), "search_files"));

    let s_allow = session(None, &["fs.read_*"], &[]);
    assert!(allowed(&fs, &task_allow, Some(&s_allow), "read_file"));
    assert_eq!(
        reason(&fs, &task_allow, Some(&s_allow), "search_files"),
        RejectReason::NotInSessionAllowlist
    );
}

#[test]
fn layers_all_must_pass_and_deny_always_removes() {
    // Registry allows everything but format_disk; task denies deletes;
    // the session asks for fs.* and removes writes.
    let fs = spec("fs", &["*"], &["format_disk"]);
    let task_deny = task(&[], &["*.delete_*"]);
    let layered = session(None, &["fs.*"], &["fs.write_*"]);
    let s = Some(&layered);
    assert!(allowed(&fs, &task_deny, s, "read_file"));
    assert_eq!(
        reason(&fs, &task_deny, s, "format_disk"),
        RejectReason::DeniedByServer {
            pattern: "format_disk".into()
        }
    );
    assert_eq!(
        reason(&fs, &task_deny, s, "delete_file"),
        RejectReason::DeniedByTask {
            pattern: "*.delete_*".into()
        }
    );
    assert_eq!(
        reason(&fs, &task_deny, s, "write_file"),
        RejectReason::DeniedBySession {
            pattern: "fs.write_*".into()
        }
    );

    // A session allowlist cannot bring back what an earlier layer removed.
    let narrow = spec("fs", &["read_*"], &[]);
    let wide_session = session(None, &["*"], &[]);
    assert_eq!(
        reason(
            &narrow,
            &CompiledTaskPolicy::unrestricted(),
            Some(&wide_session),
            "write_file"
        ),
        RejectReason::NotInAllowedTools
    );
    let task_allow = task(&["fs.read_*"], &[]);
    assert_eq!(
        reason(&fs, &task_allow, Some(&wide_session), "list_dir"),
        RejectReason::NotInTaskAllowlist
    );
}

#[test]
fn name_reasons() {
    let open = CompiledTaskPolicy::unrestricted();
    let fs = spec("fs", &["*"], &[]);
    assert_eq!(
        reason(&fs, &open, None, "read file"),
        RejectReason::InvalidToolName(ToolNameError::Whitespace { index: 4 })
    );
    assert_eq!(
        reason(&fs, &open, None, ""),
        RejectReason::InvalidToolName(ToolNameError::Empty)
    );
    let long_tool = "t".repeat(60);
    assert_eq!(
        reason(&fs, &open, None, &long_tool),
        RejectReason::InjectedNameTooLong { len: 90 }
    );
    // Policy reasons come first: a denied long name is reported as denied.
    let deny_long = spec("fs", &["*"], &["t*"]);
    assert!(matches!(
        reason(&deny_long, &open, None, &long_tool),
        RejectReason::DeniedByServer { .. }
    ));

    let mut spaced = spec("fs", &["*"], &[]);
    spaced.transform = vec![TransformStep::Suffix(" v2".into())];
    assert_eq!(
        reason(&spaced, &open, None, "read"),
        RejectReason::InvalidTransformedName {
            name: "read v2".into(),
            error: ToolNameError::Whitespace { index: 4 },
        }
    );
}

#[test]
fn invisible_characters_are_refused_beside_the_visible_name() {
    let open = CompiledTaskPolicy::unrestricted();
    let fs = spec("fs", &["*"], &[]);
    let filter = ServerToolFilter::new(&fs).unwrap();
    let decisions = evaluate_tools(
        &fs,
        &filter,
        &open,
        None,
        ["echo", "ec\u{200b}ho", "echo\u{202e}", "\u{2066}echo"],
    );
    assert!(decisions[0].decision.is_allowed());
    for entry in &decisions[1..] {
        let reason = entry.decision.reject_reason().unwrap();
        assert_eq!(
            reason.code(),
            "invisible_characters",
            "{:?}",
            entry.tool_name
        );
        assert!(
            reason.to_string().contains("invisible character U+"),
            "{reason}"
        );
    }
    // A transform cannot smuggle one in either.
    let mut suffixed = spec("fs", &["*"], &[]);
    suffixed.transform = vec![TransformStep::Suffix("\u{200d}".into())];
    assert_eq!(
        reason(&suffixed, &open, None, "echo").code(),
        "invisible_characters"
    );
}

#[test]
fn oversized_descriptions_and_schemas_are_not_injected() {
    use serde_json::{Map, Value, json};

    let open = CompiledTaskPolicy::unrestricted();
    let fs = spec("fs", &["*"], &["denied"]);
    let filter = ServerToolFilter::new(&fs).unwrap();
    let object = |value: Value| -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => unreachable!(),
        }
    };
    let mut nested = json!({"type": "string"});
    for _ in 0..MAX_TOOL_SCHEMA_DEPTH {
        nested = json!({"type": "object", "properties": {"x": nested}});
    }
    let deep = object(nested);
    let large = object(json!({"type": "object", "description": "d".repeat(MAX_TOOL_SCHEMA_BYTES)}));
    let fits =
        object(json!({"type": "object", "description": "d".repeat(MAX_TOOL_SCHEMA_BYTES - 100)}));
    let long_description = "x".repeat(MAX_TOOL_DESCRIPTION_BYTES + 1);
    let longest_description = "x".repeat(MAX_TOOL_DESCRIPTION_BYTES);
    let tools = [
        ListedTool {
            name: "long",
            description: Some(&long_description),
            input_schema: None,
        },
        ListedTool {
            name: "deep",
            description: None,
            input_schema: Some(&deep),
        },
        ListedTool {
            name: "large",
            description: None,
            input_schema: Some(&large),
        },
        ListedTool {
            name: "at_the_limits",
            description: Some(&longest_description),
            input_schema: Some(&fits),
        },
        // A denied tool keeps its policy reason.
        ListedTool {
            name: "denied",
            description: Some(&long_description),
            input_schema: None,
        },
    ];
    let codes: Vec<_> = evaluate_tools(&fs, &filter, &open, None, tools)
        .iter()
        .map(|d| d.decision.reject_reason().map(RejectReason::code))
        .collect();
    assert_eq!(
        codes,
        [
            Some("description_too_long"),
            Some("schema_too_deep"),
            Some("schema_too_large"),
            None,
            Some("denied_by_server"),
        ]
    );
    let message = ListedTool {
        name: "long",
        description: Some(&long_description),
        input_schema: None,
    }
    .check_size()
    .unwrap_err()
    .to_string();
    assert!(message.contains("8192-byte limit"), "{message}");
}

#[test]
fn transforms_change_the_injected_name_not_the_filters() {
    let mut pw = spec("pw", &["stock_*"], &[]);
    pw.transform = vec![TransformStep::Prefix(PrefixOp::Replace(PrefixReplace {
        remove: "stock_".into(),
        add: "my_".into(),
    }))];
    let task = task(&["pw.stock_click"], &[]);
    let decision = decide_one(&pw, &task, None, "stock_click");
    assert_eq!(
        decision,
        Decision::Allowed {
            injected_name: crate::naming::injected_name("pw", "my_click").unwrap(),
            exposed_name: "my_click".into(),
        }
    );
}

#[test]
fn collisions_after_transforms_are_reported() {
    let mut pw = spec("pw", &["*"], &["internal_*"]);
    pw.transform = vec![TransformStep::Prefix(PrefixOp::Replace(PrefixReplace {
        remove: "stock_".into(),
        add: String::new(),
    }))];
    let filter = ServerToolFilter::new(&pw).unwrap();
    let open = CompiledTaskPolicy::unrestricted();
    let decisions = evaluate_tools(
        &pw,
        &filter,
        &open,
        None,
        ["stock_click", "click", "stock_type", "click", "bad name"],
    );
    let names: Vec<&str> = decisions.iter().map(|d| d.tool_name.as_str()).collect();
    assert_eq!(names, ["stock_click", "click", "stock_type", "bad name"]);
    let collision = Decision::Rejected(RejectReason::NameCollision {
        exposed_name: "click".into(),
        tools: strings(&["click", "stock_click"]),
    });
    assert_eq!(decisions[0].decision, collision);
    assert_eq!(decisions[1].decision, collision);
    assert_eq!(
        decisions[2].decision.injected_name(),
        Some("mcp__cHc__dHlwZQ")
    );
    assert!(matches!(
        decisions[3].decision.reject_reason(),
        Some(RejectReason::InvalidToolName(_))
    ));

    // A colliding sibling that the request filters out still blocks the
    // name, so what a name means never depends on the request.
    let only_click = session(None, &["pw.click"], &[]);
    let decisions = evaluate_tools(
        &pw,
        &filter,
        &open,
        Some(&only_click),
        ["stock_click", "click"],
    );
    assert_eq!(
        decisions[0].decision,
        Decision::Rejected(RejectReason::NotInSessionAllowlist)
    );
    assert_eq!(decisions[1].decision, collision);

    // No transforms: no collisions, duplicates folded.
    let plain = spec("fs", &["*"], &[]);
    let filter = ServerToolFilter::new(&plain).unwrap();
    let decisions = evaluate_tools(&plain, &filter, &open, None, ["a", "b", "a"]);
    assert_eq!(decisions.len(), 2);
    assert!(decisions.iter().all(|d| d.decision.is_allowed()));
}

#[test]
fn compile_errors_name_the_field() {
    let err = TaskPolicy {
        tool_allowlist: strings(&["fs.*", "*.search*", "[bad"]),
        ..Default::default()
    }
    .compile()
    .unwrap_err();
    assert_eq!(err.field(), "tool_allowlist[2]");
    assert!(err.to_string().starts_with("tool_allowlist[2]: "), "{err}");

    let err = TaskPolicy {
        tool_denylist: strings(&[""]),
        ..Default::default()
    }
    .compile()
    .unwrap_err();
    assert_eq!(err.field(), "tool_denylist[0]");

    let err = TaskPolicy {
        allowed_server_ids: Some(strings(&["fs", "web"])),
        default_server_ids: Some(strings(&["fs", "db"])),
        ..Default::default()
    }
    .compile()
    .unwrap_err();
    assert_eq!(err.field(), "default_server_ids[1]");

    let err = TaskPolicy {
        allowed_server_ids: Some(strings(&["fs", "a.b"])),
        ..Default::default()
    }
    .compile()
    .unwrap_err();
    assert_eq!(err.field(), "allowed_server_ids[1]");

    let err = SessionFilter {
        server_ids: Some(strings(&["fs", ""])),
        ..Default::default()
    }
    .compile()
    .unwrap_err();
    assert_eq!(err.field(), "server_ids[1]");

    let err = SessionFilter {
        tool_denylist: strings(&["ok", "{a"]),
        ..Default::default()
    }
    .compile()
    .unwrap_err();
    assert_eq!(err.field(), "tool_denylist[1]");
}

#[test]
fn server_filter_rejects_unvalidated_patterns_without_panicking() {
    let bad = spec("fs", &["[oops"], &[]);
    assert!(ServerToolFilter::new(&bad).is_err());
}

#[test]
fn reasons_have_distinct_codes_and_messages() {
    let reasons = [
        RejectReason::ServerDisabled,
        RejectReason::InvalidServerId,
        RejectReason::ServerNotAllowedForTask,
        RejectReason::ServerNotSelected,
        RejectReason::InvalidToolName(ToolNameError::Empty),
        RejectReason::InvalidTransformedName {
            name: "x y".into(),
            error: ToolNameError::Whitespace { index: 1 },
        },
        RejectReason::InjectedNameTooLong { len: 70 },
        RejectReason::NotInAllowedTools,
        RejectReason::DeniedByServer {
            pattern: "p".into(),
        },
        RejectReason::DeniedByTask {
            pattern: "p".into(),
        },
        RejectReason::NotInTaskAllowlist,
        RejectReason::DeniedBySession {
            pattern: "p".into(),
        },
        RejectReason::NotInSessionAllowlist,
        RejectReason::NameCollision {
            exposed_name: "x".into(),
            tools: strings(&["a", "b"]),
        },
    ];
    let codes: BTreeSet<&str> = reasons.iter().map(RejectReason::code).collect();
    let messages: BTreeSet<String> = reasons.iter().map(ToString::to_string).collect();
    assert_eq!(codes.len(), reasons.len());
    assert_eq!(messages.len(), reasons.len());
    for message in &messages {
        assert!(!message.ends_with('.'), "{message}");
        assert!(
            message.chars().next().is_some_and(char::is_lowercase),
            "{message}"
        );
    }
}

#[test]
fn task_budgets_and_model_routing() {
    let task: TaskPolicy = toml::from_str(
        r#"
            model = "big"
            [budgets]
            max_iterations = 4
            [models]
            small = "tiny"
            "#,
    )
    .unwrap();
    let compiled = task.compile().unwrap();
    assert_eq!(compiled.budgets().max_iterations, 4);
    assert_eq!(compiled.upstream_model(Some("small")), Some("big"));
    let mapped = TaskPolicy {
        model: None,
        ..task.clone()
    }
    .compile()
    .unwrap();
    assert_eq!(mapped.upstream_model(Some("small")), Some("tiny"));
    assert_eq!(mapped.upstream_model(Some("other")), None);
    assert_eq!(mapped.upstream_model(None), None);

    let zero: TaskPolicy = toml::from_str("[budgets]\nmax_total_tool_calls = 0").unwrap();
    let err = zero.compile().unwrap_err();
    assert_eq!(err.field(), "max_total_tool_calls");
    assert!(
        err.to_string().starts_with("budgets.max_total_tool_calls"),
        "{err}"
    );
    let empty = TaskPolicy {
        models: [("a".to_owned(), " ".to_owned())].into(),
        ..TaskPolicy::default()
    };
    assert_eq!(empty.compile().unwrap_err().field(), "models.a");
    let typo = toml::from_str::<TaskPolicy>("max_iteration = 3").unwrap_err();
    assert!(typo.to_string().contains("max_iteration"), "{typo}");
}

#[test]
fn policies_deserialize_from_config_and_requests() {
    let task: TaskPolicy = toml::from_str(
        r#"
            allowed_server_ids = ["fs", "web"]
            default_server_ids = ["fs"]
            task_tool_allowlist = ["fs.read_*"]
            task_tool_denylist = ["*.delete*"]
            "#,
    )
    .unwrap();
    assert_eq!(task.tool_allowlist, ["fs.read_*"]);
    assert_eq!(task.tool_denylist, ["*.delete*"]);
    task.compile().unwrap();

    let session: SessionFilter =
        serde_json::from_str(r#"{"server_ids": ["fs"], "tool_denylist": ["fs.write_*"]}"#).unwrap();
    assert_eq!(session.server_ids, Some(strings(&["fs"])));
    assert!(session.tool_allowlist.is_empty());
    let empty: SessionFilter = serde_json::from_str("{}").unwrap();
    assert_eq!(empty, SessionFilter::default());
}
