//! The Kubernetes deployment of `deploy/kubernetes/` (a kustomize base and
//! overlays), checked without a cluster:
//!
//! - every manifest file passes `kubernetes-validate --strict` against the
//!   pinned Kubernetes versions (the validator comes from the venv of
//!   `QUIVER_TEST_PYTHON`, pinned in `scripts/test.sh`; without it the test
//!   fails, it never skips);
//! - each `kustomization.yaml` lists exactly the files beside it;
//! - the rendered base and overlays have what the deployment promises
//!   (replicas, disruption budget, autoscaler, probes, Secrets, limits,
//!   security contexts, network policies);
//! - the pods' own command lines, config files, Secret files and mcp.d copy
//!   start a real registry and a real worker that serves the dev overlay's
//!   example server.
//!
//! Rendering implements the part of kustomize these manifests use (resources,
//! `namespace`, `configMapGenerator` merges) and refuses any other field, so
//! validating the files one by one validates what `kubectl apply -k` sends.
//! Where `kubectl` is installed its own rendering is validated and compared too.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quiver_testkit::postgres::TestDatabase;
use serde_yaml_ng::Value;
use tokio::io::AsyncBufReadExt;

/// Kubernetes versions whose schemas the manifests must pass: the oldest
/// release the deployment supports and the newest the pinned validator knows.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.33.0", "1.37.0"];
/// Kustomization fields [`render`] implements.
const RENDERED_FIELDS: [&str; 5] = [
    "apiVersion",
    "kind",
    "namespace",
    "resources",
    "configMapGenerator",
];
/// Namespace of every object.
const NAMESPACE: &str = "quiver";
/// How long a process of the pod test may take to listen, then to be ready.
const START_TIMEOUT: Duration = Duration::from_secs(10);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn deploy_dir() -> PathBuf {
    repo_root().join("deploy/kubernetes")
}

fn base_dir() -> PathBuf {
    deploy_dir().join("base")
}

fn dev_dir() -> PathBuf {
    deploy_dir().join("overlays/dev")
}

/// One object of a manifest.
#[derive(Clone, Debug)]
struct Object {
    file: PathBuf,
    value: Value,
}

impl Object {
    fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or_default()
    }

    fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or_default()
    }

    fn id(&self) -> String {
        let namespace = self.value["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default();
        format!("{}/{namespace}/{}", self.kind(), self.name())
    }

    /// The pod template of a workload, `Null` for other kinds.
    fn pod(&self) -> &Value {
        &self.value["spec"]["template"]["spec"]
    }
}

/// The objects of one YAML file (multi-document; empty documents skipped).
fn read_objects(path: &Path) -> Vec<Object> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|err| panic!("read {}: {err}", path.display()));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|document| {
            serde::Deserialize::deserialize(document)
                .unwrap_or_else(|err| panic!("{} does not parse: {err}", path.display()))
        })
        .filter(|value: &Value| !value.is_null())
        .map(|value| Object {
            file: path.to_owned(),
            value,
        })
        .collect()
}

