// Outpost console: plain JavaScript, no dependencies, nothing loaded from
// elsewhere. The token lives in sessionStorage and goes in the Authorization
// header and in the websocket's first message, never in a URL.
"use strict";

const $ = (id) => document.getElementById(id);
// The stream's control messages; every other message is an event.
const CONTROL = new Set(["ready", "subscribed", "resumed", "window_exceeded", "error", "dropped"]);
const state = {
  token: sessionStorage.getItem("outpost.token") || "",
  operator: sessionStorage.getItem("outpost.operator") || "",
  runs: new Map(),       // id -> run
  selected: "",
  graphs: new Map(),     // agent -> {nodes}
  current: new Map(),    // run id -> node to highlight
  lastSeq: null,         // null until the stream first says where it stands
  ws: null,
  statusTimer: 0,
  onReady: null,         // resolves sign-in's wait for the stream
  touched: null,         // runs evented while loadRuns reads the list
  drawing: "",           // the run whose history select is reading
  selects: 0,            // counts selects, so that only the last one draws
  streams: new Map(),    // run id + node -> <span> collecting tokens
  log: new Map(),        // run id -> its events seen by this page, to redraw a transcript
  question: new Map(),   // run id -> the id of the interrupt its review shows
  drafts: new Map(),     // run id -> Map(interrupt id -> {edit, reason}) typed and not sent
  deciding: new Set(),   // run id + interrupt id of the decisions this page is sending
  dropped: new Map(),    // run id -> why its unsent drafts were discarded, said when it is next shown
  waiting: null,         // {runs, questions}: what waits for review in the whole store, as the appliance counts it
  waitingTimer: 0,
  unsure: new Map(),     // run id -> {interrupt, kind}: a decision sent while the appliance did not answer
  follow: new Map(),     // run id -> the read of the run that an event of it waits on (follow)
  drawn: new WeakMap(),  // event -> the transcript lines drawn for it, to redraw once it is followed
  // How much of the store the list reads: a page of runs, and the pages
  // of runs waiting for review. Fields, so that a test reaches the limits
  // with a few runs.
  pageSize: 1000,
  reviewPages: 20,
  listed: 500,           // how many of the newest runs the list keeps
  older: false,          // whether the store holds runs older than those listed
};

async function api(method, path, body) {
  const headers = { "Authorization": "Bearer " + state.token };
  // A header carries bytes, and fetch refuses a letter past Latin-1 (a
  // name in Chinese, Greek, Polish): the name goes as its UTF-8 bytes.
  if (state.operator) headers["X-Operator"] = String.fromCharCode(...new TextEncoder().encode(state.operator));
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let res;
  try {
    res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (e) {
    // No answer at all (the appliance stopped or restarting, the network
    // down): the browser's own words ("Failed to fetch") say nothing of it.
    const err = new Error("Cannot reach the appliance (" + e.message + ")");
    err.status = 0;
    err.unreachable = true;
    throw err;
  }
  let data = null;
  try { data = await res.json(); } catch (e) { data = null; }
  // A token that stops being valid (the appliance made a new one) ends
  // the session: every action would fail from here on.
  if (res.status === 401 && !$("main").hidden) signOut("The token is no longer valid (the appliance may have made a new one): sign in again.");
  if (!res.ok && res.status !== 202) {
    const err = new Error(data && data.error ? data.error.message : res.statusText);
    err.status = res.status;
    err.code = data && data.error ? data.error.code : "";
    throw err;
  }
  return data;
}

function show(el, on) { el.hidden = !on; }
function text(el, s) { el.textContent = s; }
function el(tag, cls, s) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (s !== undefined) e.textContent = s;
  return e;
}
function short(v, n) {
  const s = typeof v === "string" ? v : JSON.stringify(v);
  return s.length > n ? s.slice(0, n - 1) + "…" : s;
}

// ---- sign in ----
$("login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  state.token = $("token").value.trim();
  state.operator = $("operator").value.trim();
  await signIn();
});
// Signing out by hand is leaving the console: the next person to sign
// in types their own name, or their decisions would be recorded under
// this one's. (A token the appliance refuses keeps the name: the same
// person signs in again.)
$("logout").addEventListener("click", () => {
  sessionStorage.removeItem("outpost.operator");
  state.operator = "";
  $("operator").value = "";
  signOut("You signed out.");
});

// signOut takes the operator back to the sign-in, saying why, and stops
// everything that would go on using the token. The replies typed and not
// sent are discarded, saying how many: the next person to sign in on this
// tab must not find them, nor send them under their own name.
function signOut(why) {
  sessionStorage.removeItem("outpost.token");
  state.token = "";
  let unsent = 0;
  for (const d of state.drafts.values()) unsent += d.size;
  state.drafts.clear();
  state.dropped.clear();
  state.unsure.clear();
  $("edit-value").value = "";
  $("reason").value = "";
  delete $("interrupt").dataset.interrupt;
  delete $("interrupt").dataset.run;
  state.selected = "";
  show($("detail"), false);
  // A dialog left open would hold the page (a modal makes the rest inert):
  // the sign-in could not be typed into.
  $("cancel-confirm").close();
  if (unsent) why += " Your unsent " + (unsent === 1 ? "reply to a review question was" : "replies to " + unsent + " review questions were") + " discarded.";
  clearInterval(state.statusTimer);
  if (state.ws) {
    state.ws.onclose = null;
    state.ws.close();
    state.ws = null;
  }
  pill("stream", "down", "stream: signed out", "");
  $("token").value = "";
  text($("login-error"), why);
  show($("login-error"), true);
  show($("login"), true);
  show($("main"), false);
}

async function signIn() {
  show($("login-error"), false);
  try {
    await api("GET", "/api/v1/runs?limit=1");
  } catch (e) {
    text($("login-error"), e.status === 401 ? "That token is not valid." : e.unreachable ? e.message + "." : "The appliance refused: " + e.message);
    show($("login-error"), true);
    show($("login"), true);
    show($("main"), false);
    return;
  }
  sessionStorage.setItem("outpost.token", state.token);
  sessionStorage.setItem("outpost.operator", state.operator);
  show($("login"), false);
  show($("main"), true);
  if (state.ws) {
    state.ws.onclose = null;
    state.ws.close();
  }
  // The stream first, then the list: a run that starts in between is then
  // told by the stream, where it would otherwise be in neither. A stream
  // that cannot open does not hold the list up for long.
  const ready = new Promise((res) => { state.onReady = res; });
  connect();
  await Promise.race([ready, new Promise((res) => setTimeout(res, 5000))]);
  await loadAgents();
  await loadRuns();
  refreshStatus();
  clearInterval(state.statusTimer);
  state.statusTimer = setInterval(refreshStatus, 10000);
}

