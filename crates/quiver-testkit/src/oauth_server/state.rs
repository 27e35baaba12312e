//! The server's memory: clients, pending consents and codes, tokens and
//! counters, each table capped at [`MAX_ENTRIES`](super::MAX_ENTRIES), behind
//! one mutex.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

use super::options::{Fault, MAX_ENTRIES, OAuthStats, SCOPE, User};
use super::wire::{OAuthFailure, full};
use crate::oidc_issuer::OidcIssuer;

/// How long a consent page can be answered: longer than a code lives, as a
/// person (or a slow browser test) fills it in.
pub(super) const CONSENT_TTL: Duration = Duration::from_secs(600);

pub(super) struct Shared {
    /// The base URL, without a trailing slash.
    pub(super) issuer: String,
    /// `issuer` + `/mcp`.
    pub(super) resource: String,
    pub(super) fault: Option<Fault>,
    /// [`OAuthServerOptions::consent_page`].
    pub(super) consent_page: bool,
    pub(super) store: Mutex<Store>,
    /// The OpenID Connect side: signing keys, JWKS, minted JWTs.
    pub(super) oidc: Arc<OidcIssuer>,
}

pub(super) struct Client {
    /// `None`: a public client.
    pub(super) secret: Option<String>,
    /// `None`: any URI on a loopback host (pre-registered clients).
    pub(super) redirect_uris: Option<Vec<String>>,
}

/// Whom a code or token is for: the client it was issued to and the user who
/// granted it. The bearer check puts the caller's into the extensions of each
/// `/mcp` request it lets through (rmcp hands the request's `Parts` to
/// tools).
#[derive(Debug, Clone)]
pub(super) struct OAuthCaller {
    pub(super) client_id: String,
    pub(super) user: User,
}

/// An authorization request `/authorize` checked; only [`grant_code`](super::authorize::grant_code) turns
/// it into a code, for a user.
pub(super) struct AuthorizationRequest {
    pub(super) client_id: String,
    pub(super) redirect_uri: String,
    pub(super) challenge: String,
    pub(super) scope: String,
    /// The request's `nonce`, for the `id_token`.
    pub(super) nonce: Option<String>,
    /// The request's `state`, sent back with the code.
    pub(super) state: Option<String>,
}

/// An authorization request waiting on its consent page.
pub(super) struct PendingConsent {
    pub(super) request: AuthorizationRequest,
    pub(super) expires: Instant,
}

pub(super) struct PendingCode {
    pub(super) caller: OAuthCaller,
    pub(super) redirect_uri: String,
    pub(super) challenge: String,
    pub(super) scope: String,
    /// The authorization request's `nonce`, for the `id_token`.
    pub(super) nonce: Option<String>,
    pub(super) expires: Instant,
}

pub(super) struct AccessToken {
    pub(super) caller: OAuthCaller,
    pub(super) scope: String,
    pub(super) expires: Instant,
}

pub(super) struct RefreshToken {
    pub(super) caller: OAuthCaller,
    pub(super) scope: String,
}

/// The two kinds of token `GET /admin/tokens` lists.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum TokenKind {
    Access,
    Refresh,
}

/// A token as `GET /admin/tokens` remembers it.
pub(super) struct IssuedToken {
    pub(super) kind: TokenKind,
    pub(super) token: String,
    pub(super) user: User,
}

pub(super) struct Store {
    pub(super) clients: HashMap<String, Client>,
    /// Authorization requests shown a consent page, by the id the page posts
    /// back.
    pub(super) consents: HashMap<String, PendingConsent>,
    pub(super) codes: HashMap<String, PendingCode>,
    pub(super) access: HashMap<String, AccessToken>,
    pub(super) refresh: HashMap<String, RefreshToken>,
    pub(super) access_ttl: Duration,
    /// The user `/authorize` approves for without a consent page.
    pub(super) auto_user: User,
    pub(super) stats: OAuthStats,
    /// Every token issued (the newest [`MAX_ENTRIES`]), so a test can look
    /// for them where they must not appear (`GET /admin/tokens`).
    pub(super) issued: VecDeque<IssuedToken>,
}

impl Shared {
    /// The counters, the OIDC issuer's included.
    pub(super) fn stats(&self) -> OAuthStats {
        let mut stats = self.store().stats.clone();
        let oidc = self.oidc.stats();
        stats.jwks_fetches = oidc.jwks_fetches;
        stats.discovery_fetches = oidc.discovery_fetches;
        stats.id_tokens_issued = oidc.id_tokens_issued;
        stats
    }

