// Approvals (reference §13.7): pending calls first, with their arguments
// (masked by the registry where a key looks secret), approve or deny with an
// optional note; decided, used and expired ones below as history.

import { approvals as approvalsApi } from './api.js';
import { h, replace, stateBox, loading, timeEl, badge, toast, formatTime } from './dom.js';

const REFRESH_MS = 5000;

const STATE_KIND = { pending: 'warn', approved: 'ok', used: 'accent', denied: 'bad', expired: 'outline' };

export function approvalsPage(ctx) {
  const pendingBody = h('div', {}, loading('Loading approvals…'));
  const historyBody = h('div', {});
  const updated = h('span', { class: 'updated small muted', testid: 'refreshed' });
  const el = h('div', { testid: 'approvals-page' },
    h('div', { class: 'page-head' },
      h('div', {}, h('h1', {}, 'Approvals'),
        h('div', { class: 'sub' }, 'Calls of tools that need approval wait here. An approval lets exactly that call (same task, server, tool, arguments and record revision) run once, before it expires.')),
      h('div', { class: 'actions' }, updated,
        h('button', { type: 'button', class: 'btn btn-small', testid: 'refresh', onclick: () => load() }, 'Refresh'))),
    h('h2', {}, 'Pending'),
    pendingBody,
    h('h2', {}, 'History'),
    historyBody);
  let timer = null;
  let disposed = false;
  let lastKey = '';
  // Notes typed into pending cards survive a refresh that redraws them.
  const notes = new Map();

  async function load() {
    clearTimeout(timer);
    try {
      const { approvals } = await approvalsApi.list();
      if (disposed) return;
      updated.textContent = `Updated ${new Date().toLocaleTimeString()}`;
      const key = JSON.stringify(approvals);
      if (key !== lastKey) {
        lastKey = key;
        draw(approvals ?? []);
      }
    } catch (err) {
      if (disposed) return;
      replace(pendingBody, stateBox({
        title: 'Cannot load approvals', text: err.message, kind: 'error', testid: 'error-state',
        actions: [h('button', { type: 'button', class: 'btn', onclick: () => load() }, 'Retry')],
      }));
    }
    if (!disposed) timer = setTimeout(load, REFRESH_MS);
  }

  function draw(approvals) {
    const pending = approvals.filter((a) => a.state === 'pending');
    const decided = approvals.filter((a) => a.state !== 'pending');
    replace(pendingBody, pending.length
      ? pending.map(pendingCard)
      : stateBox({ title: 'Nothing waits for approval', text: 'A call that needs approval appears here within seconds.', testid: 'approvals-empty' }));
    replace(historyBody, decided.length ? historyTable(decided) : h('div', { class: 'rows-empty' }, 'No decided approvals yet.'));
  }

  function callSummary(a) {
    return h('div', { class: 'worker-meta' },
      h('span', {}, 'Server ', h('b', { class: 'mono' }, a.server_id)),
      h('span', {}, 'Tool ', h('b', { class: 'mono', testid: 'approval-tool' }, a.tool)),
      h('span', {}, 'Task ', h('b', { class: 'mono' }, a.task)),
      h('span', {}, 'Revision ', h('b', {}, String(a.record_revision))),
      h('span', {}, 'Requested ', h('b', {}, timeEl(a.requested_at))),
      h('span', {}, 'Expires ', h('b', { testid: 'approval-expires' }, formatTime(a.expires_at))));
  }

  function pendingCard(a) {
    const note = h('input', {
      type: 'text', class: 'input', testid: 'approval-note', placeholder: 'Note (optional)', maxlength: 1000,
      value: notes.get(a.approval_id) ?? '',
      oninput: () => notes.set(a.approval_id, note.value),
    });
    const decide = (decision) => async (event) => {
      const buttons = event.target.closest('section').querySelectorAll('button');
      for (const b of buttons) b.disabled = true;
      try {
        const done = await approvalsApi.decide(a.approval_id, decision, note.value.trim() || undefined);
        notes.delete(a.approval_id);
        toast(`${decision === 'approve' ? 'Approved' : 'Denied'} ${a.tool}`, decision === 'approve' ? 'ok' : 'info');
        lastKey = '';
        if (done) load();
      } catch (err) {
        toast(err.status === 409 ? `Already decided or expired: ${err.message}` : `Cannot decide: ${err.message}`, 'error');
        for (const b of buttons) b.disabled = false;
        lastKey = '';
        load();
      }
    };
    return h('section', { class: 'card', testid: 'approval-card', dataset: { approvalId: a.approval_id } },
      h('div', { class: 'card-head' },
        h('h2', { class: 'mono' }, `${a.server_id} · ${a.tool}`),
        h('div', { class: 'chips' }, badge('pending', STATE_KIND.pending, { testid: 'approval-state' }))),
      callSummary(a),
      h('pre', { class: 'json', testid: 'approval-arguments' }, argumentsText(a, 2)),
      // Viewers and editors read approvals; approvers and admins decide.
      ctx?.canDecide === false ? null : h('div', { class: 'actions' },
        note,
        h('button', { type: 'button', class: 'btn btn-primary', testid: 'approve', onclick: decide('approve') }, 'Approve'),
        h('button', { type: 'button', class: 'btn btn-danger', testid: 'deny', onclick: decide('deny') }, 'Deny')));
  }

  // Lists summarise large arguments (reference §13.7): a preview, their
  // size and hash instead of the whole object.
  function argumentsText(a, indent) {
    if (!a.arguments_truncated) return JSON.stringify(a.arguments, null, indent);
    return `${a.arguments_preview}… (${a.arguments_bytes} bytes in all, sha256 ${a.arguments_hash})`;
  }

  function historyTable(rows) {
    return h('div', { class: 'table-wrap' },
      h('table', {},
        h('thead', {}, h('tr', {}, h('th', {}, 'State'), h('th', {}, 'Server · tool'), h('th', {}, 'Task'),
          h('th', {}, 'Arguments'), h('th', {}, 'Decided by'), h('th', {}, 'Note'), h('th', {}, 'Requested'))),
        h('tbody', {}, rows.map((a) => h('tr', { testid: 'approval-row', dataset: { approvalId: a.approval_id, state: a.state } },
          h('td', {}, badge(a.state, STATE_KIND[a.state] ?? '', { testid: 'approval-state' })),
          h('td', { class: 'mono' }, `${a.server_id} · ${a.tool}`),
          h('td', { class: 'mono' }, a.task),
          h('td', { class: 'mono small' }, argumentsText(a)),
          h('td', {}, a.decided_by ?? h('span', { class: 'muted' }, '—')),
          h('td', {}, a.note ?? h('span', { class: 'muted' }, '—')),
          h('td', {}, timeEl(a.requested_at)))))));
  }

  load();
  return { el, dispose() { disposed = true; clearTimeout(timer); } };
}