fn kustomization(dir: &Path) -> Value {
    let objects = read_objects(&dir.join("kustomization.yaml"));
    assert_eq!(objects.len(), 1, "{}: one kustomization", dir.display());
    objects.into_iter().next().unwrap().value
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_sequence()
        .map(|items| items.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// Every file under `dir`, recursively, sorted.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

fn is_kustomization(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|name| name == "kustomization.yaml")
}

/// The Kubernetes manifests: every YAML file but the kustomizations.
fn manifest_files() -> Vec<PathBuf> {
    files_under(&deploy_dir())
        .into_iter()
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml") && !is_kustomization(path))
        .collect()
}

/// The directories holding a `kustomization.yaml`.
fn kustomization_dirs() -> Vec<PathBuf> {
    files_under(&deploy_dir())
        .into_iter()
        .filter(|path| is_kustomization(path))
        .map(|path| path.parent().unwrap().to_owned())
        .collect()
}

/// The objects `kubectl apply -k dir` creates, for the kustomize fields
/// these manifests use.
fn render(dir: &Path) -> Vec<Object> {
    let kustomization = kustomization(dir);
    for field in kustomization.as_mapping().unwrap().keys() {
        let field = field.as_str().unwrap_or_default();
        assert!(
            RENDERED_FIELDS.contains(&field),
            "{}: kustomization field {field:?} is not rendered by this test, so the manifest \
             files alone no longer tell what is applied; extend `render` first",
            dir.display()
        );
    }
    let mut objects = Vec::new();
    for entry in strings(&kustomization["resources"]) {
        let path = dir.join(entry);
        if path.is_dir() {
            objects.extend(render(&path));
        } else {
            objects.extend(read_objects(&path));
        }
    }
    for generator in kustomization["configMapGenerator"]
        .as_sequence()
        .into_iter()
        .flatten()
    {
        let name = generator["name"].as_str().unwrap();
        assert_eq!(
            generator["behavior"].as_str(),
            Some("merge"),
            "{}: configMapGenerator {name}: only merges into a base ConfigMap keep its name",
            dir.display()
        );
        let target = objects
            .iter_mut()
            .find(|object| object.kind() == "ConfigMap" && object.name() == name)
            .unwrap_or_else(|| panic!("{}: no ConfigMap {name} to merge into", dir.display()));
        for file in strings(&generator["files"]) {
            assert!(!file.contains('='), "{file}: keys are file names");
            let key = Path::new(file).file_name().unwrap().to_str().unwrap();
            let text = std::fs::read_to_string(dir.join(file)).unwrap();
            let data = &mut target.value["data"];
            if data.as_mapping().is_none() {
                *data = Value::Mapping(Default::default());
            }
            data.as_mapping_mut()
                .unwrap()
                .insert(key.into(), text.into());
        }
    }
    if let Some(namespace) = kustomization["namespace"].as_str() {
        for object in objects
            .iter_mut()
            .filter(|object| object.kind() != "Namespace")
        {
            object.value["metadata"]["namespace"] = namespace.into();
        }
    }
    objects
}

fn find<'a>(objects: &'a [Object], kind: &str, name: &str) -> &'a Object {
    objects
        .iter()
        .find(|object| object.kind() == kind && object.name() == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn of_kind<'a>(objects: &'a [Object], kind: &'a str) -> impl Iterator<Item = &'a Object> {
    objects.iter().filter(move |object| object.kind() == kind)
}

fn workloads(objects: &[Object]) -> impl Iterator<Item = &Object> {
    objects.iter().filter(|object| !object.pod().is_null())
}

/// Containers and init containers of a pod spec.
fn all_containers(pod: &Value) -> Vec<&Value> {
    ["initContainers", "containers"]
        .iter()
        .flat_map(|field| pod[*field].as_sequence().into_iter().flatten())
        .collect()
}

fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["containers"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|c| c["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// The value of `--flag=VALUE` in a container's args.
fn flag<'a>(container: &'a Value, flag: &str) -> Option<&'a str> {
    strings(&container["args"])
        .into_iter()
        .find_map(|arg| arg.strip_prefix(flag)?.strip_prefix('='))
}

/// Whether `selector` (a label selector's matchLabels) selects the pods of `workload`.
fn selects(selector: &Value, workload: &Object) -> bool {
    let labels = workload.value["spec"]["template"]["metadata"]["labels"]
        .as_mapping()
        .unwrap();
    selector.as_mapping().is_some_and(|wanted| {
        !wanted.is_empty() && wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
    })
}

/// The volume mounted at the longest mount path that is a prefix of `path`.
fn volume_at<'a>(pod: &'a Value, container: &Value, path: &str) -> &'a Value {
    let mount = container["volumeMounts"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter(|mount| path.starts_with(mount["mountPath"].as_str().unwrap()))
        .max_by_key(|mount| mount["mountPath"].as_str().unwrap().len())
        .unwrap_or_else(|| panic!("{path} is on no volume"));
    pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|volume| volume["name"] == mount["name"])
        .unwrap_or_else(|| panic!("no volume {:?}", mount["name"]))
}

// --- the validator -------------------------------------------------------

/// The `kubernetes-validate` version pinned in `scripts/test.sh`.
fn pinned_validator() -> String {
    let script = std::fs::read_to_string(repo_root().join("scripts/test.sh")).unwrap();
    let pins = script
        .lines()
        .find_map(|line| line.strip_prefix("PY_PINS="))
        .expect("scripts/test.sh sets PY_PINS");
    pins.trim_matches('"')
        .split_whitespace()
        .find_map(|pin| pin.strip_prefix("kubernetes-validate=="))
        .expect("PY_PINS pins kubernetes-validate")
        .to_owned()
}

/// `QUIVER_TEST_PYTHON`, holding the pinned `kubernetes-validate`.
fn validator_python() -> String {
    let pinned = pinned_validator();
    let python = std::env::var("QUIVER_TEST_PYTHON").unwrap_or_default();
    let setup = format!(
        "QUIVER_TEST_PYTHON must name a python with kubernetes-validate=={pinned}; run the \
         suite with scripts/test.sh (it creates target/pyenv), or run its venv step and \
         export QUIVER_TEST_PYTHON=$PWD/target/pyenv/bin/python"
    );
    assert!(!python.is_empty(), "QUIVER_TEST_PYTHON is not set: {setup}");
    let output = Command::new(&python)
        .args(["-m", "kubernetes_validate", "--version"])
        .output()
        .unwrap_or_else(|err| panic!("QUIVER_TEST_PYTHON={python}: {err}; {setup}"));
    let version = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    assert_eq!(
        version,
        pinned,
        "QUIVER_TEST_PYTHON={python} has kubernetes-validate {version:?} ({}); {setup}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    python
}

/// Runs `kubernetes-validate --strict` on `files` against every version of
/// [`KUBERNETES_VERSIONS`] and asserts that each of their `documents`
/// objects passed against each version. The validator only warns (and exits
/// 0) for a kind or apiVersion it has no schema for, so every object must be
/// reported as passed.
fn validate_strictly(python: &str, files: &[PathBuf], documents: usize) {
    let mut command = Command::new(python);
    command.args(["-m", "kubernetes_validate", "--strict"]);
    for version in KUBERNETES_VERSIONS {
        command.args(["-k", version]);
    }
    let output = command.args(files).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "kubernetes-validate failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    let not_passed: Vec<&str> = stdout
        .lines()
        .filter(|line| !(line.starts_with("INFO ") && line.contains(" passed for resource ")))
        .collect();
    assert!(
        not_passed.is_empty(),
        "kubernetes-validate did not pass everything:\n{}",
        not_passed.join("\n")
    );
    for version in KUBERNETES_VERSIONS {
        let minor = version.rsplit_once('.').unwrap().0;
        let passed = stdout
            .lines()
            .filter(|line| line.ends_with(&format!(" against version {minor}")))
            .count();
        assert_eq!(
            passed, documents,
            "objects that passed against Kubernetes {minor}:\n{stdout}"
        );
    }
}

/// `kubectl`, when installed (it renders kustomizations itself).
fn kubectl() -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("kubectl"))
            .find(|candidate| candidate.is_file())
    })
}

