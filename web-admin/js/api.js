// The registry's REST admin API (`/admin/api`). The credential is either a
// bearer token kept in sessionStorage (this tab only, gone when it closes), or
// the session cookie the registry sets when a person signs in with the
// organisation's identity provider (HttpOnly: this page never sees it).

/** URL path of the web admin, e.g. `/admin/` (this file is `/admin/js/api.js`). */
export const BASE = new URL('../', import.meta.url).pathname;
const API = `${BASE}api/`;
const TOKEN_KEY = 'quiver.admin.token';
/**
 * Sent with every request: the registry refuses a write authenticated by the
 * session cookie without it, and no cross-site form or link can add a header.
 */
const CSRF_HEADER = 'x-quiver-csrf';

/** The stored token, or `null`. */
export function getToken() {
  return sessionStorage.getItem(TOKEN_KEY);
}

/** Stores (or, with `null`, forgets) the token. */
export function setToken(token) {
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
}

/** A failed API call: HTTP status plus the `{"error": {...}}` body. */
export class ApiError extends Error {
  constructor(status, error, fallback) {
    super(error?.message || fallback || `HTTP ${status}`);
    this.status = status;
    this.code = error?.code ?? (status === 0 ? 'network' : `http_${status}`);
    this.field = error?.field ?? null;
    this.currentRevision = error?.current_revision ?? null;
    this.error = error ?? null;
  }

  /** Every field error: `[{field, message}]` (the message may list several). */
  fieldErrors() {
    const error = this.error ?? {};
    if (Array.isArray(error.fields) && error.fields.every((e) => e && typeof e.field === 'string')) {
      return error.fields.map((e) => ({ field: e.field, message: e.message ?? '' }));
    }
    if (!this.field) return [];
    // The registry joins several problems as `a: m1; b: m2` with the first
    // field in `field`.
    const parts = String(this.message).split('; ').map((part) => {
      const i = part.indexOf(': ');
      return i > 0 && /^[^\s]+$/.test(part.slice(0, i)) ? { field: part.slice(0, i), message: part.slice(i + 2) } : null;
    });
    if (parts.length && parts.every(Boolean) && parts.some((p) => p.field === this.field)) return parts;
    const prefix = `${this.field}: `;
    const message = this.message.startsWith(prefix) ? this.message.slice(prefix.length) : this.message;
    return [{ field: this.field, message }];
  }
}

/**
 * Calls `METHOD /admin/api/<path>`. `body` is sent as JSON unless `text` is
 * given (sent as is with `contentType`). Resolves with the parsed JSON.
 * `token` overrides the stored token (`null`: none, the session cookie
 * only); a 401 with the stored credential also fires
 * `quiver:unauthenticated` on `window`.
 */
export function api(method, path, { query, ...options } = {}) {
  const url = new URL(API + path, location.origin);
  for (const [key, value] of Object.entries(query ?? {})) {
    if (value != null) url.searchParams.set(key, String(value));
  }
  return send(method, url, options);
}

/** One request to the registry (options as for `api`). */
async function send(method, url, { body, text, contentType, token } = {}) {
  const headers = { Accept: 'application/json', [CSRF_HEADER]: '1' };
  const credential = token === undefined ? getToken() : token;
  if (credential) headers.Authorization = `Bearer ${credential}`;
  let payload;
  if (text != null) {
    payload = text;
    headers['Content-Type'] = contentType ?? 'text/plain';
  } else if (body !== undefined) {
    payload = JSON.stringify(body);
    headers['Content-Type'] = 'application/json';
  }
  let response;
  try {
    // Same-origin cookies: the session of a person signed in with the
    // identity provider, and the one binding an OAuth Connect flow to this
    // browser.
    response = await fetch(url, { method, headers, body: payload, cache: 'no-store', credentials: 'same-origin' });
  } catch (err) {
    throw new ApiError(0, null, `Cannot reach the registry: ${err.message}`);
  }
  const raw = await response.text();
  let json = null;
  try {
    json = raw ? JSON.parse(raw) : null;
  } catch {
    json = null;
  }
  if (!response.ok) {
    const error = new ApiError(response.status, json?.error, raw.slice(0, 300) || response.statusText);
    if (response.status === 401 && token === undefined) {
      window.dispatchEvent(new CustomEvent('quiver:unauthenticated'));
    }
    throw error;
  }
  return json;
}

