// The pgbroker dashboard: per queue, depth, messages in flight, throughput, failures and
// oldest-message age as inline SVG charts over a window of up to a day, from the history the
// server samples into Postgres (GET /v1/stats/history), extended between samples by polling
// /v1/stats; the queue workers and stream consumers with their heartbeats; a search by msg_id,
// header or body field; a message browser showing each failed attempt's error and traceback.
//
// The key lives in the tab's sessionStorage, and a new tab of the same browser asks the open ones
// for it (a BroadcastChannel of this origin), so it is typed once per browser session, and
// "forget" forgets it in every tab. It is sent only as an Authorization header by fetch, never as
// a cookie, so no other site can make the browser use it (no CSRF). The view (window, queue,
// search) is kept in the address, so a bookmark opens it again. Nothing from the server is ever
// inserted as HTML: every value goes in through textContent or an attribute, so a message
// payload cannot script the page. Admin buttons are shown to keys with the admin scope (the
// server checks the scope anyway), and the destructive ones only where they apply.
"use strict";

const KEY_ITEM = "pgbroker-api-key";
const CHANNEL = "pgbroker-dashboard";
const PARAMS = new URLSearchParams(location.search);
const REFRESH_MS = Math.max(250, Number(PARAMS.get("refresh")) || 2000);
const HISTORY_REFRESH_MS = 30_000;
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
const SVG_NS = "http://www.w3.org/2000/svg";
const DEAD_LETTER_HEADER = "x-pgbroker-dead-letter";
const ATTEMPTS_HEADER = "x-pgbroker-attempts";

const state = {
  key: sessionStorage.getItem(KEY_ITEM) || "",
  me: null,               // the key's name and scopes (GET /v1/key)
  windowMinutes: Number(PARAMS.get("window")) || 60,
  points: new Map(),      // queue -> [{t, length, inFlight, age, sent, consumed, retried, deadLettered}]
  historyLoadedAt: 0,     // Date.now() of the last history fetch
  colors: new Map(),      // queue -> colour, stable while the page lives
  queues: [],             // the last /v1/stats answer
  deadLetterQueue: null,  // the queue whose dead letters are shown
  polling: false,
};

const $ = (id) => document.getElementById(id);
const channel = "BroadcastChannel" in window ? new BroadcastChannel(CHANNEL) : null;

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", isError);
}

async function api(path, options = {}) {
  const headers = { Authorization: "Bearer " + state.key };
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { ...options, headers });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    throw new Error(body.error ? `${body.error.code}: ${body.error.message}` : `HTTP ${response.status}`);
  }
  return body;
}

function isAdmin() {
  return state.me !== null && state.me.scopes.includes("admin");
}

function colorOf(queue) {
  if (!state.colors.has(queue)) state.colors.set(queue, COLORS[state.colors.size % COLORS.length]);
  return state.colors.get(queue);
}

// The view in the address: a bookmark or a reload opens the same window, queue and search.
function remember(changes) {
  const params = new URLSearchParams(location.search);
  for (const [k, v] of Object.entries(changes)) {
    if (v === null || v === "") params.delete(k);
    else params.set(k, String(v));
  }
  history.replaceState(null, "", `${location.pathname}${params.size ? "?" + params : ""}`);
}

// -- data: the server's history, extended by the live feed -----------------------------------

function pointOf(sample, t) {
  return {
    t,
    length: sample.queue_length,
    inFlight: sample.in_flight,
    age: sample.oldest_msg_age_sec ?? 0,
    sent: sample.total_sent,
    consumed: sample.total_consumed,
    retried: sample.total_retried,
    deadLettered: sample.total_dead_lettered,
  };
}

async function loadHistory() {
  const answer = await api(`/v1/stats/history?minutes=${state.windowMinutes}&points=300`);
  const points = new Map();
  for (const s of answer.samples) {
    if (!points.has(s.queue_name)) points.set(s.queue_name, []);
    points.get(s.queue_name).push(pointOf(s, Date.parse(s.sampled_at)));
  }
  // Live points newer than the last sample stay: the chart does not step back.
  for (const [queue, live] of state.points) {
    const kept = points.get(queue) || [];
    const last = kept.length ? kept[kept.length - 1].t : 0;
    points.set(queue, kept.concat(live.filter((p) => p.t > last)));
  }
  state.points = points;
  state.historyLoadedAt = Date.now();
  const note = $("history-note");
  note.hidden = answer.interval_seconds > 0;
  note.textContent = "This server keeps no history (serve --history-retention 0): the charts start at this page's load.";
}

