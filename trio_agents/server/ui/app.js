// The trio_agents dev UI: a page that drives the server through its public HTTP API only.
//
// Routes it uses: GET /list-apps; GET/POST /apps/{app}/users/{user}/sessions[/{id}];
// GET .../sessions/{id}/invocations (a session's invocations with their stored events);
// POST /run_sse (start and stream); GET /invocations/{id}/events (reattach, Last-Event-ID);
// GET /invocations/{id}; POST /invocations/{id}:cancel and :resume;
// GET/POST /invocations/{id}/approvals[/{approval_id}].  live.js (the live mode of a LiveAgent's
// app) adds GET ui/live-apps and WS /run_live.
//
// Live or reopened, a session looks the same: every invocation is drawn from its events by
// one function (apply), from the stream while it runs and from the store's frames when the
// session is opened (in another tab, another browser, after a reload), so tool calls,
// approvals, endings, Resume and each invocation's timeline come back as they were.
//
// Stop is escalable: "after the turn" (or "after the tools") leaves Stop enabled as "Stop
// now", which asks again with "immediately" (cancel modes only strengthen).  The choice is
// the run's: the next answer starts at "immediately" again.  The message box stays usable
// while an answer runs: sending then preempts it (cancel, reason "preempted by a new
// message", as the chat and a live session do), and the new message follows at once.
//
// The invocation being shown ("current") is kept in sessionStorage as one snapshot: its log
// of events (text deltas merged per turn) and the id of the last event seen.  After a reload
// the page draws that log again and follows on with Last-Event-ID = that id, so nothing is
// lost or shown twice.  EventSource cannot send a bearer token, so streams are read with
// fetch() and parsed here.
//
// The server may go away (killed, restarted, a network cut) while the page is open.  The page
// then says so ("connection lost", with the next attempt's countdown), disables what needs the
// server (Send, Stop, approvals, Resume) and tries again with exponential backoff (0.5 s
// doubling to 10 s, with jitter; any answer from the server resets it).  The stream reattaches
// with Last-Event-ID = the last id seen: a run that another process took over (or that ended
// meanwhile) goes on on the page from there.  See "the connection" below.
"use strict";

// The API root: this page is served at <root>/ui/, whatever prefix <root> has.
const ROOT = new URL("..", location.href);
const FINAL = new Set(["completed", "failed", "cancelled"]);
const $ = (id) => document.getElementById(id);

const ui = {
  apps: [],
  app: localStorage.getItem("ta.app") || "",
  session: null,
  mode: "", // "token" | "dev" | "" (not connected)
  cur: null, // the current invocation (see newInvocation)
  follower: null, // AbortController of the stream being read
  connects: 0, // connect() calls, so that only the last one draws
  loads: 0, // loadSessions() calls, likewise
  blocks: new Map(), // chat blocks of the current invocation, by key
  sessions: new Map(), // the sessions listed, by id
  shown: null, // the invocation whose events the timeline shows
  stopFor: null, // the invocation the stop controls were last set up for
  sending: false, // a message on its way (preempting, then starting)
};
const PREEMPTED = "preempted by a new message";
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// ---- small helpers ----------------------------------------------------------------------

function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c !== null && c !== undefined && c !== false) el.append(c);
  }
  return el;
}

const pad = (n, w = 2) => String(n).padStart(w, "0");
function clock(at) {
  const d = new Date(at * 1000);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}
function ago(at) {
  const s = Math.max(0, Date.now() / 1000 - at);
  if (s < 60) return "just now";
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return new Date(at * 1000).toLocaleDateString();
}
function pretty(text) {
  try { return JSON.stringify(JSON.parse(text), null, 2); } catch { return text; }
}
function user() { return $("user").value.trim() || "dev"; }
function token() { return $("token").value.trim(); }

// ---- the API ------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// A request that got no answer, or an answer cut off: the server cannot be reached (fetch()
// says only "TypeError: Failed to fetch", which is no message for a person).
class Unreachable extends Error {
  constructor() {
    super("the server cannot be reached");
    this.name = "Unreachable";
  }
}

// Worth trying again later: no answer, or the server (or a proxy in front of it) failing.
const retryable = (err) => err instanceof Unreachable || (err instanceof ApiError && err.status >= 500);
const aborted = () => new DOMException("aborted", "AbortError");

function headers(extra) {
  const out = { ...extra };
  if (token()) out.Authorization = `Bearer ${token()}`;
  return out;
}

async function request(method, path, { body, signal, lastEventId } = {}) {
  const hs = headers(body === undefined ? {} : { "Content-Type": "application/json" });
  if (lastEventId) hs["Last-Event-ID"] = lastEventId;
  let response;
  try {
    response = await fetch(new URL(path, ROOT), {
      method,
      headers: hs,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
    });
  } catch (err) {
    throw err.name === "AbortError" ? err : new Unreachable();
  }
  if (response.status < 500) linkUp(); // it answers: whatever waits for it may try again
  if (!response.ok) {
    let err = { status: response.status, code: "http_error", message: response.statusText };
    try { err = (await response.json()).error || err; } catch { /* not our JSON body */ }
    throw new ApiError(response.status, err.code, err.message);
  }
  return response;
}

async function api(method, path, body) {
  const response = await request(method, path, { body });
  return response.status === 204 ? null : response.json();
}

const enc = encodeURIComponent;
const sessionsPath = () => `apps/${enc(ui.app)}/users/${enc(user())}/sessions`;
const invPath = (id) => `invocations/${enc(id)}`;

// Reads an SSE answer frame by frame: onFrame({id, event, data}) with data parsed.
async function readFrames(response, onFrame) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  let frame = { id: null, event: "message", data: [] };
  for (;;) {
    let chunk;
    try {
      chunk = await reader.read();
    } catch (err) {
      throw err.name === "AbortError" ? err : new Unreachable(); // cut off mid-stream
    }
    const { value, done } = chunk;
    if (done) return;
    buf += value;
    for (;;) {
      const i = buf.search(/[\r\n]/);
      if (i < 0 || (buf[i] === "\r" && i === buf.length - 1)) break; // wait for "\r\n"
      const line = buf.slice(0, i);
      buf = buf.slice(buf.startsWith("\r\n", i) ? i + 2 : i + 1);
      if (line === "") {
        if (frame.data.length) onFrame({ ...frame, data: JSON.parse(frame.data.join("\n")) });
        frame = { id: null, event: "message", data: [] };
      } else if (!line.startsWith(":")) {
        const c = line.indexOf(":");
        const name = c < 0 ? line : line.slice(0, c);
        const val = c < 0 ? "" : line.slice(c + 1).replace(/^ /, "");
        if (name === "data") frame.data.push(val);
        else if (name === "id" || name === "event") frame[name] = val;
      }
    }
  }
}

// ---- the banner -----------------------------------------------------------------------------

function say(message, kind = "error") {
  const banner = $("banner");
  banner.replaceChildren(
    h("span", { text: message }),
    h("button", { class: "link", text: "dismiss", onclick: () => { banner.hidden = true; } }),
  );
  banner.className = `banner ${kind}`;
  delete banner.dataset.unreachable;
  banner.hidden = false;
}

