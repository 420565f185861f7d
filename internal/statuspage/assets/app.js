// basin status page: reads the daemon's API and draws it with plain SVG (no libraries, no CDN).
"use strict";

const NS = "http://www.w3.org/2000/svg";
const PAD = { l: 44, r: 10, t: 10, b: 24 };

function el(tag, attrs, parent) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}

function clear(svg) { while (svg.firstChild) svg.removeChild(svg.firstChild); }

// frame draws axes for x in [x0, x1], y in [y0, y1] and returns the scale functions.
function frame(svg, x0, x1, y0, y1, fmtX, fmtY) {
  const vb = svg.viewBox.baseVal, w = vb.width, h = vb.height;
  const sx = (x) => PAD.l + (x - x0) / ((x1 - x0) || 1) * (w - PAD.l - PAD.r);
  const sy = (y) => h - PAD.b - (y - y0) / ((y1 - y0) || 1) * (h - PAD.t - PAD.b);
  el("line", { x1: PAD.l, y1: h - PAD.b, x2: w - PAD.r, y2: h - PAD.b, class: "axis" }, svg);
  el("line", { x1: PAD.l, y1: PAD.t, x2: PAD.l, y2: h - PAD.b, class: "axis" }, svg);
  for (const f of [0, 0.5, 1]) {
    const y = y0 + f * (y1 - y0);
    el("text", { x: 2, y: sy(y) + 3 }, svg).textContent = fmtY(y);
    const x = x0 + f * (x1 - x0);
    const anchor = f === 0 ? "start" : f === 1 ? "end" : "middle";
    el("text", { x: sx(x), y: h - 6, "text-anchor": anchor }, svg).textContent = fmtX(x);
  }
  return { sx, sy };
}

function path(svg, pts, sx, sy, cls, id) {
  const d = pts.filter((p) => p[1] !== null && p[1] !== undefined)
    .map((p, i) => (i ? "L" : "M") + sx(p[0]).toFixed(1) + " " + sy(p[1]).toFixed(1)).join(" ");
  const attrs = { d: d || "M0 0", class: cls };
  if (id) attrs.id = id;
  return el("path", attrs, svg);
}

const clock = (t) => new Date(t).toISOString().slice(11, 16);
const fixed = (n) => (v) => Number(v).toFixed(n);
const tokens = (v) => v >= 1e6 ? (v / 1e6).toFixed(1) + "M" : v >= 1e3 ? (v / 1e3).toFixed(0) + "K" : String(Math.round(v));

function timeChart(id, hist, series, fmtY, yMinZero) {
  const svg = document.getElementById(id);
  clear(svg);
  if (!hist.length) return;
  const xs = hist.map((p) => Date.parse(p.t));
  let lo = Infinity, hi = -Infinity;
  for (const s of series) for (const p of hist) {
    const v = s.get(p);
    if (v !== null && v !== undefined) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  }
  if (!isFinite(lo)) return;
  if (yMinZero) lo = 0;
  if (hi === lo) hi = lo + 1;
  const { sx, sy } = frame(svg, xs[0], xs[xs.length - 1], lo, hi * 1.05, clock, fmtY);
  for (const s of series) path(svg, hist.map((p, i) => [xs[i], s.get(p)]), sx, sy, s.cls, s.id);
}

