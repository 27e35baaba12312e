// Browser test of the web admin's OAuth page in Debian's Chromium, driven by
// playwright-core (never a downloaded browser). Run by tests/e2e (see
// `run_browser_script` in tests/e2e/web_admin.rs) as
//
//   node tests/web/oauth.spec.mjs
//
// with a registry whose OAuth connection QUIVER_OAUTH_CONNECTION exists:
//
// - default: the connection is `not_connected`; the script presses Connect,
//   follows the authorization server (which approves at once) back to
//   `/admin/oauth?connected=<name>` and waits (30 s at most) for the row to
//   read `connected`;
// - QUIVER_OAUTH_EXPECT=needs_reconsent: only checks the row reads
//   `needs_reconsent` with a Reconnect button.
//
// Either way no token may show on the page. Environment:
//   QUIVER_REGISTRY_URL      http://host:port of the registry's HTTP listener
//   QUIVER_ADMIN_TOKEN       the admin token
//   QUIVER_OAUTH_CONNECTION  the connection's name
//   QUIVER_OAUTH_EXPECT      optional: `needs_reconsent`
//   QUIVER_SCREENSHOTS       screenshot directory (or QUIVER_SCREENSHOT_DIR)
//   QUIVER_TEST_CHROMIUM     Chromium binary (default /usr/bin/chromium)
//   QUIVER_TEST_NODE_MODULES node_modules holding playwright-core
// Prints one line per step; exits 0 when all passed, 1 (after a screenshot
// `oauth-failure.png` and the reason) on the first failure.

import assert from 'node:assert/strict';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { need as needOf, tid, until, fatal, run } from './browser.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const need = (name) => needOf('oauth.spec.mjs', name);

const REGISTRY = need('QUIVER_REGISTRY_URL').replace(/\/$/, '');
const ADMIN = need('QUIVER_ADMIN_TOKEN');
const NAME = need('QUIVER_OAUTH_CONNECTION');
const EXPECT = process.env.QUIVER_OAUTH_EXPECT || 'connected';
const SHOTS = process.env.QUIVER_SCREENSHOTS || process.env.QUIVER_SCREENSHOT_DIR
  || path.join(here, '../../target/web-admin-screenshots/oauth');
const ADMIN_URL = `${REGISTRY}/admin/`;
/** How long the round trip through the authorization server may take. */
const CONNECT_TIMEOUT_MS = 30000;
/** The registry's tokens are 43+ characters of base64url. */
const TOKEN_LIKE = /[A-Za-z0-9_-]{43,}/;

if (!['connected', 'needs_reconsent'].includes(EXPECT)) {
  console.error(`oauth.spec.mjs: QUIVER_OAUTH_EXPECT must be needs_reconsent (or unset), not ${JSON.stringify(EXPECT)}`);
  process.exit(2);
}

let page;

const statusBadge = () => page.locator(tid(`oauth-status-${NAME}`));
const connectButton = () => page.locator(tid(`oauth-connect-${NAME}`));

/** The row's status text, or null while the page is elsewhere or loading. */
async function statusText() {
  if (new URL(page.url()).pathname.replace(/\/$/, '') !== '/admin/oauth') return null;
  const badge = statusBadge();
  if ((await badge.count()) === 0) return null;
  return (await badge.first().textContent({ timeout: 500 }))?.trim() ?? null;
}

/** The row's status, once shown, is exactly `status`. */
async function expectStatus(status) {
  const text = await until(`the status of ${NAME}`, statusText);
  assert.equal(text, status, `the status badge of ${NAME}`);
}

