// Import a TOML/JSON file of records or an official MCP Registry server.json
// (dry run first, then import; docs/reference.md §5.4), and rescan mcp.d (R-UI-2, §5).

import { api, servers as serversApi } from './api.js';
import { h, replace, stateBox, badge } from './dom.js';

const EXAMPLE = `# One record, or several as [[servers]]
server_id = "filesystem"
transport = "stdio"
allowed_tools = ["read_*", "list_*"]
[stdio]
command = "npx"
args = ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]`;

export function importPage(ctx) {
  if (!ctx.canEdit) {
    return {
      el: stateBox({
        title: 'Import needs the editor or admin role',
        text: 'You are signed in with a token that can only read.',
        testid: 'forbidden',
        actions: [ctx.link('servers', { class: 'btn' }, 'Back to servers')],
      }),
    };
  }

  let fileName = null;
  const text = h('textarea', { rows: 14, testid: 'import-text', placeholder: EXAMPLE, spellcheck: 'false' });
  const fileInput = h('input', { type: 'file', accept: '.toml,.json,application/json,application/toml,text/plain', testid: 'import-file', hidden: true });
  const fileLabel = h('span', { class: 'small muted', testid: 'import-file-name' }, 'No file chosen');
  const format = h('select', { testid: 'import-format', 'aria-label': 'Format' },
    h('option', { value: '' }, 'Format: detect'), h('option', { value: 'toml' }, 'TOML'), h('option', { value: 'json' }, 'JSON'));
  const strict = h('input', { type: 'checkbox', checked: true, testid: 'import-strict' });
  const importButton = h('button', { type: 'submit', class: 'btn btn-primary', testid: 'import-submit' }, 'Import');
  const importResult = h('div', { class: 'import-result', testid: 'import-result-area' });
  const rescanButton = h('button', { type: 'button', class: 'btn', testid: 'rescan', onclick: () => rescan() }, 'Rescan mcp.d now');
  const rescanResult = h('div', { testid: 'rescan-result-area' });

  async function readFile(file) {
    if (!file) return;
    fileName = file.name;
    fileLabel.textContent = `${file.name} (${file.size} bytes)`;
    text.value = await file.text();
    if (!format.value) {
      if (file.name.endsWith('.json')) format.value = 'json';
      else if (file.name.endsWith('.toml')) format.value = 'toml';
    }
  }
  fileInput.addEventListener('change', () => readFile(fileInput.files?.[0]));

  const drop = h('div', { class: 'drop', testid: 'import-drop' },
    h('div', {}, 'Drop a .toml or .json file here, or '),
    h('button', { type: 'button', class: 'btn btn-small', testid: 'import-choose', onclick: () => fileInput.click() }, 'Choose a file…'),
    ' ', fileLabel, fileInput);
  drop.addEventListener('dragover', (e) => { e.preventDefault(); drop.classList.add('over'); });
  drop.addEventListener('dragleave', () => drop.classList.remove('over'));
  drop.addEventListener('drop', (e) => { e.preventDefault(); drop.classList.remove('over'); readFile(e.dataTransfer?.files?.[0]); });

  async function submit(event) {
    event.preventDefault();
    const content = text.value;
    if (!content.trim()) {
      replace(importResult, h('div', { class: 'banner banner-error', testid: 'import-error' }, 'Choose a file or paste records first.'));
      return;
    }
    const serverJson = isServerJson(content);
    importButton.disabled = true;
    importButton.textContent = serverJson ? 'Checking…' : 'Importing…';
    try {
      if (serverJson) await serverJsonDryRun(content);
      else await importRecords(content);
    } finally {
      importButton.disabled = false;
      importButton.textContent = 'Import';
    }
  }

  async function importRecords(content) {
    shownDryRun = null;
    try {
      const fmt = format.value || null;
      const result = await serversApi.importFile(content, {
        format: fmt ?? undefined,
        strict: strict.checked ? 'true' : 'false',
        contentType: fmt === 'json' ? 'application/json' : fmt === 'toml' ? 'application/toml' : 'text/plain',
      });
      replace(importResult, importSummary(result));
    } catch (err) {
      if (err.status !== 401) {
        replace(importResult, refusal(`Nothing was imported${fileName ? ` from ${fileName}` : ''}: `, err));
      }
    }
  }

  // A server.json has a `$schema` naming server.schema.json, or the shape
  // of one: a `name` with a '/' and remotes or packages, no server_id.
  function isServerJson(content) {
    let doc;
    try { doc = JSON.parse(content); } catch { return false; }
    if (!doc || typeof doc !== 'object' || Array.isArray(doc)) return false;
    if (typeof doc.$schema === 'string' && doc.$schema.includes('server.schema.json')) return true;
    return doc.server_id === undefined && typeof doc.name === 'string' && doc.name.includes('/')
      && (Array.isArray(doc.remotes) || Array.isArray(doc.packages));
  }

  // One field for every server.json: a pattern list typed for one document
  // is kept when the next one is checked.
  const allowedTools = h('input', {
    type: 'text', class: 'mono', testid: 'server-json-allowed-tools', spellcheck: 'false', autocomplete: 'off',
    placeholder: 'e.g. read_*, list_* (empty: no tool allowed)',
  });
  // The dry run on screen: its server.json and the slot of its records,
  // which a change of the allowed tools fills again.
  let shownDryRun = null;
  let reruns = 0;
  allowedTools.addEventListener('change', async () => {
    const shown = shownDryRun;
    if (!shown) return;
    const rerun = ++reruns;
    let view;
    try {
      view = dryRunView(await serverJsonRequest(shown.content, true));
    } catch (err) {
      view = serverJsonError(err, 'The dry run failed: ');
    }
    // Answers may come out of order: only the latest change's is shown, and
    // only while its document is.
    if (rerun === reruns && shownDryRun === shown && view) replace(shown.preview, view);
  });

  function serverJsonRequest(content, dryRun) {
    return api('POST', 'import/server-json', {
      query: { dry_run: dryRun ? 'true' : 'false', allowed_tools: allowedTools.value.trim() || undefined },
      text: content,
      contentType: 'application/json',
    });
  }

  /** The banner of a refused server.json (`null` for a 401: the sign-in page takes over). */
  function serverJsonError(err, lead = 'Nothing was imported from the server.json: ') {
    return err.status === 401 ? null : refusal(lead, err);
  }

  /** An error banner: `lead`, the field the registry names, its message. */
  function refusal(lead, err) {
    // The registry's message starts with the field too: it is shown once.
    const prefix = `${err.field}: `;
    const message = err.field && err.message.startsWith(prefix) ? err.message.slice(prefix.length) : err.message;
    return h('div', { class: 'banner banner-error', testid: 'import-error', dataset: { field: err.field ?? '' } },
      h('div', { class: 'grow' }, h('b', {}, lead), err.field ? h('code', {}, err.field) : null, err.field ? ' ' : null, message));
  }

  // The dry run's record and inputs to fill, with a button that imports the
  // same server.json (with the allowed tools typed by then).
  async function serverJsonDryRun(content) {
    shownDryRun = null;
    let result;
    try {
      result = await serverJsonRequest(content, true);
    } catch (err) {
      replace(importResult, serverJsonError(err));
      return;
    }
    const preview = h('div', {}, dryRunView(result));
    const outcome = h('div', { testid: 'server-json-outcome' });
    const confirm = h('button', { type: 'button', class: 'btn btn-primary', testid: 'server-json-import' }, 'Import this record');
    confirm.addEventListener('click', async () => {
      confirm.disabled = true;
      try {
        const stored = await serverJsonRequest(content, false);
        replace(outcome, h('div', { class: 'banner banner-ok', testid: 'server-json-stored' },
          h('div', { class: 'grow' }, Object.entries(stored.revisions ?? {}).map(([id, revision]) => {
            const outcomeName = stored.outcomes?.[id] ?? 'stored';
            return h('div', { testid: 'server-json-stored-record', dataset: { serverId: id, outcome: outcomeName, revision: String(revision) } },
              ctx.link(`servers/${encodeURIComponent(id)}`, { class: 'mono' }, id), ` ${outcomeName} at revision ${revision}`);
          }))));
      } catch (err) {
        replace(outcome, serverJsonError(err));
      } finally {
        confirm.disabled = false;
      }
    });
    replace(importResult, h('div', { testid: 'server-json-result', class: 'rows' },
      h('p', { class: 'desc' }, `server.json: a dry run of ${result.choice}. Nothing is stored until you import it.`),
      h('div', { class: 'field' }, h('label', {}, 'Allowed tools (comma-separated patterns)'), allowedTools),
      preview,
      h('div', {}, confirm),
      outcome));
    shownDryRun = { content, preview };
  }

  /** The records of a dry run and the inputs its server.json leaves to fill. */
  function dryRunView(result) {
    const inputs = result.inputs ?? [];
    return h('div', { class: 'rows' },
      h('pre', { class: 'json', testid: 'server-json-records' }, JSON.stringify(result.records, null, 2)),
      inputs.length ? h('div', { class: 'table-wrap' }, h('table', { testid: 'server-json-inputs' },
        h('thead', {}, h('tr', {}, h('th', {}, 'Input to fill'), h('th', {}, 'Name'), h('th', {}, 'How'), h('th', {}, 'Description'))),
        h('tbody', {}, inputs.map((input) => h('tr', { testid: 'server-json-input', dataset: { field: input.field, env: input.env ?? '' } },
          h('td', { class: 'mono' }, input.field),
          h('td', {}, input.name, input.required ? ' (required)' : '', input.secret ? ' (secret)' : ''),
          h('td', { class: 'small' }, input.env ? `set ${input.env} on the workers` : 'edit the record'),
          h('td', { class: 'small muted' }, input.description ?? '—'))))))
        : h('p', { class: 'small muted', testid: 'server-json-no-inputs' }, 'Nothing to fill: the server.json gives every value.'));
  }

  function importSummary(result) {
    const results = result?.results ?? [];
    const counts = {};
    for (const r of results) counts[r.outcome] = (counts[r.outcome] ?? 0) + 1;
    return h('div', { testid: 'import-result' },
      h('div', { class: 'counts' }, Object.entries(counts).map(([outcome, n]) => badge(`${n} ${outcome}`, outcome, { testid: 'import-count', dataset: { outcome } }))),
      h('div', { class: 'table-wrap' }, h('table', {},
        h('thead', {}, h('tr', {}, h('th', {}, 'Server'), h('th', {}, 'Outcome'), h('th', { class: 'num' }, 'Revision'), h('th', {}, 'Notes'))),
        h('tbody', {}, results.map((r) => h('tr', { testid: 'import-row', dataset: { serverId: r.server_id, outcome: r.outcome } },
          h('td', {}, r.outcome === 'failed' ? h('span', { class: 'mono' }, r.server_id) : ctx.link(`servers/${encodeURIComponent(r.server_id)}`, { class: 'mono' }, r.server_id)),
          h('td', {}, badge(r.outcome, r.outcome)),
          h('td', { class: 'num mono' }, r.revision ?? '—'),
          h('td', { class: r.error ? 'err' : 'small muted' },
            r.error ?? (r.ignored_fields?.length ? `Ignored unknown fields: ${r.ignored_fields.join(', ')}` : '—'))))))));
  }

  async function rescan() {
    rescanButton.disabled = true;
    rescanButton.textContent = 'Rescanning…';
    try {
      const result = await serversApi.rescan();
      replace(rescanResult, rescanSummary(result));
    } catch (err) {
      if (err.status !== 401) {
        replace(rescanResult, h('div', { class: `banner ${err.status === 412 ? 'banner-warn' : 'banner-error'}`, testid: 'rescan-error' },
          h('div', { class: 'grow' }, h('b', {}, err.status === 412 ? 'No rescan: ' : 'Rescan failed: '), err.message)));
      }
    } finally {
      rescanButton.disabled = false;
      rescanButton.textContent = 'Rescan mcp.d now';
    }
  }

  function rescanSummary(result) {
    const kinds = [['created', 'created'], ['updated', 'updated'], ['deleted', 'deleted'], ['unchanged', ''], ['skipped', ''], ['kept', 'warn']];
    const failed = result?.failed ?? [];
    const errors = result?.errors ?? [];
    const warnings = result?.warnings ?? [];
    const records = result?.records ?? [];
    return h('div', { testid: 'rescan-result' },
      h('div', { class: 'counts' },
        kinds.map(([key, kind]) => badge(`${result?.[key] ?? 0} ${key}`, (result?.[key] ?? 0) > 0 ? kind : '', { testid: 'rescan-count', dataset: { kind: key, count: String(result?.[key] ?? 0) } })),
        badge(`${failed.length} failed`, failed.length ? 'failed' : '', { testid: 'rescan-count', dataset: { kind: 'failed', count: String(failed.length) } })),
      h('div', { class: 'small muted' }, `${records.length} record${records.length === 1 ? '' : 's'} declared by valid files`,
        records.length ? `: ${records.map((r) => `${r.server_id} (${r.file})`).join(', ')}` : ''),
      errors.length ? h('div', { class: 'banner banner-error', testid: 'rescan-file-errors' }, h('div', { class: 'grow' },
        h('b', {}, 'Invalid files (their records are kept as they were):'),
        h('ul', {}, errors.map((e) => h('li', {}, h('code', {}, e.file), ` ${e.message}`))))) : null,
      failed.length ? h('div', { class: 'banner banner-error' }, h('div', { class: 'grow' },
        h('b', {}, 'Failed:'), h('ul', {}, failed.map((f) => h('li', {}, h('code', {}, f.server_id), ` ${f.error}`))))) : null,
      warnings.length ? h('div', { class: 'banner banner-warn' }, h('div', { class: 'grow' },
        h('b', {}, 'Warnings:'), h('ul', {}, warnings.map((w) => h('li', {}, w))))) : null);
  }

  const el = h('div', { testid: 'import-page' },
    h('div', { class: 'page-head' },
      h('div', {}, h('h1', {}, 'Import & rescan'),
        h('div', { class: 'sub' }, 'Bring records in from a file, or re-read the registry\'s mcp.d directory.'))),
    h('div', { class: 'import-grid' },
      h('section', { class: 'card' },
        h('div', { class: 'card-head' }, h('h2', {}, 'Import a file')),
        h('p', { class: 'desc' }, 'A TOML or JSON document with one record or a [[servers]] list, in the mcp.d format, or a server.json of the official MCP Registry (checked as a dry run first). Every record is validated before any is written; imported records are admin-managed.'),
        h('form', { onsubmit: submit, class: 'rows' },
          drop,
          h('div', { class: 'field' }, h('label', {}, 'Content'), text),
          h('div', { class: 'row' }, format, h('label', { class: 'check' }, strict, 'Strict: unknown fields are errors'), h('span', { style: null }), importButton)),
        importResult),
      h('section', { class: 'card' },
        h('div', { class: 'card-head' }, h('h2', {}, 'Rescan mcp.d')),
        h('p', { class: 'desc' }, 'Reads the registry\'s mcp.d directory now (it is also read on a timer and on SIGHUP). File-managed records are created, updated or deleted to match the files; admin and API records are never touched.'),
        rescanButton,
        rescanResult)));

  return { el };
}
