// OAuth connections (status: admin, editor, viewer; changes: admin): a record's `http.auth_ref` names one. The
// list with each connection's status, Connect / Reconnect (the browser goes to
// the authorization server, which sends it back to `/admin/oauth/callback`,
// then here with `?connected=<name>`), delete, and a form to add or update a
// connection. Views never carry a token or a secret; the client secret is
// write-only here.

import { api } from './api.js';
import { h, replace, stateBox, loading, badge, toast, confirmDialog, formatTime, timeEl, fieldGroup, takeQueryParam } from './dom.js';

const REFRESH_MS = 5000;

const STATUS_KIND = { connected: 'ok', expiring: 'warn', needs_reconsent: 'bad', not_connected: 'outline' };
/** Statuses where a token was had once: the button reads "Reconnect". */
const RECONNECT = new Set(['connected', 'expiring', 'needs_reconsent']);
const GRANTS = [['authorization_code', 'Authorization code (a person consents)'], ['client_credentials', 'Client credentials (machine to machine)']];
const FIELDS = ['name', 'server_url', 'grant', 'client_id', 'client_secret', 'client_metadata_url', 'scopes', 'max_scopes'];

const enc = encodeURIComponent;
const oauthApi = {
  list: () => api('GET', 'oauth/connections'),
  put: (name, body) => api('PUT', `oauth/connections/${enc(name)}`, { body }),
  remove: (name) => api('DELETE', `oauth/connections/${enc(name)}`),
  // The answer sets the cookie that binds the flow to this browser.
  connect: (name) => api('POST', `oauth/connections/${enc(name)}/connect`),
};

