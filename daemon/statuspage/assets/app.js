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

// count writes n things in words that agree with n: "1 extra session", "2 extra sessions". Every
// count the page writes goes through it ("1 sessions" reads as a bug and makes the rest doubtful).
function count(n, one, many) {
  return `${n} ${n === 1 ? one : (many || one + "s")}`;
}

const clock = (t) => new Date(t).toISOString().slice(11, 16);
const fixed = (n) => (v) => Number(v).toFixed(n);

// COUNT_ONLY is where a budget stops being one: the gateway's documented "count only" setting is
// 1e12 tokens, out of reach of any deployment, so admission never engages. Printed as a number it
// reads as a real budget of a million M; the page says what it means instead.
const COUNT_ONLY = 1e11;
const COUNT_ONLY_TEXT = "∞ (count only)";

// tokens formats a token count for people: K, M, G, T with at most three significant digits
// (682500 → 683K, 1050000 → 1.05M), and a count-only budget as ∞.
function tokens(v) {
  if (v === null || v === undefined || !isFinite(v)) return "—";
  if (Math.abs(v) >= COUNT_ONLY) return COUNT_ONLY_TEXT;
  const units = ["", "K", "M", "G", "T"];
  let a = Math.abs(v), i = 0;
  while (a >= 999.5 && i < units.length - 1) { a /= 1000; i++; } // 999.5 rounds to the next unit
  const digits = i === 0 ? String(Math.round(a)) : String(Number(a.toPrecision(3)));
  return (v < 0 ? "-" : "") + digits + units[i];
}

const utc = (t) => new Date(t).toISOString().replace("T", " ").slice(0, 19) + " UTC";
// Go's zero time: a reading that never happened.
const never = (t) => !t || Date.parse(t) <= Date.parse("0001-01-02T00:00:00Z");

// empty says in the chart why it has nothing to draw, so a blank chart is not mistaken for zero.
function empty(svg, why) {
  const vb = svg.viewBox.baseVal;
  el("text", { x: vb.width / 2, y: vb.height / 2, "text-anchor": "middle", class: "empty" }, svg).textContent = why;
}

function timeChart(id, hist, series, fmtY, yMinZero, none) {
  const svg = document.getElementById(id);
  clear(svg);
  if (!hist.length) { empty(svg, "no history yet"); return; }
  const xs = hist.map((p) => Date.parse(p.t));
  let lo = Infinity, hi = -Infinity;
  for (const s of series) for (const p of hist) {
    const v = s.get(p);
    if (v !== null && v !== undefined) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  }
  if (!isFinite(lo)) { empty(svg, (none && none(hist)) || "no reading yet"); return; }
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
  parts.push(spikeTolerance(c.spike_tolerance));
  note.textContent = parts.join(" · ");
}

// spikeTolerance says how large a ten-minute arrival spike the deployment takes now and still comes
// back by itself; unknown is said as such, never as zero.
function spikeTolerance(t) {
  if (!t) return "spike tolerance unknown: the curve is not known up to the edge";
  if (t.ratio <= 1) return "absorbs no spike: more arrivals now would leave it trapped";
  const pct = Math.round((t.ratio - 1) * 100);
  return (t.capped ? `absorbs at least +${pct}%` : `absorbs a spike of +${pct}%`) +
    ` for 10 min (${count(Math.round(t.sessions), "extra session")}) and comes back`;
}

// blindness is what the daemon cannot see, or null when it sees everything it needs. The daemon
// says so with "blind" and lists "unseen"; the detector lists its stale signals in
// assessment.blind; an unreadable gateway admin API shows as the gateway's error. The page takes
// the union, so it reads right from a daemon that reports only some of these.
const GATEWAY_UNSEEN = "gateway admin API: ";
function blindness(s) {
  const a = s.assessment || {};
  const unseen = [];
  for (const u of (Array.isArray(s.unseen) ? s.unseen : []).concat(a.blind || [])) if (!unseen.includes(u)) unseen.push(u);
  if (!unseen.length && s.blind !== true) return null;
  if (s.gateway && s.gateway.error && !unseen.some((u) => u.startsWith(GATEWAY_UNSEEN))) unseen.push(GATEWAY_UNSEEN + s.gateway.error);
  return unseen;
}

