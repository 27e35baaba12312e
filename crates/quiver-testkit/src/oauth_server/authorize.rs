//! `/authorize`: checking an authorization request (PKCE S256, RFC 8707
//! `resource`), approving it at once or through the consent page, and
//! granting the code.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use url::Url;

use super::options::{Fault, MAX_ENTRIES, SCOPE, User};
use super::state::{AuthorizationRequest, Client, OAuthCaller, PendingCode, Shared, random_token};
use super::wire::{OAuthFailure, full, invalid_request, parse_params};

/// How long an authorization code can be exchanged.
pub(super) const CODE_TTL: Duration = Duration::from_secs(60);
/// Longest `nonce` an authorization request may carry, and `client_id`
/// `POST /admin/clients` may choose.
pub(super) const MAX_NONCE_LEN: usize = 512;

/// Whether `uri` is an http(s) URL on a loopback host.
pub(super) fn is_loopback_uri(uri: &str) -> bool {
    let Ok(url) = Url::parse(uri) else {
        return false;
    };
    if !matches!(url.scheme(), "http" | "https") {
        return false;
    }
    match url.host() {
        Some(url::Host::Domain(domain)) => domain == "localhost",
        Some(url::Host::Ipv4(addr)) => addr.is_loopback(),
        Some(url::Host::Ipv6(addr)) => addr.is_loopback(),
        None => false,
    }
}

/// `GET /authorize`: approves at once for the auto user, or shows the
/// consent page ([`OAuthServerOptions::consent_page`]).
pub(super) async fn authorize(
    State(shared): State<Arc<Shared>>,
    RawQuery(query): RawQuery,
) -> Result<Response, OAuthFailure> {
    let request = check_authorization(&shared, query.unwrap_or_default().as_bytes())?;
    if shared.consent_page {
        let id = random_token();
        let page = consent_page(&request, &id);
        shared
            .store()
            .hold_for_consent(id, request, Instant::now())?;
        return Ok(page);
    }
    let user = shared.store().auto_user.clone();
    grant_code(&shared, request, user)
}

/// `POST /authorize`: a consent page answered, with form fields `request`
/// (the page's id) and `user`.
pub(super) async fn approve(
    State(shared): State<Arc<Shared>>,
    body: Bytes,
) -> Result<Response, OAuthFailure> {
    let params = parse_params(&body)?;
    let Some(id) = params.get("request") else {
        return Err(invalid_request("request is missing"));
    };
    let Some(user) = params.get("user") else {
        return Err(invalid_request("user is missing"));
    };
    let user = User::new(user.as_str()).map_err(|err| invalid_request(err.to_string()))?;
    let Some(request) = shared.store().take_consent(id, Instant::now()) else {
        return Err(invalid_request(
            "request is unknown, already answered or expired",
        ));
    };
    grant_code(&shared, request, user)
}