function drawCurve(c) {
  const svg = document.getElementById("curve");
  clear(svg);
  const note = document.getElementById("curve-note");
  const pts = (c.points || []).map((p) => [p.n, p.sessions_per_s * 60]);
  if (!pts.length) { note.textContent = "The completion curve appears once calls per session are known (calibrate, or wait for 30 sessions to finish)."; return; }
  const lambda = (c.lambda_per_s || 0) * 60;
  const maxN = Math.max(...pts.map((p) => p[0]), c.live_sessions || 0) * 1.05;
  const maxY = Math.max(...pts.map((p) => p[1]), lambda) * 1.15;
  const { sx, sy } = frame(svg, 0, maxN, 0, maxY, fixed(0), fixed(1));
  path(svg, [[0, 0], ...pts], sx, sy, "line-main", "curve-line");
  el("line", { id: "arrival-line", x1: sx(0), x2: sx(maxN), y1: sy(lambda), y2: sy(lambda), class: "line-ref" }, svg);
  for (const [k, cls] of [["stable_n", "equilibrium stable"], ["unstable_n", "equilibrium unstable"]]) {
    if (c[k] !== undefined && c[k] !== null) el("circle", { cx: sx(c[k]), cy: sy(lambda), r: 5, class: cls }, svg);
  }
  if (c.live_sessions !== undefined) {
    el("circle", { id: "operating-point", cx: sx(c.live_sessions), cy: sy(c.completion_per_s * 60 || 0), r: 5, class: "op" }, svg);
  }
  const parts = [`λ ${lambda.toFixed(2)}/min`, `N ${Number(c.live_sessions || 0).toFixed(0)} live`];
  if (c.stable_n !== undefined) parts.push(`stable N ${c.stable_n.toFixed(1)}`);
  if (c.unstable_n !== undefined) parts.push(`unstable N ${c.unstable_n.toFixed(1)}: past it the population grows by itself`);
  if (c.no_equilibrium) parts.push("no equilibrium: arrivals exceed what the deployment can complete");
  note.textContent = parts.join(" · ");
}

function drawStatus(s) {
  const a = s.assessment || {};
  document.getElementById("deployment").textContent = s.deployment ? "— " + s.deployment : "";
  const st = document.getElementById("state");
  st.textContent = a.state || "unknown";
  st.dataset.state = a.state || "";
  document.getElementById("since").textContent = a.since ? "since " + new Date(a.since).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "";
  const paused = document.getElementById("paused");
  paused.hidden = !s.paused;
  if (s.paused) paused.textContent = `remediation paused until ${s.paused.until}: ${s.paused.reason}`;
  const ul = document.getElementById("reasons");
  ul.replaceChildren(...(a.reasons || []).concat(a.blind ? ["blind: " + a.blind.join(", ")] : []).map((r) => {
    const li = document.createElement("li"); li.textContent = r; return li;
  }));
}

function drawActions(events) {
  const tb = document.querySelector("#actions tbody");
  const rows = events.filter((e) => e.phase !== "intent").slice(-20).reverse().map((e) => {
    const tr = document.createElement("tr");
    let change = "";
    if (e.budget) change = `B ${tokens(e.budget.from_tokens)} → ${tokens(e.budget.to_tokens)}`;
    if (e.shed) change = "shed " + e.shed.session_ids.join(", ");
    if (e.lending) change = "lending " + (e.lending.enabled ? "on" : "off");
    for (const v of [new Date(e.at).toISOString().slice(11, 19), e.kind, e.phase, change, (e.reasons || []).slice(-1)[0] || e.error || ""]) {
      const td = document.createElement("td"); td.textContent = v; tr.appendChild(td);
    }
    return tr;
  });
  tb.replaceChildren(...rows);
}

async function get(path) {
  const r = await fetch(path, { cache: "no-store" });
  if (!r.ok) throw new Error(path + ": " + r.status);
  return r.json();
}

async function refresh() {
  try {
    const [s, h, c, ev] = await Promise.all([get("/api/v1/status"), get("/api/v1/history"), get("/api/v1/curve"), get("/api/v1/events?limit=50")]);
    drawStatus(s);
    const hist = h.points || [];
    timeChart("wc-chart", hist, [
      { get: (p) => p.wc, cls: "line-main", id: "wc-line" },
      { get: (p) => p.knee, cls: "line-ref" },
      { get: () => 1, cls: "line-aux" }], fixed(2), true);
    timeChart("hit-chart", hist, [
      { get: (p) => p.hit, cls: "line-main", id: "hit-line" },
      { get: (p) => p.plateau, cls: "line-ref" }], fixed(2), true);
    timeChart("budget-chart", hist, [
      { get: (p) => p.budget || null, cls: "line-main", id: "budget-line" },
      { get: (p) => p.reserved || null, cls: "line-aux" }], tokens, true);
    drawCurve(c);
    drawActions(ev.events || []);
    document.body.dataset.loaded = "true";
  } catch (e) {
    document.getElementById("state").textContent = "no data: " + e.message;
  }
}

refresh();
setInterval(refresh, 5000);
