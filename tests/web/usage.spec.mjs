// Browser test of the web admin's Usage page (issue #25) in Debian's
// Chromium, driven by playwright-core. Run by tests/e2e/usage_browser.rs
// (`run_browser_script`) as
//
//   node tests/web/usage.spec.mjs
//
// against a registry whose workers have reported the tool calls the driver
// made; QUIVER_USAGE_EXPECT holds what the registry's usage API answered for
// them, which the page must show exactly. The script signs in as a viewer on
// a deep link to the page grouped by principal, checks the totals table
// (principals named by their API key's name), that the three charts (calls,
// errors, p95) drew one series per principal on their canvases, that a
// refresh redraws the same charts (no rebuild), then switches to servers and
// to the 24-hour range. Environment:
//   QUIVER_REGISTRY_URL      http://host:port of the registry's HTTP listener
//   QUIVER_VIEWER_TOKEN      the registry's viewer token
//   QUIVER_USAGE_EXPECT      {"principal": {key: {calls, errors}}, "server": {...},
//                            "key_names": {"key:<id>": name}}
//   QUIVER_SCREENSHOTS       screenshot directory (`usage.png`, `usage-servers.png`)
//   QUIVER_TEST_CHROMIUM     Chromium binary (default /usr/bin/chromium)
//   QUIVER_TEST_NODE_MODULES node_modules holding playwright-core
// Prints one line per step; exits 0 when all passed, 1 (after a screenshot
// `usage-failure.png` and the reason) on the first failure.

import assert from 'node:assert/strict';

import { need, tid, until, expectCount, run } from './browser.mjs';

const SCRIPT = 'usage.spec.mjs';
const REGISTRY = need(SCRIPT, 'QUIVER_REGISTRY_URL').replace(/\/$/, '');
const VIEWER = need(SCRIPT, 'QUIVER_VIEWER_TOKEN');
const EXPECT = JSON.parse(need(SCRIPT, 'QUIVER_USAGE_EXPECT'));
const SHOTS = need(SCRIPT, 'QUIVER_SCREENSHOTS');
const METRICS = ['calls', 'errors', 'p95'];
/** The page refreshes every 10 s; one refresh must come within this. */
const REFRESH_TIMEOUT_MS = 15000;

let page;

/** The totals table as `{key: {calls, errors}}`, in the order shown. */
async function table() {
  return page.locator(tid('usage-row')).evaluateAll((rows) => rows.map((row) => ({
    key: row.dataset.key,
    calls: Number(row.querySelector('[data-testid="usage-calls"]').textContent.replace(/,/g, '')),
    errors: Number(row.querySelector('[data-testid="usage-errors"]').textContent.replace(/,/g, '')),
  })));
}

/** Waits until the table shows exactly `expected` (`{key: {calls, errors}}`), sorted by calls. */
async function expectTable(expected) {
  const want = Object.entries(expected)
    .map(([key, { calls, errors }]) => ({ key, calls, errors }))
    .sort((a, b) => b.calls - a.calls || a.key.localeCompare(b.key));
  await until(`the totals table to show ${JSON.stringify(want)}`, async () => {
    const got = await table();
    return JSON.stringify(got) === JSON.stringify(want) ? got : null;
  });
  return want;
}

/**
 * Per chart: the legend's series labels, and how many canvas pixels have
 * each series' colour (read from its legend marker), so a series counts as
 * drawn only when its line or points are on the canvas.
 */
async function charts() {
  return page.locator(tid('usage-chart')).evaluateAll((plots) => plots.map((plot) => {
    const canvas = plot.querySelector('canvas');
    const pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
    const series = [...plot.querySelectorAll('.u-legend .u-series')].slice(1).map((row) => {
      const [r, g, b] = getComputedStyle(row.querySelector('.u-marker')).borderColor.match(/\d+/g).map(Number);
      let painted = 0;
      for (let i = 0; i < pixels.length; i += 4) {
        const close = Math.abs(pixels[i] - r) + Math.abs(pixels[i + 1] - g) + Math.abs(pixels[i + 2] - b) < 24;
        if (close && pixels[i + 3] > 200) painted += 1;
      }
      return { label: row.querySelector('.u-label').textContent, painted };
    });
    return { metric: plot.dataset.metric, width: canvas.width, height: canvas.height, series };
  }));
}

/**
 * Waits until each chart has one series per key of `ranked`, in that order,
 * each on its canvas; `names` maps a key to the name its label starts with.
 */
