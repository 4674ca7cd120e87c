// The timerdb web console: a page per hash route, every figure read from the node's own
// HTTP/JSON API (docs/http.md), so the console can do exactly what its caller's key may do.
// No libraries: charts are drawn on canvases.
"use strict";

const $ = (sel) => document.querySelector(sel);
const page = $("#page");
let who = null; // WhoAmI of the current credential

class ApiError extends Error {
  constructor(status, error) {
    super(error ? `${error.status}: ${error.message}` : `HTTP ${status}`);
    this.status = status;
  }
}

async function api(method, path, body) {
  const headers = {};
  const token = sessionStorage.getItem("timerdb-token");
  if (token) headers.authorization = "Bearer " + token;
  if (body !== undefined) headers["content-type"] = "application/json";
  const r = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let v = null;
  try { v = await r.json(); } catch (_) { /* not JSON */ }
  if (!r.ok) throw new ApiError(r.status, v && v.error);
  return v;
}

const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) =>
  ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const num = (v) => Number(v || 0);
const time = (ms) => (num(ms) ? new Date(num(ms)).toISOString().replace(".000Z", "Z") : "—");
const stateName = (s) => String(s || "").replace("TIMER_STATE_", "");
const pill = (s) => `<span class="pill ${esc(stateName(s))}">${esc(stateName(s))}</span>`;
const enc = encodeURIComponent;

function params() {
  const q = location.hash.split("?")[1] || "";
  return Object.fromEntries(new URLSearchParams(q));
}

function show(html) { page.innerHTML = html; }
function fail(e) { show(`<p class="error" id="error">${esc(e.message)}</p>`); }

// --- permissions (the server decides; the console only hides what would be refused) -------

function matches(pattern, ns) {
  return pattern === "*" || (pattern.endsWith("*") ? ns.startsWith(pattern.slice(0, -1)) : ns === pattern);
}
function can(permission, ns) {
  if (!who || !who.auth_enabled) return true;
  return (who.roles || []).some((r) => r === "admin" ||
    (r.startsWith(permission + ":") && matches(r.slice(permission.length + 1), ns)));
}

async function whoAmI() {
  try {
    who = await api("GET", "/v1/access/whoami");
    $("#who").textContent = who.auth_enabled
      ? `${who.principal || "?"} (${(who.roles || []).join(", ") || "no roles"})`
      : "auth off: full access";
  } catch (e) {
    who = { auth_enabled: true, roles: [] };
    $("#who").textContent = e.status === 401 ? "auth on: give an API key" : e.message;
  }
}

// --- pages --------------------------------------------------------------------------------

async function cluster() {
  // The slot map is optional: a node of a build before it answers no map, and the page shows
  // the rest.
  const [o, s, m] = await Promise.all([api("GET", "/v1/cluster/overview"), api("GET", "/v1/cluster/status"),
    api("GET", "/v1/cluster/slots").catch(() => ({ groups: [] }))]);
  const rows = o.members.map((m) => `
    <tr class="${m.leader ? "leader" : ""}" data-node="${esc(m.node_id)}">
      <td>${esc(m.node_id)}</td><td>${esc(m.addr)}</td>
      <td>${m.leader ? "leader" : m.voter ? "voter" : "learner"}</td>
      <td class="num">${esc(m.matched_index)}</td><td class="num lag">${esc(m.lag)}</td></tr>`).join("");
  show(`
    <h2>Cluster</h2>
    <dl>
      <dt>leader${m.groups.length > 1 ? " (group 0)" : ""}</dt><dd id="leader">node ${esc(o.leader_id)}</dd>
      <dt>term</dt><dd>${esc(o.term)}</dd>
      <dt>leader's last log / commit / applied index</dt>
      <dd>${esc(o.last_log_index)} / ${esc(o.commit_index)} / ${esc(o.applied_index)}</dd>
      <dt>this node</dt><dd>node ${esc(s.node_id)}, ${esc(s.role)}, applied ${esc(s.applied_index)}</dd>
      <dt>pending timers</dt><dd>${esc(s.pending_timers)}</dd>
    </dl>
    <h2>Members</h2>
    <table id="members"><tr><th>node</th><th>address</th><th>role</th>
      <th class="num">matched index</th><th class="num">lag (entries)</th></tr>${rows}</table>
    ${m.groups.length ? slotMap(m) : ""}`);
  // The page's policy allows no inline style attributes (style-src 'self'): sizes and colours
  // are set through the DOM, which it allows.
  for (const el of document.querySelectorAll("#slotmap .hslots")) el.style.flexGrow = el.dataset.width;
  for (const el of document.querySelectorAll("[data-colour]")) el.style.background = el.dataset.colour;
}

