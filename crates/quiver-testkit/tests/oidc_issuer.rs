//! The test OpenID Connect issuer (`quiver_testkit::oidc_issuer`) served by
//! the OAuth test server, in-process: discovery and JWKS documents, minted
//! tokens checked with `jsonwebtoken` against the published keys (and the
//! deliberately bad ones refused by it), key rotation and the counters; and
//! sign-in by the authorization code flow, whose `id_token`s are checked the
//! same way.

use std::collections::HashSet;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use quiver_testkit::oauth_server::{OAuthServer, OAuthServerOptions, OAuthStats};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::Digest as _;

/// Where the test's public clients redirect to (never reached).
const REDIRECT: &str = "http://127.0.0.1:1/callback";
const VERIFIER: &str = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";

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
    /// from `jwks`, the algorithm the JWK names, `iss` and `aud` (`quiver`)
    /// checked.
    fn verify(&self, jwks: &JwkSet, token: &str) -> jsonwebtoken::errors::Result<Value> {
        self.verify_for(jwks, token, "quiver")
    }

    /// [`Running::verify`] for the audience `audience`.
    fn verify_for(
        &self,
        jwks: &JwkSet,
        token: &str,
        audience: &str,
    ) -> jsonwebtoken::errors::Result<Value> {
        let header = jsonwebtoken::decode_header(token)?;
        let kid = header.kid.expect("a kid");
        let jwk = jwks
            .find(&kid)
            .ok_or_else(|| jsonwebtoken::errors::Error::from(ErrorKind::InvalidKeyFormat))?;
        let alg = Algorithm::try_from(jwk.common.key_algorithm.expect("the JWK names its alg"))?;
        let mut validation = Validation::new(alg);
        validation.set_issuer(&[&self.base]);
        validation.set_audience(&[audience]);
        let data = jsonwebtoken::decode::<Value>(token, &DecodingKey::from_jwk(jwk)?, &validation)?;
        Ok(data.claims)
    }
}

impl Running {
    /// Signs in as public client `client_id` by the authorization code flow
    /// (PKCE S256, no secret) asking for `scope` with `nonce`: the token
    /// response.
    async fn sign_in(&self, client_id: &str, scope: &str, nonce: Option<&str>) -> Value {
        let challenge = URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(VERIFIER));
        let mut params = vec![
            ("response_type", "code"),
            ("client_id", client_id),
            ("redirect_uri", REDIRECT),
            ("code_challenge", challenge.as_str()),
            ("code_challenge_method", "S256"),
            ("scope", scope),
            ("state", "st-1"),
        ];
        params.extend(nonce.map(|nonce| ("nonce", nonce)));
        let response = self.authorize(&params).await;
        assert_eq!(response.status(), StatusCode::FOUND);
        let location = response.headers()[reqwest::header::LOCATION]
            .to_str()
            .expect("ascii Location");
        assert!(location.starts_with(REDIRECT), "{location}");
        let code = url::Url::parse(location)
            .expect("Location is a URL")
            .query_pairs()
            .find(|(name, _)| name == "code")
            .expect("a code")
            .1
            .into_owned();
        let response = reqwest::Client::new()
            .post(self.url("/token"))
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(encode(&[
                ("grant_type", "authorization_code"),
                ("code", &code),
                ("code_verifier", VERIFIER),
                ("redirect_uri", REDIRECT),
                ("client_id", client_id),
            ]))
            .send()
            .await
            .expect("POST /token");
        let status = response.status();
        let body: Value = response.json().await.expect("token JSON");
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }

    /// `GET /authorize?params`, its redirect not followed.
    async fn authorize(&self, params: &[(&str, &str)]) -> reqwest::Response {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("reqwest client")
            .get(format!("{}?{}", self.url("/authorize"), encode(params)))
            .send()
            .await
            .expect("GET /authorize")
    }
}

