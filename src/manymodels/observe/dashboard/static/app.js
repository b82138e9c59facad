// The manymodels live dashboard. Every value from the store (keys, errors,
// metric names) goes into the page as text (textContent, setAttribute on
// numbers), never as HTML: a key "<script>" shows as those characters.
"use strict";

const COLORS = {ok: "#4c78a8", failed: "#e45756", crashed: "#b279a2", timeout: "#f58518",
                memory: "#9d755d", cancelled: "#bab0ac"};
const SVGNS = "http://www.w3.org/2000/svg";
const token = new URLSearchParams(location.search).get("token");
let selected = null;     // run id shown
let search = "";
let polls = 0;
const opened = new Set(); // failures whose traceback is unfolded, by key

// The token of the address, where it has one: the server keeps it in a cookie
// too, so the page works without it once loaded (a reload, a bookmark).
function api(path, extra) {
  const params = new URLSearchParams(extra || {});
  if (token) params.set("token", token);
  if (search) params.set("q", search);
  const query = params.toString();
  return fetch(path + (query ? "?" + query : ""), {cache: "no-store"}).then(r => {
    if (!r.ok) return r.json().then(body => {
      const error = new Error(body.error || r.statusText);
      error.status = r.status;
      throw error;
    });
    return r.json();
  });
}

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function svg(tag, attrs, parent) {
  const node = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (parent) parent.appendChild(node);
  return node;
}

function label(parent, x, y, text, anchor) {
  const node = svg("text", {x: x, y: y, "text-anchor": anchor || "start"}, parent);
  node.textContent = text;
  return node;
}

function fmt(value, digits) {
  if (value === null || value === undefined) return "–";
  if (typeof value !== "number") return String(value);
  if (Number.isInteger(value) && Math.abs(value) < 1e15) return value.toLocaleString("en-US");
  return Number(value.toPrecision(digits || 4)).toString();
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 60) return seconds.toFixed(1) + " s";
  if (seconds < 3600) return Math.floor(seconds / 60) + " min " + Math.round(seconds % 60) + " s";
  return Math.floor(seconds / 3600) + " h " + Math.round((seconds % 3600) / 60) + " min";
}

function setText(id, value) { document.getElementById(id).textContent = value; }

function renderRuns(runs) {
  const body = document.querySelector("#runs tbody");
  const rows = runs.map(run => {
    const tr = el("tr");
    tr.dataset.run = run.run_id;
    if (run.run_id === selected) tr.className = "selected";
    const bar = el("div", null, "mini"), fill = el("div");
    fill.style.width = (100 * run.done / Math.max(run.tasks || 1, 1)).toFixed(1) + "%";
    bar.appendChild(fill);
    const status = el("span", run.status, "badge " + run.status);
    const cells = [run.run_id, status, bar, fmt(run.done) + " / " + fmt(run.tasks), fmt(run.ok),
                   fmt(run.failed), fmt(run.rate, 3) + "/s",
                   run.status === "running" ? duration(run.eta_s) : "–", run.fit];
    for (const cell of cells) {
      const td = el("td");
      if (cell instanceof Node) td.appendChild(cell); else td.textContent = String(cell);
      tr.appendChild(td);
    }
    tr.addEventListener("click", () => { selected = run.run_id; location.hash = "run=" + selected; poll(); });
    return tr;
  });
  body.replaceChildren(...rows);
  const shown = runs.find(run => run.run_id === selected);
  if (shown) {
    setText("rate", fmt(shown.rate, 3) + " models/s");
    setText("eta", shown.status === "running" ? duration(shown.eta_s) : "–");
  }
}

