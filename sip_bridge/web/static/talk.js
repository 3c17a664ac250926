// Talk page: one WebRTC session with an agent profile, from the browser's microphone.
// Contract: POST /talk/offer (SDP in, SDP out, no trickle ICE), then a server-sent event
// stream at <session>/events, and DELETE <session> to hang up.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const profileSel = $("profile");
  const startBtn = $("start");
  const stopBtn = $("stop");
  const statusEl = $("status");
  const transcript = $("transcript");
  const audioEl = $("agent-audio");
  const headsetBox = $("headset");
  const HEADSET_KEY = "sip-bridge.headset";
  headsetBox.checked = localStorage.getItem(HEADSET_KEY) === "1";
  headsetBox.addEventListener("change", () =>
    localStorage.setItem(HEADSET_KEY, headsetBox.checked ? "1" : "0"));

  // One token per session: each accepted offer hands back the token for the next one.
  let pageToken = (document.querySelector('meta[name="page-token"]') || {}).content || "";
  const ICE_GATHER_LIMIT_MS = 3000;
  const STAGE_ORDER = ["end_of_turn", "asr_tail", "dialogue", "tts_first_audio"];

  // Exposed for tests; the same object is updated in place as things happen.
  const talk = { pc: null, remoteStream: null, sessionUrl: null, turns: [] };
  window.talk = talk;

  let mic = null;       // MediaStream from getUserMedia
  let events = null;    // EventSource for the session
  let attempt = 0;      // bumps on every start/teardown so stale async steps stop early
  let active = false;   // a session is starting or running

  function setStatus(text, isError = false) {
    statusEl.textContent = text;
    statusEl.classList.toggle("error", isError);
  }

  // The server HTML-escapes placeholders; inside <script> entities are not decoded by the
  // parser, so undo the usual ones by hand if plain JSON.parse fails.
  function parseProfiles() {
    const raw = ($("profiles") || {}).textContent || "[]";
    try {
      return JSON.parse(raw);
    } catch (_) {
      const map = { "&quot;": '"', "&#x27;": "'", "&#39;": "'", "&lt;": "<", "&gt;": ">", "&amp;": "&" };
      try {
        return JSON.parse(raw.replace(/&(quot|#x27|#39|lt|gt|amp);/g, (m) => map[m]));
      } catch (e) {
        return null;
      }
    }
  }

  function fillProfiles() {
    const profiles = parseProfiles();
    if (!Array.isArray(profiles) || profiles.length === 0) {
      setStatus(profiles === null ? "error: bad profile list from the bridge" : "no agent profiles configured", true);
      startBtn.disabled = true;
      return;
    }
    for (const p of profiles) {
      const opt = document.createElement("option");
      opt.value = String(p.key);
      opt.textContent = String(p.label || p.key);
      if (p.agent) opt.title = "agent: " + p.agent;
      profileSel.append(opt);
    }
    profileSel.selectedIndex = 0; // the first profile is the default
  }

  function authHeaders(extra = {}) {
    return Object.assign({ Authorization: "Bearer " + pageToken }, extra);
  }

  // No trickle ICE: the offer must carry every candidate, so wait for gathering to finish,
  // but never more than ICE_GATHER_LIMIT_MS (then go on with what we have).
  function waitIceComplete(pc) {
    if (pc.iceGatheringState === "complete") return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        pc.removeEventListener("icegatheringstatechange", check);
        resolve();
      };
      const check = () => { if (pc.iceGatheringState === "complete") done(); };
      const timer = setTimeout(done, ICE_GATHER_LIMIT_MS);
      pc.addEventListener("icegatheringstatechange", check);
    });
  }

  function fmtMs(v) {
    return typeof v === "number" && isFinite(v) ? Math.round(v) + " ms" : "–";
  }

  // "end_of_turn 250 ms, asr_tail 40 ms, ..." in pipeline order, unknown numeric stages last.
  function stageSummary(stages) {
    if (!stages || typeof stages !== "object") return "";
    const keys = STAGE_ORDER.filter((k) => k in stages)
      .concat(Object.keys(stages).filter((k) => !STAGE_ORDER.includes(k)));
    return keys.filter((k) => typeof stages[k] === "number" && k !== "total")
      .map((k) => k + " " + fmtMs(stages[k])).join(", ");
  }

  function addTurn(turn) {
    talk.turns.push(turn);
    const li = document.createElement("li");
    li.className = "turn";
    const caller = document.createElement("div");
    caller.className = "caller";
    caller.textContent = turn.caller == null ? "" : String(turn.caller);
    const agent = document.createElement("div");
    agent.className = "agent";
    agent.textContent = turn.agent == null ? "" : String(turn.agent);
    const latency = document.createElement("span");
    latency.className = "latency";
    latency.textContent = fmtMs(turn.total_ms);
    latency.title = stageSummary(turn.stages_ms);
    const meta = document.createElement("div");
    meta.className = "meta";
    meta.append(latency);
    if (turn.barged_in) { // kept outside .latency so its text stays just "N ms"
      const b = document.createElement("span");
      b.className = "barged";
      b.textContent = "barged in";
      meta.append(b);
    }
    li.append(caller, agent, meta);
    transcript.append(li);
    li.scrollIntoView({ block: "nearest" });
  }

  // Close everything local; the server side is told separately (DELETE) when needed.
  function teardown(statusText, isError = false) {
    attempt += 1;
    active = false;
    if (events) { events.close(); events = null; }
    if (talk.pc) { talk.pc.onconnectionstatechange = null; talk.pc.close(); }
    if (mic) { mic.getTracks().forEach((t) => t.stop()); mic = null; }
    audioEl.srcObject = null;
    startBtn.disabled = false;
    profileSel.disabled = false;
    headsetBox.disabled = false;
    stopBtn.disabled = true;
    if (statusText) setStatus(statusText, isError);
  }

  function hangUpOnServer(keepalive = false) {
    if (!talk.sessionUrl) return Promise.resolve();
    return fetch(talk.sessionUrl, { method: "DELETE", headers: authHeaders(), keepalive })
      .catch(() => {}); // the session may already be gone; nothing more to do
  }

  function onEvent(msg) {
    let data;
    try { data = JSON.parse(msg.data); } catch (_) { return; }
    if (!data || typeof data !== "object") return;
    if (data.type === "state") {
      if (data.state === "connected") {
        setStatus("connected");
        stopBtn.disabled = false;
      } else if (data.state === "ended") {
        teardown("ended: " + (data.reason || "ended"));
      }
    } else if (data.type === "turn") {
      addTurn(data);
    } // other types (e.g. "caller" partials) are not shown yet
  }

  async function start() {
    if (active) return;
    active = true;
    const my = ++attempt;
    const stale = () => my !== attempt;
    startBtn.disabled = true;
    profileSel.disabled = true;
    headsetBox.disabled = true;
    stopBtn.disabled = true;
    transcript.replaceChildren();
    talk.turns = [];
    talk.sessionUrl = null;
    talk.remoteStream = null;
    setStatus("connecting");

    try {
      // Speakers: the browser's echo canceller keeps the agent from hearing itself, but it
      // also swallows the caller's first words while the agent talks (double talk) and
      // noise suppression smears speech; a headset needs none of it, and the agent hears
      // the caller clean.
      const clean = headsetBox.checked;
      mic = await navigator.mediaDevices.getUserMedia({
        audio: { echoCancellation: !clean, noiseSuppression: !clean, autoGainControl: !clean },
        video: false,
      });
    } catch (e) {
      teardown("microphone: " + (e && (e.message || e.name) || e), true);
      return;
    }
    if (stale()) return;

    // No STUN/TURN: the bridge is reached directly, never via a public server.
    const pc = new RTCPeerConnection({ iceServers: [] });
    talk.pc = pc;
    mic.getTracks().forEach((t) => pc.addTrack(t, mic));
    pc.ontrack = (ev) => {
      talk.remoteStream = ev.streams[0] || new MediaStream([ev.track]);
      audioEl.srcObject = talk.remoteStream;
    };
    pc.onconnectionstatechange = () => {
      const st = pc.connectionState;
      if (st === "connected") {
        setStatus("connected");
        stopBtn.disabled = false;
      } else if (st === "disconnected") {
        setStatus("connection disconnected (trying to recover)", true);
      } else if (st === "failed") {
        hangUpOnServer();
        teardown("connection failed", true);
      }
    };

    let resp, body;
    try {
      await pc.setLocalDescription(await pc.createOffer());
      await waitIceComplete(pc);
      if (stale()) return;
      const key = profileSel.value;
      resp = await fetch("/talk/offer?profile=" + encodeURIComponent(key), {
        method: "POST",
        headers: authHeaders({ "Content-Type": "application/sdp" }),
        body: pc.localDescription.sdp,
      });
      body = await resp.text();
      pageToken = resp.headers.get("X-Next-Token") || pageToken;
    } catch (e) {
      if (!stale()) teardown("error: " + (e && e.message || e), true);
      return;
    }
    if (stale()) return;

    if (resp.status === 401) {
      // The page token lasts 10 minutes; a reload fetches a fresh one.
      teardown("the bridge refused: 401 " + body.trim() + " (reloading for a fresh token)", true);
      setTimeout(() => location.reload(), 1000);
      return;
    }
    const loc = resp.headers.get("Location");
    if (resp.status !== 201 || !loc) {
      teardown("the bridge refused: " + resp.status + " " + (body.trim() || resp.statusText || "(no Location)"), true);
      return;
    }
    talk.sessionUrl = loc;

    try {
      await pc.setRemoteDescription({ type: "answer", sdp: body });
    } catch (e) {
      hangUpOnServer();
      teardown("bad answer from the bridge: " + (e && e.message || e), true);
      return;
    }
    if (stale()) return;

    events = new EventSource(loc + "/events");
    events.onmessage = onEvent;
    events.onerror = () => {
      // EventSource retries by itself; once it gives up (CLOSED) the stream is gone.
      if (events && events.readyState === EventSource.CLOSED && !stale()) {
        setStatus("lost the event stream from the bridge", true);
      }
    };
  }

  async function stop() {
    if (!active) return;
    stopBtn.disabled = true;
    const sent = hangUpOnServer(); // tell the bridge first, then close locally
    teardown(null);
    setStatus("ended: hung up");
    await sent;
  }

  startBtn.addEventListener("click", start);
  stopBtn.addEventListener("click", stop);
  // Leaving the page must not leave a session running on the bridge.
  window.addEventListener("pagehide", () => { if (active) { hangUpOnServer(true); teardown(null); } });

  fillProfiles();
})();