/// `application/x-www-form-urlencoded` (reqwest's `form` and `query` are
/// features the workspace does not enable).
fn encode(params: &[(&str, &str)]) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(params)
        .finish()
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
    // What an OpenID sign-in client (code flow, PKCE) looks for.
    assert_eq!(discovery["response_types_supported"], json!(["code"]));
    assert_eq!(
        discovery["code_challenge_methods_supported"],
        json!(["S256"])
    );
    let scopes = discovery["scopes_supported"].as_array().expect("scopes");
    assert!(scopes.contains(&json!("openid")), "{scopes:?}");
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

#[tokio::test]
async fn code_flow_with_openid_returns_an_id_token_for_the_person() {
    let issuer = Running::start().await;
    let discovery = issuer.get("/.well-known/openid-configuration").await;
    let (status, client) = issuer
        .post(
            "/admin/clients",
            json!({"client_id": "quiver-web", "redirect_uris": [REDIRECT]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{client}");
    assert_eq!(
        client,
        json!({"client_id": "quiver-web", "redirect_uris": [REDIRECT], "token_endpoint_auth_method": "none"})
    );
    let alice = json!({"sub": "alice", "email": "alice@example.com", "groups": ["admins"]});
    let (status, answer) = issuer.post("/admin/oidc/person", alice.clone()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer, json!({"person": alice}));

    let tokens = issuer
        .sign_in("quiver-web", "openid email", Some("n-0S6_WzA2Mj"))
        .await;
    assert_eq!(tokens["scope"], "openid email");
    assert!(tokens["access_token"].is_string(), "{tokens}");
    let id_token = tokens["id_token"].as_str().expect("an id_token");
    let header = header_of(id_token);
    assert_eq!(header["alg"], "ES256");
    assert_eq!(
        header["kid"].as_str(),
        Some(issuer.server.oidc().current_kid().unwrap().as_str())
    );
    // Verified as a relying party does: keys from the discovered
    // `jwks_uri`, `iss` exactly as discovery names it, `aud` its client id.
    assert_eq!(discovery["jwks_uri"], json!(issuer.url("/jwks")));
    assert_eq!(discovery["issuer"], json!(issuer.base));
    let jwks = issuer.jwks().await;
    let claims = issuer
        .verify_for(&jwks, id_token, "quiver-web")
        .expect("a valid id_token");
    assert_eq!(claims["iss"], discovery["issuer"]);
    assert_eq!(claims["aud"], "quiver-web");
    assert_eq!(claims["nonce"], "n-0S6_WzA2Mj");
    assert_eq!(claims["sub"], "alice");
    assert_eq!(claims["email"], "alice@example.com");
    assert_eq!(claims["groups"], json!(["admins"]));
    let (iat, exp) = (
        claims["iat"].as_i64().unwrap(),
        claims["exp"].as_i64().unwrap(),
    );
    assert_eq!(exp - iat, 300, "five minutes");
    assert!(
        issuer.verify(&jwks, id_token).is_err(),
        "not for another audience"
    );

    // A dynamically registered public client, no nonce, after a rotation:
    // the new current key signs, and the token has no `nonce`.
    let response = reqwest::Client::new()
        .post(issuer.url("/register"))
        .json(&json!({"redirect_uris": [REDIRECT], "token_endpoint_auth_method": "none"}))
        .send()
        .await
        .expect("POST /register");
    assert_eq!(response.status(), StatusCode::CREATED);
    let registered: Value = response.json().await.expect("registration JSON");
    assert_eq!(registered["client_secret"], Value::Null, "a public client");
    let client_id = registered["client_id"].as_str().expect("client_id");
    let (status, _) = issuer.post("/admin/oidc/rotate", json!({})).await;
    assert_eq!(status, StatusCode::OK);
    let tokens = issuer.sign_in(client_id, "openid", None).await;
    let id_token = tokens["id_token"].as_str().expect("an id_token");
    assert_eq!(
        header_of(id_token)["kid"].as_str(),
        Some(issuer.server.oidc().current_kid().unwrap().as_str())
    );
    let claims = issuer
        .verify_for(&issuer.jwks().await, id_token, client_id)
        .expect("a valid id_token");
    assert_eq!(claims["sub"], "alice");
    assert_eq!(claims["nonce"], Value::Null);
    assert_eq!(issuer.stats().await.id_tokens_issued, 2);
}

#[tokio::test]
async fn code_flow_without_openid_has_no_id_token() {
    let issuer = Running::start().await;
    let (status, _) = issuer
        .post(
            "/admin/clients",
            json!({"client_id": "quiver-web", "redirect_uris": [REDIRECT]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let tokens = issuer.sign_in("quiver-web", "mcp:tools", Some("n-1")).await;
    assert!(tokens["access_token"].is_string(), "{tokens}");
    assert_eq!(tokens["id_token"], Value::Null, "{tokens}");
    // `openid` must be a scope of its own, not part of one.
    let tokens = issuer.sign_in("quiver-web", "openid-ish", None).await;
    assert_eq!(tokens["id_token"], Value::Null, "{tokens}");
    assert_eq!(issuer.stats().await.id_tokens_issued, 0);

    // With `openid`, before any person is set: the default one.
    let tokens = issuer.sign_in("quiver-web", "openid", None).await;
    let claims = issuer
        .verify_for(
            &issuer.jwks().await,
            tokens["id_token"].as_str().expect("an id_token"),
            "quiver-web",
        )
        .expect("a valid id_token");
    assert_eq!(claims["sub"], "testkit-user");
    assert_eq!(issuer.stats().await.id_tokens_issued, 1);
}

#[tokio::test]
async fn bad_sign_in_setup_is_refused_naming_the_field() {
    let issuer = Running::start().await;
    for (body, field) in [
        (json!({"email": "nobody@example.com"}), "sub"),
        (json!({"sub": ""}), "sub"),
        (json!({"sub": 7}), "sub"),
        (json!({"sub": "alice", "aud": "other"}), "aud"),
        (json!({"sub": "alice", "nonce": "fixed"}), "nonce"),
        (json!(["sub"]), "object"),
    ] {
        let (status, answer) = issuer.post("/admin/oidc/person", body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        let message = answer["error_description"].as_str().unwrap_or_default();
        assert!(message.contains(field), "{body}: {message}");
    }
    assert_eq!(
        issuer.server.oidc().person(),
        json!({"sub": "testkit-user"}).as_object().cloned().unwrap(),
        "unchanged"
    );
    for (body, field) in [
        (
            json!({"client_id": "", "redirect_uris": [REDIRECT]}),
            "client_id",
        ),
        (
            json!({"client_id": "web", "redirect_uris": []}),
            "redirect_uris",
        ),
        (
            json!({"client_id": "web", "redirect_uris": ["/relative"]}),
            "redirect uri",
        ),
        (json!({"redirect_uris": [REDIRECT]}), "client_id"),
        (
            json!({"client_id": "web", "redirect_uris": [REDIRECT], "secret": "s"}),
            "secret",
        ),
    ] {
        let (status, answer) = issuer.post("/admin/clients", body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        let message = answer["error_description"].as_str().unwrap_or_default();
        assert!(message.contains(field), "{body}: {message}");
    }
    // A pre-registered client redirects to its registered URIs only, and a
    // nonce has a bounded length.
    let (status, _) = issuer
        .post(
            "/admin/clients",
            json!({"client_id": "web", "redirect_uris": [REDIRECT]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let challenge = URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(VERIFIER));
    let long_nonce = "n".repeat(513);
    for (redirect, nonce) in [
        ("http://127.0.0.1:2/elsewhere", "n"),
        (REDIRECT, long_nonce.as_str()),
    ] {
        let response = issuer
            .authorize(&[
                ("response_type", "code"),
                ("client_id", "web"),
                ("redirect_uri", redirect),
                ("code_challenge", &challenge),
                ("code_challenge_method", "S256"),
                ("scope", "openid"),
                ("nonce", nonce),
            ])
            .await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{redirect}");
    }
}
