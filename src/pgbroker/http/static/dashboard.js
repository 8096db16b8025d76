// The pgbroker dashboard: polls /v1/stats with the API key typed into the page and draws, per
// queue, depth, oldest-message age and throughput over the last five minutes as inline SVG.
//
// The key lives in this tab's sessionStorage: it survives a reload but not the tab, and it is
// sent only as an Authorization header by fetch, never as a cookie, so no other site can make
// the browser use it (no CSRF). Nothing from the server is ever inserted as HTML: every value
// goes in through textContent or an attribute, so a message payload cannot script the page.
// Admin buttons are shown to keys with the admin scope; the server checks the scope anyway.
"use strict";

const KEY_ITEM = "pgbroker-api-key";
const WINDOW_MS = 5 * 60 * 1000;
const REFRESH_MS = Math.max(250, Number(new URLSearchParams(location.search).get("refresh")) || 2000);
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
const SVG_NS = "http://www.w3.org/2000/svg";
const DEAD_LETTER_HEADER = "x-pgbroker-dead-letter";

const state = {
  key: sessionStorage.getItem(KEY_ITEM) || "",
  me: null,               // the key's name and scopes (GET /v1/key)
  history: new Map(),     // queue -> [{t, length, age, sentRate, consumedRate}]
  previous: new Map(),    // queue -> {t, sent, consumed}: the last counters, for rates
  colors: new Map(),      // queue -> colour, stable while the page lives
  deadLetterQueue: null,  // the queue whose dead letters are shown
  polling: false,
};

const $ = (id) => document.getElementById(id);

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

// -- data -------------------------------------------------------------------------------------

function record(queue, now) {
  const name = queue.queue_name;
  const previous = state.previous.get(name);
  let sentRate = null;
  let consumedRate = null;
  if (previous && now > previous.t) {
    const seconds = (now - previous.t) / 1000;
    // A counter that went down was reset (statistics reset, server restart): no rate this once.
    sentRate = Math.max(0, (queue.total_sent - previous.sent) / seconds);
    consumedRate = Math.max(0, (queue.total_consumed - previous.consumed) / seconds);
  }
  state.previous.set(name, { t: now, sent: queue.total_sent, consumed: queue.total_consumed });
  const points = state.history.get(name) || [];
  points.push({ t: now, length: queue.queue_length, age: queue.oldest_msg_age_sec ?? 0, sentRate, consumedRate });
  while (points.length && points[0].t < now - WINDOW_MS) points.shift();
  state.history.set(name, points);
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
  // The time axis grows with the page's history, from 30 s up to the five-minute window.
  const span = Math.min(WINDOW_MS, Math.max(30_000, now - first));
  const x = (t) => L + (W - L - R) * (1 - (now - t) / span);
  const y = (v) => T + (H - T - B) * (1 - v / max);
  for (const fraction of [0, 0.5, 1]) {
    const at = y(max * fraction);
    svg("line", { class: "grid", x1: L, x2: W - R, y1: at, y2: at }, element);
    svg("text", { class: "axis", x: L - 4, y: at + 3, "text-anchor": "end" }, element).textContent =
      formatNumber(max * fraction);
  }
  const spanLabel = span >= 60_000 ? `${Math.round(span / 60_000)} min` : `${Math.round(span / 1000)} s`;
  svg("text", { class: "axis", x: L, y: H - 4 }, element).textContent = `−${spanLabel}`;
  svg("text", { class: "axis", x: W - R, y: H - 4, "text-anchor": "end" }, element).textContent = "now";
  for (const s of series) {
    if (!s.points.length) continue;
    const d = s.points.map(([t, v], i) => `${i ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`).join("");
    const color = colorOf(s.queue);
    const path = svg("path", { d, class: `series ${s.kind}`, stroke: color }, element);
    const [lastT, lastV] = s.points[s.points.length - 1];
    path.dataset.queue = s.queue;
    path.dataset.last = String(lastV);
    path.dataset.points = String(s.points.length);
    svg("title", {}, path).textContent = `${s.queue}: ${formatNumber(lastV)}`;
    svg("circle", { cx: x(lastT), cy: y(lastV), r: 2.5, fill: color }, element);
  }
}