// ---- status bar ----
async function refreshStatus() {
  try {
    const [h, up] = await Promise.all([api("GET", "/healthz"), api("GET", "/api/v1/uplink")]);
    const b = h.components.bundle || {}, m = h.components.model || {};
    const bi = b.info || {};
    pill("bundle", b.state, "bundle: " + (bi.name ? bi.name + " v" + bi.version + (bi.source === "embedded" ? " (embedded, dev-signed)" : "") : b.detail || "none"), b.detail);
    pill("model", m.state || "ok", "model: " + ((m.info && m.info.model) || "?") + (m.state === "degraded" ? " (degraded)" : ""), m.detail);
    pill("uplink", up.configured ? (up.last_error ? "degraded" : "ok") : "", up.configured ? "uplink backlog: " + up.backlog : "uplink: not configured", up.note || up.last_error || "");
  } catch (e) {
    pill("model", "down", "appliance unreachable", e.message);
  }
}
function pill(id, st, label, title) {
  const p = $(id);
  p.className = "pill " + (st || "");
  text(p, label);
  p.title = title || "";
}

// ---- runs ----
async function loadAgents() {
  const { agents, allowlists } = await api("GET", "/api/v1/agents");
  const sel = $("agent");
  sel.replaceChildren();
  for (const a of agents) {
    const o = el("option", "", a);
    o.value = a;
    // The agent's allowlist, where its bundle says it (null: every tool
    // of the registry).
    if (allowlists && a in allowlists) {
      const l = allowlists[a];
      o.title = l === null ? "tools: every tool of its bundle's registry (no allowlist)"
        : "tools: " + (l.length ? l.join(", ") : "none");
    }
    sel.append(o);
  }
}

// listRuns reads up to pages pages of GET /api/v1/runs with query, newest
// first.
async function listRuns(query, pages) {
  let after = "", all = [], damaged = [], waiting = null, more = false;
  for (let i = 0; i < pages; i++) {
    const page = await api("GET", "/api/v1/runs?limit=" + state.pageSize + "&order=desc" + query + (after ? "&after=" + encodeURIComponent(after) : ""));
    if (page.waiting) waiting = page.waiting;
    all = all.concat(page.runs);
    damaged = damaged.concat(page.damaged || []);
    more = !!page.next;
    if (!page.next) break;
    after = page.next;
  }
  return { all, damaged, waiting, more };
}

async function loadRuns() {
  // Runs the stream tells of while the list is read may be newer than
  // the list has them: they are read again once it is in.
  const touched = state.touched = state.touched || new Set();
  let all, damaged, waiting, more;
  $("runs").setAttribute("aria-busy", "true");
  try {
    // The newest runs are one page, however many the appliance holds.
    [{ all, damaged, more }, waiting] = await Promise.all([listRuns("", 1), listRuns("&status=interrupted", state.reviewPages)]);
  } finally {
    if (state.touched === touched) state.touched = null;
  }
  for (const id of touched) refreshRun(id);
  state.runs.clear();
  for (const r of all.slice(0, state.listed)) state.runs.set(r.id, r);
  state.older = more || all.length > state.listed;
  // The newest runs, and every run waiting for review however old: a
  // review must never drop out of sight.
  for (const r of waiting.all) state.runs.set(r.id, r);
  // The page lists what waits up to 20,000 runs; the count it shows is
  // the appliance's, of the whole store.
  if (waiting.waiting) state.waiting = waiting.waiting;
  for (const r of state.runs.values()) dropDrafts(r);
  // A run with drafts that is no longer listed waits no more: read it,
  // to say what became of them.
  for (const id of state.drafts.keys()) if (!state.runs.has(id)) refreshRun(id);
  // Records the store cannot read are left out of the list: say so, or
  // the list would look whole. The list of reviews reads back further
  // than the newest page: a damaged record either meets is named, once.
  const named = new Map();
  for (const d of damaged.concat(waiting.damaged)) named.set(d.key, d);
  damaged = [...named.values()];
  const keys = damaged.map((d) => d.key);
  text($("runs-damaged"), keys.length + " run record(s) cannot be read and are left out of this list: " +
    short(keys.join(", "), 200) + " (run outpost db check)");
  $("runs-damaged").title = damaged.map((d) => d.error).join("\n");
  show($("runs-damaged"), keys.length > 0);
  renderRuns();
  $("runs").setAttribute("aria-busy", "false");
}

// questions says how many questions a run waiting for review holds, when
// it holds more than one.
function questions(r) {
  const n = (r.interrupts || []).length;
  return n > 1 ? " (" + n + " questions)" : "";
}

function renderRuns() {
  const onlyReview = $("filter-review").checked, onlyFlagged = $("filter-flagged").checked;
  const ul = $("runs");
  ul.replaceChildren();
  const runs = [...state.runs.values()].sort((a, b) => (a.id < b.id ? 1 : -1));
  for (const r of runs) {
    if (onlyReview && r.status !== "interrupted") continue;
    if (onlyFlagged && !(r.flags && r.flags.length)) continue;
    const li = el("li");
    li.dataset.run = r.id;
    // A button, so that the keyboard reaches and opens a run as a mouse does.
    const b = el("button", "run");
    b.type = "button";
    if (r.id === state.selected) {
      li.classList.add("selected");
      b.setAttribute("aria-current", "true");
    }
    const left = el("span");
    left.append(el("span", "", short(r.input === undefined ? r.agent : r.input, 60)), el("span", "thread", r.thread + " · " + r.agent));
    if (r.flags && r.flags.length) {
      const f = el("span", "flags", "⚑ " + short(r.flags.join(", "), 60));
      f.title = "flags: " + r.flags.join(", ");
      left.append(f);
    }
    b.append(left, el("span", "status " + r.status, r.status === "interrupted" ? "waiting for review" + questions(r) : r.held ? "held" : r.status));
    b.addEventListener("click", () => select(r.id));
    li.append(b);
    ul.append(li);
  }
  // The flagged runs are those of the runs the page has read: when the
  // store holds older ones, an empty or short list must not read as all
  // there are.
  text($("runs-flagged-note"), "Flagged runs among the " + state.listed + " newest runs and those waiting for review: older runs " +
    "are not read here (GET /api/v1/runs lists them, with their flags).");
  show($("runs-flagged-note"), onlyFlagged && state.older);
  // The review's count of what waits follows the list.
  const sel = state.runs.get(state.selected);
  if (sel && sel.status === "interrupted" && sel.interrupts && sel.interrupts.length && !$("interrupt").hidden && $("interrupt").dataset.run === sel.id) {
    countQuestions(sel, Math.max(0, sel.interrupts.findIndex((x) => x.id === state.question.get(sel.id))));
  }
}
$("filter-review").addEventListener("change", renderRuns);
$("filter-flagged").addEventListener("change", renderRuns);

