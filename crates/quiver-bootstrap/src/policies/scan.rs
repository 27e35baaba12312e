//! Reading and validating the files of a `policies.d` directory.

use std::collections::BTreeMap;
use std::path::Path;

use quiver_model::access::{
    AccessKind, AccessSpec, IdentityProviderRecord, PolicyRecord, check_name, validate_provider,
};
use quiver_model::policy::TaskPolicy;
use quiver_model::{FieldError, Format, Strictness, kind_of, parse_value, render_ignored};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::scan::{DirFile, FileError, read_dir};
use crate::{BootstrapError, Scan};

/// A policy or identity provider declared by a `policies.d` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessFileRecord {
    /// The declaring file's name (not its path): the record's `file:<name>`
    /// source.
    pub file: String,
    /// Where in the file: `policies.<name>` or `identity_providers[<i>]`,
    /// the prefix of the fields messages name.
    pub at: String,
    /// The record (a policy or an identity provider).
    pub spec: AccessSpec,
}

/// What a `policies.d` directory declares: its records ordered by kind
/// (policies first) then name.
pub type PolicyScan = Scan<AccessFileRecord>;

/// The key of the policies' table: `[policies.<name>]`.
const POLICIES: &str = "policies";
/// The key of the providers' list: `[[identity_providers]]`.
const PROVIDERS: &str = "identity_providers";

/// Reads the policies and identity providers declared directly inside `dir`
/// (the files of `mcp.d`'s rules: see the crate docs).
///
/// A file is invalid when a record in it is, or when it defines a policy
/// or provider (or a provider's issuer) an earlier file defines: the error
/// names both files. Lenient mode reports invalid files in
/// [`crate::Scan::errors`]; strict mode returns
/// [`BootstrapError::Invalid`] naming every invalid file.
pub fn scan(dir: &Path, strictness: Strictness) -> Result<PolicyScan, BootstrapError> {
    let mut found = PolicyScan::default();
    let mut taken = Taken::default();
    let mut records = Vec::new();
    for DirFile { name, format, text } in read_dir(dir, &mut found)? {
        let parsed = match parse_file(&name, format, &text, strictness) {
            Ok(parsed) => parsed,
            Err(error) => {
                found.errors.push(error);
                continue;
            }
        };
        let clashes = taken.clashes(&name, &parsed.records);
        if !clashes.is_empty() {
            found.errors.push(FileError::from_fields(&name, &clashes));
            continue;
        }
        for field in &parsed.ignored {
            found
                .warnings
                .push(format!("{name}: unknown field \"{field}\" ignored"));
        }
        taken.take(&name, &parsed.records);
        found.files.push(name.clone());
        records.extend(
            parsed
                .records
                .into_iter()
                .map(|(at, spec)| AccessFileRecord {
                    file: name.clone(),
                    at,
                    spec,
                }),
        );
    }
    records.sort_by(|a, b| (a.spec.kind(), a.spec.name()).cmp(&(b.spec.kind(), b.spec.name())));
    found.records = records;
    found.finish(dir, strictness)
}

/// The valid records of one file, each with where it is in the file
/// (`policies.<name>`, `identity_providers[<i>]`), and the unknown fields
/// dropped from it (lenient mode).
#[derive(Default)]
struct Parsed {
    records: Vec<(String, AccessSpec)>,
    ignored: Vec<String>,
}

fn parse_file(
    file: &str,
    format: Format,
    text: &str,
    strictness: Strictness,
) -> Result<Parsed, FileError> {
    let value = parse_value(text, format).map_err(|err| FileError::from_model(file, &err))?;
    let Value::Object(top) = value else {
        let error = FieldError::new(
            "",
            format!("expected a table/object, found {}", kind_of(&value)),
        );
        return Err(FileError::from_fields(file, &[error]));
    };
    let mut parsed = Parsed::default();
    let mut errors = Vec::new();
    for (key, value) in top {
        match key.as_str() {
            POLICIES => parse_policies(value, strictness, &mut parsed, &mut errors),
            PROVIDERS => parse_providers(value, strictness, &mut parsed, &mut errors),
            // API keys are never read from files: a key's secret is shown
            // once, when the registry makes it.
            _ if strictness == Strictness::Strict => {
                errors.push(FieldError::new(key, "unknown field"));
            }
            _ => parsed.ignored.push(key),
        }
    }
    if errors.is_empty() {
        Ok(parsed)
    } else {
        Err(FileError::from_fields(file, &errors))
    }
}

