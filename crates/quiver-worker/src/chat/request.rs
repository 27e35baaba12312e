//! Reading a chat-completions request: the `mcp` extension (R-CHAT-1) is
//! taken out and checked against the caller's task, the model is routed per
//! task, and everything else is kept as the caller sent it.

use std::collections::HashSet;

use quiver_model::ErrorCode;
use quiver_model::budget::{BudgetLimits, SessionBudgets};
use quiver_model::policy::{CompiledSessionFilter, SessionFilter, check_session_within_task};
use quiver_model::tool_search::ToolSearchSetting;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::auth::Task;
use crate::error::ErrorObject;

/// A request refused before anything was sent upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestError {
    /// `invalid_request` for malformed input, `mcp_policy_denied` for
    /// asking more than the task allows.
    pub code: ErrorCode,
    /// The offending field, e.g. `mcp.server_ids[1]`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl RequestError {
    fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        let field = field.into();
        RequestError {
            code: ErrorCode::InvalidRequest,
            message: format!("{field}: {}", message.into()),
            field,
        }
    }

    fn denied(field: impl Into<String>, message: impl std::fmt::Display) -> Self {
        let field = field.into();
        RequestError {
            code: ErrorCode::McpPolicyDenied,
            message: format!("mcp.{message}"),
            field,
        }
    }
}

impl From<&RequestError> for ErrorObject {
    fn from(err: &RequestError) -> Self {
        ErrorObject::new(err.code, err.message.clone()).with_field(err.field.clone())
    }
}

/// The `mcp` extension object as a caller writes it.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct McpExtension {
    enabled: bool,
    server_ids: Option<Vec<String>>,
    tool_allowlist: Vec<String>,
    tool_denylist: Vec<String>,
    max_iterations: Option<u32>,
    max_total_tool_calls: Option<u32>,
    max_tool_output_bytes: Option<u64>,
    /// Approvals (ids) the caller got for calls of an earlier attempt.
    approvals: Vec<String>,
    /// Offer tool search instead of every tool; the task's default if unset.
    tool_search: Option<ToolSearchSetting>,
    /// Show tool images to the model; the task's default if unset.
    vision: Option<bool>,
}

/// MCP settings of a request that enabled it.
#[derive(Debug, Clone)]
pub struct McpRequest {
    /// The caller's own narrowing (layer 3).
    pub session: CompiledSessionFilter,
    /// Task budgets, lowered where the request asked.
    pub budgets: SessionBudgets,
    /// `mcp.approvals`: approvals for the calls of this conversation.
    pub approvals: Vec<String>,
    /// With tool search: how many tools are offered up front.
    pub tool_search: Option<u32>,
    /// `mcp.vision` (else the task's `vision`): images of tool results go
    /// to the model as `image_url` parts.
    pub vision: bool,
}

/// A parsed chat request.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// The body to send upstream: the caller's, without `mcp`, model routed.
    pub body: Map<String, Value>,
    /// Whether `body` differs from what the caller sent.
    pub rewritten: bool,
    /// `Some` when the request enabled MCP.
    pub mcp: Option<McpRequest>,
    /// `"stream": true`.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// Names of the caller's own function tools.
    pub caller_tools: HashSet<String>,
}

