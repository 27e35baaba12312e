//! Reading the files of a bootstrap directory (R-BOOT-2…4): the walk every
//! directory shares ([`read_dir`]) and the `mcp.d` records ([`scan`]).

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::fmt;
use std::fs::{self, File, Metadata};
use std::io::{self, Read};
use std::path::Path;

use quiver_model::{FieldError, Format, McpServerSpec, ModelError, Strictness, parse_document};

use crate::BootstrapError;

/// A record declared by a file and chosen for its `server_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRecord {
    /// The declaring file's name (not its path): the record's `file:<name>` source.
    pub file: String,
    /// The declared record.
    pub spec: McpServerSpec,
}

/// A file that could not be loaded, with the fields at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileError {
    /// The file's name.
    pub file: String,
    /// What is wrong; names the fields when the content is at fault.
    pub message: String,
    /// Dotted paths of the fields at fault (empty for syntax and read errors).
    pub fields: Vec<String>,
}

impl FileError {
    pub(crate) fn new(file: &str, message: impl Into<String>) -> Self {
        FileError {
            file: file.to_owned(),
            message: message.into(),
            fields: Vec::new(),
        }
    }

    pub(crate) fn from_model(file: &str, err: &ModelError) -> Self {
        let field_errors = err.field_errors();
        if field_errors.is_empty() {
            return FileError::new(file, err.to_string());
        }
        FileError::from_fields(file, field_errors)
    }

    /// An error about the fields of `file`; `field_errors` is not empty.
    pub(crate) fn from_fields(file: &str, field_errors: &[FieldError]) -> Self {
        let message = field_errors
            .iter()
            .map(|e| {
                if e.field.is_empty() {
                    e.message.clone()
                } else {
                    format!("{}: {}", e.field, e.message)
                }
            })
            .collect::<Vec<_>>()
            .join("; ");
        FileError {
            file: file.to_owned(),
            message,
            fields: field_errors
                .iter()
                .filter(|e| !e.field.is_empty())
                .map(|e| e.field.clone())
                .collect(),
        }
    }
}

impl FileError {
    /// The error with the file's path in `dir` (`policies.d/10-teams.toml:
    /// policies.team-a.tool_denylist[0]: …`), for messages read away from
    /// the directory's context (start-up failures, `--dry-run`).
    pub fn display_in(&self, dir: &Path) -> String {
        format!("{}: {}", dir.join(&self.file).display(), self.message)
    }
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.file, self.message)
    }
}

/// What a directory declares: `mcp.d` records ([`FileRecord`], the
/// default) or `policies.d` records ([`crate::policies::AccessFileRecord`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scan<R = FileRecord> {
    /// The chosen record of every declared key, ordered by key.
    pub records: Vec<R>,
    /// Names of the valid files read, in file-name order (including files
    /// whose records were all overridden by later files).
    pub files: Vec<String>,
    /// Files present but invalid (lenient mode only; strict mode fails
    /// instead), in file-name order.
    pub errors: Vec<FileError>,
    /// Things an operator should know about: overrides, ignored unknown
    /// fields, symlinks skipped. Each names its file.
    pub warnings: Vec<String>,
}

impl<R> Default for Scan<R> {
    fn default() -> Self {
        Scan {
            records: Vec::new(),
            files: Vec::new(),
            errors: Vec::new(),
            warnings: Vec::new(),
        }
    }
}

impl<R> Scan<R> {
    /// Whether `file` was read and is valid.
    pub fn is_valid_file(&self, file: &str) -> bool {
        self.files.iter().any(|f| f == file)
    }

    /// Whether `file` is present but invalid.
    pub fn is_invalid_file(&self, file: &str) -> bool {
        self.errors.iter().any(|e| e.file == file)
    }

