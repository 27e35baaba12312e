//! The example MCP server of `quiver mcp-example`, which is also the MCP
//! server of the tests: a real server on the official `rmcp` SDK.
//!
//! [`ExampleServer`] exposes a fixed set of tools that exercise what a Quiver
//! worker has to cope with: plain results, tool errors, large and non-ASCII
//! output, images, slow and cancellable calls, concurrency, a process crash
//! and tool names that break naive naming schemes; on request it also offers
//! any number of generated look-alike tools, for catalogs of realistic size.
//! Its counters live behind an `Arc`, so every clone — and therefore every
//! HTTP session served from clones — observes the same per-process state.
//!
//! The same server runs in-process ([`serve_stdio`]; over HTTP with the
//! `http` feature, `crate::http`), as `quiver mcp-example` (the
//! [`Profile::Example`] tools over stdio) or as the `quiver-testkit-mcp`
//! test binary.
//!
//! Beware: the `crash` tool calls [`std::process::exit`], which takes the
//! whole hosting process down; call it only on a server running in a child
//! process.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use base64::Engine as _;
use futures::future::BoxFuture;
use rmcp::{
    ErrorData as McpError, RoleServer, ServerHandler, ServiceExt as _,
    handler::server::{
        router::tool::{ToolRoute, ToolRouter},
        tool::{ToolCallContext, parse_json_object},
        wrapper::Parameters,
    },
    model::{
        CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock,
        DiscoverResult, GetPromptRequestParams, GetPromptResponse, GetPromptResult, Implementation,
        InitializeRequestParams, InitializeResult, JsonObject, ListPromptsResult,
        ListResourcesResult, ListToolsResult, PaginatedRequestParams, Prompt, PromptArgument,
        PromptMessage, ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse,
        ReadResourceResult, Resource, ResourceContents, ResultType, Role, ServerCapabilities,
        ServerConfig, Tool,
    },
    service::RequestContext,
    tool, tool_handler, tool_router,
};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

/// URI of the server's one resource.
pub const README_URI: &str = "example://readme";
/// Its text.
const README: &str = "The bundled example MCP server of Quiver: tools echo, add, counter, image and sleep, this resource and the prompt \"greeting\".";
/// Name of the server's one prompt.
pub const GREETING: &str = "greeting";

/// Name the server reports in `initialize`.
pub const SERVER_NAME: &str = "quiver-testkit";

/// The 60-character tool name (`"long_"` followed by 55 `x`).
pub const LONG_TOOL_NAME: &str = "long_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx";

/// Every tool of [`Profile::Full`], in `tools/list` order (sorted by name).
pub const FULL_TOOL_NAMES: &[&str] = &[
    "add",
    "big_output",
    "counter",
    "crash",
    "dashed-name",
    "dotted.name",
    "echo",
    "fail",
    "image",
    "inflight",
    LONG_TOOL_NAME,
    "sleep",
    "stats",
    "ünïcödé_tool",
];

/// Every tool of [`Profile::Example`], in `tools/list` order.
pub const EXAMPLE_TOOL_NAMES: &[&str] = &["add", "counter", "echo", "image", "sleep"];

/// Prefix of the tools added by [`ExampleServer::with_generated_tools`].
pub const GENERATED_TOOL_PREFIX: &str = "generated_";

/// Name of the `index`-th generated tool: `generated_000`, `generated_001`, …
/// (at least three digits, so up to 1000 tools sort by name in index order).
pub fn generated_tool_name(index: usize) -> String {
    format!("{GENERATED_TOOL_PREFIX}{index:03}")
}

/// Largest output `big_output` agrees to build, so a typo in a test cannot
/// exhaust the machine's memory (128 MiB: room for the 100 MB flood of
/// the fault suite, `tests/e2e/faults.rs`).
pub const BIG_OUTPUT_MAX_BYTES: usize = 128 * 1024 * 1024;

/// A 2x2 RGB PNG (red, green / blue, white).
pub const TEST_PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x02, 0x08, 0x02, 0x00, 0x00, 0x00, 0xfd, 0xd4, 0x9a,
    0x73, 0x00, 0x00, 0x00, 0x12, 0x49, 0x44, 0x41, 0x54, 0x78, 0xda, 0x63, 0xf8, 0xcf, 0xc0, 0xc0,
    0x00, 0xc2, 0x0c, 0xff, 0x81, 0x00, 0x00, 0x1f, 0xee, 0x05, 0xfb, 0xf1, 0xab, 0xba, 0x77, 0x00,
    0x00, 0x00, 0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
];

