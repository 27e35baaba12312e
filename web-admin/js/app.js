// The web admin's shell: sign-in, navigation, client-side routes.
//
// Routes (below /admin/): `` and `servers` (list), `servers/new`,
// `servers/<id>` (edit), `servers/<id>/history`, `workers`, `import`,
// `approvals`, `oauth` (OAuth connections, admin only; the registry's OAuth
// callback comes back to `oauth?connected=<name>`), `access` (who may call),
// `usage` (calls, errors and latency over time).
// The approver sees the approvals page only.
//
// One signs in with a registry token (or an API key), kept in this tab, or
// with the organisation's identity provider: the registry's sign-in sets a
// session cookie and comes back to the page, with `?signin_error=<message>`
// when it failed.

import { BASE, getToken, setToken, whoami, signinProviders, signinHref, signout, ApiError } from './api.js';
import { h, replace, stateBox, confirmDialog, toast, takeQueryParam } from './dom.js';
import { serversPage } from './servers.js';
import { serverPage } from './form.js';
import { historyPage } from './history.js';
import { workersPage } from './workers.js';
import { importPage } from './importer.js';
import { approvalsPage } from './approvals.js';
import { oauthPage } from './oauth.js';
import { accessPage } from './access.js';
import { usagePage } from './usage.js';

const root = document.getElementById('app');

const LOGO = `<svg viewBox="0 0 32 32" aria-hidden="true"><rect width="32" height="32" rx="7" fill="#3b5bdb"/><path d="M9 23 L23 9 M23 9 h-7 M23 9 v7" stroke="#fff" stroke-width="2.6" fill="none" stroke-linecap="round" stroke-linejoin="round"/><circle cx="11.5" cy="20.5" r="1.6" fill="#fff"/></svg>`;

function logo() {
  const span = h('span', { class: 'logo' });
  span.innerHTML = LOGO; // a constant, not data
  return span.firstChild;
}

const ROLES = ['admin', 'editor', 'viewer', 'approver', 'worker'];

/**
 * Session: the role and principal of the credential in use, `via` how it was
 * presented (`session` for the identity provider's cookie); `insecure` when
 * the registry needs no credential.
 */
const session = { role: null, principal: null, via: null, insecure: false };

/** The page on screen: `{dispose(), isDirty()}`. */
let current = null;
let main = null;
let nav = null;

/** Path below BASE, without leading/trailing slashes. */
function routePath() {
  let path = location.pathname.startsWith(BASE) ? location.pathname.slice(BASE.length) : '';
  if (location.pathname === BASE.replace(/\/$/, '')) path = '';
  return path.replace(/^\/+|\/+$/g, '');
}

/** Goes to `path` (below BASE). Asks first when the page has unsaved changes. */
async function navigate(path, { replace: replaceState = false, force = false } = {}) {
  if (!force && current?.isDirty?.()) {
    const leave = await confirmDialog({
      title: 'Discard unsaved changes?',
      body: 'You changed this form without saving. Leaving the page drops those changes.',
      confirmLabel: 'Discard changes',
      danger: true,
    });
    if (!leave) return;
  }
  const url = BASE + path;
  if (replaceState) history.replaceState(null, '', url);
  else history.pushState(null, '', url);
  render();
}

const context = {
  get role() { return session.role; },
  get isAdmin() { return session.role === 'admin'; },
  // Writes MCP server records (reference §5): admin and editor.
  get canEdit() { return session.role === 'admin' || session.role === 'editor'; },
  // Decides approvals: admin and approver.
  get canDecide() { return session.role === 'admin' || session.role === 'approver'; },
  // Reads OAuth connection status and approvals: a person's token, not the worker's.
  get isPerson() { return session.role !== 'worker'; },
  // Reads who may call and asks for explanations (reference §12.2).
  get canReadAccess() { return ['admin', 'editor', 'viewer'].includes(session.role); },
  // Reads usage (issue #25).
  get canReadUsage() { return ['admin', 'editor', 'viewer'].includes(session.role); },
  navigate,
  href: (path) => BASE + path,
};

/** An in-app link. */
export function link(path, props, ...children) {
  return h('a', { href: BASE + path, 'data-link': true, ...props }, ...children);
}
context.link = link;

