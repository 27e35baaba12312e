//! Rules about the repository itself that a reviewer would otherwise check by
//! hand (issue #11): citations resolve to documents in the repository, each
//! error code of the worker's table is spelled once in product code, and the
//! product binary does not link test support.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root (this test belongs to `crates/quiver`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

/// Files git tracks plus the untracked ones it does not ignore, as text.
fn repo_files() -> Vec<(String, String)> {
    let output = Command::new("git")
        .args([
            "ls-files",
            "--cached",
            "--others",
            "--exclude-standard",
            "-z",
        ])
        .current_dir(root())
        .output()
        .expect("git ls-files");
    assert!(output.status.success(), "git ls-files failed");
    String::from_utf8_lossy(&output.stdout)
        .split('\0')
        .filter(|path| !path.is_empty())
        .filter_map(|path| {
            let text = std::fs::read_to_string(root().join(path)).ok()?;
            Some((path.to_owned(), text))
        })
        .collect()
}

/// Where citations may appear: code, protocol, configuration and our docs.
fn is_citing_file(path: &str) -> bool {
    const EXTENSIONS: &[&str] = &[
        ".rs", ".proto", ".js", ".mjs", ".html", ".css", ".toml", ".md", ".sh", ".py", ".sql",
        ".yaml", ".yml",
    ];
    !path.contains("node_modules/")
        && path != "Cargo.lock"
        && EXTENSIONS.iter().any(|ext| path.ends_with(ext))
}

/// `R-AREA-N` identifiers in `text`.
fn requirement_ids(text: &str) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let mut ids = BTreeSet::new();
    let mut at = 0;
    while let Some(found) = text[at..].find("R-") {
        let start = at + found;
        at = start + 2;
        if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'-') {
            continue;
        }
        let area_end = at
            + text[at..]
                .bytes()
                .take_while(u8::is_ascii_uppercase)
                .count();
        if area_end == at || bytes.get(area_end) != Some(&b'-') {
            continue;
        }
        let digits = text[area_end + 1..]
            .bytes()
            .take_while(u8::is_ascii_digit)
            .count();
        if digits > 0 {
            ids.insert(text[start..area_end + 1 + digits].to_owned());
        }
    }
    ids
}

#[test]
fn citations_resolve_to_documents_in_the_repository() {
    let files = repo_files();
    let reference = files
        .iter()
        .find(|(path, _)| path == "docs/reference.md")
        .map(|(_, text)| text.as_str())
        .expect("docs/reference.md exists");
    let defined = requirement_ids(reference);
    // Spelled in pieces so that this file does not match itself.
    let spec = concat!("SP", "EC");
    let cites_spec = [
        format!("{spec} §"),
        format!("{spec} R-"),
        format!("{spec}.md"),
    ];
    let mut problems = Vec::new();
    for (path, text) in files.iter().filter(|(path, _)| is_citing_file(path)) {
        for (number, line) in text.lines().enumerate() {
            // The specification lives outside the repository: a citation of
            // it cannot be followed by a maintainer.
            if cites_spec
                .iter()
                .any(|citation| line.contains(citation.as_str()))
            {
                problems.push(format!(
                    "{path}:{}: cites the specification: {}",
                    number + 1,
                    line.trim()
                ));
            }
            for id in requirement_ids(line) {
                if !defined.contains(&id) {
                    problems.push(format!(
                        "{path}:{}: {id} is not defined in docs/reference.md",
                        number + 1
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Product code of a Rust file: everything before its unit-test module.
fn product_part(text: &str) -> &str {
    text.find("#[cfg(test)]").map_or(text, |at| &text[..at])
}

#[test]
fn each_error_code_is_spelled_once_in_product_code() {
    const CODES: &[&str] = &[
        "mcp_unavailable",
        "mcp_timeout",
        "mcp_invalid_arguments",
        "mcp_policy_denied",
        "mcp_output_too_large",
        "mcp_approval_required",
        "mcp_tool_error",
        "mcp_budget_exceeded",
    ];
    let mut places: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (path, text) in repo_files() {
        let product = path.starts_with("crates/")
            && path.contains("/src/")
            && path.ends_with(".rs")
            && !path.starts_with("crates/quiver-testkit/");
        if !product {
            continue;
        }
        for code in CODES {
            let quoted = format!("\"{code}\"");
            let count = product_part(&text).matches(&quoted).count();
            places
                .entry(code)
                .or_default()
                .extend(std::iter::repeat_n(path.clone(), count));
        }
    }
    let wrong: Vec<String> = CODES
        .iter()
        .map(|code| (code, places.get(code).cloned().unwrap_or_default()))
        .filter(|(_, at)| at.len() != 1)
        .map(|(code, at)| format!("{code}: {} places {at:?}", at.len()))
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_product_binary_does_not_link_test_support() {
    let output = Command::new(env!("CARGO"))
        .args([
            "tree",
            "-p",
            "quiver",
            "-e",
            "normal",
            "--offline",
            "--prefix",
            "none",
        ])
        .current_dir(root())
        .output()
        .expect("cargo tree");
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let tree = String::from_utf8_lossy(&output.stdout);
    assert!(tree.lines().any(|line| line.starts_with("quiver-worker ")));
    assert!(
        !tree.lines().any(|line| line.starts_with("quiver-testkit ")),
        "the quiver binary links quiver-testkit:\n{tree}"
    );
}
