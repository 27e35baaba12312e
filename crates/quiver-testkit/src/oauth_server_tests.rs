//! Tests of `oauth_server`: its parsers and escaping, and the user each flow issues tokens for.

use super::authorize::html_escape;
use super::wire::form_decode;
use super::*;

#[test]
fn form_decode_handles_escapes_and_truncation() {
    assert_eq!(form_decode("a%20b+c"), "a b c");
    assert_eq!(form_decode("%3A%"), ":%");
    assert_eq!(form_decode("%4"), "%4");
    assert_eq!(form_decode("%zz"), "%zz");
}

#[test]
fn faults_round_trip() {
    for fault in Fault::ALL {
        assert_eq!(fault.name().parse::<Fault>(), Ok(fault));
    }
    assert!("nope".parse::<Fault>().is_err());
}

#[test]
fn users_are_checked() {
    assert_eq!(
        User::new("bob").map(|user| user.to_string()),
        Ok("bob".into())
    );
    assert_eq!(User::new("é".repeat(MAX_USER_LEN)).map(|_| ()), Ok(()));
    assert_eq!(User::new(""), Err(InvalidUser));
    assert_eq!(User::new("a".repeat(MAX_USER_LEN + 1)), Err(InvalidUser));
    assert_eq!(User::new("bo\nb"), Err(InvalidUser));
}

