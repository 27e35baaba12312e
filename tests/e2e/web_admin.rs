//! The web admin (docs/reference.md §5, R-UI-1…6) in a real browser: Debian's Chromium
//! driven by playwright-core (`tests/web/admin.spec.mjs`) against a real
//! registry process (SQLite, admin and worker tokens, an `mcp.d` directory)
//! and a real worker following it, so worker status is real too.
//!
//! This test owns the processes and checks how the registry serves the
//! embedded files; the script drives the pages (sign-in, create with tool
//! preview, edit, validation errors, edit conflicts, history and rollback,
//! worker status, import and rescan, a server.json imported after its dry
//! run and one refused naming its field, delete, read-only view) and saves
//! screenshots under `target/web-admin-screenshots/admin/`.
//!
//! A second test (`tests/web/signin.spec.mjs`) signs people in with the
//! organisation's identity provider — a `quiver-testkit-oauth` issuer — and
//! drives the Access page's lists and explanations (issue #22).
//!
//! Chromium (`QUIVER_TEST_CHROMIUM`, default `/usr/bin/chromium`) and the
//! pinned playwright-core (`QUIVER_TEST_NODE_MODULES`, default
//! `tests/web/node_modules`) are installed by `scripts/test.sh`. Without
//! them the test fails: it never skips silently.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use reqwest::header::{CONTENT_SECURITY_POLICY, CONTENT_TYPE, ETAG, IF_NONE_MATCH};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::harness::{
    Admin, RegistryProcess, WorkerProcess, registry, sqlite, stdio_record, testkit_mcp_bin,
};
use crate::oauth::OAuthServer;
use crate::worker::{ADMIN, WORKER};

const CALLER: &str = "e2e-web-caller-token";
const APPROVER: &str = "e2e-web-approver-token";
const VIEWER: &str = "e2e-web-viewer-token";
const WORKER_ID: &str = "e2e-web-worker";
/// Hard limit for the browser script (it normally takes 15–30 s).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(150);

pub(crate) fn workspace() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::canonicalize(&path).unwrap_or(path)
}