// The slot map (docs/sharding.md): a bar of the hash slots coloured by the node leading the
// group that owns them, and one row per Raft group.
function slotMap(m) {
  const total = num(m.hash_slots) || 1024;
  const hue = (id) => (num(id) * 137) % 360;
  const colour = (g) => num(g.leader_id) ? `hsl(${hue(g.leader_id)} 55% 62%)` : "#d5d8df";
  const spans = m.groups.flatMap((g) => (g.hash_slots || []).map((r) => ({ g, start: num(r.start), end: num(r.end) })))
    .sort((a, b) => a.start - b.start);
  const bar = spans.map(({ g, start, end }) => `<span class="hslots" data-group="${esc(g.group)}"
      data-width="${end - start}" data-colour="${colour(g)}"
      title="hash slots ${start}–${end - 1}: group ${esc(g.group)}, leader node ${esc(g.leader_id)}">${esc(g.group)}</span>`).join("");
  const ranges = (g) => (g.hash_slots || []).map((r) => `${esc(r.start)}–${num(r.end) - 1}`).join(", ") ||
    `<span class="note">none (cluster metadata)</span>`;
  const rows = m.groups.map((g) => `
    <tr data-group="${esc(g.group)}"><td>${esc(g.group)}</td><td>${ranges(g)}</td>
      <td class="leader-of"><span class="dot" data-colour="${colour(g)}"></span>${num(g.leader_id) ? `node ${esc(g.leader_id)}` : "none known"}</td>
      <td class="num">${esc(g.term)}</td>
      <td>${(g.members || []).map((x) => esc(x.node_id) + (x.voter ? "" : " (learner)")).join(", ")}</td>
      <td class="num">${esc(g.applied_index)}</td><td class="num pending">${esc(g.pending_timers)}</td></tr>`).join("");
  return `<h2>Groups and hash slots</h2>
    <div id="slotmap" class="slotmap" aria-label="hash slots by group">${bar}</div>
    <table id="groups"><tr><th>group</th><th>hash slots</th><th>leader</th><th class="num">term</th>
      <th>members</th><th class="num">applied here</th><th class="num">pending</th></tr>${rows}</table>
    <p class="note">Slot map epoch ${esc(m.epoch)}, as node ${esc(m.node_id)} knows it. A namespace's timers live
      in the group owning its hash slot (crc32 of the name, mod ${esc(total)}); the colour is the leading node.</p>`;
}

const COUNTED = ["pending", "fired", "acked", "dead", "cancelled", "expired"];

async function namespaces() {
  const [o, list] = await Promise.all([
    api("GET", "/v1/cluster/overview?by_state=true"),
    api("GET", "/v1/namespaces?limit=10000"),
  ]);
  const policies = Object.fromEntries(list.namespaces.map((n) => [n.name, n.policy]));
  const rows = o.namespaces.map((n) => {
    const p = policies[n.name];
    const policy = p
      ? `${esc(p.max_attempts || 5)} attempts, ack ${num(p.ack_timeout_ms || 30000) / 1000} s` +
        (p.push && p.push.url ? `, push ${esc(p.push.url)}` : "")
      : `<span class="note">defaults</span>`;
    const by = Object.fromEntries((n.by_state || []).map((c) => [stateName(c.state).toLowerCase(), num(c.count)]));
    const cells = COUNTED.map((st) => `<td class="num ${st}">${st === "pending" ? esc(n.pending) :
      `<a href="#/timers?ns=${enc(n.name)}&state=${st}">${by[st] || 0}</a>`}${n.by_state_partial && st !== "pending" ? "+" : ""}</td>`).join("");
    return `<tr data-ns="${esc(n.name)}">
      <td><a href="#/timers?ns=${enc(n.name)}">${esc(n.name)}</a></td>${cells}
      <td class="num group">${esc(n.group || 0)}</td>
      <td class="num">${esc(n.stored)}</td>
      <td>${n.paused ? "paused" : ""}</td><td>${policy}</td>
      <td><a href="#/dead?ns=${enc(n.name)}">dead letters</a></td></tr>`;
  }).join("");
  show(`<h2>Namespaces</h2>
    <table id="namespaces"><tr><th>namespace</th>${COUNTED.map((st) => `<th class="num">${st}</th>`).join("")}
      <th class="num">group</th><th class="num">stored</th><th></th><th>policy</th><th></th></tr>
      ${rows || `<tr><td colspan="13" class="note">no namespace yet</td></tr>`}</table>
    <p class="note">Counts by state are read from group 0's leader: each namespace from that node's replica of
      the group holding its timers (up to 200,000 timers in all; "+" marks a
      namespace counted in part). Finished timers count until the namespace's retention purges them.</p>`);
}