function recordLive(queues) {
  const present = new Set(queues.map((q) => q.queue_name));
  for (const name of [...state.points.keys()]) if (!present.has(name)) state.points.delete(name);
  for (const q of queues) {
    const points = state.points.get(q.queue_name) || [];
    const t = Date.parse(q.scrape_time);
    if (!points.length || t > points[points.length - 1].t) points.push(pointOf(q, t));
    const from = t - state.windowMinutes * 60_000;
    while (points.length && points[0].t < from) points.shift();
    state.points.set(q.queue_name, points);
  }
}

// Per second between consecutive points; a counter that went down was reset (statistics
// reset, server restart): no rate there.
function rates(points, field) {
  const out = [];
  for (let i = 1; i < points.length; i++) {
    const seconds = (points[i].t - points[i - 1].t) / 1000;
    if (seconds <= 0) continue;
    const delta = points[i][field] - points[i - 1][field];
    if (delta >= 0) out.push([points[i].t, delta / seconds]);
  }
  return out;
}

// The latest rate, over at least ten seconds, so that one 2-second poll does not make it jump.
function latestRate(points, field) {
  if (points.length < 2) return null;
  const last = points[points.length - 1];
  let i = points.length - 2;
  while (i > 0 && last.t - points[i].t < 10_000) i--;
  const seconds = (last.t - points[i].t) / 1000;
  const delta = last[field] - points[i][field];
  return seconds > 0 && delta >= 0 ? delta / seconds : null;
}

// -- charts -----------------------------------------------------------------------------------

function svg(name, attributes, parent) {
  const element = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attributes)) element.setAttribute(k, v);
  parent.appendChild(element);
  return element;
}

function niceCeiling(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const m of [1, 2, 5, 10]) if (value <= m * power) return m * power;
  return 10 * power;
}

function formatNumber(value) {
  if (value >= 1e6) return (value / 1e6).toFixed(1) + "M";
  if (value >= 1e3) return (value / 1e3).toFixed(1) + "k";
  return Number.isInteger(value) ? String(value) : value.toFixed(1);
}

function formatSpan(ms) {
  if (ms >= 3_600_000) return `${Math.round(ms / 3_600_000)} h`;
  if (ms >= 60_000) return `${Math.round(ms / 60_000)} min`;
  return `${Math.round(ms / 1000)} s`;
}

// series: [{queue, kind, points: [[t, value], ...]}]; kind is a class name (depth, sent, ...).
function drawChart(element, now, series) {
  const W = 460, H = 190, L = 44, R = 10, T = 10, B = 20;
  element.setAttribute("viewBox", `0 0 ${W} ${H}`);
  element.replaceChildren();
  let max = 0;
  let first = now;
  for (const s of series) {
    for (const [t, v] of s.points) {
      max = Math.max(max, v);
      first = Math.min(first, t);
    }
  }
  max = niceCeiling(max);
  // The time axis is the history there is, up to the window.
  const span = Math.min(state.windowMinutes * 60_000, Math.max(30_000, now - first));
  const x = (t) => L + (W - L - R) * (1 - (now - t) / span);
  const y = (v) => T + (H - T - B) * (1 - v / max);
  for (const fraction of [0, 0.5, 1]) {
    const at = y(max * fraction);
    svg("line", { class: "grid", x1: L, x2: W - R, y1: at, y2: at }, element);
    svg("text", { class: "axis", x: L - 4, y: at + 3, "text-anchor": "end" }, element).textContent =
      formatNumber(max * fraction);
  }
  svg("text", { class: "axis", x: L, y: H - 4 }, element).textContent = `−${formatSpan(span)}`;
  svg("text", { class: "axis", x: W - R, y: H - 4, "text-anchor": "end" }, element).textContent = "now";
  for (const s of series) {
    const shown = s.points.filter(([t]) => t >= now - span);
    if (!shown.length) continue;
    const d = shown.map(([t, v], i) => `${i ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`).join("");
    const color = colorOf(s.queue);
    const path = svg("path", { d, class: `series ${s.kind}`, stroke: color }, element);
    const [lastT, lastV] = shown[shown.length - 1];
    path.dataset.queue = s.queue;
    path.dataset.last = String(lastV);
    path.dataset.points = String(shown.length);
    svg("title", {}, path).textContent = `${s.queue}: ${formatNumber(lastV)}`;
    svg("circle", { cx: x(lastT), cy: y(lastV), r: 2.5, fill: color }, element);
  }
}