function seriesOf(kind, pick) {
  const out = [];
  for (const [queue, points] of state.history) {
    const values = points.filter((p) => pick(p) !== null).map((p) => [p.t, pick(p)]);
    out.push({ queue, kind, points: values });
  }
  return out;
}

function renderCharts(now) {
  drawChart($("chart-depth"), now, seriesOf("depth", (p) => p.length));
  drawChart($("chart-age"), now, seriesOf("age", (p) => p.age));
  drawChart($("chart-throughput"), now, [
    ...seriesOf("consumed", (p) => p.consumedRate),
    ...seriesOf("sent", (p) => p.sentRate),
  ]);
}

// -- table and actions ------------------------------------------------------------------------

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
  for (const field of ["length", "visible", "oldest", "sent-rate", "consumed-rate", "sent", "dead-letters"]) {
    cell(row, "", field);
  }
  const actions = cell(row, "", "actions");
  button(actions, "messages", "browse").onclick = () => browse(queue);
  button(actions, "dead letters", "show-dead-letters").onclick = () => showDeadLetters(queue);
  if (isAdmin()) {
    button(actions, "purge", "purge", "admin").onclick = () => purge(queue);
    button(actions, "replay dead letters", "replay", "admin").onclick = () => replay(queue);
    // Its label follows the queue's state (renderTable): "pause" or "resume".
    const toggle = button(actions, "pause", "pause-toggle", "admin");
    toggle.onclick = () => setPaused(queue, toggle.dataset.paused !== "true");
  }
  tbody.appendChild(row);
  return row;
}

function renderTable(queues) {
  const tbody = document.querySelector("#queues tbody");
  const present = new Set(queues.map((q) => q.queue_name));
  for (const row of [...tbody.rows]) if (!present.has(row.dataset.queue)) row.remove();
  for (const q of queues) {
    const points = state.history.get(q.queue_name) || [];
    const last = points[points.length - 1] || {};
    const row = queueRow(tbody, q.queue_name);
    const values = {
      length: formatNumber(q.queue_length) + (q.length_is_estimate ? "≈" : ""),
      visible: formatNumber(q.visible_length),
      oldest: q.oldest_msg_age_sec == null ? "" : formatNumber(Math.round(q.oldest_msg_age_sec)),
      "sent-rate": last.sentRate == null ? "" : formatNumber(last.sentRate),
      "consumed-rate": last.consumedRate == null ? "" : formatNumber(last.consumedRate),
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
  }
}

async function setPaused(queue, paused) {
  try {
    await api(queuePath(queue, paused ? "pause" : "resume"), { method: "POST" });
    setStatus(paused ? `paused ${queue}: its reads return nothing until resumed` : `resumed ${queue}`);
    await poll();
  } catch (e) {
    setStatus(e.message, true);
  }
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

function queuePath(queue, rest) {
  return `/v1/queues/${encodeURIComponent(queue)}/${rest}`;
}

async function purge(queue) {
  if (!confirm(`Delete every message of ${queue}?`)) return;
  try {
    const { purged } = await api(queuePath(queue, "purge"), { method: "POST" });
    setStatus(`purged ${purged} messages from ${queue}`);
    await poll();
  } catch (e) {
    setStatus(e.message, true);
  }
}

async function replay(queue) {
  if (!confirm(`Send every dead letter of ${queue} back to it?`)) return;
  try {
    const { replayed } = await api(queuePath(queue, "dead-letters/replay"), { method: "POST", body: "{}" });
    setStatus(`replayed ${replayed.length} dead letters into ${queue}`);
    await poll();
  } catch (e) {
    setStatus(e.message, true);
  }
}

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
    cell(row, String(m.msg_id));
    cell(row, why.deliveries == null ? "" : String(why.deliveries));
    cell(row, why.dead_lettered_at ? new Date(why.dead_lettered_at).toLocaleString() : "");
    cell(row, why.error || "", "error");
    const text = JSON.stringify(m.message);
    cell(row, text.length > 300 ? text.slice(0, 300) + "…" : text, "message");
    tbody.appendChild(row);
  }
}

// -- message browser: peek at a queue's messages (GET /v1/queues/{queue}/peek), page by msg_id, --
// -- show one with its headers and body, delete it, replay a dead letter ----------------------

