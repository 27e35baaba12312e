//! Turning a stored record into what is needed to connect: `${ENV:…}`
//! references resolved in the worker's environment (R-BOOT-6) and the minimal
//! environment of stdio children (R-MCP-6).

use std::collections::BTreeMap;
use std::sync::Arc;

use quiver_model::env_ref::{Template, reference_to};
use quiver_model::{McpServerSpec, Transport};

use crate::error::McpError;

/// Variables a stdio child inherits from the worker unless its record opts in
/// to the whole environment (`inherit_env = true`): the basics and every
/// locale category (POSIX's and glibc's), by name — not any `LC_*`, since
/// `ssh` forwards `LC_*` and other names under it can carry anything.
/// Everything else — the worker's own tokens and keys in particular — stays
/// out.
pub const BASE_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TZ",
    "TMPDIR",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_ADDRESS",
    "LC_COLLATE",
    "LC_CTYPE",
    "LC_IDENTIFICATION",
    "LC_MEASUREMENT",
    "LC_MESSAGES",
    "LC_MONETARY",
    "LC_NAME",
    "LC_NUMERIC",
    "LC_PAPER",
    "LC_TELEPHONE",
    "LC_TIME",
];

/// Where `${ENV:VAR}` values and the base environment come from.
pub type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// The process environment of the worker.
pub fn process_env() -> EnvLookup {
    Arc::new(|name| std::env::var(name).ok())
}

/// A stdio server ready to spawn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StdioLaunch {
    /// Program.
    pub command: String,
    /// Arguments.
    pub args: Vec<String>,
    /// The complete environment of the child.
    pub env: BTreeMap<String, String>,
    /// Working directory.
    pub cwd: Option<String>,
}

/// An HTTP server ready to connect to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpLaunch {
    /// Endpoint.
    pub url: String,
    /// Resolved headers.
    pub headers: BTreeMap<String, String>,
    /// The OAuth connection whose bearer token every request carries.
    pub auth_ref: Option<String>,
}

/// How to connect to one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Launch {
    /// Child process over stdin/stdout.
    Stdio(StdioLaunch),
    /// Streamable HTTP.
    StreamableHttp(HttpLaunch),
    /// 2024-11-05 HTTP+SSE.
    LegacySse(HttpLaunch),
}

fn resolve(field: &str, value: &str, env: &EnvLookup) -> Result<String, McpError> {
    let template =
        Template::parse(value).map_err(|err| McpError::Unavailable(format!("{field}: {err}")))?;
    template
        .resolve(|name| env(name))
        // No "where": the lookup is the worker's environment on workers and
        // the registry's for a preview; each caller says which.
        .map_err(|err| McpError::Unavailable(format!("{field}: {err}")))
}

/// Resolves a record; an unresolvable required reference makes the server
/// unavailable on this worker (never a crash).
pub fn launch(spec: &McpServerSpec, env: &EnvLookup) -> Result<Launch, McpError> {
    let missing = |table: &str| McpError::Unavailable(format!("record has no {table} table"));
    match spec.transport {
        Transport::Stdio => {
            let stdio = spec.stdio.as_ref().ok_or_else(|| missing("stdio"))?;
            let mut child_env = BTreeMap::new();
            if stdio.inherit_env {
                child_env.extend(std::env::vars());
            } else {
                for name in BASE_ENV {
                    if let Some(value) = env(name) {
                        child_env.insert((*name).to_owned(), value);
                    }
                }
            }
            for name in &stdio.env_from {
                let value = resolve(&format!("stdio.env_from.{name}"), &reference_to(name), env)?;
                child_env.insert(name.clone(), value);
            }
            for (name, value) in &stdio.env {
                child_env.insert(
                    name.clone(),
                    resolve(&format!("stdio.env.{name}"), value, env)?,
                );
            }
            Ok(Launch::Stdio(StdioLaunch {
                command: stdio.command.clone(),
                args: stdio.args.clone(),
                env: child_env,
                cwd: stdio.cwd.clone(),
            }))
        }
        Transport::StreamableHttp | Transport::HttpSseLegacy => {
            let http = spec.http.as_ref().ok_or_else(|| missing("http"))?;
            let headers = http
                .headers
                .iter()
                .map(|(name, value)| {
                    Ok((
                        name.clone(),
                        resolve(&format!("http.headers.{name}"), value, env)?,
                    ))
                })
                .collect::<Result<_, McpError>>()?;
            let launch = HttpLaunch {
                url: http.url.clone(),
                headers,
                auth_ref: http.auth_ref.clone(),
            };
            Ok(if spec.transport == Transport::StreamableHttp {
                Launch::StreamableHttp(launch)
            } else {
                Launch::LegacySse(launch)
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quiver_model::{HttpConfig, StdioConfig};

    fn env() -> EnvLookup {
        Arc::new(|name| match name {
            "PATH" => Some("/bin".into()),
            "TOKEN" => Some("t0k".into()),
            "SECRET_OF_THE_WORKER" => Some("never".into()),
            "LC_TIME" => Some("en_GB.UTF-8".into()),
            "LC_MESSAGES" => Some("C".into()),
            // Not a locale category: `ssh` forwards `LC_*` by default, so
            // such names are used to smuggle values through.
            "LC_SMUGGLED_TOKEN" => Some("never".into()),
            _ => None,
        })
    }

    #[test]
    fn stdio_children_get_a_minimal_resolved_environment() {
        let mut spec = McpServerSpec::new("s", Transport::Stdio);
        spec.stdio = Some(StdioConfig {
            command: "srv".into(),
            env: [("LEVEL".to_owned(), "${ENV:LEVEL:-info}".to_owned())].into(),
            env_from: vec!["TOKEN".into()],
            ..Default::default()
        });
        let Launch::Stdio(launch) = launch(&spec, &env()).unwrap() else {
            panic!("stdio expected");
        };
        assert_eq!(launch.env["PATH"], "/bin");
        assert_eq!(launch.env["TOKEN"], "t0k");
        assert_eq!(launch.env["LEVEL"], "info");
        assert!(!launch.env.contains_key("SECRET_OF_THE_WORKER"));
        assert_eq!(launch.env["LC_TIME"], "en_GB.UTF-8");
        assert_eq!(launch.env["LC_MESSAGES"], "C");
        assert!(!launch.env.contains_key("LC_SMUGGLED_TOKEN"));
    }

    #[test]
    fn unresolved_references_make_the_server_unavailable() {
        let mut spec = McpServerSpec::new("h", Transport::StreamableHttp);
        spec.http = Some(HttpConfig {
            url: "http://127.0.0.1:1/mcp".into(),
            headers: [(
                "Authorization".to_owned(),
                "Bearer ${ENV:MISSING}".to_owned(),
            )]
            .into(),
            auth_ref: None,
        });
        let err = launch(&spec, &env()).unwrap_err();
        assert_eq!(err.code(), quiver_model::ErrorCode::McpUnavailable);
        assert!(err.to_string().contains("MISSING"), "{err}");
        assert!(
            err.to_string().contains("http.headers.Authorization"),
            "{err}"
        );
    }
}