// What went wrong, for a person.  A request that got no answer says so (and the connection
// bar tells when the page tries again); it is not tried again by itself: it acted.
function describe(err) {
  if (err instanceof Unreachable) return "No answer: the server cannot be reached. Try again once it is back.";
  return err instanceof ApiError ? `${err.code}: ${err.message}` : String(err);
}
function sayError(err) {
  say(describe(err));
  if (err instanceof Unreachable) {
    $("banner").dataset.unreachable = "1"; // gone once the server answers
    linkLost(err);
  }
}

// ---- the connection ------------------------------------------------------------------------
//
// One state for the whole page: up, or down since a request got no answer (or a 5xx).  While
// it is down the bar above the conversation says so and counts down to the next attempt; the
// buttons that need the server (class "needs-server") are disabled; the run's status shows as
// last known.  Attempts come in rounds, 0.5 s doubling to 10 s apart, each delay drawn between
// half and all of that (jitter: many pages reconnecting to one restarted server do not come
// back in step).  In each round every request waiting to be tried again (the event stream,
// the session list, a status) is tried; with none waiting, a GET /list-apps probes.  The first
// answer below 500 from anything brings the page back up, resets the delay and wakes every
// waiting request at once.  "Retry now" (and the browser coming back online) starts the next
// round at once.

const BACKOFF_MS = 500;
const BACKOFF_CAP_MS = 10_000;
const link = {
  down: false,
  why: null, // the error that took it down (Unreachable, or an ApiError >= 500)
  attempt: 0, // rounds since it went down
  at: 0, // when the next round starts (Date.now() ms), while one is scheduled
  timer: 0,
  ticker: 0,
  waiting: [], // resolvers of requests waiting for the next round
};

function backoff(attempt) {
  const cap = Math.min(BACKOFF_CAP_MS, BACKOFF_MS * 2 ** attempt);
  return cap / 2 + Math.random() * (cap / 2);
}

// A request failed for want of the server: down (if it was up), and the next round scheduled
// (unless one is already).
function linkLost(err) {
  link.why = err;
  if (!link.down) {
    link.down = true;
    link.attempt = 0;
  }
  if (!link.timer) {
    const wait = backoff(link.attempt);
    link.attempt += 1;
    link.at = Date.now() + wait;
    link.timer = setTimeout(nextRound, wait);
  }
  drawLink();
}

function nextRound() {
  clearTimeout(link.timer);
  link.timer = 0;
  const waiting = link.waiting.splice(0);
  if (waiting.length) for (const wake of waiting) wake(true);
  else probe();
  drawLink();
}

async function probe() {
  try {
    await request("GET", "list-apps");
  } catch (err) {
    if (retryable(err)) linkLost(err); // any other answer (a 401) brought it up already
  }
}

function linkUp() {
  if (!link.down) return;
  link.down = false;
  link.why = null;
  link.attempt = 0;
  clearTimeout(link.timer);
  link.timer = 0;
  for (const wake of link.waiting.splice(0)) wake(true);
  if ($("banner").dataset.unreachable) $("banner").hidden = true;
  drawLink();
}

function retryNow() {
  if (link.down && link.timer) nextRound();
}

// Wait for the next round (true), or until `signal` aborts (false).
function nextAttempt(signal) {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve(false);
    if (!link.down) return resolve(true); // something else got an answer meanwhile
    const onAbort = () => {
      link.waiting = link.waiting.filter((w) => w !== wake);
      resolve(false);
    };
    const wake = (ok) => {
      signal?.removeEventListener("abort", onAbort);
      resolve(ok);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
    link.waiting.push(wake);
  });
}

// fn(), tried again in every round while the server cannot answer it; other errors (and an
// abort of `signal`) are thrown.
async function retrying(fn, signal) {
  for (;;) {
    try {
      return await fn();
    } catch (err) {
      if (!retryable(err) || signal?.aborted) throw err;
      linkLost(err);
      if (!(await nextAttempt(signal))) throw aborted();
    }
  }
}
const read = (path, signal) => retrying(() => api("GET", path), signal);

// Enable or disable a button that needs the server; while the server is away it stays
// disabled, and comes back as it should be once it answers.
function able(el, enabled) {
  el.classList.add("needs-server");
  el.disabled = !enabled || link.down;
  if (enabled && link.down) markOffline(el);
  else unmarkOffline(el);
}
function markOffline(el) {
  el.dataset.offline = "1";
  el.title = "The server cannot be reached: this waits until it is back";
}
function unmarkOffline(el) {
  if (!el.dataset.offline) return;
  delete el.dataset.offline;
  el.removeAttribute("title");
}

function reflectLink() {
  for (const el of document.querySelectorAll(".needs-server")) {
    if (link.down && !el.disabled) {
      el.disabled = true;
      markOffline(el);
    } else if (!link.down && el.dataset.offline) {
      el.disabled = false;
      unmarkOffline(el);
    }
  }
}

function drawLink() {
  const bar = $("link");
  clearInterval(link.ticker);
  link.ticker = 0;
  document.body.classList.toggle("offline", link.down);
  $("chat-status").classList.toggle("stale", link.down);
  $("chat-status").title = link.down ? "last known: the server cannot be reached" : "";
  drawMode();
  reflectLink();
  if (!link.down) {
    bar.hidden = true;
    bar.replaceChildren();
    return;
  }
  const [title, why] = link.why instanceof ApiError
    ? ["Server error. ", `The server answers ${link.why.status} (${link.why.code}).`]
    : ["Connection lost. ", "The server cannot be reached."];
  const next = h("span", { class: "link-next" });
  const tick = () => {
    const s = Math.max(1, Math.ceil((link.at - Date.now()) / 1000));
    const text = link.timer ? `Reconnecting in ${s} s (attempt ${link.attempt + 1})…` : "Reconnecting now…";
    if (next.textContent !== text) next.textContent = text; // a live region: say changes only
  };
  tick();
  if (link.timer) link.ticker = setInterval(tick, 250);
  const following = ui.follower && ui.cur && !ui.cur.ended;
  bar.replaceChildren(
    h("div", null,
      h("b", { text: title }), why, " ", next,
      h("div", { class: "small-text", text: following
        ? "Once it answers, the page goes on from the last event it saw (a run whose server died goes on when a restarted one takes it over). Stop, Send and approvals wait until then."
        : "Send, Stop and approvals wait until it answers." }),
    ),
    h("button", { class: "link", type: "button", text: "Retry now", onclick: retryNow }),
  );
  bar.hidden = false;
}

function drawMode() {
  const pill = $("mode");
  document.body.classList.toggle("connected", Boolean(ui.mode));
  if (link.down) {
    pill.textContent = "reconnecting";
    pill.className = "pill off";
    return;
  }
  pill.textContent = { token: "token", dev: "insecure dev", "": "not connected" }[ui.mode];
  pill.className = `pill ${ui.mode || "off"}`;
}

// ---- connecting, apps, sessions --------------------------------------------------------------

