// The trio_agents dev UI: a page that drives the server through its public HTTP API only.
//
// Routes it uses: GET /list-apps; GET/POST /apps/{app}/users/{user}/sessions[/{id}];
// POST /run_sse (start and stream); GET /invocations/{id}/events (reattach, Last-Event-ID);
// GET /invocations/{id}; POST /invocations/{id}:cancel and :resume;
// GET/POST /invocations/{id}/approvals[/{approval_id}].
//
// The invocation being shown ("current") is kept in sessionStorage as one snapshot: its log
// of events (text deltas merged per turn) and the id of the last event seen.  After a reload
// the page draws that log again and follows on with Last-Event-ID = that id, so nothing is
// lost or shown twice.  EventSource cannot send a bearer token, so streams are read with
// fetch() and parsed here.
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
  blocks: new Map(), // chat blocks of the current invocation, by key
};

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

function headers(extra) {
  const out = { ...extra };
  if (token()) out.Authorization = `Bearer ${token()}`;
  return out;
}

async function request(method, path, { body, signal, lastEventId } = {}) {
  const hs = headers(body === undefined ? {} : { "Content-Type": "application/json" });
  if (lastEventId) hs["Last-Event-ID"] = lastEventId;
  const response = await fetch(new URL(path, ROOT), {
    method,
    headers: hs,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  });
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
    const { value, done } = await reader.read();
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
  banner.hidden = false;
}
const sayError = (err) => say(err instanceof ApiError ? `${err.code}: ${err.message}` : String(err));

// ---- connecting, apps, sessions --------------------------------------------------------------