impl ChatRequest {
    /// Parses and checks `raw` for a caller of `task`.
    pub fn parse(raw: &[u8], task: &Task) -> Result<Self, RequestError> {
        let mut body = match serde_json::from_slice::<Value>(raw) {
            Ok(Value::Object(body)) => body,
            Ok(_) => return Err(RequestError::invalid("body", "must be a JSON object")),
            Err(err) => {
                return Err(RequestError::invalid(
                    "body",
                    format!("invalid JSON: {err}"),
                ));
            }
        };
        let mut rewritten = false;
        let mcp = match body.remove("mcp") {
            None => None,
            Some(extension) => {
                rewritten = true;
                mcp_request(extension, task)?
            }
        };
        let requested_model = match body.get("model") {
            None => None,
            Some(Value::String(model)) => Some(model.as_str()),
            Some(_) => return Err(RequestError::invalid("model", "must be a string")),
        };
        if let Some(model) = task.policy.upstream_model(requested_model)
            && Some(model) != requested_model
        {
            body.insert("model".into(), Value::String(model.to_owned()));
            rewritten = true;
        }
        let stream = optional_bool(&body, "stream")?;
        let include_usage = match body.get("stream_options") {
            None | Some(Value::Null) => false,
            Some(Value::Object(options)) => match options.get("include_usage") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(include)) => *include,
                Some(_) => {
                    return Err(RequestError::invalid(
                        "stream_options.include_usage",
                        "must be a boolean",
                    ));
                }
            },
            Some(_) => return Err(RequestError::invalid("stream_options", "must be an object")),
        };
        let caller_tools = caller_tool_names(&body)?;
        if mcp.is_some() {
            if !matches!(body.get("messages"), Some(Value::Array(_))) {
                return Err(RequestError::invalid("messages", "must be an array"));
            }
            match body.get("n") {
                None | Some(Value::Null) => {}
                Some(n) if n.as_u64() == Some(1) => {}
                Some(_) => {
                    return Err(RequestError::invalid(
                        "n",
                        "must be 1 when mcp is enabled (the tool loop follows one choice)",
                    ));
                }
            }
        }
        Ok(ChatRequest {
            body,
            rewritten,
            mcp,
            stream,
            include_usage,
            caller_tools,
        })
    }

    /// The function a `tool_choice` object forces, if any.
    pub fn forced_function(&self) -> Result<Option<&str>, RequestError> {
        match self.body.get("tool_choice") {
            Some(Value::Object(choice)) => {
                match choice.get("function").and_then(|f| f.get("name")) {
                    Some(Value::String(name)) => Ok(Some(name)),
                    _ => Err(RequestError::invalid(
                        "tool_choice.function.name",
                        "a forced tool_choice must name a function",
                    )),
                }
            }
            _ => Ok(None),
        }
    }

    /// Refuses a forced function that is neither the caller's nor injected.
    pub fn check_forced_function(
        &self,
        is_injected: impl Fn(&str) -> bool,
    ) -> Result<(), RequestError> {
        match self.forced_function()? {
            Some(name) if !self.caller_tools.contains(name) && !is_injected(name) => {
                Err(RequestError::invalid(
                    "tool_choice.function.name",
                    format!(
                        "{name:?} is neither one of the request's tools nor an MCP tool available to this request"
                    ),
                ))
            }
            _ => Ok(()),
        }
    }
}

fn optional_bool(body: &Map<String, Value>, field: &str) -> Result<bool, RequestError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(value)) => Ok(*value),
        Some(_) => Err(RequestError::invalid(field, "must be a boolean")),
    }
}

fn caller_tool_names(body: &Map<String, Value>) -> Result<HashSet<String>, RequestError> {
    let tools = match body.get("tools") {
        None | Some(Value::Null) => return Ok(HashSet::new()),
        Some(Value::Array(tools)) => tools,
        Some(_) => return Err(RequestError::invalid("tools", "must be an array")),
    };
    let mut names = HashSet::new();
    for (i, tool) in tools.iter().enumerate() {
        let Value::Object(tool) = tool else {
            return Err(RequestError::invalid(
                format!("tools[{i}]"),
                "must be an object",
            ));
        };
        // Other tool types (e.g. "custom") are passed through untouched.
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            continue;
        }
        match tool.get("function").and_then(|f| f.get("name")) {
            Some(Value::String(name)) => {
                names.insert(name.clone());
            }
            _ => {
                return Err(RequestError::invalid(
                    format!("tools[{i}].function.name"),
                    "must be a string",
                ));
            }
        }
    }
    Ok(names)
}