function seriesOf(kind, pick) {
  return [...state.points].map(([queue, points]) => ({
    queue,
    kind,
    points: points.map((p) => [p.t, pick(p)]),
  }));
}

function rateSeries(kind, field) {
  return [...state.points].map(([queue, points]) => ({ queue, kind, points: rates(points, field) }));
}

function renderCharts() {
  let now = 0;
  for (const points of state.points.values()) if (points.length) now = Math.max(now, points[points.length - 1].t);
  now = now || Date.now();
  drawChart($("chart-depth"), now, seriesOf("depth", (p) => p.length));
  drawChart($("chart-in-flight"), now, seriesOf("in-flight", (p) => p.inFlight));
  drawChart($("chart-throughput"), now, [...rateSeries("consumed", "consumed"), ...rateSeries("sent", "sent")]);
  drawChart($("chart-failures"), now, [
    ...rateSeries("retried", "retried"),
    ...rateSeries("dead-lettered", "deadLettered"),
  ]);
  drawChart($("chart-age"), now, seriesOf("age", (p) => p.age));
}

// -- the queues table -------------------------------------------------------------------------

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

function button(parent, label, action, className) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.dataset.action = action;
  if (className) b.className = className;
  parent.appendChild(b);
  return b;
}

// Rows are updated in place, never rebuilt: a button replaced under the pointer between mouse
// down and up would swallow the click.
function queueRow(tbody, queue) {
  let row = tbody.querySelector(`tr[data-queue="${CSS.escape(queue)}"]`);
  if (row) return row;
  row = document.createElement("tr");
  row.dataset.queue = queue;
  const name = cell(row, "");
  const swatch = document.createElement("span");
  swatch.className = "swatch";
  swatch.style.background = colorOf(queue);
  name.append(swatch, queue);
  for (const field of ["length", "visible", "in-flight", "oldest", "sent-rate", "consumed-rate", "retried-rate",
    "dead-lettered-rate", "sent", "dead-letters"]) {
    cell(row, "", field);
  }
  const actions = cell(row, "", "actions");
  button(actions, "messages", "browse").onclick = () => browse(queue);
  button(actions, "dead letters", "show-dead-letters").onclick = () => showDeadLetters(queue);
  if (isAdmin()) {
    // Its label follows the queue's state (renderTable): "pause" or "resume".
    const toggle = button(actions, "pause", "pause-toggle", "admin");
    toggle.onclick = () => setPaused(queue, toggle.dataset.paused !== "true");
    // Shown only where it applies (renderTable): a queue with dead letters. Purge and drop are
    // in the queue's own panel (renderQueueActions), not on every row.
    button(actions, "replay dead letters", "replay", "admin").onclick = () => replay(queue);
  }
  tbody.appendChild(row);
  return row;
}

function rateText(value) {
  return value == null ? "" : formatNumber(value);
}

function renderTable(queues) {
  const tbody = document.querySelector("#queues tbody");
  const present = new Set(queues.map((q) => q.queue_name));
  for (const row of [...tbody.rows]) if (!present.has(row.dataset.queue)) row.remove();
  for (const q of queues) {
    const points = state.points.get(q.queue_name) || [];
    const row = queueRow(tbody, q.queue_name);
    const values = {
      length: formatNumber(q.queue_length) + (q.length_is_estimate ? "≈" : ""),
      visible: formatNumber(q.visible_length),
      "in-flight": formatNumber(q.in_flight),
      oldest: q.oldest_msg_age_sec == null ? "" : formatNumber(Math.round(q.oldest_msg_age_sec)),
      "sent-rate": rateText(latestRate(points, "sent")),
      "consumed-rate": rateText(latestRate(points, "consumed")),
      "retried-rate": rateText(latestRate(points, "retried")),
      "dead-lettered-rate": rateText(latestRate(points, "deadLettered")),
      sent: formatNumber(q.total_sent),
      "dead-letters": q.dead_letter_length == null ? "?" : formatNumber(q.dead_letter_length),
    };
    for (const [field, text] of Object.entries(values)) row.querySelector(`td.${field}`).textContent = text;
    row.classList.toggle("paused", Boolean(q.paused));
    const toggle = row.querySelector('button[data-action="pause-toggle"]');
    if (toggle) {
      toggle.dataset.paused = String(Boolean(q.paused));
      toggle.textContent = q.paused ? "resume" : "pause";
    }
    const replayButton = row.querySelector('button[data-action="replay"]');
    if (replayButton) replayButton.hidden = q.dead_letter_length === 0;
  }
  renderSearchQueues(queues);
  const browsed = queues.find((q) => q.queue_name === browser.queue);
  const purgeButton = document.querySelector('#br-queue-actions button[data-action="purge"]');
  if (browsed && purgeButton) purgeButton.hidden = browsed.queue_length === 0;
}