$("start-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  show($("start-error"), false);
  if (!$("thread").value.trim()) $("thread").value = freshThread();
  const thread = $("thread").value.trim();
  try {
    const run = await api("POST", "/api/v1/threads/" + encodeURIComponent(thread) + "/runs",
      { agent: $("agent").value, input: $("input").value });
    state.runs.set(run.id, run);
    $("input").value = "";
    renderRuns();
    select(run.id);
  } catch (e) {
    text($("start-error"), e.message);
    if (e.code === "thread_busy") await explainBusy(thread);
    show($("start-error"), true);
  }
});

// freshThread names a new conversation's thread: the time it begins, and
// a few random letters so that two consoles starting at once differ.
function freshThread() {
  const t = new Date().toISOString().slice(0, 19).replace(/[-:]/g, "").replace("T", "-");
  const r = [...crypto.getRandomValues(new Uint8Array(3))].map((b) => b.toString(16).padStart(2, "0")).join("");
  return "conv-" + t + "-" + r;
}

// A new conversation gets a thread of its own; the turns started after it
// stay on that thread (the field keeps it) until another is begun or the
// operator types one. The message typed stays: a turn refused on a busy
// thread is started on a new one this way.
function newConversation() {
  $("thread").value = freshThread();
  show($("start-error"), false);
}
$("new-thread").addEventListener("click", () => {
  newConversation();
  $("input").focus();
});
newConversation();
// An opened run's conversation goes on from the start form: its thread
// goes into the field, for the next turn and those after it.
$("continue-thread").addEventListener("click", () => {
  const run = state.runs.get(state.selected);
  if (!run) return;
  $("thread").value = run.thread;
  show($("start-error"), false);
  $("input").focus();
});

// explainBusy says, in the page's words, which turn holds the thread a
// new turn was refused on, with a button that opens it: the operator
// decides or cancels it, or starts the turn on another thread. The
// message typed stays in its box.
async function explainBusy(thread) {
  let held = [];
  for (const st of ["interrupted", "running"]) {
    try {
      const page = await api("GET", "/api/v1/runs?limit=1&order=desc&status=" + st + "&thread=" + encodeURIComponent(thread));
      held = held.concat(page.runs);
    } catch (e) { /* the appliance's own message stays */ }
  }
  const run = held[0];
  if (!run) return;
  state.runs.set(run.id, run);
  renderRuns();
  const p = $("start-error");
  const open = el("button", "link", "Open it");
  open.type = "button";
  open.addEventListener("click", () => select(run.id));
  const what = run.status === "interrupted" ? "a turn waiting for review" : "a turn still " + run.status;
  p.replaceChildren("Thread " + thread + " already has " + what + " (" + run.id + "). ", open,
    run.status === "interrupted" ? " and decide or cancel it first, or start this turn on another thread: your message is kept." :
      " or wait for it to end, or start this turn on another thread: your message is kept.");
}

// refreshRun reads the run again and shows it as it now is; it returns
// the run, or nothing when it cannot be read.
async function refreshRun(id) {
  try {
    const run = await api("GET", "/api/v1/runs/" + encodeURIComponent(id));
    state.runs.set(id, run);
    dropDrafts(run);
    renderRuns();
    if (id === state.selected) {
      renderDetail(run);
      settleUnsure(run);
    }
    return run;
  } catch (e) { /* a run listed by an event may be gone after a restart */ }
}

// follow reads e's run again, after the reads the run's earlier events
// asked for, and hands it to note: an event that says only that something
// changed (a node wrote the flags, a person decided) is then told in full
// in the transcript, and the run's flags and decisions in the list and its
// view are those of the run as it now is.
function follow(e, note) {
  const next = (state.follow.get(e.run) || Promise.resolve()).then(() => refreshRun(e.run)).then((run) => {
    if (!run) return;
    note(run);
    redrawEvent(e);
  });
  state.follow.set(e.run, next);
  next.finally(() => { if (state.follow.get(e.run) === next) state.follow.delete(e.run); });
}

// redrawEvent draws e's lines again in their place, when they are on
// screen.
function redrawEvent(e) {
  const old = state.drawn.get(e);
  if (!old || !old.length || !old[0].isConnected) return;
  renderEvent(e, old[0]);
  for (const li of old) li.remove();
}

// writesFlags reports whether a node.completed event's node wrote the
// flags channel.
function writesFlags(e) {
  return e.type === "node.completed" && e.data && (e.data.writes || []).indexOf("flags") >= 0;
}

// flagsAtStep returns the flags a node.completed event carries, as its
// step left them ([] when cleared), or null when it carries none.
function flagsAtStep(e) {
  const v = e.data && e.data.values;
  return v && Object.prototype.hasOwnProperty.call(v, "flags") ? v.flags || [] : null;
}

// ---- one run ----
async function select(id) {
  const turn = ++state.selects;
  state.selected = id;
  state.drawing = "";
  show($("decide-error"), false);
  renderRuns();
  $("transcript").replaceChildren();
  state.streams.clear();
  show($("detail"), true);
  // A run the page has heard of only by its events (a stream caught up
  // after a cut: the read that run.started asked for may not be in yet)
  // is read first, rather than left with an empty transcript.
  const run = state.runs.get(id) || await refreshRun(id);
  if (!run || state.selects !== turn) return;
  renderDetail(run);
  // A list holds a preview of a large input or output: the run is read
  // whole for its detail.
  if (run.input_truncated || run.output_truncated || state.unsure.has(id)) refreshRun(id);
  const seen = state.log.get(id);
  if (seen && seen.length && seen[0].type === "run.started" && !seen.truncated) {
    // This page saw the run from its start: its own events tell it all,
    // streamed tokens included.
    for (const e of seen) renderEvent(e);
    await drawGraph(run);
    return;
  }
  // The past of the run, node by node, from its thread's checkpoints.
  // Events that arrive meanwhile are held (onEvent logs them but does not
  // draw them) and drawn in their place once the past is in.
  const since = state.lastSeq || 0;
  state.drawing = id;
  // Its tool calls come with the run read whole: the checkpoints name
  // the nodes that ran, not the calls they made.
  let mine = [], unread = "", calls = [], callsUnread = "", decisions = run.decisions || [];
  const [h, whole] = await Promise.allSettled([
    api("GET", "/api/v1/threads/" + encodeURIComponent(run.thread) + "/history?limit=1000"),
    api("GET", "/api/v1/runs/" + encodeURIComponent(id))]);
  if (h.status === "fulfilled") mine = h.value.checkpoints.filter((c) => c.run === id).reverse();
  else unread = h.reason.message;
  if (whole.status === "fulfilled") {
    calls = whole.value.tool_calls || [];
    decisions = whole.value.decisions || [];
    callsUnread = whole.value.tool_calls_error || "";
  } else callsUnread = whole.reason.message;
  if (state.selects !== turn) return; // another select has the transcript now
  state.drawing = "";
  // An empty transcript would read as a run that did nothing.
  if (unread) line("denied", "The run's steps could not be read: " + unread + ". Open the run again to retry.");
  if (callsUnread) line("denied", "The run's tool calls could not be read: " + callsUnread + ".");
  drawHeld(mine, (state.log.get(id) || []).filter((e) => e.seq > since), calls, decisions);
  await drawGraph(run);
}