fn mcp_request(extension: Value, task: &Task) -> Result<Option<McpRequest>, RequestError> {
    if !extension.is_object() {
        return Err(RequestError::invalid("mcp", "must be an object"));
    }
    let extension: McpExtension = serde_path_to_error::deserialize(extension).map_err(|err| {
        let path = err.path().to_string();
        let field = if path == "." {
            "mcp".to_owned()
        } else {
            format!("mcp.{path}")
        };
        RequestError::invalid(field, err.into_inner().to_string())
    })?;
    if !extension.enabled {
        return Ok(None);
    }
    let session = SessionFilter {
        server_ids: extension.server_ids,
        tool_allowlist: extension.tool_allowlist,
        tool_denylist: extension.tool_denylist,
    }
    .compile()
    .map_err(|err| RequestError::invalid(format!("mcp.{}", err.field()), err.to_string()))?;
    check_session_within_task(&task.policy, &session)
        .map_err(|err| RequestError::denied(format!("mcp.{}", err.field()), err))?;
    let budgets = task
        .policy
        .budgets()
        .narrowed(&BudgetLimits {
            max_iterations: extension.max_iterations,
            max_total_tool_calls: extension.max_total_tool_calls,
            max_tool_output_bytes: extension.max_tool_output_bytes,
        })
        .map_err(|err| match err {
            quiver_model::budget::BudgetError::AboveTask { .. } => {
                RequestError::denied(format!("mcp.{}", err.field()), &err)
            }
            quiver_model::budget::BudgetError::Zero { .. } => {
                RequestError::invalid(format!("mcp.{}", err.field()), err.to_string())
            }
        })?;
    if let Some(i) = extension
        .approvals
        .iter()
        .position(|id| id.is_empty() || id.len() > 64)
    {
        return Err(RequestError::invalid(
            format!("mcp.approvals[{i}]"),
            "an approval id (1 to 64 characters)",
        ));
    }
    let tool_search = match extension.tool_search {
        None => task.policy.tool_search(),
        Some(setting) => setting
            .max_tools()
            .map_err(|err| RequestError::invalid("mcp.tool_search.max_tools", err.to_string()))?,
    };
    Ok(Some(McpRequest {
        session,
        budgets,
        approvals: extension.approvals,
        tool_search,
        vision: extension.vision.unwrap_or_else(|| task.policy.vision()),
    }))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use quiver_model::policy::{CompiledTaskPolicy, TaskPolicy};
    use serde_json::json;

    use super::*;

    fn task(policy: TaskPolicy) -> Task {
        Task {
            name: "t".into(),
            policy: Arc::new(policy.compile().unwrap()),
        }
    }

    fn default_task() -> Task {
        Task {
            name: "default".into(),
            policy: Arc::new(CompiledTaskPolicy::unrestricted()),
        }
    }

    fn parse(body: Value, task: &Task) -> Result<ChatRequest, RequestError> {
        ChatRequest::parse(body.to_string().as_bytes(), task)
    }

    #[test]
    fn without_mcp_the_body_is_untouched() {
        let body = json!({"model": "m", "messages": [], "temperature": 0.2, "x_vendor": {"a": 1}});
        let request = parse(body.clone(), &default_task()).unwrap();
        assert!(!request.rewritten);
        assert!(request.mcp.is_none());
        assert_eq!(Value::Object(request.body), body);
    }

    #[test]
    fn mcp_is_stripped_and_off_unless_enabled() {
        let request = parse(
            json!({"model": "m", "messages": [], "mcp": {"enabled": false}}),
            &default_task(),
        )
        .unwrap();
        assert!(request.rewritten && request.mcp.is_none());
        assert!(!request.body.contains_key("mcp"));

        let request = parse(
            json!({"messages": [], "mcp": {"enabled": true, "server_ids": ["a"]}}),
            &default_task(),
        )
        .unwrap();
        assert!(request.mcp.is_some());
    }

    #[test]
    fn errors_name_the_field() {
        let t = default_task();
        let cases = [
            (json!([1]), "body"),
            (json!({"mcp": 3}), "mcp"),
            (
                json!({"mcp": {"enabled": true, "server_id": ["a"]}}),
                "mcp.server_id",
            ),
            (json!({"mcp": {"enabled": "yes"}}), "mcp.enabled"),
            (
                json!({"mcp": {"enabled": true, "server_ids": ["ok", "bad id"]}, "messages": []}),
                "mcp.server_ids[1]",
            ),
            (
                json!({"mcp": {"enabled": true, "tool_allowlist": ["[", "x"]}, "messages": []}),
                "mcp.tool_allowlist[0]",
            ),
            (
                json!({"mcp": {"enabled": true, "max_iterations": 0}, "messages": []}),
                "mcp.max_iterations",
            ),
            (json!({"mcp": {"enabled": true}}), "messages"),
            (
                json!({"mcp": {"enabled": true}, "messages": [], "n": 2}),
                "n",
            ),
            (json!({"stream": "yes"}), "stream"),
            (
                json!({"stream_options": {"include_usage": 1}}),
                "stream_options.include_usage",
            ),
            (json!({"tools": {}}), "tools"),
            (
                json!({"tools": [{"type": "function", "function": {}}]}),
                "tools[0].function.name",
            ),
            (json!({"model": 4}), "model"),
        ];
        for (body, field) in cases {
            let err = parse(body.clone(), &t).unwrap_err();
            assert_eq!(err.field, field, "{body}: {err:?}");
            assert_eq!(err.code, ErrorCode::InvalidRequest, "{body}");
            assert!(err.message.starts_with(field), "{body}: {}", err.message);
        }
    }

    #[test]
    fn a_request_cannot_widen_its_task() {
        let t = task(TaskPolicy {
            allowed_server_ids: Some(vec!["fs".into()]),
            budgets: BudgetLimits {
                max_iterations: Some(3),
                ..Default::default()
            },
            ..Default::default()
        });
        let err = parse(
            json!({"messages": [], "mcp": {"enabled": true, "server_ids": ["fs", "web"]}}),
            &t,
        )
        .unwrap_err();
        assert_eq!(
            (err.code, err.field.as_str()),
            (ErrorCode::McpPolicyDenied, "mcp.server_ids")
        );
        assert!(err.message.contains("\"web\""), "{}", err.message);

        let err = parse(
            json!({"messages": [], "mcp": {"enabled": true, "max_iterations": 4}}),
            &t,
        )
        .unwrap_err();
        assert_eq!(
            (err.code, err.field.as_str()),
            (ErrorCode::McpPolicyDenied, "mcp.max_iterations")
        );

        let ok = parse(
            json!({"messages": [], "mcp": {"enabled": true, "max_iterations": 2}}),
            &t,
        )
        .unwrap();
        assert_eq!(ok.mcp.unwrap().budgets.max_iterations, 2);
    }

    #[test]
    fn models_are_routed_per_task() {
        let t = task(TaskPolicy {
            models: [("gpt-4".to_owned(), "local-large".to_owned())].into(),
            ..Default::default()
        });
        let mapped = parse(json!({"model": "gpt-4", "messages": []}), &t).unwrap();
        assert!(mapped.rewritten);
        assert_eq!(mapped.body["model"], "local-large");
        let unmapped = parse(json!({"model": "other", "messages": []}), &t).unwrap();
        assert!(!unmapped.rewritten);
        assert_eq!(unmapped.body["model"], "other");

        let forced = task(TaskPolicy {
            model: Some("only-this".into()),
            ..Default::default()
        });
        let request = parse(json!({"messages": []}), &forced).unwrap();
        assert_eq!(request.body["model"], "only-this");
    }

    #[test]
    fn forced_tool_choice_must_name_a_known_function() {
        let body = json!({
            "messages": [],
            "tools": [{"type": "function", "function": {"name": "mine"}}],
            "tool_choice": {"type": "function", "function": {"name": "mine"}},
        });
        let request = parse(body, &default_task()).unwrap();
        assert!(request.check_forced_function(|_| false).is_ok());

        let body = json!({"messages": [], "tool_choice": {"type": "function", "function": {"name": "mcp__x__y"}}});
        let request = parse(body, &default_task()).unwrap();
        assert!(
            request
                .check_forced_function(|name| name == "mcp__x__y")
                .is_ok()
        );
        let err = request.check_forced_function(|_| false).unwrap_err();
        assert_eq!(err.field, "tool_choice.function.name");

        for choice in [json!("auto"), json!("none"), json!("required")] {
            let request = parse(
                json!({"messages": [], "tool_choice": choice}),
                &default_task(),
            )
            .unwrap();
            assert!(request.check_forced_function(|_| false).is_ok());
        }
    }
}

