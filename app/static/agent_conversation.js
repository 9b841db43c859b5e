/*
 * The conversation view: transcript (roles distinct, bot citations as links), handoff summary,
 * customer feedback, contact email; claim / resolve; the reply box with the assistant's
 * suggested draft (shown marked, editable, never sent by itself) and throttled typing notices.
 *
 *   initConversation({me, onChange, announce})   me() -> the signed-in agent; onChange(patch, follow)
 *                                                  tells the inbox {id, status?, assignee?, ...}
 *                                                  (follow: show the tab it is in now)
 */
import { t } from "./agent_i18n.js";
import { $, ApiError, api, describe, fullTime, h, icon, safeHref, shortTime } from "./agent_util.js";

const TYPING_REFRESH_MS = 3000;   // while typing, re-send "typing: true" at most this often
const TYPING_IDLE_MS = 4000;      // no keystroke for this long: "typing: false"
const CSAT_POLL_MS = 5000;        // a resolved conversation on screen: look for its rating
const CSAT_POLL_FOR_MS = 120000;

const conv = {
  id: null, data: null,
  seen: {},                       // message index -> true (live events and our own POSTs overlap)
  drafts: {},                     // conversation id -> unsent reply text
  suggestion: null,               // the suggested draft text, while it is in (or offered to) the box
  typing: false, typingSentAt: 0, typingTimer: null,
  pollTimer: null, pollUntil: 0, loadSeq: 0,
};
let hooks = { me: () => null, onChange: () => {}, announce: () => {} };

const path = (id, suffix) => "/api/agent/conversations/" + encodeURIComponent(id) + (suffix || "");

export function initConversation(options) {
  hooks = Object.assign(hooks, options);
  $("claim").addEventListener("click", claim);
  $("resolve").addEventListener("click", resolve);
  $("refresh").addEventListener("click", () => { if (conv.id) openConversation(conv.id, { keepFocus: true }); });
  $("suggest").addEventListener("click", () => suggest(true));
  $("suggestion-use").addEventListener("click", useSuggestion);
  $("reply-form").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  const input = $("reply-input");
  input.addEventListener("input", onReplyInput);
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey) && !e.isComposing) { e.preventDefault(); send(); }
    else if (e.key === "Escape") { e.preventDefault(); $("conversation").focus(); }
  });
  input.addEventListener("blur", () => stopTyping());
}

export const currentId = () => conv.id;

export function closeConversation() {
  leave();
  conv.id = null;
  conv.data = null;
  $("conv-body").hidden = true;
  $("conv-empty").hidden = false;
}

/** Show conversation `id` (fetched fresh). */
export async function openConversation(id, opts) {
  if (conv.id !== id) {
    leave();
    conv.id = id;
    conv.data = null;
    $("reply-input").value = conv.drafts[id] || "";
    clearSuggestion();
    $("transcript").textContent = "";
    $("feedback-list").textContent = "";
    $("conv-summary").textContent = "";
  }
  $("conv-empty").hidden = true;
  $("conv-body").hidden = false;
  $("conv-error").textContent = "";
  $("reply-error").textContent = "";
  const seq = ++conv.loadSeq;
  try {
    const data = await api("GET", path(id));
    if (seq !== conv.loadSeq || conv.id !== id) return;     // another conversation was opened meanwhile
    conv.data = data;
    render();
  } catch (e) {
    if (seq === conv.loadSeq) $("conv-error").textContent = describe(e);
  }
  if (opts && opts.focus) $("conversation").focus();
}

/** Save the draft and stop the typing notice of the conversation we leave. */
function leave() {
  if (conv.id) conv.drafts[conv.id] = $("reply-input").value;
  stopTyping();
  clearTimeout(conv.pollTimer);
  conv.pollUntil = 0;
}

/** Re-render everything (after a fetch or a language switch). */
export function render() {
  const d = conv.data;
  if (!d) return;
  $("conv-title").textContent = t("conversationTitle", { id: String(d.id || conv.id).slice(0, 8) });
  $("conv-summary").textContent = d.summary || t("noSummary");
  const contact = $("conv-contact");
  contact.textContent = "";
  if (d.contact_email) {
    const email = String(d.contact_email);
    contact.appendChild(document.createTextNode(t("contact", { email: "" })));
    contact.appendChild(h("a", { href: "mailto:" + encodeURIComponent(email).replace(/%40/g, "@"), text: email }));
  }
  const list = $("transcript");
  list.setAttribute("aria-busy", "true");     // a full render is not a stream of new messages
  list.textContent = "";
  conv.seen = {};
  (d.messages || []).forEach((m) => appendMessage(m, true));
  list.setAttribute("aria-busy", "false");
  list.scrollTop = list.scrollHeight;
  renderFeedback(d.feedback || []);
  renderState();
  if (d.status === "resolved") pollForRating();
}