/**
 * `GET whoami` with an explicit token (or none: the session cookie, or a
 * registry that needs no credential): `{role, principal?, via?}`, the role
 * being `admin`, `editor`, `viewer`, `approver` or `worker`, `via` `session`
 * for a person signed in with the identity provider.
 */
export async function whoami(token) {
  return (await api('GET', 'whoami', { token: token ?? null })) ?? {};
}

/** `GET /admin/signin/providers` (no credential): the identity providers people sign in with, `[{name}]`. */
export async function signinProviders() {
  const body = await send('GET', new URL(`${BASE}signin/providers`, location.origin), { token: null });
  return body?.providers ?? [];
}

/** Where the browser goes to sign in with `provider` (a navigation: the registry redirects to the provider). */
export function signinHref(provider) {
  return `${BASE}signin/${encodeURIComponent(provider)}`;
}

/** `POST /admin/signout`: ends the session of a person signed in with the identity provider. */
export function signout() {
  return send('POST', new URL(`${BASE}signout`, location.origin), { token: null });
}

const enc = encodeURIComponent;

/** The record endpoints. */
export const servers = {
  list: () => api('GET', 'mcp/servers', { query: { masked: true } }),
  get: (id) => api('GET', `mcp/servers/${enc(id)}`, { query: { masked: true } }),
  save: (record, expectedRevision) =>
    api('POST', 'mcp/servers', { query: { expected_revision: expectedRevision, masked: true }, body: record }),
  remove: (id, expectedRevision) =>
    api('DELETE', `mcp/servers/${enc(id)}`, { query: { expected_revision: expectedRevision } }),
  history: (id) => api('GET', `mcp/servers/${enc(id)}/history`, { query: { masked: true } }),
  rollback: (id, revision, expectedRevision) =>
    api('POST', `mcp/servers/${enc(id)}/rollback`, {
      query: { masked: true },
      body: { revision, expected_revision: expectedRevision ?? undefined },
    }),
  preview: (record) => api('POST', 'mcp/preview', { body: record }),
  evaluate: (record, tools) => api('POST', 'mcp/evaluate', { body: { record, tools } }),
  importFile: (text, { format, strict, contentType }) =>
    api('POST', 'mcp/import', { query: { format, strict }, text, contentType }),
  rescan: () => api('POST', 'mcp/rescan'),
};

/** `GET workers`: `{head_revision, workers: [...]}`. */
export function workers() {
  return api('GET', 'workers');
}

/** The approval endpoints (reference §5, §13.7): read by admin, editor, viewer and approver; decided by admin and approver. */
export const approvals = {
  list: (state) => api('GET', 'approvals', { query: { state } }),
  decide: (id, decision, note) => api('POST', `approvals/${enc(id)}`, { body: { decision, note } }),
};

/** Who may call (reference §12.2): read by admin, editor and viewer. */
export const access = {
  policies: () => api('GET', 'policies'),
  keys: () => api('GET', 'keys'),
  providers: () => api('GET', 'identity/providers'),
  /** `body`: one of `{key_id}`, `{token}`, `{subject, issuer, claims?}`, plus `server_id` and `tool`. */
  explain: (body) => api('POST', 'access/explain', { body }),
};

/**
 * `GET usage` (issue #25): tool calls, errors, rate-limited calls and p50/p95
 * latency per `groupBy` key (`server`, `policy`, `principal` or `tool`)
 * between `since` and `until` (milliseconds since the epoch), per `stepS`
 * seconds bucket when given: `{rows: [...], truncated}`. Read by admin,
 * editor and viewer.
 */
export function usage({ groupBy, since, until, stepS }) {
  return api('GET', 'usage', { query: { group_by: groupBy, since, until, step_s: stepS } });
}
