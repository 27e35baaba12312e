// History of one server (R-UI-4): every revision, the field-level diff
// against the revision before it, and one-click rollback.

import { servers as serversApi } from './api.js';
import { h, replace, toast, confirmDialog, stateBox, loading, timeEl, formatTime } from './dom.js';
import { diffRecords, renderDiff } from './diff.js';
import { sourceBadge } from './servers.js';

export function historyPage(ctx, { id }) {
  const el = h('div', { testid: 'history-page' });
  const body = h('div', {}, loading(`Loading the history of ${id}…`));
  let disposed = false;
  let entries = [];
  let selected = null;

  replace(el,
    h('div', { class: 'page-head' },
      h('div', {},
        h('div', { class: 'crumbs' }, ctx.link('servers', {}, 'Servers'), ' / ',
          ctx.link(`servers/${encodeURIComponent(id)}`, { class: 'mono' }, id), ' / history'),
        h('h1', {}, `History of ${id}`),
        h('div', { class: 'sub' }, 'Every revision is kept with its full record. Select one to see what it changed.')),
      h('div', { class: 'actions' },
        ctx.link(`servers/${encodeURIComponent(id)}`, { class: 'btn', testid: 'back-to-server' }, 'Back to the server'))),
    body);

  /** Newest first; the revision an entry replaced is the next one. */
  async function load(selectRevision) {
    try {
      const result = await serversApi.history(id);
      if (disposed) return;
      entries = [...(result?.entries ?? [])].sort((a, b) => b.revision - a.revision);
      if (!entries.length) {
        replace(body, stateBox({ title: 'No history', text: `No revision of ${id} is recorded.`, testid: 'empty-state' }));
        return;
      }
      selected = entries.find((e) => e.revision === selectRevision) ?? entries[0];
      draw();
    } catch (err) {
      if (disposed) return;
      replace(body, stateBox({
        title: err.status === 404 ? `No history for ${id}` : 'Cannot load the history',
        text: err.message,
        kind: err.status === 404 ? '' : 'error',
        testid: err.status === 404 ? 'not-found' : 'error-state',
        actions: [h('button', { type: 'button', class: 'btn', onclick: () => load() }, 'Retry')],
      }));
    }
  }

  /** The record now: the newest entry's, or none when it is a delete. */
  function head() {
    const newest = entries[0];
    return newest?.kind === 'delete' ? null : newest;
  }

  function previousOf(entry) {
    const i = entries.indexOf(entry);
    return i >= 0 ? entries[i + 1] ?? null : null;
  }

  function draw() {
    const current = head();
    const list = h('div', { class: 'timeline', testid: 'history-list' },
      entries.map((entry) => h('button', {
        type: 'button',
        class: `entry ${entry === selected ? 'selected' : ''}`,
        testid: 'history-entry',
        dataset: { revision: String(entry.revision), kind: entry.kind },
        onclick: () => { selected = entry; draw(); },
      },
      h('div', { class: 'top' },
        h('span', { class: 'rev' }, `r${entry.revision}`),
        h('span', { class: `badge ${entry.kind}` }, entry.kind === 'delete' ? 'deleted' : previousOf(entry) ? 'updated' : 'created'),
        entry === current ? h('span', { class: 'badge ok' }, 'current') : null),
      h('div', { class: 'meta' }, `by ${entry.actor ?? '?'} · `, timeEl(entry.at), entry.source ? ` · via ${entry.source}` : ''))));
    replace(body, h('div', { class: 'history' }, list, detail(selected, current)));
  }

  function detail(entry, current) {
    const previous = previousOf(entry);
    const before = previous?.kind === 'upsert' ? previous.spec : null;
    const after = entry.kind === 'upsert' ? entry.spec : null;
    const changes = diffRecords(before ?? {}, after ?? {});
    const canRollback = ctx.canEdit && entry.kind === 'upsert' && entry !== current;
    return h('section', { class: 'card', testid: 'history-detail', dataset: { revision: String(entry.revision) } },
      h('div', { class: 'card-head' },
        h('div', {},
          h('h2', {}, `Revision ${entry.revision}`),
          h('div', { class: 'small muted' }, `${entry.kind === 'delete' ? 'Deleted' : previous ? 'Changed' : 'Created'} by ${entry.actor ?? '?'} at ${formatTime(entry.at)} `,
            entry.source ? sourceBadge(entry.source) : null)),
        canRollback ? h('button', { type: 'button', class: 'btn btn-primary', testid: 'rollback', onclick: () => rollback(entry, current) },
          `Roll back to r${entry.revision}`) : null),
      h('h3', {}, entry.kind === 'delete' ? 'The record was removed'
        : previous ? (previous.kind === 'delete' ? `Recreated after the delete in r${previous.revision}` : `Changes since r${previous.revision}`)
          : 'Initial content'),
      renderDiff(changes, { testid: 'history-diff', empty: 'No field changed (only the source or owner).' }),
      after ? h('details', { class: 'small', testid: 'full-record' }, h('summary', {}, 'Full record at this revision'),
        h('pre', { class: 'json' }, JSON.stringify(after, null, 2))) : null);
  }

  async function rollback(entry, current) {
    const changes = diffRecords(current?.spec ?? {}, entry.spec ?? {});
    const ok = await confirmDialog({
      title: `Roll back ${id} to revision ${entry.revision}?`,
      body: h('div', {},
        h('p', {}, 'This saves the content of that revision as a new revision; nothing is erased. Workers pick it up at once.'),
        h('p', {}, h('b', {}, current ? `Current (r${current.revision}) → r${entry.revision}:` : `Restores the deleted record as of r${entry.revision}:`)),
        renderDiff(changes, { testid: 'rollback-diff', empty: 'Same content as now.' })),
      confirmLabel: `Roll back to r${entry.revision}`,
    });
    if (!ok) return;
    try {
      const result = await serversApi.rollback(id, entry.revision, current ? current.revision : 0);
      if (result?.unchanged) toast('Nothing changed: the record already has that content.');
      else toast(`Rolled back: revision ${result?.revision} has the content of r${entry.revision}`, 'ok');
      await load(result?.revision);
    } catch (err) {
      if (err.status === 409) {
        toast(`Not rolled back: ${id} changed meanwhile (now revision ${err.currentRevision}). Look again and retry.`, 'error');
        await load();
      } else if (err.status !== 401) {
        toast(`Rollback failed: ${err.message}`, 'error');
      }
    }
  }

  load();
  return { el, dispose() { disposed = true; } };
}
