//! The gRPC contract of the Quiver registry (`quiver.registry.v1`) and its
//! conversions to and from the domain types of `quiver-model`, so generated
//! protobuf types stop at the service edges.

use chrono::{DateTime, TimeZone, Utc};
use quiver_model as model;
use quiver_model::FieldError;

pub mod access;
pub mod approval;
pub mod credentials;
pub mod tls;

/// Generated protobuf and tonic code of `proto/quiver/registry/v1/registry.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("quiver.registry.v1");
}

/// Encoded file descriptor set of the registry protocol, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(
    env!("OUT_DIR"),
    "/quiver_registry_v1_descriptor.bin"
));

/// Port the registry serves this protocol on unless told otherwise: the
/// default of the registry's gRPC listener and of every client's registry URL.
pub const DEFAULT_GRPC_PORT: u16 = 50051;

use v1 as pb;

/// A protobuf message that does not map onto the domain model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConversionError(pub FieldError);

impl ConversionError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        ConversionError(FieldError::new(field, message))
    }

    /// The field the error is about.
    pub fn field(&self) -> &str {
        &self.0.field
    }
}

/// Converts a timestamp into its protobuf form.
pub fn timestamp(at: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: at.timestamp(),
        nanos: i32::try_from(at.timestamp_subsec_nanos()).unwrap_or(0),
    }
}

pub(crate) fn from_timestamp(
    field: &str,
    ts: Option<prost_types::Timestamp>,
) -> Result<DateTime<Utc>, ConversionError> {
    let ts = ts.ok_or_else(|| ConversionError::new(field, "missing timestamp"))?;
    let nanos =
        u32::try_from(ts.nanos).map_err(|_| ConversionError::new(field, "negative nanos"))?;
    Utc.timestamp_opt(ts.seconds, nanos)
        .single()
        .ok_or_else(|| ConversionError::new(field, "timestamp out of range"))
}

impl From<model::Transport> for pb::Transport {
    fn from(t: model::Transport) -> Self {
        match t {
            model::Transport::Stdio => pb::Transport::Stdio,
            model::Transport::StreamableHttp => pb::Transport::StreamableHttp,
            model::Transport::HttpSseLegacy => pb::Transport::HttpSseLegacy,
        }
    }
}

fn transport_from(value: i32) -> Result<model::Transport, ConversionError> {
    match pb::Transport::try_from(value) {
        Ok(pb::Transport::Stdio) => Ok(model::Transport::Stdio),
        Ok(pb::Transport::StreamableHttp) => Ok(model::Transport::StreamableHttp),
        Ok(pb::Transport::HttpSseLegacy) => Ok(model::Transport::HttpSseLegacy),
        Ok(pb::Transport::Unspecified) => {
            Err(ConversionError::new("transport", "missing transport"))
        }
        Err(_) => Err(ConversionError::new(
            "transport",
            format!("unknown transport {value}"),
        )),
    }
}

fn approval_policy_from(value: i32) -> Result<model::ApprovalPolicy, ConversionError> {
    match pb::ApprovalPolicy::try_from(value) {
        Ok(pb::ApprovalPolicy::Unspecified | pb::ApprovalPolicy::Never) => {
            Ok(model::ApprovalPolicy::Never)
        }
        Ok(pb::ApprovalPolicy::Always) => Ok(model::ApprovalPolicy::Always),
        Ok(pb::ApprovalPolicy::Policy) => Ok(model::ApprovalPolicy::Policy),
        Err(_) => Err(ConversionError::new(
            "approval_policy",
            format!("unknown approval policy {value}"),
        )),
    }
}

fn approval_policy_to(policy: model::ApprovalPolicy) -> pb::ApprovalPolicy {
    match policy {
        model::ApprovalPolicy::Never => pb::ApprovalPolicy::Never,
        model::ApprovalPolicy::Always => pb::ApprovalPolicy::Always,
        model::ApprovalPolicy::Policy => pb::ApprovalPolicy::Policy,
    }
}

fn approval_mode_from(pattern: &str, value: i32) -> Result<model::ApprovalMode, ConversionError> {
    match pb::ApprovalMode::try_from(value) {
        Ok(pb::ApprovalMode::Never) => Ok(model::ApprovalMode::Never),
        Ok(pb::ApprovalMode::Always) => Ok(model::ApprovalMode::Always),
        _ => Err(ConversionError::new(
            format!("approval_tools.{pattern}"),
            format!("unknown approval mode {value}"),
        )),
    }
}

fn approval_mode_to(mode: model::ApprovalMode) -> pb::ApprovalMode {
    match mode {
        model::ApprovalMode::Never => pb::ApprovalMode::Never,
        model::ApprovalMode::Always => pb::ApprovalMode::Always,
    }
}

