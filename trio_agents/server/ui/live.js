// The dev UI's live mode: talk to an app whose agent is a LiveAgent over WS /run_live.
//
// The page shows the live bar when the app picked is one of GET ui/live-apps.  "Go live" opens
// /run_live on the session shown (a new one if none) and the microphone (getUserMedia).  Two
// ways to take turns: push to talk (audio is sent only while the Talk button is held; letting
// go sends "commit") and voice detection (audio is sent all the time; the model server finds
// the turns and announces the person's speech, which interrupts the model).
//
// Capture: an AudioWorklet (this same file, loaded as a worklet module: the page's CSP allows
// scripts from itself only) hands the microphone's samples to the page, which resamples them
// (linear interpolation) from the context's rate to 24 kHz mono, encodes PCM16 little-endian
// and sends 100 ms "audio" frames (base64).
//
// Playback: each "audio" frame of the model becomes an AudioBuffer (24 kHz) scheduled right
// after the previous one on the AudioContext's clock.  What was played of an item is read from
// that clock (the time each chunk started, capped at its length) and reported in "played"
// frames every 100 ms, so a barge-in truncates the model's item at what the person heard,
// not at what arrived.  Interrupt (or pressing Talk while the model speaks) reports the
// position at that instant, stops the scheduled audio and sends "interrupt"; an interruption
// the server decides (the person started talking, under voice detection) stops the audio when
// its "interrupted" frame arrives, the server having truncated at the last report (at most
// 100 ms old: never past what was heard).  The transcript keeps, of an interrupted answer,
// only the "heard" text the server sends.
//
// Stop sends "stop" (the session completes) and closes the microphone; the socket closing for
// any other reason says why.  Messages typed while live go over the socket as "message" frames.
//
// Resume: a live session of the session shown that ended failed (its upstream socket dropped)
// or cancelled (the page was closed, a slow page cut off) shows Resume, which opens the
// microphone and /run_live?resume=<its id>: the same session on a new upstream socket, its
// transcript put back first.  Known when its socket closes (the page asks the invocation's
// status) and when a session is opened (its newest live session's status, from the list).
"use strict";