function queuePath(queue, rest) {
  return `/v1/queues/${encodeURIComponent(queue)}/${rest}`;
}

async function act(what, request) {
  try {
    const answer = await request();
    setStatus(typeof what === "function" ? what(answer) : what);
    await poll();
    return answer;
  } catch (e) {
    setStatus(e.message, true);
    return null;
  }
}

async function setPaused(queue, paused) {
  await act(paused ? `paused ${queue}: its reads return nothing until resumed` : `resumed ${queue}`,
    () => api(queuePath(queue, paused ? "pause" : "resume"), { method: "POST" }));
}

async function purge(queue) {
  if (!confirm(`Delete every message of ${queue}?`)) return;
  await act(({ purged }) => `purged ${purged} messages from ${queue}`,
    () => api(queuePath(queue, "purge"), { method: "POST" }));
}

async function replay(queue) {
  if (!confirm(`Send every dead letter of ${queue} back to it?`)) return;
  await act(({ replayed }) => `replayed ${replayed.length} dead letters into ${queue}`,
    () => api(queuePath(queue, "dead-letters/replay"), { method: "POST", body: "{}" }));
}

async function dropQueue(queue) {
  // Typed, not clicked: a drop takes the queue, its archive and its dead letters with it.
  if (prompt(`Drop queue ${queue} with every message and its archive? Type its name to confirm.`) !== queue) return;
  const done = await act(`dropped queue ${queue}`, () => api(`/v1/queues/${encodeURIComponent(queue)}`, { method: "DELETE" }));
  if (done) closeBrowser();
}

// -- workers: queue workers (their heartbeat rows) and stream consumers ------------------------

async function renderWorkers() {
  const { queue_workers: workers, stream_consumers: consumers } = await api("/v1/workers");
  $("wk-empty").hidden = workers.length + consumers.length > 0;
  $("queue-workers").hidden = workers.length === 0;
  $("stream-consumers").hidden = consumers.length === 0;
  const rows = workers.map((w) => {
    const row = document.createElement("tr");
    row.dataset.worker = w.worker_id;
    row.classList.toggle("stale", w.heartbeat_age_sec > 45);
    for (const [text, field] of [[w.queue_name, "queue"], [`${w.host}:${w.pid}`, "process"],
      [String(w.concurrency), "slots"], [String(w.in_flight), "holding"], [formatNumber(w.completed), "completed"],
      [formatNumber(w.retried), "retried"], [formatNumber(w.dead_lettered), "dead-lettered"],
      [String(Math.round(w.heartbeat_age_sec)), "heartbeat"], [new Date(w.started_at).toLocaleString(), "since"]]) {
      cell(row, text, field);
    }
    return row;
  });
  document.querySelector("#queue-workers tbody").replaceChildren(...rows);
  const consumerRows = consumers.map((c) => {
    const row = document.createElement("tr");
    for (const text of [c.stream, c.group, c.consumer, String(Math.round(c.renewed_age_sec)),
      new Date(c.expires_at).toLocaleTimeString()]) cell(row, text);
    return row;
  });
  document.querySelector("#stream-consumers tbody").replaceChildren(...consumerRows);
}

// Streams: lag per consumer group (shown once there is a group).
async function renderStreamGroups() {
  const { groups } = await api("/v1/streams/stats");
  const table = $("stream-groups");
  table.hidden = groups.length === 0;
  const rows = groups.map((g) => {
    const row = document.createElement("tr");
    for (const text of [g.stream, g.group, formatNumber(g.lag),
      g.oldest_unacked_age_sec == null ? "" : formatNumber(Math.round(g.oldest_unacked_age_sec)),
      String(g.consumers)]) cell(row, text);
    return row;
  });
  table.querySelector("tbody").replaceChildren(...rows);
}

// -- dead letters -----------------------------------------------------------------------------

async function showDeadLetters(queue) {
  state.deadLetterQueue = queue;
  try {
    await loadDeadLetters();
  } catch (e) {
    state.deadLetterQueue = null;  // a key without the read scope: 403, said in the status line
    setStatus(e.message, true);
  }
}

