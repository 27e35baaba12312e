//! The fleet as an MCP sub-registry (docs/reference.md §13.8): the
//! official MCP Registry's read API v0.1 — `GET /v0.1/servers`,
//! `/v0.1/servers/{name}/versions` and `…/versions/{version}` — over the
//! in-memory head, so IDEs and other registries discover the organisation's
//! approved servers in the format they already read.
//!
//! One entry per enabled record, named `<namespace>/<server_id>`, whose one
//! remote is the worker gateway's endpoint of the record
//! (`{worker_url}/mcp/{server_id}`): a client reaches the server through
//! the fleet, never directly. A record has one version, `1.0.<revision>`,
//! which grows with every change of it, so `latest` is always that one.
//!
//! Entries are served in name order; a page's cursor is the name of its
//! last entry, so paging is stable while records are written between pages
//! (a record created behind the cursor is simply not on later pages).

use std::ops::Bound;
use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::routing::get;
use chrono::{DateTime, SecondsFormat, Utc};
use quiver_model::StoredServer;
use quiver_model::token::bearer;
use serde_json::{Value, json};

use crate::error::RegistryError;
use crate::head::HeadView;
use crate::rest::{Params, http_identity};
use crate::state::RegistryState;

/// The default namespace of entry names ([`CatalogOptions::namespace`]).
pub const DEFAULT_NAMESPACE: &str = "local.quiver";

/// The fleet as an MCP sub-registry (docs/reference.md §13.8).
#[derive(Debug, Clone)]
pub struct CatalogOptions {
    /// The reverse-DNS namespace of entry names (`<namespace>/<server_id>`).
    pub namespace: String,
    /// The workers' public URL the entries' remotes point under
    /// (`{worker_url}/mcp/{server_id}`); `None`: the catalog answers 503.
    pub worker_url: Option<String>,
    /// Serve the catalog without credentials.
    pub anonymous: bool,
}

impl Default for CatalogOptions {
    fn default() -> Self {
        CatalogOptions {
            namespace: DEFAULT_NAMESPACE.to_owned(),
            worker_url: None,
            anonymous: false,
        }
    }
}

/// The `server.json` schema the entries follow: the one frozen with API
/// v0.1.
pub const SCHEMA_URL: &str =
    "https://static.modelcontextprotocol.io/schemas/2025-10-17/server.schema.json";

/// Entries of a page unless `limit` says otherwise (the official default).
pub const DEFAULT_LIMIT: usize = 30;

/// The largest `limit`.
pub const MAX_LIMIT: usize = 100;

/// The `_meta` key of what the registry (rather than the publisher) says of
/// an entry.
const OFFICIAL_META: &str = "io.modelcontextprotocol.registry/official";

/// The schema's bounds of `description` and `title`, in characters.
const MAX_TEXT_CHARS: usize = 100;

/// The schema's bound of `name`, in characters; the longest server id
/// (64) and the slash leave the rest to the namespace.
const MAX_NAME_CHARS: usize = 200;
const MAX_NAMESPACE_CHARS: usize = MAX_NAME_CHARS - 1 - 64;

/// The record label whose value is an entry's description.
pub const DESCRIPTION_LABEL: &str = "description";

/// The catalog's settings, checked: a reverse-DNS namespace and the worker
/// URL without a trailing slash.
#[derive(Debug, Clone)]
pub struct Catalog {
    namespace: String,
    worker_url: Option<String>,
    anonymous: bool,
}

impl Catalog {
    /// Checks `options`; errors name the setting (`catalog.namespace`,
    /// `catalog.worker_url`), so the registry refuses to start with them.
    pub fn new(options: &CatalogOptions) -> Result<Catalog, RegistryError> {
        check_namespace(&options.namespace)?;
        let worker_url = options
            .worker_url
            .as_deref()
            .map(check_worker_url)
            .transpose()?;
        Ok(Catalog {
            namespace: options.namespace.clone(),
            worker_url,
            anonymous: options.anonymous,
        })
    }

    /// The entry name of a server id.
    fn name_of(&self, server_id: &str) -> String {
        format!("{}/{server_id}", self.namespace)
    }

    /// The server id an entry name names, if it is in this namespace.
    fn server_id_of<'a>(&self, name: &'a str) -> Option<&'a str> {
        name.strip_prefix(self.namespace.as_str())?
            .strip_prefix('/')
    }
}

