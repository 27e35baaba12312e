//! Who may call, as registry records (docs/reference.md §12.2): policies (the
//! task policy of [`crate::policy::TaskPolicy`] under a name), API keys (a
//! hashed secret naming a policy and registry roles) and identity providers
//! (an issuer whose JWTs are callers, with rules mapping claims to a policy
//! and roles). They share the server records' revision space: every change
//! takes the next global revision, has a history row and reaches workers on
//! the watch stream.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::FieldError;
use crate::policy::TaskPolicy;
use crate::source::Source;

/// Longest policy, key or provider name.
pub const MAX_ACCESS_NAME_LEN: usize = 64;
/// Default allowed clock skew on `exp`/`nbf`, in seconds.
pub const DEFAULT_CLOCK_SKEW_SECS: u64 = 60;
/// The largest allowed clock skew, in seconds.
pub const MAX_CLOCK_SKEW_SECS: u64 = 300;
/// The most rules one identity provider may have.
pub const MAX_RULES: usize = 256;
/// The most audiences one identity provider may accept.
pub const MAX_AUDIENCES: usize = 32;

/// A person's or key's role on the registry (not on workers: there a
/// caller's policy decides).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Everything.
    Admin,
    /// Servers and policies.
    Editor,
    /// Approvals only.
    Approver,
    /// Reads.
    Viewer,
}

impl Role {
    /// The name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Editor => "editor",
            Role::Approver => "approver",
            Role::Viewer => "viewer",
        }
    }
}

/// Which kind of access record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessKind {
    /// A named task policy.
    Policy,
    /// An API key.
    ApiKey,
    /// An OIDC identity provider.
    IdentityProvider,
}

impl AccessKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            AccessKind::Policy => "policy",
            AccessKind::ApiKey => "api_key",
            AccessKind::IdentityProvider => "identity_provider",
        }
    }

    /// The kind of a stored name.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "policy" => Some(AccessKind::Policy),
            "api_key" => Some(AccessKind::ApiKey),
            "identity_provider" => Some(AccessKind::IdentityProvider),
            _ => None,
        }
    }
}

impl fmt::Display for AccessKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A named task policy (`PUT /admin/api/policies/{name}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyRecord {
    /// Its name; keys and rules name it.
    pub name: String,
    /// The policy, with the semantics of a worker's `[tasks.<name>]`.
    pub policy: TaskPolicy,
}

/// An API key. Only the SHA-256 of its secret is stored; the secret is
/// shown once, when the key is created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKeyRecord {
    /// Random id; the caller's principal is `key:<id>`.
    pub id: String,
    /// A label for people.
    pub name: String,
    /// The policy its calls get on workers.
    pub policy: String,
    /// Its roles on the registry (none: a worker caller only).
    #[serde(default)]
    pub roles: Vec<Role>,
    /// After this instant the key is refused.
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
    /// Lowercase hex SHA-256 of the secret.
    pub key_sha256: String,
}

impl ApiKeyRecord {
    /// Whether the key is past its expiry at `now`.
    pub fn expired_at(&self, now: DateTime<Utc>) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }
}

/// One rule of an identity provider: when the claim matches, the caller
/// gets the policy and roles.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimRule {
    /// A top-level claim name.
    pub claim: String,
    /// The claim (a string or an array of strings) contains this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contains: Option<String>,
    /// The claim (a string) equals this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub equals: Option<String>,
    /// The policy a matching caller gets on workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The roles a matching person gets on the registry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<Role>,
}

impl ClaimRule {
    /// Whether `claims` satisfy this rule: the claim is the string, or an
    /// array of strings holding it (`contains`); exactly the string
    /// (`equals`).
    pub fn matches(&self, claims: &serde_json::Map<String, serde_json::Value>) -> bool {
        use serde_json::Value;
        let Some(value) = claims.get(&self.claim) else {
            return false;
        };
        match (&self.contains, &self.equals, value) {
            (Some(want), None, Value::String(have)) | (None, Some(want), Value::String(have)) => {
                have == want
            }
            (Some(want), None, Value::Array(items)) => items
                .iter()
                .any(|item| item.as_str() == Some(want.as_str())),
            _ => false,
        }
    }
}

/// The first rule `claims` satisfy, with its index: it decides both the
/// policy and the roles.
pub fn first_matching_rule<'a>(
    rules: &'a [ClaimRule],
    claims: &serde_json::Map<String, serde_json::Value>,
) -> Option<(usize, &'a ClaimRule)> {
    rules
        .iter()
        .enumerate()
        .find(|(_, rule)| rule.matches(claims))
}

/// An identity provider held by the registry
/// (`PUT /admin/api/identity/providers/{name}`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityProviderRecord {
    /// Its name (logs, refusals, explain).
    #[serde(default)]
    pub name: String,
    /// The issuer (`iss`), `https://`, or `http://` on a loopback address.
    pub issuer: String,
    /// A token's `aud` must contain one of them.
    pub audiences: Vec<String>,
    /// Allowed clock skew on `exp`/`nbf` (default 60, at most 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_skew_secs: Option<u64>,
    /// The first matching rule decides.
    pub rules: Vec<ClaimRule>,
    /// The OAuth client id the web admin signs people in with (authorization
    /// code + PKCE, public client); without it the web admin offers no
    /// sign-in with this provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_client_id: Option<String>,
}

