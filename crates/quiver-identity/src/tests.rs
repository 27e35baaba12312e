//! The verifier against a real issuer: an HTTP server on 127.0.0.1 serving
//! OpenID discovery and a JWKS of keys generated here, counting fetches.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::{Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

use quiver_model::access::{ClaimRule, IdentityProviderRecord};

use super::*;

/// A signing key and its public JWK.
struct SigningKey {
    kid: String,
    encoding: EncodingKey,
    jwk: Value,
}

impl SigningKey {
    fn es256(kid: &str) -> Self {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let encoding = EncodingKey::from_ec_der(&pair.serialize_der());
        let mut jwk = Jwk::from_encoding_key(&encoding, Algorithm::ES256).unwrap();
        jwk.common.key_id = Some(kid.into());
        jwk.common.public_key_use = Some(PublicKeyUse::Signature);
        jwk.common.key_algorithm = Some(KeyAlgorithm::ES256);
        SigningKey {
            kid: kid.into(),
            encoding,
            jwk: serde_json::to_value(jwk).unwrap(),
        }
    }

    fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.encoding).unwrap()
    }
}

#[derive(Default)]
struct Issuer {
    url: std::sync::Mutex<String>,
    keys: std::sync::Mutex<Vec<Value>>,
    discovery_fetches: AtomicUsize,
    jwks_fetches: AtomicUsize,
    down: AtomicBool,
    huge: AtomicBool,
}

