// naiad's dashboard: polls dashboard/feed once a second and updates the tables in place (rows are keyed, so a
// button keeps existing between two updates). No framework, no build step, nothing fetched from elsewhere.
"use strict";

const FEED = "dashboard/feed";
const PERIOD_MS = 1000;
const STORE = "naiad-dashboard-headers";
const SVG = "http://www.w3.org/2000/svg";

// Restricted APIs: header name -> value the user typed, sent with every request (the feed and the buttons).
const keys = JSON.parse(sessionStorage.getItem(STORE) || "{}");
let actions = {};
let load = {};  // model name -> { rate, inFlight } over its versions, as of the last feed: Unload asks first
let timer = null;
let polling = false;  // a feed request is on its way
let again = false;  // asked for meanwhile (after a button): poll once more right after

const $ = (id) => document.getElementById(id);

// --- formatting ------------------------------------------------------------------------------------------------

function dash(value) { return value === null || value === undefined ? "–" : value; }

function fixed(value, digits) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
}

function bytes(value) {
  if (value === null || value === undefined) return "–";
  const units = [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];
  for (const [unit, scale] of units) if (value >= scale) return (value / scale).toFixed(1) + " " + unit;
  return value + " B";
}

function duration(seconds) {
  const s = Math.floor(seconds);
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
  return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
}

function clock(epochSeconds) { return new Date(epochSeconds * 1000).toLocaleTimeString(); }

function stateClass(state) {
  return { READY: "ok", LOADING: "busy", UNLOADING: "busy", UNAVAILABLE: "bad" }[state] || "";
}

// A state shown as a coloured pill inside its cell (the cell's text stays the state, for tests and copying).
function pill(tr, text, kind, title) {
  const td = tr.querySelector(".state");
  let span = td.firstChild;
  if (!span) {
    span = document.createElement("span");
    td.appendChild(span);
  }
  if (span.textContent !== text) span.textContent = text;
  span.className = "pill " + kind;
  td.title = title || "";
}

// --- keyed table rows ------------------------------------------------------------------------------------------

// Brings ``tbody`` to one row per item, in order: existing rows (by key) are reused, missing ones made with
// ``make(tr)``, vanished ones removed; ``fill(tr, item)`` then updates each row.
function sync(tbody, items, keyOf, make, fill) {
  const existing = new Map();
  for (const tr of tbody.rows) existing.set(tr.dataset.key, tr);
  let previous = null;
  for (const item of items) {
    const key = keyOf(item);
    let tr = existing.get(key);
    if (tr) existing.delete(key);
    else {
      tr = document.createElement("tr");
      tr.dataset.key = key;
      make(tr, item);
    }
    fill(tr, item);
    const next = previous ? previous.nextSibling : tbody.firstChild;
    if (tr !== next) tbody.insertBefore(tr, next);
    previous = tr;
  }
  for (const tr of existing.values()) tr.remove();
}

function cells(tr, classes) {
  for (const name of classes) {
    const td = document.createElement("td");
    td.className = name;
    tr.appendChild(td);
  }
}

function set(tr, cls, text, title) {
  const td = tr.querySelector("." + cls);
  const value = String(text);
  if (td.textContent !== value) td.textContent = value;
  if (title !== undefined) td.title = title;
  return td;
}

// --- charts (hand-drawn SVG) -----------------------------------------------------------------------------------

function sparkline(td, values) {
  let svg = td.querySelector("svg");
  if (!svg) {
    svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("width", "120");
    svg.setAttribute("height", "22");
    svg.setAttribute("class", "spark");
    const base = document.createElementNS(SVG, "line");
    for (const [k, v] of [["x1", 0], ["y1", 21.5], ["x2", 120], ["y2", 21.5]]) base.setAttribute(k, v);
    base.setAttribute("class", "base");
    svg.appendChild(base);
    svg.appendChild(document.createElementNS(SVG, "polyline"));
    td.appendChild(svg);
  }
  const top = Math.max(1, ...values);
  const step = 120 / 59;
  const offset = 120 - step * (values.length - 1);  // newest at the right edge
  const points = values.map((v, i) => `${(offset + i * step).toFixed(1)},${(21 - (v / top) * 20).toFixed(1)}`);
  svg.lastChild.setAttribute("points", points.join(" "));
  svg.setAttribute("aria-label", `peak ${top.toFixed(1)} req/s`);
  td.title = `peak ${top.toFixed(1)} req/s over the last ${values.length} s`;
}