function match(path) {
  const parts = path ? path.split('/').map(decodeURIComponent) : [];
  if (parts.length === 1 && parts[0] === 'approvals') return ['approvals', () => approvalsPage(context)];
  if (session.role === 'approver') return ['approvals', () => approvalsPage(context)];
  if (parts.length === 0 || (parts.length === 1 && parts[0] === 'servers')) return ['servers', () => serversPage(context)];
  if (parts[0] === 'servers' && parts.length === 2 && parts[1] === 'new') return ['servers', () => serverPage(context, { id: null })];
  if (parts[0] === 'servers' && parts.length === 2) return ['servers', () => serverPage(context, { id: parts[1] })];
  if (parts[0] === 'servers' && parts.length === 3 && parts[2] === 'history') return ['servers', () => historyPage(context, { id: parts[1] })];
  if (parts.length === 1 && parts[0] === 'workers') return ['workers', () => workersPage(context)];
  if (parts.length === 1 && parts[0] === 'import') return ['import', () => importPage(context)];
  if (parts.length === 1 && parts[0] === 'oauth') return ['oauth', () => oauthPage(context)];
  if (parts.length === 1 && parts[0] === 'access') return ['access', () => accessPage(context)];
  if (parts.length === 1 && parts[0] === 'usage') return ['usage', () => usagePage()];
  return ['', () => ({
    el: stateBox({
      title: 'Page not found',
      text: `Nothing lives at ${BASE}${path}.`,
      actions: [link('servers', { class: 'btn' }, 'Go to servers')],
      testid: 'not-found',
    }),
  })];
}

function render() {
  if (!session.role) return;
  current?.dispose?.();
  current = null;
  if (!main) shell();
  const [section, page] = match(routePath());
  for (const a of nav.querySelectorAll('a')) a.classList.toggle('active', a.dataset.section === section);
  let built;
  try {
    built = page();
  } catch (err) {
    console.error(err);
    built = { el: stateBox({ title: 'Something went wrong', text: err.message, kind: 'error', testid: 'error-state' }) };
  }
  current = built;
  replace(main, built.el);
  window.scrollTo(0, 0);
}

function shell() {
  const admin = session.role === 'admin';
  const approver = session.role === 'approver';
  const approvals = link('approvals', { dataset: { section: 'approvals' }, testid: 'nav-approvals' }, 'Approvals');
  nav = approver ? h('nav', { class: 'nav' }, approvals) : h('nav', { class: 'nav' },
    link('servers', { dataset: { section: 'servers' }, testid: 'nav-servers' }, 'Servers'),
    link('workers', { dataset: { section: 'workers' }, testid: 'nav-workers' }, 'Workers'),
    context.isPerson ? approvals : null,
    context.canEdit ? link('import', { dataset: { section: 'import' }, testid: 'nav-import' }, 'Import & rescan') : null,
    context.isPerson ? link('oauth', { dataset: { section: 'oauth' }, testid: 'nav-oauth' }, 'OAuth') : null,
    context.canReadAccess ? link('access', { dataset: { section: 'access' }, testid: 'nav-access' }, 'Access') : null,
    context.canReadUsage ? link('usage', { dataset: { section: 'usage' }, testid: 'nav-usage' }, 'Usage') : null);
  const roleBadge = session.insecure
    ? h('span', { class: 'role role-worker', testid: 'role-badge', dataset: { role: 'admin' }, title: 'The registry runs without credentials (loopback only)' }, 'no auth')
    : h('span', { class: `role role-${admin ? 'admin' : 'worker'}`, testid: 'role-badge', dataset: { role: session.role } },
      admin ? 'admin' : approver ? 'approver' : session.role === 'editor' ? 'editor' : session.role === 'viewer' ? 'viewer' : 'read-only');
  main = h('main', { id: 'main' });
  replace(root,
    h('header', { class: 'topbar' },
      link('servers', { class: 'brand' }, logo(), 'Quiver', h('small', {}, 'registry admin')),
      nav,
      h('div', { class: 'session' },
        session.principal ? h('span', { class: 'principal', testid: 'principal', title: session.principal }, session.principal) : null,
        roleBadge,
        session.insecure ? null : h('button', { type: 'button', class: 'btn btn-small', testid: 'sign-out', onclick: signOut }, 'Sign out'))),
    main);
}

/** Starts the session `me` (a `whoami` answer) got with `token` (`null`: none, or the session cookie). */
function start(me, token) {
  if (!ROLES.includes(me.role)) throw new ApiError(500, { message: `unexpected role ${JSON.stringify(me.role)}` });
  session.role = me.role;
  session.principal = me.principal ?? null;
  session.via = me.via ?? null;
  session.insecure = !token && session.via !== 'session';
  render();
}