async function namespaceOptions(selected) {
  const o = await api("GET", "/v1/cluster/overview");
  return o.namespaces.map((n) =>
    `<option ${n.name === selected ? "selected" : ""}>${esc(n.name)}</option>`).join("");
}

const STATES = ["", "pending", "fired", "acked", "cancelled", "dead", "expired"];

async function timers() {
  const q = params();
  const ns = q.ns || "";
  const state = q.state || "";
  const tokens = (q.pages || "").split(",").filter(Boolean); // page tokens walked so far
  let list = { timers: [], next_page_token: "" };
  if (ns) {
    const path = `/v1/namespaces/${enc(ns)}/timers?limit=50` + (state ? `&state=${enc(state)}` : "") +
      (tokens.length ? `&page_token=${enc(tokens[tokens.length - 1])}` : "");
    list = await api("GET", path);
  }
  const link = (pages) => `#/timers?ns=${enc(ns)}&state=${enc(state)}&pages=${enc(pages.join(","))}`;
  const rows = list.timers.map((t) => `
    <tr data-id="${esc(t.id)}">
      <td><a href="#/timer?ns=${enc(ns)}&id=${enc(t.id)}">${esc(t.id)}</a></td><td>${pill(t.state)}</td>
      <td>${time(t.fire_at_ms)}</td><td class="num">${esc(t.attempts)}</td>
      <td class="num">${esc(t.revision)}</td></tr>`).join("");
  show(`<h2>Timers</h2>
    <form class="bar" id="filters">
      <select name="ns" aria-label="namespace"><option value="">namespace…</option>${await namespaceOptions(ns)}</select>
      <select name="state" aria-label="state">${STATES.map((s) =>
        `<option value="${s}" ${s === state ? "selected" : ""}>${s || "every state"}</option>`).join("")}</select>
      <button type="submit">Show</button>
    </form>
    ${ns ? `<table id="timers"><tr><th>id</th><th>state</th><th>fire time</th><th class="num">attempts</th>
      <th class="num">revision</th></tr>${rows || `<tr><td colspan="5" class="note">none</td></tr>`}</table>
    <div class="bar">
      <a id="prev" ${tokens.length ? `href="${link(tokens.slice(0, -1))}"` : ""}>${tokens.length ? "← previous" : ""}</a>
      <span class="note">page ${tokens.length + 1}</span>
      <a id="next" ${list.next_page_token ? `href="${link([...tokens, list.next_page_token])}"` : ""}>
        ${list.next_page_token ? "next →" : ""}</a>
    </div>` : `<p class="note">Choose a namespace.</p>`}`);
  $("#filters").onsubmit = (ev) => {
    ev.preventDefault();
    const f = new FormData(ev.target);
    location.hash = `#/timers?ns=${enc(f.get("ns"))}&state=${enc(f.get("state"))}`;
  };
}

