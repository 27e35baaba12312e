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
    /// OTLP trace export (off when `None`).
    pub otlp_endpoint: Option<OtlpEndpoint>,
}

impl LogSettings {
    /// Layers `--log-format`/`--otlp-endpoint` over the `[log]` section.
    pub fn layered(
        format: Option<LogFormat>,
        otlp_endpoint: Option<String>,
        file: crate::config::LogSection,
    ) -> Result<LogSettings, TelemetryError> {
        Ok(LogSettings {
            format: format.or(file.format).unwrap_or_default(),
            otlp_endpoint: otlp_endpoint
                .or(file.otlp_endpoint)
                .filter(|value| !value.is_empty())
                .map(|value| OtlpEndpoint::parse(&value))
                .transpose()?,
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

/// Installs the tracing subscriber: logs go to stderr (`RUST_LOG` filters)
/// and, with `settings.otlp_endpoint`, spans are exported over OTLP/HTTP as
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
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
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

    #[test]
    fn flag_beats_config_and_empty_means_off() {
        let file = crate::config::LogSection {
            format: None,
            otlp_endpoint: Some("http://file:4318".to_owned()),
        };
        let settings = LogSettings::layered(None, Some("http://flag:4318".to_owned()), file);
        let url = settings
            .ok()
            .and_then(|s| s.otlp_endpoint)
            .map(|e| e.traces_url().to_string());
        assert_eq!(url.as_deref(), Some("http://flag:4318/v1/traces"));
        let off = LogSettings::layered(None, None, crate::config::LogSection::default());
        assert!(off.is_ok_and(|s| s.otlp_endpoint.is_none()));
    }
}