if (typeof registerProcessor === "function") {
  // ---- the worklet: the microphone's samples, to the page ----------------------------------
  class Capture extends AudioWorkletProcessor {
    process(inputs) {
      const channel = inputs[0] && inputs[0][0];
      if (channel && channel.length) this.port.postMessage(channel.slice(0));
      return true;
    }
  }
  registerProcessor("ta-capture", Capture);
} else {
  // ---- the page ----------------------------------------------------------------------------
  const RATE = 24000; // PCM16 mono at 24 kHz, both ways
  const FRAME = 2400; // samples per audio frame sent: 100 ms
  const REPORT_MS = 100; // how often the played position is reported

  const live = {
    apps: new Set(),
    ws: null,
    session: null,
    mode: "ptt",
    talking: false,
    ctx: null,
    stream: null,
    node: null,
    pos: 1, // the resampler's position in [last sample, ...this chunk]
    last: 0, // the previous chunk's last sample
    pending: [], // PCM16 samples not sent yet
    playhead: 0, // the AudioContext time the next chunk of the model's audio starts at
    items: new Map(), // item id -> {chunks: [{start, dur, src}], cut, reported}
    current: null, // the item whose audio plays (or played last)
    bubbles: new Map(), // turn -> the assistant's bubble
    timer: null,
    sent: 0, // audio frames sent
    resumable: null, // {session, id}: a live session of that session that may be resumed
  };
  const LIVE_INPUT = "(live session)"; // a live session's input (trio_agents.live.LIVE_INPUT)
  const RESUMABLE = new Set(["failed", "cancelled"]);

  const el = (id) => document.getElementById(id);

  function state(text) {
    el("live-state").textContent = text;
  }

  function send(frame) {
    if (live.ws && live.ws.readyState === WebSocket.OPEN) live.ws.send(JSON.stringify(frame));
  }

  function draw() {
    const on = live.ws !== null;
    el("live").dataset.live = on ? "on" : "off";
    el("live-start").hidden = on;
    const resumable = !on && live.resumable !== null;
    el("live-resume").hidden = !resumable;
    if (resumable) el("live-resume").dataset.invocation = live.resumable.id;
    el("live-mode").disabled = on;
    el("live-talk").hidden = !on || live.mode !== "ptt";
    el("live-interrupt").hidden = !on;
    el("live-stop").hidden = !on;
    el("live-talk").classList.toggle("held", live.talking);
  }

  // ---- capture: resample to 24 kHz, PCM16, base64 frames ---------------------------------

  function toBase64(samples) {
    const bytes = new Uint8Array(samples.length * 2);
    const view = new DataView(bytes.buffer);
    samples.forEach((s, i) => view.setInt16(i * 2, s, true));
    let binary = "";
    for (let i = 0; i < bytes.length; i += 0x8000) {
      binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
    }
    return btoa(binary);
  }

  function sendAudio(samples) {
    if (!samples.length) return;
    send({ type: "audio", audio: toBase64(samples) });
    live.sent += 1;
    el("live").dataset.sent = String(live.sent);
  }

  function captured(input) {
    const streaming = live.mode === "vad" || live.talking;
    const buf = new Float32Array(input.length + 1);
    buf[0] = live.last;
    buf.set(input, 1);
    const step = live.ctx.sampleRate / RATE;
    let pos = live.pos;
    while (Math.floor(pos) + 1 < buf.length) {
      const i = Math.floor(pos);
      if (streaming) {
        const s = buf[i] + (buf[i + 1] - buf[i]) * (pos - i);
        const c = Math.max(-1, Math.min(1, s));
        live.pending.push(Math.round(c < 0 ? c * 0x8000 : c * 0x7fff));
      }
      pos += step;
    }
    live.pos = pos - input.length;
    live.last = input[input.length - 1];
    while (live.pending.length >= FRAME) sendAudio(live.pending.splice(0, FRAME));
  }

  // ---- playback and the played position -------------------------------------------------

  function playedMs(item) {
    const now = live.ctx.currentTime;
    let s = 0;
    for (const c of item.chunks) s += Math.max(0, Math.min(now - c.start, c.dur));
    return s * 1000;
  }

  function play(frame) {
    let item = live.items.get(frame.item_id);
    if (!item) {
      item = { chunks: [], cut: false, reported: -1, received: 0 };
      live.items.set(frame.item_id, item);
    }
    if (item.cut) return; // the rest of an answer that was interrupted
    live.current = frame.item_id;
    item.received += frame.ms;
    el("live").dataset.received = String(item.received);
    const bytes = atob(frame.audio);
    const n = bytes.length >> 1;
    if (!n) return;
    const buffer = live.ctx.createBuffer(1, n, RATE);
    const data = buffer.getChannelData(0);
    for (let i = 0; i < n; i++) {
      const v = bytes.charCodeAt(2 * i) | (bytes.charCodeAt(2 * i + 1) << 8);
      data[i] = (v >= 0x8000 ? v - 0x10000 : v) / 0x8000;
    }
    const src = live.ctx.createBufferSource();
    src.buffer = buffer;
    src.connect(live.ctx.destination);
    const start = Math.max(live.ctx.currentTime, live.playhead);
    src.start(start);
    live.playhead = start + buffer.duration;
    item.chunks.push({ start, dur: buffer.duration, src });
  }

  function speaking() {
    return live.current !== null && live.ctx !== null && live.ctx.currentTime < live.playhead;
  }

  // Report how much of the current item was played (when it changed).
  function report() {
    const item = live.items.get(live.current);
    if (!item || item.cut) return;
    const ms = Math.floor(playedMs(item));
    if (ms === item.reported) return;
    item.reported = ms;
    el("live").dataset.item = live.current;
    el("live").dataset.played = String(ms);
    send({ type: "played", item_id: live.current, ms });
  }

  // Stop the model's audio where it is: nothing after this instant is heard.
  function silence() {
    const item = live.items.get(live.current);
    if (item && !item.cut) {
      report();
      item.cut = true;
      for (const c of item.chunks) {
        try { c.src.stop(); } catch { /* not started */ }
      }
    }
    if (live.ctx) live.playhead = live.ctx.currentTime;
  }

  function interrupt() {
    silence();
    send({ type: "interrupt", reason: "interrupted from the dev UI" });
  }

  // ---- the transcript ---------------------------------------------------------------------

  function answerBubble(turn) {
    let b = live.bubbles.get(turn);
    if (!b) {
      b = bubble("assistant", "");
      b.classList.add("live");
      live.bubbles.set(turn, b);
      el("messages").querySelector(".empty")?.remove();
      el("messages").append(b);
    }
    return b;
  }

  function onFrame(frame) {
    const box = el("messages");
    if (frame.type === "ready") {
      state(live.mode === "ptt" ? "live: hold Talk to speak" : "live: listening");
      el("live").dataset.invocation = frame.invocation_id;
    } else if (frame.type === "audio") {
      if (live.ctx) play(frame);
    } else if (frame.type === "user") {
      box.querySelector(".empty")?.remove();
      box.append(bubble("user", frame.text));
    } else if (frame.type === "text") {
      answerBubble(frame.turn).querySelector(".text").textContent += frame.text;
    } else if (frame.type === "done") {
      const b = answerBubble(frame.turn);
      b.querySelector(".text").textContent = frame.text;
      b.dataset.status = "done";
    } else if (frame.type === "interrupted") {
      silence();
      const b = answerBubble(frame.turn);
      b.querySelector(".text").textContent = frame.heard;
      b.dataset.status = "interrupted";
      b.querySelector(".meta")?.remove();
      const at = frame.audio_end_ms === null ? "" : ` at ${frame.audio_end_ms} ms`;
      b.append(h("div", { class: "meta" }, statusBadge("interrupted"), ` ${frame.reason}${at}`));
    } else if (frame.type === "notice" || frame.type === "error") {
      say(`Live session: ${frame.message}`, "info");
    }
    scrollDown();
  }

  // ---- opening and ending -----------------------------------------------------------------

  async function openMic() {
    live.ctx = new AudioContext();
    await live.ctx.audioWorklet.addModule("live.js");
    live.stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
    });
    const source = live.ctx.createMediaStreamSource(live.stream);
    live.node = new AudioWorkletNode(live.ctx, "ta-capture");
    live.node.port.onmessage = (e) => captured(e.data);
    source.connect(live.node);
    await live.ctx.resume();
  }

  function closeMic() {
    if (live.stream) for (const t of live.stream.getTracks()) t.stop();
    if (live.node) live.node.port.onmessage = null;
    if (live.ctx) live.ctx.close();
    Object.assign(live, { stream: null, node: null, ctx: null, pos: 1, last: 0, pending: [], playhead: 0, current: null, talking: false });
    live.items.clear();
    live.bubbles.clear();
  }

  // A live session (id) of session that ended: resumable if it failed or was cancelled.
  async function checkResumable(session, id) {
    let status;
    try {
      status = (await api("GET", invPath(id))).status;
    } catch { return; }
    if (RESUMABLE.has(status) && !live.ws && ui.session === session) {
      live.resumable = { session, id };
      draw();
    }
  }

  async function start(resume) {
    if (live.ws || !ui.app) return;
    if (typeof resume !== "string") resume = null;
    live.mode = el("live-mode").value;
    state("opening the microphone…");
    try {
      if (!ui.session) {
        const s = await api("POST", sessionsPath(), {});
        await loadSessions(s.id);
      }
      await openMic();
    } catch (err) {
      closeMic();
      state("");
      say(`Live mode needs the microphone: ${err.message || err}`);
      return;
    }
    const url = new URL("run_live", ROOT);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    url.searchParams.set("app_name", ui.app);
    url.searchParams.set("user_id", user());
    url.searchParams.set("session_id", ui.session);
    if (resume) url.searchParams.set("resume", resume);
    if (token()) url.searchParams.set("token", token());
    const ws = new WebSocket(url);
    live.ws = ws;
    live.session = ui.session;
    live.sent = 0;
    live.resumable = null;
    draw();
    state(resume ? "resuming…" : "connecting…");
    ws.onmessage = (e) => onFrame(JSON.parse(e.data));
    ws.onclose = (e) => {
      if (live.ws !== ws) return;
      clearInterval(live.timer);
      live.ws = null;
      closeMic();
      draw();
      state(e.code === 1000 ? "live session ended" : `live session closed: ${e.reason || e.code}`);
      const id = el("live").dataset.invocation;
      if (id) checkResumable(live.session, id); // (cancelled elsewhere closes with 1000 too)
    };
    live.timer = setInterval(report, REPORT_MS);
  }

  function stop() {
    if (!live.ws) return;
    silence();
    send({ type: "stop" });
    state("ending…");
  }

  function talk(down) {
    if (!live.ws || live.mode !== "ptt" || live.talking === down) return;
    if (down) {
      if (speaking()) interrupt(); // the person talks over the model
      live.talking = true;
    } else {
      live.talking = false;
      sendAudio(live.pending.splice(0));
      send({ type: "commit" });
    }
    draw();
  }

  // ---- hooks for app.js ---------------------------------------------------------------------

  window.taLive = {
    // The app picked (or the connection) changed: show the live bar for a LiveAgent's app.
    async appShown(app) {
      if (!app) {
        el("live").hidden = true;
        return;
      }
      try {
        live.apps = new Set(await api("GET", "ui/live-apps"));
      } catch { live.apps = new Set(); }
      el("live").hidden = !live.apps.has(app);
    },
    // Another session (or none) is shown: a live session of another one ends.
    sessionShown(id) {
      if (live.ws && id !== live.session) stop();
      if (live.resumable && live.resumable.session !== id) live.resumable = null; // its own only
      draw();
    },
    // A session was opened with its invocations (oldest first): its newest live session
    // may be resumed if it failed or was cancelled.
    sessionOpened(id, invocations) {
      const newest = [...invocations].reverse().find((i) => i.input === LIVE_INPUT);
      if (!newest || live.ws) return;
      if (RESUMABLE.has(newest.status)) live.resumable = { session: id, id: newest.invocation_id };
      else if (live.resumable && live.resumable.session === id) live.resumable = null;
      draw();
    },
    // A message typed while live goes over the socket; false when not live.
    sendText(text) {
      if (!live.ws) return false;
      silence();
      send({ type: "message", text });
      el("messages").append(bubble("user", text));
      scrollDown();
      return true;
    },
  };

  document.addEventListener("DOMContentLoaded", () => {
    el("live-start").addEventListener("click", () => start(null));
    el("live-resume").addEventListener("click", () => live.resumable && start(live.resumable.id));
    el("live-stop").addEventListener("click", stop);
    el("live-interrupt").addEventListener("click", interrupt);
    const talkButton = el("live-talk");
    talkButton.addEventListener("pointerdown", (e) => { talkButton.setPointerCapture(e.pointerId); talk(true); });
    talkButton.addEventListener("pointerup", () => talk(false));
    talkButton.addEventListener("pointercancel", () => talk(false));
    talkButton.addEventListener("keydown", (e) => { if (e.key === " " && !e.repeat) { e.preventDefault(); talk(true); } });
    talkButton.addEventListener("keyup", (e) => { if (e.key === " ") talk(false); });
    draw();
  });
}