// drawHeld draws a run's past from its checkpoints and its tool calls'
// records, and the events held while they were read: a step whose
// checkpoint the history already holds is drawn from its events (tokens
// and tool calls included) instead of twice, and the steps after it follow
// in order. A call is drawn before the step its node completed in (one
// made in a subgraph, before the step that ran the subgraph); the calls of
// a node that has not completed (it waits for review), after the last
// step. A decision that resumed the run is drawn before the first
// step after it, unless a held run.resumed event tells of it.
function drawHeld(checkpoints, held, calls, decisions) {
  const steps = new Map(); // checkpoint id -> the events up to it
  const evented = new Set(); // keys of the calls the held events tell of
  let step = [];
  for (const e of held) {
    step.push(e);
    if (e.type === "checkpoint" && e.data && e.data.id) {
      steps.set(e.data.id, step);
      step = [];
    }
    if (e.type.startsWith("tool.") && e.data) for (const k of [e.data.key, e.data.record]) if (k) evented.add(k);
  }
  let left = (calls || []).filter((c) => !evented.has(c.key));
  // Each run.resumed event held tells of that many decisions, the newest.
  const told = held.reduce((n, e) => n + (e.type === "run.resumed" ? (e.data && e.data.decisions) || 1 : 0), 0);
  let undrawn = [...(decisions || [])].sort((a, b) => Date.parse(a.at) - Date.parse(b.at));
  // A tool call rejected by a decision a held event tells of is drawn with
  // that event, not from its record.
  for (const d of undrawn.slice(Math.max(0, undrawn.length - told))) {
    const asked = d.decision === "reject" && held.length ? askedIn(held[0].run, d.interrupt) : null;
    if (toolCall(asked) && asked.payload.key) evented.add(asked.payload.key);
  }
  left = left.filter((c) => !evented.has(c.key));
  undrawn = undrawn.slice(0, Math.max(0, undrawn.length - told));
  // A call's record names its node by its path through the subgraphs
  // ("team/loop"), and the steps the nodes of the run's own graph: a call
  // goes to the first step that ended after it and ran the path's first
  // node. (A record of an older release names a subgraph's node bare, which
  // no step of the run's own graph may have run: it goes to the first step
  // that ended after it.)
  const ran = new Set(checkpoints.flatMap((c) => c.nodes || []));
  const top = (x) => (x.node || "").split("/")[0];
  for (const c of checkpoints) {
    const at = Date.parse(c.created_at);
    const mine = left.filter((x) => (c.nodes.includes(top(x)) || !ran.has(top(x))) && Date.parse(x.at) <= at);
    left = left.filter((x) => !mine.includes(x));
    const resumed = undrawn.filter((d) => Date.parse(d.at) <= at);
    undrawn = undrawn.filter((d) => !resumed.includes(d));
    const evs = steps.get(c.id);
    if (evs) {
      evs.forEach(renderEvent);
      steps.delete(c.id);
      continue;
    }
    resumed.forEach(drawDecision);
    mine.forEach(drawCall);
    for (const n of c.nodes) line("node", "✓ " + n + (c.channels.length ? "  (wrote " + c.channels.join(", ") + ")" : ""));
  }
  undrawn.forEach(drawDecision);
  left.forEach(drawCall);
  for (const evs of steps.values()) evs.forEach(renderEvent);
  step.forEach(renderEvent);
}

// drawDecision draws a decision that resumed the run, as its resume
// event draws, with who decided what.
function drawDecision(d, before) {
  return line("node", "▶ resumed: " + d.decision + " by " + (d.by || "?") + " at " + new Date(d.at).toLocaleTimeString() +
    (d.reason ? " (" + d.reason + ")" : ""), before);
}

// notRun draws a tool call that a person rejected. A call's record
// names its decider as "operator:NAME"; the person's name is what is said.
function notRun(tool, by, reason, before) {
  return line("denied", "✗ not run: " + tool + " (rejected by " + ((by || "").replace(/^operator:/, "") || "?") +
    (reason ? ": " + reason : "") + ")", before);
}

// askedIn returns the question (its interrupt event's data) of id that
// this page saw run ask, or null.
function askedIn(run, id) {
  const e = (state.log.get(run) || []).find((x) => x.type === "interrupt" && x.data && x.data.id === id);
  return e ? e.data : null;
}

// drawCall draws a tool call from its record as the live events draw it:
// the call and how it ended, a failed one as failed; a call refused (by
// the policy or a person) as refused. The mark of a question asked about
// a call is the review's, not a call, and is not drawn.
function drawCall(c) {
  const ev = (type, data) => renderEvent({ type, node: c.node, data });
  if (c.decision === "ask") return;
  if (c.decision === "deny") return ev("tool.unauthorized", { tool: c.tool, reason: c.reason || c.error || "" });
  if (c.decision === "reject") return notRun(c.tool, c.decided_by, c.reason);
  ev("tool.called", { tool: c.tool, args: c.args === undefined ? "" : c.args });
  if (c.status === "done") ev("tool.result", c.error ? { tool: c.tool, error: c.error } : { tool: c.tool, bytes: c.bytes });
  else line("flag", "← " + c.tool + ": no result recorded (it may or may not have run)");
}

