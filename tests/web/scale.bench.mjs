// Browser benchmark of the web admin's server list (issue #25), in Debian's
// Chromium driven by playwright-core. Run by tests/e2e/web_admin_scale.rs,
// once per size, against a registry holding QUIVER_SCALE_RECORDS records
// (server ids `srv-00000`…) and a worker reporting to it:
//
//   node tests/web/scale.bench.mjs
//
// Measures, in the page's own clock (performance.now and event time stamps):
// - first rows: from DOMContentLoaded of /admin/servers (signed in) until
//   the first server rows are in the document and a frame was painted with
//   them, over LOADS loads;
// - keystroke: from a key's keydown in the search box until the rows show
//   the filter's result and a frame was painted, over KEYS keystrokes that
//   alternate between typing a digit (narrowing) and Backspace (every record
//   again);
// - at 1,000 records or more: that a periodic refresh with nothing changed
//   fetches the report but not the list, touches no row and keeps the scroll
//   position; and that the list shows pages of PAGE_SIZE rows.
// Prints the raw figures and writes them as JSON to QUIVER_SCALE_OUT
// (`{first_rows_ms: [...], keystroke_ms: [...], ...}`); the Rust test
// compares sizes and holds the goals.

import assert from 'node:assert/strict';
import fs from 'node:fs';

import { need as needOf, tid, until, expectText, run } from './browser.mjs';

const need = (name) => needOf('scale.bench.mjs', name);

const REGISTRY = need('QUIVER_REGISTRY_URL').replace(/\/$/, '');
const ADMIN = need('QUIVER_ADMIN_TOKEN');
const RECORDS = Number(need('QUIVER_SCALE_RECORDS'));
const OUT = need('QUIVER_SCALE_OUT');
const SHOTS = need('QUIVER_SCREENSHOT_DIR');

const ADMIN_URL = `${REGISTRY}/admin/`;
const LOADS = 3;
/** Rows on one page of the list (web-admin/js/servers.js). */
const PAGE_SIZE = 100;
const KEYS = ['1', '2', '3', '4', '5', '6'];
/** The list refreshes every 5 s (web-admin/js/servers.js). */
const REFRESH_MS = 5000;

/**
 * Installed before the page's own scripts on every load: records
 * DOMContentLoaded and the first painted frame holding a server row in
 * `window.__bench`.
 */
function firstRowsProbe() {
  const bench = { ready: null, rowsInDom: null, rowsPainted: null };
  window.__bench = bench;
  document.addEventListener('DOMContentLoaded', () => { bench.ready = performance.now(); });
  const observer = new MutationObserver(() => {
    if (bench.rowsInDom != null || !document.querySelector('[data-testid="server-row"]')) return;
    bench.rowsInDom = performance.now();
    observer.disconnect();
    // The frame that shows them: the task after the next animation frame.
    requestAnimationFrame(() => setTimeout(() => { bench.rowsPainted = performance.now(); }));
  });
  observer.observe(document, { childList: true, subtree: true });
}

/**
 * Watches the search box and the list (in the page): each keydown starts a
 * measurement that ends at the first painted frame after a server row (or
 * the no-match box) was added or removed.
 */
function keystrokeProbe() {
  const rowish = (node) => node.nodeType === 1
    && (node.matches('[data-testid="server-row"], [data-testid="no-match"]')
      || node.querySelector('[data-testid="server-row"], [data-testid="no-match"]'));
  const keys = [];
  let pending = null;
  window.__keys = keys;
  document.querySelector('[data-testid="server-search"]').addEventListener('keydown', (event) => {
    pending = { key: event.key, start: event.timeStamp };
  }, true);
  new MutationObserver((records) => {
    if (!pending || pending.dom != null) return;
    if (!records.some((r) => [...r.addedNodes, ...r.removedNodes].some(rowish))) return;
    const measuring = pending;
    measuring.dom = performance.now();
    requestAnimationFrame(() => setTimeout(() => {
      measuring.painted = performance.now();
      keys.push({ key: measuring.key, dom_ms: measuring.dom - measuring.start, ms: measuring.painted - measuring.start });
      pending = null;
    }));
  }).observe(document.querySelector('[data-testid="servers-page"]'), { childList: true, subtree: true });
}

const median = (values) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];
const round = (n) => Math.round(n * 10) / 10;

