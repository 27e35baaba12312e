//! Flag groups shared by several subcommands (`#[command(flatten)]`), each
//! with the layering of its values over its config-file section: flags win
//! over the environment, which wins over the file.

use std::num::{NonZeroU64, NonZeroUsize};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use quiver_listen::ListenerOptions;
use quiver_proto::tls::ServerTls;
use quiver_upstream::UpstreamOptions;
use quiver_worker::gateway::GatewayOptions;

use crate::config::{
    self, EgressSection, GatewaySection, ListenerSection, LogSection, TlsFileError, TlsSection,
    UpstreamSection,
};
use crate::telemetry::{DEFAULT_LOG_FILTER, LogFormat, LogSettings, OtlpEndpoint, TelemetryError};

/// TLS of the command's listeners (`quiver registry`: gRPC and HTTP;
/// `quiver worker`: HTTP).
#[derive(Args, Debug, Default)]
pub struct TlsFlags {
    /// PEM certificate chain: serve the listeners over TLS (with --tls-key).
    #[arg(long, env = "QUIVER_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "QUIVER_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
}

impl TlsFlags {
    /// The listeners' TLS from these flags over the `[tls]` section (whose
    /// relative paths are relative to the config file `config`).
    pub fn server_tls(
        self,
        section: TlsSection,
        config: Option<&Path>,
    ) -> Result<Option<ServerTls>, TlsFileError> {
        config::server_tls(self.tls_cert, self.tls_key, section, config)
    }
}

/// Bounds of the command's listeners against slow, idle and too many peers.
#[derive(Args, Debug, Default)]
pub struct ListenerFlags {
    /// Open connections of all the command's listeners together; at the cap
    /// the oldest connection not serving a request is closed to make room.
    #[arg(long, env = "QUIVER_MAX_CONNECTIONS",
        help = format!(
            "Open connections of all the command's listeners together; at the cap the oldest connection not serving a request is closed to make room [default: the descriptor limit minus {}, at most {}]",
            ListenerOptions::default().reserved_descriptors,
            ListenerOptions::default().derived_max_connections_ceiling,
        ))]
    pub max_connections: Option<NonZeroUsize>,
    /// Milliseconds a new connection has to deliver its first complete
    /// request head (TLS handshake and HTTP/2 preface included).
    #[arg(long, env = "QUIVER_HEADER_READ_TIMEOUT_MS",
        help = format!(
            "Milliseconds a new connection has to deliver its first complete request head (TLS handshake and HTTP/2 preface included) [default: {}]",
            ListenerOptions::default().header_read_timeout.as_millis(),
        ))]
    pub header_read_timeout_ms: Option<NonZeroU64>,
    /// Milliseconds a connection may stay open with no request in flight.
    #[arg(long, env = "QUIVER_CONNECTION_IDLE_TIMEOUT_MS",
        help = format!(
            "Milliseconds a connection may stay open with no request in flight [default: {}]",
            ListenerOptions::default().idle_timeout.as_millis(),
        ))]
    pub connection_idle_timeout_ms: Option<NonZeroU64>,
}

impl ListenerFlags {
    /// The listener options of these flags over the `[listener]` section,
    /// defaults elsewhere.
    pub fn options(self, file: ListenerSection) -> ListenerOptions {
        let defaults = ListenerOptions::default();
        let millis = |ms: Option<NonZeroU64>, default| {
            ms.map_or(default, |ms| Duration::from_millis(ms.get()))
        };
        ListenerOptions {
            max_connections: self
                .max_connections
                .or(file.max_connections)
                .map(NonZeroUsize::get),
            header_read_timeout: millis(
                self.header_read_timeout_ms.or(file.header_read_timeout_ms),
                defaults.header_read_timeout,
            ),
            idle_timeout: millis(
                self.connection_idle_timeout_ms.or(file.idle_timeout_ms),
                defaults.idle_timeout,
            ),
            ..defaults
        }
    }
}