function renderDetail(run) {
  text($("run-id"), run.id);
  const st = $("run-status");
  st.className = "status " + run.status;
  text(st, run.status === "interrupted" ? "waiting for review" : run.held ? "held" : run.status);
  st.dataset.status = run.status;
  text($("run-meta"), "thread " + run.thread + " · agent " + run.agent + " · bundle " + run.bundle.name + " v" + run.bundle.version +
    " · started " + new Date(run.created_at).toLocaleTimeString() + (run.ended_at ? " · ended " + new Date(run.ended_at).toLocaleTimeString() : ""));
  const flags = run.flags || [];
  text($("run-flags"), "⚑ Flags: " + flags.join(", "));
  show($("run-flags"), flags.length > 0);
  // A run a crash left unfinished whose pinned bundle is unavailable keeps
  // its status but runs nowhere until the bundle is back.
  text($("run-held"), run.held ? "Held: this run waits for its bundle " + run.held.bundle.name + " v" + run.held.bundle.version +
    ", which is unavailable (" + run.held.reason + "). Install the same bundle file again (outpost firmware install) and restart outpost serve: the run then goes on from its last checkpoint; or cancel it." : "");
  show($("run-held"), !!run.held);
  const out = run.output === undefined ? "" : (typeof run.output === "string" ? run.output : JSON.stringify(run.output, null, 2));
  // A run an operator cancelled, or a budget stopped, did not fail.
  const why = run.status === "cancelled" || run.status === "budget_exceeded" ? "stopped" : "error";
  text($("output"), out + (run.error ? "\n" + why + ": " + run.error : ""));
  show($("output-box"), out !== "" || !!run.error);
  const ds = $("decisions");
  ds.replaceChildren();
  for (const d of run.decisions || []) {
    const li = el("li", "", d.decision + " by " + (d.by || "?") + " at " + new Date(d.at).toLocaleString() +
      (d.value !== undefined ? " · value " + short(d.value, 80) : "") + (d.reason ? " · " + d.reason : ""));
    // A value cut short opens in full, as text.
    if (d.value !== undefined && short(d.value, 80) !== short(d.value, Infinity)) {
      const more = el("details", "value");
      const whole = typeof d.value === "string" ? d.value : JSON.stringify(d.value, null, 2);
      more.append(el("summary", "", "the whole value"), el("pre", "", whole));
      li.append(more);
    }
    ds.append(li);
  }
  show($("decisions-box"), (run.decisions || []).length > 0);
  show($("cancel"), run.status === "queued" || run.status === "running" || run.status === "interrupted");
  const pending = run.status === "interrupted" && run.interrupts && run.interrupts.length > 0;
  // A review that closes (decided elsewhere, cancelled, or by this page's
  // decision that could not be confirmed) takes the error about it away:
  // it no longer says anything true about the run on screen.
  const form = $("interrupt");
  // The review the form held until now, to tell whether it changes.
  const shown = (form.dataset.run || "") + "\n" + (form.dataset.interrupt || "");
  if (!pending && form.dataset.interrupt && form.dataset.run === run.id) {
    delete form.dataset.interrupt;
    show($("decide-error"), false);
  }
  form.dataset.run = run.id;
  show(form, pending);
  // Drafts discarded since the run was last on screen are said once, and
  // stay said while it is.
  const note = $("draft-notice");
  if (state.dropped.has(run.id)) {
    text(note, state.dropped.get(run.id));
    state.dropped.delete(run.id);
    note.dataset.run = run.id;
    show(note, true);
  } else if (note.dataset.run !== run.id) show(note, false);
  if (pending) {
    // The question on screen stays there until the operator moves on or
    // it is answered; the first one otherwise.
    const at = Math.max(0, run.interrupts.findIndex((x) => x.id === state.question.get(run.id)));
    const i = run.interrupts[at];
    state.question.set(run.id, i.id);
    const n = run.interrupts.length;
    countQuestions(run, at);
    show($("interrupt-prev"), n > 1);
    show($("interrupt-next"), n > 1);
    $("interrupt-prev").disabled = at === 0;
    $("interrupt-next").disabled = at === n - 1;
    const call = toolCall(i);
    // The path through the subgraphs ("team/review"): the bare name is the
    // same in every instance of a subgraph. An older server sends none.
    text($("interrupt-node"), i.path || i.node);
    text($("interrupt-why"), whyAsked(i.payload || {}, call));
    text($("interrupt-payload"), JSON.stringify(i.payload, null, 2));
    text($("edit-label"), call ? "Edited arguments of " + call.tool + ", as JSON (for edit)" : "Edited answer (for edit)");
    // The form belongs to the review on screen: another run's (or another
    // question's) draft and reason must never ride along into this
    // decision. What the operator typed for this question comes back.
    if (shown !== run.id + "\n" + i.id) {
      form.dataset.interrupt = i.id;
      const draft = (state.drafts.get(run.id) || new Map()).get(i.id);
      // An edit of a tool call starts from the arguments asked about.
      $("edit-value").value = draft ? draft.edit : call ? JSON.stringify(call.args, null, 2) :
        i.payload && typeof i.payload.draft === "string" ? i.payload.draft : "";
      $("reason").value = draft ? draft.reason : "";
      show($("decide-error"), false);
    }
    // The graph drawn is the run's own: a subgraph's question lights the
    // node that runs the subgraph, not one that shares the bare name.
    state.current.set(run.id, (i.path || i.node).split("/")[0]);
  }
  if (["completed", "failed", "cancelled", "budget_exceeded"].includes(run.status)) state.current.set(run.id, "");
  highlight(run);
}

// toolCall returns the tool call an interrupt asks about ({tool, args}),
// or null for a review of a draft.
function toolCall(i) {
  const p = i && i.payload;
  return p && typeof p.tool === "string" && p.tool !== "" && p.args !== undefined ? { tool: p.tool, args: p.args } : null;
}

// whyAsked says in words why the run waits, and what each decision does:
// for a call that may already have run, the operator must know that
// before approving it again.
function whyAsked(p, call) {
  const detail = typeof p.detail === "string" && p.detail ? " (" + p.detail + ")" : "";
  if (call && p.reason === "uncertain_side_effect") {
    return "The call to " + call.tool + " may already have run" + detail + ". Find out from the tool's side whether it " +
      "took effect before deciding: approve (or edit) runs it again, reject reports it to the agent as not done.";
  }
  if (call) {
    return "The agent asks to call " + call.tool + ", which needs a person's approval" + detail +
      ". Approve runs the call as shown, edit runs it with the arguments below, reject does not run it.";
  }
  if (Array.isArray(p.reasons) && p.reasons.length) return "Why it is held for review: " + p.reasons.join("; ") + ".";
  return "";
}