// --- rendering -------------------------------------------------------------------------------------------------

function renderServer(doc) {
  const s = doc.server;
  $("server-id").textContent = s.id;
  for (const [id, on] of [["live", s.live], ["ready", s.ready]]) {
    $(id).textContent = on ? id : "not " + id;
    $(id).className = "badge " + (on ? "ok" : "bad");
  }
  $("version").textContent = s.version;
  $("pid").textContent = s.pid;
  $("rss").textContent = bytes(s.rss);
  $("uptime").textContent = duration(s.uptime_s);
  $("mode").textContent = s.control_mode;
  $("in-flight").textContent = s.in_flight;
  $("failure").hidden = !s.failure;
  $("failure").textContent = s.failure ? "Server not created: " + s.failure : "";
}

const MODEL_CELLS = ["name", "version", "state", "rate num", "chart", "p50 num", "p99 num", "queue num",
                     "compute num", "success num", "errors num", "action"];

function renderModels(doc) {
  load = {};
  for (const m of doc.models) {
    const busy = load[m.name] || (load[m.name] = { rate: 0, inFlight: 0 });
    busy.rate += (m.stats && m.stats.rate) || 0;
    busy.inFlight += m.in_flight || 0;
  }
  sync($("models").tBodies[0], doc.models, (m) => m.name + "/" + m.version,
    (tr, m) => {
      cells(tr, MODEL_CELLS);
      tr.dataset.model = m.name;
      tr.dataset.version = m.version;
      const label = document.createElement("span");
      label.className = "label";
      tr.querySelector(".name").appendChild(label);
    },
    (tr, m) => {
      const st = m.stats || {};
      set(tr, "label", m.name, m.platform ? "platform: " + m.platform : "");
      set(tr, "version", m.version || "–");
      pill(tr, m.state || "–", stateClass(m.state), m.reason);
      tr.classList.toggle("failed", Boolean(m.reason) && m.reason !== "unloaded");
      let reason = tr.querySelector(".reason");
      if (m.reason) {
        if (!reason) {
          reason = document.createElement("div");
          reason.className = "reason";
          tr.querySelector(".name").appendChild(reason);
        }
        reason.textContent = m.reason;
      } else if (reason) reason.remove();
      set(tr, "rate", fixed(st.rate, 1));
      const chart = tr.querySelector(".chart");
      if (st.history && st.history.length) sparkline(chart, st.history);
      else chart.textContent = "";
      set(tr, "p50", fixed(st.p50_ms, 2));
      set(tr, "p99", fixed(st.p99_ms, 2));
      set(tr, "queue", fixed(st.queue_ms, 3));
      set(tr, "compute", fixed(st.compute_ms, 3));
      set(tr, "success", dash(st.success));
      let reasons = Object.entries(st.fail_reasons || {}).map(([k, v]) => `${k}: ${v}`).join(", ");
      if (st.last_refusal) reasons += `\nlast refused: ${st.last_refusal}`;
      const errors = set(tr, "errors", st.failed === undefined ? "–" :
        st.failed + (st.error_rate ? ` (${st.error_rate.toFixed(1)}/s)` : ""), reasons);
      errors.classList.toggle("bad", Boolean(st.failed));
      renderAction(tr.querySelector(".action"), m);
    });
}

function renderAction(td, m) {
  let want = null;
  if (actions.repository) {
    if (m.state === "READY") want = "unload";
    else if (m.state === "UNAVAILABLE" || !m.state) want = "load";
  }
  let button = td.querySelector("button");
  if (!want) {
    if (button) button.remove();
    return;
  }
  if (!button || button.dataset.action !== want) {
    if (button) button.remove();
    button = document.createElement("button");
    button.type = "button";
    button.dataset.action = want;
    button.dataset.model = m.name;
    button.className = want;
    button.textContent = want === "load" ? "Load" : "Unload";
    button.title = want === "load" ? `load ${m.name}` : `unload every version of ${m.name}`;
    button.addEventListener("click", () => {
      if (want === "unload" && !confirmUnload(m.name)) return;
      control(button, "POST", `v2/repository/models/${encodeURIComponent(m.name)}/${want}`, `${want} ${m.name}`);
    });
    td.appendChild(button);
  }
}