async function connect() {
  localStorage.setItem("ta.token", token());
  localStorage.setItem("ta.user", user());
  $("banner").hidden = true;
  const gen = ++ui.connects;
  try {
    // Tried again until the server answers: a page opened while it restarts connects then.
    const apps = await read("list-apps");
    if (gen !== ui.connects) return; // connected again meanwhile
    ui.apps = apps;
    ui.mode = token() ? "token" : "dev";
    document.body.classList.remove("show-auth");
  } catch (err) {
    if (gen !== ui.connects) return;
    ui.apps = [];
    ui.mode = "";
    if (err instanceof ApiError && err.status === 401) {
      say(token() ? `The server refused the token: ${err.message}` : "This server needs a bearer token: enter it above.", "info");
    } else sayError(err);
  }
  if (ui.mode === "dev" && user() !== "dev") {
    // Auth.user: a request that names no user (the invocation routes) is "dev" without a token.
    say(`Without a token the server takes stop, approvals and reattach to be user "dev", not "${user()}": they will not find ${user()}'s invocations.`, "info");
  }
  drawMode();
  if (!ui.apps.includes(ui.app)) ui.app = ui.apps[0] || "";
  $("app").replaceChildren(...ui.apps.map((a) => h("option", { value: a, text: a, selected: a === ui.app })));
  const wanted = new URLSearchParams(location.hash.slice(1)).get("session");
  await loadSessions(wanted);
}

async function loadSessions(select) {
  const list = $("session-list");
  window.taLive?.appShown(ui.app); // live.js: a LiveAgent's app gets the live bar
  if (!ui.app) {
    list.replaceChildren();
    return showSession(null);
  }
  let sessions = [];
  const gen = ++ui.loads;
  try {
    sessions = await read(sessionsPath());
  } catch (err) { sayError(err); }
  if (gen !== ui.loads) return; // another app (or user) was picked meanwhile
  sessions.sort((a, b) => b.lastUpdateTime - a.lastUpdateTime);
  ui.sessions = new Map(sessions.map((s) => [s.id, s]));
  list.replaceChildren(...sessions.map((s) => h("li", null,
    h("button", {
      class: "session" + (s.id === select ? " active" : ""),
      dataset: { session: s.id },
      title: s.id,
      onclick: () => { closeDrawers(); openSession(s.id); },
    },
    h("span", { class: "session-title" + (s.title ? "" : " untitled"), text: s.title || "New session" }),
    h("span", { class: "muted small-text session-time", title: new Date(s.lastUpdateTime * 1000).toLocaleString(), text: ago(s.lastUpdateTime) })),
  )));
  if (!sessions.length) list.append(h("li", { class: "muted empty-note", text: "No sessions yet." }));
  if (select && sessions.some((s) => s.id === select)) await openSession(select);
  else showSession(null);
}

async function newSession() {
  closeDrawers();
  try {
    const s = await api("POST", sessionsPath(), {});
    await loadSessions(s.id);
  } catch (err) { sayError(err); }
}

function markActive() {
  for (const b of document.querySelectorAll(".session")) b.classList.toggle("active", b.dataset.session === ui.session);
  const here = location.pathname + location.search;
  history.replaceState(null, "", ui.session ? `${here}#app=${enc(ui.app)}&session=${enc(ui.session)}` : here);
}

function showSession(id) {
  window.taLive?.sessionShown(id);
  stopFollowing();
  ui.session = id;
  ui.cur = null;
  ui.blocks.clear();
  markActive();
  drawTitle();
  setStatus("");
  ui.shown = null;
  $("events").replaceChildren();
  countEvents();
  $("inv-id").textContent = "";
  renderEmpty();
  setRunning(false);
}

// A session's first message is its title: shown as soon as it is sent.
function titleIfNone(id, text) {
  const s = ui.sessions.get(id);
  if (!s || s.title) return;
  s.title = text.split(/\s+/).join(" ").trim();
  const t = document.querySelector(`.session[data-session="${CSS.escape(id)}"] .session-title`);
  if (t) {
    t.textContent = s.title;
    t.classList.remove("untitled");
  }
  drawTitle();
}

function drawTitle() {
  const s = ui.session ? ui.sessions.get(ui.session) : null;
  const title = $("chat-title");
  title.textContent = ui.session ? (s && s.title) || "New session" : ui.app ? "No session yet" : "Not connected";
  title.title = ui.session ? `session ${ui.session}` : "";
}

// Open a session: each of its invocations drawn from its stored events (as it was drawn
// live), the last one followed on if it still runs.  An invocation this tab was following
// (kept in sessionStorage) is drawn from that snapshot instead, so a reload mid-answer
// follows on from the very event it had seen.  Entries of invocations the server no longer
// lists (the oldest of a long session) are drawn from the session's messages first.
async function openSession(id) {
  showSession(id);
  let listed;
  let session;
  try {
    [listed, session] = await Promise.all([
      read(`${sessionsPath()}/${enc(id)}/invocations`),
      read(`${sessionsPath()}/${enc(id)}`),
    ]);
  } catch (err) { return ui.session === id && sayError(err); }
  if (ui.session !== id) return;
  window.taLive?.sessionOpened(id, listed.invocations); // live.js: Resume a live session
  const saved = restore();
  const ids = new Set(listed.invocations.map((i) => i.invocation_id));
  renderHistory(session.events.filter((e) => !ids.has(e.invocationId)));
  let last = null;
  const newest = listed.invocations[listed.invocations.length - 1];
  for (const info of listed.invocations) {
    let inv;
    // The snapshot only for the newest (an older one ended since: the store has it all).
    if (info === newest && saved && saved.app === ui.app && saved.session === id && saved.id === info.invocation_id && !saved.ended) {
      inv = saved;
    } else {
      inv = newInvocation(info.invocation_id);
      inv.following = false;
      for (const frame of info.frames) record(inv, frame);
    }
    begin(inv);
    for (const entry of inv.log) apply(entry, true);
    last = { inv, info };
  }
  if (!last) return;
  save();
  $("messages").scrollTop = $("messages").scrollHeight; // opened at its newest answer
  const { inv, info } = last;
  // A paused one is not followed: its stream would end at once, with no new ending.
  if ((!inv.ended && !FINAL.has(info.status) && info.status !== "paused") || inv.following) follow();
  else setRunning(false);
}

// ---- the conversation ----------------------------------------------------------------------

function renderEmpty() {
  const box = $("messages");
  let hint;
  if (!ui.mode) hint = ["Not connected", "Enter your user and token above, then Connect."];
  else if (!ui.app) hint = ["No apps", "This server serves no agents."];
  else if (!ui.session) hint = [`Talk to ${ui.app}`, "Pick a session on the left, or just type: a new session is created for you."];
  else hint = ["A new conversation", `Say something to ${ui.app}.`];
  box.replaceChildren(h("div", { class: "empty" }, h("div", { class: "empty-title", text: hint[0] }), h("p", { text: hint[1] })));
}