async function drawGraph(run) {
  let g = state.graphs.get(run.agent);
  if (!g) {
    try { g = await api("GET", "/api/v1/agents/" + encodeURIComponent(run.agent) + "/graph"); } catch (e) { return; }
    state.graphs.set(run.agent, g);
  }
  const ns = "http://www.w3.org/2000/svg";
  const w = 200, h = 30, gap = 16;
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", w + 20);
  svg.setAttribute("height", g.nodes.length * (h + gap) + 10);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", "graph of " + run.agent);
  g.nodes.forEach((n, i) => {
    const y = 5 + i * (h + gap);
    if (i > 0) {
      const a = document.createElementNS(ns, "line");
      a.setAttribute("x1", 10 + w / 2); a.setAttribute("x2", 10 + w / 2);
      a.setAttribute("y1", y - gap); a.setAttribute("y2", y);
      a.setAttribute("stroke", "#8a96a0");
      svg.append(a);
    }
    const r = document.createElementNS(ns, "rect");
    r.setAttribute("x", 10); r.setAttribute("y", y); r.setAttribute("width", w); r.setAttribute("height", h);
    r.setAttribute("rx", 5); r.setAttribute("fill", "#eef2f5"); r.setAttribute("stroke", "#8a96a0");
    r.dataset.node = n;
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", 10 + w / 2); t.setAttribute("y", y + h / 2 + 4); t.setAttribute("text-anchor", "middle");
    t.textContent = n;
    svg.append(r, t);
  });
  const title = document.createElementNS(ns, "desc");
  title.textContent = g.mermaid;
  svg.append(title);
  $("graph").replaceChildren(svg);
  highlight(run);
}

function highlight(run) {
  const cur = state.current.get(run.id) || "";
  for (const r of $("graph").querySelectorAll("rect")) {
    const on = r.dataset.node === cur;
    r.setAttribute("fill", on ? "#ffd166" : "#eef2f5");
    r.setAttribute("stroke-width", on ? 3 : 1);
    r.classList.toggle("current", on);
  }
}

// line adds a line to the transcript, at its end or before the line
// before. The transcript follows its newest
// line by scrolling itself, never the page: scrolling the page would take
// the review and its buttons, above it, out of sight. A reader who has
// scrolled back up is left where they are.
function line(cls, s, before) {
  const ol = $("transcript");
  const following = ol.scrollHeight - ol.scrollTop - ol.clientHeight < 40;
  const li = el("li", cls, s);
  if (before && before.parentNode === ol) ol.insertBefore(li, before);
  else ol.append(li);
  if (following) ol.scrollTop = ol.scrollHeight;
  return li;
}

// countQuestions says which of the run's questions is on screen (at, of
// how many), and how many wait across all the runs of the appliance (its
// count, not the page's, which holds only the runs it has read).
function countQuestions(run, at) {
  const n = run.interrupts.length;
  let count = n > 1 ? "Question " + (at + 1) + " of " + n + " waiting on this run" : "";
  const w = state.waiting;
  if (w && w.runs > 1) count += (count ? "; " : "") + w.questions + " questions wait across " + w.runs + " runs";
  text($("interrupt-count"), count);
}

// recountWaiting asks the appliance again how many runs and questions
// wait for review, once a burst of events that may change it is over.
function recountWaiting() {
  clearTimeout(state.waitingTimer);
  state.waitingTimer = setTimeout(async () => {
    try {
      const page = await api("GET", "/api/v1/runs?status=interrupted&limit=1");
      if (page.waiting) state.waiting = page.waiting;
      renderRuns();
    } catch (e) { /* the stream's state says the appliance is away */ }
  }, 200);
}

// keepDraft keeps what the operator types for the question on screen, so
// that it is there again after moving to another question or run and
// back, until it is sent or the question closes.
function keepDraft() {
  const form = $("interrupt");
  const run = form.dataset.run, q = form.dataset.interrupt;
  if (!run || !q) return;
  if (!state.drafts.has(run)) state.drafts.set(run, new Map());
  state.drafts.get(run).set(q, { edit: $("edit-value").value, reason: $("reason").value, node: $("interrupt-node").textContent });
}
$("edit-value").addEventListener("input", keepDraft);
$("reason").addEventListener("input", keepDraft);

// dropDrafts discards the drafts of run's questions that no longer wait
// (answered from another console or the CLI, or the run cancelled or
// ended), saying which and why when the run is next on screen. A question
// this page is deciding keeps its draft until the answer comes back.
function dropDrafts(run) {
  const drafts = state.drafts.get(run.id);
  if (!drafts) return;
  // A run on its way between two pauses (queued or running after one
  // question's answer) still owes the others an answer.
  const over = ["completed", "failed", "cancelled", "budget_exceeded"].includes(run.status);
  const open = new Set((run.interrupts || []).map((x) => x.id));
  const decided = new Set((run.decisions || []).map((x) => x.interrupt));
  const said = [];
  for (const [q, d] of drafts) {
    const closed = over || decided.has(q) || (run.status === "interrupted" && !open.has(q));
    if (!closed || state.deciding.has(run.id + "\n" + q)) continue;
    drafts.delete(q);
    const by = (run.decisions || []).find((x) => x.interrupt === q);
    said.push("Your unsent reply to the question at " + d.node + " was discarded: " + (by ?
      "it was answered outside this page (" + by.decision + " by " + (by.by || "?") + " at " + new Date(by.at).toLocaleTimeString() + ")." :
      "the run is now " + (run.status === "interrupted" ? "waiting on other questions" : run.status) + "."));
  }
  if (!drafts.size) state.drafts.delete(run.id);
  if (said.length) state.dropped.set(run.id, ((state.dropped.get(run.id) || "") + " " + said.join(" ")).trim());
}

// forgetDraft discards the draft of one question, sent or refused.
function forgetDraft(run, q) {
  const drafts = state.drafts.get(run);
  if (!drafts) return;
  drafts.delete(q);
  if (!drafts.size) state.drafts.delete(run);
}

// moveQuestion shows the run's question step places on from the one on
// screen; the decision buttons then answer that one.
function moveQuestion(step) {
  const run = state.runs.get(state.selected);
  if (!run || !run.interrupts) return;
  const at = run.interrupts.findIndex((x) => x.id === state.question.get(run.id));
  const next = run.interrupts[at + step];
  if (!next) return;
  state.question.set(run.id, next.id);
  renderDetail(run);
}
$("interrupt-prev").addEventListener("click", () => moveQuestion(-1));
$("interrupt-next").addEventListener("click", () => moveQuestion(1));

for (const [id, kind] of [["approve", "approve"], ["edit", "edit"], ["reject", "reject"]]) {
  $(id).addEventListener("click", () => decide(kind));
}