fn parse_policies(
    value: Value,
    strictness: Strictness,
    parsed: &mut Parsed,
    errors: &mut Vec<FieldError>,
) {
    let Value::Object(policies) = value else {
        errors.push(FieldError::new(
            POLICIES,
            format!(
                "expected a table of policies ([policies.<name>]), found {}",
                kind_of(&value)
            ),
        ));
        return;
    };
    for (name, value) in policies {
        let at = format!("{POLICIES}.{name}");
        if let Err(error) = check_name(&at, &name) {
            errors.push(error);
            continue;
        }
        let Some(policy) = record::<TaskPolicy>(value, &at, strictness, parsed, errors) else {
            continue;
        };
        let spec = AccessSpec::Policy(PolicyRecord { name, policy });
        match spec.validate() {
            Ok(()) => parsed.records.push((at, spec)),
            Err(error) => errors.push(error.nested(&at)),
        }
    }
}

fn parse_providers(
    value: Value,
    strictness: Strictness,
    parsed: &mut Parsed,
    errors: &mut Vec<FieldError>,
) {
    let Value::Array(providers) = value else {
        errors.push(FieldError::new(
            PROVIDERS,
            format!(
                "expected a list of identity providers ([[identity_providers]]), found {}",
                kind_of(&value)
            ),
        ));
        return;
    };
    for (i, value) in providers.into_iter().enumerate() {
        let at = format!("{PROVIDERS}[{i}]");
        let Some(provider) =
            record::<IdentityProviderRecord>(value, &at, strictness, parsed, errors)
        else {
            continue;
        };
        match validate_provider(&provider) {
            Ok(()) => parsed
                .records
                .push((at, AccessSpec::IdentityProvider(provider))),
            Err(error) => errors.push(error.nested(&at)),
        }
    }
}

/// Deserialises the record at `at`, adding its errors, or its dropped
/// unknown fields, to the file's.
fn record<T: DeserializeOwned>(
    value: Value,
    at: &str,
    strictness: Strictness,
    parsed: &mut Parsed,
    errors: &mut Vec<FieldError>,
) -> Option<T> {
    match deserialize::<T>(value, strictness) {
        Ok((record, ignored)) => {
            parsed.ignored.extend(
                ignored
                    .into_iter()
                    .map(|field| FieldError::new(field, "").nested(at).field),
            );
            Some(record)
        }
        Err(found) => {
            errors.extend(found.into_iter().map(|error| error.nested(at)));
            None
        }
    }
}

/// Deserialises `value` as a `T`. Unknown fields are errors in strict
/// mode. In lenient mode they are dropped and returned as paths, as for
/// `mcp.d` records, even where `T` refuses unknown fields (the task policy
/// and the provider do, everywhere else): the field is removed from
/// `value` and the record read again, which in strict mode also finds them
/// all rather than the first.
fn deserialize<T: DeserializeOwned>(
    mut value: Value,
    strictness: Strictness,
) -> Result<(T, Vec<String>), Vec<FieldError>> {
    let mut dropped = Vec::new();
    loop {
        let mut ignored = Vec::new();
        let mut track = serde_path_to_error::Track::new();
        let deserializer = serde_path_to_error::Deserializer::new(value.clone(), &mut track);
        let result: Result<T, _> = serde_ignored::deserialize(deserializer, |path| {
            ignored.push(render_ignored(&path));
        });
        let err = match result {
            Ok(record) => {
                dropped.extend(ignored);
                if strictness == Strictness::Strict && !dropped.is_empty() {
                    return Err(dropped
                        .into_iter()
                        .map(|field| FieldError::new(field, "unknown field"))
                        .collect());
                }
                return Ok((record, dropped));
            }
            Err(err) => err.to_string(),
        };
        let path = track.path();
        if let Some(name) = quoted_after(&err, "unknown field `") {
            // The path ends with the refused field itself.
            let field = path.to_string();
            if remove_field(&mut value, &path, name) {
                dropped.push(field);
                continue;
            }
            return Err(vec![FieldError::new(field, "unknown field")]);
        }
        // serde reports a missing field at its parent; name the field itself.
        let parent = path.to_string();
        let parent = if parent == "." { "" } else { parent.as_str() };
        return Err(vec![match quoted_after(&err, "missing field `") {
            Some(name) => FieldError::new(name, "missing required field").nested(parent),
            None => FieldError::new(parent, err),
        }]);
    }
}