// grouped folds the detector's "<signal> <condition>" entries by condition ("hit_rate stale,
// working_set stale" → "stale: hit_rate, working_set"): a deployment gone silent makes every
// signal stale, and the list should read as one fact, not ten.
function grouped(unseen) {
  const by = new Map(), other = [];
  for (const u of unseen) {
    const m = /^([a-z0-9_]+) ([a-z]+)$/.exec(u);
    if (!m) { other.push(u); continue; }
    if (!by.has(m[2])) by.set(m[2], []);
    by.get(m[2]).push(m[1]);
  }
  return [...by].map(([cond, sigs]) => `${cond}: ${sigs.join(", ")}`).concat(other).join("; ");
}

function drawStatus(s) {
  const a = s.assessment || {};
  document.getElementById("deployment").textContent = s.deployment ? "— " + s.deployment : "";
  document.getElementById("dry-run").hidden = !s.dry_run;
  // Two daemons on one store (HA): the standby watches and takes no action; say so as loudly as a
  // dry run. The acting daemon names the term it acts under. A standby's term is the last one it
  // held, and the status leaves it out when it has held none: "term 3" next to "standby" would read
  // as the term it acts under, and a missing one must not be printed as a value.
  const standby = s.role === "standby";
  const heldTerm = Number.isInteger(s.term) && s.term > 0 ? s.term : 0;
  const sb = document.getElementById("standby");
  sb.hidden = !standby;
  sb.innerHTML = "";
  if (standby) {
    const strong = document.createElement("strong");
    strong.textContent = "standby";
    sb.append(strong, `: ${s.instance || "this daemon"} watches and takes no action; the daemon holding the lease acts` +
      (heldTerm ? ` (this one last held term ${heldTerm})` : "") + ".");
  }
  const role = document.getElementById("role");
  role.hidden = !s.role;
  const roleParts = !s.role ? [] : standby ? ["standby (not acting)"].concat(heldTerm ? [`last held term ${heldTerm}`] : []) :
    [s.role].concat(heldTerm ? [`term ${heldTerm}`] : []);
  if (s.role && s.instance) roleParts.push(s.instance);
  role.textContent = roleParts.join(" · ");
  const unseen = blindness(s);
  // A blind daemon holds the last state it saw; showing that state's colour would claim a reading
  // basin does not have (a green "healthy" with every target down), so the badge says "blind".
  const shown = unseen ? "blind" : (a.state || "unknown");
  const st = document.getElementById("state");
  st.textContent = shown;
  st.dataset.state = unseen ? "blind" : (a.state || "");
  document.title = "basin — " + shown + (s.dry_run ? " (dry run)" : "") + (standby ? " (standby)" : "");
  document.getElementById("since").textContent = !unseen && a.since ? "since " + utc(a.since) : "";
  const bl = document.getElementById("blind");
  bl.hidden = !unseen;
  if (unseen) {
    const held = a.state ? `holding ${a.state}` + (a.since ? " since " + utc(a.since) : "") : "no state yet";
    const seen = never(a.observed_at) ? "never saw every signal" : "last saw every signal at " + utc(a.observed_at);
    bl.textContent = `cannot see: ${grouped(unseen) || "unknown"} — ${held}; ${seen}`;
  }
  const paused = document.getElementById("paused");
  paused.hidden = !s.paused;
  if (s.paused) paused.textContent = `remediation paused until ${s.paused.until}: ${s.paused.reason}`;
  const ul = document.getElementById("reasons");
  ul.replaceChildren(...(a.reasons || []).map((r) => {
    const li = document.createElement("li"); li.textContent = r; return li;
  }));
  drawBudgetNote(s);
}

// drawBudgetNote says what the gateway's budget is now, in words where a number would mislead.
function drawBudgetNote(s) {
  const note = document.getElementById("budget-note");
  const g = s.gateway;
  const parts = [];
  if (!g) {
    parts.push("the gateway's budget is not read (no gateway admin API configured)");
  } else if (g.error) {
    parts.push("the gateway's budget is unknown: " + g.error);
  } else {
    parts.push(g.count_only ? "no budget yet: the gateway only counts (admission.count_only) and admits every session" :
      g.budget_tokens >= COUNT_ONLY ?
      `B ${COUNT_ONLY_TEXT}: out of reach, the gateway counts sessions and admits them all` :
      `B ${tokens(g.budget_tokens)}`);
    if (g.reference_budget_tokens && g.reference_budget_tokens < COUNT_ONLY) parts.push(`B_ref ${tokens(g.reference_budget_tokens)}`);
    parts.push(`reserved ${tokens(g.reserved_tokens || 0)}`, `${g.live_sessions || 0} live, ${g.queued_sessions || 0} queued`);
    if (g.held_sessions) {
      // Held sessions are live: their next calls wait at the gateway while the others run.
      let held = `${g.held_sessions} held (${tokens(g.held_tokens || 0)} of context)`;
      if (g.held_calls) held += `, ${count(g.held_calls, "call")} waiting, the longest ${Math.round(g.oldest_held_call_seconds || 0)} s`;
      parts.push(held);
    }
  }
  const target = s.policy && s.policy.target_tokens;
  if (s.dry_run && target) parts.push(`dry run: basin would hold B at ${tokens(target)}, not applied`);
  note.textContent = parts.join(" · ");
}