function roleLabel(m) {
  if (m.role === "agent") return m.author && m.author.name ? t("agentAuthor", { name: m.author.name }) : t("role_agent");
  return t("role_" + (["user", "assistant", "system"].indexOf(m.role) >= 0 ? m.role : "system"));
}

function messageNode(m) {
  const role = ["user", "assistant", "agent", "system"].indexOf(m.role) >= 0 ? m.role : "system";
  const li = h("li", { class: "msg msg-" + role, "data-testid": "message", "data-role": role,
    "data-index": typeof m.index === "number" ? m.index : null }, [
    h("div", { class: "msg-head" }, [
      h("span", { class: "msg-author", text: roleLabel(m) }),
      m.created_at ? h("time", { datetime: String(m.created_at), title: fullTime(m.created_at), text: shortTime(m.created_at) }) : null,
    ]),
    h("div", { class: "msg-text", text: String(m.content == null ? "" : m.content) }),
  ]);
  const cites = (Array.isArray(m.citations) ? m.citations : []).filter((c) => c && (c.url || c.source || c.title));
  if (cites.length) {
    li.appendChild(h("div", { class: "msg-sources" }, [h("span", { class: "muted", text: t("sources") + " " })].concat(
      cites.map((c) => {
        const href = safeHref(c.url || c.source);
        const label = String(c.title || c.url || c.source);
        return href ? h("a", { href: href, target: "_blank", rel: "noopener noreferrer", "data-testid": "citation", text: label })
          : h("span", { "data-testid": "citation", text: label });
      }))));
  }
  if (role === "assistant" && m.grounding) {
    li.appendChild(h("span", { class: "tag", text: t("grounding", { value: String(m.grounding) }) }));
  }
  const act = m.action;
  if (role === "assistant" && act && typeof act.name === "string") {
    const args = act.arguments && typeof act.arguments === "object" ? JSON.stringify(act.arguments) : "";
    li.appendChild(h("span", { class: "tag", "data-testid": "message-action", title: args,
      text: t("action", { name: act.name, status: String(act.status) }) }));
  }
  return li;
}

/** Add a message unless its index is already shown. */
function appendMessage(m, bulk) {
  if (!m) return false;
  if (typeof m.index === "number") {
    if (conv.seen[m.index]) return false;
    conv.seen[m.index] = true;
  }
  const list = $("transcript");
  const stick = list.scrollHeight - list.scrollTop - list.clientHeight < 80;
  list.appendChild(messageNode(m));
  if (!bulk && stick) list.scrollTop = list.scrollHeight;
  return true;
}

function renderFeedback(items) {
  const ul = $("feedback-list");
  ul.textContent = "";
  $("transcript").querySelectorAll(".msg-rated").forEach((n) => n.remove());
  if (!items.length) { ul.appendChild(h("li", { class: "muted", text: t("noFeedback") })); return; }
  items.forEach((f) => {
    const li = f.kind === "csat" ? csatNode(f) : thumbsNode(f);
    ul.appendChild(li);
    if (f.kind !== "csat" && typeof f.message_index === "number") {   // mark the rated bot reply too
      const msg = $("transcript").querySelector('[data-index="' + f.message_index + '"]');
      if (msg) msg.appendChild(h("span", { class: "tag msg-rated" },
        [icon("thumbUp", null, f.rating !== "up"), " " + t(f.rating === "up" ? "thumbsUp" : "thumbsDown")]));
    }
  });
}

function csatNode(f) {
  const n = Math.max(0, Math.min(5, parseInt(f.rating, 10) || 0));
  return h("li", { class: "fb fb-csat", "data-testid": "csat", "data-rating": n }, [
    h("span", { class: "stars", "aria-hidden": "true", text: "★★★★★".slice(0, n) + "☆☆☆☆☆".slice(0, 5 - n) }),
    h("span", { class: "fb-label", text: t("csat", { n: n }) }),
    f.comment ? h("q", { class: "fb-comment", "data-testid": "csat-comment", text: String(f.comment) }) : null,
  ]);
}

