//! An MCP server that serves the server scenarios of the MCP conformance
//! suite (`@modelcontextprotocol/conformance` 0.1.16 and 0.2.0-alpha.12):
//! the test tools, resources, templates, prompts, completions and logging
//! its scenarios call, for the 2025-11-25 revision and for 2026-07-28 (no
//! `initialize`, per-request `_meta`, `server/discover`, input by
//! `InputRequiredResult`: `scenario_inputs`). `quiver-testkit-scenarios`
//! serves it over streamable HTTP (the suite run directly against it) and
//! over stdio (behind a worker's `/mcp/{server_id}`);
//! `tests/e2e/conformance_server.rs` runs the suite both ways.

// The suite exercises logging, sampling and resources/subscribe, which
// SEP-2577 deprecates.
#![expect(deprecated)]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    AudioContent, CallToolRequestParams, CallToolResponse, CallToolResult, CompleteRequestParams,
    CompleteResult, CompletionInfo, ContentBlock, CreateMessageRequestParams, ElicitRequestParams,
    ElicitationAction, ElicitationSchema, ErrorData, GetPromptRequestParams, GetPromptResponse,
    GetPromptResult, ImageContent, Implementation, InitializeResult, JsonObject, ListPromptsResult,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, LoggingLevel,
    LoggingMessageNotificationParam, PaginatedRequestParams, ProgressNotificationParam, Prompt,
    PromptArgument, PromptMessage, ProtocolVersion, ReadResourceRequestParams,
    ReadResourceResponse, ReadResourceResult, Reference, Resource, ResourceContents,
    ResourceTemplate, Role, SamplingMessage, ServerCapabilities, ServerConfig,
    SetLevelRequestParams, SubscribeRequestParams, SubscriptionFilter, Tool,
    UnsubscribeRequestParams,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler};
use serde_json::{Value, json};

use crate::scenario_inputs::{Flow, Flows, Outcome, is_stateless};

/// A 1×1 PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8/5+hHgAHggJ/PchI7wAAAABJRU5ErkJggg==";
/// A WAV file of no samples.
const WAV: &str = "UklGRiQAAABXQVZFZm10IBAAAAABAAEARKwAAIhYAQACABAAZGF0YQAAAAA=";

/// The protocol revisions the server offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revisions {
    /// Every revision rmcp knows, 2026-07-28 included.
    AllKnown,
    /// Up to 2025-11-25, the last with `initialize`.
    UpToInitialize,
    /// 2026-07-28 alone: `initialize` is refused.
    OnlyStateless,
}

/// The server; clones share their state (subscriptions, log level, the key
/// of the flows' request states).
#[derive(Clone)]
pub struct ScenarioServer {
    revisions: Revisions,
    flows: Arc<Flows>,
    subscriptions: Arc<Mutex<BTreeSet<String>>>,
    log_level: Arc<Mutex<Option<LoggingLevel>>>,
}

fn object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    }
}

/// Name, description and input schema of every tool.
fn tool_table() -> Vec<(&'static str, &'static str, Value)> {
    let empty = json!({"type": "object", "properties": {}});
    vec![
        ("test_simple_text", "Returns a text", empty.clone()),
        ("test_image_content", "Returns an image", empty.clone()),
        ("test_audio_content", "Returns an audio clip", empty.clone()),
        (
            "test_embedded_resource",
            "Returns an embedded resource",
            empty.clone(),
        ),
        (
            "test_multiple_content_types",
            "Returns text, an image and a resource",
            empty.clone(),
        ),
        (
            "test_tool_with_logging",
            "Logs while it runs",
            empty.clone(),
        ),
        (
            "test_logging_tool",
            "Logs while it runs, at the request's log level",
            empty.clone(),
        ),
        (
            "test_error_handling",
            "Always fails (isError)",
            empty.clone(),
        ),
        (
            "test_tool_with_progress",
            "Reports progress while it runs",
            empty.clone(),
        ),
        (
            "test_sampling",
            "Asks the client's model",
            json!({"type": "object", "properties": {"prompt": {"type": "string"}}, "required": ["prompt"]}),
        ),
        (
            "test_elicitation",
            "Asks the client's user",
            json!({"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}),
        ),
        (
            "test_elicitation_sep1034_defaults",
            "Asks with default values",
            empty.clone(),
        ),
        (
            "test_elicitation_sep1330_enums",
            "Asks with enumerations",
            empty.clone(),
        ),
        (
            "json_schema_2020_12_tool",
            "Takes a JSON Schema 2020-12 input",
            json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "$defs": {"address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}},
                "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
                "additionalProperties": false,
            }),
        ),
        ("test_reconnection", "Answers after a pause", empty.clone()),
    ]
    .into_iter()
    .chain(
        Flow::TOOLS
            .iter()
            .map(move |(flow, description)| (flow.name(), *description, empty.clone())),
    )
    .collect()
}

fn text(text: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(text)])
}

