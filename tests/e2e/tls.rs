//! Optional TLS of the listeners (`--tls-cert`/`--tls-key`) and of the
//! worker's registry client (`--registry https://…`, `--registry-ca`), with
//! a CA and a `localhost` certificate generated for the test.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use serde_json::json;

use crate::harness::{RegistryProcess, WorkerProcess, eventually, run_quiver};
use crate::worker::{ADMIN, CALLER, WORKER};

/// PEM files of a test CA and of a server certificate it issued for
/// `localhost` and 127.0.0.1.
struct TestPki {
    _dir: tempfile::TempDir,
    ca_pem: String,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl TestPki {
    fn generate() -> TestPki {
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "quiver test CA");
        let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().expect("server key");
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .expect("server params");
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        let cert = params.signed_by(&key, &issuer).expect("server certificate");

        let dir = tempfile::tempdir().expect("temp dir");
        let write = |name: &str, content: &str| -> PathBuf {
            let path = dir.path().join(name);
            std::fs::write(&path, content).expect("write PEM");
            path
        };
        let ca_pem = ca_cert.pem();
        TestPki {
            ca: write("ca.pem", &ca_pem),
            cert: write("server.pem", &cert.pem()),
            key: write("server.key", &key.serialize_pem()),
            ca_pem,
            _dir: dir,
        }
    }
}

fn path(path: &Path) -> &str {
    path.to_str().expect("utf-8 temp path")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_and_worker_serve_tls_and_sync_over_it() {
    let pki = TestPki::generate();
    let dir = tempfile::tempdir().expect("temp dir");
    let db_url = format!("sqlite://{}", dir.path().join("quiver.db").display());
    let registry = RegistryProcess::start(&[
        "--database-url",
        &db_url,
        "--admin-token",
        ADMIN,
        "--worker-token",
        WORKER,
        "--tls-cert",
        path(&pki.cert),
        "--tls-key",
        path(&pki.key),
    ])
    .await;
    let grpc_port = registry.grpc_addr().port();
    let http_port = registry
        .http_url()
        .rsplit(':')
        .next()
        .and_then(|port| port.parse::<u16>().ok())
        .expect("http port");

    // The worker follows the registry over https with the test CA, and
    // serves its own HTTP over TLS; `start_tls` waits for /readyz 200.
    let started = Instant::now();
    let registry_url = format!("https://localhost:{grpc_port}");
    let worker = WorkerProcess::start_tls(
        &registry_url,
        WORKER,
        CALLER,
        &[
            "--registry-ca",
            path(&pki.ca),
            "--tls-cert",
            path(&pki.cert),
            "--tls-key",
            path(&pki.key),
        ],
        pki.ca_pem.as_bytes(),
    )
    .await;
    eprintln!("tls worker ready in {:?}", started.elapsed());
    assert!(worker.url().starts_with("https://"), "{}", worker.url());

    // REST over https with the CA: an admin upsert reaches the worker
    // through the TLS watch stream.
    let trusting = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(pki.ca_pem.as_bytes()).expect("CA PEM")])
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let response = trusting
        .post(format!(
            "https://localhost:{http_port}/admin/api/mcp/servers"
        ))
        .bearer_auth(ADMIN)
        .json(&json!({
            "server_id": "over-tls",
            "transport": "streamable_http",
            "http": {"url": "http://127.0.0.1:9/mcp"},
            "allowed_tools": ["*"],
        }))
        .send()
        .await
        .expect("POST over https");
    assert!(response.status().is_success(), "{}", response.status());
    let body: serde_json::Value = response.json().await.expect("json");
    let revision = body["revision"].as_u64().expect("revision");
    eventually(
        Duration::from_secs(10),
        "worker synced over TLS",
        || async {
            let (_, ready) = worker.readyz().await;
            (ready["revision"] == revision).then_some(())
        },
    )
    .await;
    assert!(worker.server("over-tls").await.is_some());

    // The admin CLI speaks gRPC over TLS with the same CA flag.
    let listed = run_quiver(
        &[
            "servers",
            "list",
            "--output",
            "json",
            "--registry",
            &registry_url,
            "--registry-ca",
            path(&pki.ca),
            "--token",
            ADMIN,
        ],
        Duration::from_secs(20),
    )
    .await;
    assert!(
        listed.status.success() && listed.stdout.contains("over-tls"),
        "{listed:?}"
    );

    // Plaintext to the TLS ports fails: HTTP and gRPC.
    let plain = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    for port in [
        http_port,
        worker
            .url()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("port"),
    ] {
        let result = plain
            .get(format!("http://127.0.0.1:{port}/healthz"))
            .send()
            .await;
        assert!(result.is_err(), "plaintext to TLS port {port}: {result:?}");
    }
    let plain_grpc =
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{grpc_port}"))
            .expect("url")
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await;
    if let Ok(channel) = plain_grpc {
        let mut client = quiver_proto::credentials::Credentials::new(Some(WORKER), None)
            .expect("token")
            .client(channel);
        let listed = tokio::time::timeout(
            Duration::from_secs(5),
            client.list_mcp_servers(quiver_proto::v1::ListMcpServersRequest {}),
        )
        .await;
        assert!(
            !matches!(listed, Ok(Ok(_))),
            "plaintext gRPC to the TLS port answered"
        );
    }

    // A client without the CA (system roots only) is refused.
    let untrusting = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    let result = untrusting
        .get(format!("https://localhost:{http_port}/healthz"))
        .send()
        .await;
    assert!(result.is_err(), "https without the CA: {result:?}");
    let no_ca = tonic::transport::Endpoint::from_shared(registry_url.clone())
        .expect("url")
        .tls_config(quiver_proto::tls::client_tls(None).expect("system roots"))
        .expect("tls config")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await;
    assert!(no_ca.is_err(), "gRPC without the CA connected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_a_tls_configuration_names_the_missing_flag() {
    let pki = TestPki::generate();
    let finished = run_quiver(
        &[
            "registry",
            "--database-url",
            "sqlite::memory:",
            "--insecure-no-auth",
            "--grpc-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--tls-cert",
            path(&pki.cert),
        ],
        Duration::from_secs(20),
    )
    .await;
    assert!(!finished.status.success(), "{finished:?}");
    assert!(finished.stderr.contains("--tls-key"), "{}", finished.stderr);
    let finished = run_quiver(
        &[
            "worker",
            "--registry",
            "http://127.0.0.1:1",
            "--registry-ca",
            path(&pki.key),
        ],
        Duration::from_secs(20),
    )
    .await;
    assert!(!finished.status.success(), "{finished:?}");
    assert!(
        finished.stderr.contains("--registry-ca"),
        "{}",
        finished.stderr
    );
}