/// The checks of an authorization request's query (RFC 6749 §4.1.1, RFC
/// 7636 §4.3, RFC 8707).
pub(super) fn check_authorization(
    shared: &Shared,
    query: &[u8],
) -> Result<AuthorizationRequest, OAuthFailure> {
    let params = parse_params(query)?;
    let param = |name: &str| params.get(name).map(String::as_str);
    if param("response_type") != Some("code") {
        return Err(invalid_request("response_type must be \"code\""));
    }
    let Some(client_id) = param("client_id") else {
        return Err(invalid_request("client_id is missing"));
    };
    let Some(redirect_uri) = param("redirect_uri") else {
        return Err(invalid_request("redirect_uri is missing"));
    };
    let Some(challenge) = param("code_challenge") else {
        return Err(invalid_request(
            "code_challenge is missing (PKCE is required)",
        ));
    };
    // RFC 7636 §4.2: S256 of a verifier is 43 base64url characters.
    if challenge.len() != 43 || URL_SAFE_NO_PAD.decode(challenge).is_err() {
        return Err(invalid_request(
            "code_challenge is not a base64url SHA-256 digest",
        ));
    }
    if param("code_challenge_method") != Some("S256") {
        return Err(invalid_request("code_challenge_method must be S256"));
    }
    if let Some(resource) = param("resource")
        && resource != shared.resource
    {
        return Err(invalid_request(format!(
            "resource {resource:?} is not this server's protected resource {:?}",
            shared.resource
        )));
    }
    let scope = param("scope")
        .map(str::trim)
        .filter(|scope| !scope.is_empty())
        .unwrap_or(SCOPE);
    let nonce = param("nonce");
    if nonce.is_some_and(|nonce| nonce.len() > MAX_NONCE_LEN) {
        return Err(invalid_request(format!(
            "nonce is longer than {MAX_NONCE_LEN} bytes"
        )));
    }
    if Url::parse(redirect_uri).is_err() {
        return Err(invalid_request("redirect_uri is not a URL"));
    }
    let allowed = match shared.store().clients.get(client_id) {
        None => {
            return Err(invalid_request(format!("unknown client {client_id:?}")));
        }
        Some(Client {
            redirect_uris: Some(uris),
            ..
        }) => uris.iter().any(|uri| uri == redirect_uri),
        Some(Client {
            redirect_uris: None,
            ..
        }) => is_loopback_uri(redirect_uri),
    };
    if !allowed {
        return Err(invalid_request(format!(
            "redirect_uri {redirect_uri:?} is not registered for this client"
        )));
    }
    Ok(AuthorizationRequest {
        client_id: client_id.to_owned(),
        redirect_uri: redirect_uri.to_owned(),
        challenge: challenge.to_owned(),
        scope: scope.to_owned(),
        nonce: nonce.map(str::to_owned),
        state: param("state").map(str::to_owned),
    })
}

/// Issues a code for `request`, granted by `user`: the redirect back to the
/// client with `code`, `state` and `iss`.
pub(super) fn grant_code(
    shared: &Shared,
    request: AuthorizationRequest,
    user: User,
) -> Result<Response, OAuthFailure> {
    let Ok(mut location) = Url::parse(&request.redirect_uri) else {
        return Err(invalid_request("redirect_uri is not a URL"));
    };
    let code = random_token();
    {
        let mut store = shared.store();
        let now = Instant::now();
        if store.codes.len() >= MAX_ENTRIES {
            store.codes.retain(|_, code| code.expires > now);
        }
        if store.codes.len() >= MAX_ENTRIES {
            return Err(full("authorization codes"));
        }
        store.codes.insert(
            code.clone(),
            PendingCode {
                caller: OAuthCaller {
                    client_id: request.client_id,
                    user,
                },
                redirect_uri: request.redirect_uri,
                challenge: request.challenge,
                scope: request.scope,
                nonce: request.nonce,
                expires: now + CODE_TTL,
            },
        );
    }
    let state = if shared.fault == Some(Fault::StateMismatch) {
        Some(random_token())
    } else {
        request.state
    };
    {
        let mut query = location.query_pairs_mut();
        query.append_pair("code", &code);
        if let Some(state) = &state {
            query.append_pair("state", state);
        }
        query.append_pair("iss", &shared.issuer);
    }
    let Ok(location) = HeaderValue::from_str(location.as_str()) else {
        return Err(invalid_request(
            "redirect_uri cannot be sent back in a header",
        ));
    };
    Ok((StatusCode::FOUND, [(header::LOCATION, location)]).into_response())
}

/// The consent page of a checked authorization request: a form posting
/// `request` (`id`) and `user` back to `/authorize`, submitted by the button
/// `approve`. No scripts; every value shown is escaped.
pub(super) fn consent_page(request: &AuthorizationRequest, id: &str) -> Response {
    let client = html_escape(&request.client_id);
    let scope = html_escape(&request.scope);
    let id = html_escape(id);
    let page = format!(
        r#"<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Authorize {client}</title></head>
<body>
<h1>Authorize {client}</h1>
<p>Scope: {scope}</p>
<form method="post" action="authorize">
<input type="hidden" name="request" value="{id}">
<label for="user">User</label>
<input type="text" id="user" name="user" autocomplete="username">
<button type="submit" id="approve">Approve</button>
</form>
</body>
</html>
"#
    );
    (
        [(header::CACHE_CONTROL, HeaderValue::from_static("no-store"))],
        Html(page),
    )
        .into_response()
}

/// `text` safe inside HTML text and double-quoted attributes.
pub(super) fn html_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            c => escaped.push(c),
        }
    }
    escaped
}
