//! The web admin (docs/reference.md §5, R-UI-1…6): the static files of `web-admin/`,
//! embedded in the binary at compile time and served under `/admin`.
//!
//! The files are plain HTML, CSS and JavaScript modules (no build step, no
//! CDN). `/admin`, `/admin/` and deep links such as `/admin/servers/x` serve
//! `index.html` (the page routes on the client); a path whose last segment
//! has an extension is a file and is 404 when unknown; `/admin/api/…` paths
//! that reach this router match no API route and get the API's JSON 404.
//! Every answer carries an `ETag` (revalidated with `If-None-Match`) and
//! `Cache-Control: no-cache`, so a new binary's files are picked up at once.

use std::sync::LazyLock;

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::error::RegistryError;

/// One embedded file of `web-admin/`.
struct Asset {
    /// Path below `web-admin/` (and below `/admin/` in URLs).
    path: &'static str,
    /// The file's bytes.
    body: &'static [u8],
}

/// `Asset` for `web-admin/<path>`, read at compile time.
macro_rules! asset {
    ($path:literal) => {
        Asset {
            path: $path,
            body: include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../web-admin/",
                $path
            )),
        }
    };
}

/// Every file of `web-admin/` (a unit test checks the list is complete).
const ASSETS: &[Asset] = &[
    asset!("index.html"),
    asset!("app.css"),
    asset!("favicon.svg"),
    asset!("js/api.js"),
    asset!("js/app.js"),
    asset!("js/access.js"),
    asset!("js/approvals.js"),
    asset!("js/diff.js"),
    asset!("js/dom.js"),
    asset!("js/form.js"),
    asset!("js/history.js"),
    asset!("js/importer.js"),
    asset!("js/oauth.js"),
    asset!("js/record.js"),
    asset!("js/servers.js"),
    asset!("js/status.js"),
    asset!("js/usage.js"),
    asset!("js/workers.js"),
    asset!("vendor/uplot/LICENSE.txt"),
    asset!("vendor/uplot/README.md"),
    asset!("vendor/uplot/uPlot.iife.min.js"),
    asset!("vendor/uplot/uPlot.min.css"),
];

/// The page every client-side route is served.
const INDEX: &str = "index.html";

/// Content security policy of the pages: everything from this origin only.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The `Content-Type` of a file name, by extension.
fn content_type(path: &str) -> Option<&'static str> {
    let (_, extension) = path.rsplit_once('.')?;
    Some(match extension {
        "html" => "text/html; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "json" => "application/json",
        "txt" => "text/plain; charset=utf-8",
        "md" => "text/markdown; charset=utf-8",
        _ => return None,
    })
}

/// A strong validator per asset (FNV-1a of the bytes), in [`ASSETS`] order.
static ETAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|asset| {
            let hash = asset.body.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
            });
            format!("\"{hash:016x}\"")
        })
        .collect()
});

/// What a path below `/admin/` resolves to.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    /// The embedded file with this index in [`ASSETS`].
    Asset(usize),
    /// No such file.
    NotFound,
    /// Under `api/` but no API route matched.
    UnknownApi,
}

/// Resolves `path` (below `/admin/`, without the leading slash).
fn resolve(path: &str) -> Target {
    if path == "api" || path.starts_with("api/") {
        return Target::UnknownApi;
    }
    let path = if path.is_empty() { INDEX } else { path };
    if let Some(index) = ASSETS.iter().position(|asset| asset.path == path) {
        return Target::Asset(index);
    }
    let last = path.rsplit('/').next().unwrap_or_default();
    if last.contains('.') {
        // A file name: a missing file, not a page.
        Target::NotFound
    } else {
        // A client-side route (deep link): the page decides.
        ASSETS
            .iter()
            .position(|asset| asset.path == INDEX)
            .map_or(Target::NotFound, Target::Asset)
    }
}

/// Routes of the web admin: `/admin`, `/admin/` and `/admin/{*path}`. Merge
/// it next to the API nested at `/admin/api` (the API's routes take
/// precedence, being more specific).
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/admin", get(root))
        .route("/admin/", get(root))
        .route("/admin/{*path}", get(file).fallback(other_method))
}