// A session's messages, for the invocations whose events are not listed.
function renderHistory(entries) {
  const box = $("messages");
  if (!entries.length) return;
  box.querySelector(".empty")?.remove();
  for (const e of entries) {
    const m = e.message;
    if (!m || m.kind === "tool_results") continue;
    if (m.kind === "user") box.append(bubble("user", m.text));
    else {
      const b = bubble("assistant", m.text || "");
      for (const call of m.tool_calls || []) b.append(toolChip(call));
      if (e.status && e.status !== "completed") {
        b.append(h("div", { class: "meta" }, statusBadge(e.status), e.reason ? ` ${e.reason}` : "", e.interrupted ? " · interrupted" : ""));
      } else if (e.interrupted) { // a live session's turn, cut by a barge-in (no status)
        b.append(h("div", { class: "meta" }, statusBadge("interrupted"), e.reason ? ` ${e.reason}` : ""));
      }
      box.append(b);
    }
  }
  box.append(h("div", { class: "divider" }));
}

function bubble(who, text) {
  return h("div", { class: `bubble ${who}` }, h("div", { class: "text", text }));
}

function statusBadge(status) {
  return h("span", { class: `badge ${status}`, text: status });
}

function toolChip(call) {
  return h("details", { class: "tool", dataset: { call: call.id } },
    h("summary", null, h("span", { class: "tool-name", text: call.name }), h("span", { class: "tool-state muted", text: "" })),
    h("pre", { class: "args", text: pretty(call.arguments) }),
  );
}

function scrollDown() {
  const box = $("messages");
  if (box.scrollHeight - box.scrollTop - box.clientHeight < 160) box.scrollTop = box.scrollHeight;
}

// ---- the current invocation: its log, drawn ------------------------------------------------

function newInvocation(id) {
  return { id, app: ui.app, session: ui.session, log: [], lastId: null, run: 0, ended: null, following: true, stopping: null };
}

// Draw `inv` from here on: what was shown before stays as history, the timeline shows `inv`.
function begin(inv) {
  if (ui.cur) {
    ui.blocks.clear();
    $("messages").append(h("div", { class: "divider" }));
  }
  ui.cur = inv;
  ui.shown = inv.id;
  $("events").replaceChildren();
  countEvents();
  $("inv-id").textContent = inv.id;
}

function save() {
  if (ui.cur) sessionStorage.setItem("ta.current", JSON.stringify(ui.cur));
}
function restore() {
  try { return JSON.parse(sessionStorage.getItem("ta.current")); } catch { return null; }
}

// One frame of the stream: update the snapshot (log and last id), then draw it.
function onFrame(frame) {
  apply(record(ui.cur, frame), false);
  save();
}

// One frame into `inv`'s log (a turn's deltas merged); the entry to draw.
function record(inv, frame) {
  const d = frame.data;
  if (frame.id) inv.lastId = frame.id;
  else if (d.seq) inv.lastId = String(d.seq); // the terminal frame has no id: resume after it
  let entry;
  if (d.kind === "text_delta" || d.kind === "reasoning_delta") {
    const prev = inv.log[inv.log.length - 1];
    const key = `${d.kind}:${d.path}:${d.turn}`;
    if (prev && prev.kind === "delta" && prev.key === key) {
      prev.text += d.text;
      entry = { ...prev, text: d.text };
    } else {
      entry = { kind: "delta", key, delta: d.kind, path: d.path, turn: d.turn, text: d.text };
      inv.log.push({ ...entry });
    }
  } else {
    entry = { kind: "event", event: frame.event, data: d };
    inv.log.push(entry);
  }
  return entry;
}

function block(key, make) {
  let el = ui.blocks.get(key);
  if (!el) {
    el = make();
    ui.blocks.set(key, el);
    $("messages").querySelector(".empty")?.remove();
    $("messages").append(el);
  }
  return el;
}

// The chip of the tool call d.call (an approval's or a request for input's) says what it waits for.
function markCallWaiting(d, text) {
  const chip = turnBlock(d.path, d.turn).querySelector(`[data-call="${CSS.escape(d.call.id)}"]`);
  if (chip) chip.querySelector(".tool-state").textContent = text;
}

function turnBlock(path, turn) {
  const inv = ui.cur;
  return block(`turn:${inv.run}:${path}:${turn}`, () => {
    const el = bubble("assistant", "");
    el.dataset.turn = turn;
    if (path) el.prepend(h("div", { class: "meta", text: path }));
    return el;
  });
}

// Draw one log entry (replaying: drawn again after a reload, nothing is sent).
function apply(entry, replaying) {
  const inv = ui.cur;
  if (entry.kind === "delta") {
    const el = turnBlock(entry.path, entry.turn);
    el.classList.add("streaming");
    if (entry.delta === "reasoning_delta") {
      let r = el.querySelector(".reasoning");
      if (!r) el.prepend(r = h("div", { class: "reasoning" }));
      r.textContent += entry.text;
    } else el.querySelector(".text").textContent += entry.text;
    return scrollDown();
  }
  const d = entry.data;
  if (ui.shown === inv.id) timelineRow(entry);
  else if (!replaying) showTimeline(inv, false); // it goes on: the timeline follows it again
  switch (d.kind) {
    case "started":
      inv.run += 1;
      inv.stopping = null; // a stop asked of an earlier run is no stop of this one
      if (d.resumed) {
        // A turn still streaming when its run stopped (its process died) never finished:
        // the resumed run answers it again, in a block of its own.
        interruptStreaming();
        block(`resumed:${d.seq}`, () => h("div", { class: "divider labelled", text: resumedText(d) }));
      } else if (d.input === "(live session)") { // a LiveAgent's: its turns are user_turn events
        block("input", () => h("div", { class: "divider labelled", text: "live session" }));
      } else block("input", () => bubble("user", d.input));
      setRunning(true);
      break;
    case "user_turn": // a live session's person (live.js draws them live)
      block(`user:${d.turn}`, () => bubble("user", d.text));
      break;
    case "turn_finished": {
      const el = turnBlock(d.path, d.turn);
      el.classList.remove("streaming");
      const text = el.querySelector(".text");
      if (d.message.text !== text.textContent) {
        // The turn's text is the truth; streamed deltas that disagree mean events were lost
        // or doubled on the way (the browser tests fail on this warning).  A live session's
        // interrupted turn keeps only what was heard: shorter than what streamed, rightly.
        if (text.textContent && d.finish_reason !== "interrupted") console.warn(`turn ${d.turn}: the streamed text differs from the turn's text`);
        text.textContent = d.message.text;
      }
      for (const call of d.message.tool_calls) if (!el.querySelector(`[data-call="${CSS.escape(call.id)}"]`)) el.append(toolChip(call));
      if (!d.message.text && !d.message.tool_calls.length) el.remove();
      break;
    }
    case "tool_progress": {
      // A running call's progress (an MCP server's notifications/progress): on its chip.
      const chip = turnBlock(d.path, d.turn).querySelector(`[data-call="${CSS.escape(d.call_id)}"]`);
      const done = d.total == null ? `${d.progress}` : `${d.progress}/${d.total}`;
      if (chip) chip.querySelector(".tool-state").textContent = `running… ${done}${d.message ? ` ${d.message}` : ""}`;
      break;
    }
    case "tool_call_started": {
      const el = turnBlock(d.path, d.turn);
      let chip = el.querySelector(`[data-call="${CSS.escape(d.call.id)}"]`);
      if (!chip) el.append(chip = toolChip(d.call));
      chip.querySelector(".args").textContent = pretty(d.call.arguments); // as approved, maybe edited
      chip.classList.add("running");
      chip.querySelector(".tool-state").textContent = "running…";
      break;
    }
    case "tool_call_finished": {
      const chip = turnBlock(d.path, d.turn).querySelector(`[data-call="${CSS.escape(d.result.call_id)}"]`);
      if (chip) {
        chip.classList.remove("running");
        chip.classList.toggle("error", d.result.is_error);
        chip.querySelector(".tool-state").textContent = d.result.is_error ? "error" : "done";
        chip.append(h("pre", { class: "result", text: d.result.content }));
      }
      break;
    }
    case "approval_requested": {
      approvalCard(d);
      markCallWaiting(d, "waiting for approval");
      drawStatus();
      break;
    }
    case "approval_decided":
      settleCard(d.approval_id, d.state, d.by ? `by ${d.by}` : "", d.arguments);
      drawStatus();
      break;
    case "input_requested": {
      // A running tool (an MCP server's elicitation) asks a person: a card like an approval's.
      inputCard(d);
      markCallWaiting(d, "waiting for input");
      drawStatus();
      break;
    }
    case "input_submitted":
      settleCard(d.request_id, d.state, [d.action, d.by ? `by ${d.by}` : ""].filter(Boolean).join(" "), d.content ? JSON.stringify(d.content) : null);
      drawStatus();
      break;
    case "cancel_requested":
      // Asked here, in another tab, or by another client: the stop controls follow it.
      inv.stopping = strongest(inv.stopping, d.mode);
      drawStop();
      drawStatus();
      break;
    case "ended":
      interruptStreaming();
      if (entry.event === "ended") {
        inv.ended = d;
        setStatus(d.status);
      }
      outcomeCard(d, entry.event === "ended");
      if (entry.event === "ended") {
        for (const [gate, state] of Object.entries(d.gates || {})) if (state !== "open") settleCard(gate, state, "");
        if (d.status === "paused") syncApprovals();
        setRunning(false);
      }
      break;
    default:
      break;
  }
  if (link.down) reflectLink(); // a card drawn while the server is away: its buttons wait
  scrollDown();
}

