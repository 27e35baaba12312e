// The MCP server record (docs/reference.md §1) as JSON: metadata, paths, defaults.

import { api } from './api.js';

/** What a masked secret reads as; sent back unchanged, the registry keeps the stored value. */
export const MASK = '********';

/** Fields of a stored record that are not part of its content (never sent back). */
export const METADATA = ['revision', 'created_at', 'updated_at', 'updated_by', 'source', 'unchanged', 'masked'];

let defaultsAnswer = null;

/**
 * The defaults the registry applies to fields a record leaves out
 * (docs/reference.md §1), as it serves them from the Rust `Default`s
 * (`GET record-defaults`): `{budgets: {...}}`. Fetched once and shared; a
 * failed fetch is tried again by the next call.
 */
export function loadRecordDefaults() {
  defaultsAnswer ??= api('GET', 'record-defaults').catch((err) => {
    defaultsAnswer = null;
    throw err;
  });
  return defaultsAnswer;
}

/**
 * The transports (docs/reference.md §1) as [value, label] pairs, in the order
 * selects offer them: the one place their labels are written, so a select and
 * a badge never name the same transport differently.
 */
export const TRANSPORTS = [
  ['stdio', 'stdio'],
  ['streamable_http', 'Streamable HTTP'],
  ['http_sse_legacy', 'HTTP+SSE (legacy)'],
];

const TRANSPORT_LABELS = new Map(TRANSPORTS);

/** Display name of a transport (an unknown one as itself). */
export function transportLabel(transport) {
  return TRANSPORT_LABELS.get(transport) ?? transport;
}

/** A deep copy of JSON data. */
export function clone(value) {
  return value === undefined ? undefined : JSON.parse(JSON.stringify(value));
}

/** The record content of a stored record (metadata removed; unknown fields kept). */
export function contentOf(stored) {
  const spec = clone(stored ?? {});
  for (const key of METADATA) delete spec[key];
  return spec;
}

/** Structural equality of JSON data (object key order ignored). */
export function equal(a, b) {
  if (a === b) return true;
  if (a == null || b == null || typeof a !== 'object' || typeof b !== 'object') return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a)) return a.length === b.length && a.every((x, i) => equal(x, b[i]));
  const ka = Object.keys(a);
  const kb = Object.keys(b);
  return ka.length === kb.length && ka.every((k) => Object.hasOwn(b, k) && equal(a[k], b[k]));
}

/** The value at a dotted path (`budgets.max_concurrency`). */
export function getPath(obj, path) {
  return path.split('.').reduce((node, key) => (node != null && typeof node === 'object' ? node[key] : undefined), obj);
}

/** Sets a dotted path, creating objects on the way. */
export function setPath(obj, path, value) {
  const keys = path.split('.');
  let node = obj;
  for (const key of keys.slice(0, -1)) {
    if (node[key] == null || typeof node[key] !== 'object' || Array.isArray(node[key])) node[key] = {};
    node = node[key];
  }
  node[keys[keys.length - 1]] = value;
}

/** Removes a dotted path (and nothing else). */
export function deletePath(obj, path) {
  const keys = path.split('.');
  const parent = keys.slice(0, -1).reduce((node, key) => (node != null && typeof node === 'object' ? node[key] : undefined), obj);
  if (parent != null && typeof parent === 'object') delete parent[keys[keys.length - 1]];
}

/** Whether a record holds literal secrets that are shown masked. */
export function hasMaskedValues(spec) {
  const values = [...Object.values(spec?.stdio?.env ?? {}), ...Object.values(spec?.http?.headers ?? {})];
  return values.includes(MASK);
}

/** `admin`, `api` or `file` for a source string (`file:<name>`). */
export function sourceKind(source) {
  if (typeof source !== 'string') return 'unknown';
  if (source.startsWith('file:')) return 'file';
  return source;
}