/// Fuzz-style property tests (proptest; `cargo fuzz` needs a nightly
/// toolchain): arbitrary bytes and JSON never panic the parser, and every
/// refusal names a field of the request. Longer runs: `PROPTEST_CASES=100000
/// cargo test -p quiver-worker chat::request::proptests`.
#[cfg(test)]
mod proptests {
    use std::sync::Arc;

    use proptest::prelude::*;
    use quiver_model::ErrorCode;
    use quiver_model::budget::BudgetLimits;
    use quiver_model::policy::{CompiledTaskPolicy, TaskPolicy};
    use quiver_testkit::fuzz::{self, cases};

    use super::*;

    /// Field names of a chat request and of its `mcp` extension.
    const KEYS: &[&str] = &[
        "model",
        "messages",
        "stream",
        "stream_options",
        "include_usage",
        "tools",
        "type",
        "function",
        "name",
        "tool_choice",
        "n",
        "mcp",
        "enabled",
        "server_ids",
        "allowed_tools",
        "denied_tools",
        "budgets",
        "max_iterations",
        "max_total_tool_calls",
        "max_tool_output_bytes",
    ];

    /// String values the parser gives meaning to.
    const WORDS: &[&str] = &["function", "*", "fs"];

    fn json_value() -> BoxedStrategy<Value> {
        fuzz::json_value(KEYS, fuzz::words(WORDS), 4)
    }

