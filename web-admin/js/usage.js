// Usage (issue #25): tool calls, errors and p95 latency over time per server,
// policy, principal or tool, as charts, and a table of the totals.
//
// Each refresh reads `GET usage` twice over the same window: per time bucket
// (`step_s`) for the charts, and without buckets for the totals. The charts
// are drawn by uPlot (vendor/uplot/, loaded on first use of this page); a
// refresh feeds new data to the same charts, and rebuilds them only when the
// set of series changes, so nothing flickers.

import { BASE, usage as usageApi, access as accessApi } from './api.js';
import { h, replace, stateBox, loading, formatTime } from './dom.js';

const REFRESH_MS = 10000;
/** Keys charted one by one; the rest are drawn as one "other" series. */
const TOP = 8;
const OTHER = 'other';
const GROUPS = [
  { value: 'server', label: 'Server', plural: 'Servers' },
  { value: 'policy', label: 'Policy', plural: 'Policies' },
  { value: 'principal', label: 'Principal', plural: 'Principals' },
  { value: 'tool', label: 'Tool', plural: 'Tools' },
];
/** Time ranges: the window and the bucket width charted over it. */
const RANGES = [
  { value: '1h', label: 'Last hour', seconds: 3600, step: 60, steps: '1-minute buckets' },
  { value: '24h', label: 'Last 24 hours', seconds: 86400, step: 900, steps: '15-minute buckets' },
  { value: '7d', label: 'Last 7 days', seconds: 7 * 86400, step: 3600, steps: 'hourly buckets' },
];
/** Series colours (a canvas cannot read the stylesheet's variables); "other" is grey. */
const COLORS = ['#3b5bdb', '#e8590c', '#2b8a3e', '#c92a2a', '#7048e8', '#0c8599', '#d6336c', '#a27400'];
const OTHER_COLOR = '#868e96';
const AXIS = { stroke: '#56606b', grid: { stroke: '#eceef1', width: 1 }, ticks: { stroke: '#e3e6ea', width: 1 } };
const CHARTS = [
  { metric: 'calls', title: 'Calls', unit: 'calls per bucket', wide: true },
  { metric: 'errors', title: 'Errors', unit: 'failed calls per bucket' },
  { metric: 'p95', title: 'p95 latency', unit: 'ms', otherUnit: `ms; "${OTHER}" is the highest p95 among the rest` },
];
const CHART_HEIGHT = 220;
/** Tick steps of the count axes: whole numbers only. */
const COUNT_STEPS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6];

let library = null;

/** uPlot and its stylesheet, loaded once (a classic script defining `window.uPlot`). */
function loadUplot() {
  library ??= Promise.all([
    new Promise((resolve, reject) => {
      document.head.append(h('link', {
        rel: 'stylesheet', href: `${BASE}vendor/uplot/uPlot.min.css`, onload: resolve, onerror: reject,
      }));
    }),
    new Promise((resolve, reject) => {
      document.head.append(h('script', {
        src: `${BASE}vendor/uplot/uPlot.iife.min.js`, onload: () => resolve(window.uPlot), onerror: reject,
      }));
    }),
  ]).then(([, uPlot]) => uPlot, () => {
    library = null;
    throw new Error('cannot load the chart library (vendor/uplot)');
  });
  return library;
}

/**
 * `key:<id>` → the API key's name, to label principals. Empty when the keys
 * cannot be read: the principals are still shown, by id.
 */
async function keyNames() {
  try {
    const body = await accessApi.keys();
    return new Map((body?.keys ?? []).map((k) => [`key:${k.id}`, k.name]));
  } catch (err) {
    console.warn(`cannot read the API keys' names: ${err.message}`);
    return new Map();
  }
}

/** The key a row counts under: `server.tool` when grouped by tool. */
function keyOf(row, groupBy) {
  const key = groupBy === 'tool' ? `${row.server}.${row.tool}` : row[groupBy];
  return key == null || key === '' ? '(none)' : String(key);
}

function count(n) {
  return (n ?? 0).toLocaleString('en-US');
}

function ms(value) {
  if (value == null) return '—';
  return `${value < 10 ? Math.round(value * 100) / 100 : Math.round(value * 10) / 10} ms`;
}

/**
 * Chart data of the bucket rows: the series names (the [`TOP`] keys by calls,
 * then "other") and, per metric, uPlot's `[times, ...series]` over every
 * bucket of the window (no calls: 0, no latency: a gap).
 */