async function timer() {
  const { ns, id } = params();
  const t = (await api("GET", `/v1/namespaces/${enc(ns)}/timers/${enc(id)}`)).timer;
  let payload = t.payload_json !== undefined ? JSON.stringify(t.payload_json, null, 2) : "";
  if (!payload && t.payload) {
    try { payload = atob(t.payload); } catch (_) { payload = t.payload; }
  }
  const attempts = (t.attempt_log || []).map((a) => `<tr>
    <td class="num">${esc(a.attempt)}</td><td>${time(a.at_ms)}</td><td>${esc(a.channel)}</td>
    <td>${esc(a.outcome)}</td><td class="num">${esc(a.latency_ms)} ms</td>
    <td>${a.http_status ? "HTTP " + esc(a.http_status) : ""}${a.grpc_code ? " gRPC " + esc(a.grpc_code) : ""}</td>
    <td>${esc(a.detail)}</td></tr>`).join("");
  const dead = stateName(t.state) === "DEAD";
  show(`<h2>Timer ${esc(ns)}/${esc(id)}</h2>
    <dl id="detail">
      <dt>state</dt><dd>${pill(t.state)} ${esc(String(t.phase || "").replace("DELIVERY_PHASE_", "").replace("UNSPECIFIED", ""))}</dd>
      <dt>fire time</dt><dd>${time(t.fire_at_ms)}</dd>
      <dt>fired at</dt><dd>${time(t.fired_at_ms)} (log index ${esc(t.fire_index)})</dd>
      <dt>created</dt><dd>${time(t.created_at_ms)}</dd>
      <dt>attempts</dt><dd>${esc(t.attempts)} (nacks ${esc(t.nacks)}, timeouts ${esc(t.timeouts)}, redrives ${esc(t.redrives)})</dd>
      <dt>revision</dt><dd>${esc(t.revision)}</dd>
      <dt>content type</dt><dd>${esc(t.content_type) || "—"}</dd>
    </dl>
    <h2>Payload</h2><pre id="payload">${esc(payload) || "(empty)"}</pre>
    <h2>Attempts</h2>
    <table id="attempts"><tr><th class="num">#</th><th>at</th><th>channel</th><th>outcome</th>
      <th class="num">latency</th><th>answer</th><th>detail</th></tr>
      ${attempts || `<tr><td colspan="7" class="note">not delivered yet</td></tr>`}</table>
    ${dead ? redriveButton(ns, id) : ""}`);
  bindRedrive();
}

function redriveButton(ns, id) {
  const allowed = can("manage", ns);
  return `<button class="primary redrive" data-ns="${esc(ns)}" data-id="${esc(id)}" ${allowed ? "" :
    `disabled title="your key may not manage ${esc(ns)}"`}>Redrive</button>`;
}

function bindRedrive() {
  document.querySelectorAll("button.redrive").forEach((b) => {
    b.onclick = async () => {
      const { ns, id } = b.dataset;
      b.disabled = true;
      try {
        const body = undefined;
        const path = id ? `/v1/namespaces/${enc(ns)}/timers/${enc(id)}:redrive`
          : `/v1/namespaces/${enc(ns)}/timers:redrive`;
        const r = await api("POST", path, body);
        $("#status").innerHTML = `<span class="ok" id="redriven">redriven: ${esc(r.redriven)}</span>`;
        route();
      } catch (e) {
        $("#status").innerHTML = `<span class="error">${esc(e.message)}</span>`;
        b.disabled = false;
      }
    };
  });
}

async function dead() {
  const ns = params().ns || "";
  let list = { timers: [] };
  if (ns) list = await api("GET", `/v1/namespaces/${enc(ns)}/timers?state=dead&limit=200`);
  const rows = list.timers.map((t) => {
    const last = (t.attempt_log || []).slice(-1)[0] || {};
    return `<tr data-id="${esc(t.id)}">
      <td><a href="#/timer?ns=${enc(ns)}&id=${enc(t.id)}">${esc(t.id)}</a></td>
      <td>${time(t.fire_at_ms)}</td><td class="num">${esc(t.attempts)}</td>
      <td>${esc(last.outcome)} ${esc(last.detail)}</td><td>${redriveButton(ns, t.id)}</td></tr>`;
  }).join("");
  show(`<h2>Dead letters</h2>
    <form class="bar" id="pick"><select name="ns" aria-label="namespace">
      <option value="">namespace…</option>${await namespaceOptions(ns)}</select><button>Show</button>
      ${ns && list.timers.length ? redriveButton(ns, "").replace(">Redrive<", ">Redrive all<") : ""}</form>
    ${ns ? `<table id="dead"><tr><th>id</th><th>fire time</th><th class="num">attempts</th>
      <th>last outcome</th><th></th></tr>${rows || `<tr><td colspan="5" class="note">no dead letters</td></tr>`}</table>`
      : `<p class="note">Choose a namespace.</p>`}`);
  $("#pick").onsubmit = (ev) => {
    ev.preventDefault();
    location.hash = `#/dead?ns=${enc(new FormData(ev.target).get("ns"))}`;
  };
  bindRedrive();
}

// --- live charts: fire rate and lateness from this node's Status, once a second ------------

const BOUNDS = [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000];
let samples = [];
let chartTimer = null;

function quantile(le, total, q) {
  if (total <= 0) return 0;
  const want = q * total;
  for (let i = 0; i < BOUNDS.length; i++) if (le[i] >= want) return BOUNDS[i];
  return BOUNDS[BOUNDS.length - 1];
}

