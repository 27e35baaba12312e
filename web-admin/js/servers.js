// The MCP servers page (R-UI-1): records joined with worker reports, search
// and filters, refreshed every few seconds.

import { servers as serversApi, workers as workersApi } from './api.js';
import { h, replace, stateBox, timeEl, badge } from './dom.js';
import { serverStatus, statusTitle, stateBadge, STATE_LABELS } from './status.js';
import { transportLabel, TRANSPORTS, sourceKind } from './record.js';

const REFRESH_MS = 5000;

/** Remembered across visits in this tab. */
const filters = { q: '', transport: '', enabled: '', status: '' };

/** Source badge: admin / api / file (file-managed records marked). */
export function sourceBadge(source) {
  const kind = sourceKind(source);
  if (kind === 'file') {
    const file = source.slice('file:'.length);
    return h('span', { class: 'badge src-file', testid: 'source-badge', dataset: { source: 'file' }, title: `Managed by mcp.d/${file}` }, `file · ${file}`);
  }
  return h('span', { class: 'badge outline', testid: 'source-badge', dataset: { source: kind } }, kind);
}

export function serversPage(ctx) {
  const search = h('input', {
    type: 'search', class: 'search', testid: 'server-search', placeholder: 'Search id, name, command, URL, label…',
    value: filters.q, 'aria-label': 'Search servers',
  });
  const select = (name, label, options) => h('select', { testid: `filter-${name}`, 'aria-label': label },
    options.map(([value, text]) => h('option', { value }, text)));
  const transport = select('transport', 'Transport', [['', 'All transports'], ...TRANSPORTS]);
  const enabled = select('enabled', 'Enabled', [['', 'Enabled or not'], ['true', 'Enabled'], ['false', 'Disabled']]);
  const status = select('status', 'Status', [['', 'Any status'], ...Object.entries(STATE_LABELS)]);
  transport.value = filters.transport;
  enabled.value = filters.enabled;
  status.value = filters.status;
  const updated = h('span', { class: 'updated', testid: 'refreshed' });
  const summary = h('div', { class: 'sub', testid: 'summary' }, 'Loading…');
  const body = h('div', {}, skeleton());

  const el = h('div', { testid: 'servers-page' },
    h('div', { class: 'page-head' },
      h('div', {}, h('h1', {}, 'MCP servers'), summary),
      h('div', { class: 'actions' },
        ctx.canEdit ? ctx.link('import', { class: 'btn', testid: 'import-link' }, 'Import file') : null,
        ctx.canEdit ? ctx.link('servers/new', { class: 'btn btn-primary', testid: 'new-server' }, '+ New server') : null)),
    h('div', { class: 'toolbar' }, search, transport, enabled, status,
      h('span', { class: 'spacer' }), updated,
      h('button', { type: 'button', class: 'btn btn-small', testid: 'refresh', onclick: () => load(true) }, 'Refresh')),
    body);

  let data = null; // {servers, workers, head}
  let lastKey = '';
  let timer = null;
  let disposed = false;

  const onFilter = () => {
    filters.q = search.value;
    filters.transport = transport.value;
    filters.enabled = enabled.value;
    filters.status = status.value;
    draw();
  };
  search.addEventListener('input', onFilter);
  for (const s of [transport, enabled, status]) s.addEventListener('change', onFilter);

  async function load(manual = false) {
    clearTimeout(timer);
    try {
      const [list, report] = await Promise.all([
        serversApi.list(),
        workersApi().catch(() => ({ workers: [], unavailable: true })),
      ]);
      if (disposed) return;
      const next = {
        servers: list?.servers ?? [],
        revision: list?.revision ?? null,
        workers: report?.workers ?? [],
        head: report?.head_revision ?? list?.revision ?? null,
        workersUnavailable: Boolean(report?.unavailable),
      };
      const key = JSON.stringify([next.servers, next.workers.map((w) => [w.worker_id, w.snapshot_revision, w.servers])]);
      data = next;
      updated.textContent = `Updated ${new Date().toLocaleTimeString()}`;
      if (key !== lastKey || manual) {
        lastKey = key;
        draw();
      }
    } catch (err) {
      if (disposed) return;
      if (!data) {
        replace(body, stateBox({
          title: 'Cannot load the servers',
          text: err.message,
          kind: 'error',
          testid: 'error-state',
          actions: [h('button', { type: 'button', class: 'btn', onclick: () => { replace(body, skeleton()); load(true); } }, 'Retry')],
        }));
        summary.textContent = '';
      } else {
        updated.textContent = `Refresh failed: ${err.message}`;
      }
    }
    if (!disposed) timer = setTimeout(load, REFRESH_MS);
  }

  function matches(server, st) {
    const q = filters.q.trim().toLowerCase();
    if (q) {
      const hay = [
        server.server_id, server.display_name, server.transport, server.stdio?.command, ...(server.stdio?.args ?? []),
        server.http?.url, server.source, server.updated_by,
        ...Object.entries(server.labels ?? {}).flat(),
      ].filter(Boolean).join(' ').toLowerCase();
      if (!hay.includes(q)) return false;
    }
    if (filters.transport && server.transport !== filters.transport) return false;
    if (filters.enabled && String(server.enabled !== false) !== filters.enabled) return false;
    if (filters.status && st.state !== filters.status) return false;
    return true;
  }

  function draw() {
    if (!data) return;
    const rows = data.servers.map((server) => ({
      server,
      st: serverStatus(server.server_id, data.workers, { enabled: server.enabled !== false }),
    }));
    const counts = {};
    for (const { st } of rows) counts[st.state] = (counts[st.state] ?? 0) + 1;
    replace(summary,
      `${rows.length} server${rows.length === 1 ? '' : 's'}`,
      data.head != null ? ` · head revision ${data.head}` : '',
      ` · ${data.workers.length} worker${data.workers.length === 1 ? '' : 's'} reporting`,
      counts.down ? ` · ${counts.down} down` : '',
      counts.degraded ? ` · ${counts.degraded} degraded` : '');
    if (!rows.length) {
      replace(body, stateBox({
        title: 'No MCP servers yet',
        text: 'Workers can use a tool only from a server registered here. Create one, import a TOML/JSON file, or add files to mcp.d.',
        testid: 'empty-state',
        actions: ctx.canEdit
          ? [ctx.link('servers/new', { class: 'btn btn-primary' }, '+ New server'), ctx.link('import', { class: 'btn' }, 'Import a file')]
          : [],
      }));
      return;
    }
    const shown = rows.filter(({ server, st }) => matches(server, st));
    if (!shown.length) {
      replace(body, stateBox({
        title: 'No server matches the filters',
        text: `${rows.length} server${rows.length === 1 ? ' is' : 's are'} hidden by the search and filters.`,
        testid: 'no-match',
        actions: [h('button', {
          type: 'button', class: 'btn', testid: 'clear-filters',
          onclick: () => {
            search.value = '';
            transport.value = '';
            enabled.value = '';
            status.value = '';
            onFilter();
          },
        }, 'Clear filters')],
      }));
      return;
    }
    replace(body, h('div', { class: 'table-wrap' }, h('table', { testid: 'servers-table' },
      h('thead', {}, h('tr', {},
        h('th', {}, 'Server'), h('th', {}, 'Transport'), h('th', {}, 'Enabled'), h('th', {}, 'Status'),
        h('th', {}, 'Last error'), h('th', { class: 'num' }, 'Tools'), h('th', { class: 'num' }, 'Rev.'),
        h('th', {}, 'Updated'), h('th', {}, 'Source'))),
      h('tbody', {}, shown.map(({ server, st }) => row(server, st))))));
  }

  function row(server, st) {
    const open = () => ctx.navigate(`servers/${encodeURIComponent(server.server_id)}`);
    return h('tr', {
      class: 'clickable', testid: 'server-row', dataset: { serverId: server.server_id },
      onclick: (event) => { if (!event.target.closest('a')) open(); },
    },
    h('td', {},
      h('div', { class: 'primary' }, ctx.link(`servers/${encodeURIComponent(server.server_id)}`, { testid: 'server-link' }, server.server_id)),
      server.display_name ? h('div', { class: 'secondary', testid: 'display-name' }, server.display_name) : null),
    h('td', { class: 'nowrap' }, transportLabel(server.transport)),
    h('td', { testid: 'enabled' }, server.enabled === false ? badge('Disabled', '', { dataset: { enabled: 'false' } }) : badge('Enabled', 'ok', { dataset: { enabled: 'true' } })),
    h('td', { title: statusTitle(st) }, stateBadge(st.state, { title: statusTitle(st) }),
      st.perWorker.length > 1 ? h('div', { class: 'secondary small' }, `${st.perWorker.length} workers`) : null),
    h('td', { class: 'err', testid: 'last-error' }, st.lastError ?? h('span', { class: 'muted' }, '—')),
    h('td', { class: 'num', testid: 'tool-count' }, st.toolCount ?? h('span', { class: 'muted' }, '—')),
    h('td', { class: 'num mono', testid: 'revision' }, server.revision),
    h('td', { class: 'nowrap' }, timeEl(server.updated_at), h('div', { class: 'secondary' }, `by ${server.updated_by ?? '?'}`)),
    h('td', {}, sourceBadge(server.source)));
  }

  load();
  return {
    el,
    dispose() {
      disposed = true;
      clearTimeout(timer);
    },
  };
}

function skeleton() {
  const line = () => h('td', {}, h('span'));
  return h('div', { class: 'table-wrap', testid: 'loading' }, h('table', { class: 'skeleton' },
    h('thead', {}, h('tr', {}, ['Server', 'Transport', 'Enabled', 'Status', 'Last error', 'Tools', 'Rev.', 'Updated', 'Source'].map((t) => h('th', {}, t)))),
    h('tbody', {}, [1, 2, 3].map(() => h('tr', {}, Array.from({ length: 9 }, line))))));
}