const PAGE_SIZE = 20;
const browser = {
  queue: null,      // the queue being browsed
  after: 0,         // the page shown starts after this msg_id
  nextAfter: null,  // the next page's start (null: this is the last page)
  page: 1,
  messages: [],     // the page, as the server gave it
  selected: null,   // the msg_id shown in the detail view
};

function closeBrowser() {
  browser.queue = null;
  $("browser").hidden = true;
}

async function browse(queue) {
  browser.queue = queue;
  browser.page = 1;
  $("br-state").value = "";
  try {
    await loadPage(0);
  } catch (e) {
    closeBrowser();  // a key without the read scope: 403, said in the status line
    setStatus(e.message, true);
  }
}

async function loadPage(after) {
  const params = new URLSearchParams({ limit: String(PAGE_SIZE), after: String(after) });
  if ($("br-state").value) params.set("state", $("br-state").value);
  const page = await api(queuePath(browser.queue, "peek?" + params));
  browser.after = after;
  browser.nextAfter = page.next_after;
  browser.messages = page.messages;
  $("browser").hidden = false;
  $("br-queue").textContent = browser.queue;
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
    const text = JSON.stringify(m.message);
    cell(row, text.length > 120 ? text.slice(0, 120) + "…" : text, "message");
    row.onclick = () => showMessage(m.msg_id);
    tbody.appendChild(row);
  }
  showMessage(page.messages.some((m) => m.msg_id === browser.selected) ? browser.selected : null);
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
  $("br-detail-state").textContent = `${m.state}, read ${m.read_ct}×, enqueued ${new Date(m.enqueued_at).toLocaleString()}`;
  $("br-headers").textContent = JSON.stringify(m.headers, null, 2);
  $("br-body").textContent = JSON.stringify(m.message, null, 2);
  const actions = $("br-actions");
  actions.replaceChildren();
  if (!isAdmin()) return;
  button(actions, "delete", "delete-message", "admin").onclick = () => deleteMessage(m);
  if (m.state === "dead") button(actions, "replay", "replay-message", "admin").onclick = () => replayMessage(m);
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

async function deleteMessage(m) {
  if (!confirm(`Delete message ${m.msg_id} of ${browser.queue}?`)) return;
  // A dead letter lives in the dead-letter queue or the archive: the dead-letter route finds it.
  const path = m.state === "dead" ? "dead-letters/purge" : "delete";
  await browserAction(`deleted message ${m.msg_id}`, path, { msg_ids: [m.msg_id] });
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
      $("who").textContent = `key ${state.me.name}: ${state.me.scopes.join(", ")} on ${state.me.queues.join(", ")}`;
    }
    const { queues, replica_lag_seconds: replicaLag } = await api("/v1/stats");
    const now = Date.now();
    const present = new Set(queues.map((q) => q.queue_name));
    for (const name of [...state.history.keys()]) {
      if (!present.has(name)) {
        state.history.delete(name);
        state.previous.delete(name);
      }
    }
    for (const q of queues) record(q, now);
    renderTable(queues);
    renderCharts(now);
    await renderStreamGroups();
    if (state.deadLetterQueue !== null && present.has(state.deadLetterQueue)) await loadDeadLetters();
    await loadSchedules();
    // Served by `pgbroker serve --replica-dsn`: the figures may be this far in the past.
    const from = replicaLag == null ? "" : ` from a replica ${replicaLag.toFixed(1)} s behind the primary`;
    setStatus("updated " + new Date(now).toLocaleTimeString() + from);
  } catch (e) {
    setStatus(e.message, true);
  } finally {
    state.polling = false;
  }
}

function useKey(key) {
  state.key = key;
  state.me = null;
  state.history.clear();
  state.previous.clear();
  state.deadLetterQueue = null;
  $("dead-letters").hidden = true;
  closeBrowser();
  $("who").textContent = key ? "" : "no key";
  if (key) sessionStorage.setItem(KEY_ITEM, key);
  else sessionStorage.removeItem(KEY_ITEM);
  document.querySelector("#queues tbody").replaceChildren();
  document.querySelector("#schedules tbody").replaceChildren();
}

$("key").value = state.key;
$("key-form").onsubmit = (event) => {
  event.preventDefault();
  useKey($("key").value.trim());
  poll();
};
$("forget").onclick = () => {
  $("key").value = "";
  useKey("");
  poll();
};
poll();
setInterval(poll, REFRESH_MS);