async function decide(kind) {
  const run = state.runs.get(state.selected);
  if (!run) return;
  show($("decide-error"), false);
  // Name the review the operator saw, so that the decision cannot land on
  // a later one.
  const body = { decision: kind };
  if ($("interrupt").dataset.interrupt) body.interrupt = $("interrupt").dataset.interrupt;
  if ($("reason").value.trim()) body.reason = $("reason").value.trim();
  if (kind === "edit") {
    const raw = $("edit-value").value;
    if (!raw.trim()) {
      text($("decide-error"), "The edited answer is empty: write the answer to send, or approve or reject the draft.");
      show($("decide-error"), true);
      return;
    }
    // A review of a draft is edited as text: what the operator typed is
    // the answer, even where it would read as JSON ("2", "null"). A tool
    // call is edited as its arguments, which must be JSON: a typo is
    // refused here, never sent as a string in their place. Other reviews
    // take the JSON value they show.
    const i = (run.interrupts || []).find((x) => x.id === $("interrupt").dataset.interrupt);
    if (i && i.payload && typeof i.payload.draft === "string") body.value = raw;
    else if (toolCall(i)) {
      try { body.value = JSON.parse(raw); } catch (e) {
        text($("decide-error"), "The edited arguments are not valid JSON (" + e.message + "): nothing was sent. " +
          "Write them as a JSON object, as shown above, or approve or reject the call.");
        show($("decide-error"), true);
        return;
      }
    } else try { body.value = JSON.parse(raw); } catch (e) { body.value = raw; }
  }
  for (const b of ["approve", "edit", "reject"]) $(b).disabled = true;
  const sending = run.id + "\n" + body.interrupt;
  state.deciding.add(sending);
  try {
    const r = await api("POST", "/api/v1/runs/" + encodeURIComponent(run.id) + "/resume", body);
    state.deciding.delete(sending);
    state.unsure.delete(run.id);
    forgetDraft(run.id, body.interrupt);
    state.runs.set(r.id, r);
    $("edit-value").value = "";
    $("reason").value = "";
    dropDrafts(r);
    renderRuns();
    renderDetail(r);
    recountWaiting();
  } catch (e) {
    state.deciding.delete(sending);
    let msg = e.message;
    // The question closed before this answer: what was typed for it can
    // go nowhere now, and the error says why.
    if (e.status === 409 || e.code === "unknown_interrupt") {
      forgetDraft(run.id, body.interrupt);
      msg = await decidedElsewhere(run.id, body.interrupt) || msg;
    }
    // The request may have reached the appliance before the answer was
    // lost: the operator must not take it as refused, nor as recorded.
    if (e.unreachable) {
      msg = e.message + ": your " + kind + " may or may not have been recorded. Once the appliance answers " +
        "again (the stream says live), this run is shown as it then is, and this says whether it was.";
      state.unsure.set(run.id, { interrupt: body.interrupt, kind });
    }
    text($("decide-error"), msg);
    show($("decide-error"), true);
  } finally {
    for (const b of ["approve", "edit", "reject"]) $(b).disabled = false;
  }
}

// Cancel asks first, in a dialog of the page's own (a modal <dialog>:
// focus stays in it, Escape keeps the run), naming the run it would stop;
// the run confirmed is the one cancelled, whatever is selected by then.
$("cancel").addEventListener("click", () => {
  const d = $("cancel-confirm");
  d.dataset.run = state.selected;
  text($("cancel-confirm-run"), state.selected);
  d.showModal();
});
$("cancel-no").addEventListener("click", () => $("cancel-confirm").close());
$("cancel-yes").addEventListener("click", () => {
  const d = $("cancel-confirm");
  d.close();
  if (d.dataset.run) cancelRun(d.dataset.run);
});

async function cancelRun(id) {
  show($("decide-error"), false);
  $("cancel").disabled = true;
  try {
    const r = await api("POST", "/api/v1/runs/" + encodeURIComponent(id) + "/cancel");
    state.runs.set(r.id, r);
    dropDrafts(r);
    renderRuns();
    if (state.selected === r.id) renderDetail(r);
    recountWaiting();
  } catch (e) {
    text($("decide-error"), "Cannot cancel the run: " + e.message);
    show($("decide-error"), true);
    refreshRun(id);
  } finally {
    $("cancel").disabled = false;
  }
}

// decidedElsewhere rereads a run whose review another operator (or the
// CLI) answered first, shows it as it now is, and says who decided.
async function decidedElsewhere(id, interrupt) {
  let now;
  try { now = await api("GET", "/api/v1/runs/" + encodeURIComponent(id)); } catch (e) { return ""; }
  state.runs.set(id, now);
  dropDrafts(now);
  renderRuns();
  if (state.selected === id) renderDetail(now);
  const ds = now.decisions || [];
  const d = ds.find((x) => x.interrupt === interrupt);
  const st = now.status === "interrupted" ? "waiting for review" : now.status;
  if (!d) return "This review is no longer open: the run is now " + st + ". Your decision was not recorded.";
  return "This review was already decided: " + d.decision + " by " + (d.by || "?") + " at " +
    new Date(d.at).toLocaleTimeString() + ". Your decision was not recorded. The run is now " + st + ".";
}

// settleUnsure says, once the appliance answers again, what became of a
// decision on run sent while it did not: the operator must not be left
// guessing whether to decide again.
function settleUnsure(run) {
  const u = state.unsure.get(run.id);
  if (!u) return;
  state.unsure.delete(run.id);
  const d = (run.decisions || []).find((x) => x.interrupt === u.interrupt);
  const waits = run.status === "interrupted" && (run.interrupts || []).some((x) => x.id === u.interrupt);
  const st = run.status === "interrupted" ? "waiting for review" : run.status;
  let msg;
  if (d) {
    msg = "The appliance answers again: this question was decided, " + d.decision + " by " + (d.by || "?") + " at " +
      new Date(d.at).toLocaleTimeString() + ". The run is now " + st + ".";
  } else if (waits) {
    msg = "The appliance answers again: your " + u.kind + " was not recorded, and the question still waits. Decide again.";
  } else {
    msg = "The appliance answers again: your " + u.kind + " was not recorded, and this review is no longer open. The run is now " + st + ".";
  }
  text($("decide-error"), msg);
  show($("decide-error"), true);
}

// ---- live events ----
function connect() {
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(proto + "//" + location.host + "/api/v1/events");
  state.ws = ws;
  ws.onopen = () => ws.send(JSON.stringify({ type: "auth", token: state.token }));
  ws.onmessage = (m) => {
    let msg;
    try { msg = JSON.parse(m.data); } catch (e) { return; }
    if (msg.type === "ready") {
      pill("stream", "ok", "stream: live", "");
      // The first connection subscribes and notes where the stream
      // stood; every later one resumes from the last event seen, or from
      // that point, so that what came while the stream was down (a run
      // now waiting for review, say) is caught up on.
      if (state.lastSeq === null) {
        state.lastSeq = msg.seq;
        ws.send(JSON.stringify({ type: "subscribe" }));
      } else {
        ws.send(JSON.stringify({ type: "resume", seq: state.lastSeq }));
        // A decision sent while the appliance was away may have left no
        // event to say so: the run is read again.
        if (state.unsure.has(state.selected)) refreshRun(state.selected);
      }
      if (state.onReady) {
        state.onReady();
        state.onReady = null;
      }
      return;
    }
    if (msg.type === "window_exceeded") {
      // What was missed cannot be replayed: reread the list, and the open
      // run, which may have been decided or ended meanwhile.
      loadRuns();
      if (state.selected) refreshRun(state.selected);
      return;
    }
    if (CONTROL.has(msg.type)) return; // other control messages
    if (msg.seq > state.lastSeq) state.lastSeq = msg.seq;
    onEvent(msg);
  };
  ws.onclose = (ev) => {
    if (ev.reason.startsWith("unauthorized")) {
      signOut("The token is no longer valid (the appliance may have made a new one): sign in again.");
      return;
    }
    pill("stream", "degraded", "stream: reconnecting", ev.reason || "");
    setTimeout(() => { if (state.ws === ws) connect(); }, 1000);
  };
}

