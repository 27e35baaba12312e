//! The test OpenID Connect issuer (`quiver_testkit::oidc_issuer`) served by
//! the OAuth test server, in-process: discovery and JWKS documents, minted
//! tokens checked with `jsonwebtoken` against the published keys (and the
//! deliberately bad ones refused by it), key rotation and the counters.

use std::collections::HashSet;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use quiver_testkit::oauth_server::{OAuthServer, OAuthServerOptions, OAuthStats};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The server on a free port; stopped on drop.
struct Running {
    server: OAuthServer,
    base: String,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Running {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("address"));
        let server = OAuthServer::new(&base, OAuthServerOptions::default());
        let task = tokio::spawn(server.clone().serve(listener));
        Self { server, base, task }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn get(&self, path: &str) -> Value {
        let response = reqwest::get(self.url(path)).await.expect("GET");
        assert_eq!(response.status(), StatusCode::OK, "GET {path}");
        response.json().await.expect("JSON")
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let response = reqwest::Client::new()
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .expect("POST");
        let status = response.status();
        (status, response.json().await.expect("JSON"))
    }

    async fn jwks(&self) -> JwkSet {
        serde_json::from_value(self.get("/jwks").await).expect("a JWK set")
    }

    async fn mint(&self, body: Value) -> String {
        let (status, answer) = self.post("/admin/oidc/mint", body.clone()).await;
        assert_eq!(status, StatusCode::OK, "mint {body}: {answer}");
        answer["token"].as_str().expect("token").to_owned()
    }

    async fn stats(&self) -> OAuthStats {
        let stats: OAuthStats =
            serde_json::from_value(self.get("/admin/stats").await).expect("stats");
        assert_eq!(stats, self.server.stats());
        stats
    }

    /// What a careful verifier does: the key named by the header's `kid`
    /// from `jwks`, the algorithm the JWK names, `iss` and `aud` checked.
    fn verify(&self, jwks: &JwkSet, token: &str) -> jsonwebtoken::errors::Result<Value> {
        let header = jsonwebtoken::decode_header(token)?;
        let kid = header.kid.expect("a kid");
        let jwk = jwks
            .find(&kid)
            .ok_or_else(|| jsonwebtoken::errors::Error::from(ErrorKind::InvalidKeyFormat))?;
        let alg = Algorithm::try_from(jwk.common.key_algorithm.expect("the JWK names its alg"))?;
        let mut validation = Validation::new(alg);
        validation.set_issuer(&[&self.base]);
        validation.set_audience(&["quiver"]);
        let data = jsonwebtoken::decode::<Value>(token, &DecodingKey::from_jwk(jwk)?, &validation)?;
        Ok(data.claims)
    }
}

/// The JSON of the token's header.
fn header_of(token: &str) -> Value {
    let header = token.split('.').next().expect("a header part");
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).expect("base64url")).expect("JSON")
}

#[tokio::test]
async fn discovery_names_the_jwks_and_is_counted() {
    let issuer = Running::start().await;
    let discovery = issuer.get("/.well-known/openid-configuration").await;
    assert_eq!(discovery["issuer"], json!(issuer.base));
    assert_eq!(discovery["jwks_uri"], json!(issuer.url("/jwks")));
    assert_eq!(discovery["token_endpoint"], json!(issuer.url("/token")));
    assert_eq!(
        discovery["authorization_endpoint"],
        json!(issuer.url("/authorize"))
    );
    assert_eq!(
        discovery["id_token_signing_alg_values_supported"],
        json!(["ES256", "RS256"])
    );
    // The OAuth metadata document is not OpenID discovery: not counted.
    let oauth = issuer.get("/.well-known/oauth-authorization-server").await;
    assert_eq!(oauth["jwks_uri"], Value::Null);
    let stats = issuer.stats().await;
    assert_eq!((stats.discovery_fetches, stats.jwks_fetches), (1, 0));
}

#[tokio::test]
async fn jwks_lists_public_signing_keys() {
    let issuer = Running::start().await;
    let jwks = issuer.get("/jwks").await;
    let keys = jwks["keys"].as_array().expect("keys");
    assert_eq!(keys.len(), 2, "{jwks}");
    let ec = keys
        .iter()
        .find(|key| key["kty"] == "EC")
        .expect("an EC key");
    assert_eq!(
        (&ec["crv"], &ec["alg"], &ec["use"]),
        (&json!("P-256"), &json!("ES256"), &json!("sig"))
    );
    for coordinate in ["x", "y"] {
        let bytes = URL_SAFE_NO_PAD
            .decode(ec[coordinate].as_str().expect("coordinate"))
            .expect("base64url");
        assert_eq!(bytes.len(), 32, "{coordinate}");
    }
    let rsa = keys
        .iter()
        .find(|key| key["kty"] == "RSA")
        .expect("an RSA key");
    assert_eq!((&rsa["alg"], &rsa["use"]), (&json!("RS256"), &json!("sig")));
    let modulus = URL_SAFE_NO_PAD
        .decode(rsa["n"].as_str().expect("n"))
        .expect("base64url");
    assert!(modulus.len() >= 256, "a 2048-bit modulus");
    assert!(rsa["e"].is_string());
    let kids: HashSet<_> = keys
        .iter()
        .map(|key| key["kid"].as_str().expect("kid"))
        .collect();
    assert_eq!(kids.len(), 2);
    for key in keys {
        assert_eq!(key["d"], Value::Null, "no private part: {key}");
    }
    assert_eq!(
        ec["kid"].as_str(),
        Some(issuer.server.oidc().current_kid().expect("kid").as_str())
    );
}

