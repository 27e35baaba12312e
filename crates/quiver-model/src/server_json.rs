//! The official MCP Registry's `server.json` (registry API v0.1, schema
//! 2025-10-17) and its import as a record (docs/reference.md §5.4).
//!
//! A `server.json` describes how to reach one server in several ways:
//! `remotes` (hosted endpoints) and `packages` (npm, PyPI, OCI, NuGet, MCPB
//! artefacts to run). A record is one way, so the import picks one
//! ([`Choice`]): the first remote, else the first package. What the file
//! leaves to the user (required values without a value, secrets) is listed
//! as [`InputToFill`]s, each naming its field; env and header values the
//! user fills read `${ENV:NAME}` so a worker's environment can supply them.
//!
//! The schema's `Input`, `Argument` and `KeyValueInput` share one struct
//! ([`Input`]): each use reads the fields it means and ignores the others,
//! as unknown fields are ignored (newer schema versions add fields).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::env_ref::is_env_name;
use crate::error::join_path;
use crate::{
    FieldError, Format, HttpConfig, McpServerSpec, ModelError, StdioConfig, Transport, validate,
};

/// A `server.json` document, as far as an import reads it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerJson {
    /// `<reverse-DNS namespace>/<name>`.
    pub name: String,
    /// What the server does (at most 100 characters).
    pub description: String,
    /// The server's version (not a range).
    pub version: String,
    /// Human-readable name.
    #[serde(default)]
    pub title: Option<String>,
    /// Hosted endpoints.
    #[serde(default)]
    pub remotes: Vec<Remote>,
    /// Artefacts to run locally.
    #[serde(default)]
    pub packages: Vec<Package>,
}

/// One hosted endpoint.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Remote {
    /// `streamable-http` or `sse`.
    #[serde(rename = "type")]
    pub kind: String,
    /// URL template: `{variable}`s filled from `variables`.
    pub url: String,
    /// Request headers.
    #[serde(default)]
    pub headers: Vec<Input>,
    /// Values of the URL template's variables.
    #[serde(default)]
    pub variables: BTreeMap<String, Input>,
}

/// One artefact to run.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Package {
    /// `npm`, `pypi`, `oci`, `nuget` or `mcpb`.
    pub registry_type: String,
    /// Package name or image reference.
    pub identifier: String,
    /// Exact version (OCI images may carry it in `identifier`).
    #[serde(default)]
    pub version: Option<String>,
    /// The runtime the publisher means (`npx`, `uvx`, `docker`, `dnx`).
    #[serde(default)]
    pub runtime_hint: Option<String>,
    /// How the running package speaks MCP.
    pub transport: PackageTransport,
    /// Arguments of the runtime (`docker run …`, `npx …`).
    #[serde(default)]
    pub runtime_arguments: Vec<Input>,
    /// Arguments of the package's own program.
    #[serde(default)]
    pub package_arguments: Vec<Input>,
    /// Environment of the process.
    #[serde(default)]
    pub environment_variables: Vec<Input>,
}

/// A package's `transport`.
#[derive(Debug, Clone, Deserialize)]
pub struct PackageTransport {
    /// `stdio`, `streamable-http` or `sse`.
    #[serde(rename = "type")]
    pub kind: String,
}

/// An input, argument, header or environment variable of the schema.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Input {
    /// Arguments: `positional` or `named`.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    /// Named arguments: the flag; headers and environment variables: the name.
    #[serde(default)]
    pub name: Option<String>,
    /// Positional arguments: a label of the value.
    #[serde(default)]
    pub value_hint: Option<String>,
    /// Shown to the user.
    #[serde(default)]
    pub description: Option<String>,
    /// Whether a value must be given.
    #[serde(default)]
    pub is_required: bool,
    /// Whether the value is a secret.
    #[serde(default)]
    pub is_secret: bool,
    /// A fixed value (`{variable}`s filled from `variables`).
    #[serde(default)]
    pub value: Option<String>,
    /// The value when the user gives none.
    #[serde(default)]
    pub default: Option<String>,
    /// Values of the `{variable}`s of `value`.
    #[serde(default)]
    pub variables: BTreeMap<String, Input>,
}

