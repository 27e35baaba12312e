//! People on the registry with the organisation's identity provider
//! (docs/reference.md §12.2): a JWT of one of the registry's identity
//! providers is a credential whose rules give registry roles, and the web
//! admin signs people in with the authorization-code flow (PKCE, public
//! client `web_client_id`) into a session cookie.
//!
//! Both cookies — the pending sign-in and the session — are sealed with the
//! registry's keyring (the OAuth one when configured, so every replica
//! reads them; else a key of this process), HttpOnly and Path=/. The
//! session cookie is SameSite=Strict, and a request it authenticates must
//! carry [`CSRF_HEADER`] unless it is a read: a form of another site can
//! set neither. The flow cookie is SameSite=Lax, since the identity
//! provider's redirect back is a cross-site navigation.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, Method, header};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::Utc;
use quiver_identity::{Identities, Provider, Verified};
use quiver_model::access::{AccessKind, AccessSpec, IdentityProviderRecord, Role, StoredAccess};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::auth::Role as AuthRole;
use crate::error::RegistryError;
use crate::head::HeadView;
use crate::oauth::seal::Keyring;

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "quiver_session";
/// The pending sign-in's cookie.
pub(crate) const FLOW_COOKIE: &str = "quiver_signin";
/// Where the web admin is served: sign-in ends there.
pub(crate) const WEB_ADMIN: &str = "/admin/";
/// The header a cookie-authenticated write must carry.
pub const CSRF_HEADER: &str = "x-quiver-csrf";
/// How long a session lasts; the roles are those of the sign-in.
pub const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);
/// How long a sign-in may take at the identity provider.
const FLOW_TTL: Duration = Duration::from_secs(600);
/// Bound on each call to the identity provider (discovery, token).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A sign-in under way, sealed into [`FLOW_COOKIE`].
#[derive(Serialize, Deserialize)]
struct Flow {
    provider: String,
    state: String,
    verifier: String,
    nonce: String,
    expires: i64,
}

/// A signed-in person, sealed into [`SESSION_COOKIE`].
#[derive(Serialize, Deserialize)]
struct Session {
    principal: String,
    roles: Vec<Role>,
    expires: i64,
}

/// Who a person's credential says they are.
pub struct Person {
    /// Their registry role.
    pub role: AuthRole,
    /// `oidc:<issuer>#<sub>`.
    pub principal: String,
}

/// The registry's identity providers and sign-in state; shared.
pub struct SignIn {
    identities: Identities,
    /// The provider records the identities were built from.
    built: Mutex<Vec<Arc<StoredAccess>>>,
    keyring: Keyring,
    http: reqwest::Client,
    callback_url: String,
    secure: bool,
}

impl SignIn {
    /// Sign-in with cookies sealed by `keyring` (`None`: a key of this
    /// process), coming back to `public_url`.
    pub fn new(keyring: Option<Keyring>, public_url: &str) -> Self {
        SignIn {
            identities: Identities::new(Vec::new()),
            built: Mutex::default(),
            keyring: keyring.unwrap_or_else(|| Keyring::ephemeral("signin")),
            http: reqwest::Client::builder()
                .timeout(CALL_TIMEOUT)
                .connect_timeout(CALL_TIMEOUT)
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap_or_default(),
            callback_url: format!("{}/admin/signin/callback", public_url.trim_end_matches('/')),
            secure: public_url.starts_with("https://"),
        }
    }

    /// Rebuilds the providers when the head's differ from the last build
    /// (keys already fetched are kept per issuer).
    fn follow(&self, head: &HeadView) {
        let records: Vec<Arc<StoredAccess>> = head
            .access_of(AccessKind::IdentityProvider)
            .cloned()
            .collect();
        let mut built = self.built.lock().unwrap_or_else(|p| p.into_inner());
        if *built == records {
            return;
        }
        let providers = records
            .iter()
            .enumerate()
            .filter_map(|(at, record)| match &record.spec {
                // The store checked the policies rules name.
                AccessSpec::IdentityProvider(provider) => Provider::new(at, provider, |_| true)
                    .inspect_err(|err| tracing::warn!(provider = %provider.name, error = %err, "identity provider left out"))
                    .ok(),
                _ => None,
            })
            .collect();
        self.identities.replace(providers);
        *built = records;
    }

    /// The person of a JWT bearer token of one of the registry's providers:
    /// `None` when no provider has its issuer.
    pub async fn bearer(
        &self,
        head: &HeadView,
        token: &str,
    ) -> Option<Result<Person, RegistryError>> {
        self.follow(head);
        match self.identities.verify(token).await {
            Ok(verified) => Some(person(&verified)),
            Err(quiver_identity::Refused::WrongIssuer) => None,
            Err(why) => {
                tracing::info!(reason = %why, "identity provider token refused");
                Some(Err(RegistryError::Unauthenticated))
            }
        }
    }

