//! Logging, trace export and metrics set-up for the long-running commands.

use anyhow::Context;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer, Registry};
use url::Url;

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Path of the OTLP/HTTP trace endpoint under a collector's base URL.
const TRACES_PATH: &str = "/v1/traces";

/// Errors of the tracing set-up; each names the flag at fault.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// `--otlp-endpoint` (or `[log] otlp_endpoint`) is not an http(s) URL.
    #[error("--otlp-endpoint {value:?} (or [log] otlp_endpoint): {reason}")]
    InvalidOtlpEndpoint {
        /// The rejected value.
        value: String,
        /// Why it was rejected.
        reason: String,
    },
    /// `--log-level` (or `RUST_LOG`, or `[log] level`) is not a filter.
    #[error("--log-level {value:?} (or RUST_LOG, or [log] level): {reason}")]
    InvalidLogFilter {
        /// The rejected directives.
        value: String,
        /// Why they were rejected.
        reason: String,
    },
    /// The OTLP exporter could not be built.
    #[error("--otlp-endpoint: cannot build the OTLP trace exporter: {0}")]
    OtlpExporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// Where spans are exported: an OTLP/HTTP (protobuf) collector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpEndpoint {
    traces: Url,
}

impl OtlpEndpoint {
    /// Parses `--otlp-endpoint`: the collector's base URL (`http://host:4318`,
    /// spans go to `<base>/v1/traces`) or the full `…/v1/traces` URL.
    pub fn parse(value: &str) -> Result<OtlpEndpoint, TelemetryError> {
        let invalid = |reason: String| TelemetryError::InvalidOtlpEndpoint {
            value: value.to_owned(),
            reason,
        };
        let mut url = Url::parse(value).map_err(|err| invalid(err.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(invalid(format!(
                "scheme {:?} is not http or https",
                url.scheme()
            )));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(invalid("no host".to_owned()));
        }
        if !url.path().ends_with(TRACES_PATH) {
            let path = format!("{}{TRACES_PATH}", url.path().trim_end_matches('/'));
            url.set_path(&path);
        }
        Ok(OtlpEndpoint { traces: url })
    }

    /// The URL spans are posted to.
    pub fn traces_url(&self) -> &Url {
        &self.traces
    }
}

/// Logging settings after layering defaults < config file < env < flags.
#[derive(Debug, Clone, Default)]
pub struct LogSettings {
    /// Log line format.
    pub format: LogFormat,
    /// `tracing` filter directives; `None` is [`DEFAULT_LOG_FILTER`].
    pub filter: Option<String>,
    /// OTLP trace export (off when `None`).
    pub otlp_endpoint: Option<OtlpEndpoint>,
}

/// Log filter unless `--log-level` / `RUST_LOG` says otherwise: Quiver's own
/// crates at INFO (a target matches a directive it starts with, so `quiver`
/// covers `quiver_mcp`, `quiver_registry`, … and `quiver::audit`), every
/// other crate at WARN — rmcp, for one, logs every server notification at
/// INFO with its payload, which a chatty MCP server turns into a flood.
pub const DEFAULT_LOG_FILTER: &str = "warn,quiver=info";

impl LogSettings {
    /// The filter of `self.filter`, or the default one.
    pub fn env_filter(&self) -> Result<EnvFilter, TelemetryError> {
        let directives = self.filter.as_deref().unwrap_or(DEFAULT_LOG_FILTER);
        EnvFilter::builder()
            .parse(directives)
            .map_err(|err| TelemetryError::InvalidLogFilter {
                value: directives.to_owned(),
                reason: err.to_string(),
            })
    }
}

/// Keeps the OTLP exporter alive; [`TracingGuard::shutdown`] (or dropping
/// the guard) flushes the spans not yet exported.
#[derive(Debug, Default)]
#[must_use = "dropping the guard stops the trace export"]
pub struct TracingGuard {
    provider: Option<SdkTracerProvider>,
}

impl TracingGuard {
    /// Flushes pending spans and stops the exporter (a no-op without OTLP).
    pub fn shutdown(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        let Some(provider) = self.provider.take() else {
            return;
        };
        // The blocking HTTP client must not be dropped on a runtime thread.
        let joined = std::thread::Builder::new()
            .name("otlp-shutdown".to_owned())
            .spawn(move || provider.shutdown())
            .map(std::thread::JoinHandle::join);
        match joined {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(err))) => eprintln!("warning: flushing OTLP spans: {err}"),
            Ok(Err(_)) => eprintln!("warning: flushing OTLP spans: the flush thread panicked"),
            Err(err) => eprintln!("warning: flushing OTLP spans: {err}"),
        }
    }
}