impl Input {
    /// The value the file gives: `value`, else `default`.
    fn given(&self) -> Option<&str> {
        self.value.as_deref().or(self.default.as_deref())
    }
}

/// Which remote or package becomes the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// `remotes[i]`.
    Remote(usize),
    /// `packages[i]`.
    Package(usize),
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Choice::Remote(i) => write!(f, "remotes[{i}]"),
            Choice::Package(i) => write!(f, "packages[{i}]"),
        }
    }
}

impl std::str::FromStr for Choice {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let parse = |prefix: &str| {
            text.strip_prefix(prefix)?
                .strip_suffix(']')?
                .parse::<usize>()
                .ok()
        };
        parse("remotes[")
            .map(Choice::Remote)
            .or_else(|| parse("packages[").map(Choice::Package))
            .ok_or_else(|| format!("{text:?} is not remotes[N] or packages[N]"))
    }
}

/// How to import.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// The remote or package to use; `None`: the first remote, else the first package.
    pub choice: Option<Choice>,
    /// The record's `allowed_tools` (empty: the record model's default deny).
    pub allowed_tools: Vec<String>,
}

/// A value the file leaves to the user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InputToFill {
    /// Where in the file (`packages[0].environmentVariables[1]`).
    pub field: String,
    /// The argument's, header's, variable's or environment variable's name.
    pub name: String,
    /// The file's description of it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Whether it is a secret.
    pub secret: bool,
    /// Whether the server needs it.
    pub required: bool,
    /// The worker environment variable the record reads it from
    /// (`${ENV:NAME}`), when the record has a reference; else the record
    /// holds the `{placeholder}` to replace, or leaves the optional value out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
}

/// The outcome of an import: one record and what is left to fill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    /// The record (valid by [`validate`]).
    pub spec: McpServerSpec,
    /// Values the file leaves to the user.
    pub inputs: Vec<InputToFill>,
    /// The remote or package the record was made of.
    pub choice: Choice,
}

/// Parses a `server.json` and checks it as the official schema and
/// validation do; errors name the field (`packages[0].version`).
pub fn parse(text: &str) -> Result<ServerJson, ModelError> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let document: ServerJson =
        serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
            let path = err.path().to_string();
            let message = err.inner().to_string();
            // serde reports a missing field at the object holding it.
            let missing = message
                .strip_prefix("missing field `")
                .and_then(|rest| rest.split_once('`'))
                .map(|(name, _)| name.to_owned());
            let path = if path == "." { String::new() } else { path };
            match missing {
                Some(name) => ModelError::Invalid(vec![FieldError::new(
                    join_path(&path, &name),
                    "is required",
                )]),
                None if path.is_empty() => ModelError::Syntax {
                    format: Format::Json,
                    message,
                },
                None => ModelError::Invalid(vec![FieldError::new(path, message)]),
            }
        })?;
    let errors = document.check();
    if errors.is_empty() {
        Ok(document)
    } else {
        Err(ModelError::Invalid(errors))
    }
}

/// [`parse`] and [`ServerJson::import`] in one.
pub fn import(text: &str, options: &ImportOptions) -> Result<Imported, ModelError> {
    parse(text)?.import(options)
}

/// The registry's name rule: one `/` between a reverse-DNS namespace and a name.
fn is_valid_name(name: &str) -> bool {
    let Some((namespace, rest)) = name.split_once('/') else {
        return false;
    };
    (3..=200).contains(&name.len())
        && !namespace.is_empty()
        && namespace
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        && !rest.is_empty()
        && rest
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// A version range or floating tag, which the official validation refuses
/// (`latest`, `^1.2.3`, `~1.2`, `>=1`, `1.x`, `1.*`).
fn floating_version(version: &str) -> Option<&'static str> {
    if version == "latest" {
        return Some("\"latest\" is a floating tag: name a specific version");
    }
    let ranged = version.starts_with(['^', '~', '>', '<', '='])
        || version.contains(['*', ' '])
        || version
            .split('.')
            .skip(1)
            .any(|part| part == "x" || part == "X");
    ranged.then_some("is a version range: name a specific version")
}