/// The Chromium binary; fails the test when it is not installed.
fn chromium() -> String {
    let chromium =
        std::env::var("QUIVER_TEST_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_owned());
    assert!(
        Path::new(&chromium).is_file(),
        "Chromium is not installed at {chromium}: the web admin browser test needs Debian's \
         chromium; run the suite with scripts/test.sh (it installs it), or \
         `apt-get install -y --no-install-recommends chromium` (or set QUIVER_TEST_CHROMIUM)"
    );
    chromium
}

/// The `node_modules` holding playwright-core; fails the test when missing.
fn node_modules() -> PathBuf {
    let modules = std::env::var_os("QUIVER_TEST_NODE_MODULES")
        .map_or_else(|| workspace().join("tests/web/node_modules"), PathBuf::from);
    assert!(
        modules.join("playwright-core/package.json").is_file(),
        "playwright-core is not installed in {}: run the suite with scripts/test.sh, or \
         `(cd tests/web && npm ci)` (or set QUIVER_TEST_NODE_MODULES)",
        modules.display()
    );
    modules
}

/// Checks the `node` on `PATH` runs.
async fn node_version() -> String {
    let output = tokio::process::Command::new("node")
        .arg("--version")
        .output()
        .await
        .unwrap_or_else(|err| {
            panic!("cannot run `node` ({err}): the web admin browser test needs Node.js >= 20 on PATH (see scripts/test.sh)")
        });
    assert!(output.status.success(), "node --version failed: {output:?}");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// The embedded files are served with their types, deep links get the page,
/// unknown files and API routes are 404, and nothing needs a credential.
async fn check_serving(base: &str) {
    let client = reqwest::Client::new();
    let get = |path: &str| client.get(format!("{base}{path}")).send();
    for path in [
        "/admin",
        "/admin/",
        "/admin/servers/some-id",
        "/admin/workers",
    ] {
        let response = get(path).await.expect("GET page");
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        assert_eq!(
            response.headers()[CONTENT_TYPE],
            "text/html; charset=utf-8",
            "{path}"
        );
        assert!(
            response.headers()[CONTENT_SECURITY_POLICY]
                .to_str()
                .unwrap()
                .contains("default-src 'none'"),
            "{path}: a content security policy"
        );
        let body = response.text().await.unwrap();
        assert!(
            body.contains(r#"<script type="module" src="/admin/js/app.js">"#),
            "{path}: {body}"
        );
        assert!(
            !body.contains("https://") && !body.contains("http://"),
            "{path}: no external resource"
        );
    }
    for (path, content_type) in [
        ("/admin/js/app.js", "text/javascript; charset=utf-8"),
        ("/admin/js/form.js", "text/javascript; charset=utf-8"),
        ("/admin/app.css", "text/css; charset=utf-8"),
        ("/admin/favicon.svg", "image/svg+xml"),
    ] {
        let response = get(path).await.expect("GET asset");
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        assert_eq!(response.headers()[CONTENT_TYPE], content_type, "{path}");
        let etag = response.headers()[ETAG].clone();
        let again = client
            .get(format!("{base}{path}"))
            .header(IF_NONE_MATCH, etag)
            .send()
            .await
            .expect("revalidate");
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED, "{path}");
    }
    let missing = get("/admin/js/missing.js").await.expect("GET missing");
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    let api = get("/admin/api/no-such-route").await.expect("GET api");
    assert_eq!(api.status(), StatusCode::NOT_FOUND);
    let body: serde_json::Value = api.json().await.expect("JSON error");
    assert_eq!(body["error"]["code"], "not_found", "{body}");
    // The API itself still needs a token.
    let whoami = get("/admin/api/whoami").await.expect("GET whoami");
    assert_eq!(whoami.status(), StatusCode::UNAUTHORIZED);
}

/// Two pending approvals, requested over gRPC with the worker token as a
/// worker would (the worker side does not request them yet): the page
/// approves `approve_me` and denies `deny_me`.
async fn request_approvals(grpc_url: &str) {
    let channel = tonic::transport::Channel::from_shared(grpc_url.to_owned())
        .expect("grpc url")
        .connect()
        .await
        .expect("connect to the registry");
    let mut client = quiver_proto::credentials::Credentials::new(Some(WORKER), Some(WORKER_ID))
        .expect("credentials")
        .approval_client(channel);
    for tool in ["approve_me", "deny_me"] {
        let arguments =
            serde_json::json!({"path": format!("/srv/{tool}"), "api_key": "sk-approval-secret"});
        client
            .request_approval(quiver_proto::v1::RequestApprovalRequest {
                task: "web-task".into(),
                server_id: "web-files".into(),
                tool: tool.into(),
                arguments_json: arguments.to_string(),
                arguments_hash: quiver_model::approval::canonical_arguments_hash(&arguments),
                record_revision: 1,
                ..Default::default()
            })
            .await
            .expect("request an approval");
    }
}

/// How a browser script ended.
struct ScriptRun {
    /// Its exit status; `None` when it was killed at [`SCRIPT_TIMEOUT`].
    status: Option<ExitStatus>,
    /// Its stdout, then its stderr.
    log: String,
}

/// Runs `node <script>` in `tests/web` with `env` added to the environment
/// (and no proxy: loopback only), echoing its output as it comes; kills it
/// after [`SCRIPT_TIMEOUT`].
async fn run_script(script: &Path, env: &[(&str, OsString)]) -> ScriptRun {
    let mut command = tokio::process::Command::new("node");
    command
        .arg(script)
        .current_dir(workspace().join("tests/web"))
        .envs(env.iter().map(|(key, value)| (*key, value)))
        // Loopback only: no proxy may sit between the browser and the registry.
        .env("NO_PROXY", "*")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("spawn node");
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr = child.stderr.take().expect("piped stderr");
    // Both streams are echoed as they come (visible with --no-capture and in
    // failure output) and kept for the failure message.
    let echo = |stream: Box<dyn tokio::io::AsyncRead + Unpin + Send>| {
        tokio::spawn(async move {
            let mut lines = BufReader::new(stream).lines();
            let mut kept = Vec::new();
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("{line}");
                kept.push(line);
            }
            kept
        })
    };
    let out = echo(Box::new(stdout));
    let err = echo(Box::new(stderr));
    let status = match tokio::time::timeout(SCRIPT_TIMEOUT, child.wait()).await {
        Ok(status) => Some(status.expect("wait for node")),
        Err(_) => {
            let _ = child.kill().await;
            None
        }
    };
    let mut log = out.await.unwrap_or_default();
    log.extend(err.await.unwrap_or_default());
    let log = log.join("\n");
    ScriptRun { status, log }
}

/// Runs the browser script `script` (a file of `tests/web`, e.g.
/// `oauth.spec.mjs`, or an absolute path) with Node.js and playwright-core in
/// Chromium, with `env` added to its environment. `QUIVER_TEST_CHROMIUM` and
/// `QUIVER_TEST_NODE_MODULES` are set (the test fails when either is
/// missing), and so are `QUIVER_SCREENSHOTS` and `QUIVER_SCREENSHOT_DIR`
/// (`target/web-admin-screenshots/<script's stem>/`) unless `env` names
/// one. Panics with the script's output when it exits non-zero or does not
/// finish within [`SCRIPT_TIMEOUT`].
pub(crate) async fn run_browser_script(script: &str, env: &[(&str, String)]) {
    let chromium = chromium();
    let modules = node_modules();
    let node = node_version().await;
    let script = workspace().join("tests/web").join(script);
    let stem = script
        .file_name()
        .and_then(|name| name.to_str())
        .and_then(|name| name.split('.').next())
        .unwrap_or("script")
        .to_owned();
    let screenshots = env
        .iter()
        .find(|(key, _)| *key == "QUIVER_SCREENSHOTS" || *key == "QUIVER_SCREENSHOT_DIR")
        .map_or_else(
            || workspace().join("target/web-admin-screenshots").join(&stem),
            |(_, dir)| PathBuf::from(dir),
        );
    std::fs::create_dir_all(&screenshots).expect("screenshot dir");
    let mut full: Vec<(&str, OsString)> = vec![
        ("QUIVER_TEST_CHROMIUM", chromium.clone().into()),
        ("QUIVER_TEST_NODE_MODULES", modules.into()),
        ("QUIVER_SCREENSHOTS", screenshots.clone().into()),
        ("QUIVER_SCREENSHOT_DIR", screenshots.clone().into()),
    ];
    full.extend(env.iter().map(|(key, value)| (*key, OsString::from(value))));
    let started = Instant::now();
    let ScriptRun { status, log } = run_script(&script, &full).await;
    match status {
        None => panic!(
            "the browser script {} did not finish within {SCRIPT_TIMEOUT:?}; its output:\n{log}",
            script.display()
        ),
        Some(status) if !status.success() => panic!(
            "the browser script {} failed ({status}, node {node}, {chromium}); screenshots in {}; \
             its output:\n{log}",
            script.display(),
            screenshots.display()
        ),
        Some(_) => eprintln!(
            "browser script {} passed in {:.1?} (node {node}); screenshots in {}",
            script.display(),
            started.elapsed(),
            screenshots.display()
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_admin_in_chromium() {
    let chromium = chromium();
    let modules = node_modules();
    let node = node_version().await;

    let dir = tempfile::tempdir().expect("temp dir");
    let mcp_dir = dir.path().join("mcp.d");
    std::fs::create_dir(&mcp_dir).expect("mcp.d");
    let db_url = format!("sqlite://{}", dir.path().join("quiver.db").display());
    let mcp_dir_arg = mcp_dir.to_str().expect("utf-8 path").to_owned();
    let registry = RegistryProcess::start(&[
        "--database-url",
        &db_url,
        "--admin-token",
        ADMIN,
        "--worker-token",
        WORKER,
        "--approver-token",
        APPROVER,
        "--viewer-token",
        VIEWER,
        "--mcp-dir",
        &mcp_dir_arg,
        // Rescans happen when the page asks for them, nowhere else.
        "--rescan-interval-secs",
        "0",
    ])
    .await;
    let worker = WorkerProcess::start(
        &registry.grpc_url(),
        WORKER,
        CALLER,
        &["--worker-id", WORKER_ID],
    )
    .await;

    check_serving(&registry.http_url()).await;
    request_approvals(&registry.grpc_url()).await;

    // Its own directory only: other browser tests write theirs next to it
    // at the same time.
    let screenshots = workspace().join("target/web-admin-screenshots/admin");
    let _ = std::fs::remove_dir_all(&screenshots);
    std::fs::create_dir_all(&screenshots).expect("screenshot dir");
    let script = workspace().join("tests/web/admin.spec.mjs");

    let started = Instant::now();
    let ScriptRun { status, log } = run_script(
        &script,
        &[
            ("QUIVER_REGISTRY_URL", registry.http_url().into()),
            ("QUIVER_ADMIN_TOKEN", ADMIN.into()),
            ("QUIVER_WORKER_TOKEN", WORKER.into()),
            ("QUIVER_APPROVER_TOKEN", APPROVER.into()),
            ("QUIVER_VIEWER_TOKEN", VIEWER.into()),
            ("QUIVER_WORKER_ID", WORKER_ID.into()),
            ("QUIVER_WORKER_URL", worker.url().into()),
            ("QUIVER_CALLER_TOKEN", CALLER.into()),
            ("QUIVER_MCP_BIN", testkit_mcp_bin().into()),
            ("QUIVER_MCP_DIR", mcp_dir.clone().into()),
            ("QUIVER_SCREENSHOT_DIR", screenshots.clone().into()),
            ("QUIVER_TEST_CHROMIUM", chromium.clone().into()),
            ("QUIVER_TEST_NODE_MODULES", modules.into()),
        ],
    )
    .await;
    match status {
        None => panic!(
            "the browser script did not finish within {SCRIPT_TIMEOUT:?}; its output:\n{log}\n\
             registry log:\n{}\nworker log:\n{}",
            registry.log_tail(),
            worker.log_tail()
        ),
        Some(status) if !status.success() => panic!(
            "the browser script failed ({status}, node {node}, {chromium}); screenshots in {}; \
             its output:\n{log}\nregistry log:\n{}\nworker log:\n{}",
            screenshots.display(),
            registry.log_tail(),
            worker.log_tail()
        ),
        Some(_) => eprintln!(
            "web admin browser test passed in {:.1?} (node {node}); screenshots in {}",
            started.elapsed(),
            screenshots.display()
        ),
    }
    for name in [
        "01-sign-in",
        "02-servers",
        "03-create-with-preview",
        "07-workers",
        "12-server-json-dry-run",
        "13-server-json-error",
    ] {
        assert!(
            screenshots.join(format!("{name}.png")).is_file(),
            "screenshot {name}.png"
        );
    }
}

/// The identity provider's name in the registry, and the public client the
/// web admin signs people in with.
const PROVIDER: &str = "corp";
const WEB_CLIENT: &str = "quiver-web";
/// The policy viewers and the API key get.
const POLICY: &str = "team-a";

/// Sends `body` as JSON (with `token` as bearer, if any); panics unless the
/// answer is a success. The answer's JSON (`null` when empty).
async fn send_json(method: Method, url: &str, token: Option<&str>, body: Value) -> Value {
    let mut request = reqwest::Client::new()
        .request(method.clone(), url)
        .json(&body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request
        .send()
        .await
        .unwrap_or_else(|err| panic!("{method} {url}: {err}"));
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    assert!(
        status.is_success(),
        "{method} {url} {body}: {status} {text}"
    );
    serde_json::from_str(&text).unwrap_or(Value::Null)
}

/// People sign in with the organisation's identity provider, and the Access
/// page explains who may call (issue #22), in Chromium: a
/// `quiver-testkit-oauth` issuer whose public client [`WEB_CLIENT`] comes
/// back to the registry's sign-in callback; a registry (SQLite) trusting it
/// as [`PROVIDER`], whose rules give `admins` the admin role and `viewers`
/// the viewer role and [`POLICY`]; that policy (server `alpha` only, minus
/// `alpha.add`), servers `alpha` and `beta`, and an API key naming the
/// policy. The script picks who signs in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_admin_signin_and_access_in_chromium() {
    let issuer = OAuthServer::start(&[]).await;
    let (_dir, db_url) = sqlite();
    let registry = registry(&db_url, None).await;
    let base = registry.http_url();
    let admin = Admin::new(&registry, ADMIN);
    admin.upsert(stdio_record("alpha", &["echo", "add"])).await;
    admin.upsert(stdio_record("beta", &["echo"])).await;

    send_json(
        Method::POST,
        &format!("{}/admin/clients", issuer.base),
        None,
        json!({"client_id": WEB_CLIENT, "redirect_uris": [format!("{base}/admin/signin/callback")]}),
    )
    .await;
    send_json(
        Method::PUT,
        &format!("{base}/admin/api/policies/{POLICY}"),
        Some(ADMIN),
        json!({"allowed_server_ids": ["alpha"], "tool_denylist": ["alpha.add"]}),
    )
    .await;
    send_json(
        Method::PUT,
        &format!("{base}/admin/api/identity/providers/{PROVIDER}"),
        Some(ADMIN),
        json!({
            "issuer": issuer.base,
            "audiences": [WEB_CLIENT],
            "web_client_id": WEB_CLIENT,
            "rules": [
                {"claim": "groups", "contains": "admins", "roles": ["admin"]},
                {"claim": "groups", "contains": "viewers", "roles": ["viewer"], "policy": POLICY},
            ],
        }),
    )
    .await;
    let key = send_json(
        Method::POST,
        &format!("{base}/admin/api/keys"),
        Some(ADMIN),
        json!({"name": "ci", "policy": POLICY}),
    )
    .await;
    let key_id = key["id"].as_str().expect("key id").to_owned();
    let key_secret = key["key"].as_str().expect("key secret").to_owned();

    // The sign-in page lists the provider without any credential.
    let providers: Value = reqwest::get(format!("{base}/admin/signin/providers"))
        .await
        .expect("GET /admin/signin/providers")
        .json()
        .await
        .expect("providers JSON");
    assert_eq!(providers, json!({"providers": [{"name": PROVIDER}]}));

    run_browser_script(
        "signin.spec.mjs",
        &[
            ("QUIVER_REGISTRY_URL", base.clone()),
            ("QUIVER_ISSUER_URL", issuer.base.clone()),
            ("QUIVER_PROVIDER", PROVIDER.to_owned()),
            ("QUIVER_POLICY", POLICY.to_owned()),
            ("QUIVER_KEY_ID", key_id),
            ("QUIVER_KEY_SECRET", key_secret.clone()),
        ],
    )
    .await;
    assert!(
        !registry.log_tail().contains(&key_secret),
        "the key secret is in the registry's log"
    );
}
