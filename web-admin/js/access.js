// Who may call (docs/reference.md §12.2; read by admin, editor and viewer):
// the policies, the API keys (never a secret: the registry keeps only their
// hash) and the identity providers, and an explain form asking the registry
// whether an API key or a person may call one tool of one server, and which
// rule decides.

import { access as accessApi, servers as serversApi } from './api.js';
import { h, replace, stateBox, loading, badge, timeEl, formatTime, fieldGroup } from './dom.js';

/** `allowed_server_ids` in words: absent is every enabled server. */
function serverList(ids) {
  if (ids == null) return h('span', { class: 'muted' }, 'every enabled server');
  if (!ids.length) return h('span', { class: 'muted' }, 'none');
  return h('span', { class: 'mono' }, ids.join(', '));
}

/** A list of patterns, or a dash. */
function patterns(list) {
  return list?.length ? h('span', { class: 'mono' }, list.join(', ')) : h('span', { class: 'muted' }, '—');
}

/** What an identity provider's rule matches and gives: `groups contains "admins" → policy team-a, roles admin`. */
function ruleText(rule) {
  const test = rule.contains != null ? `contains ${JSON.stringify(rule.contains)}` : `equals ${JSON.stringify(rule.equals)}`;
  const gives = [rule.policy ? `policy ${rule.policy}` : null, rule.roles?.length ? `roles ${rule.roles.join(', ')}` : null];
  return `${rule.claim} ${test} → ${gives.filter(Boolean).join('; ')}`;
}

function table(testid, headings, rows, empty) {
  if (!rows.length) return h('div', { class: 'rows-empty', testid: `${testid}-empty` }, empty);
  return h('div', { class: 'table-wrap' }, h('table', { testid },
    h('thead', {}, h('tr', {}, headings.map((heading) => h('th', {}, heading)))),
    h('tbody', {}, rows)));
}

