//! OAuth 2.1 for remote MCP servers (the MCP authorization spec), on rmcp's
//! `auth` module: discovery (protected-resource metadata from the
//! `WWW-Authenticate` challenge or the well-known paths, then the
//! authorization server's metadata with its OpenID fallbacks), client
//! registration (pre-registered, a client ID metadata document, or dynamic
//! registration, in that order), authorization code with PKCE (S256) and the
//! RFC 8707 `resource`, and the token exchange.
//!
//! Every step that fails says which one it was ([`OAuthError`]); nothing of
//! a failed attempt is kept. A re-authorization ([`reauthorize`]) asks for
//! the scopes granted before together with the newly challenged ones.

use rmcp::transport::AuthClient;
use rmcp::transport::auth::{
    AuthorizationCallback, AuthorizationManager, AuthorizationMetadata, AuthorizationRequest,
    AuthorizationSession,
};

/// How a client is known to the authorization server.
#[derive(Debug, Clone, Default)]
pub struct OAuthClient {
    /// A pre-registered client id (else a metadata document, else dynamic
    /// registration).
    pub client_id: Option<String>,
    /// Its secret, for confidential clients.
    pub client_secret: Option<String>,
    /// An HTTPS URL of a client ID metadata document, used when the
    /// authorization server supports them.
    pub client_metadata_url: Option<String>,
    /// Scopes to ask for; empty: what the challenge or the server's metadata
    /// suggests.
    pub scopes: Vec<String>,
    /// Where the authorization server redirects with the code.
    pub redirect_uri: String,
}

/// How the user's consent is obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consent {
    /// Visit the authorization URL and take the code from its redirect
    /// without a browser (for authorization servers that approve at once).
    Automatic,
    /// Print the authorization URL and read the URL the browser was
    /// redirected to from standard input.
    Interactive,
}

/// A failed step of the authorization.
#[derive(Debug, thiserror::Error)]
pub enum OAuthError {
    /// Metadata discovery or client registration failed.
    #[error("oauth discovery/registration: {0}")]
    Discovery(String),
    /// The authorization URL could not be visited or gave no code.
    #[error("oauth authorization: {0}")]
    Authorization(String),
    /// The code could not be exchanged for a token (or the state did not match).
    #[error("oauth token exchange: {0}")]
    Exchange(String),
}

/// Authorizes against the server at `server_url`, starting from its
/// `challenge` (`WWW-Authenticate` of a 401 or 403) when there is one, and
/// returns an HTTP client that sends (and refreshes) the access token.
pub async fn authorize(
    server_url: &str,
    challenge: Option<&str>,
    client: &OAuthClient,
    consent: Consent,
    http: reqwest::Client,
) -> Result<AuthClient<reqwest::Client>, OAuthError> {
    authorize_after(server_url, challenge, None, client, consent, http).await
}

/// Authorizes again after a request with the token of `previous` was
/// answered with `challenge` (a 403 `insufficient_scope`, or a 401): asks
/// for the scopes `previous` was granted together with those the challenge
/// names (SEP-2350), so a step-up keeps what the earlier requests needed.
pub async fn reauthorize(
    server_url: &str,
    challenge: &str,
    previous: &AuthClient<reqwest::Client>,
    client: &OAuthClient,
    consent: Consent,
    http: reqwest::Client,
) -> Result<AuthClient<reqwest::Client>, OAuthError> {
    let granted = previous
        .auth_manager
        .lock()
        .await
        .get_current_scopes()
        .await;
    authorize_after(
        server_url,
        Some(challenge),
        Some(&granted),
        client,
        consent,
        http,
    )
    .await
}