function histogram(target, hist, title, color) {
  const box = document.createElement("div");
  const width = 460, height = 200, left = 46, bottom = 28, plotW = width - 60, plotH = height - 56;
  const chart = svg("svg", {width: width, height: height, class: "histogram"});
  label(chart, width / 2, 16, title, "middle");
  if (!hist.counts || !hist.counts.length) {
    label(chart, width / 2, height / 2, "no values yet", "middle");
  } else {
    const top = Math.max(...hist.counts), barW = plotW / hist.counts.length;
    // a weighted sum: the difference of values a float's range apart is Infinity
    const edge = i => hist.low * (1 - i / hist.counts.length)
                      + hist.high * (i / hist.counts.length);
    hist.counts.forEach((count, i) => {
      const h = top ? plotH * count / top : 0;
      const rect = svg("rect", {x: (left + i * barW).toFixed(1), y: (height - bottom - h).toFixed(1),
                                width: Math.max(barW - 1, 1).toFixed(1), height: h.toFixed(1),
                                fill: color}, chart);
      svg("title", {}, rect).textContent = fmt(edge(i)) + " to " + fmt(edge(i + 1)) + ": " + count;
    });
    svg("line", {x1: left, y1: height - bottom, x2: left + plotW, y2: height - bottom, stroke: "#888"}, chart);
    label(chart, left, height - 10, fmt(hist.low));
    label(chart, left + plotW, height - 10, fmt(hist.high), "end");
    label(chart, left - 5, height - bottom - plotH + 4, fmt(top), "end");
  }
  box.appendChild(chart);
  target.appendChild(box);
  return box;
}

function renderTimeline(timeline, summary) {
  const target = document.getElementById("timeline");
  const bars = timeline.bars, workers = timeline.workers;
  setText("timeline-note", timeline.total > bars.length
    ? "(" + fmt(bars.length) + " of " + fmt(timeline.total) + " tasks drawn: a sample and the slowest)" : "");
  if (!bars.length) { target.replaceChildren(el("p", "No task has finished yet.", "muted")); return; }
  const width = 1140, left = 70, top = 10;
  const rowH = Math.max(6, Math.min(24, Math.floor(360 / workers.length)));
  const height = top + rowH * workers.length + 26;
  const row = new Map(workers.map((w, i) => [w, i]));
  let end = 0;
  for (const b of bars) end = Math.max(end, b[0] + b[1]);
  end = Math.max(end, 1e-6);
  const scale = (width - left - 10) / end;
  const chart = svg("svg", {width: width, height: height, id: "timeline-svg"});
  workers.forEach((w, i) => label(chart, left - 6, top + i * rowH + rowH / 2 + 4, "worker " + w, "end"));
  bars.forEach((b, i) => {
    const rect = svg("rect", {x: (left + Math.max(b[0], 0) * scale).toFixed(2),
                              y: top + row.get(b[2]) * rowH + 1,
                              width: Math.max(b[1] * scale, 0.6).toFixed(2), height: rowH - 2,
                              fill: COLORS[b[3]] || "#888"}, chart);
    svg("title", {}, rect).textContent = timeline.keys[i] + ": " + b[3] + ", " + fmt(b[1]) + " s";
  });
  label(chart, left, height - 6, "0 s");
  label(chart, width - 10, height - 6, fmt(end) + " s", "end");
  target.replaceChildren(chart);
}

function renderFailures(failures) {
  setText("failures-count", "(" + fmt(failures.total) + (failures.search
    ? ", " + fmt(failures.matching) + " matching" : "") + ")");
  setText("failures-note", failures.note);  // more than are listed: say so
  document.getElementById("failures-note").hidden = !failures.note;
  const target = document.getElementById("failures");
  if (!failures.items.length) {
    target.replaceChildren(el("p", failures.total ? "No failure matches." : "None.", "muted"));
    return;
  }
  target.replaceChildren(...failures.items.map(item => {
    const details = el("details", null, "failure");
    details.dataset.key = item.key;
    details.open = opened.has(item.key);
    details.addEventListener("toggle", () => {
      if (details.open) opened.add(item.key); else opened.delete(item.key);
    });
    const summary = el("summary");
    summary.appendChild(el("span", item.key, "key"));
    summary.appendChild(el("span", ": " + item.status + " (worker " + item.worker + ", "
                              + item.attempts + " attempt(s)"
                              + (item.resumed_from ? "; " + item.resumed_from : "") + ")", "muted"));
    details.appendChild(summary);
    details.appendChild(el("pre", item.error, "traceback"));
    return details;
  }));
}