#[test]
fn every_manifest_passes_strict_schema_validation() {
    let python = validator_python();
    let files = manifest_files();
    assert!(files.len() >= 10, "manifests found: {files:?}");
    let documents = files.iter().map(|file| read_objects(file).len()).sum();
    validate_strictly(&python, &files, documents);

    let Some(kubectl) = kubectl() else {
        eprintln!("kubectl is not installed: kustomize's own rendering not compared");
        return;
    };
    let scratch = tempfile::tempdir().unwrap();
    for dir in kustomization_dirs() {
        let output = Command::new(&kubectl)
            .arg("kustomize")
            .arg(&dir)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "kubectl kustomize {}: {}",
            dir.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        let rendered = scratch.path().join("rendered.yaml");
        std::fs::write(&rendered, &output.stdout).unwrap();
        let theirs = read_objects(&rendered);
        validate_strictly(&python, &[rendered], theirs.len());
        let ours = render(&dir);
        let ids = |objects: &[Object]| objects.iter().map(Object::id).collect::<BTreeSet<_>>();
        assert_eq!(
            ids(&theirs),
            ids(&ours),
            "{}: rendered objects",
            dir.display()
        );
        for theirs in of_kind(&theirs, "ConfigMap") {
            let ours = find(&ours, "ConfigMap", theirs.name());
            assert_eq!(theirs.value["data"], ours.value["data"], "{}", theirs.id());
        }
    }
}

#[test]
fn kustomizations_list_exactly_the_files_beside_them() {
    let dirs = kustomization_dirs();
    assert!(
        dirs.contains(&base_dir()) && dirs.contains(&dev_dir()),
        "{dirs:?}"
    );
    let mut listed = BTreeSet::new();
    for dir in &dirs {
        let kustomization = kustomization(dir);
        let generated = kustomization["configMapGenerator"]
            .as_sequence()
            .into_iter()
            .flatten()
            .flat_map(|generator| strings(&generator["files"]));
        for entry in strings(&kustomization["resources"])
            .into_iter()
            .chain(generated)
        {
            let path = dir.join(entry);
            assert!(path.exists(), "{}: lists missing {entry}", dir.display());
            let path = path.canonicalize().unwrap();
            if path.is_dir() {
                assert!(
                    path.join("kustomization.yaml").is_file(),
                    "{}: {entry} is no kustomization",
                    dir.display()
                );
                continue;
            }
            assert!(
                path.starts_with(dir.canonicalize().unwrap()),
                "{}: {entry} lies outside the kustomization's directory",
                dir.display()
            );
            assert!(
                listed.insert(path),
                "{}: {entry} listed twice",
                dir.display()
            );
        }
    }
    for overlay in std::fs::read_dir(deploy_dir().join("overlays")).unwrap() {
        let overlay = overlay.unwrap().path();
        let bases = strings(&kustomization(&overlay)["resources"])
            .into_iter()
            .filter(|entry| {
                overlay.join(entry).canonicalize().ok() == base_dir().canonicalize().ok()
            })
            .count();
        assert_eq!(bases, 1, "{} builds on the base", overlay.display());
    }
    let present: BTreeSet<PathBuf> = files_under(&deploy_dir())
        .into_iter()
        .filter(|path| !is_kustomization(path))
        .map(|path| path.canonicalize().unwrap())
        .collect();
    let unlisted: Vec<_> = present.difference(&listed).collect();
    assert!(
        unlisted.is_empty(),
        "files no kustomization lists: {unlisted:?}"
    );
}