fn isolation_from(value: i32) -> Result<model::Isolation, ConversionError> {
    match pb::Isolation::try_from(value) {
        Ok(pb::Isolation::Unspecified | pb::Isolation::Shared) => Ok(model::Isolation::Shared),
        Ok(pb::Isolation::PerSession) => Ok(model::Isolation::PerSession),
        Err(_) => Err(ConversionError::new(
            "isolation",
            format!("unknown isolation {value}"),
        )),
    }
}

fn isolation_to(isolation: model::Isolation) -> pb::Isolation {
    match isolation {
        model::Isolation::Shared => pb::Isolation::Shared,
        model::Isolation::PerSession => pb::Isolation::PerSession,
    }
}

/// Absent is `auto`, which is left out (as in the record's JSON form).
fn protocol_to(protocol: model::Protocol) -> Option<String> {
    (protocol != model::Protocol::Auto).then(|| protocol.as_str().to_owned())
}

fn protocol_from(value: Option<String>) -> Result<model::Protocol, ConversionError> {
    value.map_or(Ok(model::Protocol::Auto), |text| {
        text.parse()
            .map_err(|err: String| ConversionError::new("protocol", err))
    })
}

fn transform_to(step: &model::TransformStep) -> pb::TransformStep {
    use pb::transform_step::Step;
    let step = match step {
        model::TransformStep::Prefix(model::PrefixOp::Add(add)) => Step::Prefix(add.clone()),
        model::TransformStep::Prefix(model::PrefixOp::Replace(r)) => {
            Step::PrefixReplace(pb::PrefixReplace {
                remove: r.remove.clone(),
                add: r.add.clone(),
            })
        }
        model::TransformStep::Suffix(suffix) => Step::Suffix(suffix.clone()),
    };
    pb::TransformStep { step: Some(step) }
}

fn transform_from(
    i: usize,
    step: pb::TransformStep,
) -> Result<model::TransformStep, ConversionError> {
    use pb::transform_step::Step;
    match step.step {
        Some(Step::Prefix(add)) => Ok(model::TransformStep::Prefix(model::PrefixOp::Add(add))),
        Some(Step::PrefixReplace(r)) => Ok(model::TransformStep::Prefix(model::PrefixOp::Replace(
            model::PrefixReplace {
                remove: r.remove,
                add: r.add,
            },
        ))),
        Some(Step::Suffix(suffix)) => Ok(model::TransformStep::Suffix(suffix)),
        None => Err(ConversionError::new(
            format!("transform[{i}]"),
            "empty transform step",
        )),
    }
}

impl From<&model::McpServerSpec> for pb::McpServerSpec {
    fn from(spec: &model::McpServerSpec) -> Self {
        pb::McpServerSpec {
            server_id: spec.server_id.clone(),
            display_name: spec.display_name.clone(),
            transport: pb::Transport::from(spec.transport).into(),
            stdio: spec.stdio.as_ref().map(|s| pb::StdioConfig {
                command: s.command.clone(),
                args: s.args.clone(),
                env: s.env.clone().into_iter().collect(),
                env_from: s.env_from.clone(),
                cwd: s.cwd.clone(),
                inherit_env: s.inherit_env,
            }),
            http: spec.http.as_ref().map(|h| pb::HttpConfig {
                url: h.url.clone(),
                headers: h.headers.clone().into_iter().collect(),
                auth_ref: h.auth_ref.clone(),
            }),
            tool_namespace: spec.tool_namespace.clone(),
            allowed_tools: spec.allowed_tools.clone(),
            denied_tools: spec.denied_tools.clone(),
            allowed_resources: spec.allowed_resources.clone(),
            allowed_prompts: spec.allowed_prompts.clone(),
            approval_policy: approval_policy_to(spec.approval_policy).into(),
            approval_tools: spec
                .approval_tools
                .iter()
                .map(|(pattern, mode)| (pattern.clone(), approval_mode_to(*mode).into()))
                .collect(),
            budgets: Some(pb::Budgets {
                tool_timeout_ms: Some(spec.budgets.tool_timeout_ms),
                max_concurrency: Some(spec.budgets.max_concurrency),
                max_tool_output_bytes: Some(spec.budgets.max_tool_output_bytes),
                session_idle_ms: spec.budgets.session_idle_ms,
            }),
            isolation: isolation_to(spec.isolation).into(),
            protocol: protocol_to(spec.protocol),
            enabled: Some(spec.enabled),
            transform: spec.transform.iter().map(transform_to).collect(),
            labels: spec.labels.clone().into_iter().collect(),
        }
    }
}

impl TryFrom<pb::McpServerSpec> for model::McpServerSpec {
    type Error = ConversionError;

