/*
 * Northwind agent console (ES2019 modules, no build step, no framework).
 *
 *   agent.js               session and login, inbox tabs and list, live events, shortcuts, language
 *   agent_conversation.js  the conversation view and reply box
 *   agent_reports.js       the reports tab
 *   agent_gaps.js          the knowledge gaps tab
 *   agent_faq.js           the FAQ drafts tab
 *   agent_webhooks.js      the webhooks tab and delivery log
 *   agent_i18n.js          English / Chinese strings
 *   agent_util.js          DOM, API client, formatting
 *
 * Untrusted text (messages, names, summaries) only reaches the DOM through textContent.
 */
import { initialLang, lang, setLang, t, translateShell } from "./agent_i18n.js";
import { $, api, describe, h, icon, isTypingTarget, onUnauthorized, parseTime, setCsrf, shortTime } from "./agent_util.js";
import * as conversation from "./agent_conversation.js";
import { initReports, loadReports, renderReports } from "./agent_reports.js";
import { initGaps, loadGaps, renderGaps } from "./agent_gaps.js";
import { loadFaq, renderFaq } from "./agent_faq.js";
import { initWebhooks, loadWebhooks, renderWebhooks } from "./agent_webhooks.js";

const STATUSES = ["pending_human", "human", "open", "resolved"];
const PANELS = ["reports", "gaps", "faq", "webhooks"];                 // the tabs that are not inbox lists
const TABS = STATUSES.concat(PANELS);
const PAGE = 50;

const state = {
  agent: null,
  tab: "pending_human",            // a status, or one of PANELS
  items: {},                       // conversation id -> list item (+ unread)
  next: {},                        // status -> cursor of the next page, or null
  selected: null,                  // id highlighted in the list
  events: null,                    // EventSource
  retryMs: 2000,                   // reconnect back-off after the stream closed for good
  liveTimer: null,
  pendingRefresh: null,
  listError: "",                   // the last failed inbox load, shown in place of the list
  loaded: {},                      // panel -> loaded once
};

/* ------------------------------------------------------------------ boot, login, logout */

async function boot() {
  setLang(initialLang(), false);
  translateShell(document);
  renderLangToggle();
  initReports();
  initGaps();
  initWebhooks();
  conversation.initConversation({ me: () => state.agent, onChange: patchItem, announce: announce });
  wire();
  onUnauthorized(() => showLogin(t("sessionExpired")));
  try {
    signedIn(await api("GET", "/api/agent/session", undefined, { quiet401: true }));
  } catch (e) {
    showLogin(e.status === 401 ? "" : describe(e));
  }
}

function showLogin(message) {
  stopEvents();
  state.agent = null;
  setCsrf("");
  $("boot").hidden = true;
  $("app-view").hidden = true;
  $("logout").hidden = true;
  $("shortcuts-button").hidden = true;
  $("agent-name").textContent = "";
  $("live-status").hidden = true;
  $("login-view").hidden = false;
  $("login-error").textContent = message || "";
  document.title = t("pageTitle");
  $("login-email").focus();
}

async function login(e) {
  e.preventDefault();
  const email = $("login-email").value.trim(), password = $("login-password").value;
  const error = $("login-error"), button = $("login-submit");
  error.textContent = "";
  if (!email || !password) { error.textContent = t("loginMissing"); return; }
  button.disabled = true;
  button.textContent = t("signingIn");
  try {
    const data = await api("POST", "/api/agent/login", { email: email, password: password }, { quiet401: true });
    $("login-password").value = "";
    signedIn(data);
  } catch (err) {
    error.textContent = err.status === 401 ? (err.message && err.message !== "HTTP 401" ? err.message : t("loginFailed"))
      : err.status === 429 ? (err.message || t("tooMany")) : describe(err);
    $("login-password").focus();
  } finally {
    button.disabled = false;
    button.textContent = t("signIn");
  }
}

function signedIn(data) {
  state.agent = data.agent || null;
  setCsrf(data.csrf_token);
  $("boot").hidden = true;
  $("login-view").hidden = true;
  $("app-view").hidden = false;
  $("logout").hidden = false;
  $("shortcuts-button").hidden = false;
  $("agent-name").textContent = state.agent ? t("signedInAs", { name: state.agent.name || state.agent.email }) : "";
  state.items = {};
  state.next = {};
  conversation.closeConversation();
  selectTab(PANELS.includes(state.tab) ? "pending_human" : state.tab, false);
  loadAll();
  startEvents();
  $("tab-" + state.tab).focus();
}

