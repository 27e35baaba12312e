//! Tests of `server_json`: every mapping and every refusal.

use serde_json::json;

use super::*;

fn imported(document: serde_json::Value) -> Imported {
    import(&document.to_string(), &ImportOptions::default())
        .unwrap_or_else(|err| panic!("import {document}: {err}"))
}

/// The field the import's error names.
fn refused(document: serde_json::Value, options: &ImportOptions) -> String {
    match import(&document.to_string(), options) {
        Ok(imported) => panic!("imported {document} as {:?}", imported.spec),
        Err(err) => err.field().unwrap_or("<none>").to_owned(),
    }
}

fn base() -> serde_json::Value {
    json!({"name": "io.github.user/weather", "description": "Weather.", "version": "1.0.0"})
}

fn with(key: &str, value: serde_json::Value) -> serde_json::Value {
    let mut document = base();
    document[key] = value;
    document
}

fn npm(extra: serde_json::Value) -> serde_json::Value {
    let mut package = json!({"registryType": "npm", "identifier": "@scope/pkg",
        "version": "1.2.3", "transport": {"type": "stdio"}});
    for (key, value) in extra.as_object().into_iter().flatten() {
        package[key] = value.clone();
    }
    with("packages", json!([package]))
}

fn stdio(imported: &Imported) -> &StdioConfig {
    imported.spec.stdio.as_ref().expect("stdio table")
}

fn http(imported: &Imported) -> &HttpConfig {
    imported.spec.http.as_ref().expect("http table")
}

#[test]
fn a_remote_becomes_a_streamable_http_record_with_its_template_filled() {
    let imported = imported(with(
        "remotes",
        json!([{"type": "streamable-http", "url": "https://{host}/mcp/{tenant}",
            "variables": {"host": {"default": "api.example.com"}, "tenant": {"value": "acme"}}}]),
    ));
    assert_eq!(imported.spec.transport, Transport::StreamableHttp);
    assert_eq!(http(&imported).url, "https://api.example.com/mcp/acme");
    assert_eq!(imported.spec.server_id, "weather");
    assert_eq!(imported.choice, Choice::Remote(0));
    assert!(imported.spec.allowed_tools.is_empty(), "default deny kept");
    assert!(imported.inputs.is_empty());
}

#[test]
fn an_sse_remote_becomes_the_legacy_transport() {
    let imported = imported(with(
        "remotes",
        json!([{"type": "sse", "url": "https://example.com/sse"}]),
    ));
    assert_eq!(imported.spec.transport, Transport::HttpSseLegacy);
}

