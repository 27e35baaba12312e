//! Tests of `config`: the TLS and token-file flags, the example configs, every key and its refusals.

use super::*;

#[test]
fn tls_needs_both_files_and_names_the_flags() {
    let section = TlsSection {
        cert: None,
        key: Some(PathBuf::from("key.pem")),
    };
    let err = server_tls(None, None, section, None).unwrap_err();
    assert_eq!(
        err.to_string(),
        "--tls-key is set without --tls-cert: set both or neither"
    );
    assert!(matches!(
        server_tls(None, None, TlsSection::default(), None),
        Ok(None)
    ));
    let err = server_tls(
        Some(PathBuf::from("/nonexistent/cert.pem")),
        Some(PathBuf::from("/nonexistent/key.pem")),
        TlsSection::default(),
        None,
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("--tls-cert /nonexistent/cert.pem"),
        "{err}"
    );
    let err = registry_ca(Some(Path::new("/nonexistent/ca.pem"))).unwrap_err();
    assert!(err.to_string().starts_with("--registry-ca"), "{err}");
}

#[test]
fn example_registry_config_parses() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/registry.toml");
    let config: RegistryFile = load(Some(&path)).unwrap();
    assert!(config.database_url.is_some());
    assert!(config.mcp.dir.is_some());
    assert!(config.mcp.policies_dir.is_some());
}

#[test]
fn example_worker_config_parses() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/worker.toml");
    let config: WorkerFile = load(Some(&path)).unwrap();
    assert!(!config.callers.is_empty());
    quiver_mcp::egress::EgressPolicy::new(&config.egress.allow_hosts, &config.egress.allow_cidrs)
        .unwrap();
    for task in config.tasks.values() {
        task.compile().unwrap();
    }
}

#[test]
fn identity_providers_parse_and_errors_name_the_field() {
    let text = r#"
            [[identity_providers]]
            name = "corp"
            issuer = "http://127.0.0.1:9"
            audiences = ["quiver"]
            [[identity_providers.rules]]
            claim = "groups"
            contains = "team-a"
            task = "team-a"
            [[identity_providers.rules]]
            claim = "sub"
            equals = "root"
            task = "nope"
            [tasks.team-a]
            allowed_server_ids = ["x"]
        "#;
    let file: WorkerFile = toml::from_str(text).unwrap();
    let config = quiver_worker::auth::CallersConfig {
        tasks: file.tasks,
        identity_providers: file
            .identity_providers
            .into_iter()
            .map(IdentityProviderEntry::into_config)
            .collect(),
        ..Default::default()
    };
    let listen = "127.0.0.1:0".parse().unwrap();
    let err = quiver_worker::auth::Callers::new(&config, listen)
        .err()
        .unwrap()
        .to_string();
    assert_eq!(
        err,
        "identity_providers[0].rules[1].policy: no such policy \"nope\""
    );
    let mut fixed = config.clone();
    fixed.identity_providers[0].rules[1].policy = Some("default".into());
    quiver_worker::auth::Callers::new(&fixed, listen)
        .expect("identity providers alone are callers enough");
    let mut public = fixed.clone();
    public.identity_providers[0].issuer = "http://idp.example.com".into();
    let err = quiver_worker::auth::Callers::new(&public, listen)
        .err()
        .unwrap()
        .to_string();
    assert!(err.starts_with("identity_providers[0].issuer: "), "{err}");
    let typo = text.replace("contains = \"team-a\"", "contain = \"team-a\"");
    let err = toml::from_str::<WorkerFile>(&typo).unwrap_err().to_string();
    assert!(err.contains("unknown field `contain`"), "{err}");
    let spelled = text.replace("task = \"team-a\"", "policy = \"team-a\"");
    let file: WorkerFile = toml::from_str(&spelled).unwrap();
    let record = file
        .identity_providers
        .into_iter()
        .next()
        .unwrap()
        .into_config();
    assert_eq!(record.rules[0].policy.as_deref(), Some("team-a"));
}

#[test]
fn token_files_are_trimmed_and_errors_name_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("token");
    std::fs::write(&good, "  s3cret\n").unwrap();
    assert_eq!(read_token_file("--token-file", &good).unwrap(), "s3cret");
    let empty = dir.path().join("empty");
    std::fs::write(&empty, " \n").unwrap();
    let err = read_token_file("--token-file", &empty).unwrap_err();
    assert!(err.to_string().starts_with("--token-file "), "{err}");
    assert!(err.to_string().contains("empty"), "{err}");
    let err = read_token_file("--admin-token-file", &dir.path().join("missing")).unwrap_err();
    assert!(err.to_string().starts_with("--admin-token-file "), "{err}");
    let err = token_or_file(Some("t".into()), "--token", Some(&good), "--token-file").unwrap_err();
    assert!(err.to_string().contains("--token-file"), "{err}");
    let lines = dir.path().join("callers");
    std::fs::write(&lines, "# callers\na\n\n b \n").unwrap();
    assert_eq!(
        read_token_lines("--caller-token-file", &lines).unwrap(),
        ["a", "b"]
    );
}