/// Any method but GET on a path below `/admin/`: the API's JSON 404 for an
/// unknown API route (this route matches those paths before the API's own
/// fallback can), else 405 (pages and files are only read).
async fn other_method(Path(path): Path<String>) -> Response {
    match resolve(&path) {
        Target::UnknownApi => {
            RegistryError::NotFound(format!("no admin API route /admin/{path}")).into_response()
        }
        Target::Asset(_) | Target::NotFound => StatusCode::METHOD_NOT_ALLOWED.into_response(),
    }
}

async fn root(headers: HeaderMap) -> Response {
    serve("", &headers)
}

async fn file(Path(path): Path<String>, headers: HeaderMap) -> Response {
    serve(&path, &headers)
}

fn serve(path: &str, headers: &HeaderMap) -> Response {
    let index = match resolve(path) {
        Target::Asset(index) => index,
        Target::NotFound => {
            return (StatusCode::NOT_FOUND, "no such file in the web admin").into_response();
        }
        Target::UnknownApi => {
            return RegistryError::NotFound(format!("no admin API route /admin/{path}"))
                .into_response();
        }
    };
    let Some(asset) = ASSETS.get(index) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let etag = ETAGS.get(index).map_or("", String::as_str);
    let not_modified = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.split(',').any(|tag| tag.trim() == etag));
    let mut response = if not_modified {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        asset.body.into_response()
    };
    let content_type = content_type(asset.path).unwrap_or("application/octet-stream");
    let response_headers = response.headers_mut();
    response_headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response_headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(value) = HeaderValue::from_str(etag) {
        response_headers.insert(header::ETAG, value);
    }
    response_headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response_headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if asset.path.ends_with(".html") {
        response_headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        );
        response_headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    }
    response
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    use super::*;

    fn files_below(dir: &Path, prefix: &str, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).expect("read web-admin") {
            let entry = entry.expect("dir entry");
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = format!("{prefix}{name}");
            if entry.file_type().expect("file type").is_dir() {
                files_below(&entry.path(), &format!("{path}/"), out);
            } else {
                out.insert(path);
            }
        }
    }

    #[test]
    fn every_file_of_web_admin_is_embedded_with_a_content_type() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../web-admin");
        let mut on_disk = BTreeSet::new();
        files_below(&dir, "", &mut on_disk);
        let embedded: BTreeSet<String> = ASSETS.iter().map(|a| a.path.to_owned()).collect();
        assert_eq!(
            embedded, on_disk,
            "ASSETS in web.rs must list exactly the files of web-admin/"
        );
        for asset in ASSETS {
            assert!(
                content_type(asset.path).is_some(),
                "{}: no content type",
                asset.path
            );
            assert!(!asset.body.is_empty(), "{} is empty", asset.path);
        }
    }

    #[test]
    fn paths_resolve_to_files_pages_or_not_found() {
        let index = ASSETS.iter().position(|a| a.path == INDEX).unwrap();
        let css = ASSETS.iter().position(|a| a.path == "app.css").unwrap();
        assert_eq!(resolve(""), Target::Asset(index));
        assert_eq!(resolve("index.html"), Target::Asset(index));
        assert_eq!(resolve("app.css"), Target::Asset(css));
        assert_eq!(resolve("servers/github"), Target::Asset(index));
        assert_eq!(resolve("servers/github/history"), Target::Asset(index));
        assert_eq!(resolve("workers"), Target::Asset(index));
        assert_eq!(resolve("js/missing.js"), Target::NotFound);
        assert_eq!(resolve("../Cargo.toml"), Target::NotFound);
        assert_eq!(resolve("api"), Target::UnknownApi);
        assert_eq!(resolve("api/nope"), Target::UnknownApi);
        assert_eq!(
            content_type("js/app.js"),
            Some("text/javascript; charset=utf-8")
        );
        assert_eq!(content_type("index.html"), Some("text/html; charset=utf-8"));
    }

    #[test]
    fn etags_differ_per_content() {
        let tags: BTreeSet<&String> = ETAGS.iter().collect();
        assert_eq!(tags.len(), ASSETS.len());
    }
}