#[test]
fn secret_headers_become_env_references_named_in_upper_snake_case() {
    let imported = imported(with(
        "remotes",
        json!([{"type": "streamable-http", "url": "https://example.com/mcp", "headers": [
            {"name": "X-Api-Key", "isSecret": true, "isRequired": true, "description": "key"},
            {"name": "X-Region", "value": "eu-{zone}", "variables": {"zone": {"default": "1"}}},
            {"name": "X-Trace", "default": "on"},
            {"name": "X-Tenant", "isRequired": true},
            {"name": "X-Optional-Token", "isSecret": true},
            {"name": "X-Hint"}
        ]}]),
    ));
    let headers = &http(&imported).headers;
    assert_eq!(headers["X-Api-Key"], "${ENV:X_API_KEY}");
    assert_eq!(headers["X-Region"], "eu-1");
    assert_eq!(headers["X-Trace"], "on");
    assert_eq!(headers["X-Tenant"], "${ENV:X_TENANT}");
    assert_eq!(headers["X-Optional-Token"], "${ENV:X_OPTIONAL_TOKEN:-}");
    assert!(
        !headers.contains_key("X-Hint"),
        "optional and not given: left out"
    );
    let fields: Vec<_> = imported
        .inputs
        .iter()
        .map(|input| {
            (
                input.field.as_str(),
                input.secret,
                input.required,
                input.env.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        fields,
        [
            ("remotes[0].headers[0]", true, true, Some("X_API_KEY")),
            ("remotes[0].headers[3]", false, true, Some("X_TENANT")),
            (
                "remotes[0].headers[4]",
                true,
                false,
                Some("X_OPTIONAL_TOKEN")
            ),
            ("remotes[0].headers[5]", false, false, None),
        ]
    );
    assert_eq!(imported.inputs[0].description.as_deref(), Some("key"));
}

#[test]
fn url_templates_without_a_value_are_errors_naming_the_field() {
    let remote = |variables: serde_json::Value| {
        with(
            "remotes",
            json!([{"type": "streamable-http", "url": "https://{host}/mcp", "variables": variables}]),
        )
    };
    let options = ImportOptions::default();
    assert_eq!(
        refused(
            remote(json!({"host": {"description": "no default"}})),
            &options
        ),
        "remotes[0].variables.host"
    );
    assert_eq!(refused(remote(json!({})), &options), "remotes[0].url");
    let bad = with(
        "remotes",
        json!([{"type": "streamable-http", "url": "ftp://x/mcp"}]),
    );
    assert_eq!(refused(bad, &options), "remotes[0].url");
}

#[test]
fn an_unknown_remote_type_is_an_error_naming_it() {
    let document = with(
        "remotes",
        json!([{"type": "websocket", "url": "wss://x/mcp"}]),
    );
    assert_eq!(
        refused(document, &ImportOptions::default()),
        "remotes[0].type"
    );
}

#[test]
fn npm_runs_with_npx_and_its_arguments_in_order() {
    let imported = imported(npm(json!({
        "runtimeHint": "npx",
        "runtimeArguments": [{"type": "named", "name": "--node-options", "value": "--max-old-space-size=64"}],
        "packageArguments": [
            {"type": "positional", "value": "serve"},
            {"type": "named", "name": "--port", "default": "8080"},
            {"type": "named", "name": "--root", "value": "{dir}/data", "variables": {"dir": {"default": "/srv"}}},
            {"type": "positional", "valueHint": "config_path"},
            {"type": "positional", "valueHint": "workspace", "isRequired": true},
            {"type": "named", "name": "--mount", "value": "{src}", "variables": {"src": {"isRequired": true}}}
        ],
        "environmentVariables": [
            {"name": "API_KEY", "isSecret": true, "isRequired": true},
            {"name": "LOG_LEVEL", "default": "info"},
            {"name": "REGION", "isRequired": true},
            {"name": "OPTIONAL"}
        ]
    })));
    let stdio = stdio(&imported);
    assert_eq!(stdio.command, "npx");
    assert_eq!(
        stdio.args,
        [
            "-y",
            "--node-options",
            "--max-old-space-size=64",
            "@scope/pkg@1.2.3",
            "serve",
            "--port",
            "8080",
            "--root",
            "/srv/data",
            "{workspace}",
            "--mount",
            "{src}"
        ]
    );
    assert_eq!(stdio.env["API_KEY"], "${ENV:API_KEY}");
    assert_eq!(stdio.env["LOG_LEVEL"], "info");
    assert_eq!(stdio.env["REGION"], "${ENV:REGION}");
    assert!(!stdio.env.contains_key("OPTIONAL"));
    let fields: Vec<_> = imported
        .inputs
        .iter()
        .map(|input| input.field.as_str())
        .collect();
    assert_eq!(
        fields,
        [
            "packages[0].packageArguments[3]",
            "packages[0].packageArguments[4]",
            "packages[0].packageArguments[5].variables.src",
            "packages[0].environmentVariables[0]",
            "packages[0].environmentVariables[2]",
            "packages[0].environmentVariables[3]",
        ]
    );
    assert_eq!(imported.inputs[0].name, "config_path");
    assert!(!imported.inputs[0].required);
    assert_eq!(imported.choice, Choice::Package(0));
}

#[test]
fn pypi_runs_with_uvx_and_oci_with_docker() {
    let document = with(
        "packages",
        json!([
            {"registryType": "pypi", "identifier": "mcp-weather", "version": "0.3.0",
             "transport": {"type": "stdio"}, "packageArguments": [{"type": "positional", "value": "--stdio"}]},
            {"registryType": "oci", "identifier": "docker.io/mcp/filesystem", "version": "1.0.2",
             "runtimeHint": "docker", "transport": {"type": "stdio"},
             "runtimeArguments": [{"type": "named", "name": "--mount",
                "value": "type=bind,src={source},dst=/project", "variables": {"source": {"default": "/data"}}}],
             "packageArguments": [{"type": "positional", "value": "/project"}]},
            {"registryType": "oci", "identifier": "ghcr.io/acme/server:2.0", "transport": {"type": "stdio"}}
        ]),
    );
    let pypi = imported(document.clone());
    assert_eq!(stdio(&pypi).command, "uvx");
    assert_eq!(stdio(&pypi).args, ["mcp-weather==0.3.0", "--stdio"]);
    let options = |i| ImportOptions {
        choice: Some(Choice::Package(i)),
        allowed_tools: vec!["read_*".into()],
    };
    let oci = import(&document.to_string(), &options(1)).expect("oci import");
    assert_eq!(oci.choice, Choice::Package(1));
    assert_eq!(stdio(&oci).command, "docker");
    assert_eq!(
        stdio(&oci).args,
        [
            "run",
            "-i",
            "--rm",
            "--mount",
            "type=bind,src=/data,dst=/project",
            "docker.io/mcp/filesystem:1.0.2",
            "/project"
        ]
    );
    assert_eq!(oci.spec.allowed_tools, ["read_*"]);
    let tagged = import(&document.to_string(), &options(2)).expect("tagged oci import");
    assert_eq!(
        stdio(&tagged).args,
        ["run", "-i", "--rm", "ghcr.io/acme/server:2.0"]
    );
}

#[test]
fn choice_picks_a_remote_or_package_and_names_a_missing_one() {
    let mut document = with(
        "remotes",
        json!([{"type": "sse", "url": "https://a.example/sse"},
               {"type": "streamable-http", "url": "https://b.example/mcp"}]),
    );
    document["packages"] = npm(json!({}))["packages"].clone();
    let pick = |choice: &str| ImportOptions {
        choice: Some(choice.parse().expect("choice")),
        allowed_tools: Vec::new(),
    };
    let second = import(&document.to_string(), &pick("remotes[1]")).expect("remotes[1]");
    assert_eq!(http(&second).url, "https://b.example/mcp");
    let package = import(&document.to_string(), &pick("packages[0]")).expect("packages[0]");
    assert_eq!(stdio(&package).command, "npx");
    assert_eq!(refused(document, &pick("remotes[2]")), "choice");
    assert!("remote[0]".parse::<Choice>().is_err());
    assert_eq!(Choice::Package(3).to_string(), "packages[3]");
}

#[test]
fn nuget_mcpb_and_unknown_registry_types_are_refused_naming_the_field() {
    for registry_type in ["nuget", "mcpb", "cargo"] {
        let document = npm(json!({"registryType": registry_type}));
        assert_eq!(
            refused(document, &ImportOptions::default()),
            "packages[0].registryType",
            "{registry_type}"
        );
    }
}

#[test]
fn floating_versions_are_refused() {
    for version in ["latest", "^1.2.3", "~1.2", ">=1.0.0", "1.x", "1.*"] {
        let document = npm(json!({"version": version}));
        assert_eq!(
            refused(document, &ImportOptions::default()),
            "packages[0].version",
            "{version}"
        );
    }
    let document = npm(json!({"version": null}));
    assert_eq!(
        refused(document, &ImportOptions::default()),
        "packages[0].version"
    );
}

#[test]
fn package_transports_and_runtime_hints_other_than_the_mapped_ones_are_refused() {
    let options = ImportOptions::default();
    let http =
        npm(json!({"transport": {"type": "streamable-http", "url": "http://localhost:3000/mcp"}}));
    assert_eq!(refused(http, &options), "packages[0].transport.type");
    let bunx = npm(json!({"runtimeHint": "bunx"}));
    assert_eq!(refused(bunx, &options), "packages[0].runtimeHint");
}

#[test]
fn malformed_documents_name_the_field() {
    let options = ImportOptions::default();
    let cases = [
        (json!({"description": "x", "version": "1"}), "name"),
        (
            json!({"name": "no-slash", "description": "x", "version": "1"}),
            "name",
        ),
        (with("description", json!("x".repeat(101))), "description"),
        (with("remotes", json!([{"type": "sse"}])), "remotes[0].url"),
        (
            with("packages", json!([{"registryType": 7}])),
            "packages[0].registryType",
        ),
        (
            npm(json!({"packageArguments": [{"type": "positional"}]})),
            "packages[0].packageArguments[0]",
        ),
        (
            npm(json!({"packageArguments": [{"type": "flag"}]})),
            "packages[0].packageArguments[0].type",
        ),
        (
            npm(json!({"packageArguments": [{"type": "named"}]})),
            "packages[0].packageArguments[0].name",
        ),
        (
            npm(json!({"environmentVariables": [{"name": "A-B"}]})),
            "packages[0].environmentVariables[0].name",
        ),
        (base(), "remotes"),
    ];
    for (document, field) in cases {
        assert_eq!(refused(document.clone(), &options), field, "{document}");
    }
    let broken = import(r#"{"name": "io.x/y", "remotes": [{"type": }]}"#, &options)
        .expect_err("malformed JSON");
    assert_eq!(broken.field(), Some("remotes[0].type"), "{broken}");
    assert!(matches!(
        import("not json", &options),
        Err(ModelError::Syntax { .. })
    ));
}

#[test]
fn server_ids_and_display_names_come_from_the_name_and_title() {
    assert_eq!(
        server_id_of("io.github.user/my.server").unwrap(),
        "my-server"
    );
    assert_eq!(server_id_of("com.example/_x").unwrap(), "x");
    assert_eq!(
        server_id_of(&format!("a.b/{}", "y".repeat(80)))
            .unwrap()
            .len(),
        64
    );
    assert_eq!(server_id_of("a.b/...").unwrap_err().field(), Some("name"));
    let mut document = with(
        "remotes",
        json!([{"type": "sse", "url": "https://x.example/sse"}]),
    );
    assert_eq!(
        imported(document.clone()).spec.display_name.as_deref(),
        Some("io.github.user/weather")
    );
    document["title"] = json!("Weather");
    assert_eq!(
        imported(document).spec.display_name.as_deref(),
        Some("Weather")
    );
    assert_eq!(header_env_name("x-api-key"), "X_API_KEY");
    assert_eq!(header_env_name("2fa"), "_2FA");
}
