// Create / edit one MCP server record (R-UI-2), test its connection and
// preview its tools (R-UI-3).
//
// Saving never drops what the form did not touch: the body is the record as
// loaded (unknown fields included) with only the fields whose form value
// changed overwritten. Masked secrets (`********`) go back unchanged unless
// retyped; the registry then keeps the stored value.

import { servers as serversApi, workers as workersApi } from './api.js';
import { h, replace, toast, dialog, confirmDialog, stateBox, loading, timeEl, debounce, formatTime } from './dom.js';
import { diffRecords, renderDiff } from './diff.js';
import {
  MASK, TRANSPORTS, clone, contentOf, equal, setPath, deletePath, sourceKind, transportLabel,
  loadRecordDefaults,
} from './record.js';
import { serverStatus, stateBadge, statusTitle } from './status.js';
import { sourceBadge } from './servers.js';

/** Form paths whose empty value means "field absent". */
const OPTIONAL_TEXT = new Set(['display_name', 'tool_namespace', 'stdio.cwd', 'http.auth_ref']);
/** Paths that feed the tool preview's evaluation. */
const TOOL_PATHS = ['allowed_tools', 'denied_tools', 'transform', 'enabled', 'server_id'];

/** Writes one form value into a record body. */
function apply(body, path, value) {
  if (value == null || (OPTIONAL_TEXT.has(path) && value === '') || (path === 'stdio.inherit_env' && value === false)) {
    deletePath(body, path);
  } else {
    setPath(body, path, clone(value));
  }
}

