// Field-level differences between two records, as flattened paths:
// `budgets.max_concurrency: 8 → 4`.

import { h } from './dom.js';
import { equal } from './record.js';

function isPlainObject(value) {
  return value != null && typeof value === 'object' && !Array.isArray(value);
}

/**
 * Flattens objects into `a.b.c` paths; arrays and scalars are leaves (an
 * array of patterns reads better whole). An empty object is a leaf too.
 */
export function flatten(value, prefix = '', out = new Map()) {
  if (isPlainObject(value) && Object.keys(value).length > 0) {
    for (const key of Object.keys(value).sort()) {
      flatten(value[key], prefix ? `${prefix}.${key}` : key, out);
    }
  } else if (prefix) {
    out.set(prefix, value);
  }
  return out;
}

/** Changes from `before` to `after`: `[{path, kind, before, after}]`, sorted by path. */
export function diffRecords(before, after) {
  const a = flatten(before ?? {});
  const b = flatten(after ?? {});
  const paths = [...new Set([...a.keys(), ...b.keys()])].sort();
  const changes = [];
  for (const path of paths) {
    const inA = a.has(path);
    const inB = b.has(path);
    if (inA && inB) {
      if (!equal(a.get(path), b.get(path))) changes.push({ path, kind: 'changed', before: a.get(path), after: b.get(path) });
    } else if (inB) {
      changes.push({ path, kind: 'added', before: undefined, after: b.get(path) });
    } else {
      changes.push({ path, kind: 'removed', before: a.get(path), after: undefined });
    }
  }
  return changes;
}

/** A value as it reads in a diff line. */
export function show(value) {
  if (value === undefined) return '(unset)';
  if (typeof value === 'string') return JSON.stringify(value);
  return JSON.stringify(value);
}

/** One change as text: `path: before → after`. */
export function changeText(change) {
  if (change.kind === 'added') return `${change.path}: ${show(change.after)} (added)`;
  if (change.kind === 'removed') return `${change.path}: ${show(change.before)} (removed)`;
  return `${change.path}: ${show(change.before)} → ${show(change.after)}`;
}

/** The changes as a list of lines (`data-testid="diff-line"`). */
export function renderDiff(changes, { empty = 'No differences.', testid = 'diff' } = {}) {
  if (!changes.length) return h('div', { class: 'diff', testid }, h('div', { class: 'diff-empty' }, empty));
  return h('div', { class: 'diff', testid },
    changes.map((change) => h('div', {
      class: `diff-line ${change.kind}`,
      testid: 'diff-line',
      dataset: { path: change.path, kind: change.kind },
      title: changeText(change),
    },
    h('span', { class: 'path' }, change.path), ': ',
    change.kind === 'added'
      ? [h('span', { class: 'muted' }, '(unset)'), h('span', { class: 'arrow' }, '→'), h('span', { class: 'after' }, show(change.after))]
      : change.kind === 'removed'
        ? [h('span', { class: 'before' }, show(change.before)), h('span', { class: 'arrow' }, '→'), h('span', { class: 'muted' }, '(unset)')]
        : [h('span', { class: 'before' }, show(change.before)), h('span', { class: 'arrow' }, '→'), h('span', { class: 'after' }, show(change.after))])));
}
