//! The rules of a provider: the first whose claim matches gives the caller
//! its task.

use serde_json::{Map, Value};

/// How a rule compares its claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Matcher {
    /// The claim is this string, or an array of strings holding it.
    Contains(String),
    /// The claim is exactly this string.
    Equals(String),
}

/// One rule.
#[derive(Debug, Clone)]
pub struct Rule {
    /// A top-level claim name.
    pub claim: String,
    /// The comparison.
    pub matcher: Matcher,
    /// The task a matching caller gets.
    pub task: String,
}

impl Rule {
    /// Whether `claims` satisfy this rule.
    pub fn matches(&self, claims: &Map<String, Value>) -> bool {
        let Some(value) = claims.get(&self.claim) else {
            return false;
        };
        match (&self.matcher, value) {
            (Matcher::Equals(want) | Matcher::Contains(want), Value::String(have)) => have == want,
            (Matcher::Contains(want), Value::Array(items)) => items
                .iter()
                .any(|item| item.as_str() == Some(want.as_str())),
            _ => false,
        }
    }
}

/// The task of the first rule `claims` satisfy.
pub fn first_match<'a>(rules: &'a [Rule], claims: &Map<String, Value>) -> Option<&'a str> {
    rules
        .iter()
        .find(|rule| rule.matches(claims))
        .map(|rule| rule.task.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn first_matching_rule_decides() {
        let rule = |claim: &str, matcher: Matcher, task: &str| Rule {
            claim: claim.into(),
            matcher,
            task: task.into(),
        };
        let rules = [
            rule("email", Matcher::Equals("boss@example.com".into()), "all"),
            rule("groups", Matcher::Contains("team-a".into()), "a"),
            rule("groups", Matcher::Contains("team-b".into()), "b"),
        ];
        let claims = |v: Value| v.as_object().unwrap().clone();
        assert_eq!(
            first_match(&rules, &claims(json!({"groups": ["team-b", "team-a"]}))),
            Some("a")
        );
        assert_eq!(
            first_match(&rules, &claims(json!({"groups": "team-b"}))),
            Some("b")
        );
        assert_eq!(
            first_match(
                &rules,
                &claims(json!({"email": "boss@example.com", "groups": ["team-a"]}))
            ),
            Some("all")
        );
        assert_eq!(
            first_match(&rules, &claims(json!({"email": ["boss@example.com"]}))),
            None,
            "equals wants a string"
        );
        assert_eq!(
            first_match(&rules, &claims(json!({"groups": [1, "team-c"]}))),
            None
        );
        assert_eq!(first_match(&rules, &claims(json!({}))), None);
    }
}