    /// Verifies a JWT of one of the registry's providers (explain).
    pub async fn verify(
        &self,
        head: &HeadView,
        token: &str,
    ) -> Result<Arc<Verified>, quiver_identity::Refused> {
        self.follow(head);
        self.identities.verify(token).await
    }

    /// The person of a session cookie value; `None` when it is not a live
    /// session of this registry.
    pub fn session(&self, value: &str) -> Option<Person> {
        let session: Session =
            serde_json::from_str(&self.keyring.open(SESSION_COOKIE, value).ok()?).ok()?;
        if session.expires <= Utc::now().timestamp() {
            return None;
        }
        Some(Person {
            role: strongest(&session.roles)?,
            principal: session.principal,
        })
    }

    /// Where the browser goes to sign in with `provider`, and the flow
    /// cookie to set.
    pub(crate) async fn start(
        &self,
        head: &HeadView,
        provider: &str,
    ) -> Result<(String, String), RegistryError> {
        let record = web_provider(head, provider)?;
        let client_id = record.web_client_id.clone().unwrap_or_default();
        let discovery = self.discover(&record.issuer).await?;
        let endpoint = endpoint(&discovery, "authorization_endpoint")?;
        let flow = Flow {
            provider: record.name.clone(),
            state: random(),
            verifier: random(),
            nonce: random(),
            expires: Utc::now().timestamp() + FLOW_TTL.as_secs() as i64,
        };
        let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(flow.verifier.as_bytes()));
        let mut url = endpoint;
        url.query_pairs_mut()
            .append_pair("response_type", "code")
            .append_pair("client_id", &client_id)
            .append_pair("redirect_uri", &self.callback_url)
            .append_pair("scope", "openid profile email")
            .append_pair("state", &flow.state)
            .append_pair("nonce", &flow.nonce)
            .append_pair("code_challenge", &challenge)
            .append_pair("code_challenge_method", "S256");
        let sealed = self.seal(FLOW_COOKIE, &flow)?;
        let cookie = format!(
            "{FLOW_COOKIE}={sealed}; Path=/admin/signin; Max-Age={}; HttpOnly; SameSite=Lax{}",
            FLOW_TTL.as_secs(),
            self.secure_attribute()
        );
        Ok((url.into(), cookie))
    }

    /// Finishes a sign-in: the session cookie's value.
    pub(crate) async fn finish(
        &self,
        head: &HeadView,
        flow_cookie: Option<String>,
        params: &CallbackParams,
    ) -> Result<String, String> {
        if let Some(error) = &params.error {
            return Err(format!("the identity provider refused: {error}"));
        }
        let flow: Flow = flow_cookie
            .and_then(|value| self.keyring.open(FLOW_COOKIE, &value).ok())
            .and_then(|text| serde_json::from_str(&text).ok())
            .ok_or("no sign-in is under way in this browser (or it expired): start again")?;
        if flow.expires <= Utc::now().timestamp() {
            return Err("the sign-in took too long: start again".into());
        }
        if params.state.as_deref() != Some(flow.state.as_str()) {
            return Err(
                "state mismatch: this answer is not for the sign-in of this browser".into(),
            );
        }
        let code = params.code.as_deref().ok_or("the answer carries no code")?;
        let record = web_provider(head, &flow.provider).map_err(|err| err.to_string())?;
        let discovery = self
            .discover(&record.issuer)
            .await
            .map_err(|err| err.to_string())?;
        let token_endpoint = endpoint(&discovery, "token_endpoint").map_err(|e| e.to_string())?;
        let client_id = record.web_client_id.clone().unwrap_or_default();
        let form: String = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("grant_type", "authorization_code")
            .append_pair("code", code)
            .append_pair("redirect_uri", &self.callback_url)
            .append_pair("client_id", &client_id)
            .append_pair("code_verifier", &flow.verifier)
            .finish();
        let url = token_endpoint.to_string();
        let answer = self
            .http
            .post(token_endpoint)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(form)
            .send()
            .await
            .map_err(|err| format!("token request failed: {err}"))?;
        let status = answer.status();
        let body = quiver_identity::jwks::read_json(answer, &url).await?;
        if !status.is_success() {
            return Err(format!(
                "the token endpoint answered {status}: {}",
                body["error"].as_str().unwrap_or("no error code")
            ));
        }
        let id_token = body["id_token"]
            .as_str()
            .ok_or("the token answer has no id_token (is openid a scope of the client?)")?;
        self.follow(head);
        let verified = self
            .identities
            .verify(id_token)
            .await
            .map_err(|why| format!("the id_token is refused: {why}"))?;
        // The signature is verified: the payload can be read for the nonce.
        if claim(id_token, "nonce").as_deref() != Some(flow.nonce.as_str()) {
            return Err("the id_token's nonce is not this sign-in's".into());
        }
        let person = person(&verified).map_err(|err| err.to_string())?;
        tracing::info!(
            target: "quiver::audit",
            action = "signin",
            principal = %person.principal,
            role = person.role.as_str(),
            "person signed in"
        );
        self.seal(
            SESSION_COOKIE,
            &Session {
                principal: person.principal,
                roles: verified.roles.clone(),
                expires: Utc::now().timestamp() + SESSION_TTL.as_secs() as i64,
            },
        )
        .map_err(|err| err.to_string())
    }

    async fn discover(&self, issuer: &str) -> Result<Value, RegistryError> {
        let url = format!(
            "{}/.well-known/openid-configuration",
            issuer.trim_end_matches('/')
        );
        quiver_identity::jwks::get_json(&self.http, &url)
            .await
            .map_err(|why| {
                RegistryError::Unavailable(format!("identity provider discovery: {why}"))
            })
    }

    fn seal<T: Serialize>(&self, binding: &str, value: &T) -> Result<String, RegistryError> {
        let text =
            serde_json::to_string(value).map_err(|err| RegistryError::Internal(err.to_string()))?;
        Ok(self.keyring.seal(binding, &text))
    }

    fn secure_attribute(&self) -> &'static str {
        if self.secure { "; Secure" } else { "" }
    }

    pub(crate) fn session_cookie(&self, value: &str, max_age: u64) -> String {
        format!(
            "{SESSION_COOKIE}={value}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Strict{}",
            self.secure_attribute()
        )
    }
}