function renderRun(data) {
  const s = data.summary;
  document.getElementById("run").hidden = false;
  setText("run-id", s.run_id);
  document.getElementById("report-link").href = "/report/" + s.run_id
    + (token ? "?token=" + encodeURIComponent(token) : "");
  const badge = document.getElementById("run-status");
  badge.textContent = s.status;
  badge.className = "badge " + s.status;
  setText("done", fmt(s.done));
  setText("total", fmt(s.tasks));
  setText("count-ok", fmt(s.counts.ok || 0));
  setText("count-failed", fmt(s.failed));
  setText("utilization", fmt(s.utilization, 3));
  setText("wall", duration(s.wall_s));
  document.getElementById("progress-fill").style.width =
    (100 * s.done / Math.max(s.tasks || 1, 1)).toFixed(2) + "%";
  setText("run-detail", s.fit + " on " + s.source + " · " + s.backend + ", " + s.workers
          + (s.workers === 1 ? " worker" : " workers") + " · keys " + s.key_columns.join(", ") + " · " + fmt(s.reused) + " reused"
          + (s.resumed ? " · " + fmt(s.resumed) + " resumed from a checkpoint" : ""));
  const legend = Object.entries(s.counts).map(([status, count]) => {
    const span = el("span");
    const swatch = el("span", null, "swatch");
    swatch.style.background = COLORS[status] || "#888";
    span.append(swatch, status + " " + fmt(count));
    span.dataset.status = status;
    return span;
  });
  document.getElementById("statuses").replaceChildren(...legend);
  renderTimeline(data.timeline, s);
  const durations = document.getElementById("durations");
  durations.replaceChildren();
  histogram(durations, data.durations, "duration (s)", "#4c78a8");
  const metrics = document.getElementById("metrics");
  metrics.replaceChildren();
  setText("metrics-note", data.metrics.sampled < s.done
    ? "(from a sample of " + fmt(data.metrics.sampled) + " tasks)" : "");
  for (const m of data.metrics.charts) {
    const box = histogram(metrics, m, m.name, "#54a24b");
    box.appendChild(el("div", "mean " + fmt(m.mean) + " · p05 " + fmt(m.p05) + " · median "
                              + fmt(m.p50) + " · p95 " + fmt(m.p95), "muted"));
  }
  if (!data.metrics.charts.length) metrics.appendChild(el("p", "No numeric metrics yet.", "muted"));
  document.querySelector("#slowest tbody").replaceChildren(...data.slowest.map(t => {
    const tr = el("tr");
    for (const v of [t.key, t.status, fmt(t.duration_s), t.worker, t.attempts])
      tr.appendChild(el("td", v));
    const resumed = el("td", t.resumed_from.startsWith("attempt") ? "yes" : "");
    if (t.resumed_from) resumed.title = t.resumed_from;  // what from: the state's age, the attempt
    tr.appendChild(resumed);
    return tr;
  }));
  renderFailures(data.failures);
}

let timer = null;
let busy = false;
async function poll() {
  clearTimeout(timer);
  if (busy) { timer = setTimeout(poll, 200); return; }
  busy = true;
  try {
    // one answer for the runs and the run shown: their counts are read at once
    const fromHash = /run=(\d+)/.exec(location.hash);
    if (selected === null && fromHash) selected = Number(fromHash[1]);
    const page = await api("/api/page", selected === null ? {} : {run: selected});
    if (selected === null && page.run) selected = page.run.summary.run_id;
    renderRuns(page.runs);
    const cut = document.getElementById("runs-cut");
    cut.hidden = !(page.runs_total > page.runs.length);
    cut.textContent = cut.hidden ? "" : "the newest " + fmt(page.runs.length) + " of " +
      fmt(page.runs_total) + " runs; open another as #run=ID";
    if (page.run) renderRun(page.run);
    polls += 1;
    document.body.dataset.polls = polls;
    if (polls === 1) document.body.dataset.firstRenderMs = Math.round(performance.now());
    setText("state", "updated " + new Date().toLocaleTimeString());
  } catch (error) {
    setText("state", "cannot read the store: " + error.message);
    if (error.status === 404 && selected !== null) {  // a run deleted, or another store's
      selected = null;                                // link: show the latest instead
      if (/run=\d+/.test(location.hash)) history.replaceState(null, "", location.pathname + location.search);
    }
  } finally {
    busy = false;
    timer = setTimeout(poll, 2000);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  let typing = null;
  const box = document.getElementById("search");
  box.value = search = new URLSearchParams(location.search).get("q") || "";  // a link to a search
  box.addEventListener("input", event => {
    search = event.target.value;
    clearTimeout(typing);
    typing = setTimeout(poll, 250);
  });
  poll();
});
