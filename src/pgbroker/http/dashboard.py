"""The dashboard: one HTML page whose inline script polls /v1/stats with the key typed into it
(kept in the browser's localStorage) and draws each queue's depth over time on a canvas."""

from __future__ import annotations

DASHBOARD_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>pgbroker</title>
<style>
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin-top:1em}
td,th{padding:.25em .8em;border-bottom:1px solid #ddd;text-align:right}
td:first-child,th:first-child{text-align:left}#err{color:#b00}canvas{border:1px solid #ccc;margin-top:1em}
</style></head><body>
<h1>pgbroker</h1>
<label>API key <input id="key" type="password" size="50"></label> <button id="save">use</button>
<span id="err"></span>
<canvas id="chart" width="900" height="260"></canvas>
<table id="queues"><thead><tr><th>queue</th><th>length</th><th>visible</th><th>oldest age (s)</th>
<th>sent</th><th>dead letters</th></tr></thead><tbody></tbody></table>
<script>
"use strict";
const keyInput = document.getElementById("key");
keyInput.value = localStorage.getItem("pgbroker-key") || "";
document.getElementById("save").onclick = () => {
  localStorage.setItem("pgbroker-key", keyInput.value); poll();
};
const history = {};  // queue -> [[time, length], ...], the last 120 samples
const colors = ["#1f77b4","#d62728","#2ca02c","#ff7f0e","#9467bd","#8c564b","#e377c2","#17becf"];
function cell(text) { const td = document.createElement("td"); td.textContent = text; return td; }
function draw() {
  const c = document.getElementById("chart"), g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  const names = Object.keys(history).sort();
  let max = 1;
  for (const n of names) for (const [, v] of history[n]) max = Math.max(max, v);
  g.fillStyle = "#666"; g.fillText("depth (max " + max + ")", 8, 14);
  names.forEach((n, i) => {
    const pts = history[n]; if (!pts.length) return;
    g.strokeStyle = colors[i % colors.length]; g.beginPath();
    pts.forEach(([, v], j) => {
      const x = 40 + j * (c.width - 50) / 119, y = c.height - 10 - v / max * (c.height - 30);
      j ? g.lineTo(x, y) : g.moveTo(x, y);
    });
    g.stroke(); g.fillStyle = g.strokeStyle; g.fillText(n, c.width - 140, 28 + i * 14);
  });
}
async function poll() {
  const err = document.getElementById("err");
  try {
    const r = await fetch("/v1/stats", {headers: {"Authorization": "Bearer " + keyInput.value}});
    const body = await r.json();
    if (!r.ok) {
      err.textContent = body.error ? body.error.code + ": " + body.error.message : r.status;
      return;
    }
    err.textContent = "";
    const tbody = document.querySelector("#queues tbody"); tbody.replaceChildren();
    for (const q of body.queues) {
      (history[q.queue_name] ||= []).push([Date.now(), q.queue_length]);
      if (history[q.queue_name].length > 120) history[q.queue_name].shift();
      const tr = document.createElement("tr");
      tr.dataset.queue = q.queue_name;
      for (const v of [q.queue_name, q.queue_length, q.visible_length,
                       q.oldest_msg_age_sec == null ? "" : Math.round(q.oldest_msg_age_sec),
                       q.total_sent, q.dead_letter_length ?? "?"]) tr.appendChild(cell(v));
      tbody.appendChild(tr);
    }
    draw();
  } catch (e) { err.textContent = String(e); }
}
poll(); setInterval(poll, 2000);
</script></body></html>
"""
