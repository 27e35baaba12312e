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

/**
 * The labelled fields of one form, able to show the registry's field errors.
 * `field(key, label, control, hint, extra)` builds one: the control gets the
 * id `<prefix>-f-<key>`, its error slot the testid `<prefix>-error-<key>`.
 * `show(errors)` marks the fields `[{field, message}]` names (a path such as
 * `scopes[0]` marks `scopes`), focuses the first and returns the errors no
 * field took; `clear()` removes every mark.
 */
export function fieldGroup(prefix) {
  const fields = new Map();
  const clear = () => {
    for (const { wrap, slot } of fields.values()) {
      wrap.classList.remove('invalid');
      slot.hidden = true;
      slot.textContent = '';
    }
  };
  return {
    field(key, label, control, hint = null, extra = null) {
      const id = `${prefix}-f-${key}`;
      control.id = id;
      const slot = h('div', { class: 'field-error', testid: `${prefix}-error-${key}`, hidden: true });
      const wrap = h('div', { class: 'field', dataset: { field: key } },
        h('label', { for: id }, label), control, typeof hint === 'string' ? h('div', { class: 'hint' }, hint) : hint, extra, slot);
      fields.set(key, { wrap, slot, control });
      return wrap;
    },
    clear,
    show(errors) {
      clear();
      const untaken = [];
      let first = null;
      for (const error of errors) {
        const target = fields.get(String(error.field).split(/[.[]/)[0]);
        if (!target) {
          untaken.push(error);
          continue;
        }
        target.wrap.classList.add('invalid');
        target.slot.textContent = target.slot.textContent ? `${target.slot.textContent}; ${error.message}` : error.message;
        target.slot.hidden = false;
        first = first ?? target.control;
      }
      first?.focus();
      return untaken;
    },
  };
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

/**
 * Query parameter `name` of the address (`null` when absent), taken off the
 * address so a reload or re-render does not act on it again.
 */
export function takeQueryParam(name) {
  const params = new URLSearchParams(location.search);
  if (!params.has(name)) return null;
  const value = params.get(name);
  params.delete(name);
  const rest = params.toString();
  history.replaceState(history.state, '', location.pathname + (rest ? `?${rest}` : '') + location.hash);
  return value;
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