async function sample() {
  const s = await api("GET", "/v1/cluster/status");
  const now = performance.now();
  const cur = { t: now, fired: num(s.timers_fired), sum: num(s.fire_lateness_sum_ms),
    le: (s.fire_lateness_le || []).map(num) };
  const prev = samples.length ? samples[samples.length - 1].raw : null;
  let point = { rate: 0, p50: 0, p99: 0, avg: 0 };
  if (prev) {
    const dt = (cur.t - prev.t) / 1000;
    const n = cur.fired - prev.fired;
    const le = cur.le.map((v, i) => v - (prev.le[i] || 0));
    point = { rate: dt > 0 ? n / dt : 0, p50: quantile(le, n, 0.5), p99: quantile(le, n, 0.99),
      avg: n > 0 ? (cur.sum - prev.sum) / n : 0 };
  }
  samples.push({ raw: cur, ...point });
  if (samples.length > 121) samples.shift();
}

function draw(canvas, series, unit) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  canvas.width = w * dpr; canvas.height = h * dpr;
  const g = canvas.getContext("2d");
  g.scale(dpr, dpr);
  g.clearRect(0, 0, w, h);
  const pts = samples.slice(1);
  const max = Math.max(1, ...pts.flatMap((p) => series.map((s) => p[s.key])));
  const span = Math.max(pts.length - 1, 30); // fills in over the first half minute, then scrolls
  const x = (i) => 40 + (i / span) * (w - 50);
  const y = (v) => h - 20 - (v / max) * (h - 30);
  g.strokeStyle = "#dde1ea"; g.fillStyle = "#6b7385"; g.font = "11px system-ui";
  for (const f of [0, 0.5, 1]) {
    g.beginPath(); g.moveTo(40, y(max * f)); g.lineTo(w - 10, y(max * f)); g.stroke();
    g.fillText(`${+(max * f).toFixed(1)}${unit}`, 2, y(max * f) + 4);
  }
  series.forEach((s, k) => {
    g.strokeStyle = s.color; g.lineWidth = 2; g.beginPath();
    pts.forEach((p, i) => (i ? g.lineTo(x(i), y(p[s.key])) : g.moveTo(x(i), y(p[s.key]))));
    g.stroke();
    g.fillStyle = s.color; g.fillText(s.label, 50 + k * 90, 12);
  });
}

async function charts() {
  show(`<h2>Live: this node's fires (the last two minutes)</h2>
    <div class="charts">
      <div class="chart"><strong>fire rate</strong><canvas id="rate"></canvas></div>
      <div class="chart"><strong>lateness after the due time</strong><canvas id="lateness"></canvas></div>
    </div><p class="note" id="latest"></p>`);
  const tick = async () => {
    try { await sample(); } catch (e) { $("#latest").textContent = e.message; return; }
    const last = samples[samples.length - 1];
    draw($("#rate"), [{ key: "rate", label: "timers/s", color: "#2459d6" }], "/s");
    draw($("#lateness"), [{ key: "p50", label: "p50", color: "#1f7a3a" },
      { key: "p99", label: "p99 (≤ bound)", color: "#b3261e" }, { key: "avg", label: "mean", color: "#8a5a00" }], " ms");
    $("#latest").textContent = `now: ${last.rate.toFixed(1)} timers/s, lateness p50 ≤ ${last.p50} ms, ` +
      `p99 ≤ ${last.p99} ms, mean ${last.avg.toFixed(1)} ms; ${last.raw.fired} fired since the node started`;
  };
  await tick();
  chartTimer = setInterval(tick, 1000);
}

// --- routing --------------------------------------------------------------------------------

const PAGES = { cluster, namespaces, timers, timer, dead, charts };

async function route() {
  if (chartTimer) { clearInterval(chartTimer); chartTimer = null; }
  const name = (location.hash.replace(/^#\//, "").split("?")[0]) || "cluster";
  document.querySelectorAll("nav a").forEach((a) =>
    a.classList.toggle("active", a.dataset.page === name || (name === "timer" && a.dataset.page === "timers")));
  document.body.dataset.page = name;
  try {
    await (PAGES[name] || cluster)();
    document.body.dataset.loaded = name;
  } catch (e) {
    fail(e);
    document.body.dataset.loaded = name;
  }
}

$("#auth").onsubmit = async (ev) => {
  ev.preventDefault();
  const t = $("#token").value.trim();
  if (t) sessionStorage.setItem("timerdb-token", t); else sessionStorage.removeItem("timerdb-token");
  $("#token").value = "";
  await whoAmI();
  route();
};
window.addEventListener("hashchange", route);
whoAmI().then(route);