function interruptStreaming() {
  for (const el of document.querySelectorAll(".messages .streaming")) {
    el.classList.remove("streaming");
    el.classList.add("interrupted"); // its turn never finished
  }
}

// ---- the timeline --------------------------------------------------------------------------

// A resumed run; one that took over from a process that died says from whom and by whom.
function resumedText(d) {
  return d.taken_over_from ? `taken over from ${d.taken_over_from} by ${d.owner}` : "resumed";
}

function summary(d) {
  switch (d.kind) {
    case "started": return d.resumed ? resumedText(d) : d.input;
    case "turn_finished": return d.message.text || d.message.tool_calls.map((c) => `${c.name}(…)`).join(", ");
    case "tool_call_started": return `${d.call.name} ${d.call.arguments}`;
    case "tool_call_finished": return `${d.result.name} → ${d.result.content}`;
    case "approval_requested": return `${d.call.name} ${d.call.arguments}`;
    case "approval_decided": return `${d.state}${d.by ? ` by ${d.by}` : ""}`;
    case "cancel_requested": return `${d.mode}${d.reason ? `: ${d.reason}` : ""}`;
    case "ended": return `${d.status}${d.reason ? `: ${d.reason}` : ""}`;
    case "warning": return d.message;
    default: return "";
  }
}

function timelineRow(entry) {
  const d = entry.data;
  const list = $("events");
  const first = list.firstElementChild;
  const t0 = first ? Number(first.dataset.at) : d.at;
  const kind = entry.event === "run_ended" ? "ended (earlier run)" : d.kind;
  const cat = d.kind === "ended" ? `st-${d.status}` : `k-${d.kind}`;
  // Durable events have a seq of their own; an ephemeral one (a cancel request, a warning)
  // is numbered after the durable event before it: "4.2".
  const id = d.seq === undefined ? "" : d.sub ? `${d.seq}.${d.sub}` : String(d.seq);
  const row = h("li", { class: `row ${cat}`, dataset: { id, seq: d.seq ?? "", kind: d.kind, at: d.at ?? "" } },
    h("div", { class: "row-head", onclick: () => row.classList.toggle("open") },
      h("span", { class: "seq mono", text: id || "–" }),
      h("span", { class: "kind", text: kind }),
      h("span", { class: "time mono", title: d.at ? clock(d.at) : "", text: d.at ? (first ? `+${Math.round((d.at - t0) * 1000)} ms` : clock(d.at)) : "" }),
    ),
    h("div", { class: "row-sum", text: summary(d) }),
    h("pre", { class: "row-json", text: JSON.stringify(d, null, 2) }),
  );
  list.append(row);
  list.scrollTop = list.scrollHeight;
  countEvents();
}

function countEvents() {
  const n = $("events").childElementCount;
  $("event-count").textContent = n ? String(n) : "";
}

// The timeline shows the events of `inv` (an earlier answer's, from its outcome card).
function showTimeline(inv, reveal = true) {
  ui.shown = inv.id;
  $("events").replaceChildren();
  for (const entry of inv.log) if (entry.kind === "event") timelineRow(entry);
  countEvents();
  $("inv-id").textContent = inv.id;
  if (reveal) openDrawer("events");
}

// ---- approvals -------------------------------------------------------------------------------

function approvalCard(d) {
  const inv = ui.cur;
  const original = pretty(d.call.arguments);
  const args = h("textarea", { class: "args-edit mono", rows: Math.min(8, original.split("\n").length + 1), spellcheck: "false" });
  args.value = original;
  const error = h("div", { class: "card-error", hidden: true });
  const decide = async (approved) => {
    const body = { approved };
    if (approved && args.value.trim() !== original.trim()) {
      try { body.arguments = JSON.parse(args.value); } catch (e) {
        error.textContent = `Not JSON: ${e.message}`;
        error.hidden = false;
        return;
      }
    }
    error.hidden = true;
    card.classList.add("busy");
    try {
      const answer = await api("POST", `${invPath(inv.id)}/approvals/${enc(d.approval_id)}`, body);
      settleCard(d.approval_id, answer.state, answer.recorded ? "" : "decided before");
    } catch (err) {
      error.textContent = describe(err);
      error.hidden = false;
      if (err instanceof Unreachable) linkLost(err);
    } finally { card.classList.remove("busy"); }
  };
  const card = block(`approval:${d.approval_id}`, () => h("div", { class: "card approval open", dataset: { approvalId: d.approval_id, call: d.call.id, path: d.path, turn: d.turn } },
    h("div", { class: "card-title" }, h("span", { class: "badge open", text: "approval" }), " ", h("b", { class: "mono", text: d.call.name }), d.description ? h("span", { class: "muted", text: ` — ${d.description}` }) : null),
    d.prompt ? h("p", { text: d.prompt }) : null,
    h("label", { class: "small-text muted edit-hint", text: "Arguments (edit before approving)" }),
    args,
    h("div", { class: "small-text muted final-label" }),
    h("pre", { class: "final-args mono" }),
    error,
    h("div", { class: "card-actions" },
      h("button", { class: "primary approve needs-server", type: "button", text: "Approve", onclick: () => decide(true) }),
      h("button", { class: "ghost deny needs-server", type: "button", text: "Deny", onclick: () => decide(false) }),
      h("span", { class: "card-state muted" }),
    ),
  ));
  return card;
}