async fn discovery(State(issuer): State<Arc<Issuer>>) -> Response {
    issuer.discovery_fetches.fetch_add(1, Ordering::SeqCst);
    if issuer.down.load(Ordering::SeqCst) {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let url = issuer.url.lock().unwrap().clone();
    axum::Json(json!({"issuer": url, "jwks_uri": format!("{url}/jwks")})).into_response()
}

async fn jwks(State(issuer): State<Arc<Issuer>>) -> Response {
    issuer.jwks_fetches.fetch_add(1, Ordering::SeqCst);
    if issuer.down.load(Ordering::SeqCst) {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    if issuer.huge.load(Ordering::SeqCst) {
        let padding = "x".repeat(jwks::MAX_DOCUMENT_BYTES);
        return axum::Json(json!({"keys": [], "padding": padding})).into_response();
    }
    axum::Json(json!({"keys": *issuer.keys.lock().unwrap()})).into_response()
}

async fn issuer(keys: &[&SigningKey]) -> (Arc<Issuer>, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let state = Arc::new(Issuer::default());
    *state.url.lock().unwrap() = url.clone();
    *state.keys.lock().unwrap() = keys.iter().map(|k| k.jwk.clone()).collect();
    let app = Router::new()
        .route("/.well-known/openid-configuration", get(discovery))
        .route("/jwks", get(jwks))
        .with_state(state.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (state, url)
}

fn record(issuer: &str) -> IdentityProviderRecord {
    IdentityProviderRecord {
        name: "corp".into(),
        issuer: issuer.into(),
        audiences: vec!["quiver".into()],
        clock_skew_secs: Some(30),
        rules: vec![ClaimRule {
            claim: "groups".into(),
            contains: Some("team-a".into()),
            policy: Some("team-a".into()),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn provider(issuer: &str) -> Provider {
    Provider::new(0, &record(issuer), |_| true).unwrap()
}

fn claims(issuer: &str, sub: &str) -> Value {
    let now = now_secs() as i64;
    json!({"iss": issuer, "sub": sub, "aud": "quiver", "iat": now, "exp": now + 300, "groups": ["team-a"]})
}

fn with(mut claims: Value, key: &str, value: Value) -> Value {
    claims[key] = value;
    claims
}

fn fetches(issuer: &Issuer) -> (usize, usize) {
    (
        issuer.discovery_fetches.load(Ordering::SeqCst),
        issuer.jwks_fetches.load(Ordering::SeqCst),
    )
}

#[tokio::test]
async fn valid_tokens_are_callers_and_every_flaw_is_refused() {
    let key = SigningKey::es256("k1");
    let (state, url) = issuer(&[&key]).await;
    let identities = Identities::new(vec![provider(&url)]);

    let token = key.sign(&claims(&url, "alice"));
    let alice = identities.verify(&token).await.unwrap();
    assert_eq!(&*alice.principal, format!("oidc:{url}#alice"));
    assert_eq!(alice.policy.as_deref(), Some("team-a"));
    assert_eq!(alice.rule, Some(0));
    assert_eq!(
        (alice.subject.as_str(), alice.issuer.as_str()),
        ("alice", url.as_str())
    );
    assert_eq!(fetches(&state), (1, 1));
    let again = identities.verify(&token).await.unwrap();
    assert!(
        Arc::ptr_eq(&alice, &again),
        "a repeated token is a cache hit"
    );
    assert_eq!(identities.remembered(), 1);

    let no_rule = key.sign(&with(claims(&url, "bob"), "groups", json!(["team-z"])));
    let bob = identities.verify(&no_rule).await.unwrap();
    assert_eq!((bob.policy.as_deref(), bob.rule), (None, None));

    let now = now_secs() as i64;
    let refused = async |token: String| identities.verify(&token).await.unwrap_err();
    assert_eq!(
        refused(key.sign(&with(claims(&url, "a"), "exp", json!(now - 120)))).await,
        Refused::Expired
    );
    // Within the skew (30 s) an expired token still verifies.
    identities
        .verify(&key.sign(&with(claims(&url, "a"), "exp", json!(now - 5))))
        .await
        .unwrap();
    assert_eq!(
        refused(key.sign(&with(claims(&url, "a"), "nbf", json!(now + 120)))).await,
        Refused::NotYetValid
    );
    assert_eq!(
        refused(key.sign(&with(claims(&url, "a"), "aud", json!(["other"])))).await,
        Refused::WrongAudience
    );
    assert_eq!(
        refused(key.sign(&with(
            claims(&url, "a"),
            "iss",
            json!("https://elsewhere.example")
        )))
        .await,
        Refused::WrongIssuer
    );
    let no_sub = {
        let mut c = claims(&url, "a");
        c.as_object_mut().unwrap().remove("sub");
        c
    };
    assert_eq!(
        refused(key.sign(&no_sub)).await,
        Refused::MissingClaim("sub".into())
    );
    assert_eq!(
        refused(key.sign(&claims(&url, "a\nb"))).await,
        Refused::MissingClaim("sub".into())
    );
    assert_eq!(
        refused(key.sign(&claims(&url, &"x".repeat(256)))).await,
        Refused::MissingClaim("sub".into())
    );

    // alg: none, unsigned.
    let b64 = |v: Value| URL_SAFE_NO_PAD.encode(serde_json::to_vec(&v).unwrap());
    let none = format!(
        "{}.{}.",
        b64(json!({"alg": "none", "kid": "k1"})),
        b64(claims(&url, "mallory"))
    );
    assert_eq!(
        refused(none).await,
        Refused::AlgorithmRefused("none".into())
    );
    // HS256 keyed with the public key (algorithm confusion).
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("k1".into());
    let public = serde_json::to_vec(&key.jwk).unwrap();
    let hs = jsonwebtoken::encode(
        &header,
        &claims(&url, "mallory"),
        &EncodingKey::from_secret(&public),
    )
    .unwrap();
    assert_eq!(refused(hs).await, Refused::AlgorithmRefused("HS256".into()));
    // An allowed algorithm the key does not name.
    let signed = key.sign(&claims(&url, "mallory"));
    let (_, rest) = signed.split_once('.').unwrap();
    let rs = format!("{}.{rest}", b64(json!({"alg": "RS256", "kid": "k1"})));
    assert!(
        matches!(refused(rs).await, Refused::AlgorithmRefused(alg) if alg.starts_with("RS256"))
    );
    // Another key under the known kid.
    let impostor = SigningKey::es256("k1");
    assert_eq!(
        refused(impostor.sign(&claims(&url, "mallory"))).await,
        Refused::BadSignature
    );
    // A changed claim under the real signature.
    let (head, rest) = signed.split_once('.').unwrap();
    let (_, signature) = rest.split_once('.').unwrap();
    let forged = format!("{head}.{}.{signature}", b64(claims(&url, "root")));
    assert_eq!(refused(forged).await, Refused::BadSignature);
    assert_eq!(refused("a.b.c".into()).await, Refused::Malformed);
    assert_eq!(
        refused(SigningKey::es256("k9").sign(&claims(&url, "a"))).await,
        Refused::UnknownKey
    );
    // alice and bob; the token verified within the skew is past its exp.
    assert_eq!(identities.remembered(), 2, "refusals are not remembered");
}

#[tokio::test]
async fn unknown_kids_refetch_once_shared_and_rate_limited() {
    let first = SigningKey::es256("k1");
    let (state, url) = issuer(&[&first]).await;
    let identities = Arc::new(Identities::new(vec![provider(&url)]));

    // Concurrent first uses share one discovery and one JWKS fetch.
    let tasks: Vec<_> = (0..16)
        .map(|n| {
            let (identities, token) = (
                identities.clone(),
                first.sign(&claims(&url, &format!("u{n}"))),
            );
            tokio::spawn(async move { identities.verify(&token).await })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(fetches(&state), (1, 1));

    // Rotation: tokens of a new kid, concurrently, cost one refetch.
    let second = SigningKey::es256("k2");
    state.keys.lock().unwrap().push(second.jwk.clone());
    let tasks: Vec<_> = (0..16)
        .map(|n| {
            let (identities, token) = (
                identities.clone(),
                second.sign(&claims(&url, &format!("v{n}"))),
            );
            tokio::spawn(async move { identities.verify(&token).await })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(fetches(&state), (1, 2));

    // A flood of unknown kids within the interval: no fetch at all.
    let tasks: Vec<_> = (0..50)
        .map(|n| {
            let (identities, token) = (
                identities.clone(),
                SigningKey::es256(&format!("junk{n}")).sign(&claims(&url, "m")),
            );
            tokio::spawn(async move { identities.verify(&token).await })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap_err(), Refused::UnknownKey);
    }
    assert_eq!(
        fetches(&state),
        (1, 2),
        "the flood did not reach the issuer"
    );
    // Known keys keep verifying meanwhile.
    identities
        .verify(&first.sign(&claims(&url, "still")))
        .await
        .unwrap();
}

#[tokio::test]
async fn an_unreachable_issuer_is_a_401_until_it_answers() {
    let key = SigningKey::es256("k1");
    let (state, url) = issuer(&[&key]).await;
    state.down.store(true, Ordering::SeqCst);
    let identities = Identities::new(vec![provider(&url)]);
    let token = key.sign(&claims(&url, "alice"));
    let err = identities.verify(&token).await.unwrap_err();
    assert_eq!(err, Refused::Unreachable("corp".into()));
    assert_eq!(err.to_string(), "identity provider corp unreachable");
    // Retries are spaced: an immediate second try does not fetch.
    identities.verify(&token).await.unwrap_err();
    assert_eq!(fetches(&state), (1, 0));
    state.down.store(false, Ordering::SeqCst);
    tokio::time::sleep(jwks::UNREACHABLE_RETRY).await;
    identities.verify(&token).await.unwrap();

    // A key set over the size limit is not taken.
    let (state, url) = issuer(&[&key]).await;
    state.huge.store(true, Ordering::SeqCst);
    let identities = Identities::new(vec![provider(&url)]);
    assert_eq!(
        identities
            .verify(&key.sign(&claims(&url, "alice")))
            .await
            .unwrap_err(),
        Refused::Unreachable("corp".into())
    );
}

#[tokio::test]
async fn the_deciding_rule_gives_policy_roles_and_its_index() {
    use quiver_model::access::Role;

    let key = SigningKey::es256("k1");
    let (_state, url) = issuer(&[&key]).await;
    let mut with_roles = record(&url);
    with_roles.rules.insert(
        0,
        ClaimRule {
            claim: "email".into(),
            equals: Some("boss@example.com".into()),
            policy: Some("all".into()),
            roles: vec![Role::Admin, Role::Approver],
            ..Default::default()
        },
    );
    let identities = Identities::new(vec![Provider::new(0, &with_roles, |_| true).unwrap()]);

    let boss = key.sign(&with(
        claims(&url, "boss"),
        "email",
        json!("boss@example.com"),
    ));
    let boss = identities.verify(&boss).await.unwrap();
    assert_eq!(boss.policy.as_deref(), Some("all"));
    assert_eq!(boss.roles, vec![Role::Admin, Role::Approver]);
    assert_eq!(boss.rule, Some(0));

    let alice = identities
        .verify(&key.sign(&claims(&url, "alice")))
        .await
        .unwrap();
    assert_eq!(
        (alice.policy.as_deref(), alice.roles.as_slice(), alice.rule),
        (Some("team-a"), &[][..], Some(1))
    );
}

#[tokio::test]
async fn replacing_providers_keeps_the_keys_of_an_unchanged_issuer() {
    let key = SigningKey::es256("k1");
    let (state, url) = issuer(&[&key]).await;
    let identities = Identities::new(vec![provider(&url)]);
    let token = key.sign(&claims(&url, "alice"));
    assert_eq!(
        identities.verify(&token).await.unwrap().policy.as_deref(),
        Some("team-a")
    );
    assert_eq!(fetches(&state), (1, 1));

    // A rule edit (and a rename): the same issuer keeps its keys, the
    // remembered caller is forgotten and mapped by the new rules.
    let mut edited = record(&url);
    edited.name = "renamed".into();
    edited.rules[0].policy = Some("team-b".into());
    identities.replace(vec![Provider::new(0, &edited, |_| true).unwrap()]);
    assert_eq!(identities.remembered(), 0);
    let alice = identities.verify(&token).await.unwrap();
    assert_eq!(
        (alice.provider.as_str(), alice.policy.as_deref()),
        ("renamed", Some("team-b"))
    );
    assert_eq!(fetches(&state), (1, 1), "no refetch for a rule edit");

    // Another issuer gets its own keys, fetched on first use.
    let other_key = SigningKey::es256("o1");
    let (other_state, other_url) = issuer(&[&other_key]).await;
    identities.replace(vec![provider(&other_url), provider(&url)]);
    identities
        .verify(&other_key.sign(&claims(&other_url, "bob")))
        .await
        .unwrap();
    identities.verify(&token).await.unwrap();
    assert_eq!(fetches(&other_state), (1, 1));
    assert_eq!(fetches(&state), (1, 1));

    // Without providers every token is of a wrong issuer; the keys of a
    // dropped issuer go with it.
    identities.replace(Vec::new());
    assert!(identities.is_empty());
    assert_eq!(
        identities.verify(&token).await.unwrap_err(),
        Refused::WrongIssuer
    );
    identities.replace(vec![provider(&url)]);
    identities.verify(&token).await.unwrap();
    assert_eq!(fetches(&state), (2, 2), "a dropped issuer is fetched anew");
}

#[tokio::test]
async fn no_providers_refuse_every_token_as_of_a_wrong_issuer() {
    let key = SigningKey::es256("k1");
    let identities = Identities::new(Vec::new());
    assert!(identities.is_empty());
    assert_eq!(
        identities
            .verify(&key.sign(&claims("https://idp.example.com", "alice")))
            .await
            .unwrap_err(),
        Refused::WrongIssuer
    );
}