    /// Structural conversion only; callers validate the result (`quiver_model::validate`).
    fn try_from(spec: pb::McpServerSpec) -> Result<Self, Self::Error> {
        let defaults = model::Budgets::default();
        let budgets = spec.budgets.unwrap_or_default();
        Ok(model::McpServerSpec {
            transport: transport_from(spec.transport)?,
            approval_policy: approval_policy_from(spec.approval_policy)?,
            isolation: isolation_from(spec.isolation)?,
            protocol: protocol_from(spec.protocol)?,
            approval_tools: spec
                .approval_tools
                .into_iter()
                .map(|(pattern, mode)| Ok((pattern.clone(), approval_mode_from(&pattern, mode)?)))
                .collect::<Result<_, ConversionError>>()?,
            transform: spec
                .transform
                .into_iter()
                .enumerate()
                .map(|(i, step)| transform_from(i, step))
                .collect::<Result<_, _>>()?,
            server_id: spec.server_id,
            display_name: spec.display_name,
            stdio: spec.stdio.map(|s| model::StdioConfig {
                command: s.command,
                args: s.args,
                env: s.env.into_iter().collect(),
                env_from: s.env_from,
                cwd: s.cwd,
                inherit_env: s.inherit_env,
            }),
            http: spec.http.map(|h| model::HttpConfig {
                url: h.url,
                headers: h.headers.into_iter().collect(),
                auth_ref: h.auth_ref,
            }),
            tool_namespace: spec.tool_namespace,
            allowed_tools: spec.allowed_tools,
            denied_tools: spec.denied_tools,
            allowed_resources: spec.allowed_resources,
            allowed_prompts: spec.allowed_prompts,
            budgets: model::Budgets {
                tool_timeout_ms: budgets.tool_timeout_ms.unwrap_or(defaults.tool_timeout_ms),
                max_concurrency: budgets.max_concurrency.unwrap_or(defaults.max_concurrency),
                max_tool_output_bytes: budgets
                    .max_tool_output_bytes
                    .unwrap_or(defaults.max_tool_output_bytes),
                session_idle_ms: budgets.session_idle_ms,
            },
            enabled: spec.enabled.unwrap_or(true),
            labels: spec.labels.into_iter().collect(),
        })
    }
}

impl From<&model::StoredServer> for pb::McpServer {
    fn from(server: &model::StoredServer) -> Self {
        pb::McpServer {
            spec: Some((&server.spec).into()),
            revision: server.revision,
            created_at: Some(timestamp(server.created_at)),
            updated_at: Some(timestamp(server.updated_at)),
            updated_by: server.updated_by.clone(),
            source: server.source.to_string(),
        }
    }
}

impl TryFrom<pb::McpServer> for model::StoredServer {
    type Error = ConversionError;

    fn try_from(server: pb::McpServer) -> Result<Self, Self::Error> {
        Ok(model::StoredServer {
            spec: server
                .spec
                .ok_or_else(|| ConversionError::new("spec", "missing record"))?
                .try_into()?,
            revision: server.revision,
            created_at: from_timestamp("created_at", server.created_at)?,
            updated_at: from_timestamp("updated_at", server.updated_at)?,
            updated_by: server.updated_by,
            source: server.source.parse().map_err(|err: model::UnknownSource| {
                ConversionError::new("source", err.to_string())
            })?,
        })
    }
}

fn change_kind_to(kind: model::ChangeKind) -> pb::ChangeKind {
    match kind {
        model::ChangeKind::Upsert => pb::ChangeKind::Upsert,
        model::ChangeKind::Delete => pb::ChangeKind::Delete,
    }
}

impl From<&model::HistoryEntry> for pb::HistoryEntry {
    fn from(entry: &model::HistoryEntry) -> Self {
        pb::HistoryEntry {
            revision: entry.revision,
            kind: change_kind_to(entry.kind).into(),
            spec: entry.spec.as_ref().map(Into::into),
            at: Some(timestamp(entry.at)),
            actor: entry.actor.clone(),
            source: entry.source.to_string(),
        }
    }
}

impl TryFrom<pb::HistoryEntry> for model::HistoryEntry {
    type Error = ConversionError;

    fn try_from(entry: pb::HistoryEntry) -> Result<Self, Self::Error> {
        let kind = match pb::ChangeKind::try_from(entry.kind) {
            Ok(pb::ChangeKind::Upsert) => model::ChangeKind::Upsert,
            Ok(pb::ChangeKind::Delete) => model::ChangeKind::Delete,
            _ => {
                return Err(ConversionError::new(
                    "kind",
                    format!("unknown change kind {}", entry.kind),
                ));
            }
        };
        Ok(model::HistoryEntry {
            revision: entry.revision,
            kind,
            spec: entry.spec.map(TryInto::try_into).transpose()?,
            at: from_timestamp("at", entry.at)?,
            actor: entry.actor,
            source: entry.source.parse().map_err(|err: model::UnknownSource| {
                ConversionError::new("source", err.to_string())
            })?,
        })
    }
}