async function scenarios({ page, step, shot, log }) {
  const figures = { records: RECORDS, first_rows_ms: [], first_rows_in_dom_ms: [], keystroke_ms: [], keystroke_dom_ms: [], loads: [] };

  await step('sign in with the admin token', async () => {
    await page.goto(ADMIN_URL);
    await page.fill(tid('token-input'), ADMIN);
    await page.click(tid('sign-in'));
    await page.locator(tid('server-row')).first().waitFor({ timeout: 60000 });
  });

  await page.addInitScript(firstRowsProbe);
  await step(`first rows after page ready, ${LOADS} loads of ${RECORDS} records`, async () => {
    for (let i = 0; i < LOADS; i += 1) {
      await page.goto(`${ADMIN_URL}servers`, { waitUntil: 'domcontentloaded' });
      const bench = await until('the first rows painted', () => page.evaluate(() => {
        const b = window.__bench;
        return b?.rowsPainted != null && b.ready != null ? b : null;
      }), 60000);
      const resources = await page.evaluate(() => performance.getEntriesByType('resource')
        .filter((e) => /\/admin\/api\/(mcp\/servers|workers)/.test(e.name))
        .map((e) => ({ url: new URL(e.name).pathname + new URL(e.name).search, start: e.startTime, ms: e.duration, bytes: e.encodedBodySize })));
      // The rows are in the viewport, not only in the document.
      const top = await page.locator(tid('server-row')).first().evaluate((el) => el.getBoundingClientRect().top);
      assert.ok(top >= 0 && top < 900, `the first row is on screen (top ${top})`);
      figures.first_rows_ms.push(round(bench.rowsPainted - bench.ready));
      figures.first_rows_in_dom_ms.push(round(bench.rowsInDom - bench.ready));
      figures.loads.push({ ready_ms: round(bench.ready), resources: resources.map((r) => ({ ...r, start: round(r.start - bench.ready), ms: round(r.ms) })) });
      log(`load ${i + 1}: rows in DOM ${round(bench.rowsInDom - bench.ready)} ms, painted ${round(bench.rowsPainted - bench.ready)} ms after DOMContentLoaded; `
        + resources.map((r) => `${r.url} ${round(r.ms)} ms ${r.bytes} B`).join(', '));
    }
    await expectText(page.locator(tid('summary')), `${RECORDS.toLocaleString('en')} servers`);
  });

  if (RECORDS > PAGE_SIZE) {
    await step('the list shows one page at a time', async () => {
      assert.equal(await page.locator(tid('server-row')).count(), PAGE_SIZE);
      await expectText(page.locator(tid('page-info')), `1–${PAGE_SIZE} of ${RECORDS.toLocaleString('en')}`);
      await page.click(tid('page-next'));
      await page.locator(`${tid('server-row')}[data-server-id="srv-${String(PAGE_SIZE).padStart(5, '0')}"]`).waitFor();
      await page.evaluate(() => window.scrollTo(0, document.body.scrollHeight));
      await shot(`servers-${RECORDS}-pager`, { fullPage: false });
      await page.click(tid('page-first'));
      await page.locator(`${tid('server-row')}[data-server-id="srv-00000"]`).waitFor();
    });
  }

  await step(`search keystrokes over ${RECORDS} records`, async () => {
    await page.evaluate(keystrokeProbe);
    await page.focus(tid('server-search'));
    for (const key of KEYS) {
      for (const press of [key, 'Backspace']) {
        const before = await page.evaluate(() => window.__keys.length);
        await page.keyboard.press(press);
        await until(`rows after pressing ${press}`, () => page.evaluate((n) => window.__keys.length > n, before), 30000);
        if (press !== 'Backspace') {
          // A digit narrows the list to the records whose id holds it (no
          // other searched field of these records has digits but the
          // display name and URL, which repeat the id's number).
          const ids = await page.locator(tid('server-row')).evaluateAll((rows) => rows.map((r) => r.dataset.serverId));
          assert.ok(ids.length > 0 && ids.every((id) => id.includes(key)), `rows for ${key}: ${ids.slice(0, 5)}`);
        }
      }
    }
    const keys = await page.evaluate(() => window.__keys);
    figures.keystroke_ms = keys.map((k) => round(k.ms));
    figures.keystroke_dom_ms = keys.map((k) => round(k.dom_ms));
    log(`keystrokes (ms to painted rows): ${keys.map((k) => `${k.key} ${round(k.ms)}`).join(', ')}`);
    await shot(`servers-${RECORDS}`, { fullPage: false });
  });

  if (RECORDS >= 1000) {
    await step('a refresh with nothing changed fetches no list, redraws no row, keeps the scroll position', async () => {
      await page.evaluate(() => window.scrollTo(0, 600));
      const scrolled = await page.evaluate(() => window.scrollY);
      assert.ok(scrolled > 0, 'the list scrolls');
      const refreshed = await page.locator(tid('refreshed')).textContent();
      await page.evaluate(() => {
        performance.clearResourceTimings();
        window.__rowMutations = 0;
        new MutationObserver((records) => { window.__rowMutations += records.length; })
          .observe(document.querySelector('[data-testid="servers-table"]'), { childList: true, subtree: true, characterData: true, attributes: true });
      });
      // Wait until the page refreshed at least once after the probe.
      await until('a periodic refresh', async () => (await page.locator(tid('refreshed')).textContent()) !== refreshed, REFRESH_MS * 3);
      await page.waitForTimeout(200);
      assert.equal(await page.evaluate(() => window.__rowMutations), 0, 'the refresh touched rows');
      assert.equal(await page.evaluate(() => window.scrollY), scrolled, 'the scroll position moved');
      // The report's head revision did not move: the list was not fetched again.
      const fetched = await page.evaluate(() => performance.getEntriesByType('resource').map((e) => new URL(e.name).pathname));
      assert.ok(fetched.includes('/admin/api/workers'), `the refresh asked for the report: ${fetched}`);
      assert.ok(!fetched.includes('/admin/api/mcp/servers'), `the refresh fetched the list again: ${fetched}`);
    });
  }

  log(`figures: ${JSON.stringify({ first_rows_ms: figures.first_rows_ms, keystroke_ms: figures.keystroke_ms })}`);
  log(`median first rows ${median(figures.first_rows_ms)} ms, median keystroke ${median(figures.keystroke_ms)} ms (${RECORDS} records)`);
  fs.writeFileSync(OUT, JSON.stringify(figures, null, 2));
}

await run(`scale-${RECORDS}`, SHOTS, async (args) => scenarios(args));
