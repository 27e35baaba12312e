//! An identity provider as configured (`[[identity_providers]]`) and as
//! validated: the issuer's URL, the audiences its tokens must name, the skew
//! allowed on their times, and the rules giving callers a task.

use std::net::IpAddr;
use std::time::Duration;

use crate::identity::rules::{Matcher, Rule};

/// Default allowed clock skew on `exp`/`nbf`, in seconds.
pub const DEFAULT_CLOCK_SKEW_SECS: u64 = 60;
/// The largest allowed clock skew, in seconds.
pub const MAX_CLOCK_SKEW_SECS: u64 = 300;
/// Longest provider name.
const MAX_NAME_LEN: usize = 64;

/// One `[[identity_providers]]` entry as written.
#[derive(Debug, Clone, Default)]
pub struct ProviderConfig {
    /// `[A-Za-z0-9_.-]{1,64}`: names the provider in logs and refusals.
    pub name: String,
    /// The issuer (`iss`), `https://`, or `http://` on a loopback address.
    pub issuer: String,
    /// At least one; a token's `aud` must contain one of them.
    pub audiences: Vec<String>,
    /// Allowed clock skew on `exp`/`nbf` (default 60, at most 300).
    pub clock_skew_secs: Option<u64>,
    /// First matching rule decides the caller's task; at least one.
    pub rules: Vec<RuleConfig>,
}

/// One `[[identity_providers.rules]]` entry as written.
#[derive(Debug, Clone, Default)]
pub struct RuleConfig {
    /// A top-level claim name.
    pub claim: String,
    /// The claim (a string or an array of strings) contains this.
    pub contains: Option<String>,
    /// The claim (a string) equals this.
    pub equals: Option<String>,
    /// The task the caller gets.
    pub task: String,
}

/// A validated provider.
#[derive(Debug, Clone)]
pub struct Provider {
    /// Its name.
    pub name: String,
    /// Its issuer, exactly as tokens name it.
    pub issuer: String,
    /// Audiences accepted.
    pub audiences: Vec<String>,
    /// Allowed clock skew.
    pub clock_skew: Duration,
    /// Its rules, in order.
    pub rules: Vec<Rule>,
}

/// Why a provider configuration is refused; names the field.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ProviderError {
    /// E.g. `identity_providers[0].rules[1].task`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl Provider {
    /// Validates entry `index` of `identity_providers`; `has_task` says
    /// whether a task name is configured.
    pub fn new(
        index: usize,
        config: &ProviderConfig,
        has_task: impl Fn(&str) -> bool,
    ) -> Result<Self, ProviderError> {
        let at = format!("identity_providers[{index}]");
        let err = |field: &str, message: String| ProviderError {
            field: format!("{at}.{field}"),
            message,
        };
        if config.name.is_empty()
            || config.name.len() > MAX_NAME_LEN
            || !config
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        {
            return Err(err(
                "name",
                format!(
                    "{:?} must be 1 to {MAX_NAME_LEN} of A-Z a-z 0-9 _ . -",
                    config.name
                ),
            ));
        }
        check_url(&config.issuer).map_err(|message| err("issuer", message))?;
        if config.audiences.is_empty() {
            return Err(err("audiences", "at least one audience is needed".into()));
        }
        if let Some(at) = config.audiences.iter().position(String::is_empty) {
            return Err(err(&format!("audiences[{at}]"), "must not be empty".into()));
        }
        let skew = config.clock_skew_secs.unwrap_or(DEFAULT_CLOCK_SKEW_SECS);
        if skew > MAX_CLOCK_SKEW_SECS {
            return Err(err(
                "clock_skew_secs",
                format!("{skew} is more than the limit of {MAX_CLOCK_SKEW_SECS}"),
            ));
        }
        if config.rules.is_empty() {
            return Err(err("rules", "at least one rule is needed".into()));
        }
        let mut rules = Vec::with_capacity(config.rules.len());
        for (r, rule) in config.rules.iter().enumerate() {
            let field = |name: &str| format!("rules[{r}].{name}");
            if rule.claim.is_empty() {
                return Err(err(&field("claim"), "must not be empty".into()));
            }
            let matcher = match (&rule.contains, &rule.equals) {
                (Some(value), None) => Matcher::Contains(value.clone()),
                (None, Some(value)) => Matcher::Equals(value.clone()),
                _ => {
                    return Err(err(
                        &field("contains"),
                        "set exactly one of contains and equals".into(),
                    ));
                }
            };
            if !has_task(&rule.task) {
                return Err(err(&field("task"), format!("no such task {:?}", rule.task)));
            }
            rules.push(Rule {
                claim: rule.claim.clone(),
                matcher,
                task: rule.task.clone(),
            });
        }
        Ok(Provider {
            name: config.name.clone(),
            issuer: config.issuer.clone(),
            audiences: config.audiences.clone(),
            clock_skew: Duration::from_secs(skew),
            rules,
        })
    }
}