#[test]
fn the_base_has_what_a_production_deployment_needs() {
    let base = render(&base_dir());
    let dev = render(&dev_dir());

    let namespace = find(&base, "Namespace", NAMESPACE);
    assert_eq!(
        namespace.value["metadata"]["labels"]["pod-security.kubernetes.io/enforce"].as_str(),
        Some("restricted")
    );
    for object in base.iter().chain(&dev).filter(|o| o.kind() != "Namespace") {
        assert_eq!(
            object.value["metadata"]["namespace"].as_str(),
            Some(NAMESPACE),
            "{} ({}): namespace",
            object.id(),
            object.file.display()
        );
    }

    // Registry: replicas, disruption budget, Service.
    let registry = find(&base, "Deployment", "quiver-registry");
    let replicas = registry.value["spec"]["replicas"].as_u64().unwrap_or(1);
    assert!(replicas >= 2, "registry replicas: {replicas}");
    let budgets: Vec<_> = of_kind(&base, "PodDisruptionBudget")
        .filter(|pdb| selects(&pdb.value["spec"]["selector"]["matchLabels"], registry))
        .collect();
    assert_eq!(
        budgets.len(),
        1,
        "one PodDisruptionBudget selects the registry"
    );
    let min_available = budgets[0].value["spec"]["minAvailable"].as_u64().unwrap();
    assert!(
        (1..replicas).contains(&min_available),
        "minAvailable {min_available}"
    );

    // Worker: the autoscaler owns the replica count.
    let worker = find(&base, "Deployment", "quiver-worker");
    let autoscalers: Vec<_> = of_kind(&base, "HorizontalPodAutoscaler")
        .filter(|hpa| {
            let target = &hpa.value["spec"]["scaleTargetRef"];
            target["kind"].as_str() == Some("Deployment")
                && target["name"].as_str() == Some(worker.name())
        })
        .collect();
    assert_eq!(
        autoscalers.len(),
        1,
        "one HPA targets the worker Deployment"
    );
    let hpa = &autoscalers[0].value;
    assert_eq!(hpa["apiVersion"].as_str(), Some("autoscaling/v2"));
    assert!(hpa["spec"]["minReplicas"].as_u64().unwrap() >= 2);
    assert!(hpa["spec"]["maxReplicas"].as_u64() > hpa["spec"]["minReplicas"].as_u64());
    assert!(
        hpa["spec"]["metrics"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|metric| metric["resource"]["name"].as_str() == Some("cpu")),
        "the HPA scales on CPU"
    );
    assert!(
        worker.value["spec"]["replicas"].is_null(),
        "the worker Deployment leaves replicas to the HPA"
    );

    // Services, ports and probes of both processes.
    for (workload, container_name, ports) in [
        (
            registry,
            "registry",
            &[("grpc", "--grpc-listen"), ("http", "--http-listen")][..],
        ),
        (worker, "worker", &[("http", "--http-listen")][..]),
    ] {
        let pod = workload.pod();
        let main = container(pod, container_name);
        let services: Vec<_> = of_kind(&base, "Service")
            .filter(|service| selects(&service.value["spec"]["selector"], workload))
            .collect();
        assert_eq!(services.len(), 1, "one Service selects {}", workload.name());
        for (port_name, listen_flag) in ports {
            let declared = main["ports"]
                .as_sequence()
                .unwrap()
                .iter()
                .find(|port| port["name"].as_str() == Some(port_name))
                .unwrap_or_else(|| panic!("{container_name}: no port {port_name}"));
            let listen = flag(main, listen_flag).unwrap();
            assert_eq!(
                listen.rsplit_once(':').unwrap().1,
                declared["containerPort"].as_u64().unwrap().to_string(),
                "{container_name}: {listen_flag} listens on port {port_name}"
            );
            assert!(
                listen.starts_with("0.0.0.0:"),
                "{listen_flag}={listen}: reachable from other pods"
            );
            assert!(
                services[0].value["spec"]["ports"]
                    .as_sequence()
                    .unwrap()
                    .iter()
                    .any(|port| port["targetPort"].as_str() == Some(port_name)),
                "the Service of {container_name} exposes {port_name}"
            );
        }
        for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
            let get = &main[probe]["httpGet"];
            assert_eq!(get["path"].as_str(), Some(path), "{container_name} {probe}");
            assert_eq!(
                get["port"].as_str(),
                Some("http"),
                "{container_name} {probe}"
            );
        }
        assert_eq!(
            pod["enableServiceLinks"].as_bool(),
            Some(false),
            "{container_name}"
        );
        assert_eq!(
            pod["automountServiceAccountToken"].as_bool(),
            Some(false),
            "{container_name}"
        );
    }
    let registry_url = flag(container(worker.pod(), "worker"), "--registry").unwrap();
    assert_eq!(
        registry_url, "http://quiver-registry:50051",
        "workers follow the registry Service"
    );
    find(&base, "Service", "quiver-registry");

    // Secrets: none in the base, referenced only; token flags name files on
    // Secret volumes; the database URL comes from a secretKeyRef.
    assert_eq!(
        of_kind(&base, "Secret").count(),
        0,
        "the base holds no Secret"
    );
    for (workload, container_name, token_flags) in [
        (
            registry,
            "registry",
            &["--admin-token-file", "--worker-token-file"][..],
        ),
        (
            worker,
            "worker",
            &["--token-file", "--caller-token-file"][..],
        ),
    ] {
        let pod = workload.pod();
        let main = container(pod, container_name);
        for arg in strings(&main["args"]) {
            let literal = [
                "--admin-token=",
                "--worker-token=",
                "--token=",
                "--caller-token=",
                "--database-url=",
            ];
            assert!(
                !literal.iter().any(|prefix| arg.starts_with(prefix)),
                "{container_name}: {arg} puts a secret on the command line"
            );
        }
        for token_flag in token_flags {
            let file = flag(main, token_flag)
                .unwrap_or_else(|| panic!("{container_name}: no {token_flag}"));
            let volume = volume_at(pod, main, file);
            let secret = &volume["secret"];
            assert!(
                secret.is_mapping(),
                "{container_name} {token_flag}={file}: on a Secret volume"
            );
            let item = Path::new(file).file_name().unwrap().to_str().unwrap();
            assert!(
                strings_at(&secret["items"], "path").contains(&item),
                "{container_name}: the Secret volume provides {item}"
            );
        }
        for env in main["env"].as_sequence().into_iter().flatten() {
            let name = env["name"].as_str().unwrap();
            let sensitive = ["TOKEN", "PASSWORD", "SECRET", "KEY", "DATABASE_URL"]
                .iter()
                .any(|word| name.contains(word));
            if sensitive {
                assert!(
                    env["value"].is_null(),
                    "{container_name}: {name} has a literal value"
                );
                assert!(
                    env["valueFrom"]["secretKeyRef"].is_mapping(),
                    "{container_name}: {name} comes from a Secret"
                );
            }
        }
    }
    let registry_env = &container(registry.pod(), "registry")["env"];
    assert!(
        registry_env
            .as_sequence()
            .unwrap()
            .iter()
            .any(|env| env["name"].as_str() == Some("QUIVER_DATABASE_URL")
                && env["valueFrom"]["secretKeyRef"]["name"].as_str() == Some("quiver-database")),
        "the database URL comes from the Secret quiver-database"
    );
    // The worker never holds the admin token.
    let worker_tokens = volume_at(
        worker.pod(),
        container(worker.pod(), "worker"),
        "/run/secrets/quiver/x",
    );
    assert!(!strings_at(&worker_tokens["secret"]["items"], "key").contains(&"admin-token"));
    let config = find(&base, "ConfigMap", "quiver-config");
    for key in ["registry.toml", "worker.toml"] {
        let text = config.value["data"][key]
            .as_str()
            .unwrap_or_else(|| panic!("no {key}"));
        for line in text
            .lines()
            .map(str::trim_start)
            .filter(|line| !line.starts_with('#'))
        {
            assert!(
                !["admin_token", "worker_token", "token ="]
                    .iter()
                    .any(|word| line.starts_with(word)),
                "{key}: {line}: tokens belong in Secrets"
            );
        }
    }

    // Resources and security contexts of every container, dev's included.
    for workload in workloads(&base).chain(workloads(&dev)) {
        let pod = workload.pod();
        let id = workload.id();
        assert_eq!(
            pod["securityContext"]["runAsNonRoot"].as_bool(),
            Some(true),
            "{id}"
        );
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"].as_str(),
            Some("RuntimeDefault"),
            "{id}"
        );
        for container in all_containers(pod) {
            let name = format!("{id} {}", container["name"].as_str().unwrap());
            for bound in ["requests", "limits"] {
                for resource in ["cpu", "memory"] {
                    assert!(
                        !container["resources"][bound][resource].is_null(),
                        "{name}: resources.{bound}.{resource}"
                    );
                }
            }
            let security = &container["securityContext"];
            assert_eq!(
                security["readOnlyRootFilesystem"].as_bool(),
                Some(true),
                "{name}"
            );
            assert_eq!(
                security["allowPrivilegeEscalation"].as_bool(),
                Some(false),
                "{name}"
            );
            assert_eq!(
                strings(&security["capabilities"]["drop"]),
                ["ALL"],
                "{name}"
            );
        }
    }
    // Stdio MCP servers write to /tmp and $HOME.
    let worker_main = container(worker.pod(), "worker");
    for path in ["/tmp", "/home/quiver"] {
        assert!(
            volume_at(worker.pod(), worker_main, path)["emptyDir"].is_mapping(),
            "worker: {path} is a writable emptyDir"
        );
    }

    // Network policies: default deny, then only what each side needs.
    let deny = find(&base, "NetworkPolicy", "default-deny");
    assert!(
        deny.value["spec"]["podSelector"]
            .as_mapping()
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        strings(&deny.value["spec"]["policyTypes"]),
        ["Ingress", "Egress"]
    );
    assert!(deny.value["spec"]["ingress"].is_null() && deny.value["spec"]["egress"].is_null());
    let policy_of = |workload: &Object| -> Value {
        let policies: Vec<_> = of_kind(&base, "NetworkPolicy")
            .filter(|policy| {
                selects(
                    &policy.value["spec"]["podSelector"]["matchLabels"],
                    workload,
                )
            })
            .collect();
        assert_eq!(
            policies.len(),
            1,
            "one NetworkPolicy for {}",
            workload.name()
        );
        policies[0].value["spec"].clone()
    };
    let worker_policy = policy_of(worker);
    let egress = worker_policy["egress"].as_sequence().unwrap();
    let to_registry = egress
        .iter()
        .find(|rule| {
            rule["to"][0]["podSelector"]["matchLabels"].is_mapping()
                && selects(&rule["to"][0]["podSelector"]["matchLabels"], registry)
        })
        .expect("workers may reach the registry");
    assert_eq!(
        ports_of(to_registry),
        [50051],
        "workers reach the registry's gRPC port only"
    );
    for rule in egress {
        assert!(
            rule["to"].is_sequence(),
            "worker egress rules name their destinations: {rule:?}"
        );
        for peer in rule["to"].as_sequence().unwrap() {
            if let Some(cidr) = peer["ipBlock"]["cidr"].as_str() {
                let except = strings(&peer["ipBlock"]["except"]);
                let private: &[&str] = if cidr.contains(':') {
                    &["fc00::/7", "fe80::/10"]
                } else {
                    &[
                        "10.0.0.0/8",
                        "172.16.0.0/12",
                        "192.168.0.0/16",
                        "169.254.0.0/16",
                    ]
                };
                for range in private {
                    assert!(
                        except.contains(range),
                        "worker egress to {cidr} excludes {range}"
                    );
                }
            }
        }
    }
    let worker_ingress = worker_policy["ingress"].as_sequence().unwrap();
    assert!(
        worker_ingress.iter().all(|rule| ports_of(rule) == [8090]),
        "callers reach port 8090 only"
    );
    let registry_policy = policy_of(registry);
    let registry_ports: BTreeSet<u64> = registry_policy["egress"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(ports_of)
        .collect();
    assert_eq!(
        registry_ports,
        BTreeSet::from([53, 5432]),
        "the registry reaches DNS and PostgreSQL only"
    );
    let from_workers = registry_policy["ingress"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|rule| selects(&rule["from"][0]["podSelector"]["matchLabels"], worker))
        .expect("workers may reach the registry");
    assert_eq!(ports_of(from_workers), [50051]);
}

