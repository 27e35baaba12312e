// Server status as workers report it (R-UI-1, R-UI-5): the worst state
// across workers, with the per-worker detail.

import { badge } from './dom.js';

/** States in the order "worse first"; `idle` (no connection yet) and `unknown` (no report) are not failures. */
const RANK = { down: 4, degraded: 3, connected: 2, idle: 1, unknown: 0, disabled: -1 };

export const STATE_LABELS = {
  connected: 'Connected',
  degraded: 'Degraded',
  down: 'Down',
  idle: 'Idle',
  unknown: 'No report',
  disabled: 'Not served',
};

/** Normalizes a reported state name. */
function stateOf(value) {
  const state = String(value ?? '').toLowerCase();
  return Object.hasOwn(RANK, state) ? state : 'unknown';
}

/**
 * The status of `serverId` across `workers` (the `workers` array of `GET
 * workers`): `{state, perWorker: [{worker_id, state, last_error, tool_count,
 * session_connections,
 * reconnect_count, p50_latency_ms, reported_at}], lastError, toolCount}`.
 * A disabled record is `disabled`; one that reporting workers do not list
 * yet (they connect on first use) is `idle`; with no worker reporting at
 * all it is `unknown`.
 */
export function serverStatus(serverId, workers, { enabled = true } = {}) {
  const perWorker = [];
  for (const worker of workers ?? []) {
    const health = (worker.servers ?? []).find((s) => s.server_id === serverId);
    if (health) {
      perWorker.push({ ...health, state: stateOf(health.state), worker_id: worker.worker_id, reported_at: worker.reported_at });
    }
  }
  let state = 'unknown';
  for (const entry of perWorker) if (RANK[entry.state] > RANK[state]) state = entry.state;
  if (!perWorker.length && (workers ?? []).length) state = 'idle';
  if (!enabled && !perWorker.length) state = 'disabled';
  const worst = perWorker.filter((e) => e.state === state);
  const lastError = (worst.find((e) => e.last_error) ?? perWorker.find((e) => e.last_error))?.last_error ?? null;
  const counts = perWorker.map((e) => e.tool_count).filter((n) => typeof n === 'number');
  const toolCount = counts.length ? Math.max(...counts) : null;
  return { state, perWorker, lastError, toolCount };
}

/** Hover text listing every worker's view of the server. */
export function statusTitle(status) {
  if (status.state === 'disabled') return 'Disabled: workers do not serve it';
  if (status.state === 'idle' && !status.perWorker.length) return 'No worker has connected to it yet (workers connect on first use)';
  if (!status.perWorker.length) return 'No worker is reporting';
  return status.perWorker
    .map((e) => `${e.worker_id}: ${STATE_LABELS[e.state]}${e.tool_count != null ? `, ${e.tool_count} tools` : ''}`
      + `${e.reconnect_count ? `, ${e.reconnect_count} reconnects` : ''}${e.last_error ? ` — ${e.last_error}` : ''}`)
    .join('\n');
}

/** A status badge for a state name. */
export function stateBadge(state, props = {}) {
  const s = stateOf(state);
  return badge(STATE_LABELS[s], s, { testid: 'status-badge', dataset: { state: s }, ...props });
}
