//! DNS-rebinding protection of the MCP endpoints (MCP transports spec,
//! "Security Warning": servers must validate `Origin`, and local servers
//! should only be reachable as loopback).
//!
//! A page on a hostile site can make a browser send requests to a server on
//! the user's machine by re-pointing its own host name at 127.0.0.1; the
//! request then carries the hostile name in `Host` and the hostile site in
//! `Origin`. So on a loopback listener only loopback host names are accepted
//! (any port) and an `Origin`, when present, must be a loopback origin too.
//! On any other listener the operator names the hosts and origins
//! (`[gateway] allowed_hosts`, `allowed_origins`); left empty, any `Host` is
//! accepted and an `Origin` must be the request's own host (same origin).

use http::HeaderMap;
use http::uri::Authority;

/// Host names a loopback listener answers to.
const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// Which `Host` and `Origin` headers the MCP endpoints accept. The lists
/// are read once, here, not on every request.
#[derive(Debug, Clone)]
pub struct RebindingGuard {
    /// `host` or `host:port`; empty: any.
    hosts: Vec<Allowed>,
    /// `scheme://host[:port]`; `None`: same origin as `Host`.
    origins: Option<Vec<(String, Allowed)>>,
}

/// A request the guard refuses, and why (for the 403 body).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The `Host` header is missing or not allowed.
    #[error(
        "Host header {0:?} is not allowed (possible DNS rebinding); allowed: gateway.allowed_hosts"
    )]
    Host(String),
    /// The `Origin` header is not allowed.
    #[error("Origin header {0:?} is not allowed; allowed: gateway.allowed_origins")]
    Origin(String),
}

/// `host` without the brackets of an IPv6 literal.
fn bare(host: &str) -> &str {
    host.trim_start_matches('[').trim_end_matches(']')
}

/// An allowed `host[:port]`: its host name (lower case, no brackets) and
/// the port, if it names one (then only that port).
#[derive(Debug, Clone)]
struct Allowed {
    host: String,
    port: Option<u16>,
}

impl Allowed {
    fn parse(allowed: &str) -> Self {
        let allowed = allowed.trim();
        match Authority::try_from(allowed) {
            Ok(authority) => Allowed {
                host: bare(authority.host()).to_ascii_lowercase(),
                port: authority.port_u16(),
            },
            Err(_) => Allowed {
                host: bare(allowed).to_ascii_lowercase(),
                port: None,
            },
        }
    }

    fn matches(&self, host: &str, port: Option<u16>) -> bool {
        self.host.eq_ignore_ascii_case(host) && self.port.is_none_or(|p| Some(p) == port)
    }
}

impl RebindingGuard {
    /// The guard for a listener on `loopback` (or not), with the configured
    /// lists (empty lists take the defaults described above).
    pub fn new(loopback: bool, hosts: Vec<String>, origins: Vec<String>) -> Self {
        let hosts = if hosts.is_empty() && loopback {
            LOOPBACK_HOSTS.map(str::to_owned).to_vec()
        } else {
            hosts
        };
        let origins = if origins.is_empty() && loopback {
            LOOPBACK_HOSTS
                .iter()
                .flat_map(|host| {
                    let host = if host.contains(':') {
                        format!("[{host}]")
                    } else {
                        (*host).to_owned()
                    };
                    [format!("http://{host}"), format!("https://{host}")]
                })
                .collect()
        } else {
            origins
        };
        RebindingGuard {
            hosts: hosts.iter().map(|host| Allowed::parse(host)).collect(),
            // An entry without a scheme never matches; the list still
            // stands (it is not "same origin").
            origins: (!origins.is_empty()).then(|| {
                origins
                    .iter()
                    .filter_map(|origin| origin.split_once("://"))
                    .map(|(scheme, rest)| (scheme.to_owned(), Allowed::parse(rest)))
                    .collect()
            }),
        }
    }

    /// Checks a request's headers.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), Refused> {
        let host_header = headers
            .get(http::header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let host =
            Authority::try_from(host_header).map_err(|_| Refused::Host(host_header.into()))?;
        let (name, port) = (bare(host.host()), host.port_u16());
        if !self.hosts.is_empty() && !self.hosts.iter().any(|allowed| allowed.matches(name, port)) {
            return Err(Refused::Host(host_header.into()));
        }
        let Some(origin) = headers.get(http::header::ORIGIN) else {
            return Ok(());
        };
        let origin_text = origin.to_str().unwrap_or_default();
        let refused = || Refused::Origin(origin_text.into());
        let parsed: http::Uri = origin_text.parse().map_err(|_| refused())?;
        let (Some(scheme), Some(authority)) = (parsed.scheme_str(), parsed.authority()) else {
            return Err(refused());
        };
        let origin_host = bare(authority.host());
        let allowed = match &self.origins {
            None => origin_host.eq_ignore_ascii_case(name) && authority.port_u16() == port,
            Some(origins) => origins.iter().any(|(allowed_scheme, allowed)| {
                allowed_scheme.eq_ignore_ascii_case(scheme)
                    && allowed.matches(origin_host, authority.port_u16())
            }),
        };
        if allowed { Ok(()) } else { Err(refused()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(host: &str, origin: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::HOST, host.parse().unwrap());
        if let Some(origin) = origin {
            headers.insert(http::header::ORIGIN, origin.parse().unwrap());
        }
        headers
    }

    #[test]
    fn loopback_listener_accepts_only_loopback_hosts_and_origins() {
        let guard = RebindingGuard::new(true, vec![], vec![]);
        for ok in [
            headers("127.0.0.1:8090", None),
            headers("localhost:1", Some("http://localhost:3000")),
            headers("[::1]:8090", Some("http://[::1]:5")),
        ] {
            assert_eq!(guard.check(&ok), Ok(()));
        }
        assert!(matches!(
            guard.check(&headers("evil.example.com", None)),
            Err(Refused::Host(_))
        ));
        assert!(matches!(
            guard.check(&headers("127.0.0.1:8090", Some("http://evil.example.com"))),
            Err(Refused::Origin(_))
        ));
        assert!(matches!(
            guard.check(&HeaderMap::new()),
            Err(Refused::Host(_))
        ));
    }

    #[test]
    fn public_listener_uses_the_configured_lists_or_same_origin() {
        let open = RebindingGuard::new(false, vec![], vec![]);
        assert_eq!(open.check(&headers("mcp.example.com", None)), Ok(()));
        assert_eq!(
            open.check(&headers("mcp.example.com", Some("https://mcp.example.com"))),
            Ok(())
        );
        assert!(
            open.check(&headers(
                "mcp.example.com",
                Some("https://evil.example.com")
            ))
            .is_err()
        );

        let listed = RebindingGuard::new(
            false,
            vec!["mcp.example.com".into()],
            vec!["https://app.example.com".into()],
        );
        assert_eq!(
            listed.check(&headers(
                "mcp.example.com:443",
                Some("https://app.example.com")
            )),
            Ok(())
        );
        assert!(listed.check(&headers("other.example.com", None)).is_err());
        assert!(
            listed
                .check(&headers("mcp.example.com", Some("http://app.example.com")))
                .is_err()
        );
    }
}
