// Browser test of a per-user OAuth consent link (issue #24) in Debian's
// Chromium, driven by playwright-core (never a downloaded browser). Run by
// tests/e2e (see `run_browser_script` in tests/e2e/web_admin.rs) as
//
//   node tests/web/consent.spec.mjs
//
// with the link a refused tool call handed out (`authorization_url` of an
// `mcp_authorization_required` error) and a test authorization server
// showing its consent page (`quiver-testkit-oauth --consent-page`). The
// script follows the link as the person would: the registry sends the
// browser on to the authorization server, where it types the user and
// approves; back at the registry it waits for the page saying the account
// is connected, with no token on it. Following the same link again must
// show the registry's refusal naming the `oauth link` step.
//
// Environment:
//   QUIVER_CONSENT_URL        the consent link
//   QUIVER_CONSENT_USER       the user to consent as
//   QUIVER_CONSENT_CONNECTION the connection the link is for
//   QUIVER_SCREENSHOTS        screenshot directory (or QUIVER_SCREENSHOT_DIR)
//   QUIVER_TEST_CHROMIUM      Chromium binary (default /usr/bin/chromium)
//   QUIVER_TEST_NODE_MODULES  node_modules holding playwright-core
// Prints one line per step; exits 0 when all passed, 1 (after a screenshot
// `consent-failure.png` and the reason) on the first failure.

import assert from 'node:assert/strict';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { need as needOf, until, fatal, run } from './browser.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const need = (name) => needOf('consent.spec.mjs', name);

const LINK = need('QUIVER_CONSENT_URL');
const USER = need('QUIVER_CONSENT_USER');
const NAME = need('QUIVER_CONSENT_CONNECTION');
const SHOTS = process.env.QUIVER_SCREENSHOTS || process.env.QUIVER_SCREENSHOT_DIR
  || path.join(here, '../../target/web-admin-screenshots/consent');
const REGISTRY = new URL(LINK).origin;
/** The link's secret: it may show in the address bar, never on a page. */
const SECRET = new URL(LINK).pathname.split('/').pop();
/** How long the round trip through the authorization server may take. */
const CONSENT_TIMEOUT_MS = 30000;
/** Tokens, codes and link secrets are 43+ characters of base64url or hex. */
const TOKEN_LIKE = /[A-Za-z0-9_-]{43,}/;

let page;

/** The registry's refusal page, if the browser is on one. */
async function refusal() {
  const failed = page.locator('#oauth-error');
  return (await failed.count()) ? (await failed.textContent())?.trim() : null;
}

/** No token, code or link secret on the page or in its address. */
async function assertNoToken() {
  const { text, html } = await page.evaluate(() => ({
    text: document.body.innerText,
    html: document.documentElement.outerHTML,
  }));
  const match = text.match(TOKEN_LIKE);
  assert.equal(match, null, `the page shows a token-like string: ${match?.[0]}`);
  for (const word of ['access_token', 'refresh_token', SECRET]) {
    assert.ok(!text.includes(word) && !html.includes(word), `the page mentions ${word === SECRET ? 'the link secret' : word}`);
  }
}

async function scenarios({ step, shot }) {
  await step('the link leads to the authorization server\'s consent form', async () => {
    await page.goto(LINK);
    await until('the consent form', async () => {
      const refused = await refusal();
      if (refused) throw fatal(`the registry refused the link: ${refused}`);
      return (await page.locator('#user').count()) > 0 && (await page.locator('#approve').count()) > 0;
    });
    assert.notEqual(new URL(page.url()).origin, REGISTRY, `the form is the authorization server's: ${page.url()}`);
    await shot('consent-form');
  });

  await step(`approve as ${USER}: back at the registry, connected to ${NAME}`, async () => {
    await page.fill('#user', USER);
    await page.click('#approve');
    const text = await until(`the page saying the account is connected to ${NAME}`, async () => {
      const refused = await refusal();
      if (refused) throw fatal(`the OAuth callback failed: ${refused}`);
      if (new URL(page.url()).origin !== REGISTRY) return null;
      const connected = page.locator('#oauth-connected');
      if ((await connected.count()) === 0) return null;
      return (await connected.textContent({ timeout: 500 }))?.trim();
    }, CONSENT_TIMEOUT_MS);
    assert.equal(await page.locator('#oauth-connected b').textContent(), NAME, `the page names the connection: ${text}`);
    const url = new URL(page.url());
    assert.equal(url.pathname, '/oauth/connected');
    assert.equal(url.searchParams.get('connection'), NAME);
    for (const param of ['code', 'state', 'iss']) {
      assert.ok(!url.searchParams.has(param), `the landing address drops ${param}: ${url}`);
    }
    assert.equal(url.href.match(TOKEN_LIKE), null, `the landing address holds a token-like string: ${url}`);
    await shot('consent-connected');
    await assertNoToken();
  });

  await step('the same link again: refused, naming the oauth link step', async () => {
    const response = await page.goto(LINK);
    assert.ok(response && response.status() >= 400, `a used link is refused (status ${response?.status()})`);
    const text = await until('the refusal page', refusal);
    assert.ok(text.includes('oauth link'), `the refusal names the step: ${text}`);
    assert.equal(new URL(page.url()).origin, REGISTRY, `no redirect to the authorization server: ${page.url()}`);
    await shot('consent-link-used');
    await assertNoToken();
  });
}

await run('consent', SHOTS, async (browser) => {
  ({ page } = browser);
  await scenarios(browser);
}, { origin: REGISTRY });
