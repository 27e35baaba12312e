// Browser test of the registry's web admin in Debian's Chromium, driven by
// playwright-core (never a downloaded browser). Run by tests/e2e/web_admin.rs,
// which starts a SQLite registry (admin + worker tokens, an empty mcp.d
// directory, no rescan timer) and a worker following it, then runs:
//
//   node tests/web/admin.spec.mjs
//
// with the environment below. Prints one line per step; exits non-zero on the
// first failure (after a screenshot `web-failure.png` and the page's console).

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';

import { need as needOf, tid, until, expectText, expectCount, expectHidden, run } from './browser.mjs';

const need = (name) => needOf('admin.spec.mjs', name);

const REGISTRY = need('QUIVER_REGISTRY_URL').replace(/\/$/, ''); // http://127.0.0.1:PORT
const ADMIN = need('QUIVER_ADMIN_TOKEN');
const WORKER = need('QUIVER_WORKER_TOKEN');
const APPROVER = need('QUIVER_APPROVER_TOKEN');
const VIEWER = need('QUIVER_VIEWER_TOKEN');
const WORKER_ID = need('QUIVER_WORKER_ID');
const WORKER_URL = need('QUIVER_WORKER_URL').replace(/\/$/, '');
const CALLER = need('QUIVER_CALLER_TOKEN');
const MCP_BIN = need('QUIVER_MCP_BIN');
const MCP_DIR = need('QUIVER_MCP_DIR');
const SHOTS = need('QUIVER_SCREENSHOT_DIR');

const ADMIN_URL = `${REGISTRY}/admin/`;
const MASK = '********';
const SECRET = 'sk-live-web-e2e-secret';
/** The test MCP server's 60-character tool name (crates/quiver-testkit/src/mcp_server.rs). */
const LONG_TOOL = `long_${'x'.repeat(55)}`;
const ID = 'web-e2e';

/** `mcp__<b64url(server_id)>__<b64url(tool)>`, computed independently of the product. */
function injected(serverId, tool) {
  const b64 = (s) => Buffer.from(s, 'utf8').toString('base64url');
  return `mcp__${b64(serverId)}__${b64(tool)}`;
}