async function loadDeadLetters() {
  const queue = state.deadLetterQueue;
  const { messages } = await api(queuePath(queue, "dead-letters?limit=50"));
  $("dead-letters").hidden = false;
  $("dl-queue").textContent = queue;
  $("dl-empty").hidden = messages.length > 0;
  const tbody = document.querySelector("#dead-letters tbody");
  tbody.replaceChildren();
  for (const m of messages) {
    const why = (m.headers || {})[DEAD_LETTER_HEADER] || {};
    const row = document.createElement("tr");
    row.dataset.msgId = String(m.msg_id);
    cell(row, String(m.msg_id), "msg-id");
    cell(row, why.deliveries == null ? "" : String(why.deliveries));
    cell(row, why.dead_lettered_at ? new Date(why.dead_lettered_at).toLocaleString() : "");
    cell(row, why.error || "", "error");
    const text = JSON.stringify(m.message);
    cell(row, text.length > 300 ? text.slice(0, 300) + "…" : text, "message");
    // The letter in the browser, with every attempt: the id is the one the worker logged.
    row.onclick = () => find(queue, String(m.msg_id));
    tbody.appendChild(row);
  }
}

// -- message browser: peek at a queue's messages (GET /v1/queues/{queue}/peek), page by msg_id, --
// -- show one with every failed attempt, its headers and body; retry, cancel, delete, replay ----

const PAGE_SIZE = 20;
const browser = {
  queue: null,      // the queue being browsed
  filter: {},       // the search's peek parameters (header, header_value, contains)
  after: 0,         // the page shown starts after this msg_id
  nextAfter: null,  // the next page's start (null: this is the last page)
  page: 1,
  messages: [],     // the page, as the server gave it
  selected: null,   // the msg_id shown in the detail view
};

function closeBrowser() {
  browser.queue = null;
  $("browser").hidden = true;
  // Another key may see the page next: no button of this one stays, even hidden.
  $("br-queue-actions").replaceChildren();
  $("br-actions").replaceChildren();
  remember({ queue: null, find: null });
}

async function browse(queue, filter = {}, { shown = "", after = 0 } = {}) {
  browser.queue = queue;
  browser.filter = filter;
  browser.page = 1;
  $("br-state").value = shown;
  remember({ queue, find: filter.text || null });
  try {
    await loadPage(after);
    renderQueueActions();
  } catch (e) {
    closeBrowser();  // a key without the read scope: 403, said in the status line
    setStatus(e.message, true);
  }
}

// The queue's destructive actions, here rather than on every row: purge (shown while the queue
// has messages, renderTable) confirmed, drop confirmed by typing the queue's name.
function renderQueueActions() {
  const actions = $("br-queue-actions");
  actions.replaceChildren();
  if (!isAdmin()) return;
  const queue = browser.queue;
  const purgeButton = button(actions, "purge queue", "purge", "admin danger");
  purgeButton.onclick = () => purge(queue).then(() => loadPage(0));
  purgeButton.hidden = (state.queues.find((q) => q.queue_name === queue) || {}).queue_length === 0;
  button(actions, "drop queue", "drop-queue", "admin danger").onclick = () => dropQueue(queue);
}

async function loadPage(after) {
  const params = new URLSearchParams({ limit: String(PAGE_SIZE), after: String(after) });
  if ($("br-state").value) params.set("state", $("br-state").value);
  for (const name of ["header", "header_value", "contains", "before"]) {
    if (browser.filter[name] !== undefined) params.set(name, browser.filter[name]);
  }
  const page = await api(queuePath(browser.queue, "peek?" + params));
  browser.after = after;
  browser.nextAfter = page.next_after;
  browser.messages = page.messages;
  $("browser").hidden = false;
  $("br-queue").textContent = browser.queue;
  $("br-search").textContent = browser.filter.text ? `matching ${browser.filter.text}` : "";
  $("br-next").disabled = page.next_after === null;
  $("br-page").textContent = `page ${browser.page}`;
  $("br-empty").hidden = page.messages.length > 0;
  const tbody = document.querySelector("#br-list tbody");
  tbody.replaceChildren();
  for (const m of page.messages) {
    const row = document.createElement("tr");
    row.dataset.msgId = String(m.msg_id);
    cell(row, String(m.msg_id), "msg-id");
    cell(row, m.state, "state");
    cell(row, String(m.read_ct), "reads");
    cell(row, new Date(m.enqueued_at).toLocaleString(), "enqueued");
    const attempts = (m.headers || {})[ATTEMPTS_HEADER] || [];
    cell(row, attempts.length ? attempts[attempts.length - 1].error : "", "error");
    const text = JSON.stringify(m.message);
    cell(row, text.length > 120 ? text.slice(0, 120) + "…" : text, "message");
    row.onclick = () => showMessage(m.msg_id);
    tbody.appendChild(row);
  }
  const keep = page.messages.some((m) => m.msg_id === browser.selected) ? browser.selected : null;
  showMessage(keep ?? (page.messages.length === 1 && browser.filter.text ? page.messages[0].msg_id : null));
}