fn text_resource(uri: &str, mime_type: &str, text: &str) -> ResourceContents {
    ResourceContents::text(text, uri).with_mime_type(mime_type)
}

impl ScenarioServer {
    /// A server offering `revisions`.
    pub fn new(revisions: Revisions) -> Self {
        Self {
            revisions,
            flows: Arc::new(Flows::default()),
            subscriptions: Arc::default(),
            log_level: Arc::default(),
        }
    }

    /// The lowest level the client wants logged for this request, `None`
    /// for no logging: the request's `_meta` level; else, for a stateless
    /// request, none (it asks for logs only that way); else the session's
    /// `logging/setLevel`, everything until it is set.
    fn log_threshold(&self, context: &RequestContext<RoleServer>) -> Option<LoggingLevel> {
        context.meta.log_level().or_else(|| {
            (!is_stateless(context)).then(|| {
                self.log_level
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .unwrap_or(LoggingLevel::Debug)
            })
        })
    }

    /// Sends a log message if the client's level lets it through.
    async fn log(&self, context: &RequestContext<RoleServer>, message: &str) {
        let threshold = self.log_threshold(context);
        if threshold.is_none_or(|min| (LoggingLevel::Info as u8) < min as u8) {
            return;
        }
        let _ = context
            .peer
            .notify_logging_message(
                LoggingMessageNotificationParam::new(LoggingLevel::Info, json!(message))
                    .with_logger("scenario-server"),
            )
            .await;
    }

    async fn elicit(
        &self,
        context: &RequestContext<RoleServer>,
        message: &str,
        schema: Value,
    ) -> CallToolResult {
        let Ok(requested_schema) = serde_json::from_value::<ElicitationSchema>(schema) else {
            return CallToolResult::error(vec![ContentBlock::text("invalid elicitation schema")]);
        };
        let asked = context
            .peer
            .create_elicitation(ElicitRequestParams::FormElicitationParams {
                meta: None,
                message: message.to_owned(),
                requested_schema,
            })
            .await;
        match asked {
            Ok(answer) => {
                let action = match answer.action {
                    ElicitationAction::Accept => "accept",
                    ElicitationAction::Decline => "decline",
                    _ => "cancel",
                };
                text(format!(
                    "Elicitation answered: action={action}, content={}",
                    answer.content.map_or_else(String::new, |c| c.to_string())
                ))
            }
            Err(err) => CallToolResult::error(vec![ContentBlock::text(format!(
                "Elicitation failed: {err}"
            ))]),
        }
    }