/// Which tools an [`ExampleServer`] offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Profile {
    /// Every tool, including the fault-injection ones and the awkward names.
    #[default]
    Full,
    /// The friendlier subset used by `quiver dev`: `echo`, `add`, `counter`,
    /// `image` and `sleep`.
    Example,
}

impl Profile {
    /// The tool names this profile offers, sorted by name.
    pub fn tool_names(self) -> &'static [&'static str] {
        match self {
            Profile::Full => FULL_TOOL_NAMES,
            Profile::Example => EXAMPLE_TOOL_NAMES,
        }
    }
}

/// Counters shared by every clone of an [`ExampleServer`]; serialized as the
/// `stats` tool's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Stats {
    /// `tools/call` requests received, `stats` itself excluded.
    pub calls: u64,
    /// `sleep`/`inflight` calls that stopped early because the client
    /// cancelled them (or the connection went away).
    pub cancelled: u64,
    /// Highest number of tool calls that were running at the same time.
    pub inflight_max: u64,
    /// Tool calls running right now, `stats` itself excluded.
    pub inflight_now: u64,
}

#[derive(Debug, Default)]
struct SharedState {
    counter: AtomicU64,
    calls: AtomicU64,
    cancelled: AtomicU64,
    inflight_now: AtomicU64,
    inflight_max: AtomicU64,
}

impl SharedState {
    fn enter(&self) -> InflightGuard<'_> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let now = self.inflight_now.fetch_add(1, Ordering::SeqCst) + 1;
        self.inflight_max.fetch_max(now, Ordering::SeqCst);
        InflightGuard(self)
    }

    fn snapshot(&self) -> Stats {
        Stats {
            calls: self.calls.load(Ordering::SeqCst),
            cancelled: self.cancelled.load(Ordering::SeqCst),
            inflight_max: self.inflight_max.load(Ordering::SeqCst),
            inflight_now: self.inflight_now.load(Ordering::SeqCst),
        }
    }
}

/// Decrements the in-flight count even when the call's future is dropped
/// half-way, e.g. when the session ends under it.
struct InflightGuard<'a>(&'a SharedState);

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        self.0.inflight_now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The example (and test) MCP server. Cheap to clone; clones share all state.
#[derive(Clone)]
pub struct ExampleServer {
    state: Arc<SharedState>,
    router: Arc<ToolRouter<ExampleServer>>,
    profile: Profile,
    generated_tools: usize,
    page_size: Option<usize>,
    slow_start: Option<Duration>,
}

impl std::fmt::Debug for ExampleServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExampleServer")
            .field("profile", &self.profile)
            .field("generated_tools", &self.generated_tools)
            .field("page_size", &self.page_size)
            .field("slow_start", &self.slow_start)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Default for ExampleServer {
    fn default() -> Self {
        Self::new(Profile::Full)
    }
}

/// `echo` and the awkward-name tools.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct EchoParams {
    /// Text returned unchanged.
    pub text: String,
}

/// `add`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct AddParams {
    /// First addend.
    pub a: f64,
    /// Second addend.
    pub b: f64,
}

/// `sleep`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SleepParams {
    /// How long to sleep, in milliseconds.
    pub ms: u64,
}

/// `fail`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct FailParams {
    /// Text of the error result (default: "requested failure").
    #[serde(default)]
    pub message: Option<String>,
}

/// `big_output`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct BigOutputParams {
    /// Exact size of the returned text, in UTF-8 bytes.
    pub bytes: usize,
    /// Text repeated to fill the output (default "é", two bytes); any rest is padded with ASCII `x`.
    #[serde(default, rename = "char")]
    pub fill: Option<String>,
}

/// The generated tools (see [`ExampleServer::with_generated_tools`]).
#[derive(Debug, Deserialize)]
pub struct GeneratedParams {
    /// Text echoed after the tool's name. The schema's `limit` is accepted
    /// and ignored: it exists so the schema has more than one property.
    pub query: String,
}

/// `crash`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct CrashParams {
    /// Process exit status (default 1).
    #[serde(default)]
    pub code: Option<i32>,
}

/// `inflight`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct InflightParams {
    /// How long to hold the call open, in milliseconds (default 100).
    #[serde(default)]
    pub ms: Option<u64>,
}

fn text_result(text: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(text)])
}

