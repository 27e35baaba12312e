//! The egress allowlist of the HTTP transports (docs/reference.md §12): which hosts a
//! worker (or the registry's tool preview) may connect to for
//! `streamable_http` and `http_sse_legacy` records.
//!
//! - No allowlist (neither hosts nor CIDRs) allows every host: existing
//!   set-ups keep working, and records only come from the registry, whose
//!   writes need the admin token.
//! - Otherwise a URL is allowed when its host matches one of `allow_hosts`
//!   (case-insensitive globs; `*` also spans dots, so `*.corp.example`
//!   matches `a.b.corp.example` but not `corp.example`), or when every
//!   address the host resolves to (an IP literal is its own address) lies in
//!   one of `allow_cidrs`.
//! - A connection allowed through the CIDRs is pinned to the addresses that
//!   were checked ([`reqwest::ClientBuilder::resolve_to_addrs`]), so a second
//!   DNS answer (DNS rebinding) cannot move it elsewhere.
//! - MCP HTTP clients follow no redirects ([`http_client_builder`]): a
//!   redirect could lead to a host the allowlist refuses, and would carry the
//!   record's headers (credentials) along.
//!
//! A refused URL fails before any connection with [`McpError::EgressDenied`]
//! (§10 `mcp_policy_denied`: the operator's policy refuses it and retrying
//! cannot help).

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use quiver_model::pattern::Pattern;

use crate::error::McpError;
use crate::launch::Launch;

/// How to widen the allowlist, for messages.
const HOW_TO_ALLOW: &str = "allow it with --egress-allow-host / --egress-allow-cidr \
     (QUIVER_EGRESS_ALLOW_HOST / QUIVER_EGRESS_ALLOW_CIDR, or [egress] allow_hosts / allow_cidrs in the config file)";

/// An allowlist entry that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressConfigError {
    /// An `allow_hosts` pattern is invalid.
    #[error(
        "egress allow_hosts[{index}] (--egress-allow-host): invalid host pattern {pattern:?}: {reason}"
    )]
    Host {
        /// Position in the list.
        index: usize,
        /// The pattern as written.
        pattern: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An `allow_cidrs` entry is not a CIDR block (`10.0.0.0/8`, `::1/128`).
    #[error(
        "egress allow_cidrs[{index}] (--egress-allow-cidr): invalid CIDR {cidr:?} (write a block such as 10.0.0.0/8 or 10.0.0.1/32): {reason}"
    )]
    Cidr {
        /// Position in the list.
        index: usize,
        /// The entry as written.
        cidr: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// The egress allowlist; the default allows every host.
#[derive(Debug, Clone, Default)]
pub struct EgressPolicy {
    hosts: Vec<(String, Pattern)>,
    cidrs: Vec<IpNet>,
}

/// What a check decided for a URL that is allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allowed {
    /// Connect as usual (no allowlist, the host name is allowed, or the host
    /// is an allowed IP literal).
    Any,
    /// Connect only to these addresses of `host` (allowed through the CIDRs).
    Pinned {
        /// The host name as in the URL (lowercase).
        host: String,
        /// The resolved addresses that were checked.
        addrs: Vec<SocketAddr>,
    },
}