// ownReasons picks an action's own reasons out of its record. The audit log gives every action of
// one plan the whole plan's reasons: the policy's (budget and mode first, shedding after), then
// the lender's verdict ("lending on…"/"lending off…") and one line of measurements per decode
// instance, then, after a restart, a reconciliation note. Showing the plan's last reason put the
// lender's measurements on the budget's row.
const LENDING_VERDICT = /^lending (on|off)\b/;
const SHEDDING = /\bshed(ding)?\b/;
const RECONCILED = /after a restart\b/;
function ownReasons(e) {
  const all = e.reasons || [];
  const notes = all.filter((r) => RECONCILED.test(r));
  const rs = all.filter((r) => !RECONCILED.test(r));
  const cut = rs.findIndex((r) => LENDING_VERDICT.test(r));
  const policy = cut < 0 ? rs : rs.slice(0, cut);
  const lending = cut < 0 ? [] : rs.slice(cut);
  let own;
  switch (e.kind) {
    case "budget": own = policy.filter((r) => !SHEDDING.test(r)); break;
    case "shed": own = policy.filter((r) => SHEDDING.test(r)); break;
    case "lending": own = lending; break;
    default: own = rs; // pause, resume: one note of their own
  }
  return { own, notes };
}

// reasonText is the row's reason: the action's own reasons (for lending the verdict; the
// per-instance measurements go to the tooltip), any reconciliation note, and the error of a
// failed action first.
function reasonText(e) {
  const { own, notes } = ownReasons(e);
  const shown = e.kind === "lending" ? own.slice(0, 1) : own;
  const text = shown.concat(notes).join("; ");
  return { text: e.error ? e.error + (text ? " — " + text : "") : text, detail: own.concat(notes).join("\n") };
}

const OUTCOMES = { dry_run: "dry run: not done" };

function changeText(e) {
  if (e.budget) {
    const b = e.budget;
    if (b.from_count_only) return `B count only → ${tokens(b.to_tokens)}`;
    if (b.from_tokens === b.to_tokens) return `B ${tokens(b.to_tokens)}, B_ref ${tokens(b.reference_tokens)}`;
    return `B ${tokens(b.from_tokens)} → ${tokens(b.to_tokens)}`;
  }
  if (e.shed) return "shed " + e.shed.session_ids.join(", ");
  if (e.hold) return e.hold.summary || "";
  if (e.lending) {
    const grants = Object.entries(e.lending.grants_tokens || {}).map(([k, v]) => `${k} ${tokens(v)}`);
    return "lending " + (e.lending.enabled ? "on" : "off") + (grants.length ? ": " + grants.join(", ") : "");
  }
  return "";
}

function drawActions(events) {
  const tb = document.querySelector("#actions tbody");
  const rows = events.filter((e) => e.phase !== "intent").slice(-20).reverse().map((e) => {
    const tr = document.createElement("tr");
    tr.dataset.phase = e.phase || "";
    const why = reasonText(e);
    for (const v of [new Date(e.at).toISOString().slice(11, 19), e.kind, OUTCOMES[e.phase] || e.phase, changeText(e), why.text]) {
      const td = document.createElement("td"); td.textContent = v; tr.appendChild(td);
    }
    if (why.detail !== why.text) tr.lastChild.title = why.detail;
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
      // A count-only budget is no budget: drawn, it would flatten everything else to zero.
      { get: (p) => p.budget && p.budget < COUNT_ONLY ? p.budget : null, cls: "line-main", id: "budget-line" },
      { get: (p) => p.reserved || null, cls: "line-aux" }], tokens, true,
      (h) => (h.filter((p) => p.budget).pop() || {}).budget >= COUNT_ONLY ? "no budget to draw: " + COUNT_ONLY_TEXT : "");
    drawCurve(c);
    drawActions(ev.events || []);
    document.body.dataset.loaded = "true";
  } catch (e) {
    // What was drawn is now old: the badge must not keep the last state's colour.
    const st = document.getElementById("state");
    st.textContent = "no data: " + e.message;
    st.dataset.state = "no-data";
    document.title = "basin — no data";
  }
}

refresh();
setInterval(refresh, 5000);