/// The MCP endpoints of a worker (gateway mode).
#[derive(Args, Debug, Default)]
pub struct GatewayFlags {
    /// `Host` value the MCP endpoints accept (`host` or `host:port`;
    /// repeatable) [default: loopback names on a loopback listener, any
    /// otherwise].
    #[arg(
        long = "mcp-allowed-host",
        env = "QUIVER_MCP_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    pub allowed_hosts: Vec<String>,
    /// `Origin` the MCP endpoints accept (`scheme://host[:port]`;
    /// repeatable) [default: loopback origins on a loopback listener, the
    /// request's own host otherwise].
    #[arg(
        long = "mcp-allowed-origin",
        env = "QUIVER_MCP_ALLOWED_ORIGINS",
        value_delimiter = ','
    )]
    pub allowed_origins: Vec<String>,
    /// Secret signing MCP session ids, the same on every worker of a fleet
    /// so any worker resumes any session [default: derived from the
    /// registry token, else random per process].
    #[arg(
        long = "mcp-session-key",
        env = "QUIVER_MCP_SESSION_KEY",
        hide_env_values = true
    )]
    pub session_key: Option<String>,
    /// MCP sessions open at once on this worker [default: 10000].
    #[arg(long = "mcp-max-sessions", env = "QUIVER_MCP_MAX_SESSIONS")]
    pub max_sessions: Option<NonZeroUsize>,
    /// MCP sessions one caller may hold open at once on this worker
    /// [default: a quarter of --mcp-max-sessions, at least 1].
    #[arg(
        long = "mcp-max-sessions-per-caller",
        env = "QUIVER_MCP_MAX_SESSIONS_PER_CALLER"
    )]
    pub max_sessions_per_caller: Option<NonZeroUsize>,
    /// How long an MCP session id is served after it was issued, in ms;
    /// then 404 and the client initializes again [default: 86400000 (24 h);
    /// at most 30 days].
    #[arg(
        long = "mcp-max-session-lifetime-ms",
        env = "QUIVER_MCP_MAX_SESSION_LIFETIME_MS"
    )]
    pub max_session_lifetime_ms: Option<NonZeroU64>,
}

impl GatewayFlags {
    /// The gateway options of these flags over the `[gateway]` section;
    /// without a configured secret, sessions are signed with one derived
    /// from `registry_token` (shared by the fleet's workers) if there is one.
    pub fn options(
        self,
        file: GatewaySection,
        registry_token: Option<&str>,
    ) -> anyhow::Result<GatewayOptions> {
        let defaults = GatewayOptions::default();
        let from_env = match &file.session_key_env {
            Some(var) => Some(std::env::var(var).with_context(|| {
                format!("gateway.session_key_env: environment variable {var} is not set")
            })?),
            None => None,
        };
        let session_secret = self
            .session_key
            .or(from_env)
            .map(String::into_bytes)
            .or_else(|| registry_token.map(|token| format!("registry token:{token}").into_bytes()));
        let max_session_lifetime = self
            .max_session_lifetime_ms
            .or(file.max_session_lifetime_ms)
            .map_or(defaults.max_session_lifetime, |ms| {
                Duration::from_millis(ms.get())
            });
        if max_session_lifetime > quiver_worker::gateway::MAX_SESSION_LIFETIME {
            anyhow::bail!(
                "gateway.max_session_lifetime_ms: at most {} ms (30 days)",
                quiver_worker::gateway::MAX_SESSION_LIFETIME.as_millis()
            );
        }
        Ok(GatewayOptions {
            allowed_hosts: if self.allowed_hosts.is_empty() {
                file.allowed_hosts
            } else {
                self.allowed_hosts
            },
            allowed_origins: if self.allowed_origins.is_empty() {
                file.allowed_origins
            } else {
                self.allowed_origins
            },
            session_secret,
            max_sessions: self
                .max_sessions
                .or(file.max_sessions)
                .map_or(defaults.max_sessions, NonZeroUsize::get),
            session_idle: file
                .session_idle_ms
                .map_or(defaults.session_idle, |ms| Duration::from_millis(ms.get())),
            max_sessions_per_caller: self
                .max_sessions_per_caller
                .or(file.max_sessions_per_caller)
                .map(NonZeroUsize::get),
            max_session_lifetime,
            ..defaults
        })
    }
}