function renderAttempts(m) {
  const attempts = (m.headers || {})[ATTEMPTS_HEADER] || [];
  $("br-no-attempts").hidden = attempts.length > 0;
  $("br-attempts").hidden = attempts.length === 0;
  const rows = attempts.map((a) => {
    const row = document.createElement("tr");
    cell(row, String(a.delivery), "delivery");
    cell(row, a.failed_at ? new Date(a.failed_at).toLocaleString() : "", "failed-at");
    const error = cell(row, a.error || "", "error");
    if (a.traceback) {
      const details = document.createElement("details");
      const summary = document.createElement("summary");
      summary.textContent = "traceback";
      const pre = document.createElement("pre");
      pre.className = "traceback";
      pre.textContent = a.traceback;
      details.append(summary, pre);
      error.appendChild(details);
    }
    return row;
  });
  document.querySelector("#br-attempts tbody").replaceChildren(...rows);
}

function showMessage(msgId) {
  browser.selected = msgId;
  const m = browser.messages.find((x) => x.msg_id === msgId);
  for (const row of document.querySelectorAll("#br-list tbody tr")) {
    row.classList.toggle("selected", row.dataset.msgId === String(msgId));
  }
  $("br-detail").hidden = !m;
  if (!m) return;
  $("br-id").textContent = String(m.msg_id);
  const why = (m.headers || {})[DEAD_LETTER_HEADER];
  $("br-detail-state").textContent = why
    ? `dead-lettered after ${why.deliveries} ${why.deliveries === 1 ? "delivery" : "deliveries"}, ` +
      new Date(why.dead_lettered_at).toLocaleString()
    : `${m.state}, read ${m.read_ct}×, enqueued ${new Date(m.enqueued_at).toLocaleString()}`;
  renderAttempts(m);
  // The attempts are in their table above: the headers show the rest.
  const { [ATTEMPTS_HEADER]: attempts, ...headers } = m.headers || {};
  $("br-headers").textContent = m.headers === null ? "null" : JSON.stringify(headers, null, 2);
  $("br-body").textContent = JSON.stringify(m.message, null, 2);
  const actions = $("br-actions");
  actions.replaceChildren();
  if (!isAdmin()) return;
  if (m.state === "dead") {
    button(actions, "replay", "replay-message", "admin").onclick = () => replayMessage(m);
  } else if (m.state === "delayed") {
    button(actions, "run now", "retry-message", "admin").onclick = () => retryMessage(m);
    button(actions, "cancel", "cancel-message", "admin danger").onclick = () => deleteMessage(m, "cancel");
  } else if (m.state === "in_flight") {
    button(actions, "retry now", "retry-message", "admin").onclick = () => retryMessage(m);
  }
  button(actions, "delete", "delete-message", "admin danger").onclick = () => deleteMessage(m, "delete");
}

async function browserAction(what, path, body) {
  try {
    await api(queuePath(browser.queue, path), { method: "POST", body: JSON.stringify(body) });
    setStatus(what);
    browser.selected = null;
    await loadPage(browser.after);
  } catch (e) {
    setStatus(e.message, true);
  }
}

async function deleteMessage(m, verb) {
  if (!confirm(`${verb === "cancel" ? "Cancel (delete)" : "Delete"} message ${m.msg_id} of ${browser.queue}?`)) return;
  // A dead letter lives in the dead-letter queue or the archive: the dead-letter route finds it.
  const path = m.state === "dead" ? "dead-letters/purge" : "delete";
  await browserAction(`${verb === "cancel" ? "cancelled" : "deleted"} message ${m.msg_id}`, path, { msg_ids: [m.msg_id] });
}

async function retryMessage(m) {
  if (m.state === "in_flight" && !confirm(`Make message ${m.msg_id} visible now? Its consumer's lease ends.`)) return;
  await browserAction(`message ${m.msg_id} is visible now`, "retry", { msg_ids: [m.msg_id] });
}