const REGISTRY_TYPES: [&str; 5] = ["npm", "pypi", "oci", "nuget", "mcpb"];

impl ServerJson {
    /// The official schema's and validation's rules an import relies on.
    fn check(&self) -> Vec<FieldError> {
        let mut errors = Vec::new();
        if !is_valid_name(&self.name) {
            errors.push(FieldError::new(
                "name",
                format!(
                    "{:?} must be <namespace>/<name> (^[a-zA-Z0-9.-]+/[a-zA-Z0-9._-]+$, 3 to 200 characters)",
                    self.name
                ),
            ));
        }
        let description_len = self.description.chars().count();
        if !(1..=100).contains(&description_len) {
            errors.push(FieldError::new(
                "description",
                format!("must be 1 to 100 characters, has {description_len}"),
            ));
        }
        if self.version.is_empty() || self.version.len() > 255 {
            errors.push(FieldError::new("version", "must be 1 to 255 characters"));
        } else if let Some(why) = floating_version(&self.version) {
            errors.push(FieldError::new("version", why));
        }
        for (i, remote) in self.remotes.iter().enumerate() {
            if !matches!(remote.kind.as_str(), "streamable-http" | "sse") {
                errors.push(FieldError::new(
                    format!("remotes[{i}].type"),
                    format!(
                        "{:?} is not a remote transport: expected \"streamable-http\" or \"sse\"",
                        remote.kind
                    ),
                ));
            }
            for (j, header) in remote.headers.iter().enumerate() {
                if header.name.as_deref().is_none_or(str::is_empty) {
                    errors.push(FieldError::new(
                        format!("remotes[{i}].headers[{j}].name"),
                        "is required",
                    ));
                }
            }
        }
        for (i, package) in self.packages.iter().enumerate() {
            let at = format!("packages[{i}]");
            if !REGISTRY_TYPES.contains(&package.registry_type.as_str()) {
                errors.push(FieldError::new(
                    format!("{at}.registryType"),
                    format!(
                        "unknown registry type {:?}: expected one of {}",
                        package.registry_type,
                        REGISTRY_TYPES.join(", ")
                    ),
                ));
            }
            if package.identifier.is_empty() {
                errors.push(FieldError::new(format!("{at}.identifier"), "is required"));
            }
            if let Some(version) = &package.version {
                if version.is_empty() {
                    errors.push(FieldError::new(
                        format!("{at}.version"),
                        "must not be empty",
                    ));
                } else if let Some(why) = floating_version(version) {
                    errors.push(FieldError::new(format!("{at}.version"), why));
                }
            }
            for (list, arguments) in [
                ("runtimeArguments", &package.runtime_arguments),
                ("packageArguments", &package.package_arguments),
            ] {
                for (j, argument) in arguments.iter().enumerate() {
                    check_argument(&format!("{at}.{list}[{j}]"), argument, &mut errors);
                }
            }
            for (j, variable) in package.environment_variables.iter().enumerate() {
                let field = format!("{at}.environmentVariables[{j}].name");
                match variable.name.as_deref() {
                    None | Some("") => errors.push(FieldError::new(field, "is required")),
                    Some(name) if !is_env_name(name) => errors.push(FieldError::new(
                        field,
                        format!("{name:?} is not a valid environment variable name"),
                    )),
                    Some(_) => {}
                }
            }
        }
        errors
    }

    /// The record of the chosen remote or package (see the module's docs).
    pub fn import(&self, options: &ImportOptions) -> Result<Imported, ModelError> {
        let choice = match options.choice {
            Some(choice) => choice,
            None if !self.remotes.is_empty() => Choice::Remote(0),
            None if !self.packages.is_empty() => Choice::Package(0),
            None => {
                return Err(invalid(
                    "remotes",
                    "the server.json has neither remotes nor packages: nothing to connect to",
                ));
            }
        };
        let server_id = server_id_of(&self.name)?;
        let mut inputs = Vec::new();
        let mut spec = match choice {
            Choice::Remote(i) => {
                let remote = self.remotes.get(i).ok_or_else(|| out_of_range(choice))?;
                remote_record(&server_id, &format!("{choice}"), remote, &mut inputs)?
            }
            Choice::Package(i) => {
                let package = self.packages.get(i).ok_or_else(|| out_of_range(choice))?;
                package_record(&server_id, &format!("{choice}"), package, &mut inputs)?
            }
        };
        spec.display_name = Some(self.title.clone().unwrap_or_else(|| self.name.clone()));
        spec.allowed_tools = options.allowed_tools.clone();
        validate(&spec)?;
        Ok(Imported {
            spec,
            inputs,
            choice,
        })
    }
}