/** Back to the sign-in page, with `notice` as its error. */
function end(notice) {
  setToken(null);
  session.role = null;
  session.principal = null;
  session.via = null;
  current?.dispose?.();
  current = null;
  main = null;
  signIn(notice);
}

async function signOut() {
  if (session.via === 'session') {
    try {
      await signout();
    } catch (err) {
      // A session the registry no longer knows is over anyway.
      if (err.status !== 401) {
        toast(`Cannot sign out: ${err.message}`, 'error');
        return;
      }
    }
  }
  end(null);
}

/** What `?signin_error=` the registry's sign-in came back with says, if any. */
function takeSigninError() {
  const message = takeQueryParam('signin_error');
  if (message === null) return null;
  return `Signing in with the identity provider failed: ${message || 'no reason given'}`;
}

/** The "Sign in with <name>" links, once the registry lists its providers (none: nothing shown). */
function providerLinks() {
  const box = h('div', { class: 'providers', testid: 'sign-in-providers', hidden: true });
  signinProviders().then((providers) => {
    if (!providers.length) return;
    replace(box,
      providers.map(({ name }) => h('a', {
        class: 'btn btn-primary', href: signinHref(name), testid: 'sign-in-provider', dataset: { provider: name },
      }, `Sign in with ${name}`)),
      h('div', { class: 'or' }, 'or with a registry token'));
    box.hidden = false;
  }, (err) => {
    // The token form still works; say why the buttons are missing.
    console.warn(`cannot list the identity providers: ${err.message}`);
  });
  return box;
}

function signIn(notice) {
  const input = h('input', {
    type: 'password', id: 'token', testid: 'token-input', autocomplete: 'off', spellcheck: 'false',
    placeholder: 'admin, editor, viewer, approver or worker token', required: true,
  });
  const error = h('div', { class: 'banner banner-error', testid: 'sign-in-error', hidden: !notice }, notice ?? '');
  const button = h('button', { type: 'submit', class: 'btn btn-primary', testid: 'sign-in' }, 'Sign in');
  const form = h('form', {
    onsubmit: async (event) => {
      event.preventDefault();
      const token = input.value.trim();
      if (!token) return;
      button.disabled = true;
      button.textContent = 'Signing in…';
      try {
        const me = await whoami(token);
        setToken(token);
        start(me, token);
      } catch (err) {
        setToken(null);
        error.hidden = false;
        error.textContent = err.status === 401
          ? 'This token is not accepted by the registry.'
          : `Cannot sign in: ${err.message}`;
        button.disabled = false;
        button.textContent = 'Sign in';
        input.select();
      }
    },
  },
  h('div', { class: 'field' }, h('label', { for: 'token' }, 'Token'), input,
    h('div', { class: 'hint' }, 'The admin and editor tokens can change records; the viewer and worker tokens give a read-only view; the approver token decides approvals. It is kept in this tab only (sessionStorage).')),
  error,
  button);
  replace(root,
    h('div', { class: 'signin-wrap', testid: 'sign-in-page' },
      h('div', { class: 'signin' },
        h('div', { class: 'brand' }, logo(), 'Quiver', h('small', {}, 'registry admin')),
        h('p', {}, 'Sign in to manage MCP servers.'),
        providerLinks(),
        form)));
  input.focus();
}

async function boot() {
  document.addEventListener('click', (event) => {
    const a = event.target.closest?.('a[data-link]');
    if (!a || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
    event.preventDefault();
    navigate(a.getAttribute('href').slice(BASE.length));
  });
  window.addEventListener('popstate', () => render());
  window.addEventListener('quiver:unauthenticated', () => {
    if (!session.role || session.insecure) return;
    end(session.via === 'session'
      ? 'Your session has ended. Sign in again.'
      : 'The registry no longer accepts your token. Sign in again.');
  });

  const signinError = takeSigninError();
  const token = getToken();
  try {
    start(await whoami(token), token);
    if (signinError) toast(signinError, 'error');
  } catch (err) {
    if (err.status === 401) {
      setToken(null);
      signIn(signinError ?? (token ? 'The registry no longer accepts your token. Sign in again.' : null));
    } else {
      replace(root, h('main', {}, stateBox({
        title: 'Cannot reach the registry',
        text: err.message,
        kind: 'error',
        testid: 'error-state',
        actions: [h('button', { class: 'btn', onclick: () => location.reload() }, 'Retry')],
      })));
    }
  }
}

boot();