function onEvent(e) {
  if (state.touched) state.touched.add(e.run);
  switch (e.type) {
    case "run.resumed":
      // The event counts the decisions; the run says who made them and
      // what they were.
      follow(e, (run) => {
        const n = (e.data && e.data.decisions) || 1;
        const ds = [...(run.decisions || [])].sort((a, b) => Date.parse(a.at) - Date.parse(b.at));
        e.told = ds.slice(Math.max(0, ds.length - n));
      });
      recountWaiting();
      break;
    case "run.started": case "interrupt": case "run.completed": case "run.failed": case "budget.exceeded":
      refreshRun(e.run);
      if (e.type !== "run.started") recountWaiting();
      break;
  }
  // The event carries the flags as of its own step (the appliance's
  // EventValues); the run, read again, brings the list and its view up to
  // date. An event without them (flags too large to carry, which it names
  // under value_refs) is named from that read, which a later step may have
  // overtaken.
  if (writesFlags(e)) {
    const at = flagsAtStep(e);
    if (at) e.flags = at;
    follow(e, (run) => { if (!at) e.flags = run.flags || []; });
  }
  if (e.type === "checkpoint" && e.data && e.data.next) {
    state.current.set(e.run, e.data.next[0] || "");
    const r = state.runs.get(e.run);
    if (r) highlight(r);
  }
  let seen = state.log.get(e.run);
  if (!seen) {
    seen = [];
    state.log.set(e.run, seen);
    if (state.log.size > 200) state.log.delete(state.log.keys().next().value);
  }
  const last = seen[seen.length - 1];
  if (e.type === "model.token" && last && last.type === "model.token" && last.node === e.node) {
    // A stream's tokens are kept run together, as one event, so that a
    // long answer does not crowd the rest of the run out of the log.
    const d = last.data || {};
    seen[seen.length - 1] = { ...last, seq: e.seq, data: { ...d, content: (d.content || "") + ((e.data || {}).content || "") } };
  } else if (seen.length < 5000) {
    seen.push(e);
  } else {
    seen.truncated = true; // select reads the run's history instead
  }
  if (e.run === state.selected && state.drawing !== e.run) renderEvent(e);
}

// renderEvent draws e in the transcript: at its end, or before the line
// before when it is drawn again.
function renderEvent(e, before) {
  const d = e.data || {};
  switch (e.type) {
    case "model.token": {
      const key = e.run + "/" + e.node;
      let span = state.streams.get(key);
      if (!span) {
        const li = line("", e.node + ": ");
        span = el("span", "tokens");
        li.append(span);
        state.streams.set(key, span);
      }
      span.textContent += d.content || "";
      break;
    }
    case "node.completed":
      state.streams.delete(e.run + "/" + e.node);
      const done = line("node", "✓ " + e.node + (d.writes && d.writes.length ? "  (wrote " + d.writes.join(", ") + ")" : ""), before);
      if (writesFlags(e)) {
        // Named from the event, or once the run is read again (follow);
        // "none" when the node cleared them.
        const named = e.flags === undefined ? "" : ": " + (e.flags.length ? e.flags.join(", ") : "none");
        state.drawn.set(e, [done, line("flag", "⚑ guardrail flags set by " + e.node + named, before)]);
      }
      break;
    case "tool.called": line("tool", "→ tool " + (d.tool || d.name || "") + " " + short(d.args || "", 80)); break;
    case "tool.result":
      // The event says how the call ended (its size, or its error), not
      // what it returned: a call that failed must not read as one that
      // returned nothing.
      if (d.error) line("tool denied", "← " + (d.tool || "") + " failed: " + short(d.error, 300));
      else line("tool", "← " + (d.tool || "") + (d.bytes !== undefined ? " returned " + d.bytes + " bytes" : ""));
      break;
    case "tool.unauthorized": line("denied", "✗ denied: " + (d.tool || d.name || "") + " " + (d.reason || "")); break;
    case "interrupt": {
      // The pause sign is drawn by the stylesheet: no font that Debian
      // installs by default has a glyph for U+23F8, which drew as a box.
      const p = d.payload || {};
      const call = toolCall(d);
      const why = call && p.reason === "uncertain_side_effect" ? ": the call to " + call.tool + " may already have run" :
        call ? ": a call to " + call.tool + " needs approval" : p.reason ? " (" + p.reason + ")" : "";
      const li = line("flag", " waiting for review at " + e.node + why);
      const icon = el("span", "icon-pause");
      icon.setAttribute("role", "img");
      icon.setAttribute("aria-label", "paused:");
      li.prepend(icon);
      break;
    }
    case "run.resumed": {
      if (!e.told) {
        state.drawn.set(e, [line("node", "▶ resumed", before)]);
        break;
      }
      // Who decided what, as a run from history shows it; a tool call a
      // person rejected is said not to have run, as its record says.
      const lines = [];
      for (const x of e.told) {
        lines.push(drawDecision(x, before));
        const call = x.decision === "reject" ? toolCall(askedIn(e.run, x.interrupt)) : null;
        if (call) lines.push(notRun(call.tool, x.by, x.reason, before));
      }
      state.drawn.set(e, lines);
      break;
    }
    case "run.completed": line("node", "■ completed"); break;
    case "run.failed": {
      // A cancel's error is "run cancelled", with its cause when it has
      // one: after "■ cancelled" only the cause is worth reading.
      const st = d.status || "failed";
      const why = st === "cancelled" ? (d.error || "").replace(/^run cancelled(: )?/, "") : d.error;
      line("denied", "■ " + st + (why ? ": " + why : ""));
      break;
    }
    case "budget.exceeded": line("denied", "■ budget exceeded"); break;
    case "events.lost": line("flag", "(" + (d.lost || "some") + " events missed)"); break;
  }
}

// ---- start ----
if (state.token) {
  $("token").value = state.token;
  $("operator").value = state.operator;
  signIn();
}
