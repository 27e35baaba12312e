//! Masking of literal secrets for reads without the admin credential (docs/reference.md §12),
//! and their redaction from text that may quote them (errors, stderr).
//!
//! References such as `${ENV:TOKEN}` are not secrets and stay visible; any
//! env or header value without a reference is treated as a literal secret,
//! and so are the userinfo (`user:pass@`) of `http.url` and the values of its
//! query parameters whose names say they hold credentials (`api_key=`,
//! `token=`, `sig=` …, see [`is_secret_parameter`]).

use std::collections::BTreeMap;

use crate::env_ref::Template;
use crate::error::{FieldError, ModelError};
use crate::record::McpServerSpec;

/// What a masked value reads as.
pub const MASK: &str = "********";

/// Secrets shorter than this are not redacted from text: replacing every
/// `1` or `on` in an error message would hide the message, not a secret.
const MIN_REDACTED_LEN: usize = 4;

/// Query parameter names (lowercase, without `-`, `_` and `.`) whose values
/// are credentials.
const SECRET_PARAMETERS: &[&str] = &[
    "key",
    "apikey",
    "token",
    "accesstoken",
    "refreshtoken",
    "idtoken",
    "authtoken",
    "secret",
    "clientsecret",
    "password",
    "passwd",
    "pwd",
    "pass",
    "sig",
    "signature",
    "auth",
    "authorization",
    "credential",
    "credentials",
    "session",
    "sessionid",
    "jwt",
    "code",
];

/// Endings of parameter names (normalised as in [`SECRET_PARAMETERS`]) that
/// make them credentials too (`x-api-key`, `github_token`, `X-Amz-Signature`).
const SECRET_SUFFIXES: &[&str] = &["key", "token", "secret", "password", "signature"];

/// Whether a URL query parameter of this name holds a credential, so its
/// value is masked and redacted like a header value.
pub fn is_secret_parameter(name: &str) -> bool {
    let normalised: String = name
        .chars()
        .filter(|c| !matches!(c, '-' | '_' | '.'))
        .flat_map(char::to_lowercase)
        .collect();
    SECRET_PARAMETERS.contains(&normalised.as_str())
        || SECRET_SUFFIXES.iter().any(|s| normalised.ends_with(s))
}

/// Whether a value is a literal, i.e. a secret to mask. A malformed template
/// cannot be stored (validation), but if one is, masking it is the safe side.
fn is_literal(value: &str) -> bool {
    !value.is_empty() && Template::parse(value).map_or(true, |t| t.is_literal())
}

fn mask_values(values: &mut BTreeMap<String, String>) {
    for value in values.values_mut() {
        if is_literal(value) {
            *value = MASK.to_owned();
        }
    }
}

/// A URL split into the parts that may hold secrets; the other parts are
/// kept byte for byte, so masking changes nothing else.
#[derive(Debug, Clone, PartialEq, Eq)]
struct UrlParts<'a> {
    /// `scheme://`.
    scheme: &'a str,
    /// The userinfo before `@`: user and, after `:`, password.
    user: Option<&'a str>,
    password: Option<&'a str>,
    /// Host, port and path.
    location: &'a str,
    /// `name=value` pairs of the query (after `?`), in order; a pair
    /// without `=` has no value.
    query: Option<Vec<(&'a str, Option<&'a str>)>>,
    /// `#…` and everything after it.
    fragment: &'a str,
}

