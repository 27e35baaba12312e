//! Whether a caller — an API key, a key's secret, or an identity
//! provider's subject with its claims — may call one tool, and which rule
//! decides (docs/reference.md §12.2; asked at `POST
//! /admin/api/access/explain`, handled in `rest::access`). It answers
//! from the in-memory head with the same decision functions workers
//! enforce with: the provider rules of `quiver_model::access` and the policy
//! evaluation of `quiver_model::policy`.

use chrono::Utc;
use quiver_model::access::{AccessKind, AccessSpec, IdentityProviderRecord};
use quiver_model::policy::{
    Decision, RejectReason, ServerToolFilter, SessionFilter, TaskPolicy, evaluate,
};
use quiver_model::token::TokenDigest;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::RegistryError;
use crate::head::HeadView;

/// The body of an explain request: one way to name the caller, and the call.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExplainRequest {
    /// An API key by id.
    #[serde(default)]
    pub key_id: Option<String>,
    /// An API key's secret or a JWT of one of the registry's identity
    /// providers (verified like a worker does; never stored or logged).
    #[serde(default)]
    pub token: Option<String>,
    /// An identity provider's subject (`sub`), with `issuer`.
    #[serde(default)]
    pub subject: Option<String>,
    /// The issuer of `subject`.
    #[serde(default)]
    pub issuer: Option<String>,
    /// Further claims of the subject (`groups`, `email`…) the provider's
    /// rules look at.
    #[serde(default)]
    pub claims: Map<String, Value>,
    /// The server.
    pub server_id: String,
    /// The tool's name on that server (before any transform).
    pub tool: String,
}

/// The answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Explanation {
    /// `allow` or `deny`.
    pub decision: &'static str,
    /// The caller, when it could be named (`key:<id>`, `oidc:<issuer>#<sub>`).
    pub principal: Option<String>,
    /// The policy that applies, when one does.
    pub policy: Option<String>,
    /// A stable code: `allowed`, or why not (`key_unknown`,
    /// `key_expired`, `issuer_unknown`, `identity_no_matching_rule`,
    /// `policy_missing`, `server_unknown`, `token_refused`, or a tool
    /// filter's code such as
    /// `denied_by_task`).
    pub code: &'static str,
    /// The reason in words.
    pub reason: String,
    /// The deciding rule, when one decides: `identity_providers.<name>.rules[i]`,
    /// `policies.<name>.tool_denylist["pattern"]`, …
    pub rule: Option<String>,
}

impl Explanation {
    pub(crate) fn deny(code: &'static str, reason: String) -> Self {
        Explanation {
            decision: "deny",
            principal: None,
            policy: None,
            code,
            reason,
            rule: None,
        }
    }

    /// Whether the call is allowed.
    pub fn allowed(&self) -> bool {
        self.decision == "allow"
    }
}

/// Who the request names, resolved to a principal and a policy name.
struct Resolved {
    principal: String,
    policy: String,
    rule: Option<String>,
}

/// Explains `request` against `head`; errors are malformed requests only.
pub fn explain(head: &HeadView, request: &ExplainRequest) -> Result<Explanation, RegistryError> {
    let named = [
        request.key_id.is_some(),
        request.token.is_some(),
        request.subject.is_some(),
    ];
    if named.iter().filter(|named| **named).count() != 1 {
        return Err(RegistryError::invalid(
            "key_id",
            "name the caller by exactly one of key_id, token, or subject with issuer",
        ));
    }
    let resolved = if let Some(id) = &request.key_id {
        key_by(
            head,
            |key_id, _| key_id == id,
            &format!("no API key {id:?}"),
        )
    } else if let Some(token) = &request.token {
        let digest = TokenDigest::of(token).hex();
        key_by(
            head,
            |_, sha| sha == digest,
            "the token is no API key's secret",
        )
    } else {
        let issuer = request.issuer.as_deref().ok_or_else(|| {
            RegistryError::invalid("issuer", "a subject needs the issuer that names it")
        })?;
        let subject = request.subject.as_deref().unwrap_or_default();
        subject_of(head, issuer, subject, &request.claims)
    };
    let resolved = match resolved {
        Ok(resolved) => resolved,
        Err(explanation) => return Ok(*explanation),
    };
    Ok(decide(head, resolved, &request.server_id, &request.tool))
}

fn key_by(
    head: &HeadView,
    matches: impl Fn(&str, &str) -> bool,
    missing: &str,
) -> Result<Resolved, Box<Explanation>> {
    let key = head
        .access_of(AccessKind::ApiKey)
        .find_map(|record| match &record.spec {
            AccessSpec::ApiKey(key) if matches(&key.id, &key.key_sha256) => Some(key),
            _ => None,
        })
        .ok_or_else(|| Box::new(Explanation::deny("key_unknown", missing.to_owned())))?;
    if key.expired_at(Utc::now()) {
        return Err(Box::new(Explanation {
            principal: Some(format!("key:{}", key.id)),
            rule: Some(format!("keys.{}.expires_at", key.id)),
            ..Explanation::deny(
                "key_expired",
                format!(
                    "API key {} expired at {}",
                    key.id,
                    key.expires_at.map(|at| at.to_rfc3339()).unwrap_or_default()
                ),
            )
        }));
    }
    Ok(Resolved {
        principal: format!("key:{}", key.id),
        policy: key.policy.clone(),
        rule: None,
    })
}

