// Small DOM helpers: element builder, toasts, dialogs, time formatting.

/** Appends children (strings, nodes, arrays; null/false skipped) to `el`. */
export function append(el, children) {
  for (const child of children) {
    if (child == null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else if (child instanceof Node) el.append(child);
    else el.append(document.createTextNode(String(child)));
  }
  return el;
}

/**
 * Builds an element. Props: `class`, `testid` (data-testid), `dataset`,
 * `on<event>` listeners, `value`/`checked`/`disabled`/`hidden` as properties,
 * anything else as an attribute (`true` → empty attribute, null/false → none).
 */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props ?? {})) {
    if (value == null || value === false) continue;
    if (key === 'class') el.className = value;
    else if (key === 'testid') el.dataset.testid = value;
    else if (key === 'dataset') Object.assign(el.dataset, value);
    else if (key.startsWith('on') && typeof value === 'function') el.addEventListener(key.slice(2), value);
    else if (key === 'value' || key === 'checked' || key === 'disabled' || key === 'hidden') el[key] = value;
    else if (value === true) el.setAttribute(key, '');
    else el.setAttribute(key, String(value));
  }
  return append(el, children);
}

/** Replaces the children of `el`. */
export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

/** A short message in the corner that goes away by itself. */
export function toast(message, kind = 'info') {
  const box = document.getElementById('toasts');
  if (!box) return;
  const el = h('div', { class: `toast ${kind}`, testid: 'toast', role: kind === 'error' ? 'alert' : 'status' }, message);
  box.append(el);
  setTimeout(() => el.remove(), kind === 'error' ? 8000 : 4000);
}

/**
 * A modal dialog. `actions` are `{label, value, class, testid}`; resolves
 * with the chosen action's value (Escape resolves with `null`).
 */
export function dialog({ title, body, actions, testid = 'dialog' }) {
  return new Promise((resolve) => {
    const buttons = actions.map((action) =>
      h('button', { type: 'button', class: `btn ${action.class ?? ''}`, testid: action.testid }, action.label));
    const dlg = h('dialog', { class: 'dialog', testid },
      h('div', { class: 'dialog-inner' },
        h('h2', {}, title),
        h('div', { class: 'dialog-body' }, body),
        h('div', { class: 'dialog-actions' }, buttons)));
    const done = (value) => {
      if (dlg.open) dlg.close();
      dlg.remove();
      resolve(value);
    };
    buttons.forEach((button, i) => button.addEventListener('click', () => done(actions[i].value)));
    dlg.addEventListener('cancel', (event) => { event.preventDefault(); done(null); });
    document.body.append(dlg);
    dlg.showModal();
    const focus = buttons.find((_, i) => actions[i].autofocus) ?? buttons[0];
    focus?.focus();
  });
}

/** Asks for confirmation; resolves `true` only when confirmed. */
export async function confirmDialog({ title, body, confirmLabel = 'Confirm', danger = false }) {
  const choice = await dialog({
    title,
    body,
    testid: 'confirm-dialog',
    actions: [
      { label: 'Cancel', value: false, testid: 'confirm-cancel', autofocus: true },
      { label: confirmLabel, value: true, class: danger ? 'btn-danger solid' : 'btn-primary', testid: 'confirm-ok' },
    ],
  });
  return choice === true;
}

/** `2026-11-22 18:17:35` in local time. */
export function formatTime(iso) {
  if (!iso) return '—';
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return String(iso);
  const pad = (n) => String(n).padStart(2, '0');
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} `
    + `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
}

/** `12 s ago`, `5 min ago`, `3 h ago`, or the date. */
export function relativeTime(iso) {
  if (!iso) return '—';
  const then = new Date(iso).getTime();
  if (Number.isNaN(then)) return String(iso);
  const seconds = Math.round((Date.now() - then) / 1000);
  if (seconds < 5) return 'just now';
  if (seconds < 60) return `${seconds} s ago`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
  return formatTime(iso).slice(0, 10);
}

/** A time element: relative text, absolute time on hover. */
export function timeEl(iso) {
  return h('time', { datetime: iso ?? '', title: formatTime(iso) }, relativeTime(iso));
}

/** A status badge with a dot. */
export function badge(text, kind = '', props = {}) {
  return h('span', { class: `badge ${kind}`, ...props }, h('span', { class: 'dot' }), text);
}

/** A centered empty / error / loading box. */
export function stateBox({ title, text, actions = [], kind = '', testid }) {
  return h('div', { class: `state-box ${kind}`, testid },
    h('h2', {}, title),
    text ? h('p', {}, text) : null,
    actions.length ? h('div', { class: 'chips' }, actions) : null);
}

/** A loading line. */
export function loading(text = 'Loading…') {
  return h('div', { class: 'state-box', testid: 'loading' }, h('span', { class: 'spinner' }), ' ', text);
}

/** Calls `fn` once no call came for `ms` milliseconds. */
export function debounce(fn, ms) {
  let timer = null;
  const wrapped = (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
  wrapped.cancel = () => clearTimeout(timer);
  return wrapped;
}