fn error_result(text: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

fn generated_input_schema() -> Arc<JsonObject> {
    let mut schema = JsonObject::new();
    schema.insert("type".into(), "object".into());
    schema.insert(
        "properties".into(),
        serde_json::json!({
            "query": {"type": "string", "description": "Text to echo back."},
            "limit": {"type": "integer", "description": "Ignored."},
        }),
    );
    schema.insert("required".into(), serde_json::json!(["query"]));
    Arc::new(schema)
}

/// The one handler behind every generated tool: the tool's own name tells
/// them apart, so none needs a closure of its own.
fn call_generated(
    context: ToolCallContext<'_, ExampleServer>,
) -> BoxFuture<'_, Result<CallToolResponse, McpError>> {
    Box::pin(async move {
        let GeneratedParams { query } = parse_json_object(context.arguments.unwrap_or_default())?;
        Ok(text_result(format!("{}: {query}", context.name)).into())
    })
}

/// Builds exactly `bytes` bytes from repetitions of `unit`, padded with `x`.
fn fill_bytes(bytes: usize, unit: &str) -> String {
    let repetitions = bytes / unit.len();
    let mut out = String::with_capacity(bytes);
    for _ in 0..repetitions {
        out.push_str(unit);
    }
    out.extend(std::iter::repeat_n('x', bytes - out.len()));
    out
}

#[tool_router(router = full_router)]
impl ExampleServer {
    #[tool(description = "Returns `text` unchanged.")]
    async fn echo(&self, Parameters(EchoParams { text }): Parameters<EchoParams>) -> String {
        text
    }

    #[tool(description = "Adds the numbers `a` and `b` and returns the sum as text.")]
    async fn add(&self, Parameters(AddParams { a, b }): Parameters<AddParams>) -> String {
        // f64's Display already prints whole numbers without a fraction ("5").
        (a + b).to_string()
    }

    #[tool(
        description = "Waits `ms` milliseconds, then returns \"slept <ms>ms\". Stops early when the call is cancelled."
    )]
    async fn sleep(
        &self,
        Parameters(SleepParams { ms }): Parameters<SleepParams>,
        ct: CancellationToken,
    ) -> CallToolResult {
        match self.cancellable_sleep(ms, &ct).await {
            true => text_result(format!("slept {ms}ms")),
            false => error_result("cancelled"),
        }
    }

    #[tool(
        name = "stats",
        description = "Returns this server's counters as JSON: calls, cancelled, inflight_max, inflight_now."
    )]
    async fn stats_tool(&self) -> Result<CallToolResult, McpError> {
        let stats = serde_json::to_string(&self.stats())
            .map_err(|err| McpError::internal_error(err.to_string(), None))?;
        Ok(text_result(stats))
    }

    #[tool(description = "Always fails: returns a tool error result carrying `message`.")]
    async fn fail(
        &self,
        Parameters(FailParams { message }): Parameters<FailParams>,
    ) -> CallToolResult {
        error_result(message.unwrap_or_else(|| "requested failure".to_owned()))
    }

    #[tool(
        description = "Returns text of exactly `bytes` UTF-8 bytes made of repetitions of `char` (default \"é\"), padded with ASCII x."
    )]
    async fn big_output(
        &self,
        Parameters(BigOutputParams { bytes, fill }): Parameters<BigOutputParams>,
    ) -> CallToolResult {
        let unit = fill.unwrap_or_else(|| "é".to_owned());
        if unit.is_empty() {
            return error_result("`char` must not be empty");
        }
        if bytes > BIG_OUTPUT_MAX_BYTES {
            return error_result(format!("`bytes` must be at most {BIG_OUTPUT_MAX_BYTES}"));
        }
        text_result(fill_bytes(bytes, &unit))
    }

    #[tool(description = "Returns a small PNG image (2x2 pixels).")]
    async fn image(&self) -> CallToolResult {
        let data = base64::engine::general_purpose::STANDARD.encode(TEST_PNG);
        CallToolResult::success(vec![ContentBlock::image(data, "image/png")])
    }

    #[tool(
        description = "Increments a counter kept by the server process and returns its new value."
    )]
    async fn counter(&self) -> String {
        (self.state.counter.fetch_add(1, Ordering::SeqCst) + 1).to_string()
    }

    #[tool(
        description = "Terminates the server process at once with exit status `code` (default 1), without replying."
    )]
    async fn crash(&self, Parameters(CrashParams { code }): Parameters<CrashParams>) -> String {
        tracing::warn!("crash tool called: exiting");
        std::process::exit(code.unwrap_or(1))
    }

    #[tool(
        description = "Holds the call open for `ms` milliseconds (default 100), then returns the highest number of concurrent tool calls seen so far."
    )]
    async fn inflight(
        &self,
        Parameters(InflightParams { ms }): Parameters<InflightParams>,
        ct: CancellationToken,
    ) -> CallToolResult {
        match self.cancellable_sleep(ms.unwrap_or(100), &ct).await {
            true => text_result(self.stats().inflight_max.to_string()),
            false => error_result("cancelled"),
        }
    }

    #[tool(
        name = "dotted.name",
        description = "Returns `text` unchanged (a name with a dot)."
    )]
    async fn dotted_name(&self, Parameters(EchoParams { text }): Parameters<EchoParams>) -> String {
        text
    }

    #[tool(
        name = "dashed-name",
        description = "Returns `text` unchanged (a name with a dash)."
    )]
    async fn dashed_name(&self, Parameters(EchoParams { text }): Parameters<EchoParams>) -> String {
        text
    }

    #[tool(
        name = "ünïcödé_tool",
        description = "Returns `text` unchanged (a name with non-ASCII letters)."
    )]
    async fn unicode_tool(
        &self,
        Parameters(EchoParams { text }): Parameters<EchoParams>,
    ) -> String {
        text
    }

    #[tool(
        name = "long_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        description = "Returns `text` unchanged (a 60-character name)."
    )]
    async fn long_name(&self, Parameters(EchoParams { text }): Parameters<EchoParams>) -> String {
        text
    }
}