const INSTANCE_CELLS = ["name", "version", "instance", "where", "pid num", "rss num", "restarts num", "state"];

function renderInstances(doc) {
  const rows = [];
  for (const m of doc.models) {
    for (const i of m.instances || []) rows.push({ model: m.name, version: m.version, ...i });
  }
  sync($("instances").tBodies[0], rows, (r) => `${r.model}/${r.version}/${r.name}`,
    (tr, r) => {
      cells(tr, INSTANCE_CELLS);
      tr.dataset.model = r.model;
    },
    (tr, r) => {
      set(tr, "name", r.model);
      set(tr, "version", r.version);
      set(tr, "instance", r.name);
      set(tr, "where", r.in_server ? "server process" : "worker process");
      set(tr, "pid", dash(r.pid));
      set(tr, "rss", r.in_server ? "(server's)" : bytes(r.rss));
      const restarts = set(tr, "restarts", dash(r.restarts));
      restarts.classList.toggle("bad", Boolean(r.restarts));
      pill(tr, r.ready ? "ready" : "restarting", r.ready ? "ok" : "busy");
    });
}

// A share of 0..1 as a bar with its text beside it.
function meter(td, share, text) {
  let bar = td.querySelector("svg");
  if (!bar) {
    bar = document.createElementNS(SVG, "svg");
    bar.setAttribute("width", "120");
    bar.setAttribute("height", "10");
    bar.setAttribute("class", "meter");
    for (const cls of ["track", "fill"]) {
      const rect = document.createElementNS(SVG, "rect");
      for (const [k, v] of [["x", 0], ["y", 0], ["height", 10], ["rx", 2]]) rect.setAttribute(k, v);
      rect.setAttribute("width", cls === "track" ? "120" : "0");
      rect.setAttribute("class", cls);
      bar.appendChild(rect);
    }
    td.appendChild(bar);
    td.appendChild(document.createElement("span"));
  }
  const known = share !== null && share !== undefined;
  const fill = bar.lastChild;
  fill.setAttribute("width", String(Math.round(120 * (known ? Math.min(1, share) : 0))));
  fill.classList.toggle("high", known && share > 0.9);
  td.lastChild.textContent = text;
}

const GPU_CELLS = ["index", "gpu-name", "util", "gpu-mem", "power num"];

function renderGpus(doc) {
  const gpus = doc.gpus;
  $("gpus").hidden = !gpus;
  if (!gpus) return;
  sync($("gpu-table").tBodies[0], gpus, (g) => g.uuid || String(g.index),
    (tr) => cells(tr, GPU_CELLS),
    (tr, g) => {
      set(tr, "index", g.index, g.uuid);
      set(tr, "gpu-name", g.name);
      const util = g.utilization;
      meter(tr.querySelector(".util"), util, util === null ? "–" : Math.round(util * 100) + " %");
      const share = g.memory_total ? g.memory_used / g.memory_total : null;
      meter(tr.querySelector(".gpu-mem"), share, `${bytes(g.memory_used)} of ${bytes(g.memory_total)}`);
      set(tr, "power", g.power_usage === null ? "–" :
        `${g.power_usage.toFixed(0)} W` + (g.power_limit ? ` of ${g.power_limit.toFixed(0)} W` : ""));
    });
}

// GPU -> bytes, as "GPU 0: 1.2 GiB".
function devices(held) {
  const parts = Object.entries(held || {}).map(([gpu, size]) => `GPU ${gpu}: ${bytes(size)}`);
  return parts.length ? parts.join(", ") : "–";
}

const RESIDENT_CELLS = ["name", "key", "mem num", "device num", "idle num", "state", "action"];