async function replayMessage(m) {
  await browserAction(`replayed dead letter ${m.msg_id} into ${browser.queue}`, "dead-letters/replay", {
    msg_ids: [m.msg_id],
  });
}

$("br-filter").onsubmit = (event) => {
  event.preventDefault();
  browser.page = 1;
  loadPage(0).catch((e) => setStatus(e.message, true));
};
$("br-next").onclick = () => {
  if (browser.nextAfter === null) return;
  browser.page += 1;
  loadPage(browser.nextAfter).catch((e) => setStatus(e.message, true));
};

// -- search: by msg_id (a message, or a dead letter by the id the worker logged), by header, ---
// -- or by a field of the body -----------------------------------------------------------------

function renderSearchQueues(queues) {
  const select = $("se-queue");
  const names = queues.map((q) => q.queue_name);
  if ([...select.options].map((o) => o.value).join() === names.join()) return;
  const chosen = select.value || PARAMS.get("queue");
  select.replaceChildren(...names.map((name) => new Option(name, name)));
  if (names.includes(chosen)) select.value = chosen;
}

// "42": msg_id 42; "header:tenant=acme": that header; "sku=A-001" or "order=7": that body
// field (the value read as JSON when it is JSON, else as text).
function searchFilter(text) {
  const header = /^header:([^=]+)(?:=(.*))?$/.exec(text);
  if (header) return header[2] === undefined ? { header: header[1] } : { header: header[1], header_value: header[2] };
  const field = /^([^=]+)=(.*)$/.exec(text);
  if (field) {
    let value = field[2];
    try {
      value = JSON.parse(value);
    } catch {
      // text, as typed
    }
    return { contains: JSON.stringify({ [field[1].trim()]: value }) };
  }
  return null;
}

async function find(queue, text) {
  $("se-queue").value = queue;
  $("se-text").value = text;
  if (/^\d+$/.test(text)) {
    const id = Number(text);
    await browse(queue, { text: `msg_id ${id}`, before: String(id) }, { after: id - 1 });
    if (browser.queue !== null && !browser.messages.length) {  // not in the queue: a dead letter, by the id the worker logged
      $("br-state").value = "dead";
      await loadPage(id - 1);
    }
    return;
  }
  const filter = searchFilter(text);
  if (filter === null) {
    setStatus("search for a msg_id, header:name=value, or field=value", true);
    return;
  }
  await browse(queue, { ...filter, text });
}

$("search").onsubmit = (event) => {
  event.preventDefault();
  const text = $("se-text").value.trim();
  if ($("se-queue").value && text) find($("se-queue").value, text).catch((e) => setStatus(e.message, true));
};

// -- schedules: the cron schedules of the key's queues (GET /v1/schedules), paused and resumed --
// -- by admin keys ------------------------------------------------------------------------------

async function loadSchedules() {
  const { schedules } = await api("/v1/schedules").catch(() => ({ schedules: null }));
  $("schedules").hidden = schedules === null;  // a key without the read scope: no panel
  if (schedules === null) return;
  $("sc-empty").hidden = schedules.length > 0;
  const tbody = document.querySelector("#schedules tbody");
  const present = new Set(schedules.map((s) => s.name));
  for (const row of [...tbody.rows]) if (!present.has(row.dataset.schedule)) row.remove();
  for (const s of schedules) {
    const row = scheduleRow(tbody, s.name);
    row.classList.toggle("schedule-paused", s.paused);
    const values = {
      queue: s.queue_name,
      cron: `${s.cron} (${s.timezone})`,
      next: s.paused ? "paused" : new Date(s.next_run).toLocaleString(),
      last: s.last_run ? new Date(s.last_run).toLocaleString() : "",
      "last-msg": s.last_error ? s.last_error : s.last_msg_id == null ? "" : String(s.last_msg_id),
    };
    for (const [field, text] of Object.entries(values)) row.querySelector(`td.${field}`).textContent = text;
    row.querySelector("td.last-msg").classList.toggle("error-text", Boolean(s.last_error));
    const toggle = row.querySelector("button[data-action=toggle-schedule]");
    if (toggle) {
      toggle.textContent = s.paused ? "resume" : "pause";
      toggle.dataset.paused = String(s.paused);
    }
  }
}