/// The registry role of a verified person: the strongest of their roles.
fn person(verified: &Verified) -> Result<Person, RegistryError> {
    let role = strongest(&verified.roles).ok_or_else(|| {
        RegistryError::PermissionDenied(format!(
            "{} is authenticated by identity provider {}, but none of its rules gives a registry role",
            verified.principal, verified.provider
        ))
    })?;
    Ok(Person {
        role,
        principal: verified.principal.to_string(),
    })
}

/// The strongest of `roles` as a registry role: admin, then editor,
/// approver, viewer.
pub(crate) fn strongest(roles: &[Role]) -> Option<AuthRole> {
    [Role::Admin, Role::Editor, Role::Approver, Role::Viewer]
        .into_iter()
        .find(|role| roles.contains(role))
        .map(|role| match role {
            Role::Admin => AuthRole::Admin,
            Role::Editor => AuthRole::Editor,
            Role::Approver => AuthRole::Approver,
            Role::Viewer => AuthRole::Viewer,
        })
}

/// The provider `name` if people may sign in with it.
fn web_provider(head: &HeadView, name: &str) -> Result<IdentityProviderRecord, RegistryError> {
    match head
        .access_record(AccessKind::IdentityProvider, name)
        .map(|r| &r.spec)
    {
        Some(AccessSpec::IdentityProvider(provider)) if provider.web_client_id.is_some() => {
            Ok(provider.clone())
        }
        _ => Err(RegistryError::NotFound(format!(
            "no identity provider {name:?} people can sign in with (web_client_id)"
        ))),
    }
}

fn endpoint(discovery: &Value, field: &str) -> Result<url::Url, RegistryError> {
    let raw = discovery[field].as_str().unwrap_or_default();
    quiver_model::access::check_issuer_url(raw)
        .map_err(|why| RegistryError::Unavailable(format!("identity provider {field}: {why}")))
}

/// A claim of a JWT whose signature was verified.
fn claim(token: &str, name: &str) -> Option<String> {
    let payload = token.split('.').nth(1)?;
    let claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()?;
    claims[name].as_str().map(str::to_owned)
}

fn random() -> String {
    URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>())
}

/// The value of cookie `name` among the request's `Cookie` headers.
pub fn cookie_value(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.trim_matches('"').to_owned())
}

/// The person of a request's session cookie, if any; a write it
/// authenticates must carry [`CSRF_HEADER`].
pub fn session_person(
    signin: &SignIn,
    method: &Method,
    headers: &HeaderMap,
) -> Option<Result<Person, RegistryError>> {
    let person = signin.session(&cookie_value(headers, SESSION_COOKIE)?)?;
    let safe = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    if !safe && !headers.contains_key(CSRF_HEADER) {
        return Some(Err(RegistryError::PermissionDenied(format!(
            "a write authenticated by the session cookie must carry the {CSRF_HEADER} header"
        ))));
    }
    Some(Ok(person))
}

/// The query of the identity provider's redirect back.
#[derive(Debug, Deserialize)]
pub struct CallbackParams {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
}