fn strings_at<'a>(items: &'a Value, field: &str) -> Vec<&'a str> {
    items
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|item| item[field].as_str())
        .collect()
}

fn ports_of(rule: &Value) -> Vec<u64> {
    rule["ports"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|port| port["port"].as_u64())
        .collect()
}

// --- the pods' command lines, run for real -------------------------------

/// A pod's volumes laid out in a temporary directory, the way the kubelet
/// presents them: ConfigMap and Secret keys as symlinks into a `..data`
/// directory, emptyDirs empty. Volumes are shared by the pod's containers.
struct PodFiles {
    root: tempfile::TempDir,
    /// Mount path → host directory, of the container at hand.
    mounts: Vec<(String, PathBuf)>,
}

impl PodFiles {
    fn new(pod: &Value, objects: &[Object]) -> PodFiles {
        let root = tempfile::tempdir().unwrap();
        for volume in pod["volumes"].as_sequence().unwrap() {
            let dir = root.path().join(volume["name"].as_str().unwrap());
            std::fs::create_dir(&dir).unwrap();
            let data = if volume["configMap"].is_mapping() {
                let name = volume["configMap"]["name"].as_str().unwrap();
                Some((
                    find(objects, "ConfigMap", name).value["data"].clone(),
                    &volume["configMap"],
                ))
            } else if volume["secret"].is_mapping() {
                let name = volume["secret"]["secretName"].as_str().unwrap();
                Some((
                    find(objects, "Secret", name).value["stringData"].clone(),
                    &volume["secret"],
                ))
            } else {
                assert!(volume["emptyDir"].is_mapping(), "volume kind of {volume:?}");
                None
            };
            if let Some((data, source)) = data {
                project(&dir, &data, &source["items"]);
            }
        }
        PodFiles {
            root,
            mounts: Vec::new(),
        }
    }

