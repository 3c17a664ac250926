// Operator console: live calls (polled every second), call history (every 5 s), one call's
// detail with a stacked latency chart and its recording, and hang-up/transfer/say actions for
// a reader signed in with an operator token. The login is an HttpOnly cookie this script never
// sees; actions carry the login's CSRF token in a header. Everything from the server is
// untrusted text: nodes are built with textContent only.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const SVG_NS = "http://www.w3.org/2000/svg";
  const LIVE_EVERY_MS = 1000;
  const HISTORY_EVERY_MS = 5000;
  const STAGE_ORDER = ["end_of_turn", "asr_tail", "dialogue", "tts_first_audio"];
  const STAGE_SKIP = new Set(["barged_in", "total"]);
  const COLOURS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"];

  const meta = (name) => (document.querySelector('meta[name="' + name + '"]') || {}).content || "";
  const actionsEnabled = meta("actions-enabled") === "true";
  const operatorsExist = meta("operators") === "true";
  const csrfToken = meta("csrf-token");
  const statusEl = $("console-status");
  const liveBody = $("live").tBodies[0];
  const historyBody = $("history").tBodies[0];
  const historyNote = $("history-note");
  const detailEl = $("detail");
  const loadEl = $("node-load");

  // Exposed for tests: the last answers of /api/calls (calls, load) and /api/history.
  const state = { live: [], history: [], load: null };
  window.consoleState = state;

  let stickyUntil = 0;      // keep errors and action results visible before "updated ..." replaces them
  let selectedId = null;    // call shown in #detail
  let liveIds = new Set();

  // ---- small helpers ----
  function el(tag, opts = {}, ...children) {
    const n = document.createElement(tag);
    if (opts.cls) n.className = opts.cls;
    if (opts.text != null) n.textContent = String(opts.text);
    if (opts.title != null) n.title = String(opts.title);
    n.append(...children);
    return n;
  }
  function svg(tag, attrs = {}, text) {
    const n = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, String(v));
    if (text != null) n.textContent = String(text);
    return n;
  }
  const isNum = (v) => typeof v === "number" && isFinite(v);
  const fmt = (v, digits = 0) => (isNum(v) ? v.toFixed(digits) : "–");
  const str = (v) => (v == null || v === "" ? "–" : String(v));
  const cut = (s, n) => { s = s == null ? "" : String(s); return s.length > n ? s.slice(0, n - 1) + "…" : s; };
  // one timestamp format, as `sip-bridge calls` prints it: ISO 8601, local time with its zone
  const pad2 = (n) => String(Math.trunc(Math.abs(n))).padStart(2, "0");
  const isoLocal = (d) => { const z = -d.getTimezoneOffset(); return d.getFullYear() + "-" + pad2(d.getMonth() + 1) + "-" + pad2(d.getDate()) + "T" + pad2(d.getHours()) + ":" + pad2(d.getMinutes()) + ":" + pad2(d.getSeconds()) + (z < 0 ? "-" : "+") + pad2(z / 60) + ":" + pad2(z % 60); };
  const clock = (d = new Date()) => isoLocal(d);
  const localTime = (unix) => (isNum(unix) ? isoLocal(new Date(unix * 1000)) : "–");
  const callIdNode = (id) => el("span", { cls: "call-id", text: str(id), title: str(id) });

  function setStatus(text, isError = false, sticky = isError) {
    if (!sticky && Date.now() < stickyUntil) return;
    if (sticky) stickyUntil = Date.now() + 8000;
    statusEl.textContent = text;
    statusEl.classList.toggle("error", isError);
  }

  async function getJson(url) {
    const resp = await fetch(url, { headers: { Accept: "application/json" }, cache: "no-store" });
    if (resp.status === 401) { // signed out (expired, or the token was removed): sign in again
      window.location.assign("/login?next=/console");
    }
    if (!resp.ok) {
      const err = new Error(resp.status + " " + (await resp.text()).trim());
      err.status = resp.status;
      throw err;
    }
    return resp.json();
  }

  // ---- who is reading, and actions ----
  function setupActions() {
    if ($("signed-in").textContent.trim()) $("signed-in-box").classList.remove("hidden");
    if (!actionsEnabled) {
      $((operatorsExist ? "sign-in" : "read-only")).classList.remove("hidden");
      document.querySelectorAll("#live .action-col").forEach((n) => n.classList.add("hidden"));
    }
  }

  async function act(callId, verb, label, body) {
    const opts = { method: "POST", headers: { "X-CSRF-Token": csrfToken }, credentials: "same-origin" };
    if (body !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
    try {
      const resp = await fetch("/api/calls/" + encodeURIComponent(callId) + "/" + verb, opts);
      const text = await resp.text();
      if (resp.ok) {
        setStatus(label + " sent for " + cut(callId, 16), false, true);
      } else {
        let msg = text.trim();
        try { msg = JSON.parse(text).error || msg; } catch (_) { /* not JSON: show as is */ }
        setStatus(label + " refused: " + resp.status + " " + msg, true);
      }
    } catch (e) {
      setStatus(label + " failed: " + (e && e.message || e), true);
    }
    pollLive(false);
  }

  function onHangup(callId) { act(callId, "hangup", "hang-up"); }
  function onSay(callId) {
    const text = prompt("What should the agent say on call " + callId + "?", "");
    if (text == null || !text.trim()) return;
    act(callId, "say", "say", { text: text.trim() });
  }
  function onTransfer(callId) {
    const target = prompt("Transfer call " + callId + " to (SIP URI):", "sip:");
    if (target == null) return; // cancelled
    const t = target.trim();
    if (!t || t === "sip:") { setStatus("transfer: no target given", true); return; }
    act(callId, "transfer", "transfer", { target: t });
  }

  // ---- live calls ----
  const LIVE_COLS = ["id", "leg", "caller", "callee", "route", "agent", "state", "duration", "quality", "latency", "deadair", "turns", "actions"];

  function lastTurnsNode(turns) {
    const box = document.createDocumentFragment();
    for (const t of (Array.isArray(turns) ? turns.slice(-2) : [])) {
      const pair = el("div", { cls: "turn-pair", title: str(t.caller) + " → " + str(t.agent) },
        el("div", {}, el("span", { cls: "who", text: "caller" }), cut(t.caller, 80)),
        el("div", {}, el("span", { cls: "who", text: "agent" }), cut(t.agent, 80)));
      box.append(pair);
    }
    return box;
  }

  function newLiveRow(call) {
    const tr = document.createElement("tr");
    tr.dataset.callId = call.call_id;
    for (const col of LIVE_COLS) {
      const td = el("td");
      td.dataset.col = col;
      if (["duration", "quality", "latency", "deadair"].includes(col)) td.className = "num";
      if (col === "turns") td.className = "turns";
      if (col === "id") td.append(callIdNode(call.call_id));
      if (col === "actions") {
        td.className = "actions action-col";
        if (!actionsEnabled) td.classList.add("hidden");
        const h = el("button", { cls: "hangup small danger", text: "Hang up" });
        h.type = "button";
        h.addEventListener("click", () => onHangup(call.call_id));
        const x = el("button", { cls: "transfer small", text: "Transfer" });
        x.type = "button";
        x.addEventListener("click", () => onTransfer(call.call_id));
        const s = el("button", { cls: "say small", text: "Say…" });
        s.type = "button";
        s.addEventListener("click", () => onSay(call.call_id));
        td.append(h, x, s);
      }
      tr.append(td);
    }
    return tr;
  }

  function setCell(tr, col, text) {
    const td = tr.querySelector('td[data-col="' + col + '"]');
    if (td.textContent !== text) td.textContent = text;
  }

  // Update rows in place (a test or the operator may hold a row), add new, drop gone ones.
  function renderLive(calls) {
    const rows = new Map();
    for (const tr of liveBody.querySelectorAll("tr[data-call-id]")) rows.set(tr.dataset.callId, tr);
    liveBody.querySelectorAll("tr.empty-row").forEach((n) => n.remove());
    const seen = new Set();
    for (const c of calls) {
      const id = String(c.call_id);
      seen.add(id);
      let tr = rows.get(id);
      if (!tr) tr = newLiveRow(c);
      liveBody.append(tr); // keeps server order; moving an existing node does not recreate it
      setCell(tr, "leg", str(c.leg));
      setCell(tr, "caller", str(c.caller));
      setCell(tr, "callee", str(c.callee));
      setCell(tr, "route", str(c.route));
      setCell(tr, "agent", str(c.agent) + (c.profile ? " (" + c.profile + ")" : ""));
      setCell(tr, "state", str(c.state));
      setCell(tr, "duration", fmt(c.duration_s, 0));
      setCell(tr, "quality", fmt(c.jitter_ms, 1) + " / " + fmt(c.loss_pct, 1));
      setCell(tr, "latency", fmt(c.turn_latency_ms, 0));
      const da = c.dead_air || null; // the caller's waits in silence: longest / total
      setCell(tr, "deadair", da ? fmt(da.longest_ms, 0) + " / " + fmt(da.total_ms, 0) : "–");
      const turnsTd = tr.querySelector('td[data-col="turns"]');
      turnsTd.replaceChildren(lastTurnsNode(c.last_turns));
    }
    for (const [id, tr] of rows) if (!seen.has(id)) tr.remove();
    if (calls.length === 0) {
      const tr = el("tr", { cls: "empty-row" });
      const td = el("td", { cls: "empty", text: "no calls in progress" });
      td.colSpan = LIVE_COLS.length;
      tr.append(td);
      liveBody.append(tr);
    }
    return seen;
  }

  // The node's headroom ([load]): what it has left, its figures against their budgets, and
  // whether it refuses new calls (503) now.
  function renderLoad(load) {
    if (!load || typeof load !== "object") { loadEl.textContent = ""; return; }
    const turn = isNum(load.turn_p95_ms) ? fmt(load.turn_p95_ms, 0) + " ms" : "– (" + str(load.turns) + " turns)";
    const parts = [
      "headroom " + fmt(load.headroom_pct, 0) + " %",
      "turn p95 " + turn + " of " + fmt(load.turn_p95_budget_ms, 0) + " ms",
      "CPU " + fmt(load.cpu_busy_pct, 0) + " % of " + fmt(load.cpu_budget_pct, 0) + " %",
    ];
    if (isNum(load.ceiling)) parts.push("at most " + fmt(load.ceiling, 0) + " calls");
    let verdict = "taking new calls";
    if (load.shedding) verdict = "SHEDDING: new calls get 503 (" + str(load.reason) + ")";
    else if (load.over_budget) verdict = "over budget (" + str(load.reason) + "), shedding is off";
    loadEl.textContent = "load: " + parts.join(" · ") + " · " + verdict + " · refused so far " + str(load.shed_calls);
    loadEl.classList.toggle("error", Boolean(load.shedding || load.over_budget));
  }

  async function pollLive(reschedule = true) {
    try {
      const data = await getJson("/api/calls");
      const calls = Array.isArray(data.calls) ? data.calls : [];
      state.live = calls;
      state.load = data.load || null;
      renderLoad(data.load);
      const seen = renderLive(calls);
      const ended = [...liveIds].some((id) => !seen.has(id));
      liveIds = seen;
      if (ended) pollHistory(false); // a call just ended: its record is now in the history
      setStatus("updated " + clock());
    } catch (e) {
      setStatus("live calls: " + (e && e.message || e), true);
    }
    if (reschedule) setTimeout(pollLive, LIVE_EVERY_MS);
  }

  // ---- history ----
  function renderHistory(data) {
    const calls = Array.isArray(data.calls) ? data.calls : [];
    state.history = calls;
    historyNote.textContent = data.note ? String(data.note) : "";
    historyNote.classList.toggle("hidden", !data.note);
    const rows = calls.map((c) => {
      const tr = el("tr");
      tr.dataset.callId = c.call_id;
      tr.tabIndex = 0;
      if (c.call_id === selectedId) tr.classList.add("selected");
      const cells = [
        el("td", {}, callIdNode(c.call_id)),
        el("td", { text: localTime(c.started_at) }),
        el("td", { text: str(c.caller) }),
        el("td", { text: str(c.callee) }),
        el("td", { text: str(c.agent) + (c.profile ? " (" + c.profile + ")" : "") }),
        el("td", { text: str(c.outcome) }),
        el("td", { cls: "num", text: fmt(c.duration_s, 1) }),
        el("td", { cls: "num", text: fmt(c.setup_ms, 0) }),
        el("td", { cls: "num", text: fmt(c.dead_air_max_ms, 0) + " / " + fmt(c.dead_air_total_ms, 0) }),
        el("td", { text: str(c.end_reason) }),
      ];
      tr.append(...cells);
      return tr;
    });
    if (rows.length === 0 && !data.note) {
      const tr = el("tr");
      const td = el("td", { cls: "empty", text: "no calls recorded yet" });
      td.colSpan = 10;
      tr.append(td);
      rows.push(tr);
    }
    historyBody.replaceChildren(...rows);
  }

  async function pollHistory(reschedule = true) {
    try {
      renderHistory(await getJson("/api/history?limit=50"));
    } catch (e) {
      setStatus("history: " + (e && e.message || e), true);
    }
    if (reschedule) setTimeout(pollHistory, HISTORY_EVERY_MS);
  }

  // One listener for the whole table, since rows are rebuilt on every poll.
  function pickHistoryRow(ev) {
    if (ev.type === "keydown" && ev.key !== "Enter") return;
    const tr = ev.target.closest("tr[data-call-id]");
    if (tr) loadDetail(tr.dataset.callId);
  }

  // ---- detail ----
  const FIELD_ORDER = ["call_id", "started_at", "caller", "callee", "agent", "outcome", "duration_s",
    "setup_ms", "end_reason", "trunk", "codec", "remote", "packets_in", "packets_out", "jitter_ms",
    "loss_pct", "jb_delay_ms", "late_frames", "dead_air_max_ms", "dead_air_total_ms"];

  function fieldList(call) {
    const dl = el("dl", { cls: "fields" });
    const keys = FIELD_ORDER.filter((k) => k in call).concat(Object.keys(call).filter((k) => !FIELD_ORDER.includes(k)));
    for (const k of keys) {
      let v = call[k];
      if (k === "started_at") v = localTime(v);
      else if (v !== null && typeof v === "object") v = JSON.stringify(v);
      dl.append(el("dt", { text: k }), el("dd", { text: str(v) }));
    }
    return dl;
  }

  function timelineList(timeline) {
    if (!Array.isArray(timeline) || timeline.length === 0) return el("p", { cls: "note", text: "no timeline recorded" });
    const ol = el("ol", { cls: "timeline" });
    for (const ev of timeline) {
      const li = el("li");
      li.append(el("span", { cls: "when", text: isNum(ev.at) ? clock(new Date(ev.at * 1000)) : "–" }), str(ev.kind));
      if (ev.data && typeof ev.data === "object" && Object.keys(ev.data).length) {
        li.append(" ", el("span", { cls: "data", text: cut(JSON.stringify(ev.data), 200) }));
      }
      ol.append(li);
    }
    return ol;
  }

  function turnList(turns) {
    const ol = el("ol", { cls: "turn-list" });
    for (const t of turns) {
      const li = el("li");
      li.append(el("div", {}, el("span", { cls: "who", text: "caller" }), str(t.caller_text)),
        el("div", {}, el("span", { cls: "who", text: "agent" }), str(t.agent_text)));
      if (t.timings && t.timings.barged_in) li.append(el("div", { cls: "note", text: "barged in" }));
      ol.append(li);
    }
    return ol;
  }

  // Tick step from 1/2/2.5/5 x 10^n so that 0..top has 3 to 5 labels.
  function niceScale(max) {
    if (!(max > 0)) max = 1;
    const raw = max / 4;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const norm = raw / mag;
    const step = (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 2.5 ? 2.5 : norm <= 5 ? 5 : 10) * mag;
    return { step, top: Math.max(2, Math.ceil(max / step)) * step };
  }

  function stageKeys(turns) {
    const keys = [];
    for (const k of STAGE_ORDER) if (turns.some((t) => t.timings && isNum(t.timings[k]))) keys.push(k);
    for (const t of turns) {
      for (const [k, v] of Object.entries(t.timings || {})) {
        if (!STAGE_SKIP.has(k) && isNum(v) && !keys.includes(k)) keys.push(k);
      }
    }
    return keys;
  }

  function latencyChart(turns, callId) {
    const box = el("div");
    box.id = "latency-chart";
    if (!turns.length) { box.append(el("p", { cls: "note", text: "no turns recorded" })); return box; }
    const stages = stageKeys(turns);
    const sums = turns.map((t) => stages.reduce((s, k) => s + (isNum((t.timings || {})[k]) ? Math.max(0, t.timings[k]) : 0), 0));
    const { step, top } = niceScale(Math.max(...sums));

    // Legend first, wrapped over as many lines as the stage names need.
    const W = 640, left = 52, right = 12, legendRow = 18;
    const legend = [];
    let lx = left, ly = 14;
    stages.forEach((k, i) => {
      const w = 18 + k.length * 6.5 + 14;
      if (lx + w > W - right && lx > left) { lx = left; ly += legendRow; }
      legend.push({ k, i, x: lx, y: ly });
      lx += w;
    });
    const plotTop = ly + 16, plotH = 200, plotBottom = plotTop + plotH, H = plotBottom + 26;
    const plotW = W - left - right;
    const slot = plotW / turns.length;
    const barW = Math.max(2, Math.min(48, slot * 0.6));
    const y = (v) => plotBottom - (v / top) * plotH;

    const titleId = "latency-title-" + Math.random().toString(36).slice(2, 8);
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "aria-labelledby": titleId });
    root.append(svg("title", { id: titleId }, `Latency per turn for call ${callId}, stacked by stage, in ms`));

    for (const { k, i, x, y: yy } of legend) {
      root.append(svg("rect", { x, y: yy - 9, width: 12, height: 12, fill: COLOURS[i % COLOURS.length] }),
        svg("text", { x: x + 16, y: yy + 1 }, k));
    }
    // Y axis: grid lines and ms labels.
    for (let v = 0; v <= top + step / 2; v += step) {
      root.append(svg("line", { x1: left, x2: W - right, y1: y(v), y2: y(v), stroke: "#e3e6ea" }),
        svg("text", { x: left - 6, y: y(v) + 4, "text-anchor": "end" }, Math.round(v * 10) / 10));
    }
    root.append(svg("text", { x: 12, y: plotTop + plotH / 2, transform: `rotate(-90 12 ${plotTop + plotH / 2})`, "text-anchor": "middle" }, "ms"));

    // Bars: one per turn, one segment per stage; label every k-th turn when crowded.
    const labelEvery = Math.max(1, Math.ceil(44 / slot));
    turns.forEach((t, ti) => {
      const x = left + slot * ti + (slot - barW) / 2;
      let acc = 0;
      stages.forEach((k, si) => {
        const v = (t.timings || {})[k];
        if (!isNum(v) || v <= 0) return;
        const seg = svg("rect", { x, y: y(acc + v), width: barW, height: Math.max(0.5, y(acc) - y(acc + v)), fill: COLOURS[si % COLOURS.length] });
        seg.append(svg("title", {}, `turn ${ti + 1}: ${k} ${Math.round(v)} ms`));
        root.append(seg);
        acc += v;
      });
      if (ti % labelEvery === 0) {
        root.append(svg("text", { x: x + barW / 2, y: plotBottom + 16, "text-anchor": "middle" }, "turn " + (ti + 1)));
      }
    });
    root.append(svg("line", { x1: left, x2: W - right, y1: plotBottom, y2: plotBottom, stroke: "#9aa3ad" }));
    box.append(root);
    return box;
  }

  async function loadDetail(callId) {
    selectedId = callId;
    for (const tr of historyBody.rows) tr.classList.toggle("selected", tr.dataset.callId === callId);
    detailEl.replaceChildren(el("p", { cls: "note", text: "loading " + callId + " …" }));
    let data;
    try {
      data = await getJson("/api/calls/" + encodeURIComponent(callId));
    } catch (e) {
      if (selectedId !== callId) return;
      detailEl.replaceChildren(el("p", { cls: "note", text: e.status === 404 ? "call " + callId + " not found" : "could not load the call: " + (e.message || e) }));
      return;
    }
    if (selectedId !== callId) return; // another row was clicked meanwhile
    const call = data.call || {};
    const turns = Array.isArray(data.turns) ? data.turns : [];
    const heading = el("h3", {}, "Call ", el("span", { cls: "mono", text: call.call_id || callId }));
    const side = el("div", {}, fieldList(call));
    const recorded = (Array.isArray(data.events) ? data.events : []).some((e) => e.kind === "recording");
    const recording = recorded
      ? el("audio", { cls: "recording" })
      : el("p", { cls: "note", text: "not recorded" });
    if (recorded) {
      recording.controls = true;
      recording.preload = "none";
      recording.src = "/api/calls/" + encodeURIComponent(call.call_id || callId) + "/recording";
    }
    const main = el("div", {}, el("h3", { text: "Recording" }), recording,
      el("h3", { text: "Latency per turn" }), latencyChart(turns, call.call_id || callId),
      el("h3", { text: "Turns" }), turns.length ? turnList(turns) : el("p", { cls: "note", text: "no turns recorded" }),
      el("h3", { text: "Timeline" }), timelineList(data.timeline));
    detailEl.replaceChildren(heading, el("div", { cls: "detail-grid" }, side, main));
  }

  // ---- start ----
  setupActions();
  historyBody.addEventListener("click", pickHistoryRow);
  historyBody.addEventListener("keydown", pickHistoryRow);
  pollLive();
  pollHistory();
})();