export function serverPage(ctx, { id }) {
  const isNew = id == null;
  const readOnly = !ctx.canEdit;
  const el = h('div', { testid: 'server-page' }, loading(isNew ? 'Preparing the form…' : `Loading ${id}…`));
  const page = { el, dispose() { state.disposed = true; evaluateSoon.cancel(); }, isDirty: () => !readOnly && state.ready && isDirty() };

  const state = {
    disposed: false,
    ready: false,
    stored: null, // the stored record as loaded (masked), null when new
    base: {}, // its content: what a save starts from
    initial: null, // the form model right after loading (null when new)
    pristine: null, // same, for the "unsaved changes" indicator
    widgets: new Map(), // path → {get, set}
    targets: new Map(), // path → error target
    resolvers: [], // path → error target (rows of editors)
    shownErrors: [],
    transientErrors: false,
    preview: null, // last preview, normalized
    evaluatedKey: '',
    workers: [],
    defaults: null, // what the registry gives fields a record leaves out
  };

  const evaluateSoon = debounce(() => evaluate(), 350);

  // ---- widgets -------------------------------------------------------

  function errorSlot(container) {
    const slot = h('div', { class: 'field-error', testid: 'field-error', hidden: true });
    const target = {
      show(message, path) {
        slot.hidden = false;
        slot.dataset.for = path;
        slot.textContent = slot.textContent && slot.dataset.shown === '1' ? `${slot.textContent}; ${message}` : message;
        slot.dataset.shown = '1';
        container.classList.add('invalid');
        state.shownErrors.push(target);
        return container;
      },
      clear() {
        slot.hidden = true;
        slot.textContent = '';
        slot.dataset.shown = '';
        delete slot.dataset.for;
        container.classList.remove('invalid');
      },
    };
    return { slot, target };
  }

  /** A labelled field whose errors show below it; registers `path`. */
  function field(path, label, control, hint, { className = '' } = {}) {
    const wrap = h('div', { class: `field ${className}`, dataset: { field: path } });
    const { slot, target } = errorSlot(wrap);
    const inputId = `f-${path.replace(/[^A-Za-z0-9_-]/g, '-')}`;
    if (control instanceof HTMLElement && ['INPUT', 'SELECT', 'TEXTAREA'].includes(control.tagName)) control.id = inputId;
    append(wrap, h('label', { for: inputId }, label), control, hint ? h('div', { class: 'hint' }, hint) : null, slot);
    state.targets.set(path, target);
    return wrap;
  }

  function append(parent, ...children) {
    for (const child of children) if (child) parent.append(child);
    return parent;
  }

  function register(path, widget) {
    state.widgets.set(path, widget);
    return widget;
  }

  function textInput(path, value, { placeholder = '', mono = false, type = 'text' } = {}) {
    const input = h('input', {
      type, class: mono ? 'mono' : '', value: value ?? '', placeholder, disabled: readOnly,
      testid: `input-${path}`, spellcheck: 'false', autocomplete: 'off',
    });
    register(path, { get: () => input.value, set: (v) => { input.value = v ?? ''; } });
    return input;
  }

  function numberInput(path, value, placeholder) {
    const input = h('input', {
      type: 'number', min: 1, step: 1, value: value ?? '', placeholder: String(placeholder), disabled: readOnly,
      testid: `input-${path}`,
    });
    register(path, {
      get: () => (input.value.trim() === '' ? null : Number(input.value)),
      set: (v) => { input.value = v ?? ''; },
    });
    return input;
  }

  function selectInput(path, value, options, onChange) {
    const select = h('select', { disabled: readOnly, testid: `input-${path}` },
      options.map(([v, text]) => h('option', { value: v }, text)));
    select.value = value;
    if (select.value !== value && value != null) {
      // A value this form does not know: keep it selectable so it is not lost.
      select.append(h('option', { value }, value));
      select.value = value;
    }
    if (onChange) select.addEventListener('change', onChange);
    register(path, { get: () => select.value, set: (v) => { select.value = v; onChange?.(); } });
    return select;
  }

  function checkbox(path, checked, label) {
    const input = h('input', { type: 'checkbox', checked: Boolean(checked), disabled: readOnly, testid: `input-${path}` });
    register(path, { get: () => input.checked, set: (v) => { input.checked = Boolean(v); } });
    return h('label', { class: 'check' }, input, label);
  }

  /** Rows of single values (args, patterns, env_from). */
  function listEditor(path, values, { placeholder = '', mono = true, addLabel = '+ Add' } = {}) {
    const rowsEl = h('div', { class: 'rows', testid: `rows-${path}` });
    const empty = h('div', { class: 'rows-empty' }, 'None');
    let rows = [];
    const refresh = () => { empty.hidden = rows.length > 0; };
    function addRow(value = '') {
      const input = h('input', {
        type: 'text', class: mono ? 'mono' : '', value, placeholder, disabled: readOnly,
        testid: `item-${path}`, spellcheck: 'false', autocomplete: 'off',
      });
      const row = h('div', { class: 'row' }, input);
      const { slot, target } = errorSlot(row);
      if (!readOnly) {
        row.append(h('button', {
          type: 'button', class: 'btn btn-ghost icon-btn', title: 'Remove', 'aria-label': 'Remove', testid: `remove-${path}`,
          onclick: () => { rows = rows.filter((r) => r.row !== row); row.remove(); refresh(); changed(); },
        }, '×'));
      }
      row.append(slot);
      rows.push({ row, input, target });
      rowsEl.append(row);
      refresh();
      return input;
    }
    (values ?? []).forEach((v) => addRow(String(v)));
    refresh();
    const filled = () => rows.filter((r) => r.input.value.trim() !== '');
    register(path, {
      get: () => filled().map((r) => r.input.value),
      set: (vals) => { rows.forEach((r) => r.row.remove()); rows = []; (vals ?? []).forEach((v) => addRow(String(v))); refresh(); },
    });
    const re = new RegExp(`^${path.replace(/[.[\]]/g, '\\$&')}\\[(\\d+)\\]$`);
    state.resolvers.push((p) => {
      const m = p.match(re);
      return m ? filled()[Number(m[1])]?.target ?? null : null;
    });
    return h('div', { class: 'rows-wrap' }, rowsEl, empty, readOnly ? null : h('button', {
      type: 'button', class: 'btn btn-small add-row', testid: `add-${path}`,
      onclick: () => { addRow().focus(); },
    }, addLabel));
  }

  /** Key/value rows (env, headers, labels, approval_tools). */
  function kvEditor(path, object, { keyPlaceholder = 'KEY', valuePlaceholder = 'value', options = null, masked = false, addLabel = '+ Add' } = {}) {
    const rowsEl = h('div', { class: 'rows', testid: `rows-${path}` });
    const empty = h('div', { class: 'rows-empty' }, 'None');
    let rows = [];
    const refresh = () => { empty.hidden = rows.length > 0; };
    function addRow(key = '', value = '') {
      const keyInput = h('input', {
        type: 'text', class: 'mono k', value: key, placeholder: keyPlaceholder, disabled: readOnly,
        testid: `key-${path}`, spellcheck: 'false', autocomplete: 'off', 'aria-label': `${path} key`,
      });
      let valueInput;
      if (options) {
        valueInput = h('select', { class: 'sel', disabled: readOnly, testid: `value-${path}`, 'aria-label': `${path} value` },
          options.map(([v, t]) => h('option', { value: v }, t)));
        valueInput.value = value || options[0][0];
      } else {
        valueInput = h('input', {
          type: 'text', class: 'mono', value, placeholder: valuePlaceholder, disabled: readOnly,
          testid: `value-${path}`, spellcheck: 'false', autocomplete: 'off', 'aria-label': `${path} value`,
        });
        if (masked) {
          const mark = () => {
            const isMask = valueInput.value === MASK;
            valueInput.classList.toggle('masked', isMask);
            valueInput.title = isMask ? 'A stored secret, hidden. Leave it to keep it; type a new value to replace it.' : '';
          };
          valueInput.addEventListener('input', mark);
          valueInput.addEventListener('focus', () => { if (valueInput.value === MASK) valueInput.select(); });
          mark();
        }
      }
      const row = h('div', { class: 'row', dataset: { key } }, keyInput, valueInput);
      keyInput.addEventListener('input', () => { row.dataset.key = keyInput.value; });
      const { slot, target } = errorSlot(row);
      if (!readOnly) {
        row.append(h('button', {
          type: 'button', class: 'btn btn-ghost icon-btn', title: 'Remove', 'aria-label': 'Remove', testid: `remove-${path}`,
          onclick: () => { rows = rows.filter((r) => r.row !== row); row.remove(); refresh(); changed(); },
        }, '×'));
      }
      row.append(slot);
      rows.push({ row, keyInput, valueInput, target });
      rowsEl.append(row);
      refresh();
      return keyInput;
    }
    for (const [k, v] of Object.entries(object ?? {})) addRow(k, String(v));
    refresh();
    register(path, {
      get: () => {
        const out = {};
        for (const r of rows) if (r.keyInput.value.trim() !== '') out[r.keyInput.value] = r.valueInput.value;
        return out;
      },
      set: (obj) => { rows.forEach((r) => r.row.remove()); rows = []; for (const [k, v] of Object.entries(obj ?? {})) addRow(k, String(v)); refresh(); },
    });
    state.resolvers.push((p) => {
      if (!p.startsWith(`${path}.`)) return null;
      const key = p.slice(path.length + 1);
      return rows.find((r) => r.keyInput.value === key)?.target ?? null;
    });
    return h('div', { class: 'rows-wrap' }, rowsEl, empty, readOnly ? null : h('button', {
      type: 'button', class: 'btn btn-small add-row', testid: `add-${path}`,
      onclick: () => { addRow().focus(); },
    }, addLabel));
  }

  /** Ordered tool-name transform steps (docs/reference.md §13.3). */
  function transformEditor(path, steps) {
    const rowsEl = h('div', { class: 'rows', testid: `rows-${path}` });
    const empty = h('div', { class: 'rows-empty' }, 'No transform: tools keep their raw names');
    let rows = [];
    const refresh = () => { empty.hidden = rows.length > 0; };
    function addRow(step = { prefix: '' }) {
      let kind = 'prefix';
      let a = '';
      let b = '';
      if (step && typeof step.prefix === 'string') { kind = 'prefix'; a = step.prefix; }
      else if (step && step.prefix && typeof step.prefix === 'object') { kind = 'replace'; a = step.prefix.remove ?? ''; b = step.prefix.add ?? ''; }
      else if (step && typeof step.suffix === 'string') { kind = 'suffix'; a = step.suffix; }
      else { kind = 'json'; a = JSON.stringify(step); }
      const kindSelect = h('select', { class: 'sel', disabled: readOnly, testid: 'transform-kind', 'aria-label': 'Transform step' },
        h('option', { value: 'prefix' }, 'add prefix'),
        h('option', { value: 'replace' }, 'replace prefix'),
        h('option', { value: 'suffix' }, 'add suffix'),
        kind === 'json' ? h('option', { value: 'json' }, 'other (JSON)') : null);
      kindSelect.value = kind;
      const aInput = h('input', { type: 'text', class: 'mono', value: a, disabled: readOnly, testid: 'transform-a', spellcheck: 'false' });
      const bInput = h('input', { type: 'text', class: 'mono', value: b, disabled: readOnly, testid: 'transform-b', spellcheck: 'false', placeholder: 'new prefix' });
      const sync = () => {
        bInput.hidden = kindSelect.value !== 'replace';
        aInput.placeholder = { prefix: 'prefix_', replace: 'old prefix', suffix: '_suffix', json: '{"prefix": "x_"}' }[kindSelect.value];
      };
      kindSelect.addEventListener('change', () => { sync(); changed(); });
      sync();
      const row = h('div', { class: 'row' }, kindSelect, aInput, bInput);
      const { slot, target } = errorSlot(row);
      if (!readOnly) {
        row.append(h('button', {
          type: 'button', class: 'btn btn-ghost icon-btn', title: 'Remove', 'aria-label': 'Remove', testid: 'remove-transform',
          onclick: () => { rows = rows.filter((r) => r.row !== row); row.remove(); refresh(); changed(); },
        }, '×'));
      }
      row.append(slot);
      const entry = {
        row,
        target,
        blank: () => aInput.value.trim() === '' && bInput.value.trim() === '',
        get() {
          switch (kindSelect.value) {
            case 'replace': return { prefix: { remove: aInput.value, add: bInput.value } };
            case 'suffix': return { suffix: aInput.value };
            case 'json': try { return JSON.parse(aInput.value); } catch { return aInput.value; }
            default: return { prefix: aInput.value };
          }
        },
      };
      rows.push(entry);
      rowsEl.append(row);
      refresh();
      return aInput;
    }
    (steps ?? []).forEach((s) => addRow(s));
    refresh();
    // A row left blank is not a step yet (like empty rows of the other editors).
    const filled = () => rows.filter((r) => !r.blank());
    register(path, {
      get: () => filled().map((r) => r.get()),
      set: (vals) => { rows.forEach((r) => r.row.remove()); rows = []; (vals ?? []).forEach((s) => addRow(s)); refresh(); },
    });
    state.resolvers.push((p) => {
      const m = p.match(/^transform\[(\d+)\]/);
      return m ? filled()[Number(m[1])]?.target ?? null : null;
    });
    return h('div', { class: 'rows-wrap' }, rowsEl, empty, readOnly ? null : h('button', {
      type: 'button', class: 'btn btn-small add-row', testid: 'add-transform',
      onclick: () => { addRow().focus(); },
    }, '+ Add step'));
  }

  // ---- model ---------------------------------------------------------

  function readModel() {
    const model = {};
    for (const [path, widget] of state.widgets) model[path] = widget.get();
    if (model.approval_policy !== 'policy') model.approval_tools = {};
    return model;
  }

  function isDirty() {
    return state.pristine != null && !equal(readModel(), state.pristine);
  }

  /** The record as the form has it: the loaded record with the changed fields overwritten. */
  function buildBody() {
    const body = clone(state.base);
    const now = readModel();
    const initial = state.initial;
    const transportChanged = initial == null || now.transport !== initial.transport;
    const section = now.transport === 'stdio' ? 'stdio.' : 'http.';
    for (const path of Object.keys(now)) {
      const forced = initial == null || (transportChanged && path.startsWith(section));
      if (forced || !equal(now[path], initial[path])) apply(body, path, now[path]);
    }
    if (transportChanged) {
      if (now.transport === 'stdio') delete body.http;
      else delete body.stdio;
    }
    return body;
  }

  // ---- errors --------------------------------------------------------

  function findTarget(path) {
    let p = path;
    while (p) {
      if (state.targets.has(p)) return state.targets.get(p);
      for (const resolve of state.resolvers) {
        const target = resolve(p);
        if (target) return target;
      }
      const m = p.match(/^(.*)(\[\d+\]|\.[^.[]*)$/);
      p = m ? m[1] : '';
    }
    return null;
  }

  function clearErrors() {
    for (const target of state.shownErrors.splice(0)) target.clear();
    formBanner.hidden = true;
    state.transientErrors = false;
  }

  /** Shows field errors; `transient` ones (live evaluation) go away once the settings evaluate cleanly. */
  function showErrors(err, title = 'The registry refused this record', { scroll = true, transient = false } = {}) {
    clearErrors();
    state.transientErrors = transient;
    const list = err.fieldErrors?.() ?? [];
    let first = null;
    for (const { field: path, message } of list) {
      const target = findTarget(path);
      const container = target?.show(message, path);
      first = first ?? container;
    }
    replace(formBanner,
      h('div', { class: 'grow' },
        h('b', {}, `${title}: `),
        list.length
          ? h('ul', { class: 'small' }, list.map((e) => h('li', {}, h('code', {}, e.field), ` ${e.message}`)))
          : err.message));
    formBanner.hidden = false;
    if (scroll) {
      (first ?? formBanner).scrollIntoView({ block: 'center', behavior: 'instant' });
      first?.querySelector('input,select')?.focus({ preventScroll: true });
    }
  }

  // ---- layout ----------------------------------------------------------

  const formBanner = h('div', { class: 'banner banner-error', testid: 'form-error', role: 'alert', hidden: true });
  const dirtyNote = h('span', { class: 'state', testid: 'dirty-state' }, '');
  let sections = {};

  function changed() {
    if (!state.ready) return;
    const dirty = isDirty();
    dirtyNote.textContent = readOnly ? 'Read-only view' : dirty ? 'Unsaved changes' : isNew ? '' : 'No changes';
    dirtyNote.classList.toggle('dirty', dirty);
    const model = readModel();
    const key = JSON.stringify(TOOL_PATHS.map((p) => model[p]));
    if (state.preview && key !== state.evaluatedKey) {
      previewNote('Patterns changed: re-evaluating…', 'muted');
      evaluateSoon();
    }
  }

  function syncSections() {
    const transport = state.widgets.get('transport')?.get();
    if (sections.stdio) sections.stdio.hidden = transport !== 'stdio';
    if (sections.http) sections.http.hidden = transport === 'stdio';
    const policy = state.widgets.get('approval_policy')?.get();
    if (sections.approvalTools) sections.approvalTools.hidden = policy !== 'policy';
  }

  function card(title, desc, ...children) {
    return h('section', { class: 'card' },
      h('div', { class: 'card-head' }, h('h2', {}, title)),
      desc ? h('p', { class: 'desc' }, desc) : null,
      ...children);
  }

  // ---- preview -------------------------------------------------------

  const previewBody = h('div', { testid: 'preview' });
  const previewStatus = h('div', { class: 'small muted', testid: 'preview-note' });
  const testButton = h('button', { type: 'button', class: 'btn', testid: 'test-connection', onclick: () => testConnection() }, 'Test connection');

  function previewNote(text, kind = '') {
    previewStatus.className = `small ${kind}`;
    previewStatus.textContent = text;
  }

  function normalizeTool(tool) {
    const reason = tool.reason == null ? null
      : typeof tool.reason === 'string' ? { code: tool.reason, message: '' }
        : { code: tool.reason.code ?? '', message: tool.reason.message ?? '' };
    const injected = tool.injected_name ?? null;
    return {
      name: tool.name ?? tool.tool_name ?? '?',
      description: tool.description ?? '',
      injected_name: injected,
      exposed_name: tool.exposed_name ?? null,
      allowed: typeof tool.allowed === 'boolean' ? tool.allowed : typeof tool.injected === 'boolean' ? tool.injected : Boolean(injected && !reason),
      reason,
    };
  }

  function normalizePreview(result) {
    const info = result?.server_info ?? result?.server ?? result?.serverInfo ?? result?.initialize ?? null;
    return {
      info,
      protocol: result?.protocol_version ?? info?.protocol_version ?? info?.protocolVersion ?? null,
      instructions: result?.instructions ?? null,
      elapsed: typeof result?.duration_ms === 'number' ? Math.round(result.duration_ms) : null,
      note: result?.note ?? null,
      tools: (result?.tools ?? []).map(normalizeTool),
    };
  }

  function renderPreview() {
    const p = state.preview;
    if (!p) {
      replace(previewBody, h('div', { class: 'rows-empty', testid: 'preview-empty' },
        readOnly
          ? 'Testing a connection needs the editor or admin role.'
          : 'Run "Test connection" to start the server with this form\'s settings (initialize + tools/list) and see which tools workers would inject.'));
      return;
    }
    const injected = p.tools.filter((t) => t.allowed).length;
    const name = p.info?.name ?? p.info?.server_name;
    const version = p.info?.version;
    const toolRow = (t) => h('tr', { testid: 'preview-tool', dataset: { tool: t.name, allowed: String(t.allowed) } },
      h('td', { class: 'wrap-any' },
        h('div', { class: 'mono primary', testid: 'tool-name' }, t.name),
        t.description ? h('div', { class: 'secondary' }, t.description) : null),
      h('td', {}, t.allowed
        ? h('span', { class: 'badge allowed', testid: 'tool-result' }, '✓ injected')
        : h('span', { class: 'badge rejected', testid: 'tool-result' }, '✕ rejected')),
      h('td', {},
        t.injected_name ? h('div', { class: 'injected', testid: 'injected-name' }, t.injected_name) : null,
        t.reason
          ? h('div', { class: 'reason', testid: 'tool-reason', dataset: { code: t.reason.code } },
            h('code', { testid: 'reason-code' }, t.reason.code), t.reason.message ? ` ${t.reason.message}` : '')
          : null));
    const table = h('div', { class: 'table-wrap preview' },
      h('table', { testid: 'preview-table' },
        h('thead', {}, h('tr', {}, h('th', {}, 'Tool'), h('th', {}, 'Result'), h('th', {}, 'Injected name / reason'))),
        h('tbody', {}, p.tools.map(toolRow))));
    replace(previewBody,
      h('div', { class: 'preview-info', testid: 'preview-info' },
        h('span', {}, 'Server ', h('b', { testid: 'preview-server-name' }, name ?? '(unnamed)'), version ? ` ${version}` : ''),
        p.protocol ? h('span', {}, 'Protocol ', h('b', {}, p.protocol)) : null,
        h('span', { testid: 'preview-counts' }, h('b', {}, String(p.tools.length)), ' tools, ', h('b', {}, String(injected)), ' injected'),
        p.elapsed != null ? h('span', {}, `${p.elapsed} ms`) : null),
      p.note ? h('div', { class: 'banner banner-warn small', testid: 'preview-disabled-note' }, p.note) : null,
      p.tools.length === 0 ? h('div', { class: 'rows-empty' }, 'The server lists no tools.') : table);
  }

  async function testConnection() {
    testButton.disabled = true;
    testButton.replaceChildren(h('span', { class: 'spinner' }), ' Connecting…');
    previewNote('Starting the server and listing its tools…', 'muted');
    const record = buildBody();
    try {
      const result = await serversApi.preview(record);
      if (state.disposed) return;
      state.preview = normalizePreview(result);
      state.evaluatedKey = JSON.stringify(TOOL_PATHS.map((p) => readModel()[p]));
      previewNote(`Tested ${formatTime(new Date().toISOString())} with the form's current settings.`, 'muted');
      renderPreview();
    } catch (err) {
      if (state.disposed) return;
      state.preview = null;
      if (err.status === 400 && err.field) showErrors(err, 'Fix the record before testing it');
      replace(previewBody, h('div', { class: 'banner banner-error', testid: 'preview-error' },
        h('div', { class: 'grow' }, h('b', {}, 'Test failed: '), err.message)));
      previewNote('');
    } finally {
      testButton.disabled = false;
      testButton.textContent = 'Test connection';
    }
  }

  async function evaluate() {
    const p = state.preview;
    if (!p || state.disposed) return;
    const model = readModel();
    const key = JSON.stringify(TOOL_PATHS.map((path) => model[path]));
    try {
      const result = await serversApi.evaluate(buildBody(), p.tools.map((t) => t.name));
      if (state.disposed || state.preview !== p) return;
      const byName = new Map((result?.tools ?? []).map((t) => [t.name ?? t.tool_name, normalizeTool(t)]));
      p.tools = p.tools.map((t) => {
        const next = byName.get(t.name);
        return next ? { ...t, injected_name: next.injected_name, allowed: next.allowed, reason: next.reason } : t;
      });
      state.evaluatedKey = key;
      p.note = result?.note ?? null;
      if (state.transientErrors) clearErrors();
      renderPreview();
      previewNote('Re-evaluated with the unsaved patterns (not saved yet).', 'muted');
      previewStatus.dataset.testid = 'preview-note';
      previewStatus.dataset.evaluated = key;
    } catch (err) {
      if (state.disposed) return;
      previewBody.querySelector('table')?.classList.add('stale');
      previewNote(`Cannot evaluate these settings yet: ${err.message}`, 'field-error');
      if (err.status === 400) {
        // Errors about the record name its fields as `record.<path>`.
        const list = err.fieldErrors().filter((e) => e.field.startsWith('record.'))
          .map((e) => ({ field: e.field.slice('record.'.length), message: e.message }));
        if (list.length) showErrors({ fieldErrors: () => list, message: err.message }, 'Not valid yet', { scroll: false, transient: true });
      }
    }
  }

  // ---- status of this server on the workers ----------------------------

  function statusCard() {
    const st = serverStatus(state.stored?.server_id, state.workers, { enabled: state.stored?.enabled !== false });
    return h('section', { class: 'card', testid: 'server-status' },
      h('div', { class: 'card-head' }, h('h2', {}, 'Status on workers'), stateBadge(st.state, { title: statusTitle(st) })),
      st.perWorker.length === 0
        ? h('div', { class: 'rows-empty' }, 'No worker has reported this server yet (workers report every few seconds once they serve it).')
        : h('div', { class: 'table-wrap' }, h('table', {},
          h('thead', {}, h('tr', {}, h('th', {}, 'Worker'), h('th', {}, 'State'), h('th', { class: 'num' }, 'Tools'),
            h('th', { class: 'num' }, 'Reconnects'), h('th', { class: 'num', title: 'Live connections of a per_session server' }, 'Sessions'),
            h('th', { class: 'num' }, 'p50'), h('th', {}, 'Last error'))),
          h('tbody', {}, st.perWorker.map((w) => h('tr', { testid: 'server-worker', dataset: { workerId: w.worker_id } },
            h('td', { class: 'mono' }, w.worker_id), h('td', {}, stateBadge(w.state)),
            h('td', { class: 'num' }, w.tool_count ?? '—'), h('td', { class: 'num' }, w.reconnect_count ?? 0),
            h('td', { class: 'num', testid: 'server-worker-sessions' }, w.session_connections ?? 0),
            h('td', { class: 'num' }, w.p50_latency_ms != null ? `${Math.round(w.p50_latency_ms)} ms` : '—'),
            h('td', { class: 'err' }, w.last_error ?? h('span', { class: 'muted' }, '—'))))))));
  }

  // ---- the form --------------------------------------------------------

  function renderForm(stored) {
    state.ready = false;
    state.stored = stored;
    state.base = stored ? contentOf(stored) : {};
    state.widgets = new Map();
    state.targets = new Map();
    state.resolvers = [];
    state.shownErrors = [];
    state.transientErrors = false;
    formBanner.hidden = true;
    const r = state.base;
    const transport = r.transport ?? 'stdio';
    const budgets = r.budgets ?? {};
    const defaultBudgets = state.defaults.budgets;

    const serverIdInput = isNew
      ? textInput('server_id', '', { placeholder: 'e.g. github', mono: true })
      : h('input', { type: 'text', class: 'mono', value: r.server_id, disabled: true, testid: 'input-server_id' });

    sections = {};
    sections.stdio = h('div', { testid: 'section-stdio' },
      h('div', { class: 'grid-2' },
        field('stdio.command', 'Command', textInput('stdio.command', r.stdio?.command, { placeholder: 'npx, /usr/local/bin/server, …', mono: true }),
          'Looked up on the worker\'s PATH when not absolute.', { className: 'span-2' }),
        field('stdio.args', 'Arguments', listEditor('stdio.args', r.stdio?.args, { placeholder: '--flag', addLabel: '+ Add argument' }), 'One argument per row, in order.'),
        field('stdio.env_from', 'Environment from the worker (env_from)', listEditor('stdio.env_from', r.stdio?.env_from, { placeholder: 'VAR_NAME', addLabel: '+ Add variable' }),
          'Each name X is passed as ${ENV:X} from the worker.'),
        field('stdio.env', 'Environment (env)', kvEditor('stdio.env', r.stdio?.env, { keyPlaceholder: 'NAME', valuePlaceholder: 'value or ${ENV:VAR}', masked: true, addLabel: '+ Add variable' }),
          'Literal values are secrets: shown masked, kept unless you type a new value. ${ENV:VAR} and ${ENV:VAR:-default} are resolved on workers.', { className: 'span-2' }),
        field('stdio.cwd', 'Working directory', textInput('stdio.cwd', r.stdio?.cwd, { placeholder: '(worker\'s default)', mono: true })),
        field('stdio.inherit_env', 'Worker environment', checkbox('stdio.inherit_env', r.stdio?.inherit_env, 'Inherit the worker\'s whole environment (inherit_env)'),
          'Off: only PATH, HOME, LANG… plus env, so the worker\'s own secrets do not leak.')));
    const stdioError = errorSlot(sections.stdio);
    sections.stdio.append(stdioError.slot);
    state.targets.set('stdio', stdioError.target);

    sections.http = h('div', { testid: 'section-http' },
      h('div', { class: 'grid-2' },
        field('http.url', 'URL', textInput('http.url', r.http?.url, { placeholder: 'https://mcp.example.com/mcp', mono: true, type: 'url' }),
          'Credentials in the URL (user:password@, api_key=, token=, sig= …) are secrets: shown masked, kept unless you type a new value.', { className: 'span-2' }),
        field('http.headers', 'Headers', kvEditor('http.headers', r.http?.headers, { keyPlaceholder: 'Header-Name', valuePlaceholder: 'value or ${ENV:VAR}', masked: true, addLabel: '+ Add header' }),
          'Literal values are secrets: shown masked, kept unless you type a new value.', { className: 'span-2' }),
        field('http.auth_ref', 'Credential reference (auth_ref)', textInput('http.auth_ref', r.http?.auth_ref, { placeholder: 'name of a credential held outside the registry', mono: true }))));
    const httpError = errorSlot(sections.http);
    sections.http.append(httpError.slot);
    state.targets.set('http', httpError.target);

    sections.approvalTools = field('approval_tools', 'Per-tool approval (approval_tools)',
      kvEditor('approval_tools', r.approval_tools, { keyPlaceholder: 'tool pattern', options: [['always', 'always'], ['never', 'never']], addLabel: '+ Add pattern' }),
      'Patterns of raw tool names; the first match decides.');

    const general = card('General', null,
      h('div', { class: 'grid-2' },
        field('server_id', 'Server id', serverIdInput, isNew ? 'Letters, digits, - and _; at most 64 characters. Cannot be changed later.' : 'The stable key of this record.'),
        field('display_name', 'Display name', textInput('display_name', r.display_name, { placeholder: 'Shown to admins' })),
        field('transport', 'Transport', selectInput('transport', transport, TRANSPORTS, () => { syncSections(); changed(); }), 'stdio starts a child process on each worker; the HTTP transports reach a URL.'),
        field('isolation', 'Isolation', selectInput('isolation', r.isolation ?? 'shared', [['shared', 'shared: one pooled client'], ['per_session', 'per_session: a client per chat session']])),
        field('tool_namespace', 'Tool namespace', textInput('tool_namespace', r.tool_namespace, { placeholder: `mcp.${r.server_id ?? '<server_id>'}`, mono: true }), 'Audit grouping; defaults to mcp.<server_id>.'),
        field('enabled', 'Enabled', checkbox('enabled', r.enabled !== false, 'Workers may use this server'), 'Disabled records stay stored but are never injected.')));

    const connection = card('Connection', 'How workers start or reach the server.', sections.stdio, sections.http);

    const tools = card('Tools', 'Default deny: with no allowed pattern, no tool of this server is ever injected. * matches any substring; deny wins over allow.',
      h('div', { class: 'grid-2' },
        field('allowed_tools', 'Allowed tools', listEditor('allowed_tools', r.allowed_tools, { placeholder: 'read_*', addLabel: '+ Add pattern' })),
        field('denied_tools', 'Denied tools', listEditor('denied_tools', r.denied_tools, { placeholder: '*delete*', addLabel: '+ Add pattern' })),
        field('transform', 'Name transforms', transformEditor('transform', r.transform), 'Applied in order to the raw name; filters still match the raw name.', { className: 'span-2' })),
      h('div', { class: 'card-head preview-head' },
        h('h3', {}, 'Tool preview'),
        readOnly ? null : testButton),
      previewStatus,
      previewBody);

    const content = card('Resources and prompts',
      'Default deny, like tools: with no pattern, no resource or prompt of this server is offered. Resource patterns match the whole URI, prompt patterns the name; * matches any substring, / included, and \\? is a literal ?. Served by the workers\' MCP endpoints (/mcp/{server_id}); tools are unaffected.',
      h('div', { class: 'grid-2' },
        field('allowed_resources', 'Allowed resources', listEditor('allowed_resources', r.allowed_resources, { placeholder: 'file:///data/*.md', addLabel: '+ Add URI pattern' })),
        field('allowed_prompts', 'Allowed prompts', listEditor('allowed_prompts', r.allowed_prompts, { placeholder: 'summarize*', addLabel: '+ Add pattern' }))));

    const approval = card('Approval', null,
      h('div', { class: 'grid-2' },
        field('approval_policy', 'Approval policy', selectInput('approval_policy', r.approval_policy ?? 'never',
          [['never', 'never: calls run without approval'], ['always', 'always: every call needs an approval'], ['policy', 'policy: per tool']],
          () => { syncSections(); changed(); })),
        sections.approvalTools));

    const budgetsCard = card('Budgets', 'Enforced by every worker for this server.',
      h('div', { class: 'grid-3' },
        field('budgets.tool_timeout_ms', 'Tool timeout (ms)', numberInput('budgets.tool_timeout_ms', budgets.tool_timeout_ms, defaultBudgets.tool_timeout_ms), `Default ${defaultBudgets.tool_timeout_ms}.`),
        field('budgets.max_concurrency', 'Max concurrency', numberInput('budgets.max_concurrency', budgets.max_concurrency, defaultBudgets.max_concurrency), `Calls in flight per worker. Default ${defaultBudgets.max_concurrency}.`),
        field('budgets.max_tool_output_bytes', 'Max tool output (bytes)', numberInput('budgets.max_tool_output_bytes', budgets.max_tool_output_bytes, defaultBudgets.max_tool_output_bytes), `Longer output is cut and marked. Default ${defaultBudgets.max_tool_output_bytes}.`),
        field('budgets.session_idle_ms', 'Session idle time (ms)', numberInput('budgets.session_idle_ms', budgets.session_idle_ms, 'worker default'), 'isolation = "per_session": a session unused this long ends (1000 to 86400000). Empty: the worker\'s.')));
    const budgetsError = errorSlot(budgetsCard);
    budgetsCard.append(budgetsError.slot);
    state.targets.set('budgets', budgetsError.target);

    const labels = card('Labels', 'Free-form metadata.',
      field('labels', 'Labels', kvEditor('labels', r.labels, { keyPlaceholder: 'key', valuePlaceholder: 'value', addLabel: '+ Add label' })));

    const banners = [];
    if (readOnly) {
      banners.push(h('div', { class: 'banner banner-info', testid: 'read-only-banner' },
        h('div', { class: 'grow' }, h('b', {}, 'Read-only. '), 'You are signed in with a token that can only read: you can look, not change. Secret values are masked.')));
    }
    if (stored && sourceKind(stored.source) === 'file') {
      banners.push(h('div', { class: 'banner banner-warn', testid: 'file-banner' },
        h('div', { class: 'grow' }, h('b', {}, `Managed by mcp.d/${stored.source.slice(5)}. `),
          'Saving here makes it an admin-managed record: rescans of that file no longer change it.')));
    }

    const footer = h('div', { class: 'form-footer' },
      dirtyNote,
      readOnly
        ? ctx.link('servers', { class: 'btn', testid: 'back' }, 'Back to servers')
        : ctx.link(isNew ? 'servers' : `servers/${encodeURIComponent(id)}`, {
          class: 'btn',
          testid: 'cancel',
          onclick: (e) => { if (!isNew) { e.preventDefault(); e.stopPropagation(); reset(); } },
        }, isNew ? 'Cancel' : 'Discard changes'),
      readOnly ? null : h('button', { type: 'submit', class: 'btn btn-primary', testid: 'save' }, isNew ? 'Create server' : 'Save changes'));

    const form = h('form', {
      testid: 'server-form', novalidate: true,
      onsubmit: (event) => { event.preventDefault(); if (!readOnly) save(); },
      oninput: () => changed(),
      onchange: () => changed(),
    }, formBanner, general, connection, tools, content, approval, budgetsCard, labels, footer);

    replace(el, header(stored), ...banners, stored ? statusCard() : null, form);
    syncSections();
    const model = readModel();
    state.initial = isNew ? null : model;
    state.pristine = clone(model);
    state.ready = true;
    renderPreview();
    changed();
  }

  function header(stored) {
    const title = isNew ? 'New MCP server' : stored.display_name || stored.server_id;
    return h('div', { class: 'page-head' },
      h('div', {},
        h('div', { class: 'crumbs' }, ctx.link('servers', {}, 'Servers'), ' / ', isNew ? 'new' : h('span', { class: 'mono' }, stored.server_id)),
        h('h1', { testid: 'page-title' }, title),
        isNew ? h('div', { class: 'sub' }, 'Fill in the record, test the connection, then create it.')
          : h('div', { class: 'sub chips' },
            h('span', { class: 'mono' }, stored.server_id),
            h('span', { class: 'badge outline' }, transportLabel(stored.transport)),
            h('span', { class: 'badge accent', testid: 'current-revision', dataset: { revision: String(stored.revision) } }, `revision ${stored.revision}`),
            sourceBadge(stored.source),
            h('span', { class: 'small muted' }, 'updated ', timeEl(stored.updated_at), ` by ${stored.updated_by}`))),
      isNew ? null : h('div', { class: 'actions' },
        ctx.link(`servers/${encodeURIComponent(stored.server_id)}/history`, { class: 'btn', testid: 'history-link' }, 'History'),
        readOnly ? null : h('button', { type: 'button', class: 'btn btn-danger', testid: 'delete', onclick: () => remove() }, 'Delete')));
  }

  function reset() {
    if (state.stored) renderForm(state.stored);
  }

  // ---- actions ---------------------------------------------------------

  async function save() {
    clearErrors();
    const body = buildBody();
    const expected = isNew ? 0 : state.stored.revision;
    const saveButton = el.querySelector('[data-testid="save"]');
    if (saveButton) saveButton.disabled = true;
    try {
      const saved = await serversApi.save(body, expected);
      state.ready = false;
      if (saved?.unchanged) toast('Nothing to save: the record is already like this.');
      else toast(isNew ? `Created ${saved.server_id} (revision ${saved.revision})` : `Saved ${saved.server_id}: revision ${saved.revision}`, 'ok');
      ctx.navigate(`servers/${encodeURIComponent(saved?.server_id ?? body.server_id)}`, { replace: !isNew, force: true });
    } catch (err) {
      if (state.disposed) return;
      if (err.status === 409) {
        if (isNew) {
          showErrors({ fieldErrors: () => [{ field: 'server_id', message: `a server with this id already exists (revision ${err.currentRevision})` }], message: err.message }, 'Cannot create');
        } else {
          await conflict(body, err);
        }
      } else if (err.status === 400) {
        showErrors(err);
      } else if (err.status !== 401) {
        showErrors({ fieldErrors: () => [], message: err.message }, 'Saving failed');
      }
    } finally {
      if (saveButton) saveButton.disabled = false;
    }
  }

  async function conflict(mine, err) {
    let current = null;
    try {
      current = await serversApi.get(state.stored.server_id);
    } catch (getErr) {
      if (getErr.status !== 404) {
        showErrors({ fieldErrors: () => [], message: `${err.message} (and reloading failed: ${getErr.message})` }, 'Edit conflict');
        return;
      }
    }
    if (!current) {
      const choice = await dialog({
        title: 'This server was deleted',
        testid: 'conflict-dialog',
        body: h('p', {}, `Someone deleted ${state.stored.server_id} after you opened it. Your changes are still in the form.`),
        actions: [
          { label: 'Keep editing', value: null, testid: 'conflict-cancel' },
          { label: 'Back to the list', value: 'list', testid: 'conflict-list' },
        ],
      });
      if (choice === 'list') ctx.navigate('servers', { force: true });
      return;
    }
    const opened = state.base;
    const stored = contentOf(current);
    const choice = await dialog({
      title: 'Someone else saved this server first',
      testid: 'conflict-dialog',
      body: h('div', {},
        h('p', {}, `You opened revision ${state.stored.revision}; revision ${current.revision} was saved by ${current.updated_by} `,
          timeEl(current.updated_at), '. Nothing was overwritten.'),
        h('h3', {}, `Their changes (r${state.stored.revision} → r${current.revision})`),
        renderDiff(diffRecords(opened, stored), { testid: 'conflict-theirs', empty: 'No field changed (only the owner or source).' }),
        h('h3', { class: 'spaced' }, 'Your unsaved changes'),
        renderDiff(diffRecords(opened, mine), { testid: 'conflict-yours', empty: 'You changed nothing.' }),
        h('details', { class: 'small spaced' }, h('summary', {}, 'Everything that differs: stored now → yours'),
          renderDiff(diffRecords(stored, mine), { testid: 'conflict-diff', empty: 'Your version and the stored one are the same.' })),
        h('p', { class: 'small spaced' }, 'Reload to start again from the stored version, or apply only the fields you changed on top of it and review before saving.')),
      actions: [
        { label: 'Cancel', value: null, testid: 'conflict-cancel' },
        { label: 'Reload stored version', value: 'reload', testid: 'conflict-reload' },
        { label: 'Apply my changes on top', value: 'rebase', class: 'btn-primary', testid: 'conflict-rebase', autofocus: true },
      ],
    });
    if (choice === 'reload') {
      renderForm(current);
      toast(`Reloaded revision ${current.revision}; your changes were discarded.`);
    } else if (choice === 'rebase') {
      const now = readModel();
      const dirty = Object.keys(now).filter((path) => state.initial && !equal(now[path], state.initial[path]));
      renderForm(current);
      for (const path of dirty) state.widgets.get(path)?.set(now[path]);
      syncSections();
      changed();
      toast(`Your changes (${dirty.join(', ') || 'none'}) now sit on top of revision ${current.revision}. Review and save.`);
    }
  }

  async function remove() {
    const stored = state.stored;
    const ok = await confirmDialog({
      title: `Delete ${stored.server_id}?`,
      body: h('div', {},
        h('p', {}, 'Workers stop offering its tools at once. The history is kept, so it can be restored from a revision later.'),
        sourceKind(stored.source) === 'file'
          ? h('p', {}, h('b', {}, 'Note: '), `its file mcp.d/${stored.source.slice(5)} recreates it at the next rescan unless you remove the file.`)
          : null),
      confirmLabel: 'Delete server',
      danger: true,
    });
    if (!ok) return;
    try {
      const result = await serversApi.remove(stored.server_id, stored.revision);
      toast(`Deleted ${stored.server_id} (revision ${result?.revision ?? '?'})`, 'ok');
      state.ready = false;
      ctx.navigate('servers', { force: true });
    } catch (err) {
      if (err.status === 409) {
        toast(`Not deleted: the server changed since you opened it (now revision ${err.currentRevision}). Reload and try again.`, 'error');
      } else if (err.status !== 401) {
        toast(`Delete failed: ${err.message}`, 'error');
      }
    }
  }

  // ---- load --------------------------------------------------------------

  (async () => {
    if (isNew) {
      try {
        state.defaults = await loadRecordDefaults();
      } catch (err) {
        if (state.disposed) return;
        replace(el, stateBox({ title: 'Cannot prepare the form', text: err.message, kind: 'error', testid: 'error-state' }));
        return;
      }
      if (state.disposed) return;
      renderForm(null);
      return;
    }
    try {
      const [stored, report, defaults] = await Promise.all([
        serversApi.get(id),
        workersApi().catch(() => ({ workers: [] })),
        loadRecordDefaults(),
      ]);
      if (state.disposed) return;
      state.workers = report?.workers ?? [];
      state.defaults = defaults;
      renderForm(stored);
    } catch (err) {
      if (state.disposed) return;
      replace(el, err.status === 404
        ? stateBox({
          title: `No server ${id}`,
          text: 'It does not exist (any more). Its history may still be there.',
          testid: 'not-found',
          actions: [ctx.link('servers', { class: 'btn' }, 'Back to servers'), ctx.link(`servers/${encodeURIComponent(id)}/history`, { class: 'btn' }, 'History')],
        })
        : stateBox({
          title: `Cannot load ${id}`,
          text: err.message,
          kind: 'error',
          testid: 'error-state',
          actions: [h('button', { type: 'button', class: 'btn', onclick: () => ctx.navigate(`servers/${encodeURIComponent(id)}`, { replace: true, force: true }) }, 'Retry')],
        }));
    }
  })();

  return page;
}