/// Logging and trace export.
#[derive(Args, Debug, Default)]
pub struct LogFlags {
    /// Log format [default: text].
    #[arg(long, env = "QUIVER_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// Log filter: `tracing` directives such as `debug` or
    /// `warn,quiver_mcp=debug`.
    #[arg(long, env = "RUST_LOG",
        help = format!("Log filter: `tracing` directives such as `debug` or `warn,quiver_mcp=debug` [default: {DEFAULT_LOG_FILTER}: Quiver's own crates at INFO, every other crate at WARN]"))]
    pub log_level: Option<String>,
    /// OTLP/HTTP collector base URL (e.g. http://127.0.0.1:4318): export
    /// trace spans there as protobuf (off by default).
    #[arg(long, env = "QUIVER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
}

impl LogFlags {
    /// These flags over the `[log]` section; an empty value means unset.
    pub fn settings(self, file: LogSection) -> Result<LogSettings, TelemetryError> {
        let set = |value: Option<String>| value.filter(|value| !value.trim().is_empty());
        Ok(LogSettings {
            format: self.log_format.or(file.format).unwrap_or_default(),
            filter: set(self.log_level).or(set(file.level)),
            otlp_endpoint: set(self.otlp_endpoint)
                .or(set(file.otlp_endpoint))
                .map(|value| OtlpEndpoint::parse(&value))
                .transpose()?,
        })
    }
}

/// The egress allowlist (`quiver worker`, and `quiver registry` whose tool
/// previews obey it). No entry anywhere allows every host; flags replace the
/// config file's list of the same kind.
#[derive(Args, Debug, Default)]
pub struct EgressFlags {
    /// Host name (glob, `*` spans dots) HTTP MCP servers may be reached on
    /// (repeatable; comma-separated in the env) [default: every host, unless
    /// an allowlist is set].
    #[arg(
        long = "egress-allow-host",
        env = "QUIVER_EGRESS_ALLOW_HOST",
        value_delimiter = ','
    )]
    pub allow_hosts: Vec<String>,
    /// CIDR block every resolved address of an HTTP MCP server's host must
    /// lie in, unless the host name is allowed (repeatable; comma-separated
    /// in the env).
    #[arg(
        long = "egress-allow-cidr",
        env = "QUIVER_EGRESS_ALLOW_CIDR",
        value_delimiter = ','
    )]
    pub allow_cidrs: Vec<String>,
}

impl EgressFlags {
    /// The egress allowlist from these flags over the `[egress]` section.
    pub fn policy(self, file: EgressSection) -> anyhow::Result<quiver_mcp::egress::EgressPolicy> {
        let pick =
            |flags: Vec<String>, file: Vec<String>| if flags.is_empty() { file } else { flags };
        let hosts = pick(self.allow_hosts, file.allow_hosts);
        let cidrs = pick(self.allow_cidrs, file.allow_cidrs);
        Ok(quiver_mcp::egress::EgressPolicy::new(&hosts, &cidrs)?)
    }
}

/// Default of `--upstream-api-key-env`.
const DEFAULT_UPSTREAM_API_KEY_ENV: &str = "OPENAI_API_KEY";

/// The OpenAI-compatible upstream of `/v1/chat/completions` (`quiver worker`
/// and `quiver dev`).
#[derive(Args, Debug, Default)]
pub struct UpstreamFlags {
    /// Base URL of the OpenAI-compatible chat API, e.g. <https://api.openai.com/v1>.
    #[arg(long, env = "QUIVER_UPSTREAM_URL")]
    pub upstream_url: Option<String>,
    /// Environment variable holding the upstream API key.
    #[arg(long, env = "QUIVER_UPSTREAM_API_KEY_ENV",
        help = format!("Environment variable holding the upstream API key [default: {DEFAULT_UPSTREAM_API_KEY_ENV}]"))]
    pub upstream_api_key_env: Option<String>,
}