    /// Uses `container`'s mounts for [`PodFiles::host`].
    fn enter(&mut self, container: &Value) {
        self.mounts = container["volumeMounts"]
            .as_sequence()
            .into_iter()
            .flatten()
            .map(|mount| {
                (
                    mount["mountPath"].as_str().unwrap().to_owned(),
                    self.root.path().join(mount["name"].as_str().unwrap()),
                )
            })
            .collect();
        self.mounts
            .sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
    }

    /// `text` with every whole path that is a mount path of the container,
    /// or lies under one, moved to its host directory (in one pass: a host
    /// directory is never rewritten again).
    fn host(&self, text: &str) -> String {
        let in_path = |c: char| c.is_alphanumeric() || "/._-".contains(c);
        let mut host = String::new();
        let mut rest = text;
        'scan: while let Some(next) = rest.chars().next() {
            if !host.ends_with(in_path) {
                for (path, dir) in &self.mounts {
                    if let Some(after) = rest.strip_prefix(path.as_str())
                        && (after.is_empty()
                            || after.starts_with('/')
                            || !after.starts_with(in_path))
                    {
                        host.push_str(dir.to_str().unwrap());
                        rest = after;
                        continue 'scan;
                    }
                }
            }
            host.push(next);
            rest = &rest[next.len_utf8()..];
        }
        host
    }
}