fn check_argument(at: &str, argument: &Input, errors: &mut Vec<FieldError>) {
    match argument.kind.as_deref() {
        Some("positional") => {
            if argument.value.is_none() && argument.value_hint.is_none() {
                errors.push(FieldError::new(
                    at,
                    "a positional argument needs a value or a valueHint",
                ));
            }
        }
        Some("named") => {
            if argument.name.as_deref().is_none_or(str::is_empty) {
                errors.push(FieldError::new(format!("{at}.name"), "is required"));
            }
        }
        Some(other) => errors.push(FieldError::new(
            format!("{at}.type"),
            format!("{other:?} is not an argument type: expected \"positional\" or \"named\""),
        )),
        None => errors.push(FieldError::new(format!("{at}.type"), "is required")),
    }
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> ModelError {
    ModelError::Invalid(vec![FieldError::new(field, message)])
}

fn out_of_range(choice: Choice) -> ModelError {
    invalid("choice", format!("the server.json has no {choice}"))
}

/// The last segment of the name, made a valid `server_id`: characters
/// outside `[A-Za-z0-9_-]` become `-`, leading ones that cannot start an id
/// are dropped, at most 64 are kept.
fn server_id_of(name: &str) -> Result<String, ModelError> {
    let last = name.rsplit('/').next().unwrap_or(name);
    let mapped: String = last
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .skip_while(|c| !c.is_ascii_alphanumeric())
        .take(64)
        .collect();
    if mapped.is_empty() {
        return Err(invalid(
            "name",
            format!("{name:?} gives no usable server_id (no letter or digit after the '/')"),
        ));
    }
    Ok(mapped)
}

/// The environment variable a secret header is read from: the header's
/// name in upper snake case (`X-Api-Key` → `X_API_KEY`).
pub fn header_env_name(header: &str) -> String {
    let mut name: String = header
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, '_');
    }
    name
}

/// Where a value goes: env and header values may hold `${ENV:…}`
/// references, arguments may not (a worker passes them as they are).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Slot {
    EnvOrHeader,
    Argument,
}

/// `template` with each `{name}` that `variables` defines replaced by its
/// value or default. A variable without one is an input to fill: an
/// `${ENV:NAME}` reference in env and header values, the `{name}` kept in
/// arguments. Braces naming no variable stay as they are (the schema's rule).
fn fill(
    at: &str,
    template: &str,
    variables: &BTreeMap<String, Input>,
    slot: Slot,
    inputs: &mut Vec<InputToFill>,
) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else {
            out.push_str(&rest[open..]);
            return out;
        };
        let name = &after[..close];
        match variables.get(name) {
            Some(variable) if !variable.is_secret && variable.given().is_some() => {
                out.push_str(variable.given().unwrap_or_default());
            }
            Some(variable) => {
                let env = (slot == Slot::EnvOrHeader).then(|| header_env_name(name));
                match &env {
                    Some(env) => out.push_str(&format!("${{ENV:{env}}}")),
                    None => out.push_str(&rest[open..open + close + 2]),
                }
                inputs.push(InputToFill {
                    field: format!("{at}.variables.{name}"),
                    name: name.to_owned(),
                    description: variable.description.clone(),
                    secret: variable.is_secret,
                    required: true,
                    env,
                });
            }
            None => out.push_str(&rest[open..open + close + 2]),
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
}