function thumbsNode(f) {
  const up = f.rating === "up";
  return h("li", { class: "fb fb-thumbs", "data-testid": "feedback-item", "data-rating": up ? "up" : "down" }, [
    icon("thumbUp", null, !up),
    h("span", { class: "fb-label", text: t(up ? "thumbsUp" : "thumbsDown") +
      (typeof f.message_index === "number" ? " · " + t("onMessage", { n: f.message_index + 1 }) : "") }),
    f.comment ? h("q", { class: "fb-comment", text: String(f.comment) }) : null,
  ]);
}

function mine() {
  const d = conv.data, me = hooks.me();
  return !!(d && d.assignee && me && String(d.assignee.id) === String(me.id));
}

const canReply = () => !!(conv.data && conv.data.status === "human" && mine());

/** Status badge, assignee line, and which actions are possible now. */
function renderState() {
  const d = conv.data;
  if (!d) return;
  const badge = $("conv-status");
  badge.textContent = t("status_" + d.status);
  badge.className = "badge badge-" + d.status;
  const who = d.assignee ? d.assignee.name + (mine() ? " (" + t("you") + ")" : "") : null;
  $("conv-assignee").textContent = who ? t("assignedTo", { name: who }) : (d.status === "pending_human" ? t("unassigned") : "");
  const takenByOther = !!(d.assignee && !mine() && d.status === "human");
  const claim = $("claim");
  claim.disabled = d.status === "resolved" || takenByOther || (d.status === "human" && mine());
  claim.textContent = d.status === "human" && mine() ? t("claimed") : t("claim");
  $("resolve").disabled = d.status === "resolved" || takenByOther;
  $("reply-send").disabled = !canReply();
  $("suggest").disabled = d.status === "resolved";
  $("reply-state").textContent = canReply() ? "" : d.status === "resolved" ? t("replyResolved")
    : takenByOther ? t("replyOther", { name: d.assignee.name }) : t("replyClaimFirst");
}

/** A live `message` event for some conversation. */
export function onMessageEvent(id, message) {
  if (id !== conv.id || !conv.data || !message) return;
  if (appendMessage(message)) (conv.data.messages = conv.data.messages || []).push(message);
}

/** A live `status` event for some conversation. */
export function onStatusEvent(id, status, assignee) {
  if (id !== conv.id || !conv.data) return;
  const was = conv.data.status;
  conv.data.status = status;
  conv.data.assignee = assignee || null;
  renderState();
  if (status === "human" && assignee && !mine() && was !== "human") {
    $("conv-error").textContent = t("claimedByOther", { name: assignee.name });
  }
  if (status === "resolved") { stopTyping(); pollForRating(); }
}

export async function claim() {
  const d = conv.data;
  if (!d || $("claim").disabled) return;
  const id = conv.id;
  $("claim").disabled = true;
  $("conv-error").textContent = "";
  try {
    const res = await api("POST", path(id, "/claim"));
    if (conv.id !== id) return;
    d.status = res.status || "human";
    d.assignee = res.assignee || d.assignee;
    renderState();
    hooks.onChange({ id: id, status: d.status, assignee: d.assignee }, true);   // the list follows it
    hooks.announce(t("announceClaimed"));
    focusReply();
    if (!$("reply-input").value.trim()) suggest(false);
  } catch (e) {
    $("conv-error").textContent = e.status === 409 ? (e.message || t("claimConflict")) : describe(e);
    if (e.status === 409) openConversation(id, { keepFocus: true });
    else renderState();
  }
}

export async function resolve() {
  const d = conv.data;
  if (!d || $("resolve").disabled) return;
  const id = conv.id;
  $("resolve").disabled = true;
  $("conv-error").textContent = "";
  try {
    const res = await api("POST", path(id, "/resolve"));
    stopTyping();
    if (conv.id !== id) return;
    d.status = res.status || "resolved";
    renderState();
    hooks.onChange({ id: id, status: d.status, assignee: d.assignee });
    hooks.announce(t("announceResolved"));
    pollForRating();
  } catch (e) {
    $("conv-error").textContent = describe(e);
    renderState();
  }
}

export function focusReply() {
  if (!conv.data) return;
  const input = $("reply-input");
  input.focus();
  input.setSelectionRange(input.value.length, input.value.length);
}