/// Writes ConfigMap or Secret `data` (only `items`, when given) into `dir`
/// as the kubelet does: files in a timestamped directory, `..data` linking
/// to it, and each key a symlink through `..data`.
fn project(dir: &Path, data: &Value, items: &Value) {
    let data = data.as_mapping().cloned().unwrap_or_default();
    let wanted: Vec<(String, String)> = match items.as_sequence() {
        Some(items) => items
            .iter()
            .map(|item| {
                (
                    item["key"].as_str().unwrap().to_owned(),
                    item["path"].as_str().unwrap().to_owned(),
                )
            })
            .collect(),
        None => data
            .keys()
            .map(|key| {
                (
                    key.as_str().unwrap().to_owned(),
                    key.as_str().unwrap().to_owned(),
                )
            })
            .collect(),
    };
    let timestamped = dir.join("..2025_01_01_00_00_00.000000001");
    std::fs::create_dir(&timestamped).unwrap();
    std::os::unix::fs::symlink(timestamped.file_name().unwrap(), dir.join("..data")).unwrap();
    for (key, path) in wanted {
        let text = data
            .get(key.as_str())
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no key {key}"));
        std::fs::write(timestamped.join(&path), text).unwrap();
        std::os::unix::fs::symlink(format!("..data/{path}"), dir.join(&path)).unwrap();
    }
}

/// A container's environment as the kubelet sets it: literal values,
/// Secret keys (an optional one may be missing) and the pod name.
fn container_env(container: &Value, objects: &[Object], pod_name: &str) -> Vec<(String, String)> {
    let mut env = Vec::new();
    for entry in container["env"].as_sequence().into_iter().flatten() {
        let name = entry["name"].as_str().unwrap().to_owned();
        let from = &entry["valueFrom"];
        let value = if let Some(value) = entry["value"].as_str() {
            value.to_owned()
        } else if from["fieldRef"]["fieldPath"].as_str() == Some("metadata.name") {
            pod_name.to_owned()
        } else {
            let key_ref = &from["secretKeyRef"];
            let secret = objects.iter().find(|object| {
                object.kind() == "Secret" && object.name() == key_ref["name"].as_str().unwrap()
            });
            match secret {
                Some(secret) => secret.value["stringData"][key_ref["key"].as_str().unwrap()]
                    .as_str()
                    .unwrap()
                    .to_owned(),
                None if key_ref["optional"].as_bool() == Some(true) => continue,
                None => panic!("{name}: no Secret {:?}", key_ref["name"]),
            }
        };
        env.push((name, value));
    }
    env
}

/// `$(NAME)` references to the container's variables, expanded as the kubelet does.
fn expand(arg: &str, env: &[(String, String)]) -> String {
    env.iter().fold(arg.to_owned(), |arg, (name, value)| {
        arg.replace(&format!("$({name})"), value)
    })
}