/// [`authorize`], or [`reauthorize`] when `granted` holds the scopes of the
/// grant being replaced.
async fn authorize_after(
    server_url: &str,
    challenge: Option<&str>,
    granted: Option<&[String]>,
    client: &OAuthClient,
    consent: Consent,
    http: reqwest::Client,
) -> Result<AuthClient<reqwest::Client>, OAuthError> {
    let discovery = |err: rmcp::transport::auth::AuthError| OAuthError::Discovery(err.to_string());
    let mut manager = AuthorizationManager::new(server_url)
        .await
        .map_err(discovery)?;
    manager.with_client(http.clone()).map_err(discovery)?;
    let resolution = manager
        .resolve_metadata_from_challenge(challenge)
        .await
        .map_err(discovery)?;
    // The 2025-03-26 fallback (no metadata at all: endpoints made up from
    // the URL) predates the PKCE rule; published metadata must follow it.
    if resolution.source.is_discovered() {
        require_pkce(&resolution.metadata).map_err(OAuthError::Discovery)?;
    }
    manager.set_metadata(resolution.metadata);
    let scopes = match granted {
        None => client.scopes.clone(),
        // What this challenge alone would ask for: its `scope`, else the
        // resource's `scopes_supported`.
        Some(granted) => {
            let challenged = manager.select_initial_scopes(&[]).await;
            union_of_scopes([granted, &client.scopes, &challenged])
        }
    };
    let mut request = AuthorizationRequest::new(client.redirect_uri.clone())
        .with_client_name("quiver")
        .with_scopes(scopes.iter().cloned());
    if scopes.is_empty() {
        request = request.with_initial_scope_selection();
    }
    if let Some(id) = &client.client_id {
        request = request.with_preregistered_client(id.clone());
    }
    if let Some(secret) = &client.client_secret {
        request = request.with_client_secret(secret.clone());
    }
    if let Some(url) = &client.client_metadata_url {
        request = request.with_client_metadata_url(url.clone());
    }
    if let Some(challenge) = challenge {
        request = request.with_challenge(challenge);
    }
    let session = AuthorizationSession::new(manager, request)
        .await
        .map_err(|(_, err)| discovery(err))?;
    let callback = match consent {
        Consent::Automatic => follow_authorization(&http, &session.auth_url).await?,
        Consent::Interactive => ask_for_redirect(&session.auth_url).await?,
    };
    session
        .handle_callback_with_issuer(
            &callback.code,
            &callback.csrf_token,
            callback.issuer.as_deref(),
        )
        .await
        .map_err(|err| OAuthError::Exchange(err.to_string()))?;
    Ok(AuthClient::new(http, session.auth_manager))
}

/// Every scope of `lists` once, in the order first seen.
fn union_of_scopes<'a>(lists: impl IntoIterator<Item = &'a [String]>) -> Vec<String> {
    let mut union: Vec<String> = Vec::new();
    for scope in lists.into_iter().flatten() {
        if !union.contains(scope) {
            union.push(scope.clone());
        }
    }
    union
}

/// The MCP authorization rule on PKCE: an authorization server whose
/// metadata does not list `S256` in `code_challenge_methods_supported` does
/// not support PKCE, and a client must not proceed. (rmcp only refuses a
/// list without S256, and proceeds when the field is absent.)
pub fn require_pkce(metadata: &AuthorizationMetadata) -> Result<(), String> {
    let s256 = metadata
        .code_challenge_methods_supported
        .as_ref()
        .is_some_and(|methods| methods.iter().any(|method| method == "S256"));
    if s256 {
        Ok(())
    } else {
        Err(
            "the authorization server does not advertise PKCE with S256 (code_challenge_methods_supported)"
                .to_owned(),
        )
    }
}

/// Visits the authorization URL without following its redirect: the
/// redirect's `Location` carries the code.
async fn follow_authorization(
    http: &reqwest::Client,
    url: &str,
) -> Result<AuthorizationCallback, OAuthError> {
    let failed = |what: String| OAuthError::Authorization(what);
    let response = http
        .get(url)
        .send()
        .await
        .map_err(|err| failed(format!("GET the authorization URL: {err}")))?;
    let status = response.status();
    let location = response
        .headers()
        .get(reqwest::header::LOCATION)
        .and_then(|value| value.to_str().ok())
        .ok_or_else(|| {
            failed(format!(
                "the authorization URL answered {status} without a redirect (it needs a person: run without --oauth-auto-authorize)"
            ))
        })?;
    AuthorizationCallback::from_redirect_url(location)
        .map_err(|err| failed(format!("the redirect carries no code: {err}")))
}

/// Prints the authorization URL and reads back where the browser landed.
async fn ask_for_redirect(url: &str) -> Result<AuthorizationCallback, OAuthError> {
    eprintln!("Open this URL, approve, then paste the URL your browser was sent to:\n{url}");
    let line = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await
    .map_err(|err| OAuthError::Authorization(err.to_string()))?
    .map_err(|err| OAuthError::Authorization(format!("reading the redirect URL: {err}")))?;
    AuthorizationCallback::from_redirect_url(line.trim())
        .map_err(|err| OAuthError::Authorization(format!("the pasted URL carries no code: {err}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scopes(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn a_step_up_asks_for_the_granted_scopes_and_the_challenged_ones() {
        let granted = scopes("mcp:basic offline_access");
        let challenged = scopes("mcp:write mcp:basic");
        assert_eq!(
            union_of_scopes([&granted[..], &[], &challenged]),
            scopes("mcp:basic offline_access mcp:write")
        );
        let explicit = scopes("mcp:read");
        assert_eq!(
            union_of_scopes([&[][..], &explicit, &challenged]),
            scopes("mcp:read mcp:write mcp:basic")
        );
    }
}