async function logout() {
  try { await api("POST", "/api/agent/logout", {}, { quiet401: true }); } catch (e) { /* signed out anyway */ }
  conversation.closeConversation();
  showLogin("");
}

/* ------------------------------------------------------------------ inbox */

async function loadStatus(status, before) {
  const q = "?status=" + status + "&limit=" + PAGE + (before ? "&before=" + encodeURIComponent(before) : "");
  const data = await api("GET", "/api/agent/conversations" + q);
  const unread = {};
  if (!before) {   // a fresh first page replaces what we had for this status (keeping unread marks)
    Object.keys(state.items).forEach((id) => {
      if (state.items[id].status !== status) return;
      unread[id] = state.items[id].unread;
      delete state.items[id];
    });
  }
  (data.conversations || []).forEach((c) => upsert(c, unread[String(c.id)]));
  state.next[status] = data.next || null;
}

async function loadAll() {
  state.listError = "";
  try {
    await Promise.all(STATUSES.map((s) => loadStatus(s)));
  } catch (e) {
    state.listError = describe(e);
  }
  renderInbox();
}

function upsert(item, unread) {
  if (!item || item.id == null) return;
  const id = String(item.id), old = state.items[id] || {};
  state.items[id] = Object.assign({}, old, item, { id: id, unread: !!(unread || old.unread) });
}

/** A change from the conversation view (claim, resolve, reply) or a live event. */
function patchItem(patch, follow) {
  const old = state.items[patch.id];
  if (!old) return;
  state.items[patch.id] = Object.assign({}, old, patch);
  if (follow && patch.status && patch.status !== state.tab && !PANELS.includes(state.tab)) selectTab(patch.status, false);
  else renderInbox();
}

function visibleItems() {
  const time = (c) => { const d = parseTime(c.updated_at); return d ? d.getTime() : 0; };
  return Object.keys(state.items).map((id) => state.items[id])
    .filter((c) => c.status === state.tab)
    .sort((a, b) => time(b) - time(a));
}

function renderInbox() {
  STATUSES.forEach((s) => {
    const n = Object.keys(state.items).filter((id) => state.items[id].status === s).length;
    document.querySelector('[data-count="' + s + '"]').textContent = n + (state.next[s] ? "+" : "");
  });
  const unread = Object.keys(state.items).filter((id) => state.items[id].unread).length;
  document.title = (unread ? "(" + unread + ") " : "") + t("pageTitle");      // seen from another tab too
  if (PANELS.includes(state.tab)) return;
  const items = visibleItems();
  const list = $("inbox-list");
  const focusedId = document.activeElement && document.activeElement.getAttribute("data-id");
  list.textContent = "";
  items.forEach((c) => list.appendChild(h("li", null, [itemNode(c)])));
  $("inbox-empty").hidden = items.length > 0 && !state.listError;
  $("inbox-empty").textContent = state.listError || t("empty_" + state.tab);
  $("inbox-more").hidden = !state.next[state.tab];
  if (focusedId) {   // re-rendering must not drop the keyboard focus
    const again = list.querySelector('[data-id="' + focusedId + '"]');
    if (again) again.focus();
  }
}

function itemNode(c) {
  const me = state.agent;
  const title = c.first_question || c.last_message || t("noMessages");   // the customer's words, not a summary
  const meta = [h("time", { datetime: c.updated_at || "", text: shortTime(c.updated_at) })];
  if (c.status === "pending_human" && typeof c.queue_position === "number") {
    meta.push(h("span", { class: "queue", text: t("queuePosition", { n: c.queue_position }) }));
  }
  if (c.assignee && c.assignee.name) {
    const self = me && String(c.assignee.id) === String(me.id);
    meta.push(h("span", { class: "assignee", text: t("assignedTo", { name: c.assignee.name + (self ? " (" + t("you") + ")" : "") }) }));
  }
  return h("button", {
    type: "button", class: "inbox-item" + (c.unread ? " unread" : ""), "data-testid": "inbox-item", "data-id": c.id,
    "data-status": c.status, "aria-current": c.id === state.selected ? "true" : null, onclick: () => select(c.id, false),
  }, [
    c.unread ? h("span", { class: "dot", "data-testid": "unread" }, [h("span", { class: "sr-only", text: t("unread") })]) : null,
    h("span", { class: "item-title", text: title }),
    c.last_message && c.last_message !== title ? h("span", { class: "item-last", text: c.last_message })
      : c.summary ? h("span", { class: "item-last", text: c.summary }) : null,       // what is new, else the summary
    h("span", { class: "item-meta" }, meta),
  ]);
}