impl<'a> UrlParts<'a> {
    /// Splits `url` (`scheme://[user[:password]@]location[?query][#fragment]`);
    /// `None` when it has no `://`.
    fn split(url: &'a str) -> Option<Self> {
        let scheme_end = url.find("://")? + 3;
        let (body, fragment) = url.split_at(url.find('#').unwrap_or(url.len()));
        let rest = body.get(scheme_end..)?;
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (user, password, rest) = match rest[..authority_end].rfind('@') {
            Some(at) => {
                let userinfo = &rest[..at];
                let (user, password) = match userinfo.split_once(':') {
                    Some((user, password)) => (user, Some(password)),
                    None => (userinfo, None),
                };
                (Some(user), password, &rest[at + 1..])
            }
            None => (None, None, rest),
        };
        let (location, query) = match rest.split_once('?') {
            Some((location, query)) => (location, Some(query)),
            None => (rest, None),
        };
        let query = query.map(|query| {
            query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name, value)) => (name, Some(value)),
                    None => (pair, None),
                })
                .collect()
        });
        Some(UrlParts {
            scheme: &url[..scheme_end],
            user,
            password,
            location,
            query,
            fragment,
        })
    }

    /// The URL with `user`, `password` and secret query values replaced by
    /// what `replace` returns for them (it gets the value and, for query
    /// values, the parameter's name and its occurrence index among the
    /// parameters of that name).
    fn rebuild(&self, mut replace: impl FnMut(Secret<'a>) -> Option<String>) -> String {
        let mut url = self.scheme.to_owned();
        if let Some(user) = self.user {
            url.push_str(&replace(Secret::User(user)).unwrap_or_else(|| user.to_owned()));
            if let Some(password) = self.password {
                url.push(':');
                url.push_str(
                    &replace(Secret::Password(password)).unwrap_or_else(|| password.to_owned()),
                );
            }
            url.push('@');
        }
        url.push_str(self.location);
        if let Some(query) = &self.query {
            url.push('?');
            let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
            for (i, (name, value)) in query.iter().enumerate() {
                if i > 0 {
                    url.push('&');
                }
                url.push_str(name);
                let occurrence = seen.entry(name).or_default();
                if let Some(value) = value {
                    url.push('=');
                    let replaced = is_secret_parameter(name)
                        .then(|| {
                            replace(Secret::Parameter {
                                name,
                                occurrence: *occurrence,
                                value,
                            })
                        })
                        .flatten();
                    url.push_str(replaced.as_deref().unwrap_or(value));
                }
                *occurrence += 1;
            }
        }
        url.push_str(self.fragment);
        url
    }

    /// The secret values of the URL (userinfo, secret query values).
    fn secrets(&self) -> Vec<&'a str> {
        let parameters = self
            .query
            .iter()
            .flatten()
            .filter_map(|(name, value)| value.filter(|_| is_secret_parameter(name)));
        self.user
            .into_iter()
            .chain(self.password)
            .chain(parameters)
            .filter(|value| is_literal(value))
            .collect()
    }

    /// The value of the `occurrence`-th query parameter called `name`.
    fn parameter(&self, name: &str, occurrence: usize) -> Option<&'a str> {
        self.query
            .iter()
            .flatten()
            .filter(|(n, _)| *n == name)
            .nth(occurrence)
            .and_then(|(_, value)| *value)
    }
}

/// One secret part of a URL ([`UrlParts::rebuild`]).
#[derive(Debug, Clone, Copy)]
enum Secret<'a> {
    User(&'a str),
    Password(&'a str),
    Parameter {
        name: &'a str,
        occurrence: usize,
        value: &'a str,
    },
}

impl<'a> Secret<'a> {
    fn value(self) -> &'a str {
        match self {
            Secret::User(value) | Secret::Password(value) | Secret::Parameter { value, .. } => {
                value
            }
        }
    }
}

/// `url` with its userinfo and the values of its secret query parameters
/// masked (see the module documentation); anything that is not a
/// `scheme://` URL is returned as it is. For logs and error messages.
pub fn redact_url(url: &str) -> String {
    match UrlParts::split(url) {
        Some(parts) => parts.rebuild(|secret| is_literal(secret.value()).then(|| MASK.to_owned())),
        None => url.to_owned(),
    }
}

