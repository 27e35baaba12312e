// Browser test of signing in to the web admin with the organisation's
// identity provider, and of its Access page (issue #22), in Debian's
// Chromium. Run by tests/e2e/web_admin.rs (`run_browser_script`) as
//
//   node tests/web/signin.spec.mjs
//
// with a registry whose identity provider QUIVER_PROVIDER (issuer
// QUIVER_ISSUER_URL, a `quiver-testkit-oauth` process, web client
// registered) has the rules: groups contains "admins" → role admin; groups
// contains "viewers" → role viewer and policy QUIVER_POLICY. That policy
// allows server `alpha` only and denies `alpha.add`; servers `alpha` (tools
// echo, add) and `beta` exist, and API key QUIVER_KEY_ID (secret
// QUIVER_KEY_SECRET, which must never show) names the policy. The script
// chooses who signs in at the issuer (`POST /admin/oidc/person`). Environment:
//   QUIVER_REGISTRY_URL      http://host:port of the registry's HTTP listener
//   QUIVER_ISSUER_URL        the identity provider's issuer, as the registry has it
//   QUIVER_PROVIDER          the provider's name
//   QUIVER_POLICY            the policy's name
//   QUIVER_KEY_ID            the API key's id
//   QUIVER_KEY_SECRET        the API key's secret
//   QUIVER_SCREENSHOTS       screenshot directory
//   QUIVER_TEST_CHROMIUM     Chromium binary (default /usr/bin/chromium)
//   QUIVER_TEST_NODE_MODULES node_modules holding playwright-core
// Prints one line per step; exits 0 when all passed, 1 (after a screenshot
// `signin-failure.png` and the reason) on the first failure.

import assert from 'node:assert/strict';

import { need, tid, until, fatal, expectText, expectHidden, run } from './browser.mjs';

const SCRIPT = 'signin.spec.mjs';
const REGISTRY = need(SCRIPT, 'QUIVER_REGISTRY_URL').replace(/\/$/, '');
const ISSUER = need(SCRIPT, 'QUIVER_ISSUER_URL');
const PROVIDER = need(SCRIPT, 'QUIVER_PROVIDER');
const POLICY = need(SCRIPT, 'QUIVER_POLICY');
const KEY_ID = need(SCRIPT, 'QUIVER_KEY_ID');
const KEY_SECRET = need(SCRIPT, 'QUIVER_KEY_SECRET');
const SHOTS = need(SCRIPT, 'QUIVER_SCREENSHOTS');

const ADMIN_URL = `${REGISTRY}/admin/`;
/** How long the round trip through the identity provider may take. */
const SIGNIN_TIMEOUT_MS = 20000;
/** The rule of the provider giving viewers the policy (the second). */
const VIEWER_RULE = `identity_providers.${PROVIDER}.rules[1]`;
const DENY_RULE = `policies.${POLICY}.tool_denylist["alpha.add"]`;

/** Who signs in at the identity provider from now on. */
async function person(claims) {
  const response = await fetch(`${ISSUER.replace(/\/$/, '')}/admin/oidc/person`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(claims),
  });
  assert.equal(response.status, 200, `POST /admin/oidc/person: ${await response.text()}`);
}