// A request for input: the server's message, a field per property of its schema (a JSON box
// when the schema names none); Accept sends the content, Decline and Dismiss send none.
function inputCard(d) {
  const inv = ui.cur;
  const props = (d.schema && d.schema.properties) || {};
  const names = Object.keys(props);
  const fields = new Map();
  for (const name of names) {
    const type = props[name].type;
    const input = type === "boolean" ? h("input", { type: "checkbox", class: "input-field", dataset: { field: name } })
      : h("input", { type: type === "number" || type === "integer" ? "number" : "text", class: "input-field mono", dataset: { field: name } });
    fields.set(name, input);
  }
  const json = h("textarea", { class: "args-edit mono", rows: 4, spellcheck: "false", hidden: names.length > 0 });
  json.value = "{}";
  const error = h("div", { class: "card-error", hidden: true });
  const content = () => {
    if (!names.length) return JSON.parse(json.value);
    const out = {};
    for (const [name, input] of fields) {
      const type = props[name].type;
      if (type === "boolean") out[name] = input.checked;
      else if (input.value === "") continue;
      else out[name] = type === "number" || type === "integer" ? Number(input.value) : input.value;
    }
    return out;
  };
  const answer = async (action) => {
    const body = { approved: action === "accept", action };
    if (action === "accept") {
      try { body.content = content(); } catch (e) {
        error.textContent = `Not JSON: ${e.message}`;
        error.hidden = false;
        return;
      }
    }
    error.hidden = true;
    card.classList.add("busy");
    try {
      const got = await api("POST", `${invPath(inv.id)}/approvals/${enc(d.request_id)}`, body);
      settleCard(d.request_id, got.state, got.recorded ? got.action || "" : "answered before", body.content ? JSON.stringify(body.content) : null);
    } catch (err) {
      error.textContent = describe(err);
      error.hidden = false;
      if (err instanceof Unreachable) linkLost(err);
    } finally { card.classList.remove("busy"); }
  };
  const card = block(`approval:${d.request_id}`, () => h("div", { class: "card approval input open", dataset: { approvalId: d.request_id, kind: "input", call: d.call.id, path: d.path, turn: d.turn } },
    h("div", { class: "card-title" }, h("span", { class: "badge open", text: "input" }), " ", h("b", { class: "mono", text: d.call.name })),
    h("p", { class: "input-message", text: d.message }),
    ...names.map((name) => h("label", { class: "small-text input-label" }, `${props[name].title || name} `, fields.get(name))),
    json,
    h("div", { class: "small-text muted final-label" }),
    h("pre", { class: "final-args mono" }),
    error,
    h("div", { class: "card-actions" },
      h("button", { class: "primary approve needs-server", type: "button", text: "Accept", onclick: () => answer("accept") }),
      h("button", { class: "ghost deny needs-server", type: "button", text: "Decline", onclick: () => answer("decline") }),
      h("button", { class: "ghost dismiss needs-server", type: "button", text: "Dismiss", onclick: () => answer("cancel") }),
      h("span", { class: "card-state muted" }),
    ),
  ));
  return card;
}

// A paused invocation's decisions wait in the store (no event yet): show them on the cards.
async function syncApprovals() {
  const inv = ui.cur;
  try {
    const listed = await read(`${invPath(inv.id)}/approvals`);
    if (ui.cur !== inv) return;
    for (const a of listed.approvals) if (a.state !== "open") settleCard(a.approval_id, a.state, a.decided_by ? `by ${a.decided_by}` : "");
  } catch { /* the cards stay as they are */ }
}

// A decided (or closed) gate: the card shrinks to what was decided, with the arguments used.
function settleCard(gate, state, note, args) {
  const card = ui.blocks.get(`approval:${gate}`);
  if (!card) return;
  if (card.dataset.kind === "input") {  // the call ran on: the card keeps the answer sent
    card.classList.remove("open");
    card.classList.add("settled");
    card.dataset.state = state;
    for (const el of card.querySelectorAll("button, textarea, input")) el.disabled = true;
    card.querySelector(".final-label").textContent = args ? "Answered with" : "";
    card.querySelector(".final-args").textContent = args ? pretty(args) : "";
    card.querySelector(".card-state").replaceChildren(statusBadge(state), note ? ` ${note}` : "");
    return;
  }
  if (state !== "approved") {
    // Its tool call never ran: the chip says so (and why).
    const chip = ui.blocks.get(`turn:${ui.cur.run}:${card.dataset.path}:${card.dataset.turn}`)?.querySelector(`[data-call="${CSS.escape(card.dataset.call)}"]`);
    if (chip) chip.querySelector(".tool-state").textContent = `not run (${state})`;
  }
  card.classList.remove("open");
  card.classList.add("settled");
  card.dataset.state = state;
  for (const el of card.querySelectorAll("button, textarea")) el.disabled = true;
  // The arguments stay on the card whatever the ending: those it ran with, or those asked.
  const approved = state === "approved";
  card.querySelector(".final-label").textContent = approved ? "Ran with" : "Asked to run with";
  card.querySelector(".final-args").textContent = pretty(approved && args ? args : card.querySelector(".args-edit").value);
  const paused = ui.cur?.ended?.status === "paused";
  card.querySelector(".card-state").replaceChildren(statusBadge(state), note ? ` ${note}` : "", paused && ["approved", "denied"].includes(state) ? " · resume to continue" : "");
}

// ---- outcomes, stop, resume ----------------------------------------------------------------