function chartData(rows, groupBy, start, end, step) {
  const sums = new Map();
  for (const row of rows) sums.set(keyOf(row, groupBy), (sums.get(keyOf(row, groupBy)) ?? 0) + (row.calls ?? 0));
  const ranked = [...sums].sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0])).map(([key]) => key);
  const top = ranked.slice(0, TOP);
  const names = ranked.length > TOP ? [...top, OTHER] : top;
  const slot = new Map(top.map((key, i) => [key, i]));
  const buckets = Math.max(1, Math.ceil((end - start) / step));
  const times = Array.from({ length: buckets }, (_, i) => start + i * step);
  const filled = (value) => names.map(() => new Array(buckets).fill(value));
  const calls = filled(0);
  const errors = filled(0);
  const p95 = filled(null);
  for (const row of rows) {
    const i = Math.floor((Date.parse(row.time) / 1000 - start) / step);
    if (!(i >= 0 && i < buckets)) continue;
    const s = slot.get(keyOf(row, groupBy)) ?? names.length - 1;
    calls[s][i] += row.calls ?? 0;
    errors[s][i] += row.errors ?? 0;
    if (row.p95_ms != null) p95[s][i] = Math.max(p95[s][i] ?? 0, row.p95_ms);
  }
  return { names, data: { calls: [times, ...calls], errors: [times, ...errors], p95: [times, ...p95] } };
}

/**
 * uPlot options of one chart of `step`-second buckets; `label(key)` names a
 * series.
 */
function chartOptions(uPlot, { metric, names, width, label, step }) {
  const latency = metric === 'p95';
  return {
    width,
    height: CHART_HEIGHT,
    cursor: { drag: { x: false, y: false } },
    legend: { live: true },
    scales: {
      // Through the end of the last bucket, so the current one is not on the edge.
      x: { time: true, range: (u, min, max) => [min, max + step] },
      y: { range: (u, min, max) => uPlot.rangeNum(0, Math.max(max ?? 0, latency ? 1 : 2), 0.1, true) },
    },
    axes: [
      { ...AXIS },
      latency
        ? { ...AXIS, size: 64, values: (u, ticks) => ticks.map((v) => `${Math.round(v * 1000) / 1000} ms`) }
        // Counts have whole ticks only.
        : { ...AXIS, size: 56, incrs: COUNT_STEPS, values: (u, ticks) => ticks.map(count) },
    ],
    series: [
      // The legend shows values only while the pointer is over a bucket.
      { label: 'Time', value: (u, t) => (t == null ? '' : formatTime(new Date(t * 1000).toISOString()).slice(0, 16)) },
      ...names.map((name, i) => {
        const other = name === OTHER && i === names.length - 1 && names.length > TOP;
        const stroke = other ? OTHER_COLOR : COLORS[i % COLORS.length];
        return {
          label: label(name),
          stroke,
          width: 2,
          ...(other ? { dash: [6, 4] } : {}),
          spanGaps: false,
          // A latency bucket between two empty ones is a lone point.
          // Counts are drawn for every bucket (0 when none): lines suffice.
          points: latency ? { show: true, size: 6, fill: stroke } : { show: false },
          value: (u, v) => (v == null ? '' : latency ? ms(v) : count(v)),
        };
      }),
    ],
  };
}