#[test]
fn unknown_keys_are_rejected() {
    let err = toml::from_str::<RegistryFile>("databse_url = \"x\"").unwrap_err();
    assert!(err.to_string().contains("databse_url"), "{err}");
    let err = toml::from_str::<WorkerFile>("[pool]\ncancel_grace = 5").unwrap_err();
    assert!(
        err.to_string().contains("unknown field `cancel_grace`"),
        "{err}"
    );
    let err = toml::from_str::<WorkerFile>("[listener]\nidle_timeout = 5").unwrap_err();
    assert!(
        err.to_string().contains("unknown field `idle_timeout`"),
        "{err}"
    );
    let err = toml::from_str::<RegistryFile>("[listener]\nmax_conns = 5").unwrap_err();
    assert!(
        err.to_string().contains("unknown field `max_conns`"),
        "{err}"
    );
}

#[test]
fn pool_keys_set_the_pool_options_and_zero_bounds_are_refused() {
    let file: WorkerFile = toml::from_str(
        "[pool]\ncancel_grace_ms = 500\nmax_list_pages = 7\nmax_list_items = 70\n\
         max_list_bytes = 7000\nlist_timeout_ms = 1500\nmax_message_bytes = 65536\n\
         initialize_timeout_ms = 900\nidle_timeout_secs = 0\n",
    )
    .unwrap();
    let pool = file.pool.over(PoolOptions::default());
    assert_eq!(pool.cancel_grace, Duration::from_millis(500));
    assert_eq!(
        (
            pool.max_list_pages,
            pool.max_list_items,
            pool.max_list_bytes
        ),
        (7, 70, 7000)
    );
    assert_eq!(pool.list_timeout, Duration::from_millis(1500));
    assert_eq!(pool.max_message_bytes, 65536);
    assert_eq!(pool.initialize_timeout, Duration::from_millis(900));
    assert_eq!(pool.idle_timeout, None);
    // Unset keys keep the defaults.
    let defaults = PoolOptions::default();
    let pool = PoolSection::default().over(PoolOptions::default());
    assert_eq!(pool.cancel_grace, defaults.cancel_grace);
    assert_eq!(pool.max_list_pages, defaults.max_list_pages);
    assert_eq!(pool.max_message_bytes, defaults.max_message_bytes);
    assert_eq!(pool.idle_timeout, defaults.idle_timeout);
    // A zero bound would fail every listing or call: refused, naming the key.
    for key in ["max_list_pages", "cancel_grace_ms", "max_message_bytes"] {
        let err = toml::from_str::<WorkerFile>(&format!("[pool]\n{key} = 0")).unwrap_err();
        assert!(err.to_string().contains(key), "{key}: {err}");
        assert!(err.to_string().contains("nonzero"), "{key}: {err}");
    }
}

/// The example configs' commented-out numbers are the defaults they
/// claim to be (`max_connections`, derived by default, aside).
#[test]
fn example_configs_show_the_defaults() {
    let uncommented = |name: &str| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../config")
            .join(name);
        let text = std::fs::read_to_string(path).unwrap();
        text.lines()
            .map(|line| match line.strip_prefix("# ") {
                Some(setting)
                    if !setting.starts_with("max_connections")
                        && setting
                            .split_once(" = ")
                            .is_some_and(|(_, value)| value.parse::<u64>().is_ok()) =>
                {
                    setting
                }
                _ => line,
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let worker: WorkerFile = toml::from_str(&uncommented("worker.toml")).unwrap();
    let registry: RegistryFile = toml::from_str(&uncommented("registry.toml")).unwrap();
    let defaults = PoolOptions::default();
    let pool = &worker.pool;
    let millis = |ms: Option<NonZeroU64>| ms.map(|ms| Duration::from_millis(ms.get()));
    assert_eq!(millis(pool.cancel_grace_ms), Some(defaults.cancel_grace));
    assert_eq!(millis(pool.list_timeout_ms), Some(defaults.list_timeout));
    let count = |n: Option<NonZeroUsize>| n.map(NonZeroUsize::get);
    assert_eq!(count(pool.max_list_pages), Some(defaults.max_list_pages));
    assert_eq!(count(pool.max_list_items), Some(defaults.max_list_items));
    assert_eq!(count(pool.max_list_bytes), Some(defaults.max_list_bytes));
    assert_eq!(
        count(pool.max_message_bytes),
        Some(defaults.max_message_bytes)
    );
    let listener_defaults = quiver_listen::ListenerOptions::default();
    for listener in [&worker.listener, &registry.listener] {
        assert_eq!(
            millis(listener.header_read_timeout_ms),
            Some(listener_defaults.header_read_timeout)
        );
        assert_eq!(
            millis(listener.idle_timeout_ms),
            Some(listener_defaults.idle_timeout)
        );
    }
    let artifacts = worker.artifacts.into_options().unwrap();
    let artifact_defaults = quiver_worker::artifacts::ArtifactOptions::default();
    assert_eq!(
        (
            artifacts.max_total_bytes,
            artifacts.caller_share(),
            artifacts.max_item_bytes,
            artifacts.ttl,
            artifacts.vision_url
        ),
        (
            artifact_defaults.max_total_bytes,
            artifact_defaults.caller_share(),
            artifact_defaults.max_item_bytes,
            artifact_defaults.ttl,
            artifact_defaults.vision_url
        )
    );
    assert_eq!(artifacts.max_caller_bytes, Some(16 * 1024 * 1024));
    // A share over the whole store is refused, naming the key.
    let err = toml::from_str::<WorkerFile>(
        "[artifacts]\nmax_total_bytes = 100\nmax_caller_bytes = 101\n",
    )
    .unwrap()
    .artifacts
    .into_options()
    .unwrap_err();
    assert!(
        err.to_string().contains("artifacts.max_caller_bytes"),
        "{err}"
    );
}