function outcomeCard(d, last) {
  const u = d.usage || {};
  const inv = ui.cur;
  // Token counts only as the model server reported them: an answer cut off mid-stream has
  // none (not "0 in · 0 out" beside the text it streamed).
  const counted = u.input_tokens || u.output_tokens;
  const card = h("div", { class: `card outcome st-${d.status}`, dataset: { status: d.status, seq: d.seq ?? "" } },
    h("div", { class: "card-title" }, statusBadge(d.status), d.reason ? h("span", { class: "reason", text: ` ${d.reason}` }) : null, d.synthesized ? h("span", { class: "muted", text: " (the server lost track)" }) : null,
      h("button", { class: "link small-text show-events", type: "button", text: "events", title: "Show this answer's events", onclick: () => showTimeline(inv) })),
    h("div", { class: "facts small-text" },
      counted ? h("span", { class: "tokens", text: `${u.input_tokens ?? 0} in · ${u.output_tokens ?? 0} out tokens` }) : null,
      u.requests ? h("span", { text: `${u.requests} model request${u.requests === 1 ? "" : "s"}` }) : null,
      d.cancelled_by ? h("span", { text: `stopped by ${d.cancelled_by}` }) : null,
      d.pending_approvals && d.pending_approvals.length ? h("span", { text: `waiting for ${d.pending_approvals.length} approval${d.pending_approvals.length === 1 ? "" : "s"}` }) : null,
    ),
    d.error ? h("pre", { class: "card-error", text: `${d.error.type}: ${d.error.message}` }) : null,
  );
  if (last && d.status !== "completed" && !d.synthesized) {
    const paused = d.status === "paused";
    card.append(h("div", { class: "card-actions" },
      h("button", { class: "primary resume needs-server", type: "button", text: "Resume", onclick: resume }),
      paused ? h("button", { class: "ghost end needs-server", type: "button", text: "Cancel it", onclick: endPaused }) : null,
      h("span", { class: "muted small-text", text: paused ? "decide above, then resume" : "continue where it stopped" }),
    ));
  }
  $("messages").append(card);
  for (const old of document.querySelectorAll(".outcome .resume")) if (!card.contains(old)) old.closest(".card-actions").remove();
}

function setStatus(status, label) {
  const badge = $("chat-status");
  badge.hidden = !status;
  badge.className = `badge ${status}`;
  badge.classList.toggle("stale", link.down);
  badge.textContent = label || status;
}

const MODES = ["after_turn", "after_tools", "immediate"]; // weakest first: modes only strengthen
const MODE_TEXT = { after_turn: "after the turn", after_tools: "after the tools", immediate: "now" };
function strongest(a, b) {
  return MODES.indexOf(a) >= MODES.indexOf(b) ? a : b;
}

// The status of a run that has not ended: waiting for a person, stopping, or running.
function drawStatus() {
  const inv = ui.cur;
  if (!inv || inv.ended) return;
  if (ui.sending) return setStatus("stopping", "interrupting…");
  if (inv.stopping) return setStatus("stopping", `stopping ${MODE_TEXT[inv.stopping]}`);
  const gates = [...ui.blocks].filter(([key, el]) => key.startsWith("approval:") && el.classList.contains("open"));
  if (gates.length) return setStatus("waiting", "waiting for approval");
  setStatus("running");
}

// Stop and its mode, for the current run: a stop asked at a safe point can be made
// stronger ("Stop now"); an immediate one waits for the ending.  A new run starts afresh.
function drawStop() {
  const inv = ui.cur;
  const select = $("stop-mode");
  if (!inv) return;
  if (ui.stopFor !== `${inv.id}:${inv.run}`) {
    ui.stopFor = `${inv.id}:${inv.run}`; // each run (a resumed one too) starts at "immediately"
    select.value = "immediate";
  }
  const asked = inv.stopping;
  for (const option of select.options) option.disabled = Boolean(asked) && MODES.indexOf(option.value) <= MODES.indexOf(asked);
  if (asked && select.selectedOptions[0]?.disabled) select.value = "immediate";
  const stop = $("stop");
  if (asked === "immediate" || ui.sending) {
    stop.disabled = true;
    stop.textContent = "Stopping…";
  } else {
    able(stop, true);
    stop.textContent = asked ? "Stop now" : "Stop";
    stop.title = asked ? `A stop ${MODE_TEXT[asked]} was asked: this makes it stronger` : "";
  }
}

function setRunning(running) {
  $("stop-group").hidden = !running;
  const usable = Boolean(ui.mode && ui.app);
  $("message").disabled = !usable;
  able($("send"), usable);
  able($("new-session"), usable);
  $("app").disabled = !ui.apps.length;
  $("send").title = running ? "Send now: the answer in progress stops and this message is answered" : "";
  $("message").placeholder = running ? "Message the agent…  (sending interrupts the answer)" : "Message the agent…  (Enter sends, Shift+Enter for a new line)";
  if (running) {
    drawStop();
    drawStatus();
  }
}

async function stop() {
  const inv = ui.cur;
  if (!inv || inv.ended) return;
  const mode = $("stop-mode").value;
  $("stop").disabled = true;
  $("stop").textContent = "Stopping…";
  try {
    // Answered at once (202): the stream shows the stop and then the ending.
    await api("POST", `${invPath(inv.id)}:cancel`, { mode, reason: "stopped from the dev UI", wait: false });
  } catch (err) {
    sayError(err);
    if (ui.cur === inv) drawStop();
    return;
  }
  if (ui.cur !== inv || inv.ended) return;
  inv.stopping = strongest(inv.stopping, mode);
  drawStop();
  drawStatus();
}

// A paused invocation is ended by a cancel at once; its new ending is then followed in.
async function endPaused() {
  const inv = ui.cur;
  try {
    await api("POST", `${invPath(inv.id)}:cancel`, { reason: "cancelled from the dev UI" });
  } catch (err) { return sayError(err); }
  for (const b of document.querySelectorAll(".outcome .card-actions")) b.remove();
  inv.ended = null;
  follow();
}

async function resume() {
  const inv = ui.cur;
  if (!inv) return;
  for (const b of document.querySelectorAll(".outcome .resume")) b.disabled = true;
  try {
    await api("POST", `${invPath(inv.id)}:resume`, {});
  } catch (err) {
    for (const b of document.querySelectorAll(".outcome .resume")) able(b, true);
    return sayError(err);
  }
  for (const b of document.querySelectorAll(".outcome .card-actions")) b.remove();
  inv.ended = null;
  follow();
}

// ---- sending and following -------------------------------------------------------------------

function stopFollowing() {
  if (ui.follower) ui.follower.abort();
  ui.follower = null;
}

// A message sent while an answer runs: that answer is cancelled first (immediately, reason
// "preempted by a new message", as a live session and the chat do) and its ending drawn;
// false if the cancel could not be asked.
async function preempt(inv) {
  drawStop();
  drawStatus();
  let out;
  try {
    out = await api("POST", `${invPath(inv.id)}:cancel`, { mode: "immediate", reason: PREEMPTED });
  } catch (err) {
    sayError(err);
    return false;
  }
  // The answer comes once the ending is stored; the stream brings it a moment later.
  for (let i = 0; i < 40 && !inv.ended && ui.cur === inv; i++) await sleep(50);
  if (ui.cur === inv && !inv.ended && out && out.status) {
    stopFollowing();
    const seq = out.event_id ? Number(out.event_id.split(".")[0]) : undefined;
    onFrame({ id: null, event: "ended", data: { ...out, kind: "ended", seq } });
  }
  return true;
}

async function send(text) {
  if (ui.sending) return;
  ui.sending = true;
  try {
    await sendNow(text);
  } finally {
    if (ui.sending) {
      ui.sending = false;
      if (ui.cur && !ui.cur.ended) {
        drawStop();
        drawStatus();
      }
    }
  }
}