#[tokio::test]
async fn minted_tokens_verify_against_the_jwks() {
    let issuer = Running::start().await;
    let jwks = issuer.jwks().await;
    for alg in ["ES256", "RS256"] {
        let token = issuer
            .mint(json!({"alg": alg, "claims": {"sub": "alice", "groups": ["team-a"]}}))
            .await;
        assert_eq!(header_of(&token)["alg"], alg);
        let claims = issuer.verify(&jwks, &token).expect(alg);
        assert_eq!(claims["sub"], "alice");
        assert_eq!(claims["groups"], json!(["team-a"]));
        assert_eq!(claims["iss"], json!(issuer.base));
        assert_eq!(claims["aud"], "quiver");
        let (iat, exp) = (
            claims["iat"].as_i64().unwrap(),
            claims["exp"].as_i64().unwrap(),
        );
        assert_eq!(exp - iat, 300, "default lifetime");
    }
    // Defaults: ES256 under the current kid; claims merged, `null` drops one.
    let token = issuer
        .mint(json!({"claims": {"aud": ["other", "quiver"], "email": null, "nbf": null}}))
        .await;
    let header = header_of(&token);
    assert_eq!(header["alg"], "ES256");
    assert_eq!(
        header["kid"].as_str(),
        Some(issuer.server.oidc().current_kid().unwrap().as_str())
    );
    assert_eq!(
        issuer.verify(&jwks, &token).expect("valid")["aud"],
        json!(["other", "quiver"])
    );
    let token = issuer.mint(json!({"claims": {"sub": null}})).await;
    assert_eq!(
        issuer.verify(&jwks, &token).expect("valid")["sub"],
        Value::Null
    );
}

#[tokio::test]
async fn bad_tokens_are_minted_as_asked() {
    let issuer = Running::start().await;
    let jwks = issuer.jwks().await;
    let current = issuer.server.oidc().current_kid().unwrap();

    let expired = issuer.mint(json!({"ttl_secs": -600})).await;
    let err = issuer.verify(&jwks, &expired).expect_err("expired");
    assert!(matches!(err.kind(), ErrorKind::ExpiredSignature), "{err:?}");

    let wrong_audience = issuer
        .mint(json!({"claims": {"aud": "someone-else"}}))
        .await;
    let err = issuer.verify(&jwks, &wrong_audience).expect_err("audience");
    assert!(matches!(err.kind(), ErrorKind::InvalidAudience), "{err:?}");

    let wrong_issuer = issuer
        .mint(json!({"claims": {"iss": "http://evil.invalid"}}))
        .await;
    let err = issuer.verify(&jwks, &wrong_issuer).expect_err("issuer");
    assert!(matches!(err.kind(), ErrorKind::InvalidIssuer), "{err:?}");

    // alg none: header {"alg":"none"} under the current kid, no signature.
    let unsigned = issuer.mint(json!({"alg": "none"})).await;
    assert!(unsigned.ends_with('.'), "{unsigned}");
    assert_eq!(unsigned.split('.').count(), 3);
    assert_eq!(header_of(&unsigned)["alg"], "none");
    assert_eq!(header_of(&unsigned)["kid"], json!(current));
    assert!(issuer.verify(&jwks, &unsigned).is_err());

    // HS256 keyed with the public key's PEM: "valid" for a verifier that
    // takes the algorithm from the token, refused by one that takes it from
    // the JWK.
    let confused = issuer.mint(json!({"alg": "HS256-with-public-key"})).await;
    assert_eq!(header_of(&confused)["alg"], "HS256");
    assert_eq!(header_of(&confused)["kid"], json!(current));
    let pem = issuer
        .server
        .oidc()
        .public_pem(&current)
        .unwrap()
        .expect("pem");
    let mut naive = Validation::new(Algorithm::HS256);
    naive.set_audience(&["quiver"]);
    jsonwebtoken::decode::<Value>(&confused, &DecodingKey::from_secret(pem.as_bytes()), &naive)
        .expect("the HMAC is keyed with the public PEM");
    let err = issuer.verify(&jwks, &confused).expect_err("confusion");
    assert!(matches!(err.kind(), ErrorKind::InvalidAlgorithm), "{err:?}");

    // A kid the JWKS does not list: signed by a throwaway key.
    let unknown = issuer.mint(json!({"kid": "not-in-the-jwks"})).await;
    assert_eq!(header_of(&unknown)["kid"], "not-in-the-jwks");
    assert!(jwks.find("not-in-the-jwks").is_none());
    assert!(issuer.jwks().await.find("not-in-the-jwks").is_none());
    let unknown_rsa = issuer
        .mint(json!({"kid": "rsa-unknown", "alg": "RS256"}))
        .await;
    assert_eq!(header_of(&unknown_rsa)["alg"], "RS256");
    // Its signature is no listed key's: re-labelled with the current kid it
    // fails as a bad signature.
    let mut parts: Vec<String> = unknown.split('.').map(str::to_owned).collect();
    let mut header = header_of(&unknown);
    header["kid"] = json!(current);
    parts[0] = URL_SAFE_NO_PAD.encode(header.to_string());
    let err = issuer
        .verify(&jwks, &parts.join("."))
        .expect_err("bad signature");
    assert!(matches!(err.kind(), ErrorKind::InvalidSignature), "{err:?}");
}