function select(id, focusItem) {
  state.selected = id;
  if (state.items[id]) state.items[id].unread = false;
  renderInbox();
  if (focusItem) {
    const el = $("inbox-list").querySelector('[data-id="' + id + '"]');
    if (el) { el.focus(); el.scrollIntoView({ block: "nearest" }); }
  }
  conversation.openConversation(id);
}

/** j / k: the next or previous conversation in the visible list. */
function move(delta) {
  const items = visibleItems();
  if (!items.length) return;
  const i = items.findIndex((c) => c.id === state.selected);
  const next = i < 0 ? (delta > 0 ? 0 : items.length - 1) : Math.max(0, Math.min(items.length - 1, i + delta));
  select(items[next].id, true);
}

/* ------------------------------------------------------------------ tabs */

function selectTab(tab, focus) {
  state.tab = tab;
  TABS.forEach((s) => {
    const el = $("tab-" + s);
    el.setAttribute("aria-selected", String(s === tab));
    el.tabIndex = s === tab ? 0 : -1;
  });
  $("inbox-panel").hidden = PANELS.includes(tab);
  PANELS.forEach((p) => { $(p + "-panel").hidden = tab !== p; });
  if (PANELS.includes(tab)) {
    if (tab === "faq") loadFaq();                    // new drafts arrive as agents resolve: always fresh
    else if (tab === "webhooks") loadWebhooks();     // and new deliveries as conversations go on
    else if (!state.loaded[tab]) { state.loaded[tab] = true; (tab === "reports" ? loadReports : loadGaps)(); }
  } else {
    $("inbox-panel").setAttribute("aria-labelledby", "tab-" + tab);
    renderInbox();
  }
  if (focus) $("tab-" + tab).focus();
}

function onTabKey(e) {   // WAI-ARIA tabs: arrows move between tabs, Home / End to the ends
  const tabs = TABS;
  const i = tabs.indexOf(state.tab);
  const to = { ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: tabs.length - 1 }[e.key];
  if (to == null) return;
  e.preventDefault();
  selectTab(tabs[(to + tabs.length) % tabs.length], true);
}

/* ------------------------------------------------------------------ live events */

function startEvents() {
  stopEvents();
  const es = state.events = new EventSource("/api/agent/events");
  const parse = (e) => { try { return JSON.parse(e.data); } catch (err) { return null; } };
  es.addEventListener("open", () => { state.retryMs = 2000; setLive("live"); });
  es.addEventListener("error", () => {
    if (es.readyState === EventSource.CLOSED) {       // not retried by the browser (e.g. a 401)
      setLive("offline");
      setTimeout(reconnect, state.retryMs);
      state.retryMs = Math.min(state.retryMs * 2, 60000);
    } else {
      setLive("reconnecting");                         // the browser retries with Last-Event-ID
    }
  });
  es.addEventListener("handoff", (e) => { const d = parse(e); if (d) onHandoff(d); });
  es.addEventListener("message", (e) => { const d = parse(e); if (d) onMessage(d); });
  es.addEventListener("status", (e) => { const d = parse(e); if (d) onStatus(d); });
}

function stopEvents() {
  if (state.events) state.events.close();
  state.events = null;
}

async function reconnect() {
  if (!state.agent || (state.events && state.events.readyState !== EventSource.CLOSED)) return;
  try {
    await api("GET", "/api/agent/session", undefined, { quiet401: true });
  } catch (e) {
    if (e.status === 401) { showLogin(t("sessionExpired")); return; }
    setTimeout(reconnect, state.retryMs);
    return;
  }
  startEvents();
  loadAll();                                  // a new stream has no Last-Event-ID: catch up
  const id = conversation.currentId();
  if (id) conversation.openConversation(id);
}

/** "live" at once; "reconnecting" / "offline" only if it lasts (the server ends streams now and then). */
function setLive(kind) {
  const el = $("live-status");
  clearTimeout(state.liveTimer);
  const show = () => {
    el.hidden = false;
    el.className = "live live-" + kind;
    el.textContent = t(kind === "live" ? "live" : kind === "offline" ? "offline" : "reconnecting");
  };
  if (kind === "live") show(); else state.liveTimer = setTimeout(show, 5000);
}

function onHandoff(d) {
  const c = d.conversation;
  if (!c) return;
  upsert(c, String(c.id) !== conversation.currentId());
  renderInbox();
  announce(t("announceHandoff", { summary: c.summary || c.last_message || "" }));
}