impl EgressPolicy {
    /// Compiles the allowlist. Host patterns are matched lowercase; CIDRs
    /// are IPv4 or IPv6 blocks (a bare address is refused: write `/32` or
    /// `/128`).
    pub fn new<H: AsRef<str>, C: AsRef<str>>(
        allow_hosts: &[H],
        allow_cidrs: &[C],
    ) -> Result<Self, EgressConfigError> {
        let hosts = allow_hosts
            .iter()
            .enumerate()
            .map(|(index, pattern)| {
                let pattern = pattern.as_ref().trim().to_ascii_lowercase();
                Pattern::new(&pattern)
                    .map(|compiled| (pattern.clone(), compiled))
                    .map_err(|err| EgressConfigError::Host {
                        index,
                        pattern,
                        reason: err.reason,
                    })
            })
            .collect::<Result<_, _>>()?;
        let cidrs = allow_cidrs
            .iter()
            .enumerate()
            .map(|(index, cidr)| {
                cidr.as_ref()
                    .trim()
                    .parse::<IpNet>()
                    .map_err(|err| EgressConfigError::Cidr {
                        index,
                        cidr: cidr.as_ref().to_owned(),
                        reason: err.to_string(),
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(EgressPolicy { hosts, cidrs })
    }

    /// Whether no allowlist is configured (every host is allowed).
    pub fn is_unrestricted(&self) -> bool {
        self.hosts.is_empty() && self.cidrs.is_empty()
    }

    fn host_allowed(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        self.hosts.iter().any(|(_, pattern)| pattern.matches(&host))
    }

    fn ip_allowed(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.cidrs.iter().any(|net| net.contains(&ip))
    }

    fn denied(&self, host: &str, why: &str) -> McpError {
        McpError::EgressDenied(format!(
            "egress to host {host:?} is not allowed: {why}; {HOW_TO_ALLOW}"
        ))
    }

    /// The decision that needs no DNS: `Some(Ok)` or `Some(Err)` when the
    /// URL's host decides by itself (no allowlist, an allowed name, an IP
    /// literal, or a name while no CIDRs are configured), `None` when the
    /// host name must be resolved and its addresses checked.
    pub fn check_static(&self, url: &url::Url) -> Option<Result<(), McpError>> {
        if self.is_unrestricted() {
            return Some(Ok(()));
        }
        let Some(host) = url.host() else {
            return Some(Err(McpError::EgressDenied(format!(
                "egress to {url:?} is not allowed: the url has no host"
            ))));
        };
        let name = host_string(&host);
        if self.host_allowed(&name) {
            return Some(Ok(()));
        }
        let ip = match host {
            url::Host::Ipv4(ip) => IpAddr::V4(ip),
            url::Host::Ipv6(ip) => IpAddr::V6(ip),
            url::Host::Domain(_) if self.cidrs.is_empty() => {
                return Some(Err(self.denied(&name, "it matches no allowed host pattern")));
            }
            url::Host::Domain(_) => return None,
        };
        Some(if self.ip_allowed(ip) {
            Ok(())
        } else {
            Err(self.denied(
                &name,
                "it matches no allowed host pattern and no allowed CIDR",
            ))
        })
    }

    /// [`EgressPolicy::check_static`] for a resolved record: a URL that is
    /// refused without DNS makes the record unavailable on this process
    /// before any call. Stdio launches and URLs that need resolving pass
    /// (the latter are checked at each connect).
    pub fn check_launch(&self, launch: &Launch) -> Result<(), McpError> {
        if let Launch::StreamableHttp(http) | Launch::LegacySse(http) = launch
            && let Ok(url) = url::Url::parse(&http.url)
            && let Some(Err(denied)) = self.check_static(&url)
        {
            return Err(denied);
        }
        Ok(())
    }

    /// Checks `url` before connecting; resolves a host name that is only
    /// allowed through the CIDRs and requires every address to be inside
    /// one of them.
    pub async fn check(&self, url: &url::Url) -> Result<Allowed, McpError> {
        if let Some(decided) = self.check_static(url) {
            return decided.map(|()| Allowed::Any);
        }
        let Some(host) = url.host_str().map(str::to_ascii_lowercase) else {
            return Err(self.denied("", "the url has no host"));
        };
        let port = url.port_or_known_default().unwrap_or(0);
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|err| {
                McpError::Unavailable(format!("egress check: cannot resolve {host:?}: {err}"))
            })?
            .collect();
        if addrs.is_empty() {
            return Err(McpError::Unavailable(format!(
                "egress check: {host:?} resolves to no address"
            )));
        }
        if let Some(outside) = addrs.iter().find(|addr| !self.ip_allowed(addr.ip())) {
            return Err(self.denied(
                &host,
                &format!(
                    "it matches no allowed host pattern and resolves to {}, outside every allowed CIDR",
                    outside.ip()
                ),
            ));
        }
        Ok(Allowed::Pinned { host, addrs })
    }

    /// The client to connect to `url` with: `base` when the host is allowed
    /// outright, else a client pinned to the checked addresses.
    pub async fn client_for(
        &self,
        url: &url::Url,
        base: &reqwest::Client,
    ) -> Result<reqwest::Client, McpError> {
        match self.check(url).await? {
            Allowed::Any => Ok(base.clone()),
            Allowed::Pinned { host, addrs } => http_client_builder()
                .resolve_to_addrs(&host, &addrs)
                .build()
                .map_err(|err| {
                    McpError::Unavailable(format!("cannot build a pinned http client: {err}"))
                }),
        }
    }
}

/// The builder of every MCP HTTP client: no redirects (see the module docs).
pub fn http_client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none())
}

/// An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`) is checked as IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn host_string(host: &url::Host<&str>) -> String {
    match host {
        url::Host::Domain(name) => name.to_ascii_lowercase(),
        url::Host::Ipv4(ip) => ip.to_string(),
        url::Host::Ipv6(ip) => ip.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> url::Url {
        url::Url::parse(s).unwrap()
    }

    fn policy(hosts: &[&str], cidrs: &[&str]) -> EgressPolicy {
        EgressPolicy::new(hosts, cidrs).unwrap()
    }

    #[test]
    fn no_allowlist_allows_everything() {
        let open = EgressPolicy::default();
        assert!(open.is_unrestricted());
        assert!(matches!(
            open.check_static(&url("http://169.254.169.254/")),
            Some(Ok(()))
        ));
    }

    #[test]
    fn host_patterns_match_case_insensitively_and_span_subdomains() {
        let p = policy(&["api.example.com", "*.Corp.Example"], &[]);
        for allowed in [
            "https://api.example.com/mcp",
            "https://API.EXAMPLE.COM:8443/mcp",
            "http://a.corp.example/mcp",
            "http://a.b.corp.example/mcp",
        ] {
            assert!(
                matches!(p.check_static(&url(allowed)), Some(Ok(()))),
                "{allowed}"
            );
        }
        for denied in [
            "https://example.com/",
            "https://api.example.com.evil.net/",
            "http://corp.example/",
            "http://127.0.0.1:8080/mcp",
        ] {
            let err = p.check_static(&url(denied)).unwrap().unwrap_err();
            assert_eq!(
                err.code(),
                quiver_model::ErrorCode::McpPolicyDenied,
                "{denied}"
            );
            assert!(!err.retryable());
            assert!(err.to_string().contains("--egress-allow-host"), "{err}");
        }
    }

    #[test]
    fn ip_literals_are_checked_against_the_cidrs() {
        let p = policy(&[], &["10.0.0.0/8", "127.0.0.1/32", "fd00::/8"]);
        assert!(matches!(
            p.check_static(&url("http://10.1.2.3/")),
            Some(Ok(()))
        ));
        assert!(matches!(
            p.check_static(&url("http://127.0.0.1:9/")),
            Some(Ok(()))
        ));
        assert!(matches!(
            p.check_static(&url("http://[fd00::1]/")),
            Some(Ok(()))
        ));
        assert!(matches!(
            p.check_static(&url("http://[::ffff:10.0.0.1]/")),
            Some(Ok(()))
        ));
        let err = p
            .check_static(&url("http://127.0.0.2/"))
            .unwrap()
            .unwrap_err();
        assert!(err.to_string().contains("\"127.0.0.2\""), "{err}");
        // A name needs DNS when CIDRs are configured.
        assert!(p.check_static(&url("http://db.internal/")).is_none());
    }

    #[test]
    fn an_ip_literal_may_be_allowed_by_name() {
        let p = policy(&["127.0.0.1"], &[]);
        assert!(matches!(
            p.check_static(&url("http://127.0.0.1:1/")),
            Some(Ok(()))
        ));
    }

    #[tokio::test]
    async fn names_are_resolved_and_every_address_must_be_allowed() {
        let inside = policy(&[], &["127.0.0.0/8", "::1/128"]);
        match inside
            .check(&url("http://localhost:8123/mcp"))
            .await
            .unwrap()
        {
            Allowed::Pinned { host, addrs } => {
                assert_eq!(host, "localhost");
                assert!(!addrs.is_empty());
                assert!(addrs.iter().all(|a| a.port() == 8123));
            }
            other => panic!("pinned expected, got {other:?}"),
        }
        let outside = policy(&[], &["10.0.0.0/8"]);
        let err = outside
            .check(&url("http://localhost:8123/mcp"))
            .await
            .unwrap_err();
        assert_eq!(err.code(), quiver_model::ErrorCode::McpPolicyDenied);
        assert!(err.to_string().contains("\"localhost\""), "{err}");
    }

    #[test]
    fn bad_entries_name_their_list_and_position() {
        let err = EgressPolicy::new(&["ok", "[bad"], &[] as &[&str]).unwrap_err();
        assert!(err.to_string().contains("allow_hosts[1]"), "{err}");
        let err = EgressPolicy::new(&[] as &[&str], &["10.0.0.0/8", "10.0.0.1"]).unwrap_err();
        assert!(err.to_string().contains("allow_cidrs[1]"), "{err}");
    }
}