/// Checks an issuer or `jwks_uri`: `https://`, or `http://` on a loopback
/// address (development and tests); no credentials, query or fragment.
pub fn check_url(raw: &str) -> Result<url::Url, String> {
    let url = url::Url::parse(raw).map_err(|e| format!("{raw:?} is not a URL: {e}"))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!("{raw:?} must not carry credentials"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!("{raw:?} must not have a query or fragment"));
    }
    match url.scheme() {
        "https" if url.host().is_some() => Ok(url),
        "http" if is_loopback(&url) => Ok(url),
        "http" => Err(format!(
            "{raw:?} must be https:// (http:// only on a loopback address: 127.0.0.0/8, ::1, localhost)"
        )),
        _ => Err(format!("{raw:?} must be an https:// URL")),
    }
}

fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(domain)) => domain.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip).is_loopback(),
        Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip).is_loopback(),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ProviderConfig {
        ProviderConfig {
            name: "corp".into(),
            issuer: "https://idp.example.com".into(),
            audiences: vec!["quiver".into()],
            clock_skew_secs: None,
            rules: vec![RuleConfig {
                claim: "groups".into(),
                contains: Some("team-a".into()),
                equals: None,
                task: "team-a".into(),
            }],
        }
    }

    fn refused(config: &ProviderConfig) -> String {
        Provider::new(2, config, |task| task == "team-a")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn errors_name_the_field() {
        let ok = Provider::new(0, &config(), |task| task == "team-a").unwrap();
        assert_eq!(ok.clock_skew, Duration::from_secs(60));
        for issuer in [
            "http://127.0.0.1:9000",
            "http://[::1]:80/realm",
            "http://localhost:1",
        ] {
            let mut c = config();
            c.issuer = issuer.into();
            Provider::new(0, &c, |_| true).unwrap();
        }
        let mut c = config();
        c.issuer = "http://idp.example.com".into();
        assert!(
            refused(&c).starts_with("identity_providers[2].issuer: "),
            "{}",
            refused(&c)
        );
        c.issuer = "ftp://127.0.0.1".into();
        assert!(refused(&c).starts_with("identity_providers[2].issuer: "));
        c.issuer = "not a url".into();
        assert!(refused(&c).starts_with("identity_providers[2].issuer: "));
        let mut c = config();
        c.name = "a b".into();
        assert!(refused(&c).starts_with("identity_providers[2].name: "));
        let mut c = config();
        c.audiences.clear();
        assert!(refused(&c).starts_with("identity_providers[2].audiences: "));
        let mut c = config();
        c.clock_skew_secs = Some(301);
        assert!(refused(&c).contains("clock_skew_secs: 301 is more than the limit of 300"));
        let mut c = config();
        c.rules.clear();
        assert!(refused(&c).starts_with("identity_providers[2].rules: "));
        let mut c = config();
        c.rules[0].equals = Some("x".into());
        assert!(refused(&c).starts_with("identity_providers[2].rules[0].contains: "));
        let mut c = config();
        c.rules.push(RuleConfig {
            claim: "sub".into(),
            equals: Some("alice".into()),
            task: "x".into(),
            ..Default::default()
        });
        assert_eq!(
            refused(&c),
            "identity_providers[2].rules[1].task: no such task \"x\""
        );
    }
}
