// What a browser script of tests/web needs around its scenarios:
// playwright-core (from QUIVER_TEST_NODE_MODULES, else the node_modules next
// to this file) driving Debian's Chromium with nothing allowed off the
// machine, page errors collected, polling, steps and screenshots.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const modules = process.env.QUIVER_TEST_NODE_MODULES || path.join(here, 'node_modules');
const { chromium } = createRequire(path.join(path.dirname(modules), 'package.json'))('playwright-core');
const CHROMIUM = process.env.QUIVER_TEST_CHROMIUM || '/usr/bin/chromium';

/** `[data-testid="<id>"]`. */
export const tid = (id) => `[data-testid="${id}"]`;

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** The environment variable `name`; exits with status 2 naming it when unset. */
export function need(script, name) {
  const value = process.env[name];
  if (!value) {
    console.error(`${script}: ${name} is not set (run it through tests/e2e, run_browser_script)`);
    process.exit(2);
  }
  return value;
}

/** An error that ends an [`until`] wait at once (other errors count as "not yet"). */
export function fatal(message) {
  const err = new Error(message);
  err.fatal = true;
  return err;
}

/** Polls `probe` until it returns a truthy value. */
export async function until(what, probe, timeout = 10000) {
  const start = Date.now();
  let last = null;
  for (;;) {
    try {
      const value = await probe();
      if (value) return value;
    } catch (err) {
      if (err.fatal) throw err;
      last = err;
    }
    if (Date.now() - start > timeout) {
      throw new Error(`timed out after ${timeout} ms waiting for ${what}${last ? `: ${last.message}` : ''}`);
    }
    await sleep(100);
  }
}

/** The text of `locator`'s first match, once it contains `text`. */
export async function expectText(locator, text, timeout = 10000) {
  return until(`${locator} to contain ${JSON.stringify(text)}`, async () => {
    const got = await locator.first().textContent({ timeout: 500 });
    return got?.includes(text) ? got : null;
  }, timeout);
}

/** Waits until exactly `n` elements match `locator`. */
export async function expectCount(locator, n, timeout = 10000) {
  await until(`${locator} count ${n}`, async () => (await locator.count()) === n, timeout);
}

/** Waits until nothing matches `locator`. */
export async function expectHidden(locator, timeout = 10000) {
  await until(`${locator} to be absent`, async () => (await locator.count()) === 0, timeout);
}

/**
 * Runs `scenarios({page, context, step, shot, log})` in a fresh headless
 * Chromium page, logging as `[<tag> 1.2s] …`; `shot(name, {fullPage})` saves
 * `<shots>/<name>.png`. Fails (exit status 1, after a `<tag>-failure.png`
 * screenshot and the page's problems) when a scenario throws, a page logs an
 * error (with `origin`, only pages of that origin count: not those of a
 * test authorization server), or the browser tries to reach a host that is
 * not loopback.
 */
export async function run(tag, shots, scenarios, { origin } = {}) {
  const started = Date.now();
  const elapsed = () => `${((Date.now() - started) / 1000).toFixed(1)}s`;
  const log = (line) => console.log(`[${tag} ${elapsed()}] ${line}`);
  const problems = [];
  const external = [];
  let page;
  const step = async (name, fn) => {
    const t = Date.now();
    log(`▶ ${name}`);
    await fn();
    log(`✓ ${name} (${Date.now() - t} ms)`);
  };
  const shot = async (name, { fullPage = true } = {}) => {
    fs.mkdirSync(shots, { recursive: true });
    // Sticky bars would be painted mid-page in a full-page screenshot, and
    // toasts of earlier steps only clutter it.
    await page.evaluate((full) => {
      if (full) document.querySelectorAll('.topbar, .form-footer').forEach((el) => { el.style.position = 'static'; });
      document.querySelectorAll('.toasts').forEach((el) => { el.style.visibility = 'hidden'; });
    }, fullPage);
    await page.screenshot({ path: path.join(shots, `${name}.png`), fullPage });
    await page.evaluate(() => {
      document.querySelectorAll('.topbar, .form-footer').forEach((el) => { el.style.position = ''; });
      document.querySelectorAll('.toasts').forEach((el) => { el.style.visibility = ''; });
    });
  };
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', '--no-first-run', '--disable-dev-shm-usage', '--no-proxy-server'],
  });
  try {
    const context = await browser.newContext({ viewport: { width: 1360, height: 900 }, deviceScaleFactor: 1 });
    // Nothing may leave the machine: no CDN, no fonts, no telemetry.
    await context.route('**/*', (route) => {
      const host = new URL(route.request().url()).hostname;
      if (host === 'localhost' || host === '[::1]' || /^127\.\d+\.\d+\.\d+$/.test(host)) return route.continue();
      external.push(route.request().url());
      return route.abort();
    });
    page = await context.newPage();
    page.setDefaultTimeout(10000);
    page.on('pageerror', (err) => problems.push(`page error: ${err.message}`));
    page.on('console', (msg) => {
      // Refused API calls are logged by Chromium as failed resource loads;
      // they are part of the scenarios.
      if (msg.type() !== 'error' || msg.text().startsWith('Failed to load resource')) return;
      if (origin && !(msg.location()?.url ?? '').startsWith(origin)) return;
      problems.push(`console: ${msg.text()}`);
    });
    await scenarios({ page, context, step, shot, log });
    assert.deepEqual(problems, [], 'the page logged errors');
    assert.deepEqual(external, [], 'the page tried to reach other hosts');
    log(`all scenarios passed; screenshots in ${shots}`);
  } catch (err) {
    try {
      const failure = path.join(shots, `${tag}-failure.png`);
      fs.mkdirSync(shots, { recursive: true });
      await page?.screenshot({ path: failure, fullPage: true });
      log(`failure screenshot: ${failure} (at ${page?.url()})`);
    } catch { /* the page may be gone */ }
    if (problems.length) log(`page problems:\n  ${problems.join('\n  ')}`);
    console.error(`[${tag} ${elapsed()}] FAILED: ${err.stack ?? err}`);
    process.exitCode = 1;
  } finally {
    await browser.close();
  }
}