/// One access record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "spec", rename_all = "snake_case")]
pub enum AccessSpec {
    /// A named policy.
    Policy(PolicyRecord),
    /// An API key.
    ApiKey(ApiKeyRecord),
    /// An identity provider.
    IdentityProvider(IdentityProviderRecord),
}

impl AccessSpec {
    /// Its kind.
    pub fn kind(&self) -> AccessKind {
        match self {
            AccessSpec::Policy(_) => AccessKind::Policy,
            AccessSpec::ApiKey(_) => AccessKind::ApiKey,
            AccessSpec::IdentityProvider(_) => AccessKind::IdentityProvider,
        }
    }

    /// Its key within its kind: the policy or provider name, the key id.
    pub fn name(&self) -> &str {
        match self {
            AccessSpec::Policy(policy) => &policy.name,
            AccessSpec::ApiKey(key) => &key.id,
            AccessSpec::IdentityProvider(provider) => &provider.name,
        }
    }

    /// The policies it names (they must exist).
    pub fn policies_named(&self) -> BTreeSet<&str> {
        match self {
            AccessSpec::Policy(_) => BTreeSet::new(),
            AccessSpec::ApiKey(key) => BTreeSet::from([key.policy.as_str()]),
            AccessSpec::IdentityProvider(provider) => provider
                .rules
                .iter()
                .filter_map(|rule| rule.policy.as_deref())
                .collect(),
        }
    }

    /// Checks the record on its own; errors name the field. References to
    /// other records are checked by the store, in the writing transaction.
    pub fn validate(&self) -> Result<(), FieldError> {
        match self {
            AccessSpec::Policy(record) => {
                check_name("name", &record.name)?;
                record.policy.compile().map(|_| ()).map_err(|error| {
                    // The error's text starts with its field; say it once.
                    let text = error.to_string();
                    let message = text
                        .strip_prefix(error.field())
                        .and_then(|rest| rest.strip_prefix(": "))
                        .unwrap_or(&text);
                    FieldError::new(error.field(), message)
                })
            }
            AccessSpec::ApiKey(key) => {
                check_name("id", &key.id)?;
                if key.name.trim().is_empty() || key.name.chars().count() > 200 {
                    return Err(FieldError::new("name", "must be 1 to 200 characters"));
                }
                check_name("policy", &key.policy)?;
                check_roles("roles", &key.roles)?;
                if key.key_sha256.len() != 64
                    || !key
                        .key_sha256
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                {
                    return Err(FieldError::new(
                        "key_sha256",
                        "must be 64 lowercase hex digits",
                    ));
                }
                Ok(())
            }
            AccessSpec::IdentityProvider(provider) => validate_provider(provider),
        }
    }
}

fn check_roles(field: &str, roles: &[Role]) -> Result<(), FieldError> {
    let mut seen = BTreeSet::new();
    for (at, role) in roles.iter().enumerate() {
        if !seen.insert(role) {
            return Err(FieldError::new(
                format!("{field}[{at}]"),
                format!("role {} is named twice", role.as_str()),
            ));
        }
    }
    Ok(())
}