#[tokio::test]
async fn bad_mint_requests_name_the_field() {
    let issuer = Running::start().await;
    let current = issuer.server.oidc().current_kid().unwrap();
    for (body, field) in [
        (json!({"ttl_secs": 10_000_000_000_i64}), "ttl_secs"),
        (json!({"kid": ""}), "kid"),
        (json!({"kid": current, "alg": "RS256"}), "alg"),
        (json!({"alg": "HS512"}), "alg"),
        (json!({"claims": [1]}), "claims"),
        (json!({"lifetime": 3}), "lifetime"),
    ] {
        let (status, answer) = issuer.post("/admin/oidc/mint", body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        let message = answer["error_description"].as_str().unwrap_or_default();
        assert!(message.contains(field), "{body}: {message}");
    }
    let (status, _) = issuer
        .post("/admin/oidc/rotate", json!({"drop": true}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn rotation_adds_a_new_kid_and_drop_old_removes_the_old_keys() {
    let issuer = Running::start().await;
    let first = issuer.server.oidc().current_kid().unwrap();
    let before = issuer.mint(json!({})).await;

    let (status, rotated) = issuer.post("/admin/oidc/rotate", json!({})).await;
    assert_eq!(status, StatusCode::OK);
    let second = rotated["kid"].as_str().expect("kid").to_owned();
    assert_ne!(second, first);
    let jwks = issuer.jwks().await;
    assert_eq!(jwks.keys.len(), 4, "old and new keys");
    assert!(jwks.find(&first).is_some() && jwks.find(&second).is_some());
    let after = issuer.mint(json!({})).await;
    assert_eq!(header_of(&after)["kid"], json!(second));
    issuer.verify(&jwks, &before).expect("old key still listed");
    issuer.verify(&jwks, &after).expect("new key");
    // A listed old key can still be asked for by kid.
    let by_kid = issuer.mint(json!({"kid": first})).await;
    issuer.verify(&jwks, &by_kid).expect("old key by kid");

    let (status, rotated) = issuer
        .post("/admin/oidc/rotate", json!({"drop_old": true}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let third = rotated["kid"].as_str().expect("kid").to_owned();
    let jwks = issuer.jwks().await;
    let kids: Vec<_> = jwks
        .keys
        .iter()
        .filter_map(|key| key.common.key_id.clone())
        .collect();
    assert_eq!(kids.len(), 2, "{kids:?}");
    assert!(kids.contains(&third), "{kids:?}");
    assert!(
        !kids.contains(&first) && !kids.contains(&second),
        "{kids:?}"
    );
    assert!(issuer.verify(&jwks, &before).is_err(), "old key gone");
    issuer
        .verify(&jwks, &issuer.mint(json!({})).await)
        .expect("current key");
}

#[tokio::test]
async fn counters_count_jwks_and_discovery_fetches() {
    let issuer = Running::start().await;
    assert_eq!(
        (
            issuer.stats().await.jwks_fetches,
            issuer.stats().await.discovery_fetches
        ),
        (0, 0)
    );
    for _ in 0..3 {
        issuer.get("/jwks").await;
    }
    for _ in 0..2 {
        issuer.get("/.well-known/openid-configuration").await;
    }
    // Minting and rotating read the keys without counting as fetches.
    issuer.mint(json!({})).await;
    issuer.post("/admin/oidc/rotate", json!({})).await;
    let stats = issuer.stats().await;
    assert_eq!((stats.jwks_fetches, stats.discovery_fetches), (3, 2));
}