async function send() {
  const input = $("reply-input"), error = $("reply-error");
  const content = input.value.trim();
  error.textContent = "";
  if (!conv.data) return;
  if (!content) { error.textContent = t("replyEmpty"); return; }
  if (!canReply()) { error.textContent = t("replyNotClaimed"); return; }
  const id = conv.id, button = $("reply-send");
  button.disabled = true;
  button.textContent = t("sending");
  try {
    const res = await api("POST", path(id, "/messages"), { content: content });
    stopTyping();
    const message = res.message || { role: "agent", content: content };
    if (conv.id === id) {
      onMessageEvent(id, message);
      if (input.value.trim() === content) input.value = "";
      clearSuggestion();
    }
    delete conv.drafts[id];
    hooks.onChange({ id: id, last_message: message.content, updated_at: message.created_at || new Date().toISOString() });
    hooks.announce(t("announceSent"));
  } catch (e) {
    error.textContent = e.status === 409 ? t("replyNotClaimed") + (e.message ? " (" + e.message + ")" : "") : describe(e);
    if (e.status === 409) openConversation(id, { keepFocus: true });
  } finally {
    button.textContent = t("send");
    renderState();
  }
}

/** Ask the assistant for a draft; it goes into an empty box, else it is offered beside it. */
export async function suggest(byHand) {
  if (!conv.data || conv.data.status === "resolved") return;
  const id = conv.id, button = $("suggest");
  button.disabled = true;
  button.textContent = t("suggesting");
  $("reply-error").textContent = "";
  try {
    const res = await api("GET", path(id, "/suggestion"));
    if (conv.id !== id) return;
    const text = String(res.suggestion || "").trim();
    if (!text) { if (byHand) $("reply-error").textContent = t("suggestionEmpty"); return; }
    const input = $("reply-input");
    const replaceable = !input.value.trim() || input.value === conv.suggestion;
    conv.suggestion = text;
    $("suggestion-note").hidden = false;
    $("suggestion-text").hidden = replaceable;
    $("suggestion-use").hidden = replaceable;
    $("suggestion-text").textContent = replaceable ? "" : text;
    const sources = $("suggestion-sources");
    sources.textContent = "";
    (Array.isArray(res.citations) ? res.citations : []).forEach((c) => {
      const href = c && safeHref(c.url || c.source);
      if (href) sources.appendChild(h("a", { href: href, target: "_blank", rel: "noopener noreferrer", text: String(c.title || href) }));
    });
    if (replaceable) {
      input.value = text;
      input.classList.add("is-suggestion");
    }
  } catch (e) {
    if (conv.id === id && (byHand || !(e instanceof ApiError) || e.status !== 404)) $("reply-error").textContent = describe(e);
  } finally {
    button.textContent = t("suggest");
    renderState();
  }
}

function useSuggestion() {
  if (!conv.suggestion) return;
  const input = $("reply-input");
  input.value = conv.suggestion;
  input.classList.add("is-suggestion");
  $("suggestion-text").hidden = true;
  $("suggestion-use").hidden = true;
  focusReply();
}

function clearSuggestion() {
  conv.suggestion = null;
  $("suggestion-note").hidden = true;
  $("suggestion-text").textContent = "";
  $("suggestion-sources").textContent = "";
  $("reply-input").classList.remove("is-suggestion");
}

function onReplyInput() {
  const input = $("reply-input");
  if (!input.value.trim()) { clearSuggestion(); stopTyping(); return; }
  if (!canReply()) return;
  const now = Date.now();
  if (!conv.typing || now - conv.typingSentAt > TYPING_REFRESH_MS) {
    conv.typing = true;
    conv.typingSentAt = now;
    postTyping(conv.id, true);
  }
  clearTimeout(conv.typingTimer);
  conv.typingTimer = setTimeout(stopTyping, TYPING_IDLE_MS);
}

function stopTyping() {
  clearTimeout(conv.typingTimer);
  if (!conv.typing) return;
  conv.typing = false;
  postTyping(conv.id, false);
}

function postTyping(id, typing) {
  if (id) api("POST", path(id, "/typing"), { typing: typing }).catch(() => { /* best effort */ });
}

/** The customer rates after the resolve; no event says so, so look again for a while. */
function pollForRating() {
  clearTimeout(conv.pollTimer);
  if (!conv.pollUntil || conv.pollUntil < Date.now()) conv.pollUntil = Date.now() + CSAT_POLL_FOR_MS;
  const id = conv.id;
  const tick = async () => {
    if (conv.id !== id || !conv.data || conv.data.status !== "resolved" || Date.now() > conv.pollUntil) return;
    if ((conv.data.feedback || []).some((f) => f.kind === "csat")) return;
    try {
      const data = await api("GET", path(id));
      if (conv.id !== id) return;
      conv.data.feedback = data.feedback || [];
      conv.data.status = data.status;
      renderFeedback(conv.data.feedback);
    } catch (e) { /* try again on the next tick */ }
    conv.pollTimer = setTimeout(tick, CSAT_POLL_MS);
  };
  conv.pollTimer = setTimeout(tick, CSAT_POLL_MS);
}