/// Checks a policy, key or provider name: `[A-Za-z0-9_.-]{1,64}`.
pub fn check_name(field: &str, name: &str) -> Result<(), FieldError> {
    if name.is_empty()
        || name.len() > MAX_ACCESS_NAME_LEN
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    {
        return Err(FieldError::new(
            field,
            format!("{name:?} must be 1 to {MAX_ACCESS_NAME_LEN} of A-Z a-z 0-9 _ . -"),
        ));
    }
    Ok(())
}

/// Checks an identity provider record on its own (what
/// [`AccessSpec::validate`] does for one); errors name the field.
pub fn validate_provider(provider: &IdentityProviderRecord) -> Result<(), FieldError> {
    check_name("name", &provider.name)?;
    check_issuer_url(&provider.issuer).map_err(|message| FieldError::new("issuer", message))?;
    if provider.audiences.is_empty() {
        return Err(FieldError::new(
            "audiences",
            "at least one audience is needed",
        ));
    }
    if provider.audiences.len() > MAX_AUDIENCES {
        return Err(FieldError::new(
            "audiences",
            format!("at most {MAX_AUDIENCES} audiences"),
        ));
    }
    if let Some(at) = provider.audiences.iter().position(|a| a.trim().is_empty()) {
        return Err(FieldError::new(
            format!("audiences[{at}]"),
            "must not be empty",
        ));
    }
    let skew = provider.clock_skew_secs.unwrap_or(DEFAULT_CLOCK_SKEW_SECS);
    if skew > MAX_CLOCK_SKEW_SECS {
        return Err(FieldError::new(
            "clock_skew_secs",
            format!("{skew} is more than the limit of {MAX_CLOCK_SKEW_SECS}"),
        ));
    }
    if provider.rules.is_empty() {
        return Err(FieldError::new("rules", "at least one rule is needed"));
    }
    if provider.rules.len() > MAX_RULES {
        return Err(FieldError::new(
            "rules",
            format!("at most {MAX_RULES} rules"),
        ));
    }
    for (r, rule) in provider.rules.iter().enumerate() {
        let field = |name: &str| format!("rules[{r}].{name}");
        if rule.claim.is_empty() {
            return Err(FieldError::new(field("claim"), "must not be empty"));
        }
        if rule.contains.is_some() == rule.equals.is_some() {
            return Err(FieldError::new(
                field("contains"),
                "set exactly one of contains and equals",
            ));
        }
        if rule.policy.is_none() && rule.roles.is_empty() {
            return Err(FieldError::new(
                field("policy"),
                "a rule gives a policy, roles, or both",
            ));
        }
        if let Some(policy) = &rule.policy {
            check_name(&field("policy"), policy)?;
        }
        check_roles(&field("roles"), &rule.roles)?;
    }
    if let Some(client) = &provider.web_client_id
        && (client.trim().is_empty() || client.len() > 256)
    {
        return Err(FieldError::new(
            "web_client_id",
            "must be 1 to 256 characters",
        ));
    }
    Ok(())
}