impl ExampleServer {
    /// A server offering `profile`'s tools, without pagination or delays.
    pub fn new(profile: Profile) -> Self {
        ExampleServer {
            state: Arc::default(),
            router: Arc::new(Self::router_for(profile, 0)),
            profile,
            generated_tools: 0,
            page_size: None,
            slow_start: None,
        }
    }

    fn router_for(profile: Profile, generated_tools: usize) -> ToolRouter<ExampleServer> {
        let mut router = Self::full_router();
        let unwanted: Vec<String> = router
            .list_all()
            .into_iter()
            .map(|tool| tool.name.into_owned())
            .filter(|name| !profile.tool_names().contains(&name.as_str()))
            .collect();
        for name in unwanted {
            router.remove_route(&name);
        }
        let schema = generated_input_schema();
        for index in 0..generated_tools {
            let name = generated_tool_name(index);
            let description = format!("Generated tool {index}: returns \"{name}: <query>\".");
            let tool = Tool::new(name, description, schema.clone());
            router.add_route(ToolRoute::new_dyn(tool, call_generated));
        }
        router
    }

    /// The [`Profile::Full`] server.
    pub fn full() -> Self {
        Self::new(Profile::Full)
    }

    /// The [`Profile::Example`] server used by `quiver dev`.
    pub fn example() -> Self {
        Self::new(Profile::Example)
    }

    /// Splits `tools/list` into pages of at most `page_size` tools (a size of
    /// 0 counts as 1); the cursor is the decimal offset of the next page.
    /// `None` returns every tool in one page.
    pub fn with_page_size(mut self, page_size: Option<usize>) -> Self {
        self.page_size = page_size.map(|size| size.max(1));
        self
    }

    /// Offers exactly `n` generated tools besides the profile's own, named by
    /// [`generated_tool_name`] (`generated_000` …), each taking
    /// `{"query": string, "limit"?: integer}` and answering
    /// `"<its name>: <query>"`. They are listed (and paginated) with the
    /// others, sorted by name.
    pub fn with_generated_tools(mut self, n: usize) -> Self {
        self.router = Arc::new(Self::router_for(self.profile, n));
        self.generated_tools = n;
        self
    }

    /// Delays every `initialize` (and `server/discover`) answer by `delay`,
    /// to simulate a server that is slow to start.
    pub fn with_slow_start(mut self, delay: Option<Duration>) -> Self {
        self.slow_start = delay;
        self
    }

    /// The profile chosen at construction.
    pub fn profile(&self) -> Profile {
        self.profile
    }

    /// How many generated tools the server offers.
    pub fn generated_tools(&self) -> usize {
        self.generated_tools
    }

    /// Current counters, as the `stats` tool reports them.
    pub fn stats(&self) -> Stats {
        self.state.snapshot()
    }

    /// Sleeps `ms`; returns `false` (and counts a cancellation) when `ct`
    /// fires first.
    async fn cancellable_sleep(&self, ms: u64, ct: &CancellationToken) -> bool {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(ms)) => true,
            () = ct.cancelled() => {
                self.state.cancelled.fetch_add(1, Ordering::SeqCst);
                false
            }
        }
    }

    async fn delay_start(&self) {
        if let Some(delay) = self.slow_start {
            tokio::time::sleep(delay).await;
        }
    }
}