/// `name` of a serde message `<prefix>name`…`.
fn quoted_after<'a>(message: &'a str, prefix: &str) -> Option<&'a str> {
    message.strip_prefix(prefix)?.split('`').next()
}

/// Removes the field `name` that `path` ends with from `value`; whether
/// it was there.
fn remove_field(value: &mut Value, path: &serde_path_to_error::Path, name: &str) -> bool {
    use serde_path_to_error::Segment;
    let segments: Vec<&Segment> = path.iter().collect();
    let Some((Segment::Map { key }, parents)) = segments.split_last() else {
        return false;
    };
    if key != name {
        return false;
    }
    let mut at = value;
    for segment in parents {
        let next = match segment {
            Segment::Seq { index } => at.get_mut(*index),
            Segment::Map { key } => at.get_mut(key.as_str()),
            Segment::Enum { .. } | Segment::Unknown => None,
        };
        let Some(next) = next else {
            return false;
        };
        at = next;
    }
    at.as_object_mut()
        .is_some_and(|table| table.remove(name).is_some())
}

/// Where a record or issuer is defined: the file and the record's place
/// in it.
#[derive(Debug, Clone)]
struct Place {
    file: String,
    at: String,
}

/// The names and issuers the valid files read so far define, so a later
/// file defining one again is refused, naming both files.
#[derive(Default)]
struct Taken {
    records: BTreeMap<(AccessKind, String), Place>,
    /// Issuer → its provider's place and name: a token's `iss` picks its
    /// provider, so two providers with one issuer would leave the choice to
    /// their order.
    issuers: BTreeMap<String, (Place, String)>,
}

impl Taken {
    /// What `file`'s records define that earlier files, or earlier records
    /// of `file` itself, define already.
    fn clashes(&self, file: &str, records: &[(String, AccessSpec)]) -> Vec<FieldError> {
        let mut this_file = Taken::default();
        let mut clashes = Vec::new();
        let where_ = |place: &Place| {
            if place.file == file {
                format!("{} in this file", place.at)
            } else {
                format!("{} ({})", place.file, place.at)
            }
        };
        for (at, spec) in records {
            let (kind, name) = (spec.kind(), spec.name());
            let key = (kind, name.to_owned());
            let name_field = match spec {
                AccessSpec::Policy(_) => at.clone(),
                _ => format!("{at}.name"),
            };
            if let Some(place) = self
                .records
                .get(&key)
                .or_else(|| this_file.records.get(&key))
            {
                clashes.push(FieldError::new(
                    name_field,
                    format!("{kind} {name:?} is already defined by {}", where_(place)),
                ));
            }
            if let AccessSpec::IdentityProvider(provider) = spec
                && let Some((place, other)) = self
                    .issuers
                    .get(&provider.issuer)
                    .or_else(|| this_file.issuers.get(&provider.issuer))
            {
                clashes.push(FieldError::new(
                    format!("{at}.issuer"),
                    format!(
                        "identity provider {other:?} of {} has this issuer already",
                        where_(place)
                    ),
                ));
            }
            this_file.take_one(file, at, spec);
        }
        clashes
    }

    fn take(&mut self, file: &str, records: &[(String, AccessSpec)]) {
        for (at, spec) in records {
            self.take_one(file, at, spec);
        }
    }

    fn take_one(&mut self, file: &str, at: &str, spec: &AccessSpec) {
        let place = Place {
            file: file.to_owned(),
            at: at.to_owned(),
        };
        if let AccessSpec::IdentityProvider(provider) = spec {
            self.issuers
                .entry(provider.issuer.clone())
                .or_insert_with(|| (place.clone(), provider.name.clone()));
        }
        self.records
            .entry((spec.kind(), spec.name().to_owned()))
            .or_insert(place);
    }
}