async function sendNow(text) {
  const running = ui.cur && !ui.cur.ended && ui.follower && ui.cur.session === ui.session;
  if (running && !(await preempt(ui.cur))) return;
  if (!ui.session) {
    try {
      const s = await api("POST", sessionsPath(), {});
      await loadSessions(s.id);
    } catch (err) { return sayError(err); }
  }
  stopFollowing();
  const ctl = (ui.follower = new AbortController());
  let response;
  for (let attempt = 0; ; attempt++) {
    try {
      response = await request("POST", "run_sse", {
        body: { app_name: ui.app, user_id: user(), session_id: ui.session, input: text },
        signal: ctl.signal,
      });
      break;
    } catch (err) {
      // Just preempted: the session is free once the cut-off answer's ending is stored,
      // which another process may take a moment to do.
      if (running && err.code === "session_busy" && attempt < 20) {
        await sleep(100);
        continue;
      }
      if (err.name !== "AbortError") sayError(err);
      return;
    }
  }
  if (ui.follower !== ctl) return;
  $("message").value = "";
  // Whatever was shown goes to history; the new invocation is drawn live.
  begin(newInvocation(response.headers.get("X-Invocation-Id")));
  ui.sending = false; // sent: the new answer is the one Stop and Send act on now
  save();
  titleIfNone(ui.session, text);
  const inv = ui.cur;
  let done;
  try {
    done = await stream(response, ctl);
  } catch (err) {
    return sayError(err);
  }
  if (!done && !ctl.signal.aborted && ui.cur === inv) follow();
}

// Follow the current invocation from the last event seen.  Cut off (the server went away, or
// its stream ended before its terminal frame), it tries again from the last event seen in the
// connection's rounds, so a run that another process took over meanwhile goes on here, with
// nothing shown twice or missed.  It stops at the ending, or when another follower (or
// another session) replaces it.
async function follow() {
  const inv = ui.cur;
  stopFollowing();
  const ctl = (ui.follower = new AbortController());
  const gone = () => ctl.signal.aborted || ui.cur !== inv;
  setRunning(true);
  for (;;) {
    try {
      const response = await request("GET", `${invPath(inv.id)}/events`, { signal: ctl.signal, lastEventId: inv.lastId });
      if (response.status === 204 ? await endedAway(inv, ctl) : await stream(response, ctl)) return;
      if (gone()) return;
      if (response.status !== 204) linkLost(new Unreachable()); // cut off before its ending
    } catch (err) {
      if (err.name === "AbortError" || gone()) return;
      if (!retryable(err)) {
        sayError(err);
        break;
      }
      linkLost(err);
    }
    if (!(await nextAttempt(ctl.signal)) || gone()) return;
  }
  if (ui.follower === ctl) ui.follower = null;
  setRunning(false);
}

// Read one SSE answer into the current invocation; true once its terminal frame came.  A cut
// (or an abort) is false; anything else that goes wrong is thrown.
async function stream(response, ctl) {
  const inv = ui.cur;
  let done = false;
  inv.following = true;
  save();
  try {
    await readFrames(response, (frame) => {
      if (ctl.signal.aborted || ui.cur !== inv) return;
      onFrame(frame);
      if (frame.event === "ended") done = true;
    });
  } catch (err) {
    if (err.name !== "AbortError" && !(err instanceof Unreachable)) throw err;
  }
  if (done && ui.cur === inv) followed(inv, ctl);
  return done;
}

// The server answered 204: the invocation is not running and nothing came after the last
// event seen.  Its ending is drawn from its status unless the page has it already.  True once
// that is done; false if it runs again (resumed meanwhile): follow it on.
async function endedAway(inv, ctl) {
  const info = await read(invPath(inv.id), ctl.signal);
  if (ctl.signal.aborted || ui.cur !== inv) return true;
  if (info.status === "running") return false;
  const out = info.outcome;
  const seq = out && out.event_id ? Number(out.event_id.split(".")[0]) : undefined;
  if (out && !(inv.ended && inv.ended.seq === seq)) {
    onFrame({ id: null, event: "ended", data: { ...out, kind: "ended", seq } });
  }
  followed(inv, ctl);
  setRunning(false);
  return true;
}

function followed(inv, ctl) {
  inv.following = false;
  save();
  if (ui.follower === ctl) ui.follower = null;
  loadSessionsQuietly();
}

async function loadSessionsQuietly() {
  // Bring the sidebar's times up to date without redrawing the conversation.
  try {
    const sessions = await api("GET", sessionsPath());
    for (const s of sessions) {
      ui.sessions.set(s.id, s);
      const b = document.querySelector(`.session[data-session="${CSS.escape(s.id)}"]`);
      if (!b) continue;
      b.querySelector(".session-time").textContent = ago(s.lastUpdateTime);
      const t = b.querySelector(".session-title");
      t.textContent = s.title || "New session";
      t.classList.toggle("untitled", !s.title);
    }
    drawTitle();
  } catch { /* the sidebar can wait */ }
}

// ---- drawers ----------------------------------------------------------------------------------
//
// Where a panel does not fit beside the conversation (the Events panel below 1100 px, the
// sessions below 760 px) it is a drawer, opened from the conversation's head; the CSS decides
// which are drawers, so these classes do nothing on a wide screen.

function openDrawer(which) {
  closeDrawers();
  document.body.classList.add(`show-${which}`);
  $(`show-${which}`).setAttribute("aria-expanded", "true");
}
function toggleDrawer(which) {
  if (document.body.classList.contains(`show-${which}`)) closeDrawers();
  else openDrawer(which);
}
function closeDrawers() {
  for (const which of ["sessions", "events"]) {
    document.body.classList.remove(`show-${which}`);
    $(`show-${which}`).setAttribute("aria-expanded", "false");
  }
}

// ---- wiring -----------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("token").value = localStorage.getItem("ta.token") || "";
  $("user").value = localStorage.getItem("ta.user") || "";
  const hash = new URLSearchParams(location.hash.slice(1));
  if (hash.get("app")) ui.app = hash.get("app");
  $("auth").addEventListener("submit", (e) => { e.preventDefault(); connect(); });
  $("app").addEventListener("change", () => {
    ui.app = $("app").value;
    localStorage.setItem("ta.app", ui.app);
    loadSessions(null);
  });
  $("new-session").addEventListener("click", newSession);
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("message").value.trim();
    if (text && window.taLive?.sendText(text)) $("message").value = ""; // live: over its socket
    else if (text && ui.app && !link.down) send(text); // Enter, while Send waits for the server
  });
  $("message").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", stop);
  $("show-sessions").addEventListener("click", () => toggleDrawer("sessions"));
  $("show-events").addEventListener("click", () => toggleDrawer("events"));
  for (const b of document.querySelectorAll(".close-drawer")) b.addEventListener("click", closeDrawers);
  $("scrim").addEventListener("click", closeDrawers);
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") closeDrawers(); });
  $("mode").addEventListener("click", () => document.body.classList.toggle("show-auth"));
  window.addEventListener("online", retryNow); // the network is back: no need to wait
  connect();
});