    /// A request object: known top-level keys with arbitrary values.
    fn request_object() -> impl Strategy<Value = Value> {
        proptest::collection::btree_map(
            proptest::sample::select(KEYS).prop_map(str::to_owned),
            json_value(),
            0..6,
        )
        .prop_map(|map| Value::Object(map.into_iter().collect()))
    }

    fn tasks() -> [Task; 2] {
        let restricted = TaskPolicy {
            allowed_server_ids: Some(vec!["fs".into()]),
            budgets: BudgetLimits {
                max_iterations: Some(3),
                ..Default::default()
            },
            ..Default::default()
        };
        [
            Task {
                name: "default".into(),
                policy: Arc::new(CompiledTaskPolicy::unrestricted()),
            },
            Task {
                name: "restricted".into(),
                policy: Arc::new(restricted.compile().expect("task policy")),
            },
        ]
    }

    /// Parses `raw` for every task: a refusal is `invalid_request` or
    /// `mcp_policy_denied`, naming `body`, a field whose root key is in the
    /// request, or `messages`, which an MCP-enabled request must have.
    fn check(raw: &[u8]) -> Result<(), TestCaseError> {
        let keys: Vec<String> = match serde_json::from_slice::<Value>(raw) {
            Ok(Value::Object(map)) => map.keys().cloned().collect(),
            _ => Vec::new(),
        };
        for task in &tasks() {
            let Err(err) = ChatRequest::parse(raw, task) else {
                continue;
            };
            prop_assert!(
                matches!(
                    err.code,
                    ErrorCode::InvalidRequest | ErrorCode::McpPolicyDenied
                ),
                "{err:?}"
            );
            prop_assert!(!err.message.is_empty(), "{err:?}");
            let root = err
                .field
                .split(['.', '['])
                .next()
                .unwrap_or_default()
                .to_owned();
            prop_assert!(
                root == "body" || root == "messages" || keys.contains(&root),
                "error names {:?}, not a field of the request {:?}: {:?}",
                err.field,
                keys,
                err
            );
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(cases(1000))]

        #[test]
        fn arbitrary_bytes_are_refused_naming_a_field(
            raw in proptest::collection::vec(any::<u8>(), 0..256),
        ) {
            check(&raw)?;
        }

        #[test]
        fn arbitrary_json_is_refused_naming_a_field(value in json_value()) {
            check(value.to_string().as_bytes())?;
        }

        #[test]
        fn arbitrary_requests_are_refused_naming_a_field(value in request_object()) {
            check(value.to_string().as_bytes())?;
        }
    }
}
