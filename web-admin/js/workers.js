// Workers (R-UI-5): who reports, which snapshot revision they serve against
// the registry's head, and the health of every server on each.

import { workers as workersApi } from './api.js';
import { h, replace, stateBox, loading, timeEl, badge } from './dom.js';
import { stateBadge } from './status.js';

const REFRESH_MS = 5000;

export function workersPage(ctx) {
  const body = h('div', {}, loading('Loading worker reports…'));
  const updated = h('span', { class: 'updated small muted', testid: 'refreshed' });
  const el = h('div', { testid: 'workers-page' },
    h('div', { class: 'page-head' },
      h('div', {}, h('h1', {}, 'Workers'),
        h('div', { class: 'sub' }, 'Workers report their snapshot revision and per-server health every few seconds; a worker silent for 5 minutes is dropped.')),
      h('div', { class: 'actions' }, updated,
        h('button', { type: 'button', class: 'btn btn-small', testid: 'refresh', onclick: () => load() }, 'Refresh'))),
    body);
  let timer = null;
  let disposed = false;
  let loaded = false;
  let lastKey = '';

  async function load() {
    clearTimeout(timer);
    try {
      const report = await workersApi();
      if (disposed) return;
      loaded = true;
      updated.textContent = `Updated ${new Date().toLocaleTimeString()}`;
      const key = JSON.stringify(report);
      if (key !== lastKey) {
        lastKey = key;
        draw(report);
      }
    } catch (err) {
      if (disposed) return;
      if (!loaded) {
        replace(body, stateBox({
          title: 'Cannot load the workers', text: err.message, kind: 'error', testid: 'error-state',
          actions: [h('button', { type: 'button', class: 'btn', onclick: () => load() }, 'Retry')],
        }));
      } else {
        updated.textContent = `Refresh failed: ${err.message}`;
      }
    }
    if (!disposed) timer = setTimeout(load, REFRESH_MS);
  }

  function lagOf(worker, head) {
    if (typeof worker.lag === 'number') return worker.lag;
    return typeof head === 'number' ? Math.max(0, head - worker.snapshot_revision) : null;
  }

  function draw(report) {
    const workers = report?.workers ?? [];
    const head = report?.head_revision ?? null;
    const behind = workers.filter((w) => (lagOf(w, head) ?? 0) > 0).length;
    const degraded = workers.filter((w) => w.degraded).length;
    const stats = h('div', { class: 'stats' },
      stat('Head revision', head ?? '—', 'head-revision'),
      stat('Workers reporting', workers.length, 'worker-count'),
      stat('Behind head', behind, 'behind-count'),
      stat('Degraded (stale snapshot)', degraded, 'degraded-count'));
    if (!workers.length) {
      replace(body, stats, stateBox({
        title: 'No worker is reporting',
        text: 'Start a worker with --registry pointing here and the worker token; it appears within seconds.',
        testid: 'empty-state',
      }));
      return;
    }
    replace(body, stats, workers.map((w) => workerCard(w, lagOf(w, head))));
  }

  function stat(label, value, testid) {
    return h('div', { class: 'stat', testid }, h('div', { class: 'v' }, String(value)), h('div', { class: 'l' }, label));
  }

  function workerCard(worker, lag) {
    const servers = [...(worker.servers ?? [])].sort((a, b) => a.server_id.localeCompare(b.server_id));
    const healthRow = (s) => h('tr', { testid: 'worker-server', dataset: { serverId: s.server_id } },
      h('td', {}, ctx.link(`servers/${encodeURIComponent(s.server_id)}`, { class: 'mono' }, s.server_id)),
      h('td', {}, stateBadge(s.state)),
      h('td', { class: 'num' }, s.tool_count ?? '—'),
      h('td', { class: 'num' }, s.reconnect_count ?? 0),
      h('td', { class: 'num', testid: 'worker-server-sessions' }, s.session_connections ?? 0),
      h('td', { class: 'num' }, s.p50_latency_ms != null ? `${Math.round(s.p50_latency_ms * 10) / 10} ms` : '—'),
      h('td', { class: 'err' }, s.last_error ?? h('span', { class: 'muted' }, '—')));
    const table = h('div', { class: 'table-wrap' },
      h('table', {},
        h('thead', {}, h('tr', {}, h('th', {}, 'Server'), h('th', {}, 'State'), h('th', { class: 'num' }, 'Tools'),
          h('th', { class: 'num' }, 'Reconnects'), h('th', { class: 'num', title: 'Live connections of a per_session server' }, 'Sessions'),
          h('th', { class: 'num' }, 'p50 latency'), h('th', {}, 'Last error'))),
        h('tbody', {}, servers.map(healthRow))));
    const lagBadge = lag == null ? null : lag === 0
      ? badge('lag 0', 'ok', { testid: 'worker-lag', dataset: { lag: '0' } })
      : badge(`${lag} revision${lag === 1 ? '' : 's'} behind`, 'warn', { testid: 'worker-lag', dataset: { lag: String(lag) } });
    return h('section', { class: 'card worker-card', testid: 'worker-card', dataset: { workerId: worker.worker_id } },
      h('div', { class: 'card-head' },
        h('h2', { class: 'mono' }, worker.worker_id),
        h('div', { class: 'chips' },
          worker.degraded
            ? badge('Degraded: serving a stale snapshot', 'degraded', { testid: 'worker-degraded' })
            : badge('Following the registry', 'ok'),
          lagBadge)),
      h('div', { class: 'worker-meta' },
        h('span', {}, 'Snapshot revision ', h('b', { testid: 'snapshot-revision' }, String(worker.snapshot_revision))),
        h('span', {}, 'Last report ', h('b', {}, timeEl(worker.reported_at))),
        h('span', {}, h('b', {}, String(servers.length)), ` server${servers.length === 1 ? '' : 's'}`)),
      servers.length === 0 ? h('div', { class: 'rows-empty' }, 'This worker serves no MCP server.') : table);
  }

  load();
  return { el, dispose() { disposed = true; clearTimeout(timer); } };
}