/// Reverse-DNS: dot-separated labels of letters, digits and hyphens (the
/// official name pattern's namespace part), at least two of them, none
/// empty or starting or ending with a hyphen.
fn check_namespace(namespace: &str) -> Result<(), RegistryError> {
    let refuse = |why: &str| {
        RegistryError::invalid(
            "catalog.namespace",
            format!(
                "{namespace:?} is not a reverse-DNS namespace like {DEFAULT_NAMESPACE:?}: {why}"
            ),
        )
    };
    if namespace.len() > MAX_NAMESPACE_CHARS {
        return Err(refuse(&format!(
            "it is longer than {MAX_NAMESPACE_CHARS} characters"
        )));
    }
    let labels: Vec<&str> = namespace.split('.').collect();
    if labels.len() < 2 {
        return Err(refuse("it needs at least two dot-separated labels"));
    }
    for label in labels {
        if label.is_empty() || label.starts_with('-') || label.ends_with('-') {
            return Err(refuse("a label is empty or starts or ends with a hyphen"));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err(refuse("labels hold only letters, digits and hyphens"));
        }
    }
    Ok(())
}

/// An `http://` or `https://` URL without query or fragment; returned
/// without its trailing slash so `/mcp/{id}` can be appended.
fn check_worker_url(text: &str) -> Result<String, RegistryError> {
    let refuse = |why: &str| {
        RegistryError::invalid(
            "catalog.worker_url",
            format!("{text:?} is not the workers' public URL: {why}"),
        )
    };
    let url = url::Url::parse(text).map_err(|err| refuse(&err.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(refuse("it must be an http:// or https:// URL"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(refuse("it must not have a query or fragment"));
    }
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

/// What the handlers share.
struct App {
    state: RegistryState,
    catalog: Catalog,
}

/// The catalog's routes, to be merged at the root of the HTTP listener.
pub fn router(state: RegistryState, options: &CatalogOptions) -> Result<Router, RegistryError> {
    let app = Arc::new(App {
        state,
        catalog: Catalog::new(options)?,
    });
    Ok(Router::new()
        .route("/v0.1/servers", get(list))
        .route("/v0.1/servers/{name}/versions", get(versions))
        .route("/v0.1/servers/{name}/versions/{version}", get(version))
        .with_state(app))
}

/// Lets a request through when it may read the catalog: with the
/// anonymous setting anyone; else any registry credential (a role token,
/// an API key with roles, a person's JWT or session) or a caller
/// credential (an API key without roles, which is a worker caller only).
struct Reader;

impl FromRequestParts<Arc<App>> for Reader {
    type Rejection = RegistryError;

    async fn from_request_parts(
        parts: &mut Parts,
        app: &Arc<App>,
    ) -> Result<Self, Self::Rejection> {
        if app.catalog.anonymous {
            return Ok(Reader);
        }
        match http_identity(parts, &app.state).await {
            Ok(_) => Ok(Reader),
            Err(RegistryError::Unauthenticated) => {
                let authorization = parts
                    .headers
                    .get(axum::http::header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok());
                let head = app.state.feed.current_head();
                match bearer(authorization) {
                    Some(token) if crate::access::live_key(&head, token).is_some() => Ok(Reader),
                    _ => Err(RegistryError::Unauthenticated),
                }
            }
            Err(other) => Err(other),
        }
    }
}

/// One entry: a record as the official registry shows a server.
struct Entry<'a> {
    record: &'a StoredServer,
    name: String,
    title: Option<String>,
    description: String,
    version: String,
}

impl<'a> Entry<'a> {
    fn of(catalog: &Catalog, record: &'a StoredServer) -> Entry<'a> {
        let spec = &record.spec;
        let title = spec
            .display_name
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(|t| cut(t, MAX_TEXT_CHARS));
        let description = spec
            .labels
            .get(DESCRIPTION_LABEL)
            .map(|d| d.trim())
            .filter(|d| !d.is_empty())
            .map_or_else(
                || format!("MCP server {} via the Quiver gateway", spec.server_id),
                |d| cut(d, MAX_TEXT_CHARS),
            );
        Entry {
            record,
            name: catalog.name_of(&spec.server_id),
            title,
            description,
            version: version_of(record),
        }
    }

    /// Whether `needle` (lowercase) is in the name, title or description,
    /// case-insensitively.
    fn matches(&self, needle: &str) -> bool {
        [
            Some(self.name.as_str()),
            self.title.as_deref(),
            Some(self.description.as_str()),
        ]
        .into_iter()
        .flatten()
        .any(|text| text.to_lowercase().contains(needle))
    }

    /// `{server, _meta}`, the official `ServerResponse`.
    fn to_json(&self, worker_url: &str) -> Value {
        let mut server = json!({
            "$schema": SCHEMA_URL,
            "name": self.name,
            "description": self.description,
            "version": self.version,
            "remotes": [{
                "type": "streamable-http",
                "url": format!("{worker_url}/mcp/{}", self.record.spec.server_id),
                // The gateway serves callers only: an importer learns it
                // must supply a caller credential of this fleet.
                "headers": [{
                    "name": "Authorization",
                    "description": "Bearer followed by a caller credential of this fleet (an API key or a token of its identity provider)",
                    "isRequired": true,
                    "isSecret": true,
                }],
            }],
        });
        if let Some(title) = &self.title {
            server["title"] = json!(title);
        }
        json!({
            "server": server,
            "_meta": {
                OFFICIAL_META: {
                    "status": "active",
                    "publishedAt": timestamp(self.record.created_at),
                    "updatedAt": timestamp(self.record.updated_at),
                    "isLatest": true,
                }
            }
        })
    }
}

/// `1.0.<revision>`: semver, and greater after every change of the record.
fn version_of(record: &StoredServer) -> String {
    format!("1.0.{}", record.revision)
}

/// RFC 3339 in UTC at full precision, so an `updatedAt` given back as
/// `updated_since` excludes that very change.
fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// The first `max` characters of `text`.
fn cut(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

/// The query of `GET /v0.1/servers`, checked.
struct ListQuery {
    /// The server id after which the page starts.
    after: Option<String>,
    limit: usize,
    /// Lowercase.
    search: Option<String>,
    updated_since: Option<DateTime<Utc>>,
    /// An exact version to keep (`latest` keeps every entry: each has one).
    version: Option<String>,
}

impl ListQuery {
    fn parse(catalog: &Catalog, params: &Params) -> Result<ListQuery, RegistryError> {
        let get = |name: &str| params.0.get(name).map(String::as_str);
        let after = get("cursor")
            .filter(|c| !c.is_empty())
            .map(|cursor| {
                catalog
                    .server_id_of(cursor)
                    .map(str::to_owned)
                    .ok_or_else(|| {
                        RegistryError::invalid(
                            "cursor",
                            format!("{cursor:?} is not a cursor this registry returned"),
                        )
                    })
            })
            .transpose()?;
        let limit = match get("limit") {
            None => DEFAULT_LIMIT,
            Some(text) => text
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_LIMIT).contains(n))
                .ok_or_else(|| {
                    RegistryError::invalid(
                        "limit",
                        format!("{text:?} is not a number from 1 to {MAX_LIMIT}"),
                    )
                })?,
        };
        let updated_since = get("updated_since")
            .map(|text| {
                DateTime::parse_from_rfc3339(text)
                    .map(|at| at.with_timezone(&Utc))
                    .map_err(|err| {
                        RegistryError::invalid(
                            "updated_since",
                            format!("{text:?} is not an RFC 3339 date-time: {err}"),
                        )
                    })
            })
            .transpose()?;
        Ok(ListQuery {
            after,
            limit,
            search: get("search")
                .filter(|s| !s.is_empty())
                .map(str::to_lowercase),
            updated_since,
            version: get("version")
                .filter(|v| !v.is_empty() && *v != "latest")
                .map(str::to_owned),
        })
    }

    fn keeps(&self, entry: &Entry<'_>) -> bool {
        self.search.as_deref().is_none_or(|s| entry.matches(s))
            && self
                .updated_since
                .is_none_or(|since| entry.record.updated_at > since)
            && self.version.as_deref().is_none_or(|v| entry.version == v)
    }
}

/// The worker URL remotes point under; without one the catalog has no
/// endpoint to offer.
fn worker_url(catalog: &Catalog) -> Result<&str, RegistryError> {
    catalog.worker_url.as_deref().ok_or_else(|| {
        RegistryError::Unavailable(
            "the catalog has no worker URL to point its remotes at: start the registry with --catalog-worker-url (QUIVER_CATALOG_WORKER_URL, catalog.worker_url)".into(),
        )
    })
}

/// `GET /v0.1/servers`: a page of entries in name order.
async fn list(
    _: Reader,
    State(app): State<Arc<App>>,
    params: Params,
) -> Result<axum::Json<Value>, RegistryError> {
    let catalog = &app.catalog;
    let query = ListQuery::parse(catalog, &params)?;
    let worker_url = worker_url(catalog)?;
    let head = app.state.feed.head().await?;
    let start = query
        .after
        .as_ref()
        .map_or(Bound::Unbounded, |id| Bound::Excluded(id.clone()));
    let mut page = head
        .servers
        .range::<String, _>((start, Bound::Unbounded))
        .map(|(_, record)| record)
        .filter(|record| record.spec.enabled)
        .map(|record| Entry::of(catalog, record))
        .filter(|entry| query.keeps(entry));
    let servers: Vec<Entry<'_>> = page.by_ref().take(query.limit).collect();
    let mut metadata = json!({"count": servers.len()});
    if page.next().is_some()
        && let Some(last) = servers.last()
    {
        metadata["nextCursor"] = json!(last.name);
    }
    Ok(axum::Json(json!({
        "servers": servers.iter().map(|e| e.to_json(worker_url)).collect::<Vec<_>>(),
        "metadata": metadata,
    })))
}

/// The enabled record an entry name names.
fn find<'h>(
    catalog: &Catalog,
    head: &'h HeadView,
    name: &str,
) -> Result<&'h StoredServer, RegistryError> {
    catalog
        .server_id_of(name)
        .and_then(|id| head.servers.get(id))
        .map(Arc::as_ref)
        .filter(|record| record.spec.enabled)
        .ok_or_else(|| RegistryError::NotFound(format!("no server named {name:?}")))
}

/// `GET /v0.1/servers/{name}/versions`: the one version of an entry.
async fn versions(
    _: Reader,
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
) -> Result<axum::Json<Value>, RegistryError> {
    let worker_url = worker_url(&app.catalog)?;
    let head = app.state.feed.head().await?;
    let entry = Entry::of(&app.catalog, find(&app.catalog, &head, &name)?);
    Ok(axum::Json(json!({
        "servers": [entry.to_json(worker_url)],
        "metadata": {"count": 1},
    })))
}

/// `GET /v0.1/servers/{name}/versions/{version}`: `latest` or the exact
/// version.
async fn version(
    _: Reader,
    State(app): State<Arc<App>>,
    Path((name, version)): Path<(String, String)>,
) -> Result<axum::Json<Value>, RegistryError> {
    let worker_url = worker_url(&app.catalog)?;
    let head = app.state.feed.head().await?;
    let entry = Entry::of(&app.catalog, find(&app.catalog, &head, &name)?);
    if version != "latest" && version != entry.version {
        return Err(RegistryError::NotFound(format!(
            "server {name:?} has no version {version:?}; its one version is {:?} (also \"latest\")",
            entry.version
        )));
    }
    Ok(axum::Json(entry.to_json(worker_url)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(namespace: &str, worker_url: Option<&str>) -> CatalogOptions {
        CatalogOptions {
            namespace: namespace.into(),
            worker_url: worker_url.map(str::to_owned),
            anonymous: false,
        }
    }

    #[test]
    fn namespaces_must_be_reverse_dns() {
        for good in [DEFAULT_NAMESPACE, "com.example", "io.github.some-org"] {
            assert!(Catalog::new(&options(good, None)).is_ok(), "{good}");
        }
        for bad in [
            "quiver",
            "com..example",
            ".com",
            "com.-x",
            "com.ex_ample",
            "com/x",
            "",
        ] {
            let err = Catalog::new(&options(bad, None)).unwrap_err();
            assert!(
                matches!(&err, RegistryError::InvalidArgument { field: Some(f), .. } if f == "catalog.namespace"),
                "{bad}: {err}"
            );
        }
        let long = format!("a.{}", "b".repeat(MAX_NAMESPACE_CHARS));
        assert!(Catalog::new(&options(&long, None)).is_err());
    }

    #[test]
    fn worker_urls_lose_their_trailing_slash() {
        let catalog =
            Catalog::new(&options("com.example", Some("https://mcp.example.com/"))).unwrap();
        assert_eq!(
            catalog.worker_url.as_deref(),
            Some("https://mcp.example.com")
        );
        for bad in ["mcp.example.com", "ftp://x", "http://x/?a=1"] {
            let err = Catalog::new(&options("com.example", Some(bad))).unwrap_err();
            assert!(
                matches!(&err, RegistryError::InvalidArgument { field: Some(f), .. } if f == "catalog.worker_url"),
                "{bad}: {err}"
            );
        }
    }
}