export function oauthPage(ctx) {
  // Viewers and editors see the connections' status; only the admin
  // changes or connects them (reference §5).
  const canWrite = ctx.isAdmin;
  if (!ctx.isPerson) {
    return {
      el: stateBox({
        title: 'OAuth connections need a person\'s token',
        text: 'You are signed in with a token that cannot manage OAuth connections.',
        testid: 'forbidden',
        actions: [ctx.link('servers', { class: 'btn' }, 'Back to servers')],
      }),
    };
  }

  // Back from the authorization server: say so once.
  const connected = takeQueryParam('connected');
  if (connected) toast(`Connected ${connected}`, 'ok');

  const body = h('div', {}, loading('Loading OAuth connections…'));
  const updated = h('span', { class: 'updated small muted', testid: 'refreshed' });
  const connectError = h('div', { class: 'banner banner-error', testid: 'oauth-connect-error', role: 'alert', hidden: true });

  // ---- the form ---------------------------------------------------------

  const inputs = {
    name: h('input', { type: 'text', class: 'mono', testid: 'oauth-name', autocomplete: 'off', spellcheck: 'false', placeholder: 'e.g. github', required: true }),
    server_url: h('input', { type: 'url', class: 'mono', testid: 'oauth-server-url', autocomplete: 'off', spellcheck: 'false', placeholder: 'https://mcp.example.com/mcp', required: true }),
    grant: h('select', { testid: 'oauth-grant' }, GRANTS.map(([value, text]) => h('option', { value }, text))),
    client_id: h('input', { type: 'text', class: 'mono', testid: 'oauth-client-id', autocomplete: 'off', spellcheck: 'false', placeholder: 'optional: a pre-registered client' }),
    client_secret: h('input', { type: 'password', testid: 'oauth-client-secret', autocomplete: 'new-password', placeholder: 'optional' }),
    client_metadata_url: h('input', { type: 'url', class: 'mono', testid: 'oauth-client-metadata-url', autocomplete: 'off', spellcheck: 'false', placeholder: 'optional: https://…/client.json' }),
    scopes: h('input', { type: 'text', class: 'mono', testid: 'oauth-scopes', autocomplete: 'off', spellcheck: 'false', placeholder: 'optional, space separated' }),
    max_scopes: h('input', { type: 'text', class: 'mono', testid: 'oauth-max-scopes', autocomplete: 'off', spellcheck: 'false', placeholder: 'optional, space separated' }),
  };
  const removeSecret = h('input', { type: 'checkbox', testid: 'oauth-remove-secret' });
  const removeSecretRow = h('label', { class: 'check small', hidden: true }, removeSecret, 'Remove the stored secret');
  const secretHint = h('div', { class: 'hint', testid: 'oauth-secret-hint' }, 'Stored encrypted and never shown again.');
  const fields = fieldGroup('oauth');
  const formBanner = h('div', { class: 'banner banner-error', testid: 'oauth-form-error', role: 'alert', hidden: true });
  const saveButton = h('button', { type: 'submit', class: 'btn btn-primary', testid: 'oauth-save' }, 'Save connection');
  const formTitle = h('h2', { testid: 'oauth-form-title' }, 'Add a connection');

  const field = (key, label, hint, extra) => fields.field(key, label, inputs[key], hint, extra);

  const form = h('form', { class: 'card oauth-form', testid: 'oauth-form', novalidate: true, onsubmit: (event) => { event.preventDefault(); save(); } },
    h('div', { class: 'card-head' }, formTitle,
      h('button', { type: 'button', class: 'btn btn-small btn-ghost', testid: 'oauth-form-reset', onclick: () => fill(null) }, 'Clear')),
    h('p', { class: 'desc' }, 'Saving a connection with an existing name updates it. Connect afterwards to get a token.'),
    formBanner,
    h('div', { class: 'grid-2' },
      field('name', 'Name', 'What records put in http.auth_ref: letters, digits, "_", "." or "-".'),
      field('server_url', 'MCP server URL', 'The protected MCP server the tokens are for.'),
      field('grant', 'Grant'),
      field('scopes', 'Scopes', 'Empty: what the server\'s metadata suggests.'),
      field('max_scopes', 'Step-up ceiling', 'The widest scopes a server\'s insufficient_scope may widen the connection to. Empty: the scopes above (no widening).'),
      field('client_id', 'Client id', 'Without one the registry uses the client metadata document or dynamic registration.'),
      field('client_secret', 'Client secret', secretHint, removeSecretRow),
      field('client_metadata_url', 'Client metadata document URL', 'An HTTPS URL of a client ID metadata document.')),
    h('div', { class: 'dialog-actions spaced' }, saveButton));

  let baseline = '';
  const snapshot = () => JSON.stringify([...FIELDS.map((k) => inputs[k].value), removeSecret.checked]);

  /** Fills the form with a connection's settings (`null`: empty form). */
  function fill(view) {
    clearErrors();
    inputs.name.value = view?.name ?? '';
    inputs.server_url.value = view?.server_url ?? '';
    inputs.grant.value = view?.grant ?? 'authorization_code';
    inputs.client_id.value = view?.client_id ?? '';
    inputs.client_secret.value = '';
    inputs.client_metadata_url.value = view?.client_metadata_url ?? '';
    inputs.scopes.value = (view?.scopes ?? []).join(' ');
    inputs.max_scopes.value = (view?.max_scopes ?? []).join(' ');
    removeSecret.checked = false;
    removeSecretRow.hidden = !view?.has_client_secret;
    secretHint.textContent = view?.has_client_secret
      ? 'A secret is stored (never shown). Leave empty to keep it; type one to replace it.'
      : 'Stored encrypted and never shown again.';
    formTitle.textContent = view ? `Edit ${view.name}` : 'Add a connection';
    baseline = snapshot();
  }

  function clearErrors() {
    formBanner.hidden = true;
    replace(formBanner);
    fields.clear();
  }

  function showErrors(err) {
    clearErrors();
    const list = err.fieldErrors?.() ?? [];
    if (fields.show(list).length || !list.length) {
      replace(formBanner, h('div', { class: 'grow' }, h('b', {}, 'The registry refused this connection: '), err.message));
      formBanner.hidden = false;
    }
  }

  function readForm() {
    const value = (key) => inputs[key].value.trim();
    const body = { server_url: value('server_url'), grant: inputs.grant.value };
    if (value('client_id')) body.client_id = value('client_id');
    // Absent: keep the stored secret; "": remove it.
    if (inputs.client_secret.value) body.client_secret = inputs.client_secret.value;
    else if (removeSecret.checked) body.client_secret = '';
    if (value('client_metadata_url')) body.client_metadata_url = value('client_metadata_url');
    const scopes = value('scopes').split(/\s+/).filter(Boolean);
    if (scopes.length) body.scopes = scopes;
    const ceiling = value('max_scopes').split(/\s+/).filter(Boolean);
    if (ceiling.length) body.max_scopes = ceiling;
    return body;
  }

  async function save() {
    clearErrors();
    const name = inputs.name.value.trim();
    if (!name) {
      showErrors({ fieldErrors: () => [{ field: 'name', message: 'a name is required' }], message: 'a name is required' });
      return;
    }
    saveButton.disabled = true;
    saveButton.textContent = 'Saving…';
    try {
      const view = await oauthApi.put(name, readForm());
      toast(`Saved ${view?.name ?? name}`, 'ok');
      fill(view ?? null);
      lastKey = '';
      load();
    } catch (err) {
      showErrors(err);
    } finally {
      saveButton.disabled = false;
      saveButton.textContent = 'Save connection';
    }
  }

  fill(null);

  // ---- the list ---------------------------------------------------------

  const el = h('div', { testid: 'oauth-page' },
    h('div', { class: 'page-head' },
      h('div', {}, h('h1', {}, 'OAuth connections'),
        h('div', { class: 'sub' }, 'Connections get and refresh the tokens of MCP servers that need OAuth; a record names one in http.auth_ref. Tokens stay in the registry: this page never shows them.')),
      h('div', { class: 'actions' }, updated,
        h('button', { type: 'button', class: 'btn btn-small', testid: 'refresh', onclick: () => { lastKey = ''; load(); } }, 'Refresh'))),
    connectError,
    body,
    canWrite ? form : null);

  let timer = null;
  let disposed = false;
  let loaded = false;
  let lastKey = '';
  let connections = [];
  /** Names whose Connect is under way (their button stays disabled across redraws). */
  const busy = new Set();

  async function load() {
    clearTimeout(timer);
    try {
      const list = await oauthApi.list();
      if (disposed) return;
      loaded = true;
      updated.textContent = `Updated ${new Date().toLocaleTimeString()}`;
      connections = list?.connections ?? [];
      const key = JSON.stringify([connections, [...busy]]);
      if (key !== lastKey) {
        lastKey = key;
        draw();
      }
    } catch (err) {
      if (disposed) return;
      if (!loaded) {
        replace(body, stateBox({
          title: 'Cannot load the OAuth connections', text: err.message, kind: 'error', testid: 'error-state',
          actions: [h('button', { type: 'button', class: 'btn', onclick: () => load() }, 'Retry')],
        }));
      } else {
        updated.textContent = `Refresh failed: ${err.message}`;
      }
    }
    if (!disposed) timer = setTimeout(load, REFRESH_MS);
  }

  function draw() {
    if (!connections.length) {
      replace(body, stateBox({
        title: 'No OAuth connections yet',
        text: 'Add one below, connect it, then name it in a record\'s http.auth_ref.',
        testid: 'oauth-empty',
      }));
      return;
    }
    replace(body, h('div', { class: 'table-wrap' }, h('table', { testid: 'oauth-table' },
      h('thead', {}, h('tr', {},
        h('th', {}, 'Name'), h('th', {}, 'Server URL'), h('th', {}, 'Grant'), h('th', {}, 'Status'),
        h('th', {}, 'Expires'), h('th', { class: 'num' }, 'Refreshes'), h('th', {}, 'Last error'), h('th', {}))),
      h('tbody', {}, connections.map(row)))));
  }

  function row(c) {
    const again = RECONNECT.has(c.status);
    const working = busy.has(c.name);
    return h('tr', { testid: 'oauth-row', dataset: { name: c.name, status: c.status } },
      h('td', {},
        h('div', { class: 'primary mono' }, c.name),
        c.connected_at ? h('div', { class: 'secondary' }, 'connected ', timeEl(c.connected_at)) : null),
      h('td', { class: 'mono small wrap-any oauth-url' }, c.server_url),
      h('td', { class: 'nowrap small' }, c.grant),
      h('td', {}, badge(c.status, STATUS_KIND[c.status] ?? '', { testid: `oauth-status-${c.name}`, dataset: { status: c.status } })),
      h('td', { class: 'nowrap small', testid: `oauth-expires-${c.name}` }, c.expires_at ? formatTime(c.expires_at) : h('span', { class: 'muted' }, '—')),
      h('td', { class: 'num', testid: `oauth-refresh-count-${c.name}` }, String(c.refresh_count ?? 0)),
      h('td', { class: 'err', testid: `oauth-last-error-${c.name}` }, c.last_error ?? h('span', { class: 'muted' }, '—')),
      h('td', {}, canWrite ? h('div', { class: 'oauth-actions' },
        h('button', {
          type: 'button', class: `btn btn-small${again ? '' : ' btn-primary'}`, testid: `oauth-connect-${c.name}`,
          disabled: working, onclick: () => connect(c),
        }, working ? 'Connecting…' : again ? 'Reconnect' : 'Connect'),
        h('button', { type: 'button', class: 'btn btn-small', testid: `oauth-edit-${c.name}`, onclick: () => edit(c) }, 'Edit'),
        h('button', { type: 'button', class: 'btn btn-small btn-danger', testid: `oauth-delete-${c.name}`, onclick: () => remove(c) }, 'Delete')) : null));
  }

  function setBusy(name, on) {
    if (on) busy.add(name);
    else busy.delete(name);
    lastKey = '';
    draw();
  }

  async function connect(c) {
    connectError.hidden = true;
    setBusy(c.name, true);
    try {
      const outcome = await oauthApi.connect(c.name);
      if (outcome?.authorization_url) {
        // The authorization server sends the browser back to the registry's
        // callback, which comes back here with `?connected=<name>`.
        location.assign(outcome.authorization_url);
        return;
      }
      setBusy(c.name, false);
      toast(`Connected ${outcome?.connection?.name ?? c.name}`, 'ok');
      load();
    } catch (err) {
      if (disposed) return;
      setBusy(c.name, false);
      replace(connectError, h('div', { class: 'grow' }, h('b', {}, `Cannot connect ${c.name}: `), h('span', { testid: 'oauth-connect-error-message' }, err.message)));
      connectError.hidden = false;
      toast(`Cannot connect ${c.name}: ${err.message}`, 'error');
      load();
    }
  }

  function edit(c) {
    fill(c);
    form.scrollIntoView({ block: 'start', behavior: 'instant' });
    inputs.server_url.focus({ preventScroll: true });
  }

  async function remove(c) {
    const ok = await confirmDialog({
      title: `Delete the OAuth connection ${c.name}?`,
      body: h('p', {}, 'Its tokens are dropped. Records whose http.auth_ref names ', h('code', {}, c.name), ' cannot reach their server until it is added and connected again.'),
      confirmLabel: 'Delete',
      danger: true,
    });
    if (!ok) return;
    try {
      await oauthApi.remove(c.name);
      toast(`Deleted ${c.name}`, 'ok');
      if (inputs.name.value.trim() === c.name) fill(null);
    } catch (err) {
      toast(`Cannot delete ${c.name}: ${err.message}`, 'error');
    }
    lastKey = '';
    load();
  }

  load();
  return {
    el,
    isDirty: () => canWrite && snapshot() !== baseline,
    dispose() {
      disposed = true;
      clearTimeout(timer);
    },
  };
}