    async fn call(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let arguments = request.arguments.unwrap_or_default();
        let argument = |name: &str| {
            arguments
                .get(name)
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        Ok(match request.name.as_ref() {
            "test_simple_text" => text("This is a simple text response for testing."),
            "test_image_content" => CallToolResult::success(vec![ContentBlock::image(PNG, "image/png")]),
            "test_audio_content" => CallToolResult::success(vec![ContentBlock::Audio(AudioContent::new(WAV, "audio/wav"))]),
            "test_embedded_resource" => CallToolResult::success(vec![ContentBlock::resource(text_resource(
                "test://embedded-resource",
                "text/plain",
                "This is an embedded resource content.",
            ))]),
            "test_multiple_content_types" => CallToolResult::success(vec![
                ContentBlock::text("Multiple content types test:"),
                ContentBlock::image(PNG, "image/png"),
                ContentBlock::resource(text_resource(
                    "test://mixed-content-resource",
                    "application/json",
                    r#"{"test":"data","value":123}"#,
                )),
            ]),
            "test_tool_with_logging" | "test_logging_tool" => {
                for message in ["Tool execution started", "Tool processing data", "Tool execution completed"] {
                    self.log(&context, message).await;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                text("Logging test completed")
            }
            "test_error_handling" => CallToolResult::error(vec![ContentBlock::text(
                "This tool intentionally returns an error for testing",
            )]),
            "test_tool_with_progress" => {
                let token = context.meta.get_progress_token();
                for (done, message) in [(0.0, "Starting"), (50.0, "Halfway"), (100.0, "Complete")] {
                    if let Some(token) = &token {
                        let _ = context
                            .peer
                            .notify_progress(
                                ProgressNotificationParam::new(token.clone(), done)
                                    .with_total(100.0)
                                    .with_message(message),
                            )
                            .await;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                text("Progress test completed")
            }
            "test_sampling" => {
                let prompt = argument("prompt").unwrap_or_else(|| "Hello".into());
                let asked = context
                    .peer
                    .create_message(CreateMessageRequestParams::new(vec![SamplingMessage::user_text(prompt)], 100))
                    .await;
                match asked {
                    Ok(answer) => text(format!(
                        "LLM response: {}",
                        answer
                            .message
                            .content
                            .first()
                            .and_then(|c| c.as_text())
                            .map_or("(no text)", |t| t.text.as_str())
                    )),
                    Err(err) => CallToolResult::error(vec![ContentBlock::text(format!("Sampling failed: {err}"))]),
                }
            }
            "test_elicitation" => {
                let message = argument("message").unwrap_or_else(|| "Please provide your information".into());
                self.elicit(
                    &context,
                    &message,
                    json!({"type": "object", "properties": {
                        "username": {"type": "string", "description": "Your name"},
                        "email": {"type": "string", "description": "Your email address"}},
                        "required": ["username", "email"]}),
                )
                .await
            }
            "test_elicitation_sep1034_defaults" => {
                self.elicit(
                    &context,
                    "Please confirm these values (all have defaults)",
                    json!({"type": "object", "properties": {
                        "name": {"type": "string", "default": "John Doe"},
                        "age": {"type": "integer", "default": 30},
                        "score": {"type": "number", "default": 95.5},
                        "status": {"type": "string", "enum": ["active", "inactive", "pending"], "default": "active"},
                        "verified": {"type": "boolean", "default": true}}}),
                )
                .await
            }
            "test_elicitation_sep1330_enums" => {
                self.elicit(
                    &context,
                    "Pick from these enumerations",
                    json!({"type": "object", "properties": {
                        "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
                        "titledSingle": {"type": "string", "oneOf": [
                            {"const": "value1", "title": "First Option"},
                            {"const": "value2", "title": "Second Option"},
                            {"const": "value3", "title": "Third Option"}]},
                        "legacyEnum": {"type": "string", "enum": ["opt1", "opt2", "opt3"],
                            "enumNames": ["Option One", "Option Two", "Option Three"]},
                        "untitledMulti": {"type": "array", "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
                        "titledMulti": {"type": "array", "items": {"anyOf": [
                            {"const": "value1", "title": "First Choice"},
                            {"const": "value2", "title": "Second Choice"},
                            {"const": "value3", "title": "Third Choice"}]}}}}),
                )
                .await
            }
            "json_schema_2020_12_tool" => text(format!(
                "Hello, {}!",
                argument("name").unwrap_or_else(|| "world".into())
            )),
            "test_reconnection" => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                text("Reconnection test completed")
            }
            other => {
                return Err(ErrorData::invalid_params(format!("unknown tool {other:?}"), None));
            }
        })
    }
}

impl ServerHandler for ScenarioServer {
    fn get_info(&self) -> ServerConfig {
        InitializeResult::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .enable_resources_subscribe()
                .enable_prompts()
                .enable_completions()
                .enable_logging()
                .build(),
        )
        .with_server_info(Implementation::new(
            "quiver-testkit-scenarios",
            env!("CARGO_PKG_VERSION"),
        ))
        .with_instructions("The conformance suite's server scenarios")
    }

    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        std::borrow::Cow::Borrowed(match self.revisions {
            Revisions::AllKnown => ProtocolVersion::KNOWN_VERSIONS,
            Revisions::UpToInitialize => {
                ProtocolVersion::known_up_to(&ProtocolVersion::LATEST_WITH_INITIALIZE)
            }
            Revisions::OnlyStateless => &[ProtocolVersion::V_2026_07_28],
        })
    }

    /// `subscriptions/listen` (2026-07-28): every requested notification
    /// the capabilities advertise. The default `listen` then holds the
    /// stream until the client closes it: none of the resources changes,
    /// like under `resources/subscribe`.
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(requested.clone())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(
            tool_table()
                .into_iter()
                .map(|(name, description, schema)| {
                    Tool::new(name, description, Arc::new(object(schema)))
                })
                .collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(flow) = Flow::tool(&request.name) else {
            return self.call(request, context).await.map(Into::into);
        };
        let outcome = self
            .flows
            .run(
                flow,
                request.input_responses,
                request.request_state,
                &context,
            )
            .await?;
        Ok(match outcome {
            Outcome::Done(Ok(answer)) => text(answer).into(),
            Outcome::Done(Err(reason)) => {
                CallToolResult::error(vec![ContentBlock::text(reason)]).into()
            }
            Outcome::InputRequired(result) => result.into(),
        })
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        Ok(ListResourcesResult::with_all_items(vec![
            Resource::new("test://static-text", "Static text")
                .with_description("A text resource")
                .with_mime_type("text/plain"),
            Resource::new("test://static-binary", "Static binary")
                .with_description("A binary resource")
                .with_mime_type("image/png"),
            Resource::new("test://watched-resource", "Watched")
                .with_description("A resource to subscribe to")
                .with_mime_type("text/plain"),
        ]))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            ResourceTemplate::new("test://template/{id}/data", "Data by id")
                .with_description("A resource of a template")
                .with_mime_type("application/json"),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let uri = request.uri.as_str();
        let contents = match uri {
            "test://static-text" => text_resource(
                uri,
                "text/plain",
                "This is the content of the static text resource.",
            ),
            "test://watched-resource" => {
                text_resource(uri, "text/plain", "Watched resource content.")
            }
            "test://static-binary" => ResourceContents::blob(PNG, uri).with_mime_type("image/png"),
            _ => match uri
                .strip_prefix("test://template/")
                .and_then(|rest| rest.strip_suffix("/data"))
            {
                Some(id) => text_resource(
                    uri,
                    "application/json",
                    &json!({"id": id, "templateTest": true, "data": format!("Data for ID: {id}")})
                        .to_string(),
                ),
                None => {
                    return Err(ErrorData::resource_not_found(
                        format!("no resource {uri:?}"),
                        Some(json!({"uri": uri})),
                    ));
                }
            },
        };
        Ok(ReadResourceResult::new(vec![contents]).into())
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.subscriptions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(request.uri);
        Ok(())
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.subscriptions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&request.uri);
        Ok(())
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let prompt = |name: &str, description: &str, arguments: Option<Vec<PromptArgument>>| {
            Prompt::new(name, Some(description), arguments)
        };
        Ok(ListPromptsResult::with_all_items(vec![
            prompt("test_simple_prompt", "A prompt without arguments", None),
            prompt(
                "test_prompt_with_arguments",
                "A prompt with arguments",
                Some(vec![
                    PromptArgument::new("arg1")
                        .with_description("First argument")
                        .with_required(true),
                    PromptArgument::new("arg2")
                        .with_description("Second argument")
                        .with_required(false),
                ]),
            ),
            prompt(
                "test_prompt_with_embedded_resource",
                "A prompt with a resource",
                None,
            ),
            prompt("test_prompt_with_image", "A prompt with an image", None),
            prompt(
                Flow::Prompt.name(),
                "A prompt on a context the client's user gives",
                None,
            ),
        ]))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        if request.name == Flow::Prompt.name() {
            let outcome = self
                .flows
                .run(
                    Flow::Prompt,
                    request.input_responses,
                    request.request_state,
                    &context,
                )
                .await?;
            return match outcome {
                Outcome::Done(Ok(message)) => {
                    Ok(
                        GetPromptResult::new(vec![PromptMessage::new_text(Role::User, message)])
                            .into(),
                    )
                }
                Outcome::Done(Err(reason)) => Err(ErrorData::invalid_params(reason, None)),
                Outcome::InputRequired(result) => Ok(result.into()),
            };
        }
        let messages = match request.name.as_str() {
            "test_simple_prompt" => vec![PromptMessage::new_text(
                Role::User,
                "This is a simple test prompt.",
            )],
            "test_prompt_with_arguments" => {
                let arguments = request.arguments.unwrap_or_default();
                let argument = |name: &str| {
                    arguments
                        .get(name)
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned()
                };
                vec![PromptMessage::new_text(
                    Role::User,
                    format!(
                        "Prompt with arguments: arg1='{}', arg2='{}'",
                        argument("arg1"),
                        argument("arg2")
                    ),
                )]
            }
            "test_prompt_with_embedded_resource" => vec![
                PromptMessage::new_text(Role::User, "Here is a resource:"),
                PromptMessage::new_resource(
                    Role::User,
                    "test://static-text".into(),
                    Some("text/plain".into()),
                    Some("Resource content for the prompt".into()),
                    None,
                    None,
                    None,
                ),
            ],
            "test_prompt_with_image" => vec![
                PromptMessage::new_text(Role::User, "Here is an image:"),
                PromptMessage::new(
                    Role::User,
                    ContentBlock::Image(ImageContent::new(PNG, "image/png")),
                ),
            ],
            other => {
                return Err(ErrorData::invalid_params(
                    format!("unknown prompt {other:?}"),
                    None,
                ));
            }
        };
        Ok(GetPromptResult::new(messages).into())
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        let values: Vec<String> = match (&request.r#ref, request.argument.name.as_str()) {
            (Reference::Resource(_), "id") => vec!["1".into(), "2".into(), "3".into()],
            (Reference::Prompt(_), "arg1" | "name") => {
                vec!["Alice".into(), "Bob".into(), "Charlie".into()]
            }
            (Reference::Prompt(prompt), _) => vec![prompt.name.clone()],
            _ => Vec::new(),
        };
        let prefix = request.argument.value.clone();
        let values = values
            .into_iter()
            .filter(|v| v.starts_with(&prefix))
            .collect();
        Ok(CompleteResult::new(
            CompletionInfo::new(values).map_err(|err| ErrorData::internal_error(err, None))?,
        ))
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        *self.log_level.lock().unwrap_or_else(|p| p.into_inner()) = Some(request.level);
        Ok(())
    }
}