/** Calls the registry's REST API directly (as another admin would). */
async function rest(method, apiPath, { token = ADMIN, body, query } = {}) {
  const url = new URL(`${REGISTRY}/admin/api/${apiPath}`);
  for (const [k, v] of Object.entries(query ?? {})) url.searchParams.set(k, String(v));
  const response = await fetch(url, {
    method,
    headers: { Authorization: `Bearer ${token}`, 'Content-Type': 'application/json', 'X-Quiver-Actor': 'api-script' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch { json = null; }
  return { status: response.status, json, text };
}

/** The stored record, unmasked (admin token, no `masked`). */
async function stored(id = ID) {
  const { status, json, text } = await rest('GET', `mcp/servers/${id}`);
  assert.equal(status, 200, `GET ${id}: ${text}`);
  return json;
}

const META = ['revision', 'created_at', 'updated_at', 'updated_by', 'source', 'unchanged'];
function content(record) {
  const copy = structuredClone(record);
  for (const key of META) delete copy[key];
  return copy;
}

let page;
let context;

/** Adds a row to a list editor (`path`) and types `value` into it. */
async function addItem(pathName, value) {
  await page.click(tid(`add-${pathName}`));
  await page.locator(tid(`item-${pathName}`)).last().fill(value);
}

/** Adds a key/value row. */
async function addPair(pathName, key, value) {
  await page.click(tid(`add-${pathName}`));
  await page.locator(tid(`key-${pathName}`)).last().fill(key);
  const valueInput = page.locator(tid(`value-${pathName}`)).last();
  if ((await valueInput.evaluate((el) => el.tagName)) === 'SELECT') await valueInput.selectOption(value);
  else await valueInput.fill(value);
}

/** The value input next to key `key` of a key/value editor. */
function valueOf(pathName, key) {
  return page.locator(`${tid(`rows-${pathName}`)} .row[data-key="${key}"] ${tid(`value-${pathName}`)}`);
}

async function openServer(id) {
  await page.goto(`${ADMIN_URL}servers/${id}`); // a deep link, served index.html
  await page.locator(tid('server-form')).waitFor();
}

async function currentRevision() {
  return Number(await page.locator(tid('current-revision')).getAttribute('data-revision'));
}

async function previewRow(tool) {
  const r = page.locator(`${tid('preview-tool')}[data-tool="${tool}"]`);
  await r.waitFor();
  return r;
}

async function scenarios({ step, shot }) {
  let created;

  await step('sign in: a wrong token is refused, the admin token opens an empty registry', async () => {
    await page.goto(ADMIN_URL);
    await page.locator(tid('sign-in-page')).waitFor();
    await shot('01-sign-in');
    await page.fill(tid('token-input'), 'not-a-token');
    await page.click(tid('sign-in'));
    await expectText(page.locator(tid('sign-in-error')), 'not accepted');
    await page.fill(tid('token-input'), ADMIN);
    await page.click(tid('sign-in'));
    await expectText(page.locator(tid('role-badge')), 'admin');
    await page.locator(tid('empty-state')).waitFor();
    assert.equal(await page.evaluate(() => sessionStorage.getItem('quiver.admin.token')), ADMIN);
    assert.deepEqual((await context.cookies()).length, 0, 'no cookies');
    // A configured token names no principal; no identity provider is set up.
    assert.equal(await page.locator(tid('principal')).count(), 0);
    await page.locator(tid('nav-access')).waitFor();
  });

  await step('create a stdio server with every kind of field; preview and live re-evaluation', async () => {
    await page.click(tid('new-server'));
    await page.locator(tid('server-form')).waitFor();
    await page.fill(tid('input-server_id'), ID);
    await page.fill(tid('input-display_name'), 'Web E2E');
    await page.selectOption(tid('input-transport'), 'stdio');
    await page.fill(tid('input-stdio.command'), MCP_BIN);
    await addItem('stdio.args', '--profile');
    await addItem('stdio.args', 'full');
    await addPair('stdio.env', 'API_KEY', SECRET);
    await addPair('stdio.env', 'LANG_REF', '${ENV:LANG:-C}');
    await addItem('stdio.env_from', 'PATH'); // resolved from the registry's environment by the preview
    await page.fill(tid('input-stdio.cwd'), '/tmp');
    await page.fill(tid('input-tool_namespace'), 'mcp.web');
    for (const pattern of ['echo', 'add', '*long*', 'c*']) await addItem('allowed_tools', pattern);
    await addItem('denied_tools', 'crash');
    await page.selectOption(tid('input-approval_policy'), 'policy');
    await addPair('approval_tools', 'add', 'always');
    await page.fill(tid('input-budgets.tool_timeout_ms'), '15000');
    await page.fill(tid('input-budgets.max_concurrency'), '4');
    await page.fill(tid('input-budgets.max_tool_output_bytes'), '131072');
    await addPair('labels', 'team', 'platform');
    await addPair('labels', 'tier', 'gold');

    await page.click(tid('test-connection'));
    await page.locator(tid('preview-table')).waitFor({ timeout: 15000 });
    const echo = await previewRow('echo');
    assert.equal(await echo.getAttribute('data-allowed'), 'true');
    assert.equal(await echo.locator(tid('injected-name')).textContent(), injected(ID, 'echo'));
    const long = await previewRow(LONG_TOOL);
    assert.equal(await long.getAttribute('data-allowed'), 'false');
    assert.equal(await long.locator(tid('reason-code')).textContent(), 'injected_name_too_long');
    await expectText(long.locator(tid('tool-reason')), '64');
    assert.equal(await (await previewRow('crash')).locator(tid('reason-code')).textContent(), 'denied_by_server');
    assert.equal(await (await previewRow('fail')).locator(tid('reason-code')).textContent(), 'not_in_allowed_tools');
    assert.equal(await (await previewRow('counter')).getAttribute('data-allowed'), 'true');
    await expectText(page.locator(tid('preview-server-name')), 'quiver-testkit');

    // Denying echo re-evaluates without another connection, before saving.
    await addItem('denied_tools', 'ec*');
    await until('echo rejected by the unsaved deny pattern', async () =>
      (await (await previewRow('echo')).getAttribute('data-allowed')) === 'false');
    assert.equal(await (await previewRow('echo')).locator(tid('reason-code')).textContent(), 'denied_by_server');
    await page.locator(tid('remove-denied_tools')).last().click();
    await until('echo allowed again', async () =>
      (await (await previewRow('echo')).getAttribute('data-allowed')) === 'true');
    await shot('03-create-with-preview');

    await page.click(tid('save'));
    await until('the saved server page', async () => (await page.locator(tid('page-title')).textContent()) === 'Web E2E');
    created = await stored();
    assert.equal(created.source, 'admin');
    assert.deepEqual(content(created), {
      server_id: ID,
      display_name: 'Web E2E',
      transport: 'stdio',
      stdio: {
        command: MCP_BIN,
        args: ['--profile', 'full'],
        env: { API_KEY: SECRET, LANG_REF: '${ENV:LANG:-C}' },
        env_from: ['PATH'],
        cwd: '/tmp',
      },
      tool_namespace: 'mcp.web',
      allowed_tools: ['echo', 'add', '*long*', 'c*'],
      denied_tools: ['crash'],
      approval_policy: 'policy',
      approval_tools: { add: 'always' },
      budgets: { tool_timeout_ms: 15000, max_concurrency: 4, max_tool_output_bytes: 131072 },
      isolation: 'shared',
      enabled: true,
      labels: { team: 'platform', tier: 'gold' },
    });
  });

  await step('the list shows it; search and filters narrow it', async () => {
    await page.click(tid('nav-servers'));
    const r = page.locator(`${tid('server-row')}[data-server-id="${ID}"]`);
    await r.waitFor();
    await expectText(r.locator(tid('display-name')), 'Web E2E');
    assert.equal(await r.locator(tid('revision')).textContent(), String(created.revision));
    assert.equal(await r.locator(tid('source-badge')).getAttribute('data-source'), 'admin');
    await page.fill(tid('server-search'), 'no-such-thing');
    await page.locator(tid('no-match')).waitFor();
    await page.click(tid('clear-filters'));
    await r.waitFor();
    await page.selectOption(tid('filter-transport'), 'streamable_http');
    await page.locator(tid('no-match')).waitFor();
    await page.selectOption(tid('filter-transport'), 'stdio');
    await page.fill(tid('server-search'), 'platform'); // a label value
    await r.waitFor();
    await page.click(tid('refresh'));
    await page.selectOption(tid('filter-transport'), '');
    await page.fill(tid('server-search'), '');
  });

  await step('editing only the display name keeps every other field (secrets included)', async () => {
    await openServer(ID);
    assert.equal(await valueOf('stdio.env', 'API_KEY').inputValue(), MASK, 'secrets are shown masked');
    assert.equal(await valueOf('stdio.env', 'LANG_REF').inputValue(), '${ENV:LANG:-C}', 'references are not secrets');
    const before = await currentRevision();
    await page.fill(tid('input-display_name'), 'Web E2E renamed');
    await expectText(page.locator(tid('dirty-state')), 'Unsaved');
    await page.click(tid('save'));
    await until('a new revision', async () => (await page.locator(tid('current-revision')).count()) === 1 && (await currentRevision()) > before);
    const after = await stored();
    assert.equal(after.display_name, 'Web E2E renamed');
    assert.deepEqual({ ...content(after), display_name: null }, { ...content(created), display_name: null });
  });

  await step('server-side validation errors show next to their fields', async () => {
    await page.fill(tid('input-budgets.max_concurrency'), '0');
    await page.fill(tid('input-stdio.command'), '  ');
    await page.click(tid('add-transform'));
    await page.locator(tid('transform-a')).last().fill('bad prefix');
    await addItem('allowed_tools', ''); // a blank row is no pattern
    await addItem('allowed_resources', 'ui://*');
    await addItem('allowed_resources', 'file:///my notes/*');
    await page.click(tid('save'));
    await expectText(page.locator(`${tid('field-error')}[data-for="allowed_resources[1]"]`), 'whitespace');
    await expectText(page.locator(`${tid('field-error')}[data-for="transform[0].prefix"]`), 'may only contain');
    const concurrency = page.locator(`${tid('field-error')}[data-for="budgets.max_concurrency"]`);
    await expectText(concurrency, 'between 1 and');
    await expectText(page.locator(`${tid('field-error')}[data-for="stdio.command"]`), 'must not be empty');
    assert.ok(await page.locator('[data-field="budgets.max_concurrency"]').evaluate((el) => el.classList.contains('invalid')));
    await page.locator(tid('form-error')).waitFor();
    await shot('04-validation-errors');
    await page.click(tid('cancel')); // discard: the stored record is untouched
    assert.equal(await page.inputValue(tid('input-budgets.max_concurrency')), '4');
    await expectHidden(page.locator(`${tid('field-error')}[data-for="budgets.max_concurrency"]`));
    assert.equal((await stored()).budgets.max_concurrency, 4);
  });

  await step('a concurrent API write is shown as a conflict; my changes can be applied on top', async () => {
    await openServer(ID);
    await page.fill(tid('input-display_name'), 'Web E2E conflict');
    // Someone else saves first, through the API.
    const theirs = await stored();
    const write = await rest('POST', 'mcp/servers', {
      query: { expected_revision: theirs.revision },
      body: { ...content(theirs), labels: { ...theirs.labels, team: 'infra' } },
    });
    assert.equal(write.status, 200, write.text);
    await page.click(tid('save'));
    const dialogEl = page.locator(tid('conflict-dialog'));
    await dialogEl.waitFor();
    await expectText(page.locator(`${tid('conflict-theirs')} ${tid('diff-line')}[data-path="labels.team"]`), '"infra"');
    await expectCount(page.locator(`${tid('conflict-theirs')} ${tid('diff-line')}`), 1);
    await expectText(page.locator(`${tid('conflict-yours')} ${tid('diff-line')}[data-path="display_name"]`), '"Web E2E conflict"');
    await expectCount(page.locator(`${tid('conflict-yours')} ${tid('diff-line')}`), 1);
    await expectCount(page.locator(`${tid('conflict-diff')} ${tid('diff-line')}`), 2); // stored now → mine
    await shot('05-edit-conflict', { fullPage: false });
    await page.click(tid('conflict-rebase'));
    await expectHidden(dialogEl);
    assert.equal(await valueOf('labels', 'team').inputValue(), 'infra');
    assert.equal(await page.inputValue(tid('input-display_name')), 'Web E2E conflict');
    await page.click(tid('save'));
    await until('saved on top', async () => (await stored()).display_name === 'Web E2E conflict');
    const merged = await stored();
    assert.equal(merged.labels.team, 'infra');
    assert.equal(merged.stdio.env.API_KEY, SECRET);

    // Again, and this time reload the stored version.
    await until('the page shows the new revision', async () => (await currentRevision()) === merged.revision);
    await page.fill(tid('input-display_name'), 'Lost edit');
    const write2 = await rest('POST', 'mcp/servers', {
      query: { expected_revision: merged.revision },
      body: { ...content(merged), labels: { ...merged.labels, tier: 'silver' } },
    });
    assert.equal(write2.status, 200, write2.text);
    await page.click(tid('save'));
    await dialogEl.waitFor();
    await page.click(tid('conflict-reload'));
    await expectHidden(dialogEl);
    assert.equal(await page.inputValue(tid('input-display_name')), 'Web E2E conflict');
    assert.equal(await valueOf('labels', 'tier').inputValue(), 'silver');
    assert.equal((await stored()).display_name, 'Web E2E conflict');
  });

  await step('history: field-level diff per revision, rollback to the first one', async () => {
    await page.click(tid('history-link'));
    await page.locator(tid('history-list')).waitFor();
    await expectCount(page.locator(tid('history-entry')), 5);
    // Newest first: r(create) is last, the rename second to last.
    await page.locator(tid('history-entry')).nth(3).click();
    const line = page.locator(`${tid('history-diff')} ${tid('diff-line')}[data-path="display_name"]`);
    await expectText(line, '"Web E2E"');
    await expectText(line, '"Web E2E renamed"');
    assert.equal(await page.locator(`${tid('history-diff')} ${tid('diff-line')}`).count(), 1, 'only the display name changed');
    await page.locator(tid('history-entry')).nth(2).click(); // the API write
    await expectText(page.locator(`${tid('history-diff')} ${tid('diff-line')}[data-path="labels.team"]`), '"infra"');
    await page.locator(tid('history-entry')).nth(1).click(); // the rebased save
    await expectText(page.locator(`${tid('history-diff')} ${tid('diff-line')}[data-path="display_name"]`), '"Web E2E conflict"');
    await shot('06-history-diff');

    const first = page.locator(tid('history-entry')).nth(4);
    await first.click();
    const firstRevision = Number(await first.getAttribute('data-revision'));
    assert.equal(firstRevision, created.revision);
    await page.click(tid('rollback'));
    await page.locator(tid('confirm-dialog')).waitFor();
    await page.locator(`${tid('rollback-diff')} ${tid('diff-line')}[data-path="labels.tier"]`).waitFor();
    await page.click(tid('confirm-ok'));
    await expectCount(page.locator(tid('history-entry')), 6);
    const back = await stored();
    assert.deepEqual(content(back), content(created));
    assert.equal(await page.locator(tid('history-entry')).first().getAttribute('data-revision'), String(back.revision));
  });

  await step('worker status: Connected in the list, lag 0 and per-server health on the workers page', async () => {
    // A server that cannot start, to see Down and its last error.
    const broken = await rest('POST', 'mcp/servers', {
      query: { expected_revision: 0 },
      body: { server_id: 'web-broken', transport: 'stdio', stdio: { command: '/nonexistent/mcp-server' }, allowed_tools: ['*'] },
    });
    assert.equal(broken.status, 201, broken.text);
    await until('the worker at the new head', async () => {
      const ready = await (await fetch(`${WORKER_URL}/readyz`)).json();
      return ready.revision === broken.json.revision;
    });
    // Let the worker connect (it connects lazily), then change the registry
    // so the worker reports at once rather than at its next periodic report.
    const tools = await fetch(`${WORKER_URL}/v1/mcp/tools`, { headers: { Authorization: `Bearer ${CALLER}` } });
    assert.equal(tools.status, 200);
    const names = (await tools.json()).map((t) => t.name);
    assert.ok(names.includes(injected(ID, 'echo')), `worker tools: ${names}`);
    const other = await rest('POST', 'mcp/servers', {
      query: { expected_revision: 0 },
      body: { server_id: 'web-other', display_name: 'Disabled HTTP server', transport: 'streamable_http', http: { url: 'http://127.0.0.1:9/mcp', headers: { 'X-Api-Key': 'header-secret' } }, enabled: false },
    });
    assert.equal(other.status, 201, other.text);

    await page.click(tid('nav-servers'));
    const r = page.locator(`${tid('server-row')}[data-server-id="${ID}"]`);
    await until('web-e2e Connected in the list', async () => {
      await page.click(tid('refresh'));
      return (await r.locator(tid('status-badge')).getAttribute('data-state', { timeout: 1000 })) === 'connected';
    }, 20000);
    assert.match(await r.locator(tid('tool-count')).textContent(), /^\d+$/);
    const brokenRow = page.locator(`${tid('server-row')}[data-server-id="web-broken"]`);
    await until('web-broken Down with its error', async () => {
      await page.click(tid('refresh'));
      const state = await brokenRow.locator(tid('status-badge')).getAttribute('data-state', { timeout: 1000 });
      return ['down', 'degraded'].includes(state) && (await brokenRow.locator(tid('last-error')).textContent()).length > 3;
    }, 20000);
    await page.selectOption(tid('filter-status'), 'connected');
    await expectCount(page.locator(tid('server-row')), 1);
    await page.selectOption(tid('filter-status'), '');
    await page.selectOption(tid('filter-enabled'), 'false');
    await expectCount(page.locator(tid('server-row')), 1);
    await page.locator(`${tid('server-row')}[data-server-id="web-other"]`).waitFor();
    await page.selectOption(tid('filter-enabled'), '');
    await expectCount(page.locator(tid('server-row')), 3);
    await shot('02-servers');

    await page.click(tid('nav-workers'));
    const card = page.locator(`${tid('worker-card')}[data-worker-id="${WORKER_ID}"]`);
    await card.waitFor();
    await until('the worker at head (lag 0)', async () => {
      await page.click(tid('refresh'));
      return (await card.locator(tid('worker-lag')).getAttribute('data-lag', { timeout: 1000 })) === '0';
    }, 15000);
    const head = (await rest('GET', 'workers')).json.head_revision;
    assert.equal(await card.locator(tid('snapshot-revision')).textContent(), String(head));
    await expectText(page.locator(tid('head-revision')), String(head));
    const health = card.locator(`${tid('worker-server')}[data-server-id="${ID}"]`);
    assert.equal(await health.locator(tid('status-badge')).getAttribute('data-state'), 'connected');
    await shot('07-workers');
  });

  await step('import a TOML file and rescan mcp.d, each with a summary', async () => {
    await page.click(tid('nav-import'));
    // An invalid document writes nothing and says why.
    await page.fill(tid('import-text'), 'server_id = "bad"\ntransport = "stdio"\n[stdio]\ncommand = "x"\n[budgets]\nmax_concurrency = 0\n');
    await page.selectOption(tid('import-format'), 'toml');
    await page.click(tid('import-submit'));
    await expectText(page.locator(tid('import-error')), 'max_concurrency');
    assert.equal((await rest('GET', 'mcp/servers/bad')).status, 404);

    await page.selectOption(tid('import-format'), '');
    const toml = [
      '[[servers]]',
      'server_id = "imported-a"',
      'transport = "stdio"',
      'allowed_tools = ["echo"]',
      '[servers.stdio]',
      `command = ${JSON.stringify(MCP_BIN)}`,
      '',
      '[[servers]]',
      'server_id = "imported-b"',
      'transport = "streamable_http"',
      '[servers.http]',
      'url = "http://127.0.0.1:9/mcp"',
      '',
    ].join('\n');
    await page.setInputFiles(tid('import-file'), { name: 'imported.toml', mimeType: 'application/toml', buffer: Buffer.from(toml) });
    await expectText(page.locator(tid('import-file-name')), 'imported.toml');
    await page.click(tid('import-submit'));
    await page.locator(`${tid('import-row')}[data-server-id="imported-a"][data-outcome="created"]`).waitFor();
    await page.locator(`${tid('import-row')}[data-server-id="imported-b"][data-outcome="created"]`).waitFor();

    fs.writeFileSync(path.join(MCP_DIR, '20-web.toml'), [
      'server_id = "from-file"',
      'display_name = "Declared in mcp.d"',
      'transport = "stdio"',
      'allowed_tools = ["echo"]',
      '[stdio]',
      `command = ${JSON.stringify(MCP_BIN)}`,
      '',
    ].join('\n'));
    await page.click(tid('rescan'));
    await page.locator(`${tid('rescan-count')}[data-kind="created"][data-count="1"]`).waitFor();
    await shot('08-import-and-rescan');

    await page.click(tid('nav-servers'));
    const fileRow = page.locator(`${tid('server-row')}[data-server-id="from-file"]`);
    await fileRow.waitFor();
    assert.equal(await fileRow.locator(tid('source-badge')).getAttribute('data-source'), 'file');
    await expectText(fileRow.locator(tid('source-badge')), '20-web.toml');
    await fileRow.locator(tid('server-link')).click();
    await page.locator(tid('file-banner')).waitFor();
  });

  await step('import a server.json: a dry run with the inputs to fill, then the record; a bad one names its field', async () => {
    // The official example's shape, named for this test, its URL template
    // filled with a loopback port nothing listens on: only the record is
    // checked, no tool call.
    const example = JSON.parse(fs.readFileSync(new URL('../data/server-json/examples/valid/with-remote.json', import.meta.url), 'utf8'));
    const remoteUrl = 'http://127.0.0.1:9/mcp';
    const doc = {
      ...example,
      name: 'io.github.quiver-e2e/web-remote',
      title: 'Web Remote',
      remotes: [{ ...example.remotes[0], url: 'http://{host}/mcp', variables: { host: { description: 'API host', default: '127.0.0.1:9' } } }],
    };
    assert.deepEqual(doc.remotes[0].headers, [{ name: 'Authorization', isSecret: true, isRequired: true }], 'the example\'s secret header');
    const remoteId = 'web-remote'; // the name's last segment
    await page.click(tid('nav-import'));
    await page.fill(tid('import-text'), JSON.stringify(doc, null, 2));
    await page.click(tid('import-submit'));

    const records = page.locator(tid('server-json-records'));
    await expectText(records, `"server_id": "${remoteId}"`);
    const [dry] = JSON.parse(await records.textContent());
    assert.equal(dry.transport, 'streamable_http');
    assert.equal(dry.display_name, 'Web Remote');
    assert.equal(dry.http.url, remoteUrl);
    assert.deepEqual(dry.http.headers, { Authorization: '${ENV:AUTHORIZATION}' });
    assert.deepEqual(dry.allowed_tools ?? [], [], 'default deny until allowed tools are given');
    // The secret header is the one input to fill: from the workers' environment.
    await expectCount(page.locator(tid('server-json-input')), 1);
    const input = page.locator(`${tid('server-json-input')}[data-field="remotes[0].headers[0]"]`);
    assert.equal(await input.getAttribute('data-env'), 'AUTHORIZATION');
    await expectText(input, 'Authorization (required) (secret)');
    await expectText(input, 'set AUTHORIZATION on the workers');
    assert.equal((await rest('GET', `mcp/servers/${remoteId}`)).status, 404, 'a dry run stores nothing');

    // Allowed tools run the dry run again.
    await page.fill(tid('server-json-allowed-tools'), 'echo, add*');
    await page.press(tid('server-json-allowed-tools'), 'Tab');
    const withTools = await until('the dry run with the allowed tools', async () => {
      const [record] = JSON.parse(await records.textContent({ timeout: 500 }));
      return record.allowed_tools?.length ? record : null;
    });
    assert.deepEqual(withTools.allowed_tools, ['echo', 'add*']);
    await shot('12-server-json-dry-run');

    await page.click(tid('server-json-import'));
    const storedRow = page.locator(`${tid('server-json-stored-record')}[data-server-id="${remoteId}"]`);
    await storedRow.waitFor();
    assert.equal(await storedRow.getAttribute('data-outcome'), 'created');
    const record = await stored(remoteId);
    assert.equal(await storedRow.getAttribute('data-revision'), String(record.revision));
    assert.equal(record.source, 'admin');
    assert.deepEqual(content(record), withTools, 'the record stored is the one the dry run showed');

    await storedRow.locator('a').click();
    await page.locator(tid('server-form')).waitFor();
    assert.equal(await page.inputValue(tid('input-transport')), 'streamable_http');
    assert.equal(await page.inputValue(tid('input-http.url')), remoteUrl);
    assert.equal(await valueOf('http.headers', 'Authorization').inputValue(), '${ENV:AUTHORIZATION}', 'a reference, not a secret');
    await page.click(tid('nav-servers'));
    const row = page.locator(`${tid('server-row')}[data-server-id="${remoteId}"]`);
    await row.waitFor();
    await expectText(row.locator(tid('display-name')), 'Web Remote');
    await expectText(row, 'Streamable HTTP');
    assert.equal(await row.locator(tid('source-badge')).getAttribute('data-source'), 'admin');

    // A URL variable without value or default cannot be filled: refused,
    // naming the server.json's field, nothing stored.
    const head = (await rest('GET', 'workers')).json.head_revision;
    const bad = {
      ...doc,
      name: 'io.github.quiver-e2e/web-remote-bad',
      remotes: [{ ...doc.remotes[0], variables: { host: { description: 'API host' } } }],
    };
    await page.click(tid('nav-import'));
    await page.fill(tid('import-text'), JSON.stringify(bad, null, 2));
    await page.click(tid('import-submit'));
    const error = page.locator(tid('import-error'));
    await expectText(error, 'remotes[0].variables.host');
    assert.equal(await error.getAttribute('data-field'), 'remotes[0].variables.host');
    assert.equal(await page.locator(tid('server-json-import')).count(), 0, 'nothing to import');
    assert.equal((await rest('GET', 'mcp/servers/web-remote-bad')).status, 404);
    assert.equal((await rest('GET', 'workers')).json.head_revision, head, 'no write');
    await shot('13-server-json-error');
  });

  await step('approvals: pending ones with masked arguments; approve with a note, deny; history', async () => {
    await page.click(tid('nav-approvals'));
    await page.locator(tid('approvals-page')).waitFor();
    const card = (tool) => page.locator(`${tid('approval-card')}:has(${tid('approval-tool')}:text-is("${tool}"))`);
    await card('approve_me').waitFor();
    await card('deny_me').waitFor();
    const args = await card('approve_me').locator(tid('approval-arguments')).textContent();
    assert.ok(args.includes('/srv/approve_me') && args.includes(MASK), args);
    assert.ok(!args.includes('sk-approval-secret'), 'arguments are masked');
    await shot('10-approvals-pending');
    await card('approve_me').locator(tid('approval-note')).fill('looks right');
    await card('approve_me').locator(tid('approve')).click();
    await expectCount(card('approve_me'), 0);
    await card('deny_me').locator(tid('deny')).click();
    await expectCount(page.locator(tid('approval-card')), 0);
    await page.locator(tid('approvals-empty')).waitFor();
    await page.locator(`${tid('approval-row')}[data-state="approved"]`).waitFor();
    await page.locator(`${tid('approval-row')}[data-state="denied"]`).waitFor();
    const { json } = await rest('GET', 'approvals', { query: { state: 'approved' } });
    assert.equal(json.approvals.length, 1);
    assert.equal(json.approvals[0].tool, 'approve_me');
    assert.equal(json.approvals[0].note, 'looks right');
    assert.equal(json.approvals[0].decided_by, 'admin');
    const denied = await rest('GET', 'approvals', { query: { state: 'denied' } });
    assert.equal(denied.json.approvals[0].tool, 'deny_me');
    // The worker token may not decide.
    const refused = await rest('POST', `approvals/${json.approvals[0].approval_id}`, { token: WORKER, body: { decision: 'deny' } });
    assert.equal(refused.status, 403);
    await shot('11-approvals-history');
  });

  await step('delete asks for confirmation', async () => {
    await openServer('web-other');
    assert.equal(await valueOf('http.headers', 'X-Api-Key').inputValue(), MASK);
    await page.click(tid('delete'));
    await page.locator(tid('confirm-dialog')).waitFor();
    await page.click(tid('confirm-cancel'));
    await expectHidden(page.locator(tid('confirm-dialog')));
    assert.equal((await rest('GET', 'mcp/servers/web-other')).status, 200);
    await page.click(tid('delete'));
    await page.click(tid('confirm-ok'));
    await page.locator(tid('servers-page')).waitFor();
    await expectHidden(page.locator(`${tid('server-row')}[data-server-id="web-other"]`));
    assert.equal((await rest('GET', 'mcp/servers/web-other')).status, 404);
  });

  await step('the worker token gets a read-only view', async () => {
    await page.click(tid('sign-out'));
    await page.locator(tid('sign-in-page')).waitFor();
    assert.equal(await page.evaluate(() => sessionStorage.getItem('quiver.admin.token')), null);
    await page.fill(tid('token-input'), WORKER);
    await page.click(tid('sign-in'));
    await expectText(page.locator(tid('role-badge')), 'read-only');
    await page.locator(`${tid('server-row')}[data-server-id="${ID}"]`).waitFor();
    await expectHidden(page.locator(tid('new-server')));
    await expectHidden(page.locator(tid('nav-import')));
    await openServer(ID);
    await page.locator(tid('read-only-banner')).waitFor();
    for (const action of ['save', 'delete', 'test-connection', 'add-allowed_tools']) {
      assert.equal(await page.locator(tid(action)).count(), 0, `${action} is hidden`);
    }
    assert.ok(await page.locator(tid('input-display_name')).isDisabled());
    assert.equal(await valueOf('stdio.env', 'API_KEY').inputValue(), MASK);
    await shot('09-read-only');
    await page.click(tid('history-link'));
    await page.locator(tid('history-list')).waitFor();
    await page.locator(tid('history-entry')).last().click();
    await page.locator(tid('history-detail')).waitFor();
    assert.equal(await page.locator(tid('rollback')).count(), 0);
    const full = await page.locator(`${tid('full-record')} pre`).textContent();
    assert.ok(!full.includes(SECRET), 'history is masked for the worker token');
    await page.goto(`${ADMIN_URL}import`);
    await page.locator(tid('forbidden')).waitFor();
    assert.equal(await page.locator(tid('nav-access')).count(), 0, 'the worker token reads no access records');
    await page.goto(`${ADMIN_URL}access`);
    await page.locator(tid('forbidden')).waitFor();
  });

  await step('the viewer token reads servers, approvals and OAuth status, and changes nothing', async () => {
    await page.click(tid('sign-out'));
    await page.locator(tid('sign-in-page')).waitFor();
    await page.fill(tid('token-input'), VIEWER);
    await page.click(tid('sign-in'));
    await expectText(page.locator(tid('role-badge')), 'viewer');
    await page.click(tid('nav-servers'));
    await page.locator(`${tid('server-row')}[data-server-id="${ID}"]`).waitFor();
    await expectHidden(page.locator(tid('new-server')));
    await expectHidden(page.locator(tid('nav-import')));
    await openServer(ID);
    await page.locator(tid('read-only-banner')).waitFor();
    for (const action of ['save', 'delete', 'test-connection']) {
      assert.equal(await page.locator(tid(action)).count(), 0, `${action} is hidden`);
    }
    await page.click(tid('nav-approvals'));
    await page.locator(`${tid('approval-row')}[data-state="approved"]`).waitFor();
    assert.equal(await page.locator(tid('approve')).count(), 0, 'the viewer cannot decide');
    await page.click(tid('nav-oauth'));
    await page.locator(tid('oauth-page')).waitFor();
    assert.equal(await page.locator(tid('oauth-save')).count(), 0, 'the viewer cannot change OAuth connections');
    await page.click(tid('nav-access'));
    await page.locator(tid('access-explain')).waitFor();
    await page.locator(tid('policies-table-empty')).waitFor();
  });

  await step('the approver token sees the approvals page only', async () => {
    await page.click(tid('sign-out'));
    await page.locator(tid('sign-in-page')).waitFor();
    await page.fill(tid('token-input'), APPROVER);
    await page.click(tid('sign-in'));
    await expectText(page.locator(tid('role-badge')), 'approver');
    await page.locator(tid('approvals-page')).waitFor();
    await expectHidden(page.locator(tid('nav-servers')));
    assert.equal(await page.locator(tid('nav-access')).count(), 0);
    await page.locator(`${tid('approval-row')}[data-state="approved"]`).waitFor();
  });
}

await run('web', SHOTS, async (browser) => {
  ({ page, context } = browser);
  await scenarios(browser);
});