/// A process started from a container: killed when dropped; its stderr is
/// kept for failure messages.
struct Running {
    _child: tokio::process::Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Running {
    /// Starts `quiver ARGS` with exactly `env` (and PATH, the test's quiver
    /// first, as the image has it) and waits for the JSON log line
    /// `message`, whose fields it returns.
    async fn start(
        args: &[String],
        env: &[(String, String)],
        message: &str,
    ) -> (Running, serde_json::Value) {
        let quiver = Path::new(env!("CARGO_BIN_EXE_quiver"));
        let path =
            std::env::join_paths(std::iter::once(quiver.parent().unwrap().to_owned()).chain(
                std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
            ))
            .unwrap();
        let mut command = tokio::process::Command::new(quiver);
        command
            .args(args)
            .env_clear()
            .env("PATH", path)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().unwrap();
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (found_tx, found_rx) = tokio::sync::oneshot::channel();
        let (kept, wanted) = (log.clone(), message.to_owned());
        tokio::spawn(async move {
            let mut found_tx = Some(found_tx);
            while let Ok(Some(line)) = lines.next_line().await {
                let fields = serde_json::from_str::<serde_json::Value>(&line)
                    .ok()
                    .map(|event| event["fields"].clone())
                    .filter(|fields| fields["message"] == wanted.as_str());
                if let Some(fields) = fields
                    && let Some(tx) = found_tx.take()
                {
                    let _ = tx.send(fields);
                }
                kept.lock().unwrap().push(line);
            }
        });
        let running = Running { _child: child, log };
        match tokio::time::timeout(START_TIMEOUT, found_rx).await {
            Ok(Ok(fields)) => (running, fields),
            _ => panic!(
                "quiver {} did not log {message:?} within {START_TIMEOUT:?}; log:\n{}",
                args.join(" "),
                running.log()
            ),
        }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

/// The container's args for this machine: mount paths on the host, `$(VAR)`
/// expanded, listeners on ephemeral loopback ports, the registry URL replaced.
fn host_args(
    container: &Value,
    files: &PodFiles,
    env: &[(String, String)],
    registry: Option<&str>,
) -> Vec<String> {
    strings(&container["args"])
        .into_iter()
        .map(|arg| match arg.split_once('=') {
            Some((listen, _)) if listen.ends_with("-listen") => format!("{listen}=127.0.0.1:0"),
            Some(("--registry", _)) => format!("--registry={}", registry.unwrap()),
            _ => expand(&files.host(arg), env),
        })
        .collect()
}

async fn get(url: &str, token: &str) -> (reqwest::StatusCode, serde_json::Value) {
    let response = reqwest::Client::new()
        .get(url)
        .bearer_auth(token)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or_default())
}

#[tokio::test]
async fn the_dev_pods_command_lines_run_a_registry_and_a_worker_serving_the_example() {
    let dev = render(&dev_dir());
    let secret = |name: &str, key: &str| {
        find(&dev, "Secret", name).value["stringData"][key]
            .as_str()
            .unwrap()
            .trim()
            .to_owned()
    };
    let database = TestDatabase::create().await;

    // The registry pod: the init container copies mcp.d out of the
    // ConfigMap's symlinks, then the registry starts with the pod's args.
    let registry = find(&dev, "Deployment", "quiver-registry");
    let pod = registry.pod();
    let mut files = PodFiles::new(pod, &dev);
    let init = &pod["initContainers"][0];
    files.enter(init);
    let script: Vec<String> = strings(&init["command"])
        .iter()
        .map(|part| files.host(part))
        .collect();
    let copied = Command::new(&script[0])
        .args(&script[1..])
        .output()
        .unwrap();
    assert!(
        copied.status.success(),
        "init container: {}",
        String::from_utf8_lossy(&copied.stderr)
    );
    let main = container(pod, "registry");
    files.enter(main);
    let mcp_dir = files.host(flag(main, "--mcp-dir").unwrap());
    let record = Path::new(&mcp_dir).join("00-example.toml");
    assert!(
        std::fs::symlink_metadata(&record)
            .unwrap()
            .file_type()
            .is_file(),
        "mcp.d holds regular files, which scans read"
    );
    let mut env = container_env(main, &dev, "quiver-registry-0");
    let url = env
        .iter_mut()
        .find(|(name, _)| name == "QUIVER_DATABASE_URL")
        .unwrap();
    assert!(
        url.1.starts_with("postgres://") && url.1.contains("@quiver-postgres:5432/"),
        "{}",
        url.1
    );
    url.1 = database.url().to_owned();
    let args = host_args(main, &files, &env, None);
    let (registry_process, listening) =
        Running::start(&args, &env, "quiver registry listening").await;
    let registry_http = format!("http://{}", listening["http"].as_str().unwrap());
    let registry_grpc = format!("http://{}", listening["grpc"].as_str().unwrap());
    let (status, whoami) = get(
        &format!("{registry_http}/admin/api/whoami"),
        &secret("quiver-tokens", "admin-token"),
    )
    .await;
    assert_eq!(
        status,
        200,
        "admin token file: {whoami}\n{}",
        registry_process.log()
    );
    let (status, _) = get(&format!("{registry_http}/readyz"), "").await;
    assert_eq!(status, 200);

    // A worker pod, following that registry with the pod's args.
    let worker = find(&dev, "Deployment", "quiver-worker");
    let pod = worker.pod();
    let mut files = PodFiles::new(pod, &dev);
    let main = container(pod, "worker");
    files.enter(main);
    let env: Vec<(String, String)> = container_env(main, &dev, "quiver-worker-abc12")
        .into_iter()
        .map(|(name, value)| (name, files.host(&value)))
        .collect();
    let args = host_args(main, &files, &env, Some(&registry_grpc));
    assert!(
        args.contains(&"--worker-id=quiver-worker-abc12".to_owned()),
        "{args:?}"
    );
    let (worker_process, listening) = Running::start(&args, &env, "quiver worker listening").await;
    let worker_http = format!("http://{}", listening["http"].as_str().unwrap());
    let caller = secret("quiver-tokens", "caller-tokens");
    eventually("the worker is ready", async || {
        let (status, body) = get(&format!("{worker_http}/readyz"), "").await;
        (status == 200)
            .then_some(())
            .ok_or_else(|| format!("{body}\n{}", worker_process.log()))
    })
    .await;
    let (status, _) = get(&format!("{worker_http}/v1/mcp/tools"), "not-a-caller").await;
    assert_eq!(status, 401);
    let call = reqwest::Client::new()
        .post(format!("{worker_http}/v1/mcp/tools/call"))
        .bearer_auth(&caller)
        .json(&serde_json::json!({"name": "mcp__ZXhhbXBsZQ__YWRk", "arguments": {"a": 2, "b": 3}}))
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .unwrap();
    let status = call.status();
    let body: serde_json::Value = call.json().await.unwrap();
    assert_eq!(
        (status.as_u16(), body["content"][0]["text"].as_str()),
        (200, Some("5")),
        "example.add through the worker: {body}\nworker log:\n{}",
        worker_process.log()
    );
    // Its status report (sent when a server's health changes) names the pod.
    let admin = secret("quiver-tokens", "admin-token");
    eventually("the worker's report reaches the registry", async || {
        let (status, workers) = get(&format!("{registry_http}/admin/api/workers"), &admin).await;
        let reported = status == 200 && workers.to_string().contains("\"quiver-worker-abc12\"");
        reported
            .then_some(())
            .ok_or_else(|| format!("{status}: {workers}"))
    })
    .await;
}

/// Retries `probe` until it succeeds, failing the test with its last error
/// after [`START_TIMEOUT`].
async fn eventually(what: &str, mut probe: impl AsyncFnMut() -> Result<(), String>) {
    let started = Instant::now();
    loop {
        match probe().await {
            Ok(()) => return,
            Err(last) if started.elapsed() > START_TIMEOUT => {
                panic!("{what}: not within {START_TIMEOUT:?}: {last}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}
