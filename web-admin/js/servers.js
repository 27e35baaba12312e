// The MCP servers page (R-UI-1): records joined with worker reports, search
// and filters, refreshed every few seconds.
//
// At fleet scale (10,000 records and more) the page stays quick: it draws
// one page of PAGE_SIZE rows, never every row; the search runs over
// lowercase texts built once per record list; the status of every record is
// joined once per report through an index by server id; and a refresh first
// asks for the workers report, which names the head revision, fetching the
// record list again only when that moved and redrawing only what changed.

import { servers as serversApi, workers as workersApi } from './api.js';
import { h, replace, stateBox, timeEl, badge } from './dom.js';
import { serverStatus, statusTitle, stateBadge, STATE_LABELS } from './status.js';
import { transportLabel, TRANSPORTS, sourceKind } from './record.js';

const REFRESH_MS = 5000;
/** Rows on one page: a few screens, drawn in milliseconds at any fleet size. */
const PAGE_SIZE = 100;

/** Remembered across visits in this tab (`page` counts from 0). */
const filters = { q: '', transport: '', enabled: '', status: '', page: 0 };

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
  // The table and pager stay in place across redraws: only the rows of the
  // page change, so the scroll position holds.
  const tbody = h('tbody');
  const table = h('div', { class: 'table-wrap' }, h('table', { testid: 'servers-table' },
    h('thead', {}, h('tr', {},
      h('th', {}, 'Server'), h('th', {}, 'Transport'), h('th', {}, 'Enabled'), h('th', {}, 'Status'),
      h('th', {}, 'Last error'), h('th', { class: 'num' }, 'Tools'), h('th', { class: 'num' }, 'Rev.'),
      h('th', {}, 'Updated'), h('th', {}, 'Source'))),
    tbody));
  const pager = h('nav', { class: 'pager', testid: 'pager', 'aria-label': 'Pages of servers' });

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

  let list = null; // {servers, revision}: the record list
  let report = null; // {workers, head, unavailable}: null until the first report came
  let reportKey = null;
  let rows = []; // [{server, st}], `st` null while no report came
  let shown = []; // the rows the filters keep
  let timer = null;
  let loads = 0;
  let disposed = false;

  const onFilter = () => {
    filters.q = search.value;
    filters.transport = transport.value;
    filters.enabled = enabled.value;
    filters.status = status.value;
    filters.page = 0;
    refilter();
  };
  search.addEventListener('input', onFilter);
  for (const s of [transport, enabled, status]) s.addEventListener('change', onFilter);

  /** `GET workers`, never failing: a missing report only leaves the status unknown. */
  function fetchReport() {
    return workersApi().then(
      (body) => ({ workers: body?.workers ?? [], head: body?.head_revision ?? null, unavailable: false }),
      () => ({ workers: [], head: null, unavailable: true }));
  }

  async function load(manual = false) {
    clearTimeout(timer);
    // A load started later (Refresh while a periodic one runs) supersedes
    // this one: its answers are dropped and it schedules no refresh.
    const mine = ++loads;
    const stale = () => disposed || mine !== loads;
    let latest = null;
    const reportDone = fetchReport().then((next) => { latest = next; return next; });
    try {
      // The list is megabytes at fleet scale: fetched again only when the
      // head revision the report names moved (or on request).
      let fetchList = manual || !list;
      if (!fetchList) {
        const next = await reportDone;
        fetchList = next.unavailable || next.head !== list.revision;
      }
      if (fetchList) {
        const next = await serversApi.list();
        if (stale()) return;
        // The rows show as soon as the list is in; the report, when it
        // comes later, fills their status.
        apply({ servers: next?.servers ?? [], revision: next?.revision ?? null }, latest);
      }
      const next = await reportDone;
      if (stale()) return;
      apply(null, next);
      updated.textContent = `Updated ${new Date().toLocaleTimeString()}`;
    } catch (err) {
      if (stale()) return;
      if (!list) {
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
    if (!stale()) timer = setTimeout(load, REFRESH_MS);
  }

  /** Takes a new list and/or report (null: none); redraws only when either changed. */
  function apply(nextList, nextReport) {
    let changed = false;
    if (nextList && nextList.revision !== list?.revision) {
      list = nextList;
      changed = true;
      // The search texts are built while the page idles, not on the first keystroke.
      const servers = list.servers;
      requestIdleCallback(() => { for (const server of servers) searchText(server); });
    }
    if (nextReport) {
      const key = JSON.stringify([nextReport.unavailable, nextReport.head,
        nextReport.workers.map((w) => [w.worker_id, w.snapshot_revision, w.servers])]);
      if (key !== reportKey) {
        reportKey = key;
        report = nextReport;
        changed = true;
      }
    }
    if (!changed || !list) return;
    const statusOf = report ? statusIndex(report.workers) : null;
    rows = list.servers.map((server) => ({ server, st: statusOf?.(server) ?? null }));
    drawSummary();
    refilter();
  }

  function drawSummary() {
    const counts = {};
    for (const { st } of rows) if (st) counts[st.state] = (counts[st.state] ?? 0) + 1;
    const head = report?.head ?? list.revision;
    const workerCount = report?.workers.length ?? 0;
    replace(summary,
      `${count(rows.length)} server${rows.length === 1 ? '' : 's'}`,
      head != null ? ` · head revision ${head}` : '',
      report ? ` · ${workerCount} worker${workerCount === 1 ? '' : 's'} reporting` : '',
      counts.down ? ` · ${count(counts.down)} down` : '',
      counts.degraded ? ` · ${count(counts.degraded)} degraded` : '');
  }

  function matches({ server, st }, q) {
    if (q && !searchText(server).includes(q)) return false;
    if (filters.transport && server.transport !== filters.transport) return false;
    if (filters.enabled && String(server.enabled !== false) !== filters.enabled) return false;
    if (filters.status && st?.state !== filters.status) return false;
    return true;
  }

  function refilter() {
    if (!list) return;
    const q = filters.q.trim().toLowerCase();
    const filtered = q || filters.transport || filters.enabled || filters.status;
    shown = filtered ? rows.filter((r) => matches(r, q)) : rows;
    draw();
  }

  function draw() {
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
    if (!shown.length) {
      replace(body, stateBox({
        title: 'No server matches the filters',
        text: `${count(rows.length)} server${rows.length === 1 ? ' is' : 's are'} hidden by the search and filters.`,
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
    const pages = Math.ceil(shown.length / PAGE_SIZE);
    filters.page = Math.min(filters.page, pages - 1);
    const from = filters.page * PAGE_SIZE;
    const to = Math.min(from + PAGE_SIZE, shown.length);
    replace(tbody, shown.slice(from, to).map(({ server, st }) => row(server, st)));
    drawPager(from, to, pages);
    if (body.firstChild !== table) replace(body, table, pager);
  }

  function drawPager(from, to, pages) {
    pager.hidden = pages <= 1;
    if (pager.hidden) return;
    const go = (page) => {
      filters.page = page;
      draw();
      // The pager sits below the table: the new page is read from its top.
      window.scrollTo(0, 0);
    };
    const last = pages - 1;
    const button = (label, page, testid, title) => h('button', {
      type: 'button', class: 'btn btn-small', testid, title, disabled: page === filters.page || page < 0 || page > last,
      onclick: () => go(page),
    }, label);
    const filtered = shown.length !== rows.length;
    replace(pager,
      button('«', 0, 'page-first', 'First page'),
      button('‹ Previous', filters.page - 1, 'page-prev'),
      h('span', { class: 'pager-info', testid: 'page-info' },
        `${count(from + 1)}–${count(to)} of ${count(shown.length)}${filtered ? ' matching' : ''}`,
        h('span', { class: 'muted' }, ` · page ${count(filters.page + 1)} of ${count(pages)}`)),
      button('Next ›', filters.page + 1, 'page-next'),
      button('»', last, 'page-last', 'Last page'));
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
    st
      ? h('td', { title: statusTitle(st) }, stateBadge(st.state, { title: statusTitle(st) }),
        st.perWorker.length > 1 ? h('div', { class: 'secondary small' }, `${st.perWorker.length} workers`) : null)
      : h('td', { class: 'muted', title: 'Waiting for the workers report' }, '…'),
    h('td', { class: 'err', testid: 'last-error' }, st?.lastError ?? h('span', { class: 'muted' }, '—')),
    h('td', { class: 'num', testid: 'tool-count' }, st?.toolCount ?? h('span', { class: 'muted' }, '—')),
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

/** `10,000`. */
function count(n) {
  return n.toLocaleString('en');
}

/** The lowercase text the search looks in, built once per record object (a list fetched again makes new ones). */
const searchTexts = new WeakMap();
function searchText(server) {
  let text = searchTexts.get(server);
  if (text === undefined) {
    text = [
      server.server_id, server.display_name, server.transport, server.stdio?.command, ...(server.stdio?.args ?? []),
      server.http?.url, server.source, server.updated_by,
      ...Object.entries(server.labels ?? {}).flat(),
    ].filter(Boolean).join(' ').toLowerCase();
    searchTexts.set(server, text);
  }
  return text;
}

/**
 * `server → serverStatus(…)` over `workers` in time linear in the records
 * and reports: each record is judged against the reports that name it (one
 * health entry each), or, when none does, against every worker with no
 * entry, which is what `serverStatus` would find by scanning each report.
 */
function statusIndex(workers) {
  const bare = workers.map((w) => ({ worker_id: w.worker_id, reported_at: w.reported_at, servers: [] }));
  const named = new Map();
  for (const worker of workers) {
    const seen = new Set();
    for (const health of worker.servers ?? []) {
      // `serverStatus` takes a report's first entry for a server.
      if (seen.has(health.server_id)) continue;
      seen.add(health.server_id);
      let reports = named.get(health.server_id);
      if (!reports) named.set(health.server_id, reports = []);
      reports.push({ worker_id: worker.worker_id, reported_at: worker.reported_at, servers: [health] });
    }
  }
  return (server) => serverStatus(server.server_id, named.get(server.server_id) ?? bare, { enabled: server.enabled !== false });
}

function skeleton() {
  const line = () => h('td', {}, h('span'));
  return h('div', { class: 'table-wrap', testid: 'loading' }, h('table', { class: 'skeleton' },
    h('thead', {}, h('tr', {}, ['Server', 'Transport', 'Enabled', 'Status', 'Last error', 'Tools', 'Rev.', 'Updated', 'Source'].map((t) => h('th', {}, t)))),
    h('tbody', {}, [1, 2, 3].map(() => h('tr', {}, Array.from({ length: 9 }, line))))));
}