async function expectCharts(ranked, names = {}) {
  const labels = ranked.map((row) => (names[row.key] ? `${names[row.key]} (${row.key})` : row.key));
  return until(`three charts with the series ${labels.join(', ')}`, async () => {
    const got = await charts();
    if (JSON.stringify(got.map((c) => c.metric)) !== JSON.stringify(METRICS)) return null;
    for (const chart of got) {
      if (JSON.stringify(chart.series.map((s) => s.label)) !== JSON.stringify(labels)) return null;
      assert.ok(chart.width >= 280 && chart.height >= 150, `${chart.metric}: a canvas of ${chart.width}×${chart.height}`);
      if (chart.metric === 'p95') {
        // Latency points of keys called in the same buckets may cover each other.
        const painted = chart.series.reduce((n, series) => n + series.painted, 0);
        if (painted < 20) throw new Error(`p95: no latency drawn (${JSON.stringify(chart.series)})`);
        continue;
      }
      for (const [i, series] of chart.series.entries()) {
        // A key without errors still has its line at 0.
        if (series.painted < 20) throw new Error(`${chart.metric}: series ${series.label} is not drawn (${series.painted} pixels of its colour; ${JSON.stringify(ranked[i])})`);
      }
    }
    return got;
  });
}

await run('usage', SHOTS, async ({ page: p, step, shot, log }) => {
  page = p;

  await step('sign in as the viewer on a deep link to the Usage page, grouped by principal', async () => {
    await page.goto(`${REGISTRY}/admin/usage?group_by=principal`);
    await page.fill(tid('token-input'), VIEWER);
    await page.click(tid('sign-in'));
    await page.waitForSelector(tid('usage-page'));
    assert.equal(await page.getAttribute(tid('nav-usage'), 'class'), 'active');
    assert.equal(await page.inputValue(tid('usage-group-by')), 'principal');
    assert.equal(await page.getAttribute(`${tid('usage-range')}[data-range="1h"]`, 'aria-pressed'), 'true');
  });

  let ranked;
  await step('the totals show the exact calls and errors per principal', async () => {
    ranked = await expectTable(EXPECT.principal);
    const total = ranked.reduce((n, row) => n + row.calls, 0);
    assert.equal(await page.textContent(`${tid('usage-total-calls')} .v`), total.toLocaleString('en-US'));
    const errors = ranked.reduce((n, row) => n + row.errors, 0);
    assert.equal(await page.textContent(`${tid('usage-total-errors')} .v`), errors.toLocaleString('en-US'));
    assert.equal(await page.textContent(`${tid('usage-key-count')} .v`), String(ranked.length));
    for (const [key, name] of Object.entries(EXPECT.key_names)) {
      assert.equal(await page.textContent(`${tid('usage-row')}[data-key="${key}"] ${tid('usage-key-name')}`), name);
    }
    log(`table: ${JSON.stringify(await table())}`);
  });

  await step('three charts draw one series per principal', async () => {
    const got = await expectCharts(ranked, EXPECT.key_names);
    log(`charts: ${JSON.stringify(got.map((c) => [c.metric, c.series.map((s) => `${s.label}:${s.painted}px`)]))}`);
    await expectCount(page.locator(tid('empty-state')), 0);
    await shot('usage');
  });

  await step('a refresh redraws the same charts in place', async () => {
    const before = await page.textContent(tid('refreshed'));
    await page.locator(`${tid('usage-chart')} canvas`).evaluateAll((canvases) => {
      canvases.forEach((canvas) => { canvas.dataset.kept = 'yes'; });
    });
    await until('the next refresh', async () => (await page.textContent(tid('refreshed'))) !== before, REFRESH_TIMEOUT_MS);
    const kept = await page.locator(`${tid('usage-chart')} canvas[data-kept="yes"]`).count();
    assert.equal(kept, METRICS.length, 'the charts were rebuilt by a refresh that brought no new series');
    await expectTable(EXPECT.principal);
  });

  await step('group by server: exact totals per server and one series each', async () => {
    await page.selectOption(tid('usage-group-by'), 'server');
    const servers = await expectTable(EXPECT.server);
    await expectCharts(servers);
    assert.equal(new URL(page.url()).searchParams.get('group_by'), 'server');
    await shot('usage-servers');
  });

  await step('the 24-hour range holds the same calls', async () => {
    await page.click(`${tid('usage-range')}[data-range="24h"]`);
    await until('the 24-hour range to be selected', async () =>
      (await page.getAttribute(`${tid('usage-range')}[data-range="24h"]`, 'aria-pressed')) === 'true');
    await until('the window to span 15-minute buckets', async () =>
      (await page.textContent(tid('usage-window')))?.includes('15-minute'));
    const servers = await expectTable(EXPECT.server);
    await expectCharts(servers);
    assert.equal(new URL(page.url()).searchParams.get('range'), '24h');
  });
}, { origin: REGISTRY });
