//! `docker-compose.yml` and the `Dockerfile` cannot run here (no Docker
//! engine), so this checks what can be checked: every file they reference
//! exists, the image builds and starts the binary this repository builds, and
//! the registry service's exact command line and environment are accepted by
//! that binary (run as a `--dry-run` against a real PostgreSQL database).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use quiver_testkit::postgres::TestDatabase;
use serde::Deserialize;

#[derive(Deserialize)]
struct Compose {
    services: BTreeMap<String, Service>,
}

#[derive(Deserialize)]
struct Service {
    #[serde(default)]
    build: Option<String>,
    #[serde(default)]
    command: Vec<String>,
    #[serde(default)]
    environment: BTreeMap<String, String>,
    #[serde(default)]
    volumes: Vec<String>,
    #[serde(default)]
    depends_on: BTreeMap<String, serde_yaml_ng::Value>,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn compose() -> Compose {
    let text = std::fs::read_to_string(repo_root().join("docker-compose.yml")).unwrap();
    serde_yaml_ng::from_str(&text).expect("docker-compose.yml parses")
}

#[test]
fn compose_references_existing_files_and_services() {
    let compose = compose();
    for (name, service) in &compose.services {
        for dependency in service.depends_on.keys() {
            assert!(
                compose.services.contains_key(dependency),
                "{name} depends on unknown service {dependency}"
            );
        }
        for volume in &service.volumes {
            let source = volume.split(':').next().unwrap();
            if source.starts_with("./") {
                assert!(
                    repo_root().join(source).exists(),
                    "{name} mounts missing {source}"
                );
            }
        }
    }
    let registry = &compose.services["registry"];
    assert_eq!(registry.build.as_deref(), Some("."));
    let dockerfile = std::fs::read_to_string(repo_root().join("Dockerfile")).unwrap();
    assert!(
        dockerfile.contains("cargo build --release --locked -p quiver"),
        "the image builds the quiver binary"
    );
    assert!(dockerfile.contains("target/release/quiver"));
    assert!(dockerfile.contains("COPY config /etc/quiver"));
    assert!(dockerfile.contains("ENTRYPOINT [\"quiver\"]"));
}

/// Maps a path inside the image to this checkout (`COPY config /etc/quiver`).
fn host_path(arg: &str) -> String {
    match arg.strip_prefix("/etc/quiver") {
        Some(rest) => repo_root()
            .join(format!("config{rest}"))
            .display()
            .to_string(),
        None => arg.to_owned(),
    }
}

#[tokio::test]
async fn the_registry_service_command_is_accepted_by_the_binary() {
    let compose = compose();
    let registry = &compose.services["registry"];
    let db = TestDatabase::create().await;
    let mut command = Command::new(env!("CARGO_BIN_EXE_quiver"));
    command
        .args(registry.command.iter().map(|arg| host_path(arg)))
        .arg("--dry-run");
    command
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    for (key, value) in &registry.environment {
        let value = match key.as_str() {
            // Same variables, values for this machine.
            "QUIVER_DATABASE_URL" => db.url().to_owned(),
            "QUIVER_GRPC_LISTEN" | "QUIVER_REGISTRY_HTTP_LISTEN" => "127.0.0.1:0".to_owned(),
            _ => interpolated(value),
        };
        command.env(key, value);
    }
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "compose's registry command failed:\n{stdout}\n{stderr}"
    );
    for id in ["filesystem", "github", "memory", "legacy-sse"] {
        assert!(
            stdout.contains(&format!("+ create {id}")),
            "dry-run plans the example {id}:\n{stdout}"
        );
    }
}

/// A compose value as compose would interpolate it with the variable unset:
/// `${VAR:-default}` gives the default; a required `${VAR:?…}` gets a test
/// token.
fn interpolated(value: &str) -> String {
    match value
        .strip_prefix("${")
        .and_then(|rest| rest.strip_suffix('}'))
    {
        Some(inner) => match inner.split_once(":-") {
            Some((_, default)) => default.to_owned(),
            None => "token-for-test".to_owned(),
        },
        None => value.to_owned(),
    }
}

/// Every worker service's command line and environment start a real worker
/// (against a registry that is not there: it must still start, listen and
/// report itself not ready, rather than exit).
#[tokio::test]
async fn the_worker_service_commands_start_a_worker() {
    let compose = compose();
    let workers: Vec<_> = compose
        .services
        .iter()
        .filter(|(_, service)| service.command.first().map(String::as_str) == Some("worker"))
        .collect();
    assert!(workers.len() >= 2, "compose runs at least two workers");
    for (name, service) in workers {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_quiver"));
        command.args(service.command.iter().map(|arg| host_path(arg)));
        command
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default());
        for (key, value) in &service.environment {
            let value = match key.as_str() {
                "QUIVER_REGISTRY" => "http://127.0.0.1:1".to_owned(),
                "QUIVER_WORKER_HTTP_LISTEN" => "127.0.0.1:0".to_owned(),
                _ => interpolated(value),
            };
            command.env(key, value);
        }
        command
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stderr));
        let listening = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            let mut seen = Vec::new();
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains("quiver worker listening") {
                    return Ok(line);
                }
                seen.push(line);
            }
            Err(seen.join("\n"))
        })
        .await
        .unwrap_or_else(|_| panic!("{name}: no listening line within 10 s"));
        let line =
            listening.unwrap_or_else(|log| panic!("{name}: exited before listening:\n{log}"));
        let event: serde_json::Value = serde_json::from_str(&line).unwrap();
        let http = event["fields"]["http"].as_str().unwrap().to_owned();
        let ready = reqwest::get(format!("http://{http}/readyz")).await.unwrap();
        assert_eq!(ready.status(), 503, "{name}: not ready without a registry");
        child.kill().await.unwrap();
    }
}