impl UpstreamFlags {
    /// Upstream options from these flags over the `[upstream]` section;
    /// `None` when no URL is configured (chat requests are then refused with
    /// 503).
    pub fn options(self, file: UpstreamSection) -> anyhow::Result<Option<UpstreamOptions>> {
        let Some(url) = self.upstream_url.or(file.url) else {
            return Ok(None);
        };
        let base_url = url::Url::parse(&url).with_context(|| format!("upstream url {url:?}"))?;
        let key_env = self
            .upstream_api_key_env
            .or(file.api_key_env)
            .unwrap_or_else(|| DEFAULT_UPSTREAM_API_KEY_ENV.to_owned());
        let mut options = UpstreamOptions::new(base_url);
        // Local providers need no key: an unset variable sends none.
        options.api_key = std::env::var(&key_env).ok().filter(|key| !key.is_empty());
        if let Some(retries) = file.max_retries {
            options.max_retries = retries;
        }
        if let Some(secs) = file.request_timeout_secs {
            options.request_timeout = Duration::from_secs(secs);
        }
        if let Some(secs) = file.connect_timeout_secs {
            options.connect_timeout = Duration::from_secs(secs);
        }
        if let Some(secs) = file.max_retry_after_secs {
            options.max_retry_after = Duration::from_secs(secs);
        }
        Ok(Some(options))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listener_flags_beat_the_config_which_beats_the_defaults() {
        let file: crate::config::RegistryFile = toml::from_str(
            "[listener]\nheader_read_timeout_ms = 1500\nidle_timeout_ms = 2500\nmax_connections = 300\n",
        )
        .unwrap();
        let from_file = ListenerFlags::default().options(file.listener);
        assert_eq!(from_file.header_read_timeout, Duration::from_millis(1500));
        assert_eq!(from_file.idle_timeout, Duration::from_millis(2500));
        assert_eq!(from_file.max_connections, Some(300));

        let file: crate::config::RegistryFile =
            toml::from_str("[listener]\nheader_read_timeout_ms = 1500\nmax_connections = 300\n")
                .unwrap();
        let flags = ListenerFlags {
            max_connections: NonZeroUsize::new(40),
            header_read_timeout_ms: NonZeroU64::new(700),
            connection_idle_timeout_ms: None,
        };
        let options = flags.options(file.listener);
        let defaults = ListenerOptions::default();
        assert_eq!(options.header_read_timeout, Duration::from_millis(700));
        assert_eq!(options.max_connections, Some(40));
        assert_eq!(options.idle_timeout, defaults.idle_timeout);
        let neither = ListenerFlags::default().options(ListenerSection::default());
        assert_eq!(neither.max_connections, None);
        assert_eq!(neither.header_read_timeout, defaults.header_read_timeout);
    }

    #[test]
    fn log_flags_beat_the_config_and_empty_means_unset() {
        let file = LogSection {
            format: Some(LogFormat::Json),
            level: Some("debug".to_owned()),
            otlp_endpoint: Some("http://file:4318".to_owned()),
        };
        let flags = LogFlags {
            log_format: None,
            log_level: Some("trace".to_owned()),
            otlp_endpoint: Some("http://flag:4318".to_owned()),
        };
        let settings = flags.settings(file).unwrap();
        assert_eq!(settings.format, LogFormat::Json);
        assert_eq!(settings.filter.as_deref(), Some("trace"));
        let url = settings.otlp_endpoint.map(|e| e.traces_url().to_string());
        assert_eq!(url.as_deref(), Some("http://flag:4318/v1/traces"));

        let empty = LogFlags {
            log_level: Some(String::new()),
            otlp_endpoint: Some(String::new()),
            ..LogFlags::default()
        };
        let settings = empty.settings(LogSection::default()).unwrap();
        assert_eq!(settings.format, LogFormat::Text);
        assert!(settings.filter.is_none());
        assert!(settings.otlp_endpoint.is_none());
    }
}