export function usagePage() {
  const params = new URLSearchParams(location.search);
  const state = {
    groupBy: GROUPS.some((g) => g.value === params.get('group_by')) ? params.get('group_by') : 'server',
    range: RANGES.find((r) => r.value === params.get('range')) ?? RANGES[0],
  };
  const updated = h('span', { class: 'updated small muted', testid: 'refreshed' });
  const groupSelect = h('select', {
    id: 'usage-group-by', testid: 'usage-group-by',
    onchange: () => { state.groupBy = groupSelect.value; changed(); },
  }, GROUPS.map((g) => h('option', { value: g.value }, g.label)));
  groupSelect.value = state.groupBy;
  const rangeButtons = RANGES.map((range) => h('button', {
    type: 'button', class: 'btn btn-small', testid: 'usage-range', dataset: { range: range.value },
    'aria-pressed': String(range === state.range),
    onclick: () => { state.range = range; changed(); },
  }, range.label));
  const windowLabel = h('span', { class: 'small muted', testid: 'usage-window' });

  const stats = h('div', { class: 'stats' });
  const truncated = h('div', { class: 'banner banner-warn', testid: 'usage-truncated', hidden: true },
    'This window has more rows than the registry sends at once, so some calls are missing here: choose a shorter time range or a coarser grouping.');
  const empty = h('div', { hidden: true });
  const chartBoxes = CHARTS.map((c) => {
    const plot = h('div', { class: 'usage-plot', testid: 'usage-chart', dataset: { metric: c.metric } });
    const unit = h('span', { class: 'small muted' }, c.unit);
    const card = h('section', { class: `card usage-chart${c.wide ? ' wide' : ''}` },
      h('div', { class: 'card-head' }, h('h2', {}, c.title), unit),
      plot);
    return { ...c, card, plot, unitEl: unit, chart: null };
  });
  const charts = h('div', { class: 'usage-charts', hidden: true }, chartBoxes.map((c) => c.card));
  const table = h('div', { hidden: true });
  const body = h('div', {}, loading('Loading usage…'));
  const el = h('div', { class: 'usage', testid: 'usage-page' },
    h('div', { class: 'page-head' },
      h('div', {}, h('h1', {}, 'Usage'),
        h('div', { class: 'sub' }, 'Tool calls through the workers, as they report them every few seconds: calls, errors and p95 latency over time.')),
      h('div', { class: 'actions' }, updated,
        h('button', { type: 'button', class: 'btn btn-small', testid: 'refresh', onclick: () => load() }, 'Refresh'))),
    h('div', { class: 'toolbar' },
      h('label', { for: 'usage-group-by', class: 'small muted' }, 'Group by'), groupSelect,
      h('div', { class: 'segmented', role: 'group', 'aria-label': 'Time range' }, rangeButtons),
      h('span', { class: 'spacer' }), windowLabel),
    body);

  let timer = null;
  let disposed = false;
  let loaded = false;
  /** Answers to an older request (before a change of group or range) are dropped. */
  let generation = 0;
  let lastTable = '';
  let seriesKey = '';

  const resize = new ResizeObserver(() => {
    for (const c of chartBoxes) c.chart?.setSize({ width: plotWidth(c), height: CHART_HEIGHT });
  });
  resize.observe(charts);

  function plotWidth(c) {
    return Math.max(280, c.plot.clientWidth);
  }

  /** The group or range changed: keep the address in step, show the old data dimmed until the new arrives. */
  function changed() {
    const query = new URLSearchParams(location.search);
    query.set('group_by', state.groupBy);
    query.set('range', state.range.value);
    history.replaceState(history.state, '', `${location.pathname}?${query}`);
    for (const b of rangeButtons) b.setAttribute('aria-pressed', String(b.dataset.range === state.range.value));
    body.classList.add('stale');
    load();
  }

  async function load() {
    clearTimeout(timer);
    const mine = ++generation;
    const { groupBy, range } = state;
    // Whole buckets: the window starts on a bucket boundary.
    const end = Math.floor(Date.now() / 1000);
    const start = Math.floor((end - range.seconds) / range.step) * range.step;
    try {
      const span = { groupBy, since: start * 1000, until: end * 1000 };
      const [series, totals, uPlot, names] = await Promise.all([
        usageApi({ ...span, stepS: range.step }),
        usageApi(span),
        loadUplot(),
        groupBy === 'principal' ? keyNames() : new Map(),
      ]);
      if (disposed || mine !== generation) return;
      if (!loaded) replace(body, truncated, stats, empty, charts, table);
      loaded = true;
      body.classList.remove('stale');
      updated.textContent = `Updated ${new Date().toLocaleTimeString()}`;
      windowLabel.textContent = `${formatTime(new Date(start * 1000).toISOString()).slice(0, 16)} – ${formatTime(new Date(end * 1000).toISOString()).slice(0, 16)}, ${range.steps}`;
      truncated.hidden = !(series?.truncated || totals?.truncated);
      const label = (key) => (names.has(key) ? `${names.get(key)} (${key})` : key);
      draw(uPlot, { groupBy, range, start, end, names, label }, series?.rows ?? [], totals?.rows ?? []);
    } catch (err) {
      if (disposed || mine !== generation) return;
      body.classList.remove('stale');
      if (!loaded) {
        replace(body, stateBox({
          title: 'Cannot load usage', text: err.message, kind: 'error', testid: 'error-state',
          actions: [h('button', { type: 'button', class: 'btn', onclick: () => load() }, 'Retry')],
        }));
      } else {
        updated.textContent = `Refresh failed: ${err.message}`;
      }
    }
    if (!disposed && mine === generation) timer = setTimeout(load, REFRESH_MS);
  }

  /** Draws one answer: `view` is what was asked and how keys are named. */
  function draw(uPlot, view, bucketRows, totalRows) {
    const { groupBy, range, start, end } = view;
    const sum = (field) => totalRows.reduce((n, row) => n + (row[field] ?? 0), 0);
    const group = GROUPS.find((g) => g.value === groupBy);
    replace(stats,
      stat('Calls', count(sum('calls')), 'usage-total-calls'),
      stat('Errors', count(sum('errors')), 'usage-total-errors'),
      stat('Rate limited', count(sum('rate_limited')), 'usage-total-rate-limited'),
      stat(group.plural, count(totalRows.length), 'usage-key-count'));
    const none = totalRows.length === 0 && bucketRows.length === 0;
    empty.hidden = !none;
    charts.hidden = none;
    table.hidden = none;
    if (none) {
      replace(empty, stateBox({
        title: `No tool calls in the ${range.label.toLowerCase()}`,
        text: 'Calls through the workers show here within seconds of being made (workers report their usage every few seconds).',
        testid: 'empty-state',
      }));
      return;
    }
    drawCharts(uPlot, chartData(bucketRows, groupBy, start, end, range.step), view);
    drawTable(group, totalRows, view.names);
  }

  function drawCharts(uPlot, { names, data }, { groupBy, range, label }) {
    const key = JSON.stringify([groupBy, range.value, names.map(label)]);
    const rebuild = key !== seriesKey;
    seriesKey = key;
    for (const c of chartBoxes) {
      if (rebuild || !c.chart) {
        c.chart?.destroy();
        const options = chartOptions(uPlot, { metric: c.metric, names, width: plotWidth(c), label, step: range.step });
        c.chart = new uPlot(options, data[c.metric], c.plot);
      } else {
        c.chart.setData(data[c.metric]);
      }
      c.plot.dataset.series = String(names.length);
      c.unitEl.textContent = names.length > TOP ? (c.otherUnit ?? c.unit) : c.unit;
    }
  }

  /** The totals; `names` holds the API keys' names (`key:<id>` → name). */
  function drawTable(group, rows, names) {
    const sorted = [...rows].sort((a, b) => (b.calls ?? 0) - (a.calls ?? 0)
      || keyOf(a, group.value).localeCompare(keyOf(b, group.value)));
    const snapshot = JSON.stringify([group.value, sorted, [...names]]);
    if (snapshot === lastTable) return;
    lastTable = snapshot;
    replace(table, h('div', { class: 'table-wrap' },
      h('table', { testid: 'usage-table' },
        h('thead', {}, h('tr', {}, h('th', {}, group.label), h('th', { class: 'num' }, 'Calls'),
          h('th', { class: 'num' }, 'Errors'), h('th', { class: 'num', title: 'Calls refused by a rate limit' }, 'Rate limited'),
          h('th', { class: 'num' }, 'p50'), h('th', { class: 'num' }, 'p95'))),
        h('tbody', {}, sorted.map((row) => h('tr', { testid: 'usage-row', dataset: { key: keyOf(row, group.value) } },
          keyCell(keyOf(row, group.value), names),
          h('td', { class: 'num', testid: 'usage-calls' }, count(row.calls)),
          h('td', { class: 'num', testid: 'usage-errors' }, count(row.errors)),
          h('td', { class: 'num', testid: 'usage-rate-limited' }, count(row.rate_limited)),
          h('td', { class: 'num' }, ms(row.p50_ms)),
          h('td', { class: 'num' }, ms(row.p95_ms))))))));
  }

  function keyCell(key, names) {
    if (!names.has(key)) return h('td', { class: 'mono wrap-any', testid: 'usage-key' }, key);
    return h('td', { class: 'wrap-any', testid: 'usage-key' },
      h('span', { class: 'primary', testid: 'usage-key-name' }, names.get(key)), ' ',
      h('span', { class: 'secondary mono' }, key));
  }

  function stat(label, value, testid) {
    return h('div', { class: 'stat', testid }, h('div', { class: 'v' }, value), h('div', { class: 'l' }, label));
  }

  load();
  return {
    el,
    dispose() {
      disposed = true;
      clearTimeout(timer);
      resize.disconnect();
      for (const c of chartBoxes) c.chart?.destroy();
    },
  };
}