    /// The scan as the mode wants it: in strict mode any invalid file fails
    /// it ([`BootstrapError::Invalid`]). Errors end up in file-name order
    /// whichever step found them.
    pub(crate) fn finish(
        mut self,
        dir: &Path,
        strictness: Strictness,
    ) -> Result<Self, BootstrapError> {
        self.errors.sort_by(|a, b| a.file.cmp(&b.file));
        if strictness == Strictness::Strict && !self.errors.is_empty() {
            return Err(BootstrapError::Invalid {
                dir: dir.to_owned(),
                errors: self.errors,
            });
        }
        Ok(self)
    }
}

impl Scan<FileRecord> {
    /// The record declared for `server_id`, if any.
    pub fn record(&self, server_id: &str) -> Option<&FileRecord> {
        self.records.iter().find(|r| r.spec.server_id == server_id)
    }
}

/// A file of a bootstrap directory worth parsing, read.
pub(crate) struct DirFile {
    /// Its name, the records' `file:<name>` source.
    pub name: String,
    /// Its syntax, by extension.
    pub format: Format,
    /// Its content.
    pub text: String,
}

/// Reads every record file directly inside `dir` (see the crate docs for
/// which files count), in byte order of their names. Files skipped for the
/// operator's attention become warnings of `found`, unreadable ones errors.
pub(crate) fn read_dir<R>(dir: &Path, found: &mut Scan<R>) -> Result<Vec<DirFile>, BootstrapError> {
    let io_error = |source| BootstrapError::Io {
        path: dir.to_owned(),
        source,
    };
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_error)? {
        let entry = entry.map_err(io_error)?;
        match entry.file_name().into_string() {
            Ok(name) => names.push(name),
            Err(raw) => {
                // The name could not be recorded as a `file:<name>` source faithfully.
                let lossy = raw.to_string_lossy().into_owned();
                if candidate_format(&lossy).is_some() {
                    found.warnings.push(format!(
                        "{lossy}: file name is not valid utf-8; file skipped"
                    ));
                }
            }
        }
    }
    // `String` orders by bytes, which is the documented precedence order.
    names.sort();

    let mut files = Vec::new();
    for name in names {
        let Some(format) = candidate_format(&name) else {
            continue;
        };
        match read_candidate(&dir.join(&name)) {
            Candidate::Text(text) => files.push(DirFile { name, format, text }),
            Candidate::Skipped(reason) => {
                found
                    .warnings
                    .push(format!("{name}: {reason}; file skipped"));
            }
            Candidate::Ignored(reason) => {
                tracing::debug!(dir = %dir.display(), file = %name, reason, "bootstrap entry ignored");
            }
            Candidate::Unreadable(message) => found.errors.push(FileError::new(&name, message)),
        }
    }
    Ok(files)
}

/// Reads the `mcp.d` records directly inside `dir` (see the crate docs for
/// which files count).
///
/// Lenient mode reports invalid files in [`Scan::errors`]; strict mode
/// returns [`BootstrapError::Invalid`] naming every invalid file.
pub fn scan(dir: &Path, strictness: Strictness) -> Result<Scan, BootstrapError> {
    let mut found = Scan::default();
    let mut declared: BTreeMap<String, FileRecord> = BTreeMap::new();
    for DirFile { name, format, text } in read_dir(dir, &mut found)? {
        let parsed = match parse_document(&text, format, strictness) {
            Ok(parsed) => parsed,
            Err(err) => {
                found.errors.push(FileError::from_model(&name, &err));
                continue;
            }
        };
        if let Some(error) = duplicate_ids(&name, parsed.iter().map(|p| &p.spec)) {
            found.errors.push(error);
            continue;
        }
        found.files.push(name.clone());
        for record in parsed {
            let server_id = record.spec.server_id.clone();
            for field in &record.ignored_fields {
                found.warnings.push(format!(
                    "{name}: unknown field \"{field}\" ignored (server_id \"{server_id}\")"
                ));
            }
            let file_record = FileRecord {
                file: name.clone(),
                spec: record.spec,
            };
            match declared.entry(server_id) {
                Entry::Vacant(slot) => {
                    slot.insert(file_record);
                }
                Entry::Occupied(mut slot) => {
                    found.warnings.push(format!(
                        "server_id \"{}\" in {name} overrides {}",
                        slot.key(),
                        slot.get().file
                    ));
                    slot.insert(file_record);
                }
            }
        }
    }
    found.records = declared.into_values().collect();
    found.finish(dir, strictness)
}