function renderResidency(doc) {
  const mme = doc.mme;
  $("mme").hidden = !mme;
  if (!mme) return;
  const fill = $("memory-bar").querySelector(".fill");
  const share = mme.limit ? Math.min(1, mme.used / mme.limit) : 0;
  fill.setAttribute("width", String(Math.round(320 * share)));
  fill.classList.toggle("high", share > 0.9);
  $("memory-text").textContent = mme.limit
    ? `${bytes(mme.used)} of ${bytes(mme.limit)} (--model-memory-limit) in use`
    : `${bytes(mme.used)} in use, no --model-memory-limit`;
  $("cache-hits").textContent = mme.cache_hits;
  $("cache-misses").textContent = mme.cache_misses;
  $("evictions").textContent = mme.evictions;
  $("loads").textContent = mme.loads;
  $("mean-load").textContent = mme.mean_load_ms === null ? "–" : mme.mean_load_ms + " ms";
  sync($("residents").tBodies[0], mme.models, (r) => r.key,
    (tr, r) => {
      cells(tr, RESIDENT_CELLS);
      tr.dataset.model = r.model;
      if (actions.residents) {
        const button = document.createElement("button");
        button.type = "button";
        button.className = "unload";
        button.textContent = "Unload";
        button.addEventListener("click", () => {
          if (confirmUnload(r.model)) control(button, "DELETE", `models/${encodeURIComponent(r.key)}`,
            `unload ${r.model}`);
        });
        tr.querySelector(".action").appendChild(button);
      }
    },
    (tr, r) => {
      set(tr, "name", r.model, r.url);
      set(tr, "key", r.key);
      set(tr, "mem", bytes(r.memory));
      set(tr, "device", devices(r.device));
      set(tr, "idle", duration(r.idle_s));
      pill(tr, r.ready ? "ready" : "not ready", r.ready ? "ok" : "busy");
    });
  const list = $("evicted");
  list.replaceChildren(...mme.last_evicted.map((e) => {
    const li = document.createElement("li");
    li.textContent = `${clock(e.at)}  ${e.model}`;
    return li;
  }));
  if (!mme.last_evicted.length) list.replaceChildren(Object.assign(document.createElement("li"),
    { textContent: "none yet", className: "muted" }));
}

function render(doc) {
  actions = doc.actions;
  renderServer(doc);
  renderGpus(doc);
  renderModels(doc);
  renderInstances(doc);
  renderResidency(doc);
  $("status").textContent = "updated " + clock(doc.time);
  $("status").className = "muted";
}

// --- requests --------------------------------------------------------------------------------------------------

// A model serving requests is unloaded only once the user confirms: its clients' next requests fail.
function confirmUnload(name) {
  const busy = load[name];
  if (!busy || (busy.rate <= 0 && busy.inFlight <= 0)) return true;
  return window.confirm(`${name} is under load (${busy.rate.toFixed(1)} requests/s, ${busy.inFlight} in flight). ` +
    "Unload it anyway? Requests in flight finish; new ones fail until it is loaded again.");
}

async function control(button, method, url, what) {
  button.disabled = true;
  const message = $("action-message");
  message.textContent = what + "…";
  try {
    const response = await fetch(url, { method, headers: keys });
    if (response.ok) message.textContent = what + ": done";
    else {
      const text = await response.text();
      let error = text;
      try { error = JSON.parse(text).error || text; } catch (_) { /* not JSON: shown as is */ }
      message.textContent = `${what}: HTTP ${response.status} ${error}`;
    }
  } catch (e) {
    message.textContent = `${what}: ${e}`;
  }
  button.disabled = false;
  poll();
}

function askForKey(error) {
  const match = /expecting header '([^']+)'/.exec(error || "");
  $("key-message").textContent = error;
  $("key-name").textContent = match ? match[1] : "?";
  $("key-prompt").hidden = false;
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const name = $("key-name").textContent;
  keys[name] = $("key-value").value;
  sessionStorage.setItem(STORE, JSON.stringify(keys));
  $("key-value").value = "";
  $("key-prompt").hidden = true;
  poll();
});

async function poll() {
  if (polling) {
    again = true;
    return;
  }
  polling = true;
  clearTimeout(timer);
  try {
    const response = await fetch(FEED, { headers: keys, cache: "no-store" });
    if (response.status === 403) {
      const body = await response.json();
      if ($("key-prompt").hidden) askForKey(body.error);
      $("status").textContent = "restricted";
    } else if (!response.ok) {
      $("status").textContent = `feed: HTTP ${response.status}`;
    } else {
      $("key-prompt").hidden = true;
      render(await response.json());
    }
  } catch (e) {
    $("status").textContent = "server unreachable";
    $("status").className = "bad";
  }
  polling = false;
  timer = setTimeout(poll, again ? 0 : PERIOD_MS);
  again = false;
}

poll();