/** No token on the page: nothing token-shaped in its text, no token field names. */
async function assertNoToken() {
  const { text, html } = await page.evaluate(() => ({
    text: document.body.innerText,
    html: document.documentElement.outerHTML,
  }));
  const match = text.match(TOKEN_LIKE);
  assert.equal(match, null, `the page shows a token-like string: ${match?.[0]}`);
  for (const word of ['access_token', 'refresh_token']) {
    assert.ok(!text.includes(word) && !html.includes(word), `the page mentions ${word}`);
  }
  // The REST view the page is built from carries no token either.
  const response = await fetch(`${REGISTRY}/admin/api/oauth/connections/${encodeURIComponent(NAME)}`, {
    headers: { Authorization: `Bearer ${ADMIN}`, Accept: 'application/json' },
  });
  const body = await response.text();
  assert.equal(response.status, 200, `GET the connection: ${body}`);
  for (const word of ['access_token', 'refresh_token']) {
    assert.ok(!body.includes(word), `the connection's view mentions ${word}: ${body}`);
  }
  const view = JSON.parse(body);
  for (const key of ['client_secret', 'token', 'id_token']) {
    assert.ok(!(key in view), `the connection's view has ${key}: ${body}`);
  }
}

async function signInAndOpen() {
  await page.goto(ADMIN_URL);
  // A registry without credentials (dev) opens straight away.
  const first = await until('the sign-in page or the admin', async () => {
    if (await page.locator(tid('sign-in-page')).count()) return 'sign-in';
    if (await page.locator(tid('nav-servers')).count()) return 'signed-in';
    return null;
  });
  if (first === 'sign-in') {
    await page.fill(tid('token-input'), ADMIN);
    await page.click(tid('sign-in'));
    await until('the admin role', async () => (await page.locator(tid('role-badge')).getAttribute('data-role', { timeout: 500 })) === 'admin');
  }
  await page.click(tid('nav-oauth'));
  await page.locator(tid('oauth-page')).waitFor();
  assert.equal(new URL(page.url()).pathname, '/admin/oauth');
  await until(`the row of ${NAME}`, async () => {
    if (await page.locator(tid('oauth-empty')).count()) throw fatal(`no connection is listed (${NAME} expected)`);
    if (await page.locator(tid('error-state')).count()) throw fatal(`the page cannot load: ${await page.locator(tid('error-state')).textContent()}`);
    return (await statusBadge().count()) > 0;
  });
}

async function scenarios({ step, shot }) {
  await step(`sign in and open the OAuth page: ${NAME} is listed`, signInAndOpen);

  if (EXPECT === 'needs_reconsent') {
    await step(`${NAME} needs re-consent, with a Reconnect button`, async () => {
      await expectStatus('needs_reconsent');
      assert.equal((await connectButton().textContent())?.trim(), 'Reconnect');
      assert.ok(await connectButton().isEnabled(), 'Reconnect is enabled');
      await shot('oauth-needs-reconsent');
      await assertNoToken();
    });
    return;
  }

  await step(`${NAME} is not connected yet`, async () => {
    await expectStatus('not_connected');
    assert.equal((await connectButton().textContent())?.trim(), 'Connect');
    await shot('oauth-01-not-connected');
    await assertNoToken();
  });

  await step('Connect: through the authorization server and back, connected', async () => {
    await connectButton().click();
    await until(`${NAME} connected, back on /admin/oauth`, async () => {
      // A refused callback: the registry's page names the failed step.
      const failed = page.locator('#oauth-error');
      if (await failed.count()) throw fatal(`the OAuth callback failed: ${await failed.textContent()}`);
      const refused = page.locator(tid('oauth-connect-error'));
      if (await refused.count() && await refused.isVisible()) throw fatal(`Connect failed: ${await refused.textContent()}`);
      return (await statusText()) === 'connected';
    }, CONNECT_TIMEOUT_MS);
    const url = new URL(page.url());
    assert.equal(url.pathname, '/admin/oauth');
    assert.ok(!url.searchParams.has('connected'), `the ?connected= query is dropped: ${url}`);
    await until(`the toast "Connected ${NAME}"`, async () =>
      (await page.locator(tid('toast')).allTextContents()).some((t) => t.includes(`Connected ${NAME}`)), 3000);
    assert.equal((await connectButton().textContent())?.trim(), 'Reconnect');
    await shot('oauth-02-connected');
    await assertNoToken();
  });
}

await run('oauth', SHOTS, async (browser) => {
  ({ page } = browser);
  await scenarios(browser);
}, { origin: REGISTRY });