/// The value of an env variable or header named `name` (read from
/// `${ENV:env}` when the user fills it); `None`: optional and not given.
fn env_or_header_value(
    at: &str,
    name: &str,
    env: String,
    input: &Input,
    inputs: &mut Vec<InputToFill>,
) -> Option<String> {
    let to_fill = |env: Option<String>| InputToFill {
        field: at.to_owned(),
        name: name.to_owned(),
        description: input.description.clone(),
        secret: input.is_secret,
        required: input.is_required,
        env,
    };
    if !input.is_secret
        && let Some(given) = input.given()
    {
        return Some(fill(at, given, &input.variables, Slot::EnvOrHeader, inputs));
    }
    if input.is_secret || input.is_required {
        // An optional secret the worker's environment lacks is empty
        // rather than a connection failure.
        let reference = if input.is_required {
            format!("${{ENV:{env}}}")
        } else {
            format!("${{ENV:{env}:-}}")
        };
        inputs.push(to_fill(Some(env)));
        return Some(reference);
    }
    inputs.push(to_fill(None));
    None
}

fn remote_record(
    server_id: &str,
    at: &str,
    remote: &Remote,
    inputs: &mut Vec<InputToFill>,
) -> Result<McpServerSpec, ModelError> {
    let transport = match remote.kind.as_str() {
        "sse" => Transport::HttpSseLegacy,
        _ => Transport::StreamableHttp,
    };
    let url = url_of(at, remote)?;
    let mut headers = BTreeMap::new();
    for (j, header) in remote.headers.iter().enumerate() {
        let name = header.name.clone().unwrap_or_default();
        let field = format!("{at}.headers[{j}]");
        if let Some(value) =
            env_or_header_value(&field, &name, header_env_name(&name), header, inputs)
        {
            headers.insert(name, value);
        }
    }
    let mut spec = McpServerSpec::new(server_id, transport);
    spec.http = Some(HttpConfig {
        url,
        headers,
        auth_ref: None,
    });
    Ok(spec)
}

/// The remote's URL with every `{variable}` filled from its value or
/// default: a URL cannot wait for the user, so a missing one is an error.
fn url_of(at: &str, remote: &Remote) -> Result<String, ModelError> {
    let mut url = String::with_capacity(remote.url.len());
    let mut rest = remote.url.as_str();
    while let Some(open) = rest.find('{') {
        url.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let close = after
            .find('}')
            .ok_or_else(|| invalid(format!("{at}.url"), "has a '{' without its '}'"))?;
        let name = &after[..close];
        let variable = remote.variables.get(name).ok_or_else(|| {
            invalid(
                format!("{at}.url"),
                format!("names variable {{{name}}}, which {at}.variables does not define"),
            )
        })?;
        let value = variable.given().ok_or_else(|| {
            invalid(
                format!("{at}.variables.{name}"),
                "has neither value nor default: the URL template cannot be filled",
            )
        })?;
        url.push_str(value);
        rest = &after[close + 1..];
    }
    url.push_str(rest);
    match url::Url::parse(&url) {
        Ok(parsed) if matches!(parsed.scheme(), "http" | "https") && parsed.has_host() => Ok(url),
        _ => Err(invalid(
            format!("{at}.url"),
            format!("{url:?} is not an http(s) URL with a host"),
        )),
    }
}

/// Command-line words of one argument; `None`: optional and not given.
fn argument_words(
    at: &str,
    argument: &Input,
    inputs: &mut Vec<InputToFill>,
) -> Option<Vec<String>> {
    let named = argument.kind.as_deref() == Some("named");
    let flag = argument.name.clone().unwrap_or_default();
    let label = if named {
        flag.trim_start_matches('-').to_owned()
    } else {
        argument.value_hint.clone().unwrap_or_default()
    };
    let value = match argument.given().filter(|_| !argument.is_secret) {
        Some(given) => fill(at, given, &argument.variables, Slot::Argument, inputs),
        None => {
            inputs.push(InputToFill {
                field: at.to_owned(),
                name: label.clone(),
                description: argument.description.clone(),
                secret: argument.is_secret,
                required: argument.is_required,
                env: None,
            });
            if !argument.is_required && !argument.is_secret {
                return None;
            }
            format!("{{{label}}}")
        }
    };
    // The schema's named argument is "a command-line `--flag {value}`":
    // two words.
    Some(if named {
        vec![flag, value]
    } else {
        vec![value]
    })
}