/// `text` with every URL in it passed through [`redact_url`]. A URL runs
/// from its `scheme://` to the next whitespace, quote or bracket.
pub fn redact_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(found) = rest.find("://") {
        let is_scheme_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.');
        let start = rest[..found]
            .char_indices()
            .rev()
            .take_while(|(_, c)| is_scheme_char(*c))
            .last()
            .map_or(found, |(i, _)| i);
        let end = rest[found..]
            .find(|c: char| c.is_whitespace() || "\"'<>()[]{}|`".contains(c))
            .map_or(rest.len(), |i| found + i);
        out.push_str(&rest[..start]);
        out.push_str(&redact_url(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Decodes `%XX` escapes and `+` as a query string would.
fn percent_decoded(value: &str) -> String {
    url::form_urlencoded::parse(format!("v={value}").as_bytes())
        .next()
        .map(|(_, decoded)| decoded.into_owned())
        .unwrap_or_default()
}

/// Puts the stored value back for every value that is exactly [`MASK`];
/// names each key that has no stored value to keep.
fn restore_values(
    table: &str,
    values: &mut BTreeMap<String, String>,
    stored: Option<&BTreeMap<String, String>>,
    server_id: &str,
    errors: &mut Vec<FieldError>,
) {
    for (key, value) in values.iter_mut().filter(|(_, value)| *value == MASK) {
        match stored.and_then(|stored| stored.get(key)) {
            Some(kept) => kept.clone_into(value),
            None => errors.push(FieldError::new(
                format!("{table}.{key}"),
                format!(
                    "is the mask {MASK:?}, which keeps the stored value, but mcp server {server_id:?} has no stored {table}.{key}; enter the value itself"
                ),
            )),
        }
    }
}

/// `url` with every secret part that is exactly [`MASK`] replaced by the
/// same part of `stored` (the user, the password, the same occurrence of the
/// same query parameter); `None` when nothing is masked. Names the parts
/// `stored` lacks in `errors` (field `http.url`).
fn restore_url(
    url: &str,
    stored: Option<&str>,
    server_id: &str,
    errors: &mut Vec<FieldError>,
) -> Option<String> {
    let parts = UrlParts::split(url)?;
    let stored = stored.and_then(UrlParts::split);
    let mut masked = false;
    let restored = parts.rebuild(|secret| {
        if secret.value() != MASK {
            return None;
        }
        masked = true;
        let (kept, what) = match secret {
            Secret::User(_) => (stored.as_ref().and_then(|s| s.user), "user".to_owned()),
            Secret::Password(_) => (
                stored.as_ref().and_then(|s| s.password),
                "password".to_owned(),
            ),
            Secret::Parameter {
                name, occurrence, ..
            } => (
                stored.as_ref().and_then(|s| s.parameter(name, occurrence)),
                format!("query parameter {name:?}"),
            ),
        };
        match kept.filter(|kept| !kept.is_empty() && *kept != MASK) {
            Some(kept) => Some(kept.to_owned()),
            None => {
                errors.push(FieldError::new(
                    "http.url",
                    format!(
                        "the {what} is the mask {MASK:?}, which keeps the stored value, but mcp server {server_id:?} has no stored {what} in its URL; enter the value itself"
                    ),
                ));
                None
            }
        }
    });
    masked.then_some(restored)
}

impl McpServerSpec {
    /// A copy with literal env and header values and the secret parts of
    /// the URL replaced by [`MASK`].
    pub fn masked(&self) -> McpServerSpec {
        let mut spec = self.clone();
        if let Some(stdio) = &mut spec.stdio {
            mask_values(&mut stdio.env);
        }
        if let Some(http) = &mut spec.http {
            mask_values(&mut http.headers);
            http.url = redact_url(&http.url);
        }
        spec
    }

    /// Whether any env or header value, or a secret part of the URL, is
    /// exactly [`MASK`].
    pub fn has_masked_values(&self) -> bool {
        let env = self.stdio.iter().flat_map(|stdio| stdio.env.values());
        let headers = self.http.iter().flat_map(|http| http.headers.values());
        let url = self.http.iter().any(|http| {
            let mut masked = false;
            if let Some(parts) = UrlParts::split(&http.url) {
                parts.rebuild(|secret| {
                    masked |= secret.value() == MASK;
                    None
                });
            }
            masked
        });
        url || env.chain(headers).any(|value| value == MASK)
    }

    /// The literal secrets of the record: env and header values (and the
    /// credential after a header's scheme, `Bearer <credential>`), and the
    /// secret parts of the URL, raw and percent-decoded.
    fn secrets(&self) -> Vec<String> {
        let mut secrets = Vec::new();
        let env = self.stdio.iter().flat_map(|stdio| stdio.env.values());
        let headers = self.http.iter().flat_map(|http| http.headers.values());
        for value in env.chain(headers).filter(|value| is_literal(value)) {
            secrets.push(value.clone());
            if let Some((_, credential)) = value.trim().rsplit_once(' ') {
                secrets.push(credential.to_owned());
            }
        }
        if let Some(parts) = self.http.as_ref().and_then(|h| UrlParts::split(&h.url)) {
            for secret in parts.secrets() {
                secrets.push(secret.to_owned());
                secrets.push(percent_decoded(secret));
            }
        }
        secrets.retain(|secret| secret.len() >= MIN_REDACTED_LEN && secret != MASK);
        // Longest first, so a secret containing another is replaced whole.
        secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        secrets.dedup();
        secrets
    }

    /// `text` (an error message, a server's stderr) with this record's
    /// literal secrets replaced by [`MASK`], and the userinfo and secret
    /// query values of any URL in it masked ([`redact_url`]). Secrets
    /// shorter than 4 bytes are left alone: they cannot be told apart from
    /// ordinary words.
    pub fn redact(&self, text: &str) -> String {
        let mut redacted = redact_urls(text);
        for secret in self.secrets() {
            if redacted.contains(&secret) {
                redacted = redacted.replace(&secret, MASK);
            }
        }
        redacted
    }

    /// The inverse of [`McpServerSpec::masked`] for a record sent back by a
    /// client that only ever saw masked values: every `stdio.env` /
    /// `http.headers` value that is exactly [`MASK`] takes the value `stored`
    /// (the current record with the same id, `None` when there is none) has
    /// for the same key. Masked values stay masked unless changed, so the
    /// mask itself can never be stored as a value.
    ///
    /// Fails, naming every such field, when a masked key has no stored value
    /// (a new record, a new key, or a table the stored record lacks); the
    /// record is left partly restored then and must not be used.
    pub fn restore_masked(&mut self, stored: Option<&McpServerSpec>) -> Result<(), ModelError> {
        let mut errors = Vec::new();
        if let Some(stdio) = &mut self.stdio {
            let kept = stored.and_then(|s| s.stdio.as_ref()).map(|s| &s.env);
            restore_values(
                "stdio.env",
                &mut stdio.env,
                kept,
                &self.server_id,
                &mut errors,
            );
        }
        if let Some(http) = &mut self.http {
            let kept = stored.and_then(|s| s.http.as_ref());
            restore_values(
                "http.headers",
                &mut http.headers,
                kept.map(|h| &h.headers),
                &self.server_id,
                &mut errors,
            );
            if let Some(url) = restore_url(
                &http.url,
                kept.map(|h| h.url.as_str()),
                &self.server_id,
                &mut errors,
            ) {
                http.url = url;
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ModelError::Invalid(errors))
        }
    }
}

impl McpServerSpec {
    /// Whether this record's values go where `stored`'s go: the same
    /// transport, the same stdio command, arguments and directory (the
    /// process its environment is given to), the same HTTP origin (where
    /// its headers and URL are sent). A stored secret kept through a masked
    /// value by someone who may not read it must not be sent elsewhere.
    pub fn same_destination(&self, stored: &McpServerSpec) -> bool {
        let stdio = match (&self.stdio, &stored.stdio) {
            (Some(a), Some(b)) => a.command == b.command && a.args == b.args && a.cwd == b.cwd,
            (None, None) => true,
            _ => false,
        };
        let origin = |url: &str| url::Url::parse(url).ok().map(|url| url.origin());
        let http = match (&self.http, &stored.http) {
            (Some(a), Some(b)) => origin(&a.url).is_some() && origin(&a.url) == origin(&b.url),
            (None, None) => true,
            _ => false,
        };
        self.transport == stored.transport && stdio && http
    }
}

#[cfg(test)]
mod tests {
    use crate::record::{HttpConfig, McpServerSpec, StdioConfig, Transport};

    #[test]
    fn a_destination_is_the_command_or_the_origin() {
        let mut stdio = McpServerSpec::new("s", Transport::Stdio);
        stdio.stdio = Some(StdioConfig {
            command: "server".into(),
            ..Default::default()
        });
        let mut other = stdio.clone();
        assert!(other.same_destination(&stdio));
        other
            .stdio
            .as_mut()
            .unwrap()
            .args
            .push("--exfiltrate".into());
        assert!(!other.same_destination(&stdio));

        let mut http = McpServerSpec::new("h", Transport::StreamableHttp);
        http.http = Some(HttpConfig {
            url: "https://mcp.example.com/a".into(),
            ..Default::default()
        });
        let mut moved = http.clone();
        moved.http.as_mut().unwrap().url = "https://mcp.example.com/b?x=1".into();
        assert!(moved.same_destination(&http), "same origin");
        moved.http.as_mut().unwrap().url = "https://attacker.example/a".into();
        assert!(!moved.same_destination(&http));
        assert!(!stdio.same_destination(&http));
    }

    #[test]
    fn literals_are_masked_references_are_not() {
        let mut spec = McpServerSpec::new("s", Transport::Stdio);
        spec.stdio = Some(StdioConfig {
            command: "x".into(),
            env: [
                ("API_KEY".to_owned(), "sk-live-123".to_owned()),
                ("TOKEN".to_owned(), "${ENV:TOKEN}".to_owned()),
                ("EMPTY".to_owned(), String::new()),
            ]
            .into(),
            ..Default::default()
        });
        let masked = spec.masked();
        let env = &masked.stdio.as_ref().unwrap().env;
        assert_eq!(env["API_KEY"], super::MASK);
        assert_eq!(env["TOKEN"], "${ENV:TOKEN}");
        assert_eq!(env["EMPTY"], "");

        let mut http = McpServerSpec::new("h", Transport::StreamableHttp);
        http.http = Some(HttpConfig {
            url: "https://x".into(),
            headers: [
                ("Authorization".to_owned(), "Bearer ${ENV:T}".to_owned()),
                ("X-Key".to_owned(), "abc".to_owned()),
            ]
            .into(),
            auth_ref: None,
        });
        let headers = http.masked().http.unwrap().headers;
        assert_eq!(headers["Authorization"], "Bearer ${ENV:T}");
        assert_eq!(headers["X-Key"], super::MASK);
    }

    #[test]
    fn masked_values_are_restored_from_the_stored_record() {
        let mut stored = McpServerSpec::new("s", Transport::Stdio);
        stored.stdio = Some(StdioConfig {
            command: "x".into(),
            env: [
                ("API_KEY".to_owned(), "sk-live-123".to_owned()),
                ("TOKEN".to_owned(), "${ENV:TOKEN}".to_owned()),
            ]
            .into(),
            ..Default::default()
        });
        let mut sent = stored.masked();
        assert!(sent.has_masked_values());
        sent.restore_masked(Some(&stored)).unwrap();
        assert_eq!(sent, stored);
        assert!(!sent.has_masked_values());

        let mut new_key = stored.masked();
        let env = &mut new_key.stdio.as_mut().unwrap().env;
        env.insert("OTHER".into(), super::MASK.into());
        env.insert("CHANGED".into(), "typed".into());
        let err = new_key.restore_masked(Some(&stored)).unwrap_err();
        assert_eq!(err.field(), Some("stdio.env.OTHER"));
        assert_eq!(err.field_errors().len(), 1);

        let mut http = McpServerSpec::new("s", Transport::StreamableHttp);
        http.http = Some(HttpConfig {
            url: "https://x".into(),
            headers: [("X-Key".to_owned(), super::MASK.to_owned())].into(),
            auth_ref: None,
        });
        // The stored record is stdio: it has no headers to keep.
        let err = http.clone().restore_masked(Some(&stored)).unwrap_err();
        assert_eq!(err.field(), Some("http.headers.X-Key"));
        let err = http.restore_masked(None).unwrap_err();
        assert!(err.to_string().contains("enter the value"), "{err}");
    }

    fn http_spec(url: &str, headers: &[(&str, &str)]) -> McpServerSpec {
        let mut spec = McpServerSpec::new("h", Transport::StreamableHttp);
        spec.http = Some(HttpConfig {
            url: url.into(),
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            auth_ref: None,
        });
        spec
    }

    #[test]
    fn url_secrets_are_masked_and_the_rest_kept_byte_for_byte() {
        let m = super::MASK;
        for (url, masked) in [
            (
                "https://mcp.example/mcp",
                "https://mcp.example/mcp".to_owned(),
            ),
            (
                "https://u:p%40ss@mcp.example:8443/a/b?api_key=k1&x=1&Token=t#frag?token=no",
                format!(
                    "https://{m}:{m}@mcp.example:8443/a/b?api_key={m}&x=1&Token={m}#frag?token=no"
                ),
            ),
            (
                "http://tok@h/?X-Amz-Signature=abc&X-Amz-Date=2026&sig=&flag",
                format!("http://{m}@h/?X-Amz-Signature={m}&X-Amz-Date=2026&sig=&flag"),
            ),
            (
                "https://h/p?github_token=${ENV:GH}&client_secret=s",
                format!("https://h/p?github_token=${{ENV:GH}}&client_secret={m}"),
            ),
            ("https://h@x/p@q?a=b", format!("https://{m}@x/p@q?a=b")),
            ("not a url", "not a url".to_owned()),
        ] {
            assert_eq!(super::redact_url(url), masked, "{url}");
            let spec = http_spec(url, &[]);
            assert_eq!(spec.masked().http.unwrap().url, masked, "{url}");
        }
        for name in [
            "api_key",
            "X-API-Key",
            "access_token",
            "password",
            "sig",
            "key",
        ] {
            assert!(super::is_secret_parameter(name), "{name}");
        }
        for name in ["region", "page", "limit", "format"] {
            assert!(!super::is_secret_parameter(name), "{name}");
        }
    }

    #[test]
    fn masked_url_parts_are_restored_from_the_stored_url() {
        let stored = http_spec("https://u:pw@h/mcp?api_key=k1&api_key=k2&x=1", &[]);
        let mut sent = stored.masked();
        assert!(sent.has_masked_values());
        // The admin edits a harmless part around the masks.
        let url = &mut sent.http.as_mut().unwrap().url;
        *url = url.replace("x=1", "x=2");
        sent.restore_masked(Some(&stored)).unwrap();
        assert_eq!(
            sent.http.as_ref().unwrap().url,
            "https://u:pw@h/mcp?api_key=k1&api_key=k2&x=2"
        );
        assert!(!sent.has_masked_values());

        // A mask where the stored URL has nothing to keep is an error.
        let m = super::MASK;
        let no_userinfo = http_spec("https://h/mcp", &[]);
        for (url, stored) in [
            (format!("https://h/mcp?token={m}"), &stored),
            (format!("https://{m}@h/mcp"), &no_userinfo),
            (format!("https://u:{m}@h/mcp"), &no_userinfo),
            (
                format!("https://u:pw@h/mcp?api_key=k1&api_key=k2&api_key={m}"),
                &stored,
            ),
        ] {
            let mut sent = http_spec(&url, &[]);
            let err = sent.restore_masked(Some(stored)).unwrap_err();
            assert_eq!(err.field(), Some("http.url"), "{url}");
            assert!(err.to_string().contains("enter the value"), "{err}");
        }
    }

    #[test]
    fn redact_removes_the_records_secrets_from_text() {
        let mut spec = http_spec(
            "https://svc:pw-in-url@h/mcp?api_key=k%2Fslash&page=2",
            &[
                ("Authorization", "Bearer sk-header-1"),
                ("X-Ref", "${ENV:REF}"),
            ],
        );
        let text = "401 from https://svc:pw-in-url@h/mcp?api_key=k%2Fslash&page=2 \
                    (key k/slash, sent Bearer sk-header-1); token sk-header-1; ${ENV:REF}; \
                    other https://h2/x?token=elsewhere&q=1";
        let redacted = spec.redact(text);
        for secret in [
            "pw-in-url",
            "k%2Fslash",
            "k/slash",
            "sk-header-1",
            "elsewhere",
            "svc:",
        ] {
            assert!(!redacted.contains(secret), "{secret} in {redacted}");
        }
        for kept in ["page=2", "${ENV:REF}", "q=1", "401 from https://"] {
            assert!(redacted.contains(kept), "{kept} not in {redacted}");
        }

        // Env values of a stdio record; values too short to tell apart stay.
        spec = McpServerSpec::new("s", Transport::Stdio);
        spec.stdio = Some(StdioConfig {
            command: "x".into(),
            env: [
                ("API_KEY".to_owned(), "sk-live-123".to_owned()),
                ("DEBUG".to_owned(), "1".to_owned()),
            ]
            .into(),
            ..Default::default()
        });
        assert_eq!(
            spec.redact("starting with sk-live-123, debug 1"),
            format!("starting with {}, debug 1", super::MASK)
        );
    }
}