/// Checks an issuer or `jwks_uri`: `https://`, or `http://` on a loopback
/// address (development and tests); no credentials, query or fragment.
pub fn check_issuer_url(raw: &str) -> Result<url::Url, String> {
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

/// A stored access record: its content plus what the registry knows of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredAccess {
    /// The content.
    pub spec: AccessSpec,
    /// Global revision of its last change.
    pub revision: u64,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// Who changed it last.
    pub updated_by: String,
    /// Where its content comes from.
    pub source: Source,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider() -> IdentityProviderRecord {
        IdentityProviderRecord {
            name: "corp".into(),
            issuer: "https://idp.example.com".into(),
            audiences: vec!["quiver".into()],
            rules: vec![ClaimRule {
                claim: "groups".into(),
                contains: Some("team-a".into()),
                policy: Some("team-a".into()),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn field_of(spec: AccessSpec) -> String {
        spec.validate().unwrap_err().field
    }

    #[test]
    fn provider_errors_name_the_field() {
        assert!(AccessSpec::IdentityProvider(provider()).validate().is_ok());
        let with = |edit: fn(&mut IdentityProviderRecord)| {
            let mut p = provider();
            edit(&mut p);
            field_of(AccessSpec::IdentityProvider(p))
        };
        assert_eq!(
            with(|p| p.issuer = "http://idp.example.com".into()),
            "issuer"
        );
        assert_eq!(with(|p| p.issuer = "https://idp?x=1".into()), "issuer");
        assert_eq!(with(|p| p.audiences.clear()), "audiences");
        assert_eq!(with(|p| p.audiences.push(" ".into())), "audiences[1]");
        assert_eq!(with(|p| p.clock_skew_secs = Some(301)), "clock_skew_secs");
        assert_eq!(
            with(|p| p.rules[0].equals = Some("x".into())),
            "rules[0].contains"
        );
        assert_eq!(with(|p| p.rules[0].policy = None), "rules[0].policy");
        assert_eq!(
            with(|p| p.rules[0].policy = Some("a b".into())),
            "rules[0].policy"
        );
        assert_eq!(
            with(|p| p.rules[0].roles = vec![Role::Viewer, Role::Viewer]),
            "rules[0].roles[1]"
        );
        assert_eq!(with(|p| p.name = String::new()), "name");
        assert!(check_issuer_url("http://127.0.0.1:9/").is_ok());
        assert!(check_issuer_url("http://localhost/").is_ok());
        assert!(check_issuer_url("ftp://idp/").is_err());
    }

    #[test]
    fn key_and_policy_errors_name_the_field() {
        let key = ApiKeyRecord {
            id: "k1".into(),
            name: "ci".into(),
            policy: "team-a".into(),
            roles: vec![],
            expires_at: None,
            key_sha256: "a".repeat(64),
        };
        assert!(AccessSpec::ApiKey(key.clone()).validate().is_ok());
        let bad_hash = ApiKeyRecord {
            key_sha256: "A".repeat(64),
            ..key.clone()
        };
        assert_eq!(field_of(AccessSpec::ApiKey(bad_hash)), "key_sha256");
        let bad_policy = ApiKeyRecord {
            policy: String::new(),
            ..key
        };
        assert_eq!(field_of(AccessSpec::ApiKey(bad_policy)), "policy");
        let policy = PolicyRecord {
            name: "p".into(),
            policy: TaskPolicy {
                tool_denylist: vec!["[".into()],
                ..Default::default()
            },
        };
        assert_eq!(field_of(AccessSpec::Policy(policy)), "tool_denylist[0]");
    }

    #[test]
    fn the_first_matching_rule_decides() {
        let rule =
            |claim: &str, contains: Option<&str>, equals: Option<&str>, policy: &str| ClaimRule {
                claim: claim.into(),
                contains: contains.map(Into::into),
                equals: equals.map(Into::into),
                policy: Some(policy.into()),
                roles: vec![],
            };
        let rules = [
            rule("email", None, Some("boss@example.com"), "all"),
            rule("groups", Some("team-a"), None, "a"),
            rule("groups", Some("team-b"), None, "b"),
        ];
        let claims = |v: serde_json::Value| v.as_object().unwrap().clone();
        let first = |v| first_matching_rule(&rules, &claims(v)).map(|(at, _)| at);
        assert_eq!(
            first(serde_json::json!({"groups": ["team-b", "team-a"]})),
            Some(1)
        );
        assert_eq!(first(serde_json::json!({"groups": "team-b"})), Some(2));
        assert_eq!(
            first(serde_json::json!({"email": ["boss@example.com"]})),
            None
        );
        assert_eq!(
            first(serde_json::json!({"groups": [1, {"team-a": true}]})),
            None
        );
        assert_eq!(first(serde_json::json!({})), None);
    }

    #[test]
    fn the_stored_form_is_tagged_by_kind() {
        let spec = AccessSpec::IdentityProvider(provider());
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(json["kind"], "identity_provider");
        assert_eq!(json["spec"]["rules"][0]["policy"], "team-a");
        assert_eq!(serde_json::from_value::<AccessSpec>(json).unwrap(), spec);
        assert_eq!(AccessKind::parse("api_key"), Some(AccessKind::ApiKey));
        assert_eq!(AccessKind::parse("server"), None);
    }
}