impl Drop for TracingGuard {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Target of the HTTP request spans of `tower_http`'s `TraceLayer` (DEBUG).
const REQUEST_SPANS: &str = "tower_http::trace::make_span=debug";

/// Installs the tracing subscriber: logs go to stderr (filtered by
/// [`LogSettings::env_filter`]) and, with `settings.otlp_endpoint`, spans are exported over OTLP/HTTP as
/// service `service_name`. With OTLP on, the HTTP request spans of
/// `tower_http` (DEBUG) are enabled too (spans only: its DEBUG events stay off).
///
/// One global filter serves both layers: per-layer filters lost every later
/// event on a thread after sqlx's `enabled!` check of a filtered-out notice.
pub fn init_tracing(
    settings: &LogSettings,
    service_name: &'static str,
) -> Result<TracingGuard, TelemetryError> {
    type BoxedLayer = Box<dyn Layer<Registry> + Send + Sync>;
    let mut filter = settings.env_filter()?;
    let fmt_layer: BoxedLayer = match settings.format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let mut layers = vec![fmt_layer];
    let mut guard = TracingGuard::default();
    if let Some(endpoint) = &settings.otlp_endpoint {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(endpoint.traces_url().as_str())
            .build()?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(Resource::builder().with_service_name(service_name).build())
            .build();
        if let Ok(directive) = REQUEST_SPANS.parse() {
            filter = filter.add_directive(directive);
        }
        layers.push(
            tracing_opentelemetry::layer()
                .with_tracer(provider.tracer(service_name))
                .boxed(),
        );
        guard.provider = Some(provider);
    }
    // A second initialisation (tests, dev mode) keeps the first subscriber;
    // the unused exporter is shut down with the guard.
    let subscriber = tracing_subscriber::registry().with(layers).with(filter);
    if subscriber.try_init().is_err() {
        guard.finish();
    }
    Ok(guard)
}

/// Installs the Prometheus recorder; `/metrics` renders the returned handle.
pub fn init_metrics() -> anyhow::Result<PrometheusHandle> {
    PrometheusBuilder::new()
        .install_recorder()
        .context("installing the metrics recorder")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn otlp_endpoint_gets_the_traces_path() {
        let parse = |value: &str| OtlpEndpoint::parse(value).map(|e| e.traces_url().to_string());
        assert_eq!(
            parse("http://127.0.0.1:4318").ok().as_deref(),
            Some("http://127.0.0.1:4318/v1/traces")
        );
        assert_eq!(
            parse("https://otel.example/base/").ok().as_deref(),
            Some("https://otel.example/base/v1/traces")
        );
        assert_eq!(
            parse("http://c:4318/v1/traces").ok().as_deref(),
            Some("http://c:4318/v1/traces")
        );
    }

    #[test]
    fn bad_otlp_endpoint_names_the_flag() {
        for value in ["127.0.0.1:4318", "grpc://c:4317", "not a url"] {
            let err = OtlpEndpoint::parse(value)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.starts_with("--otlp-endpoint"), "{value}: {err}");
        }
    }

    /// Which of these (target, level) events `settings` lets through, with
    /// the filter installed as `init_tracing` installs it.
    fn passed(settings: &LogSettings, events: &[(&str, tracing::Level)]) -> Vec<String> {
        use std::sync::{Arc, Mutex};
        let seen = Arc::new(Mutex::new(Vec::new()));
        let layer = {
            let seen = Arc::clone(&seen);
            tracing_subscriber::fmt::layer()
                .with_writer(move || CaptureWriter(Arc::clone(&seen)))
                .with_ansi(false)
        };
        let subscriber = tracing_subscriber::registry()
            .with(layer)
            .with(settings.env_filter().unwrap());
        tracing::subscriber::with_default(subscriber, || {
            for (target, level) in events {
                emit(target, *level);
            }
        });
        let text = String::from_utf8(seen.lock().unwrap().clone()).unwrap();
        text.lines()
            .filter_map(|line| line.split_once("event ").map(|(_, rest)| rest.to_owned()))
            .collect()
    }

    /// `tracing` needs literal targets and levels: one arm per case tested.
    fn emit(target: &str, level: tracing::Level) {
        use tracing::Level;
        match (target, level) {
            ("rmcp::service", Level::INFO) => {
                tracing::info!(target: "rmcp::service", "event rmcp info")
            }
            ("rmcp::service", Level::WARN) => {
                tracing::warn!(target: "rmcp::service", "event rmcp warn")
            }
            ("sqlx::query", Level::INFO) => {
                tracing::info!(target: "sqlx::query", "event sqlx info")
            }
            ("quiver", Level::INFO) => tracing::info!(target: "quiver", "event quiver info"),
            ("quiver::audit", Level::INFO) => {
                tracing::info!(target: "quiver::audit", "event audit info")
            }
            ("quiver_registry::state", Level::INFO) => {
                tracing::info!(target: "quiver_registry::state", "event registry info")
            }
            ("quiver_mcp::pool", Level::DEBUG) => {
                tracing::debug!(target: "quiver_mcp::pool", "event mcp debug")
            }
            other => panic!("no arm for {other:?}"),
        }
    }

    struct CaptureWriter(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for CaptureWriter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    const EVENTS: &[(&str, tracing::Level)] = &[
        ("rmcp::service", tracing::Level::INFO),
        ("rmcp::service", tracing::Level::WARN),
        ("sqlx::query", tracing::Level::INFO),
        ("quiver", tracing::Level::INFO),
        ("quiver::audit", tracing::Level::INFO),
        ("quiver_registry::state", tracing::Level::INFO),
        ("quiver_mcp::pool", tracing::Level::DEBUG),
    ];

    #[test]
    fn default_filter_keeps_our_info_and_other_crates_warnings() {
        assert_eq!(DEFAULT_LOG_FILTER, "warn,quiver=info");
        let passed = passed(&LogSettings::default(), EVENTS);
        assert_eq!(
            passed,
            ["rmcp warn", "quiver info", "audit info", "registry info"]
        );
    }

    #[test]
    fn log_level_replaces_the_default_filter() {
        let settings = LogSettings {
            filter: Some("info,quiver_mcp=debug".to_owned()),
            ..LogSettings::default()
        };
        let passed = passed(&settings, EVENTS);
        assert_eq!(
            passed,
            [
                "rmcp info",
                "rmcp warn",
                "sqlx info",
                "quiver info",
                "audit info",
                "registry info",
                "mcp debug"
            ]
        );
    }

    #[test]
    fn bad_log_level_names_the_flag() {
        let settings = LogSettings {
            filter: Some("quiver=loud".to_owned()),
            ..LogSettings::default()
        };
        let err = settings.env_filter().err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.starts_with("--log-level \"quiver=loud\"")),
            "{err:?}"
        );
    }
}