impl From<&model::Change> for pb::WatchMcpServersResponse {
    /// The event of a change without its record: a server change names the
    /// id, an access delete its kind and name (an access upsert's record is
    /// added by the feed).
    fn from(change: &model::Change) -> Self {
        if let Some(kind) = change.access {
            let deletes = match change.kind {
                model::ChangeKind::Upsert => Vec::new(),
                model::ChangeKind::Delete => vec![(kind, change.server_id.as_str()).into()],
            };
            return pb::WatchMcpServersResponse {
                revision: change.revision,
                access_deletes: deletes,
                ..Default::default()
            };
        }
        let ids = vec![change.server_id.clone()];
        let (upserts, deletes) = match change.kind {
            model::ChangeKind::Upsert => (ids, Vec::new()),
            model::ChangeKind::Delete => (Vec::new(), ids),
        };
        pb::WatchMcpServersResponse {
            revision: change.revision,
            upserts,
            deletes,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_survives_a_round_trip() {
        let text = r#"
server_id = "fs"
display_name = "Files"
transport = "stdio"
tool_namespace = "files"
allowed_tools = ["read_*"]
denied_tools = ["read_secret"]
allowed_resources = ["file:///data/*.md", "ui://*"]
allowed_prompts = ["summarize*"]
approval_policy = "policy"
approval_tools = { "write_*" = "always", "read_*" = "never" }
isolation = "per_session"
protocol = "2026-07-28"
enabled = false
labels = { team = "infra" }
transform = [{ prefix = "fs_" }, { prefix = { remove = "a", add = "b" } }, { suffix = "_v2" }]
[stdio]
command = "npx"
args = ["-y", "x"]
env = { LOG = "${ENV:LOG:-info}" }
env_from = ["HOME"]
cwd = "/tmp"
inherit_env = true
[budgets]
tool_timeout_ms = 1000
max_concurrency = 2
max_tool_output_bytes = 10
"#;
        let spec = model::parse_record(text, model::Format::Toml, model::Strictness::Strict)
            .unwrap()
            .spec;
        let stored = model::StoredServer {
            spec,
            revision: 7,
            created_at: Utc.timestamp_millis_opt(1_700_000_000_123).unwrap(),
            updated_at: Utc.timestamp_millis_opt(1_700_000_001_456).unwrap(),
            updated_by: "alice".into(),
            source: model::Source::File("10-fs.toml".into()),
        };
        let message = pb::McpServer::from(&stored);
        let wire = message.spec.as_ref().unwrap();
        assert_eq!(wire.allowed_resources, ["file:///data/*.md", "ui://*"]);
        assert_eq!(wire.allowed_prompts, ["summarize*"]);
        let back = model::StoredServer::try_from(message).unwrap();
        assert_eq!(back, stored);
    }

    #[test]
    fn missing_fields_are_named() {
        let empty = pb::McpServerSpec::default();
        let err = model::McpServerSpec::try_from(empty).unwrap_err();
        assert_eq!(err.field(), "transport");
        let bad_step = pb::McpServerSpec {
            transport: pb::Transport::Stdio.into(),
            transform: vec![pb::TransformStep { step: None }],
            ..Default::default()
        };
        assert_eq!(
            model::McpServerSpec::try_from(bad_step)
                .unwrap_err()
                .field(),
            "transform[0]"
        );
    }

    #[test]
    fn absent_budgets_and_enabled_take_defaults() {
        let spec = pb::McpServerSpec {
            server_id: "a".into(),
            transport: pb::Transport::StreamableHttp.into(),
            ..Default::default()
        };
        let spec = model::McpServerSpec::try_from(spec).unwrap();
        assert!(spec.enabled);
        assert_eq!(spec.budgets, model::Budgets::default());
        assert_eq!(spec.protocol, model::Protocol::Auto);
        // `auto` travels as an absent field, as it did before there was one.
        assert_eq!(pb::McpServerSpec::from(&spec).protocol, None);
    }

    #[test]
    fn every_protocol_survives_and_an_unknown_one_is_named() {
        for protocol in model::Protocol::ALL {
            let mut spec = model::McpServerSpec::new("a", model::Transport::Stdio);
            spec.protocol = protocol;
            let back = model::McpServerSpec::try_from(pb::McpServerSpec::from(&spec)).unwrap();
            assert_eq!(back.protocol, protocol);
        }
        let unknown = pb::McpServerSpec {
            transport: pb::Transport::Stdio.into(),
            protocol: Some("2024-11-05".into()),
            ..Default::default()
        };
        assert_eq!(
            model::McpServerSpec::try_from(unknown).unwrap_err().field(),
            "protocol"
        );
    }
}