/// What runs a package of a registry type: the program, the words before
/// the runtime arguments, and how the package is named after them.
fn runtime_of(
    at: &str,
    package: &Package,
) -> Result<(&'static str, Vec<String>, String), ModelError> {
    let version = || {
        package.version.as_deref().ok_or_else(|| {
            invalid(
                format!("{at}.version"),
                format!("is required for {} packages", package.registry_type),
            )
        })
    };
    let (program, lead, target) = match package.registry_type.as_str() {
        "npm" => (
            "npx",
            vec!["-y".to_owned()],
            format!("{}@{}", package.identifier, version()?),
        ),
        "pypi" => (
            "uvx",
            Vec::new(),
            format!("{}=={}", package.identifier, version()?),
        ),
        "oci" => {
            let image = &package.identifier;
            let last = image.rsplit('/').next().unwrap_or(image);
            let tagged = last.contains(':') || image.contains('@');
            let image = match (&package.version, tagged) {
                (Some(version), false) => format!("{image}:{version}"),
                _ => image.clone(),
            };
            (
                "docker",
                vec!["run".into(), "-i".into(), "--rm".into()],
                image,
            )
        }
        "nuget" => {
            return Err(invalid(
                format!("{at}.registryType"),
                "nuget packages run with dnx of the .NET 10 SDK, which is not among the \
                 runtimes an import maps (npx, uvx, docker): write the record by hand",
            ));
        }
        "mcpb" => {
            return Err(invalid(
                format!("{at}.registryType"),
                "mcpb bundles are archives to download, verify (fileSha256) and unpack \
                 before they run; a worker starts a command line, so write the record by hand",
            ));
        }
        other => {
            return Err(invalid(
                format!("{at}.registryType"),
                format!("unknown registry type {other:?}"),
            ));
        }
    };
    if let Some(hint) = &package.runtime_hint
        && hint != program
    {
        return Err(invalid(
            format!("{at}.runtimeHint"),
            format!(
                "{hint:?}: an import runs {} packages with {program} only",
                package.registry_type
            ),
        ));
    }
    Ok((program, lead, target))
}

fn package_record(
    server_id: &str,
    at: &str,
    package: &Package,
    inputs: &mut Vec<InputToFill>,
) -> Result<McpServerSpec, ModelError> {
    if package.transport.kind != "stdio" {
        return Err(invalid(
            format!("{at}.transport.type"),
            format!(
                "{:?}: a worker starts packages over stdio only; run an HTTP package \
                 yourself and import it as a remote",
                package.transport.kind
            ),
        ));
    }
    let (program, mut args, target) = runtime_of(at, package)?;
    // Runtime arguments go to the runtime (after `docker run`, before the
    // image), package arguments to the package's program (after it).
    for (j, argument) in package.runtime_arguments.iter().enumerate() {
        let field = format!("{at}.runtimeArguments[{j}]");
        args.extend(
            argument_words(&field, argument, inputs)
                .into_iter()
                .flatten(),
        );
    }
    args.push(target);
    for (j, argument) in package.package_arguments.iter().enumerate() {
        let field = format!("{at}.packageArguments[{j}]");
        args.extend(
            argument_words(&field, argument, inputs)
                .into_iter()
                .flatten(),
        );
    }
    let mut env = BTreeMap::new();
    for (j, variable) in package.environment_variables.iter().enumerate() {
        let name = variable.name.clone().unwrap_or_default();
        let field = format!("{at}.environmentVariables[{j}]");
        if let Some(value) = env_or_header_value(&field, &name, name.clone(), variable, inputs) {
            env.insert(name, value);
        }
    }
    let mut spec = McpServerSpec::new(server_id, Transport::Stdio);
    spec.stdio = Some(StdioConfig {
        command: program.to_owned(),
        args,
        env,
        ..StdioConfig::default()
    });
    Ok(spec)
}

#[cfg(test)]
#[path = "server_json_tests.rs"]
mod tests;
