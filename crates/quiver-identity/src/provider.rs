//! An identity provider as used to verify and map tokens, built from the
//! registry's record ([`IdentityProviderRecord`], validated by the model):
//! the issuer, the audiences its tokens must name, the skew allowed on their
//! times, and the rules giving callers a policy and roles.

use std::sync::Arc;
use std::time::Duration;

use quiver_model::access::{
    ClaimRule, DEFAULT_CLOCK_SKEW_SECS, IdentityProviderRecord, first_matching_rule,
    validate_provider,
};
use serde_json::{Map, Value};

use crate::Verified;

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
    pub rules: Vec<ClaimRule>,
}

/// Why a provider is refused; names the field.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ProviderError {
    /// E.g. `identity_providers[0].rules[1].policy`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl Provider {
    /// Validates `record`, entry `index` of a list of providers (errors name
    /// `identity_providers[{index}].<field>`); `has_policy` says whether a
    /// policy a rule names exists (a worker's tasks, the registry's
    /// policies).
    pub fn new(
        index: usize,
        record: &IdentityProviderRecord,
        has_policy: impl Fn(&str) -> bool,
    ) -> Result<Self, ProviderError> {
        let err = |field: &str, message: String| ProviderError {
            field: format!("identity_providers[{index}].{field}"),
            message,
        };
        validate_provider(record).map_err(|error| err(&error.field, error.message))?;
        for (r, rule) in record.rules.iter().enumerate() {
            if let Some(policy) = &rule.policy
                && !has_policy(policy)
            {
                return Err(err(
                    &format!("rules[{r}].policy"),
                    format!("no such policy {policy:?}"),
                ));
            }
        }
        Ok(Provider {
            name: record.name.clone(),
            issuer: record.issuer.clone(),
            audiences: record.audiences.clone(),
            clock_skew: Duration::from_secs(
                record.clock_skew_secs.unwrap_or(DEFAULT_CLOCK_SKEW_SECS),
            ),
            rules: record.rules.clone(),
        })
    }

    /// Validates a whole list of providers (each as [`Provider::new`]);
    /// no two may share a name or an issuer (a token's `iss` picks its
    /// provider).
    pub fn all(
        records: &[IdentityProviderRecord],
        has_policy: impl Fn(&str) -> bool,
    ) -> Result<Vec<Self>, ProviderError> {
        let mut providers: Vec<Provider> = Vec::with_capacity(records.len());
        for (at, record) in records.iter().enumerate() {
            let provider = Provider::new(at, record, &has_policy)?;
            if let Some(first) = providers
                .iter()
                .position(|p| p.name == provider.name || p.issuer == provider.issuer)
            {
                return Err(ProviderError {
                    field: format!("identity_providers[{at}]"),
                    message: format!(
                        "same name or issuer as identity_providers[{first}] (each issuer is one provider)"
                    ),
                });
            }
            providers.push(provider);
        }
        Ok(providers)
    }

    /// The caller `subject` of this provider is, given its (verified, or
    /// for explain: supplied) `claims`: the first matching rule decides its
    /// policy and roles.
    pub fn evaluate(&self, subject: &str, claims: &Map<String, Value>) -> Verified {
        let matched = first_matching_rule(&self.rules, claims);
        Verified {
            provider: self.name.clone(),
            issuer: self.issuer.clone(),
            subject: subject.to_owned(),
            principal: Arc::from(format!("oidc:{}#{subject}", self.issuer)),
            policy: matched.and_then(|(_, rule)| rule.policy.clone()),
            roles: matched
                .map(|(_, rule)| rule.roles.clone())
                .unwrap_or_default(),
            rule: matched.map(|(at, _)| at),
        }
    }
}

#[cfg(test)]
mod tests {
    use quiver_model::access::{ClaimRule, Role};
    use serde_json::json;

    use super::*;