await run('signin', SHOTS, async ({ page, context, step, shot }) => {
  const providerLink = page.locator(`${tid('sign-in-provider')}[data-provider="${PROVIDER}"]`);
  // Where the registry's sign-in callback last sent the browser (to say so
  // when that is not the web admin).
  let sentTo = null;
  page.on('response', (response) => {
    if (new URL(response.url()).pathname === '/admin/signin/callback') sentTo = response.headers().location ?? null;
  });

  /**
   * Presses "Sign in with <provider>" on the sign-in page; resolves once the
   * browser is back on the web admin.
   */
  async function signInWithProvider() {
    await page.goto(ADMIN_URL);
    await page.locator(tid('sign-in-page')).waitFor();
    sentTo = null;
    await providerLink.click();
    await until('the browser back on the web admin', async () => {
      const url = new URL(page.url());
      if (url.protocol === 'chrome-error:') {
        throw fatal(`the browser ended on an error page: the sign-in callback sent it to ${sentTo ?? '(no callback seen)'}`);
      }
      return sentTo && url.origin === REGISTRY && url.pathname.startsWith('/admin') && !url.pathname.startsWith('/admin/signin');
    }, SIGNIN_TIMEOUT_MS);
  }

  /** Signs in with the provider; waits for the role badge. */
  async function signedInAs(role, sub) {
    await signInWithProvider();
    await expectText(page.locator(tid('role-badge')), role, SIGNIN_TIMEOUT_MS);
    assert.equal(await page.locator(tid('role-badge')).getAttribute('data-role'), role);
    assert.equal(await page.locator(tid('principal')).textContent(), `oidc:${ISSUER}#${sub}`);
    assert.equal(await page.evaluate(() => sessionStorage.getItem('quiver.admin.token')), null, 'no token is stored');
  }

  /** The live cookies of the registry that the page's scripts cannot read. */
  async function sessionCookies() {
    const cookies = await context.cookies(REGISTRY);
    return cookies.filter((c) => c.httpOnly && c.value && (c.expires === -1 || c.expires * 1000 > Date.now()));
  }

  async function signOut() {
    await page.click(tid('sign-out'));
    await page.locator(tid('sign-in-page')).waitFor();
    await until('the session cookie to be gone', async () => (await sessionCookies()).every((c) => c.sameSite !== 'Strict'));
  }

  /** Submits the explain form; the shown answer, once it is for this question. */
  async function explain({ server, tool }) {
    await page.selectOption(tid('explain-server'), server);
    await page.fill(tid('explain-tool'), tool);
    const before = await page.locator(tid('access-result')).count();
    if (before) await page.locator(tid('access-result')).evaluate((el) => el.remove());
    await page.click(tid('explain-submit'));
    const result = page.locator(tid('access-result'));
    await result.waitFor();
    const text = async (id) => (await result.locator(tid(id)).textContent()).trim();
    return {
      decision: await result.locator(tid('access-decision')).getAttribute('data-decision'),
      principal: await text('access-principal'),
      policy: await text('access-policy'),
      code: await text('access-code'),
      rule: await text('access-rule'),
      reason: await text('access-reason'),
    };
  }

  await step('the sign-in page offers the identity provider beside the token form', async () => {
    await page.goto(ADMIN_URL);
    await page.locator(tid('sign-in-page')).waitFor();
    await providerLink.waitFor();
    assert.equal((await providerLink.textContent()).trim(), `Sign in with ${PROVIDER}`);
    assert.equal(new URL(await providerLink.getAttribute('href'), ADMIN_URL).pathname, `/admin/signin/${PROVIDER}`);
    await page.locator(tid('token-input')).waitFor();
    await shot('01-sign-in-with-provider');
  });

  await step('a viewer signs in with the provider: role badge, principal, an HttpOnly session, no write buttons', async () => {
    await person({ sub: 'alice', groups: ['viewers'] });
    await signedInAs('viewer', 'alice');
    const cookies = await sessionCookies();
    assert.ok(cookies.some((c) => c.sameSite === 'Strict'), `a SameSite=Strict HttpOnly session cookie: ${JSON.stringify(cookies)}`);
    assert.equal(await page.evaluate(() => document.cookie), '', 'the page cannot read the session cookie');

    await page.locator(`${tid('server-row')}[data-server-id="alpha"]`).waitFor();
    await expectHidden(page.locator(tid('new-server')));
    await expectHidden(page.locator(tid('nav-import')));
    await page.locator(tid('nav-access')).waitFor();
    await page.goto(`${ADMIN_URL}servers/alpha`);
    await page.locator(tid('read-only-banner')).waitFor();
    for (const action of ['save', 'delete', 'test-connection']) {
      assert.equal(await page.locator(tid(action)).count(), 0, `${action} is hidden`);
    }
    // The session survives a reload (the cookie, not this tab's storage).
    await page.reload();
    await expectText(page.locator(tid('role-badge')), 'viewer');
    // A write the cookie authenticates needs the header the page sends.
    const bare = await page.evaluate(async () => (await fetch('/admin/api/access/explain', {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{}', credentials: 'same-origin',
    })).status);
    assert.equal(bare, 403, 'a cookie write without x-quiver-csrf is refused');
    await shot('02-viewer-signed-in');
  });

  await step('the Access page lists policies, keys and providers, never a secret', async () => {
    await page.click(tid('nav-access'));
    await page.locator(tid('access-page')).waitFor();
    const policy = page.locator(`${tid('policy-row')}[data-name="${POLICY}"]`);
    await policy.waitFor();
    await expectText(policy, 'alpha.add');
    const key = page.locator(`${tid('key-row')}[data-key-id="${KEY_ID}"]`);
    await key.waitFor();
    assert.equal((await key.locator(tid('key-policy')).textContent()).trim(), POLICY);
    await expectText(key.locator(tid('key-last-used')), 'never');
    const rules = page.locator(`${tid('provider-row')}[data-name="${PROVIDER}"] ${tid('provider-rule')}`);
    assert.equal(await rules.nth(1).getAttribute('data-rule'), VIEWER_RULE);
    const html = await page.content();
    assert.ok(!html.includes(KEY_SECRET), 'the key secret is not on the page');
    assert.ok(!/qk_[A-Za-z0-9_-]{16,}/.test(html), 'nothing like a key secret is on the page');
    assert.equal(await page.locator('button.btn-danger').count(), 0, 'no delete button for a viewer');
  });

  await step('explain: an API key\'s allowed and denied calls, with the deciding rule', async () => {
    await page.check(tid('explain-kind-key'));
    await page.selectOption(tid('explain-key'), KEY_ID);
    const allowed = await explain({ server: 'alpha', tool: 'echo' });
    assert.deepEqual({ ...allowed, reason: '' }, {
      decision: 'allow', principal: `key:${KEY_ID}`, policy: POLICY, code: 'allowed', rule: '—', reason: '',
    });
    assert.match(allowed.reason, /allows alpha\.echo/);
    assert.equal(await page.locator(`${tid('access-decision')}.ok`).count(), 1, 'allow is styled as such');

    const denied = await explain({ server: 'alpha', tool: 'add' });
    assert.equal(denied.decision, 'deny');
    assert.equal(denied.code, 'denied_by_task');
    assert.equal(denied.rule, DENY_RULE);
    assert.ok(denied.reason.length > 0, 'a reason in words');
    assert.equal(await page.locator(`${tid('access-decision')}.bad`).count(), 1, 'deny is styled as such');

    const otherServer = await explain({ server: 'beta', tool: 'echo' });
    assert.equal(otherServer.decision, 'deny');
    assert.equal(otherServer.rule, `policies.${POLICY}.allowed_server_ids`);
    await shot('03-explain-key');
  });

  await step('explain: a person, decided by the provider\'s rules and the policy', async () => {
    await page.check(tid('explain-kind-person'));
    await page.locator(tid('explain-person-fields')).waitFor();
    assert.ok(await page.locator(tid('explain-key-fields')).isHidden());
    await page.selectOption(tid('explain-issuer'), ISSUER);
    await page.fill(tid('explain-subject'), 'alice');
    // Claims that are not a JSON object are refused before asking.
    await page.fill(tid('explain-claims'), '{"groups": ');
    await page.click(tid('explain-submit'));
    await expectText(page.locator(tid('explain-error-claims')), 'not JSON');
    await page.fill(tid('explain-claims'), '["viewers"]');
    await page.click(tid('explain-submit'));
    await expectText(page.locator(tid('explain-error-claims')), 'JSON object');

    await page.fill(tid('explain-claims'), '{"groups": ["viewers"]}');
    const allowed = await explain({ server: 'alpha', tool: 'echo' });
    assert.equal(await page.locator(tid('explain-error-claims')).isHidden(), true);
    assert.deepEqual({ ...allowed, reason: '' }, {
      decision: 'allow', principal: `oidc:${ISSUER}#alice`, policy: POLICY, code: 'allowed', rule: VIEWER_RULE, reason: '',
    });
    const denied = await explain({ server: 'alpha', tool: 'add' });
    assert.deepEqual([denied.decision, denied.code, denied.rule], ['deny', 'denied_by_task', DENY_RULE]);

    await page.fill(tid('explain-claims'), '{"groups": ["contractors"]}');
    const unmatched = await explain({ server: 'alpha', tool: 'echo' });
    assert.deepEqual([unmatched.decision, unmatched.code, unmatched.policy], ['deny', 'identity_no_matching_rule', '—']);
    assert.match(unmatched.reason, /none of its rules/);
    await shot('04-explain-person');
  });

  await step('signing out ends the session', async () => {
    await signOut();
    await page.reload();
    await page.locator(tid('sign-in-page')).waitFor();
    assert.ok(await page.locator(tid('sign-in-error')).isHidden(), 'no error after signing out');
  });

  await step('an admin person gets the write buttons', async () => {
    await person({ sub: 'root', groups: ['admins', 'viewers'] });
    await signedInAs('admin', 'root');
    await page.locator(tid('new-server')).waitFor();
    await page.locator(tid('nav-import')).waitFor();
    await signOut();
  });

  await step('a person no rule gives a registry role is refused, saying why', async () => {
    await person({ sub: 'mallory', groups: ['contractors'] });
    await signInWithProvider();
    await page.locator(tid('sign-in-page')).waitFor({ timeout: SIGNIN_TIMEOUT_MS });
    const banner = page.locator(tid('sign-in-error'));
    await expectText(banner, 'failed', SIGNIN_TIMEOUT_MS);
    await expectText(banner, 'mallory');
    assert.ok(!new URL(page.url()).searchParams.has('signin_error'), 'the error is taken off the address');
    assert.equal((await sessionCookies()).filter((c) => c.sameSite === 'Strict').length, 0, 'no session');
    await shot('05-sign-in-refused');
  });
}, { origin: REGISTRY });
