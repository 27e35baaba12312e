//! Every HTTP request of the OAuth broker (discovery, client registration,
//! token exchange, refresh, client credentials) under the registry's egress
//! allowlist, the same rule its tool preview applies (`--egress-allow-host`
//! / `--egress-allow-cidr`, [`quiver_mcp::egress`]).
//!
//! Without an allowlist the broker keeps rmcp's own client, which refuses
//! link-local and reserved addresses and loopback unless the server's URL
//! is loopback. With one, [`EgressOAuthClient`] checks each request's URL
//! (and each redirect's) before connecting, and a host allowed through the
//! CIDRs is connected to at the addresses that were checked.

use std::time::Duration;

use oauth2::http;
use quiver_mcp::egress::EgressPolicy;
use rmcp::transport::auth::{
    OAuthHttpClient, OAuthHttpClientError, OAuthHttpClientFuture, OAuthHttpRedirectPolicy,
    OAuthHttpRequest,
};

/// Largest response body of one OAuth request (metadata, registration,
/// token responses are small).
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Most redirects one request follows (discovery only; token requests
/// follow none).
const MAX_REDIRECTS: usize = 5;

/// An [`OAuthHttpClient`] that asks the egress allowlist before every
/// connection.
pub struct EgressOAuthClient {
    egress: EgressPolicy,
    base: reqwest::Client,
}

fn boxed(message: String) -> OAuthHttpClientError {
    message.into()
}

impl EgressOAuthClient {
    /// A client under `egress`; each request is bounded by `timeout`.
    pub fn new(egress: EgressPolicy, timeout: Duration) -> Result<Self, String> {
        let base = quiver_mcp::egress::http_client_builder()
            .timeout(timeout)
            .build()
            .map_err(|err| format!("cannot build an http client: {err}"))?;
        Ok(EgressOAuthClient { egress, base })
    }

    /// Whether `url` may be connected to; the refusal names the host and
    /// how to allow it.
    pub async fn check(&self, url: &str) -> Result<(), String> {
        let url = url::Url::parse(url).map_err(|err| format!("{url:?} is not a URL: {err}"))?;
        self.egress
            .check(&url)
            .await
            .map(|_| ())
            .map_err(|err| err.to_string())
    }

    async fn send(
        &self,
        request: reqwest::Request,
    ) -> Result<reqwest::Response, OAuthHttpClientError> {
        let client = self
            .egress
            .client_for(request.url(), &self.base)
            .await
            .map_err(|err| boxed(err.to_string()))?;
        Ok(client.execute(request).await?)
    }
}

impl OAuthHttpClient for EgressOAuthClient {
    fn execute(&self, request: OAuthHttpRequest) -> OAuthHttpClientFuture<'_> {
        Box::pin(async move {
            let OAuthHttpRequest {
                request,
                redirect_policy,
                ..
            } = request;
            let follow = matches!(redirect_policy, OAuthHttpRedirectPolicy::Follow);
            let mut request = reqwest::Request::try_from(request)?;
            let mut redirects = 0;
            let mut response = loop {
                let response = self.send(request).await?;
                let location = response
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .and_then(|value| value.to_str().ok())
                    .and_then(|location| response.url().join(location).ok());
                match location {
                    Some(next) if follow && response.status().is_redirection() => {
                        redirects += 1;
                        if redirects > MAX_REDIRECTS {
                            return Err(boxed(format!(
                                "more than {MAX_REDIRECTS} redirects (the most an OAuth request follows)"
                            )));
                        }
                        request = reqwest::Request::new(reqwest::Method::GET, next);
                    }
                    _ => break response,
                }
            };
            let mut builder = http::Response::builder()
                .status(response.status().as_u16())
                .version(response.version());
            for (name, value) in response.headers() {
                builder = builder.header(name.as_str(), value.as_bytes());
            }
            let mut body = Vec::new();
            while let Some(chunk) = response.chunk().await? {
                if chunk.len() > MAX_BODY_BYTES - body.len() {
                    return Err(boxed(format!(
                        "response body larger than {MAX_BODY_BYTES} bytes (the limit of an OAuth response)"
                    )));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(builder.body(body)?)
        })
    }
}