async function onMessage(d) {
  const id = String(d.conversation_id), m = d.message || {};
  const viewing = id === conversation.currentId();
  if (!state.items[id]) {     // a conversation we have not listed yet
    try {
      const c = await api("GET", "/api/agent/conversations/" + encodeURIComponent(id));
      upsert({ id: id, status: c.status, summary: c.summary, assignee: c.assignee, queue_position: null }, false);
    } catch (e) { return; }
  }
  const patch = { last_message: m.content, updated_at: m.created_at || new Date().toISOString() };
  if (m.role === "user" && !viewing) patch.unread = true;
  Object.assign(state.items[id], patch);
  renderInbox();
  conversation.onMessageEvent(id, m);
  if (m.role === "user" && !viewing) announce(t("announceMessage"));
}

function onStatus(d) {
  const id = String(d.conversation_id);
  const old = state.items[id];
  if (old) {
    Object.assign(old, { status: d.status, assignee: d.assignee || null, updated_at: new Date().toISOString() });
    if (d.status !== "pending_human") old.queue_position = null;
  }
  conversation.onStatusEvent(id, d.status, d.assignee);
  renderInbox();
  // queue positions of the others moved: refresh the waiting list once things settle
  clearTimeout(state.pendingRefresh);
  state.pendingRefresh = setTimeout(() => loadStatus("pending_human").then(renderInbox, () => {}), 800);
}

/* ------------------------------------------------------------------ shortcuts, language, misc */

const SHORTCUTS = [["j", "sc_next"], ["k", "sc_prev"], ["c", "sc_claim"], ["r", "sc_reply"], ["s", "sc_suggest"],
  ["e", "sc_resolve"], ["Ctrl+Enter", "sc_send"], ["Esc", "sc_escape"], ["1–8", "sc_tabs"], ["?", "sc_help"]];

function onKey(e) {
  if (e.defaultPrevented || e.ctrlKey || e.metaKey || e.altKey || e.isComposing) return;
  if (isTypingTarget(e.target) || $("app-view").hidden || $("shortcuts-dialog").open) return;
  const inConversation = !PANELS.includes(state.tab);
  const act = {
    j: () => inConversation && move(1), k: () => inConversation && move(-1),
    c: () => conversation.claim(), e: () => conversation.resolve(), r: () => conversation.focusReply(),
    s: () => conversation.suggest(true), "?": showShortcuts,
    1: () => selectTab("pending_human", true), 2: () => selectTab("human", true), 3: () => selectTab("open", true),
    4: () => selectTab("resolved", true), 5: () => selectTab("reports", true), 6: () => selectTab("gaps", true),
    7: () => selectTab("faq", true), 8: () => selectTab("webhooks", true),
  }[e.key];
  if (!act) return;
  e.preventDefault();
  act();
}

function showShortcuts() {
  const dl = $("shortcuts-list");
  dl.textContent = "";
  SHORTCUTS.forEach((s) => {
    dl.appendChild(h("dt", null, [h("kbd", { text: s[0] })]));
    dl.appendChild(h("dd", { text: t(s[1]) }));
  });
  $("shortcuts-dialog").showModal();
}

function renderLangToggle() {
  const b = $("lang-toggle");
  b.textContent = "";
  b.append(icon("globe"), " " + t("langToggle"));       // the globe draws without any emoji or CJK font
  b.setAttribute("aria-label", t("langToggleLabel"));
  b.setAttribute("lang", lang() === "zh" ? "en" : "zh-CN");
}

function toggleLang() {
  setLang(lang() === "zh" ? "en" : "zh", true);
  translateShell(document);
  renderLangToggle();
  if (state.agent) $("agent-name").textContent = t("signedInAs", { name: state.agent.name || state.agent.email });
  renderInbox();
  conversation.render();
  renderReports();
  renderGaps();
  renderFaq();
  renderWebhooks();
  if (!$("live-status").hidden) setLive(($("live-status").className.match(/live-(\w+)/) || [])[1] || "live");
}

function announce(text) {
  const el = $("announcer");
  el.textContent = "";
  setTimeout(() => { el.textContent = text; }, 50);    // a change, even when the text repeats
}

function wire() {
  $("login-form").addEventListener("submit", login);
  $("logout").addEventListener("click", logout);
  $("lang-toggle").addEventListener("click", toggleLang);
  $("shortcuts-button").addEventListener("click", showShortcuts);
  $("inbox-more").addEventListener("click", () => {
    const s = state.tab;
    loadStatus(s, state.next[s]).then(() => { state.listError = ""; }, (e) => { state.listError = describe(e); }).then(renderInbox);
  });
  TABS.forEach((s) => $("tab-" + s).addEventListener("click", () => selectTab(s, false)));
  $("tabs").addEventListener("keydown", onTabKey);
  document.addEventListener("keydown", onKey);
}

boot();