fn subject_of(
    head: &HeadView,
    issuer: &str,
    subject: &str,
    claims: &Map<String, Value>,
) -> Result<Resolved, Box<Explanation>> {
    let provider: &IdentityProviderRecord = head
        .access_of(AccessKind::IdentityProvider)
        .find_map(|record| match &record.spec {
            AccessSpec::IdentityProvider(provider) if provider.issuer == issuer => Some(provider),
            _ => None,
        })
        .ok_or_else(|| {
            Box::new(Explanation::deny(
                "issuer_unknown",
                format!("no identity provider has issuer {issuer:?}"),
            ))
        })?;
    let principal = format!("oidc:{issuer}#{subject}");
    let mut claims = claims.clone();
    claims.insert("sub".into(), Value::String(subject.to_owned()));
    claims.insert("iss".into(), Value::String(issuer.to_owned()));
    let matched = quiver_model::access::first_matching_rule(&provider.rules, &claims)
        .and_then(|(at, rule)| rule.policy.as_ref().map(|policy| (at, policy)));
    match matched {
        Some((at, policy)) => Ok(Resolved {
            principal,
            policy: policy.clone(),
            rule: Some(format!("identity_providers.{}.rules[{at}]", provider.name)),
        }),
        None => Err(Box::new(no_rule(principal, &provider.name))),
    }
}

/// A provider's caller no rule gives a policy.
fn no_rule(principal: String, provider: &str) -> Explanation {
    Explanation {
        reason: format!(
            "{principal} is authenticated by identity provider {provider}, but none of its rules gives it a policy"
        ),
        principal: Some(principal),
        ..Explanation::deny("identity_no_matching_rule", String::new())
    }
}

/// The policy's decision on one tool of one server, as a worker takes it
/// for a request naming that server.
fn decide(head: &HeadView, resolved: Resolved, server_id: &str, tool: &str) -> Explanation {
    let Resolved {
        principal,
        policy: name,
        rule: identity_rule,
    } = resolved;
    let named = |explanation: Explanation| Explanation {
        principal: Some(principal.clone()),
        policy: Some(name.clone()),
        ..explanation
    };
    let policy: Option<&TaskPolicy> =
        head.access_record(AccessKind::Policy, &name)
            .and_then(|record| match &record.spec {
                AccessSpec::Policy(policy) => Some(&policy.policy),
                _ => None,
            });
    let compiled = policy.map(TaskPolicy::compile);
    let Some(Ok(compiled)) = compiled else {
        return named(Explanation::deny(
            "policy_missing",
            format!("policy {name:?} does not exist (or does not compile)"),
        ));
    };
    let Some(server) = head.servers.get(server_id) else {
        return named(Explanation::deny(
            "server_unknown",
            format!("no MCP server {server_id:?} in the registry"),
        ));
    };
    let selection = SessionFilter {
        server_ids: Some(vec![server_id.to_owned()]),
        ..Default::default()
    }
    .compile();
    let filter = ServerToolFilter::new(&server.spec);
    let (Ok(selection), Ok(filter)) = (selection, filter) else {
        return named(Explanation::deny(
            "server_unknown",
            format!("MCP server {server_id:?} has filters that do not compile"),
        ));
    };
    match evaluate(&server.spec, &filter, &compiled, Some(&selection), tool) {
        Decision::Allowed { injected_name, .. } => named(Explanation {
            decision: "allow",
            principal: None,
            policy: None,
            code: "allowed",
            reason: format!(
                "policy {name:?} allows {server_id}.{tool} (the model sees it as {injected_name})"
            ),
            rule: identity_rule,
        }),
        Decision::Rejected(reason) => named(Explanation {
            rule: Some(rule_of(&reason, &name, server_id)),
            ..Explanation::deny(reason.code(), reason.to_string())
        }),
    }
}

/// The rule a refusal names.
fn rule_of(reason: &RejectReason, policy: &str, server_id: &str) -> String {
    match reason {
        RejectReason::ServerNotAllowedForTask => {
            format!("policies.{policy}.allowed_server_ids")
        }
        RejectReason::DeniedByTask { pattern } => {
            format!("policies.{policy}.tool_denylist[{pattern:?}]")
        }
        RejectReason::NotInTaskAllowlist => format!("policies.{policy}.tool_allowlist"),
        RejectReason::ServerDisabled => format!("servers.{server_id}.enabled"),
        RejectReason::DeniedByServer { pattern } => {
            format!("servers.{server_id}.denied_tools[{pattern:?}]")
        }
        RejectReason::NotInAllowedTools => format!("servers.{server_id}.allowed_tools"),
        other => format!("servers.{server_id}: {}", other.code()),
    }
}

/// Explains a call by the caller of a verified JWT (its rules already
/// applied).
pub fn explain_verified(
    head: &HeadView,
    verified: &quiver_identity::Verified,
    server_id: &str,
    tool: &str,
) -> Explanation {
    let principal = verified.principal.to_string();
    match &verified.policy {
        Some(policy) => decide(
            head,
            Resolved {
                principal,
                policy: policy.clone(),
                rule: verified
                    .rule
                    .map(|at| format!("identity_providers.{}.rules[{at}]", verified.provider)),
            },
            server_id,
            tool,
        ),
        None => no_rule(principal, &verified.provider),
    }
}