#[tool_handler(router = self.router)]
impl ServerHandler for ExampleServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .enable_prompts()
                .build(),
        )
        .with_server_info(Implementation::new(SERVER_NAME, env!("CARGO_PKG_VERSION")))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        self.delay_start().await;
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn discover(
        &self,
        _context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, McpError> {
        self.delay_start().await;
        Ok(DiscoverResult::from_server_info(
            self.supported_protocol_versions().into_owned(),
            self.get_info(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        // `stats` observes the other calls, so it must not count as one.
        let _guard = (request.name != "stats").then(|| self.state.enter());
        let call = ToolCallContext::new(self, request, context);
        self.router.call(call).await
    }

    /// One resource, so that `quiver dev` shows the gateway's resources.
    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        Ok(ListResourcesResult::with_all_items(vec![
            Resource::new(README_URI, "readme")
                .with_title("About this server")
                .with_mime_type("text/plain"),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        if request.uri != README_URI {
            return Err(McpError::resource_not_found(
                format!("no resource {:?}", request.uri),
                None,
            ));
        }
        Ok(ReadResourceResult::new(vec![ResourceContents::text(README, README_URI)]).into())
    }

    /// One prompt with an argument, likewise.
    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        Ok(ListPromptsResult::with_all_items(vec![
            Prompt::new(
                GREETING,
                Some("Asks for a greeting of someone"),
                Some(vec![PromptArgument::new("name").with_required(true)]),
            )
            .with_title("Greeting"),
        ]))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        if request.name != GREETING {
            return Err(McpError::invalid_params(
                format!("no prompt {:?}", request.name),
                None,
            ));
        }
        let name = request
            .arguments
            .as_ref()
            .and_then(|arguments| arguments.get("name"))
            .and_then(|name| name.as_str())
            .ok_or_else(|| McpError::invalid_params("argument \"name\" is required", None))?;
        Ok(GetPromptResult::new(vec![PromptMessage::new_text(
            Role::User,
            format!("Please greet {name} warmly."),
        )])
        .into())
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let all = self.router.list_all();
        let offset = match request.and_then(|request| request.cursor) {
            None => 0,
            Some(cursor) => cursor
                .parse::<usize>()
                .ok()
                .filter(|offset| *offset <= all.len())
                .ok_or_else(|| {
                    McpError::invalid_params(format!("invalid cursor {cursor:?}"), None)
                })?,
        };
        let end = match self.page_size {
            Some(size) => offset.saturating_add(size).min(all.len()),
            None => all.len(),
        };
        // Same cache hints as rmcp's generated `list_tools`: only peers on
        // 2026-07-28 or later understand them.
        let supports_cache_hints = context
            .protocol_version()
            .is_some_and(|version| version >= ProtocolVersion::V_2026_07_28);
        Ok(ListToolsResult {
            result_type: Some(ResultType::COMPLETE),
            meta: None,
            next_cursor: (end < all.len()).then(|| end.to_string()),
            ttl_ms: supports_cache_hints.then_some(0),
            cache_scope: supports_cache_hints.then_some(CacheScope::Public),
            tools: all[offset..end].to_vec(),
        })
    }
}

/// Failure of one of the `serve_*` functions.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The MCP handshake with the client failed.
    #[error("MCP initialization failed: {0}")]
    Initialize(#[from] Box<rmcp::service::ServerInitializeError>),
    /// The task running the MCP service panicked or was aborted.
    #[error("MCP service task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    /// Binding or serving the HTTP listener failed (feature `http`).
    #[error("HTTP server I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// Serves `server` over this process's stdin/stdout until the client closes
/// stdin. Stdout carries only protocol messages: log to stderr.
pub async fn serve_stdio(server: ExampleServer) -> Result<(), ServeError> {
    let running = server
        .serve(rmcp::transport::stdio_pipes())
        .await
        .map_err(Box::new)?;
    running.waiting().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_name_is_sixty_characters() {
        assert_eq!(LONG_TOOL_NAME.len(), 60);
        assert!(LONG_TOOL_NAME.starts_with("long_"));
    }

    #[test]
    fn profiles_list_their_tools_in_order() {
        for profile in [Profile::Full, Profile::Example] {
            let names: Vec<String> = ExampleServer::new(profile)
                .router
                .list_all()
                .into_iter()
                .map(|tool| tool.name.into_owned())
                .collect();
            assert_eq!(names, profile.tool_names());
        }
    }

    #[test]
    fn fill_bytes_is_exact() {
        assert_eq!(fill_bytes(5, "é"), "ééx");
        assert_eq!(fill_bytes(4, "é"), "éé");
        assert_eq!(fill_bytes(0, "é"), "");
        assert_eq!(fill_bytes(2, "€"), "xx");
        assert_eq!(fill_bytes(7, "ab"), "abababx");
    }
}