    /// The store; a handler that panicked cannot leave it half-written in a
    /// way that matters to tests, so poisoning is ignored.
    pub(super) fn store(&self) -> MutexGuard<'_, Store> {
        self.store
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn expire_access_tokens(&self) {
        let now = Instant::now();
        for token in self.store().access.values_mut() {
            token.expires = token.expires.min(now);
        }
    }

    /// The `WWW-Authenticate` challenge of a 401 from `/mcp`.
    pub(super) fn challenge(&self, invalid_token: bool) -> String {
        let mut challenge = format!(
            "Bearer resource_metadata=\"{}/.well-known/oauth-protected-resource/mcp\", scope=\"{SCOPE}\"",
            self.issuer
        );
        if invalid_token {
            challenge.push_str(", error=\"invalid_token\"");
        }
        challenge
    }
}

impl Store {
    /// Drops what has expired from the table that is full, then says whether
    /// one more entry fits.
    pub(super) fn make_room_for_access(&mut self, now: Instant) -> Result<(), OAuthFailure> {
        if self.access.len() >= MAX_ENTRIES {
            self.access.retain(|_, token| token.expires > now);
        }
        if self.access.len() >= MAX_ENTRIES {
            return Err(full("access tokens"));
        }
        Ok(())
    }

    /// Issues an access token (and a refresh token when `refresh`) to
    /// `caller`; the token response.
    pub(super) fn issue(
        &mut self,
        caller: &OAuthCaller,
        scope: &str,
        refresh: bool,
        now: Instant,
    ) -> Result<Value, OAuthFailure> {
        self.make_room_for_access(now)?;
        if refresh && self.refresh.len() >= MAX_ENTRIES {
            return Err(full("refresh tokens"));
        }
        let access_token = random_token();
        self.access.insert(
            access_token.clone(),
            AccessToken {
                caller: caller.clone(),
                scope: scope.to_owned(),
                expires: now + self.access_ttl,
            },
        );
        self.remember(TokenKind::Access, &access_token, &caller.user);
        let mut response = json!({
            "access_token": access_token,
            "token_type": "Bearer",
            "expires_in": self.access_ttl.as_secs(),
            "scope": scope,
        });
        if refresh {
            let refresh_token = random_token();
            self.refresh.insert(
                refresh_token.clone(),
                RefreshToken {
                    caller: caller.clone(),
                    scope: scope.to_owned(),
                },
            );
            self.remember(TokenKind::Refresh, &refresh_token, &caller.user);
            response["refresh_token"] = Value::String(refresh_token);
        }
        Ok(response)
    }

    pub(super) fn remember(&mut self, kind: TokenKind, token: &str, user: &User) {
        if self.issued.len() >= MAX_ENTRIES {
            self.issued.pop_front();
        }
        self.issued.push_back(IssuedToken {
            kind,
            token: token.to_owned(),
            user: user.clone(),
        });
    }

    /// Counts a refresh grant of `user`'s token; a user beyond the first
    /// [`MAX_ENTRIES`] is counted only in the total.
    pub(super) fn count_refresh(&mut self, user: &User) {
        self.stats.refresh_grants += 1;
        let by_user = &mut self.stats.refresh_grants_by_user;
        if let Some(count) = by_user.get_mut(user.as_str()) {
            *count += 1;
        } else if by_user.len() < MAX_ENTRIES {
            by_user.insert(user.as_str().to_owned(), 1);
        }
    }

    /// Keeps `request` until its consent page is answered with `id`.
    pub(super) fn hold_for_consent(
        &mut self,
        id: String,
        request: AuthorizationRequest,
        now: Instant,
    ) -> Result<(), OAuthFailure> {
        if self.consents.len() >= MAX_ENTRIES {
            self.consents.retain(|_, pending| pending.expires > now);
        }
        if self.consents.len() >= MAX_ENTRIES {
            return Err(full("consent requests"));
        }
        self.consents.insert(
            id,
            PendingConsent {
                request,
                expires: now + CONSENT_TTL,
            },
        );
        Ok(())
    }

    /// The request a consent page with `id` was shown for, once and while
    /// it has not expired.
    pub(super) fn take_consent(&mut self, id: &str, now: Instant) -> Option<AuthorizationRequest> {
        self.consents
            .remove(id)
            .filter(|pending| pending.expires > now)
            .map(|pending| pending.request)
    }
}

/// 32 random bytes, base64url.
pub(super) fn random_token() -> String {
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}