async function connect() {
  localStorage.setItem("ta.token", token());
  localStorage.setItem("ta.user", user());
  $("banner").hidden = true;
  try {
    ui.apps = await api("GET", "list-apps");
    ui.mode = token() ? "token" : "dev";
  } catch (err) {
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
  const pill = $("mode");
  pill.textContent = { token: "token", dev: "insecure dev", "": "not connected" }[ui.mode];
  pill.className = `pill ${ui.mode || "off"}`;
  if (!ui.apps.includes(ui.app)) ui.app = ui.apps[0] || "";
  $("app").replaceChildren(...ui.apps.map((a) => h("option", { value: a, text: a, selected: a === ui.app })));
  const wanted = new URLSearchParams(location.hash.slice(1)).get("session");
  await loadSessions(wanted);
}

async function loadSessions(select) {
  const list = $("session-list");
  if (!ui.app) {
    list.replaceChildren();
    return showSession(null);
  }
  let sessions = [];
  try {
    sessions = await api("GET", sessionsPath());
  } catch (err) { sayError(err); }
  sessions.sort((a, b) => b.lastUpdateTime - a.lastUpdateTime);
  list.replaceChildren(...sessions.map((s) => h("li", null,
    h("button", {
      class: "session" + (s.id === select ? " active" : ""),
      dataset: { session: s.id },
      onclick: () => openSession(s.id),
    }, h("span", { class: "session-id", text: s.id }), h("span", { class: "muted small-text", text: ago(s.lastUpdateTime) })),
  )));
  if (!sessions.length) list.append(h("li", { class: "muted empty-note", text: "No sessions yet." }));
  if (select && sessions.some((s) => s.id === select)) await openSession(select);
  else showSession(null);
}

async function newSession() {
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
  stopFollowing();
  ui.session = id;
  ui.cur = null;
  ui.blocks.clear();
  markActive();
  $("chat-title").textContent = id ? `Session ${id}` : ui.app ? "No session yet" : "Not connected";
  setStatus("");
  $("events").replaceChildren();
  $("inv-id").textContent = "";
  renderEmpty();
  setRunning(false);
}

// Open a session: its history, then the current invocation (one this tab was following, or
// one still running or paused) drawn and followed.
async function openSession(id) {
  showSession(id);
  let session;
  try {
    session = await api("GET", `${sessionsPath()}/${enc(id)}`);
  } catch (err) { return sayError(err); }
  if (ui.session !== id) return;
  const saved = restore();
  let current = saved && saved.app === ui.app && saved.session === id ? saved : null;
  const last = session.events.length ? session.events[session.events.length - 1].invocationId : null;
  if (!current && last) {
    try {
      const info = await api("GET", invPath(last));
      if (!FINAL.has(info.status)) current = newInvocation(last);
    } catch { /* not ours, or gone: just the history */ }
  }
  renderHistory(session.events.filter((e) => !current || e.invocationId !== current.id));
  if (current) {
    ui.cur = current;
    for (const entry of current.log) apply(entry, true);
    // A paused one is not followed: its stream would end at once, with no new ending.
    if (!current.ended || current.following) follow();
    else setRunning(false);
  }
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

function renderHistory(entries) {
  const box = $("messages");
  box.replaceChildren();
  if (!entries.length) return renderEmpty();
  for (const e of entries) {
    const m = e.message;
    if (!m || m.kind === "tool_results") continue;
    if (m.kind === "user") box.append(bubble("user", m.text));
    else {
      const b = bubble("assistant", m.text || "");
      for (const call of m.tool_calls || []) b.append(toolChip(call));
      if (e.status && e.status !== "completed") {
        b.append(h("div", { class: "meta" }, statusBadge(e.status), e.reason ? ` ${e.reason}` : "", e.interrupted ? " · interrupted" : ""));
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
  return { id, app: ui.app, session: ui.session, log: [], lastId: null, run: 0, ended: null, following: true };
}

function save() {
  if (ui.cur) sessionStorage.setItem("ta.current", JSON.stringify(ui.cur));
}
function restore() {
  try { return JSON.parse(sessionStorage.getItem("ta.current")); } catch { return null; }
}

// One frame of the stream: update the snapshot (log and last id), then draw it.
function onFrame(frame) {
  const inv = ui.cur;
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
  apply(entry, false);
  save();
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
  timelineRow(entry);
  switch (d.kind) {
    case "started":
      inv.run += 1;
      $("inv-id").textContent = d.invocation_id;
      if (d.resumed) block(`resumed:${d.seq}`, () => h("div", { class: "divider labelled", text: resumedText(d) }));
      else block("input", () => bubble("user", d.input));
      setRunning(true);
      break;
    case "turn_finished": {
      const el = turnBlock(d.path, d.turn);
      el.classList.remove("streaming");
      const text = el.querySelector(".text");
      if (d.message.text !== text.textContent) {
        // The turn's text is the truth; streamed deltas that disagree mean events were lost
        // or doubled on the way (the browser tests fail on this warning).
        if (text.textContent) console.warn(`turn ${d.turn}: the streamed text differs from the turn's text`);
        text.textContent = d.message.text;
      }
      for (const call of d.message.tool_calls) if (!el.querySelector(`[data-call="${CSS.escape(call.id)}"]`)) el.append(toolChip(call));
      if (!d.message.text && !d.message.tool_calls.length) el.remove();
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
    case "approval_requested":
      approvalCard(d);
      break;
    case "approval_decided":
      settleCard(d.approval_id, d.state, d.by ? `by ${d.by}` : "", d.arguments);
      break;
    case "ended":
      for (const el of document.querySelectorAll(".messages .streaming")) {
        el.classList.remove("streaming");
        el.classList.add("interrupted"); // its turn never finished
      }
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
  scrollDown();
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
      error.textContent = err instanceof ApiError ? `${err.code}: ${err.message}` : String(err);
      error.hidden = false;
    } finally { card.classList.remove("busy"); }
  };
  const card = block(`approval:${d.approval_id}`, () => h("div", { class: "card approval open", dataset: { approvalId: d.approval_id } },
    h("div", { class: "card-title" }, h("span", { class: "badge open", text: "approval" }), " ", h("b", { class: "mono", text: d.call.name }), d.description ? h("span", { class: "muted", text: ` — ${d.description}` }) : null),
    d.prompt ? h("p", { text: d.prompt }) : null,
    h("label", { class: "small-text muted edit-hint", text: "Arguments (edit before approving)" }),
    args,
    h("pre", { class: "final-args mono" }),
    error,
    h("div", { class: "card-actions" },
      h("button", { class: "primary approve", type: "button", text: "Approve", onclick: () => decide(true) }),
      h("button", { class: "ghost deny", type: "button", text: "Deny", onclick: () => decide(false) }),
      h("span", { class: "card-state muted" }),
    ),
  ));
  return card;
}

// A paused invocation's decisions wait in the store (no event yet): show them on the cards.
async function syncApprovals() {
  const inv = ui.cur;
  try {
    const listed = await api("GET", `${invPath(inv.id)}/approvals`);
    if (ui.cur !== inv) return;
    for (const a of listed.approvals) if (a.state !== "open") settleCard(a.approval_id, a.state, a.decided_by ? `by ${a.decided_by}` : "");
  } catch { /* the cards stay as they are */ }
}

// A decided (or closed) gate: the card shrinks to what was decided, with the arguments used.
function settleCard(gate, state, note, args) {
  const card = ui.blocks.get(`approval:${gate}`);
  if (!card) return;
  card.classList.remove("open");
  card.classList.add("settled");
  card.dataset.state = state;
  for (const el of card.querySelectorAll("button, textarea")) el.disabled = true;
  if (state === "approved") card.querySelector(".final-args").textContent = pretty(args || card.querySelector(".args-edit").value);
  const paused = ui.cur?.ended?.status === "paused";
  card.querySelector(".card-state").replaceChildren(statusBadge(state), note ? ` ${note}` : "", paused && ["approved", "denied"].includes(state) ? " · resume to continue" : "");
}

// ---- outcomes, stop, resume ----------------------------------------------------------------

function outcomeCard(d, last) {
  const u = d.usage || {};
  const card = h("div", { class: `card outcome st-${d.status}`, dataset: { status: d.status, seq: d.seq ?? "" } },
    h("div", { class: "card-title" }, statusBadge(d.status), d.reason ? h("span", { class: "reason", text: ` ${d.reason}` }) : null, d.synthesized ? h("span", { class: "muted", text: " (the server lost track)" }) : null),
    h("div", { class: "facts small-text" },
      h("span", { text: `${u.input_tokens ?? 0} in · ${u.output_tokens ?? 0} out tokens` }),
      u.requests ? h("span", { text: `${u.requests} model request${u.requests === 1 ? "" : "s"}` }) : null,
      d.cancelled_by ? h("span", { text: `stopped by ${d.cancelled_by}` }) : null,
      d.pending_approvals && d.pending_approvals.length ? h("span", { text: `waiting for ${d.pending_approvals.length} approval${d.pending_approvals.length === 1 ? "" : "s"}` }) : null,
    ),
    d.error ? h("pre", { class: "card-error", text: `${d.error.type}: ${d.error.message}` }) : null,
  );
  if (last && d.status !== "completed" && !d.synthesized) {
    const paused = d.status === "paused";
    card.append(h("div", { class: "card-actions" },
      h("button", { class: "primary resume", type: "button", text: "Resume", onclick: resume }),
      paused ? h("button", { class: "ghost end", type: "button", text: "Cancel it", onclick: endPaused }) : null,
      h("span", { class: "muted small-text", text: paused ? "decide above, then resume" : "continue where it stopped" }),
    ));
  }
  $("messages").append(card);
  for (const old of document.querySelectorAll(".outcome .resume")) if (!card.contains(old)) old.closest(".card-actions").remove();
}

function setStatus(status) {
  const badge = $("chat-status");
  badge.hidden = !status;
  badge.className = `badge ${status}`;
  badge.textContent = status;
}

function setRunning(running) {
  if (running) setStatus("running");
  $("stop-group").hidden = !running;
  $("send").hidden = running;
  const usable = Boolean(ui.mode && ui.app);
  $("message").disabled = running || !usable;
  $("send").disabled = !usable;
  $("new-session").disabled = !usable;
  $("app").disabled = !ui.apps.length;
  $("message").placeholder = running ? "Waiting for the answer…  (Stop ends it)" : "Message the agent…  (Enter sends, Shift+Enter for a new line)";
  $("stop").disabled = false;
  $("stop").textContent = "Stop";
}

async function stop() {
  const inv = ui.cur;
  if (!inv) return;
  $("stop").disabled = true;
  $("stop").textContent = "Stopping…";
  try {
    await api("POST", `${invPath(inv.id)}:cancel`, { mode: $("stop-mode").value, reason: "stopped from the dev UI" });
  } catch (err) {
    sayError(err);
    $("stop").disabled = false;
    $("stop").textContent = "Stop";
  }
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
    for (const b of document.querySelectorAll(".outcome .resume")) b.disabled = false;
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

async function send(text) {
  if (!ui.session) {
    try {
      const s = await api("POST", sessionsPath(), {});
      await loadSessions(s.id);
    } catch (err) { return sayError(err); }
  }
  stopFollowing();
  const ctl = (ui.follower = new AbortController());
  let response;
  try {
    response = await request("POST", "run_sse", {
      body: { app_name: ui.app, user_id: user(), session_id: ui.session, input: text },
      signal: ctl.signal,
    });
  } catch (err) {
    if (err.name !== "AbortError") sayError(err);
    return;
  }
  $("message").value = "";
  // Whatever was shown goes to history; the new invocation is drawn live.
  if (ui.cur) {
    ui.blocks.clear();
    $("messages").append(h("div", { class: "divider" }));
  }
  ui.cur = newInvocation(response.headers.get("X-Invocation-Id"));
  $("events").replaceChildren();
  save();
  const inv = ui.cur;
  if (!(await stream(response, ctl)) && !ctl.signal.aborted && ui.cur === inv) follow();
}

// Follow the current invocation from the last event seen, again after a cut-off.
async function follow() {
  const inv = ui.cur;
  stopFollowing();
  const ctl = (ui.follower = new AbortController());
  setRunning(true);
  for (let attempt = 0; ; attempt++) {
    try {
      const response = await request("GET", `${invPath(inv.id)}/events`, { signal: ctl.signal, lastEventId: inv.lastId });
      if (await stream(response, ctl)) return;
    } catch (err) {
      if (err.name === "AbortError") return;
      if (err instanceof ApiError && err.status < 500) { sayError(err); break; }
    }
    if (ctl.signal.aborted || ui.cur !== inv) return;
    await new Promise((ok) => setTimeout(ok, Math.min(8000, 500 * 2 ** attempt)));
  }
  setRunning(false);
}

// Read one SSE answer into the current invocation; true once its terminal frame came (or
// the server answered 204: it ended where we were, nothing more will come).
async function stream(response, ctl) {
  const inv = ui.cur;
  let done = response.status === 204;
  inv.following = true;
  save();
  try {
    if (!done) {
      await readFrames(response, (frame) => {
        if (ctl.signal.aborted || ui.cur !== inv) return;
        onFrame(frame);
        if (frame.event === "ended") done = true;
      });
    }
  } catch (err) {
    if (err.name === "AbortError") return false;
  }
  if (done && ui.cur === inv) {
    inv.following = false;
    save();
    if (ui.follower === ctl) ui.follower = null;
    loadSessionsQuietly();
  }
  return done;
}

async function loadSessionsQuietly() {
  // Bring the sidebar's times up to date without redrawing the conversation.
  try {
    const sessions = await api("GET", sessionsPath());
    for (const s of sessions) {
      const b = document.querySelector(`.session[data-session="${CSS.escape(s.id)}"] .small-text`);
      if (b) b.textContent = ago(s.lastUpdateTime);
    }
  } catch { /* the sidebar can wait */ }
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
    if (text && ui.app) send(text);
  });
  $("message").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", stop);
  connect();
});