// In place, like the queue rows: a button replaced under the pointer would swallow the click.
function scheduleRow(tbody, name) {
  let row = tbody.querySelector(`tr[data-schedule="${CSS.escape(name)}"]`);
  if (row) return row;
  row = document.createElement("tr");
  row.dataset.schedule = name;
  cell(row, name);
  for (const field of ["queue", "cron", "next", "last", "last-msg"]) cell(row, "", field);
  const actions = cell(row, "", "actions");
  if (isAdmin()) {
    const toggle = button(actions, "pause", "toggle-schedule", "admin");
    toggle.onclick = () => toggleSchedule(name, toggle.dataset.paused === "true");
  }
  tbody.appendChild(row);
  return row;
}

async function toggleSchedule(name, paused) {
  try {
    await api(`/v1/schedules/${encodeURIComponent(name)}/${paused ? "resume" : "pause"}`, { method: "POST" });
    setStatus(`${paused ? "resumed" : "paused"} schedule ${name}`);
    await loadSchedules();
  } catch (e) {
    setStatus(e.message, true);
  }
}

// -- the loop ---------------------------------------------------------------------------------

async function poll() {
  if (!state.key) {
    setStatus("enter an API key (pgbroker keys create)");
    return;
  }
  if (state.polling) return;
  state.polling = true;
  try {
    if (state.me === null) {
      state.me = await api("/v1/key");
      const groups = state.me.groups.join(", ");
      $("who").textContent = `key ${state.me.name}: ${state.me.scopes.join(", ")} on ${state.me.queues.join(", ")}`
        + (groups === "*" ? "" : ` (groups ${groups})`);
      reopenView();
    }
    if (Date.now() - state.historyLoadedAt > HISTORY_REFRESH_MS) await loadHistory();
    const { queues, replica_lag_seconds: replicaLag } = await api("/v1/stats");
    state.queues = queues;
    recordLive(queues);
    renderTable(queues);
    renderCharts();
    await renderWorkers();
    await renderStreamGroups();
    const present = new Set(queues.map((q) => q.queue_name));
    if (state.deadLetterQueue !== null && present.has(state.deadLetterQueue)) await loadDeadLetters();
    await loadSchedules();
    // Served by `pgbroker serve --replica-dsn`: the figures may be this far in the past.
    const from = replicaLag == null ? "" : ` from a replica ${replicaLag.toFixed(1)} s behind the primary`;
    setStatus("updated " + new Date().toLocaleTimeString() + from);
  } catch (e) {
    setStatus(e.message, true);
  } finally {
    state.polling = false;
  }
}

// The queue and search of a bookmark, opened once the key is known.
function reopenView() {
  const queue = PARAMS.get("queue");
  if (!queue || browser.queue !== null) return;
  const text = PARAMS.get("find");
  (text ? find(queue, text) : browse(queue)).catch((e) => setStatus(e.message, true));
}

function useKey(key, { share = true } = {}) {
  state.key = key;
  state.me = null;
  state.points.clear();
  state.historyLoadedAt = 0;
  state.deadLetterQueue = null;
  $("dead-letters").hidden = true;
  closeBrowser();
  $("who").textContent = key ? "" : "no key";
  $("key").value = key;
  if (key) sessionStorage.setItem(KEY_ITEM, key);
  else sessionStorage.removeItem(KEY_ITEM);
  document.querySelector("#queues tbody").replaceChildren();
  document.querySelector("#schedules tbody").replaceChildren();
  if (share && channel) channel.postMessage(key ? { type: "key", key } : { type: "forget" });
}

// Tabs of this browser share the key: a new tab asks, an open one answers; "forget" is for all.
if (channel) {
  channel.onmessage = ({ data }) => {
    if (data.type === "ask" && state.key) channel.postMessage({ type: "key", key: state.key });
    else if (data.type === "key" && data.key !== state.key) {
      useKey(data.key, { share: false });
      poll();
    } else if (data.type === "forget" && state.key) {
      useKey("", { share: false });
      poll();
    }
  };
  if (!state.key) channel.postMessage({ type: "ask" });
}

$("key").value = state.key;
$("window").value = String(state.windowMinutes);
$("key-form").onsubmit = (event) => {
  event.preventDefault();
  useKey($("key").value.trim());
  poll();
};
$("forget").onclick = () => {
  useKey("");
  poll();
};
$("window").onchange = () => {
  state.windowMinutes = Number($("window").value);
  state.historyLoadedAt = 0;
  remember({ window: state.windowMinutes });
  poll();
};
poll();
setInterval(poll, REFRESH_MS);