    fn record() -> IdentityProviderRecord {
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

    fn refused(record: &IdentityProviderRecord) -> String {
        Provider::new(2, record, |policy| policy == "team-a")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn errors_name_the_field() {
        let ok = Provider::new(0, &record(), |policy| policy == "team-a").unwrap();
        assert_eq!(ok.clock_skew, Duration::from_secs(60));
        for issuer in [
            "http://127.0.0.1:9000",
            "http://[::1]:80/realm",
            "http://localhost:1",
        ] {
            let mut r = record();
            r.issuer = issuer.into();
            Provider::new(0, &r, |_| true).unwrap();
        }
        let mut r = record();
        r.issuer = "http://idp.example.com".into();
        assert!(
            refused(&r).starts_with("identity_providers[2].issuer: "),
            "{}",
            refused(&r)
        );
        r.issuer = "ftp://127.0.0.1".into();
        assert!(refused(&r).starts_with("identity_providers[2].issuer: "));
        r.issuer = "not a url".into();
        assert!(refused(&r).starts_with("identity_providers[2].issuer: "));
        let mut r = record();
        r.name = "a b".into();
        assert!(refused(&r).starts_with("identity_providers[2].name: "));
        let mut r = record();
        r.audiences.clear();
        assert!(refused(&r).starts_with("identity_providers[2].audiences: "));
        let mut r = record();
        r.clock_skew_secs = Some(301);
        assert!(refused(&r).contains("clock_skew_secs: 301 is more than the limit of 300"));
        let mut r = record();
        r.rules.clear();
        assert!(refused(&r).starts_with("identity_providers[2].rules: "));
        let mut r = record();
        r.rules[0].equals = Some("x".into());
        assert!(refused(&r).starts_with("identity_providers[2].rules[0].contains: "));
        let mut r = record();
        r.rules.push(ClaimRule {
            claim: "sub".into(),
            equals: Some("alice".into()),
            policy: Some("x".into()),
            ..Default::default()
        });
        assert_eq!(
            refused(&r),
            "identity_providers[2].rules[1].policy: no such policy \"x\""
        );
        // A rule giving registry roles only names no policy to check.
        r.rules[1].policy = None;
        r.rules[1].roles = vec![Role::Viewer];
        Provider::new(0, &r, |policy| policy == "team-a").unwrap();
    }

    #[test]
    fn a_list_is_one_provider_per_name_and_issuer() {
        let other = IdentityProviderRecord {
            name: "other".into(),
            issuer: "https://other.example.com".into(),
            ..record()
        };
        let providers = Provider::all(&[record(), other.clone()], |_| true).unwrap();
        assert_eq!(providers.len(), 2);
        let same_issuer = IdentityProviderRecord {
            issuer: record().issuer,
            ..other
        };
        assert_eq!(
            Provider::all(&[record(), same_issuer], |_| true)
                .unwrap_err()
                .to_string(),
            "identity_providers[1]: same name or issuer as identity_providers[0] (each issuer is one provider)"
        );
        let mut bad = record();
        bad.audiences.clear();
        assert!(
            Provider::all(&[record(), bad], |_| true)
                .unwrap_err()
                .to_string()
                .starts_with("identity_providers[1].audiences: ")
        );
        assert!(Provider::all(&[], |_| true).unwrap().is_empty());
    }

    #[test]
    fn the_first_matching_rule_decides_policy_roles_and_rule() {
        let mut r = record();
        r.rules = vec![
            ClaimRule {
                claim: "groups".into(),
                contains: Some("admins".into()),
                roles: vec![Role::Admin],
                ..Default::default()
            },
            ClaimRule {
                claim: "groups".into(),
                contains: Some("team-a".into()),
                policy: Some("team-a".into()),
                roles: vec![Role::Viewer],
                ..Default::default()
            },
        ];
        let provider = Provider::new(0, &r, |_| true).unwrap();
        let claims = |v: Value| v.as_object().unwrap().clone();

        let alice = provider.evaluate("alice", &claims(json!({"groups": ["team-a"]})));
        assert_eq!(alice.policy.as_deref(), Some("team-a"));
        assert_eq!(alice.roles, vec![Role::Viewer]);
        assert_eq!(alice.rule, Some(1));
        assert_eq!(&*alice.principal, "oidc:https://idp.example.com#alice");
        assert_eq!(
            (
                alice.provider.as_str(),
                alice.issuer.as_str(),
                alice.subject.as_str()
            ),
            ("corp", "https://idp.example.com", "alice")
        );

        // Both rules match: the first decides, its lack of a policy included.
        let root = provider.evaluate("root", &claims(json!({"groups": ["admins", "team-a"]})));
        assert_eq!(
            (root.policy, root.roles, root.rule),
            (None, vec![Role::Admin], Some(0))
        );

        let eve = provider.evaluate("eve", &claims(json!({"groups": []})));
        assert_eq!((eve.policy, eve.roles, eve.rule), (None, vec![], None));
    }
}