export function accessPage(ctx) {
  if (!ctx.canReadAccess) {
    return {
      el: stateBox({
        title: 'Access needs the viewer, editor or admin role',
        text: 'You are signed in with a credential that cannot read who may call.',
        testid: 'forbidden',
        actions: [ctx.link('servers', { class: 'btn' }, 'Back to servers')],
      }),
    };
  }

  const lists = h('div', {}, loading('Loading policies, keys and identity providers…'));
  const updated = h('span', { class: 'updated small muted', testid: 'refreshed' });
  let data = { policies: [], keys: [], providers: [], servers: [] };
  let disposed = false;

  // ---- the explain form -------------------------------------------------

  const kindInput = (value, label) => h('label', { class: 'check' },
    h('input', { type: 'radio', name: 'explain-kind', value, testid: `explain-kind-${value}`, checked: value === 'key', onchange: showKind }),
    label);
  const kinds = h('div', { class: 'chips', role: 'radiogroup', 'aria-label': 'Who calls' },
    kindInput('key', 'API key'), kindInput('person', 'Person'));
  const inputs = {
    key_id: h('select', { testid: 'explain-key' }),
    issuer: h('select', { testid: 'explain-issuer' }),
    subject: h('input', { type: 'text', class: 'mono', testid: 'explain-subject', autocomplete: 'off', spellcheck: 'false', placeholder: 'the sub claim, e.g. alice' }),
    claims: h('textarea', { rows: 3, testid: 'explain-claims', spellcheck: 'false', placeholder: '{"groups": ["viewers"]}' }),
    server_id: h('select', { testid: 'explain-server' }),
    tool: h('input', { type: 'text', class: 'mono', testid: 'explain-tool', autocomplete: 'off', spellcheck: 'false', placeholder: 'the tool\'s name on the server, e.g. echo' }),
  };
  const fields = fieldGroup('explain');
  const field = (key, label, hint) => fields.field(key, label, inputs[key], hint);
  const keyFields = h('div', { class: 'grid-2', testid: 'explain-key-fields' },
    field('key_id', 'API key', 'Its policy decides; the key\'s secret is not needed.'));
  const personFields = h('div', { class: 'grid-2', testid: 'explain-person-fields', hidden: true },
    field('issuer', 'Identity provider'),
    field('subject', 'Subject', 'The person\'s sub claim at the provider.'),
    h('div', { class: 'span-2' }, field('claims', 'Claims (optional)', 'A JSON object of further claims the provider\'s rules look at, such as groups or email.')));
  const explainBanner = h('div', { class: 'banner banner-error', testid: 'access-explain-error', role: 'alert', hidden: true });
  const explainButton = h('button', { type: 'submit', class: 'btn btn-primary', testid: 'explain-submit' }, 'Explain');
  const result = h('div', { testid: 'access-result-area' });

  function kind() {
    return personFields.hidden ? 'key' : 'person';
  }

  function showKind(event) {
    const person = event.target.value === 'person';
    keyFields.hidden = person;
    personFields.hidden = !person;
    fields.clear();
  }

  /** Refills a select with `options` (`[value, label]`), keeping its choice when still offered. */
  function options(select, list, none) {
    const chosen = select.value;
    replace(select, list.length
      ? list.map(([value, label]) => h('option', { value }, label))
      : h('option', { value: '' }, none));
    select.disabled = !list.length;
    if (list.some(([value]) => value === chosen)) select.value = chosen;
  }

  function fillSelects() {
    options(inputs.key_id, data.keys.map((k) => [k.id, `${k.id} · ${k.name} (policy ${k.policy})`]), 'No API keys');
    options(inputs.issuer, data.providers.map((p) => [p.issuer, `${p.name} · ${p.issuer}`]), 'No identity providers');
    options(inputs.server_id, data.servers.map((s) => [s.server_id, s.display_name ? `${s.server_id} · ${s.display_name}` : s.server_id]), 'No MCP servers');
  }

  /** The request body, or `null` after marking what is missing. */
  function readForm() {
    const problems = [];
    const body = { server_id: inputs.server_id.value, tool: inputs.tool.value.trim() };
    if (kind() === 'key') {
      body.key_id = inputs.key_id.value;
      if (!body.key_id) problems.push({ field: 'key_id', message: 'choose an API key' });
    } else {
      body.issuer = inputs.issuer.value;
      body.subject = inputs.subject.value.trim();
      if (!body.issuer) problems.push({ field: 'issuer', message: 'choose an identity provider' });
      if (!body.subject) problems.push({ field: 'subject', message: 'a subject is required' });
      const claims = inputs.claims.value.trim();
      if (claims) {
        let parsed;
        try {
          parsed = JSON.parse(claims);
        } catch (err) {
          problems.push({ field: 'claims', message: `not JSON: ${err.message}` });
        }
        if (parsed !== undefined && (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed))) {
          problems.push({ field: 'claims', message: 'must be a JSON object, e.g. {"groups": ["viewers"]}' });
        } else if (parsed !== undefined) {
          body.claims = parsed;
        }
      }
    }
    if (!body.server_id) problems.push({ field: 'server_id', message: 'choose a server' });
    if (!body.tool) problems.push({ field: 'tool', message: 'a tool name is required' });
    if (problems.length) {
      fields.show(problems);
      return null;
    }
    return body;
  }

  async function explain(event) {
    event.preventDefault();
    fields.clear();
    explainBanner.hidden = true;
    const body = readForm();
    if (!body) return;
    explainButton.disabled = true;
    explainButton.textContent = 'Explaining…';
    try {
      const answer = await accessApi.explain(body);
      if (!disposed) replace(result, explanation(body, answer));
    } catch (err) {
      if (disposed || err.status === 401) return;
      replace(result);
      const list = err.fieldErrors();
      if (fields.show(list).length || !list.length) {
        replace(explainBanner, h('div', { class: 'grow' }, h('b', {}, 'The registry cannot explain this: '), err.message));
        explainBanner.hidden = false;
      }
    } finally {
      explainButton.disabled = false;
      explainButton.textContent = 'Explain';
    }
  }

  function explanation(asked, answer) {
    const allowed = answer.decision === 'allow';
    const item = (label, value, testid, { mono = true } = {}) => [
      h('dt', {}, label),
      h('dd', { testid, class: mono && value != null ? 'mono' : '' }, value ?? h('span', { class: 'muted' }, '—')),
    ];
    return h('div', { class: `explain-result ${allowed ? 'allowed' : 'denied'}`, testid: 'access-result', dataset: { decision: answer.decision } },
      h('div', { class: 'explain-verdict' },
        badge(answer.decision, allowed ? 'ok' : 'bad', { testid: 'access-decision', dataset: { decision: answer.decision } }),
        h('span', { class: 'mono' }, `${asked.server_id}.${asked.tool}`)),
      h('dl', {},
        item('Principal', answer.principal, 'access-principal'),
        item('Policy', answer.policy, 'access-policy'),
        item('Code', answer.code, 'access-code'),
        item('Deciding rule', answer.rule, 'access-rule'),
        item('Reason', answer.reason, 'access-reason', { mono: false })));
  }

  const form = h('form', { class: 'card', testid: 'access-explain', novalidate: true, onsubmit: explain },
    h('div', { class: 'card-head' }, h('h2', {}, 'Explain a call')),
    h('p', { class: 'desc' }, 'Whether a caller may call one tool of one server, decided as workers decide it, and the rule that decides.'),
    explainBanner,
    h('div', { class: 'rows' },
      h('div', { class: 'field' }, h('span', { class: 'label' }, 'Who calls'), kinds),
      keyFields,
      personFields,
      h('div', { class: 'grid-2' },
        field('server_id', 'Server'),
        field('tool', 'Tool'))),
    h('div', { class: 'dialog-actions spaced' }, explainButton),
    result);

  // ---- the lists --------------------------------------------------------

  function draw() {
    replace(lists,
      h('h2', {}, 'Policies'),
      table('policies-table', ['Name', 'Servers', 'Tool allowlist', 'Tool denylist', 'Rev.', 'Updated'],
        data.policies.map((p) => h('tr', { testid: 'policy-row', dataset: { name: p.name } },
          h('td', { class: 'primary mono' }, p.name),
          h('td', {}, serverList(p.policy?.allowed_server_ids)),
          h('td', {}, patterns(p.policy?.tool_allowlist)),
          h('td', {}, patterns(p.policy?.tool_denylist)),
          h('td', { class: 'num mono' }, p.revision),
          h('td', { class: 'nowrap' }, timeEl(p.updated_at), h('div', { class: 'secondary' }, `by ${p.updated_by ?? '?'}`)))),
        'No policies yet: an API key or a provider rule names one.'),
      h('h2', { class: 'spaced' }, 'API keys'),
      table('keys-table', ['Id', 'Name', 'Policy', 'Registry roles', 'Expires', 'Last used'],
        data.keys.map((k) => {
          const expired = k.expires_at && new Date(k.expires_at) <= new Date();
          return h('tr', { testid: 'key-row', dataset: { keyId: k.id } },
            h('td', { class: 'mono', testid: 'key-id' }, k.id),
            h('td', { testid: 'key-name' }, k.name),
            h('td', { class: 'mono', testid: 'key-policy' }, k.policy),
            h('td', { testid: 'key-roles' }, k.roles?.length
              ? h('div', { class: 'chips' }, k.roles.map((role) => badge(role, 'accent')))
              : h('span', { class: 'muted', title: 'Calls tools on workers only' }, 'none')),
            h('td', { class: 'nowrap', testid: 'key-expires' }, k.expires_at
              ? [formatTime(k.expires_at), expired ? [' ', badge('expired', 'bad')] : null]
              : h('span', { class: 'muted' }, 'never')),
            h('td', { class: 'nowrap', testid: 'key-last-used' }, k.last_used_at ? timeEl(k.last_used_at) : h('span', { class: 'muted' }, 'never')));
        }),
        'No API keys yet.'),
      h('h2', { class: 'spaced' }, 'Identity providers'),
      table('providers-table', ['Name', 'Issuer', 'Audiences', 'Rules (the first match decides)', 'Web sign-in'],
        data.providers.map((p) => h('tr', { testid: 'provider-row', dataset: { name: p.name } },
          h('td', { class: 'primary mono' }, p.name),
          h('td', { class: 'mono small wrap-any' }, p.issuer),
          h('td', { class: 'mono small' }, (p.audiences ?? []).join(', ')),
          h('td', {}, h('ol', { class: 'rules', start: 0 }, (p.rules ?? []).map((rule, at) =>
            h('li', { class: 'mono small', testid: 'provider-rule', dataset: { rule: `identity_providers.${p.name}.rules[${at}]` } }, ruleText(rule))))),
          h('td', {}, p.web_client_id ? badge('on', 'ok', { title: `client ${p.web_client_id}` }) : h('span', { class: 'muted' }, 'off')))),
        'No identity providers: people sign in with tokens only.'));
  }

  async function load() {
    try {
      const [policies, keys, providers, servers] = await Promise.all([
        accessApi.policies(), accessApi.keys(), accessApi.providers(), serversApi.list(),
      ]);
      if (disposed) return;
      data = {
        policies: policies?.policies ?? [],
        keys: keys?.keys ?? [],
        providers: providers?.providers ?? [],
        servers: servers?.servers ?? [],
      };
      updated.textContent = `Updated ${new Date().toLocaleTimeString()}`;
      draw();
      fillSelects();
    } catch (err) {
      if (disposed) return;
      replace(lists, stateBox({
        title: 'Cannot load who may call', text: err.message, kind: 'error', testid: 'error-state',
        actions: [h('button', { type: 'button', class: 'btn', onclick: () => load() }, 'Retry')],
      }));
    }
  }

  const el = h('div', { testid: 'access-page' },
    h('div', { class: 'page-head' },
      h('div', {}, h('h1', {}, 'Access'),
        h('div', { class: 'sub' }, 'Who may call which tools: policies, API keys and the identity provider\'s people. API key secrets are shown once, when a key is made, and never here.')),
      h('div', { class: 'actions' }, updated,
        h('button', { type: 'button', class: 'btn btn-small', testid: 'refresh', onclick: () => load() }, 'Refresh'))),
    form,
    lists);

  fillSelects();
  load();
  return { el, dispose() { disposed = true; } };
}