#[test]
fn html_escape_escapes_markup() {
    assert_eq!(
        html_escape(r#"<a href="x">'&'</a>"#),
        "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
    );
}

mod users {
    use std::collections::BTreeMap;
    use std::time::{Duration, Instant};

    use axum::http::{StatusCode, header};
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use rmcp::ServiceExt as _;
    use rmcp::model::CallToolRequestParams;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use serde_json::{Value, json};
    use sha2::{Digest as _, Sha256};
    use url::Url;

    use super::super::state::{AuthorizationRequest, random_token};
    use super::super::*;

    /// Upper bound for anything that should be quick.
    const WAIT: Duration = Duration::from_secs(20);
    const CLIENT: &str = "app";
    const REDIRECT: &str = "http://127.0.0.1:1/callback";
    const VERIFIER: &str = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
    const FORM: &str = "application/x-www-form-urlencoded";

    /// The server on a free port with the public client [`CLIENT`];
    /// stopped on drop.
    struct Running {
        server: OAuthServer,
        base: String,
        http: reqwest::Client,
        task: tokio::task::JoinHandle<anyhow::Result<()>>,
    }

    impl Drop for Running {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    impl Running {
        async fn start(options: OAuthServerOptions) -> Self {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let base = format!("http://{}", listener.local_addr().expect("address"));
            let server = OAuthServer::new(&base, options);
            let task = tokio::spawn(server.clone().serve(listener));
            let http = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(WAIT)
                .build()
                .expect("reqwest client");
            let running = Self {
                server,
                base,
                http,
                task,
            };
            let (status, body) = running
                .post_json(
                    "/admin/clients",
                    json!({"client_id": CLIENT, "redirect_uris": [REDIRECT]}),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
            running
        }

        fn url(&self, path: &str) -> String {
            format!("{}{path}", self.base)
        }

        async fn post_json(&self, path: &str, body: Value) -> (StatusCode, Value) {
            let response = self
                .http
                .post(self.url(path))
                .json(&body)
                .send()
                .await
                .expect("POST");
            let status = response.status();
            (status, response.json().await.expect("JSON"))
        }

        async fn post_form(&self, path: &str, form: &[(&str, &str)]) -> reqwest::Response {
            self.http
                .post(self.url(path))
                .header(header::CONTENT_TYPE, FORM)
                .body(encode(form))
                .send()
                .await
                .expect("POST form")
        }

        /// `GET /authorize` for [`CLIENT`] (state `st-1`).
        async fn authorize(&self) -> reqwest::Response {
            let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(VERIFIER.as_bytes()));
            let query = encode(&[
                ("response_type", "code"),
                ("client_id", CLIENT),
                ("redirect_uri", REDIRECT),
                ("code_challenge", &challenge),
                ("code_challenge_method", "S256"),
                ("state", "st-1"),
            ]);
            self.http
                .get(format!("{}?{query}", self.url("/authorize")))
                .send()
                .await
                .expect("GET /authorize")
        }

        /// The code a redirect back to [`REDIRECT`] carries.
        fn code_of(&self, response: &reqwest::Response) -> String {
            assert_eq!(response.status(), StatusCode::FOUND);
            let location = response.headers()[header::LOCATION]
                .to_str()
                .expect("ascii Location");
            assert!(location.starts_with(REDIRECT), "{location}");
            let url = Url::parse(location).expect("Location is a URL");
            let param = |name: &str| {
                url.query_pairs()
                    .find(|(key, _)| key == name)
                    .map(|(_, value)| value.into_owned())
            };
            assert_eq!(param("state").as_deref(), Some("st-1"));
            assert_eq!(param("iss"), Some(self.base.clone()));
            param("code").expect("code")
        }

        /// `/token`'s answer to `form`, which must be a success.
        async fn tokens(&self, form: &[(&str, &str)]) -> Value {
            let response = self.post_form("/token", form).await;
            let status = response.status();
            let body: Value = response.json().await.expect("token JSON");
            assert_eq!(status, StatusCode::OK, "{body}");
            body
        }

        async fn exchange(&self, code: &str) -> Value {
            self.tokens(&[
                ("grant_type", "authorization_code"),
                ("code", code),
                ("code_verifier", VERIFIER),
                ("redirect_uri", REDIRECT),
                ("client_id", CLIENT),
            ])
            .await
        }

        /// The text `tool` answers a caller with `access_token`.
        async fn call(&self, access_token: &str, tool: &str) -> String {
            let transport = StreamableHttpClientTransport::from_config(
                StreamableHttpClientTransportConfig::with_uri(self.url("/mcp"))
                    .auth_header(access_token),
            );
            let client = tokio::time::timeout(WAIT, ().serve(transport))
                .await
                .expect("initialize timed out")
                .expect("initialize");
            let result = tokio::time::timeout(
                WAIT,
                client.call_tool(CallToolRequestParams::new(tool.to_owned())),
            )
            .await
            .expect("tools/call timed out")
            .expect("tools/call");
            let _ = client.cancel().await;
            result.content[0].as_text().expect("text").text.clone()
        }

        /// `GET /admin/tokens`' user of `token`.
        async fn user_of(&self, token: &str) -> Value {
            let body: Value = self
                .http
                .get(self.url("/admin/tokens"))
                .send()
                .await
                .expect("GET /admin/tokens")
                .json()
                .await
                .expect("tokens JSON");
            body["users"][token].clone()
        }
    }

    fn encode(params: &[(&str, &str)]) -> String {
        url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params)
            .finish()
    }

    fn access_token(tokens: &Value) -> &str {
        tokens["access_token"].as_str().expect("access_token")
    }

    #[tokio::test]
    async fn auto_user_is_the_tokens_user() {
        let running = Running::start(OAuthServerOptions {
            clients: vec!["machine:s3cret".parse().expect("ID:SECRET")],
            ..Default::default()
        })
        .await;
        let code = running.code_of(&running.authorize().await);
        let tokens = running.exchange(&code).await;
        let access = access_token(&tokens);
        assert_eq!(running.call(access, "whoami_user").await, DEFAULT_AUTO_USER);
        assert_eq!(running.call(access, "whoami").await, CLIENT);
        assert_eq!(running.user_of(access).await, json!(DEFAULT_AUTO_USER));

        let (status, body) = running
            .post_json("/admin/auto-user", json!({"user": "bob"}))
            .await;
        assert_eq!((status, body), (StatusCode::OK, json!({"user": "bob"})));
        let code = running.code_of(&running.authorize().await);
        let tokens = running.exchange(&code).await;
        let access = access_token(&tokens);
        assert_eq!(running.call(access, "whoami_user").await, "bob");
        assert_eq!(running.user_of(access).await, json!("bob"));
        let refresh = tokens["refresh_token"].as_str().expect("refresh_token");
        assert_eq!(running.user_of(refresh).await, json!("bob"));

        for bad in [json!({"user": ""}), json!({"user": "a\u{7}b"}), json!({})] {
            let (status, body) = running.post_json("/admin/auto-user", bad).await;
            assert_eq!(status, StatusCode::BAD_REQUEST);
            let description = body["error_description"].as_str().expect("description");
            assert!(description.contains("user"), "{description}");
        }

        // client_credentials: the client is its own user.
        let tokens = running
            .tokens(&[
                ("grant_type", "client_credentials"),
                ("client_id", "machine"),
                ("client_secret", "s3cret"),
            ])
            .await;
        assert_eq!(
            running.call(access_token(&tokens), "whoami_user").await,
            "machine"
        );
    }

    #[tokio::test]
    async fn consent_page_grants_for_the_user_named() {
        let running = Running::start(OAuthServerOptions {
            consent_page: true,
            ..Default::default()
        })
        .await;
        let response = running.authorize().await;
        assert_eq!(response.status(), StatusCode::OK);
        let content_type = response.headers()[header::CONTENT_TYPE]
            .to_str()
            .expect("ascii content type");
        assert!(content_type.starts_with("text/html"), "{content_type}");
        let page = response.text().await.expect("page");
        assert!(page.contains(r#"name="user""#), "{page}");
        assert!(page.contains(r#"id="user""#), "{page}");
        assert!(page.contains(r#"id="approve""#), "{page}");
        assert!(!page.contains("<script"), "{page}");
        let id = page
            .split(r#"name="request" value=""#)
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .expect("hidden request field")
            .to_owned();

        // A bad user is refused without spending the request.
        let response = running
            .post_form("/authorize", &[("request", &id), ("user", "")])
            .await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let body: Value = response.json().await.expect("error JSON");
        assert!(
            body["error_description"]
                .as_str()
                .expect("description")
                .contains("user")
        );

        let response = running
            .post_form("/authorize", &[("request", &id), ("user", "carol")])
            .await;
        let code = running.code_of(&response);
        let tokens = running.exchange(&code).await;
        assert_eq!(
            running.call(access_token(&tokens), "whoami_user").await,
            "carol"
        );

        // Answered once; unknown and expired requests are refused alike.
        let expired = random_token();
        {
            let request = AuthorizationRequest {
                client_id: CLIENT.to_owned(),
                redirect_uri: REDIRECT.to_owned(),
                challenge: URL_SAFE_NO_PAD.encode(Sha256::digest(VERIFIER.as_bytes())),
                scope: SCOPE.to_owned(),
                nonce: None,
                state: None,
            };
            let mut store = running.server.shared.store();
            store
                .hold_for_consent(expired.clone(), request, Instant::now())
                .unwrap_or_else(|failure| panic!("{}", failure.description));
            let pending = store.consents.get_mut(&expired).expect("held");
            pending.expires = Instant::now();
        }
        for id in [id.as_str(), "nope", expired.as_str()] {
            let response = running
                .post_form("/authorize", &[("request", id), ("user", "carol")])
                .await;
            assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{id}");
            let body: Value = response.json().await.expect("error JSON");
            let description = body["error_description"].as_str().expect("description");
            assert!(description.starts_with("request"), "{description}");
        }
    }

    #[tokio::test]
    async fn refresh_keeps_the_user() {
        let running = Running::start(OAuthServerOptions::default()).await;
        running
            .server
            .set_auto_user(User::new("dave").expect("user"));
        let code = running.code_of(&running.authorize().await);
        let tokens = running.exchange(&code).await;
        let refresh = tokens["refresh_token"].as_str().expect("refresh_token");
        let refreshed = running
            .tokens(&[
                ("grant_type", "refresh_token"),
                ("refresh_token", refresh),
                ("client_id", CLIENT),
            ])
            .await;
        let access = access_token(&refreshed);
        assert_eq!(running.call(access, "whoami_user").await, "dave");
        let rotated = refreshed["refresh_token"].as_str().expect("rotated");
        assert_eq!(running.user_of(rotated).await, json!("dave"));
        let stats = running.server.stats();
        assert_eq!(stats.refresh_grants, 1);
        assert_eq!(
            stats.refresh_grants_by_user,
            BTreeMap::from([("dave".to_owned(), 1)])
        );
    }
}