/// The format of a file worth reading, or `None` for everything else.
fn candidate_format(name: &str) -> Option<Format> {
    // Editor swap/backup files and half-written deployments must never load,
    // even when their name happens to end in a record extension.
    let leftover = name.starts_with('.')
        || name.ends_with('~')
        || name.ends_with(".swp")
        || name.ends_with(".tmp");
    if leftover {
        tracing::debug!(file = %name, "bootstrap entry ignored: hidden or temporary file");
        return None;
    }
    let format = Format::from_file_name(name);
    if format.is_none() {
        tracing::debug!(file = %name, "bootstrap entry ignored: not a .toml or .json file");
    }
    format
}

enum Candidate {
    Text(String),
    /// Not read, and the operator should hear about it.
    Skipped(&'static str),
    /// Not read, and that is expected (directories, files gone meanwhile).
    Ignored(&'static str),
    /// Present but unreadable: an invalid file.
    Unreadable(String),
}

fn read_candidate(path: &Path) -> Candidate {
    let unreadable = |err: io::Error| Candidate::Unreadable(format!("cannot read file: {err}"));
    let linked = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            return Candidate::Ignored("removed while scanning");
        }
        Err(err) => return unreadable(err),
    };
    let file_type = linked.file_type();
    if file_type.is_symlink() {
        return Candidate::Skipped("is a symlink and symlinks are never followed");
    }
    if file_type.is_dir() {
        return Candidate::Ignored("directory, scan is not recursive");
    }
    if !file_type.is_file() {
        // Opening a fifo or device could block the scan or read without end.
        return Candidate::Skipped("is not a regular file");
    }
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            return Candidate::Ignored("removed while scanning");
        }
        Err(err) => return unreadable(err),
    };
    match file.metadata() {
        Ok(opened) if same_file(&linked, &opened) => {}
        Ok(_) => {
            // Swapped for something else (maybe a symlink) after the check above.
            return Candidate::Skipped("was replaced while being read");
        }
        Err(err) => return unreadable(err),
    }
    let mut bytes = Vec::new();
    if let Err(err) = file.read_to_end(&mut bytes) {
        return unreadable(err);
    }
    match String::from_utf8(bytes) {
        Ok(text) => Candidate::Text(text),
        Err(_) => Candidate::Unreadable("file is not valid utf-8 text".to_owned()),
    }
}

#[cfg(unix)]
fn same_file(linked: &Metadata, opened: &Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    linked.dev() == opened.dev() && linked.ino() == opened.ino()
}

#[cfg(not(unix))]
fn same_file(_linked: &Metadata, opened: &Metadata) -> bool {
    opened.is_file()
}

/// One file declaring a `server_id` twice is ambiguous: reject the file.
fn duplicate_ids<'a>(
    file: &str,
    specs: impl Iterator<Item = &'a McpServerSpec>,
) -> Option<FileError> {
    let mut first_index: BTreeMap<&str, usize> = BTreeMap::new();
    let mut messages = Vec::new();
    let mut fields = Vec::new();
    for (i, spec) in specs.enumerate() {
        match first_index.entry(&spec.server_id) {
            Entry::Vacant(slot) => {
                slot.insert(i);
            }
            Entry::Occupied(slot) => {
                let field = format!("servers[{i}].server_id");
                messages.push(format!(
                    "{field}: server_id \"{}\" is already declared by servers[{}] in this file",
                    spec.server_id,
                    slot.get()
                ));
                fields.push(field);
            }
        }
    }
    if fields.is_empty() {
        None
    } else {
        Some(FileError {
            file: file.to_owned(),
            message: messages.join("; "),
            fields,
        })
    }
}
