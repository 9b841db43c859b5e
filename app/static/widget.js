/*!
 * Northwind support chat widget: dependency-free, embeddable, ES2019.
 *
 *   <script src="https://support.example.com/static/widget.js" data-site-key="demo-site-key"></script>
 *
 * Optional attributes on the script tag:
 *   data-api-base  API origin (default: the origin of this script's src)
 *   data-lang      "en" | "zh" (default: navigator.language, zh* -> Chinese)
 *   data-title     header title
 *   data-color     accent colour (any CSS colour)
 *
 * Everything lives in an open Shadow DOM root, so host-page CSS does not leak in and ours
 * does not leak out. Untrusted text (user input, model replies, citations) only ever reaches
 * the DOM through textContent / createTextNode, never innerHTML.
 * window.NorthwindChat = { open(), close(), toggle(), reset() } for host pages.
 *
 * Human handoff: once the customer asks for a human (or the bot hands over), messages go to the
 * agent (the server answers {"reply": null, "status", "waiting"}), and GET .../events (SSE,
 * EventSource, site key in the query) brings the agent's messages, typing and status; a resolved
 * conversation asks for a 1-5 rating and goes back to the bot.
 */
(function () {
  "use strict";

  // document.currentScript is only set while this file first executes: capture it now.
  const script = document.currentScript ||
    document.querySelector('script[data-site-key][src*="widget"]');
  if (!script || window.NorthwindChat) return; // no tag found, or already loaded once

  /* ------------------------------------------------------------------ config */

  const attr = (name) => (script.getAttribute(name) || "").trim();
  const siteKey = attr("data-site-key");
  const apiBase = (attr("data-api-base") || originOf(script.src)).replace(/\/+$/, "");
  const lang = (attr("data-lang") || navigator.language || "en").toLowerCase().indexOf("zh") === 0
    ? "zh" : "en";
  const STORE_KEY = "nw-chat:" + siteKey + ":session";

  function originOf(src) {
    try { return new URL(src, location.href).origin; } catch (e) { return location.origin; }
  }

  /* ------------------------------------------------------------------ strings */

  const STRINGS = {
    en: {
      title: "Northwind support", open: "Open support chat", close: "Close support chat",
      greeting: "Hi! Ask us about orders, shipping, returns or your account.",
      placeholder: "Type your message…", inputLabel: "Message", send: "Send message",
      typing: "The assistant is typing",
      handoff: "Talk to a human", handoffAria: "Ask to talk to a human agent",
      handoffRequested: "Human requested",
      handoffNotice: "You've asked to talk to a human. A support agent will join this conversation shortly.",
      handoffFailed: "Sorry, we couldn't reach a human agent right now. Please try again.",
      helpful: "Helpful", notHelpful: "Not helpful", thanks: "Thanks",
      feedbackFailed: "Couldn't send feedback", sources: "Sources",
      confirm: "Confirm", cancel: "Cancel", actionFailed: "Couldn't send your answer. Please try again.",
      degraded: "Limited mode", degradedTitle: "The assistant is running in limited mode; answers may be less complete.",
      error: "Sorry, something went wrong.", network: "Connection problem. Please check your network.",
      interrupted: "The reply was interrupted.", retry: "Retry", retryAria: "Resend your last message",
      waiting: "Waiting for an agent…", waitingQueue: "Waiting for an agent — you are number {n} in the queue.",
      outsideHours: "Our team is away until {time}. Leave your email and we'll reply there.",
      outsideHoursUnknown: "Our team is away right now. Leave your email and we'll reply there.",
      offerEmail: "Leave your email and we'll reply", emailLabel: "Your email", emailPlaceholder: "you@example.com",
      emailSend: "Send", emailInvalid: "Please enter a valid email address.", emailThanks: "Thanks! We'll reply to {email}.",
      emailFailed: "Couldn't save your email. Please try again.",
      offerBot: "Go back to the assistant", backToBot: "You're back with the assistant. Ask away!",
      cancelFailed: "Couldn't go back to the assistant. Please try again.",
      agentLabel: "{name} (support)", agentFallback: "Support agent", agentTyping: "{name} is typing…",
      agentJoined: "{name} joined the conversation",
      resolvedNotice: "This conversation with our support team is closed. The assistant can help with anything else.",
      csatQuestion: "How would you rate this conversation?", csatStar: "{n} star", csatStars: "{n} stars",
      csatComment: "Comment (optional)", csatSubmit: "Send rating", csatPick: "Choose a rating first.",
      csatThanks: "Thanks for your rating", csatFailed: "Couldn't send your rating. Please try again.",
    },
    zh: {
      title: "Northwind 客服", open: "打开客服聊天", close: "关闭客服聊天",
      greeting: "您好!有关订单、配送、退货或账户的问题都可以问我。",
      placeholder: "输入您的问题…", inputLabel: "消息", send: "发送消息",
      typing: "客服正在输入",
      handoff: "转人工客服", handoffAria: "请求人工客服", handoffRequested: "已请求人工",
      handoffNotice: "已为您转接人工客服,客服人员将尽快加入对话。",
      handoffFailed: "抱歉,暂时无法转接人工客服,请稍后再试。",
      helpful: "有帮助", notHelpful: "没有帮助", thanks: "谢谢",
      feedbackFailed: "反馈发送失败", sources: "参考资料",
      confirm: "确认", cancel: "取消", actionFailed: "发送失败，请重试。",
      degraded: "有限模式", degradedTitle: "服务当前处于有限模式,回答可能不够完整。",
      error: "抱歉,出现了问题。", network: "网络连接出现问题,请检查网络。",
      interrupted: "回复中断了。", retry: "重试", retryAria: "重新发送上一条消息",
      waiting: "正在等待人工客服…", waitingQueue: "正在等待人工客服——您目前排在第 {n} 位。",
      outsideHours: "客服团队目前不在线,将于 {time} 回来。请留下邮箱,我们会通过邮件回复您。",
      outsideHoursUnknown: "客服团队目前不在线。请留下邮箱,我们会通过邮件回复您。",
      offerEmail: "留下邮箱,我们会回复您", emailLabel: "您的邮箱", emailPlaceholder: "you@example.com",
      emailSend: "提交", emailInvalid: "请输入有效的邮箱地址。", emailThanks: "谢谢!我们会回复到 {email}。",
      emailFailed: "邮箱保存失败,请重试。",
      offerBot: "返回智能助手", backToBot: "已返回智能助手,请继续提问。",
      cancelFailed: "无法返回智能助手,请重试。",
      agentLabel: "{name}(客服)", agentFallback: "客服人员", agentTyping: "{name} 正在输入…",
      agentJoined: "{name} 已加入对话",
      resolvedNotice: "本次人工客服对话已结束。如有其他问题,智能助手可以继续为您解答。",
      csatQuestion: "您对本次服务满意吗?", csatStar: "{n} 星", csatStars: "{n} 星",
      csatComment: "留言(可选)", csatSubmit: "提交评价", csatPick: "请先选择评分。",
      csatThanks: "感谢您的评价", csatFailed: "评价提交失败,请重试。",
    },
  };
  const t = (key) => STRINGS[lang][key] || STRINGS.en[key] || key;
  /** t(key) with "{name}" placeholders filled from vars (plain text, inserted via textContent). */
  const tf = (key, vars) => t(key).replace(/\{(\w+)\}/g, (m, k) => (vars && vars[k] != null ? String(vars[k]) : m));

  /* ------------------------------------------------------------------ DOM helpers */

  /** h("div", {class: "x", text: "hi", onclick: fn}, [children]) -> element (text is textContent). */
  function h(tag, attrs, children) {
    const el = document.createElement(tag);
    Object.keys(attrs || {}).forEach((k) => {
      const v = attrs[k];
      if (v == null || v === false) return;
      if (k === "text") el.textContent = v;
      else if (k.slice(0, 2) === "on") el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : String(v));
    });
    (children || []).forEach((c) => {
      if (c != null) el.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    });
    return el;
  }

  function setChildren(el, node) { el.textContent = ""; el.appendChild(node); }

  // tiny inline SVG; `d` is a constant path from this file, never user data. Emoji are not used:
  // they render as empty boxes where no emoji font is installed. `flip`: upside down.
  function icon(d, flip) {
    const ns = "http://www.w3.org/2000/svg", svg = document.createElementNS(ns, "svg");
    const path = svg.appendChild(document.createElementNS(ns, "path"));
    path.setAttribute("d", d);
    if (flip) path.setAttribute("transform", "rotate(180 12 12)");
    [["viewBox", "0 0 24 24"], ["aria-hidden", "true"], ["focusable", "false"]].forEach((a) => svg.setAttribute(a[0], a[1]));
    return svg;
  }
  const ICON_CHAT = "M4 3h16a2 2 0 0 1 2 2v11a2 2 0 0 1-2 2H9l-5 4v-4a2 2 0 0 1-2-2V5a2 2 0 0 1 2-2z";
  const ICON_CLOSE = "M6.4 5 5 6.4 10.6 12 5 17.6 6.4 19l5.6-5.6 5.6 5.6 1.4-1.4-5.6-5.6L19 6.4 17.6 5 12 10.6z";
  const ICON_SEND = "M3 20.5 21.5 12 3 3.5V10l13 2-13 2z";
  const ICON_THUMB = "M2 10h4v11H2zM8 21V10l4.6-7.2c.8-1.2 2.7-.6 2.6.9L14.8 9H20a2 2 0 0 1 2 2.3l-1.3 8A2 2 0 0 1 18.7 21z";

  /* ------------------------------------------------------------------ safe Markdown */

  /** An absolute http/https/mailto URL, normalised, or null for anything else. */
  function safeUrl(raw) {
    try {
      const u = new URL(String(raw).trim());
      return ["http:", "https:", "mailto:"].indexOf(u.protocol) >= 0 ? u.href : null;
    } catch (e) { return null; }
  }

  function link(href) {
    return h("a", { href: href, target: "_blank", rel: "noopener noreferrer nofollow" });
  }

  // Inline syntax, in priority order: `code`, **bold**, *italic*, [label](url), bare http(s) URL.
  const INLINE = /`([^`\n]+)`|\*\*(?!\s)(.+?)\*\*|\*(?![\s*])([^*\n]+?)\*|\[([^\]\n]+)\]\(\s*([^)\s]+)\s*\)|(https?:\/\/[^\s<>]*[^\s<>.,;:!?)\]'"*])/g;

  /** Append inline-formatted `text` to `parent` as DOM nodes (no HTML parsing anywhere). */
  function appendInline(parent, text, inLink) {
    const re = new RegExp(INLINE.source, "g");
    let last = 0, m;
    while ((m = re.exec(text))) {
      if (m.index > last) parent.appendChild(document.createTextNode(text.slice(last, m.index)));
      if (m[1] != null) {
        parent.appendChild(h("code", { text: m[1] }));
      } else if (m[2] != null || m[3] != null) {
        const el = h(m[2] != null ? "strong" : "em");
        appendInline(el, m[2] != null ? m[2] : m[3], inLink);
        parent.appendChild(el);
      } else if (m[4] != null) {
        const href = !inLink && safeUrl(m[5]);
        const el = href ? link(href) : h("span");
        appendInline(el, m[4], true); // unsafe URL: keep the label as plain text, drop the link
        parent.appendChild(el);
      } else {
        const href = !inLink && safeUrl(m[6]);
        const el = href ? link(href) : h("span");
        el.textContent = m[6];
        parent.appendChild(el);
      }
      last = re.lastIndex;
    }
    if (last < text.length) parent.appendChild(document.createTextNode(text.slice(last)));
  }

  /**
   * Block-level Markdown subset -> DocumentFragment: paragraphs (single newlines become <br>),
   * "- "/"* " bullet lists, "1. " numbered lists, ``` code fences, "#" headings (shown bold).
   */
  function renderMarkdown(src) {
    const frag = document.createDocumentFragment();
    const lines = String(src || "").replace(/\r\n?/g, "\n").split("\n");
    let para = [], list = null;
    const flushPara = () => {
      if (!para.length) return;
      const p = h("p");
      para.forEach((line, i) => { if (i) p.appendChild(h("br")); appendInline(p, line); });
      frag.appendChild(p);
      para = [];
    };
    const flushList = () => { if (list) frag.appendChild(list); list = null; };

    for (let i = 0; i < lines.length; i++) {
      const line = lines[i];
      let m;
      if (/^\s*```/.test(line)) { // fenced code block (an unclosed fence runs to the end)
        flushPara(); flushList();
        const code = [];
        while (++i < lines.length && !/^\s*```/.test(lines[i])) code.push(lines[i]);
        frag.appendChild(h("pre", null, [h("code", { text: code.join("\n") })]));
      } else if (!line.trim()) {
        flushPara(); flushList();
      } else if ((m = /^\s*(?:([-*+•])|(\d+)[.)])\s+(.*)$/.exec(line))) {
        flushPara();
        const tag = m[1] ? "ul" : "ol";
        if (!list || list.tagName.toLowerCase() !== tag) { flushList(); list = h(tag); }
        const li = h("li");
        appendInline(li, m[3]);
        list.appendChild(li);
      } else if (list && /^\s+\S/.test(line)) { // indented continuation of the last list item
        const li = list.lastChild;
        li.appendChild(document.createTextNode(" "));
        appendInline(li, line.trim());
      } else if ((m = /^#{1,6}\s+(.*)$/.exec(line))) {
        flushPara(); flushList();
        const p = h("p", { class: "nw-heading" });
        appendInline(p, m[1]);
        frag.appendChild(p);
      } else {
        flushList();
        para.push(line);
      }
    }
    flushPara(); flushList();
    return frag;
  }

  /** Citation link: absolute http(s) URLs as-is, other schemes unlinked, paths -> <api>/kb/<name>. */
  function citationUrl(source) {
    const s = String(source || "").trim();
    if (!s) return null;
    if (/^\/\//.test(s)) return safeUrl(location.protocol + s);
    if (/^[a-z][a-z0-9+.-]*:/i.test(s)) return safeUrl(s);
    const parts = s.replace(/^\.?\/+/, "").replace(/^kb\//, "").split("/")
      .filter((p) => p && p !== "." && p !== "..");
    return parts.length ? apiBase + "/kb/" + parts.map(encodeURIComponent).join("/") : null;
  }

  /* ------------------------------------------------------------------ storage + API */

  const store = { // localStorage can throw (privacy modes, sandboxed iframes): never fatal
    get() { try { return localStorage.getItem(STORE_KEY); } catch (e) { return null; } },
    set(v) { try { localStorage.setItem(STORE_KEY, v); } catch (e) { /* memory only */ } },
    clear() { try { localStorage.removeItem(STORE_KEY); } catch (e) { /* ignore */ } },
  };

  function apiError(status, message, kind) {
    const e = new Error(message || "HTTP " + status);
    e.status = status;
    e.kind = kind || "http"; // "http" | "network" | "interrupted" | "stream"
    e.detail = message || "";
    return e;
  }

  function headers(accept) {
    return { "X-Site-Key": siteKey, "Content-Type": "application/json", Accept: accept || "application/json" };
  }

  async function doFetch(path, init) {
    try { return await fetch(apiBase + path, init); } catch (e) { throw apiError(0, "", "network"); }
  }

  /** JSON request; non-2xx -> thrown error carrying the status and the body's "error". */
  async function api(method, path, body) {
    const res = await doFetch(path, {
      method: method, headers: headers(),
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const data = await res.json().catch(() => ({}));
    if (!res.ok) throw apiError(res.status, data && data.error);
    return data || {};
  }

  const sessionPath = (suffix) => "/api/chat/sessions/" + encodeURIComponent(state.sessionId) + (suffix || "");

  /**
   * POST a user message and read the SSE reply with fetch + ReadableStream (EventSource cannot
   * POST). Calls view.token(text) per "token" event and view.done(payload) on "done"; throws on
   * "error", on non-2xx, and when the stream ends without "done".
   */
  async function streamReply(content, view) {
    const res = await doFetch(sessionPath("/messages"), {
      method: "POST", headers: headers("text/event-stream"),
      body: JSON.stringify({ content: content, stream: true }),
    });
    if (!res.ok) {
      const data = await res.json().catch(() => ({}));
      throw apiError(res.status, data && data.error);
    }
    if (!res.body || (res.headers.get("content-type") || "").indexOf("text/event-stream") < 0) {
      view.done(await res.json()); // a server that answered in one JSON piece: same as "done"
      return;
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "", finished = false;

    const dispatch = (block) => { // one SSE event: "event:" + "data:" lines, ":" comments
      let name = "message";
      const data = [];
      block.split(/\r?\n/).forEach((line) => {
        if (!line || line[0] === ":") return;
        const i = line.indexOf(":");
        const field = i < 0 ? line : line.slice(0, i);
        let value = i < 0 ? "" : line.slice(i + 1);
        if (value[0] === " ") value = value.slice(1);
        if (field === "event") name = value;
        else if (field === "data") data.push(value);
      });
      if (!data.length) return;
      let payload;
      try { payload = JSON.parse(data.join("\n")); } catch (e) { payload = data.join("\n"); }
      if (typeof payload === "string") payload = { text: payload, error: payload }; // non-JSON data
      if (name === "token" || (name === "message" && payload && typeof payload.text === "string")) {
        view.token(String(payload.text || ""));
      } else if (name === "done") {
        finished = true;
        view.done(payload || {});
      } else if (name === "error") {
        finished = true;
        throw apiError(0, payload && payload.error, "stream");
      }
    };

    try {
      while (!finished) {
        let chunk;
        try { chunk = await reader.read(); } catch (e) { throw apiError(0, "", "interrupted"); }
        buffer += chunk.value ? decoder.decode(chunk.value, { stream: true }) : "";
        if (chunk.done) buffer += decoder.decode() + "\n\n"; // flush a last unterminated event
        let m;
        while (!finished && (m = /\r?\n\r?\n/.exec(buffer))) {
          const block = buffer.slice(0, m.index);
          buffer = buffer.slice(m.index + m[0].length);
          dispatch(block);
        }
        if (chunk.done) break;
      }
    } finally {
      reader.cancel().catch(() => {}); // stop reading after "done"/"error"; no-op at the end
    }
    if (!finished) throw apiError(0, "", "interrupted");
  }

  /* ------------------------------------------------------------------ state */

  const state = {
    sessionId: null,
    creating: null,   // in-flight POST /sessions promise
    ready: null,      // history restore promise; sends wait for it
    busy: false,      // a reply is streaming
    open: false,
    handoff: false,   // a human was asked for (pending_human or human): the notice was shown
    status: "open",   // the conversation: open | pending_human | human | resolved
    lastUserText: "",
    failed: [],       // nodes to remove when the user retries (error row, partial reply)
    events: null,     // EventSource of the live agent events, while a human is involved
    eventsRetry: null, eventsBackoff: 2000,
    seen: {},         // message index -> shown (live events, refetches and our own sends overlap)
    joined: "",       // the agent last announced as having joined
    waiting: {},      // the last waiting info: queue_position, offer_email, offer_bot
    contactLeft: false,
    agentShown: -1,   // the last agent message shown, and the last one reported seen (POST /seen):
    seenSent: -1,     // the email fallback mails only replies the customer has not seen here
    agentTyping: null, typingTimer: null,
  };

  async function ensureSession() {
    if (state.sessionId) return state.sessionId;
    if (!state.creating) {
      state.creating = api("POST", "/api/chat/sessions").then((d) => {
        if (!d.session_id) throw apiError(0, "no session_id");
        state.sessionId = String(d.session_id);
        store.set(state.sessionId);
        return state.sessionId;
      }).finally(() => { state.creating = null; });
    }
    return state.creating;
  }

  function forgetSession() { state.sessionId = null; store.clear(); }

  /** Run fn with a session; if the stored one expired (404), start a new one and try once more. */
  async function withSession(fn) {
    await ensureSession();
    try { return await fn(); } catch (e) {
      if (e.status !== 404) throw e;
      forgetSession();
      await ensureSession();
      return fn();
    }
  }

  /* ------------------------------------------------------------------ UI */

  const host = document.createElement("northwind-chat-widget");
  host.setAttribute("style", "all: initial !important; position: static !important; display: block !important;");
  const shadow = host.attachShadow({ mode: "open" });
  // Styles live in widget.css next to this file, loaded inside the shadow root (so they stay
  // scoped). The root stays invisible until the sheet has loaded, to avoid a flash of unstyled UI.
  const sheet = h("link", { rel: "stylesheet", href: new URL("widget.css", script.src).href });
  const root = h("div", { class: "nw-root", lang: lang });
  root.style.visibility = "hidden";
  const reveal = () => { root.style.visibility = ""; };
  sheet.addEventListener("load", reveal);
  sheet.addEventListener("error", reveal);
  const color = attr("data-color").replace(/[;{}<>\\]/g, "");
  if (color) root.style.setProperty("--nw-accent", color);

  const launcherIcon = h("span", { class: "nw-launcher-icon" }, [icon(ICON_CHAT)]);
  const launcher = h("button", {
    type: "button", class: "nw-launcher", "data-testid": "nw-launcher",
    "aria-label": t("open"), "aria-expanded": "false", "aria-controls": "nw-panel", onclick: () => toggle(),
  }, [launcherIcon]);

  const handoffBtn = h("button", {
    type: "button", class: "nw-handoff", "data-testid": "nw-handoff", "aria-label": t("handoff"),
    title: t("handoffAria"), text: t("handoff"), onclick: () => requestHandoff(),
  });
  const closeBtn = h("button", {
    type: "button", class: "nw-icon-btn", "aria-label": t("close"), title: t("close"),
    onclick: () => close(true),
  }, [icon(ICON_CLOSE)]);

  const log = h("div", { class: "nw-log", role: "log", "aria-live": "polite", "aria-label": t("title") }, [
    h("div", { class: "nw-greeting", text: t("greeting") }),
  ]);

  const input = h("textarea", {
    class: "nw-input", "data-testid": "nw-input", rows: "1", placeholder: t("placeholder"),
    "aria-label": t("inputLabel"), maxlength: "4000",
  });
  const sendBtn = h("button", {
    type: "submit", class: "nw-send", "data-testid": "nw-send", "aria-label": t("send"), title: t("send"),
  }, [icon(ICON_SEND)]);
  const composer = h("form", { class: "nw-composer", onsubmit: (e) => { e.preventDefault(); submit(); } },
    [input, sendBtn]);

  // While waiting for an agent: the queue position and, after a while, the email / bot offers.
  const waitText = h("span", { class: "nw-wait-text", role: "status", "data-testid": "nw-waiting-text" });
  const emailBtn = h("button", {
    type: "button", class: "nw-link-btn", "data-testid": "nw-offer-email", text: t("offerEmail"), hidden: true,
    onclick: () => { emailForm.hidden = false; emailBtn.hidden = true; emailInput.focus(); },
  });
  const botBtn = h("button", {
    type: "button", class: "nw-link-btn", "data-testid": "nw-offer-bot", text: t("offerBot"), hidden: true,
    onclick: () => cancelHandoff(),
  });
  const emailInput = h("input", {
    type: "email", class: "nw-email", "data-testid": "nw-email", "aria-label": t("emailLabel"),
    placeholder: t("emailPlaceholder"), autocomplete: "email", maxlength: "254",
  });
  const emailForm = h("form", { class: "nw-email-form", hidden: true, onsubmit: (e) => { e.preventDefault(); leaveEmail(); } }, [
    emailInput, h("button", { type: "submit", class: "nw-email-send", "data-testid": "nw-email-send", text: t("emailSend") }),
  ]);
  const emailStatus = h("div", { class: "nw-wait-status", "data-testid": "nw-email-status", "aria-live": "polite" });
  const waitBar = h("div", { class: "nw-waitbar", "data-testid": "nw-waiting", hidden: true }, [
    waitText, h("div", { class: "nw-offers" }, [emailBtn, botBtn]), emailForm, emailStatus,
  ]);

  const panel = h("section", {
    id: "nw-panel", class: "nw-panel", "data-testid": "nw-panel", role: "dialog",
    "aria-label": attr("data-title") || t("title"), hidden: true,
  }, [
    h("header", { class: "nw-header" }, [
      h("div", { class: "nw-title", text: attr("data-title") || t("title") }), handoffBtn, closeBtn,
    ]),
    log, waitBar, composer,
  ]);
  root.appendChild(panel);
  root.appendChild(launcher);
  shadow.appendChild(sheet);
  shadow.appendChild(root);

  // Enter sends, Shift+Enter inserts a newline; never send mid-IME composition (Chinese input).
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing && e.keyCode !== 229) {
      e.preventDefault();
      submit();
    }
  });
  input.addEventListener("input", autosize);
  panel.addEventListener("keydown", (e) => { if (e.key === "Escape") close(true); });

  function autosize() {
    input.style.height = "auto";
    input.style.height = Math.min(input.scrollHeight, 120) + "px";
  }

  /** Show or hide the panel; the launcher doubles as the close button while it is open. */
  function setOpen(isOpen, refocus) {
    state.open = isOpen;
    panel.hidden = !isOpen;
    launcher.setAttribute("aria-expanded", String(isOpen));
    launcher.setAttribute("aria-label", t(isOpen ? "close" : "open"));
    setChildren(launcherIcon, icon(isOpen ? ICON_CLOSE : ICON_CHAT));
    if (isOpen) { scrollToBottom(true); if (!state.busy) input.focus(); reportSeen(); } else if (refocus) launcher.focus();
  }
  const open = () => setOpen(true);
  const close = (refocus) => setOpen(false, refocus);
  const toggle = () => setOpen(!state.open);

  const nearBottom = () => log.scrollHeight - log.scrollTop - log.clientHeight < 60;
  function scrollToBottom(force) { if (force || nearBottom()) log.scrollTop = log.scrollHeight; }
  function append(node) { const stick = nearBottom(); log.appendChild(node); scrollToBottom(stick); return node; }

  function setBusy(busy) {
    state.busy = busy;
    input.disabled = busy;
    sendBtn.disabled = busy;
    log.setAttribute("aria-busy", busy ? "true" : "false");
    if (!busy && state.open) input.focus();
  }

  function addNotice(text, kind) {
    return append(h("div", { class: "nw-notice" + (kind ? " nw-notice-" + kind : ""), role: "status", "data-testid": "nw-notice", text: text }));
  }

  function addUserMessage(text) {
    return append(h("div", { class: "nw-row nw-row-user" }, [
      h("div", { class: "nw-msg nw-msg-user", "data-testid": "nw-message", "data-role": "user" }, [
        h("div", { class: "nw-content nw-plain", text: text }),
      ]),
    ]));
  }

  /**
   * An assistant bubble. Returns {row, setText(text), finish(info)} where info is
   * {citations, index, degraded}: finish() adds sources, the limited-mode note and feedback.
   */
  function addAssistantMessage(role) {
    const content = h("div", { class: "nw-content" });
    const bubble = h("div", {
      class: "nw-msg nw-msg-assistant", "data-testid": "nw-message", "data-role": role || "assistant",
    }, [content]);
    const row = append(h("div", { class: "nw-row nw-row-assistant" }, [bubble]));
    return {
      row: row,
      setText(text) {
        const stick = nearBottom();
        setChildren(content, renderMarkdown(text));
        scrollToBottom(stick);
      },
      finish(info) {
        const stick = nearBottom();
        const sources = citationList(info.citations);
        if (sources) bubble.appendChild(sources);
        const meta = h("div", { class: "nw-meta" });
        if (info.degraded) {
          meta.appendChild(h("span", { class: "nw-degraded", "data-testid": "nw-degraded", title: t("degradedTitle"), text: t("degraded") }));
        }
        if (typeof info.index === "number" && isFinite(info.index)) meta.appendChild(feedbackBar(info.index));
        if (meta.childNodes.length) bubble.appendChild(meta);
        const action = info.action;
        if (action && action.status === "needs_confirmation" && typeof action.id === "string") {
          bubble.appendChild(actionBar(action.id));
        }
        scrollToBottom(stick);
      },
    };
  }

  function citationList(citations) {
    const seen = {};
    const items = (Array.isArray(citations) ? citations : []).filter((c) => {
      const key = c && (c.source || c.title);
      if (!key || seen[key]) return false;
      return (seen[key] = true);
    });
    if (!items.length) return null;
    return h("div", { class: "nw-citations" }, [
      h("div", { class: "nw-citations-label", text: t("sources") }),
      h("ul", null, items.map((c) => {
        const href = citationUrl(c.source);
        const label = String(c.title || c.source);
        const el = href ? link(href) : h("span");
        el.setAttribute("data-testid", "nw-citation");
        el.textContent = label;
        if (c.source) el.setAttribute("title", String(c.source));
        return h("li", null, [el]);
      })),
    ]);
  }

  /** Confirm / Cancel for an action the assistant asked about; the answer's reply is a new bubble. */
  function actionBar(id) {
    const status = h("span", { class: "nw-thanks", "aria-live": "polite" });
    const button = (confirm) => h("button", {
      type: "button", class: "nw-action" + (confirm ? " nw-action-confirm" : ""),
      "data-testid": confirm ? "nw-action-confirm" : "nw-action-cancel",
      text: t(confirm ? "confirm" : "cancel"), onclick: () => answer(confirm),
    });
    const yes = button(true), no = button(false);
    const bar = h("div", { class: "nw-actions", "data-testid": "nw-action" }, [yes, no, status]);
    async function answer(confirm) {
      yes.disabled = no.disabled = true;
      status.textContent = "";
      try {
        const d = await api("POST", sessionPath("/actions/" + encodeURIComponent(id)), { confirm: confirm });
        bar.remove();
        if (typeof d.message_index === "number") state.seen[d.message_index] = true;
        const view = addAssistantMessage();
        view.setText(String(d.reply || ""));
        view.finish({ citations: d.citations, index: d.message_index, degraded: false, action: d.action });
      } catch (e) { // let the customer answer again: the server runs the action at most once
        yes.disabled = no.disabled = false;
        status.textContent = t("actionFailed");
      }
    }
    return bar;
  }

  function feedbackBar(index) {
    const status = h("span", { class: "nw-thanks", "aria-live": "polite" });
    const button = (rating) => h("button", {
      type: "button", class: "nw-fb", "data-testid": "nw-feedback-" + rating, "aria-pressed": "false",
      "aria-label": t(rating === "up" ? "helpful" : "notHelpful"), title: t(rating === "up" ? "helpful" : "notHelpful"),
      onclick: () => vote(rating),
    }, [icon(ICON_THUMB, rating === "down")]);
    const up = button("up"), down = button("down");
    async function vote(rating) {
      const chosen = rating === "up" ? up : down;
      up.disabled = down.disabled = true;
      chosen.setAttribute("aria-pressed", "true");
      status.textContent = "";
      try {
        await api("POST", sessionPath("/feedback"), { message_index: index, rating: rating });
        status.textContent = t("thanks");
      } catch (e) { // let the user try again
        up.disabled = down.disabled = false;
        chosen.setAttribute("aria-pressed", "false");
        status.textContent = t("feedbackFailed");
      }
    }
    return h("div", { class: "nw-feedback" }, [up, down, status]);
  }

  function typingIndicator() {
    return append(h("div", { class: "nw-row nw-row-assistant", "data-testid": "nw-typing" }, [
      h("div", { class: "nw-msg nw-msg-assistant nw-typing", role: "status", "aria-label": t("typing") }, [
        h("span"), h("span"), h("span"),
      ]),
    ]));
  }

  const agentName = (author) => (author && author.name ? String(author.name) : t("agentFallback"));

  /** A support agent's message, labelled with their name ("Dana (support)"). */
  function addAgentMessage(m) {
    dropAgentTyping();
    const content = h("div", { class: "nw-content" });
    content.appendChild(renderMarkdown(String(m.content || "")));
    return append(h("div", { class: "nw-row nw-row-assistant" }, [
      h("div", { class: "nw-msg nw-msg-agent", "data-testid": "nw-message", "data-role": "agent" }, [
        h("div", { class: "nw-author", "data-testid": "nw-agent-name", text: tf("agentLabel", { name: agentName(m.author) }) }),
        content,
      ]),
    ]));
  }

  /** "Dana is typing…" (kept last in the log; hidden again if no update comes for a while). */
  function showAgentTyping(name) {
    const label = tf("agentTyping", { name: name || t("agentFallback") });
    if (!state.agentTyping) {
      state.agentTyping = h("div", { class: "nw-row nw-row-assistant", "data-testid": "nw-agent-typing" }, [
        h("div", { class: "nw-msg nw-msg-agent nw-agent-typing", role: "status" }, [
          h("span", { class: "nw-agent-typing-label" }), h("span", { class: "nw-typing nw-typing-inline", "aria-hidden": "true" },
            [h("span"), h("span"), h("span")]),
        ]),
      ]);
    }
    state.agentTyping.querySelector(".nw-agent-typing-label").textContent = label;
    append(state.agentTyping);                     // (re)placed at the end of the log
    clearTimeout(state.typingTimer);
    state.typingTimer = setTimeout(dropAgentTyping, 15000);
  }

  function dropAgentTyping() {
    clearTimeout(state.typingTimer);
    if (state.agentTyping) state.agentTyping.remove();
    state.agentTyping = null;
  }

  /** The end-of-conversation rating: 1-5 stars and an optional comment. */
  function showCsat() {
    let rating = 0;
    const stars = [1, 2, 3, 4, 5].map((n) => h("button", {
      type: "button", class: "nw-star", "data-testid": "nw-csat-" + n, "aria-pressed": "false", text: "★",
      "aria-label": tf(n === 1 ? "csatStar" : "csatStars", { n: n }), title: tf(n === 1 ? "csatStar" : "csatStars", { n: n }),
      onclick: () => pick(n),
    }));
    const comment = h("textarea", {
      class: "nw-csat-comment", "data-testid": "nw-csat-comment", rows: "2", maxlength: "1000",
      "aria-label": t("csatComment"), placeholder: t("csatComment"),
    });
    const submitBtn = h("button", { type: "submit", class: "nw-csat-submit", "data-testid": "nw-csat-submit", text: t("csatSubmit") });
    const status = h("div", { class: "nw-csat-status", role: "status" });
    const question = h("div", { class: "nw-csat-q", id: "nw-csat-q", text: t("csatQuestion") });
    const form = h("form", { class: "nw-csat", "data-testid": "nw-csat", "aria-labelledby": "nw-csat-q", onsubmit: (e) => { e.preventDefault(); rate(); } }, [
      question, h("div", { class: "nw-stars", role: "group", "aria-labelledby": "nw-csat-q" }, stars), comment, submitBtn, status,
    ]);
    function pick(n) {
      rating = n;
      stars.forEach((b, i) => {
        b.setAttribute("aria-pressed", String(i + 1 === n));
        b.classList.toggle("nw-star-on", i < n);
      });
      status.textContent = "";
    }
    async function rate() {
      if (!rating) { status.textContent = t("csatPick"); return; }
      submitBtn.disabled = true;
      status.textContent = "";
      try {
        await api("POST", sessionPath("/csat"), { rating: rating, comment: comment.value.trim() });
        form.replaceWith(h("div", { class: "nw-notice", role: "status", "data-testid": "nw-csat-thanks", text: t("csatThanks") }));
      } catch (e) {
        submitBtn.disabled = false;
        status.textContent = t("csatFailed");
      }
    }
    append(form);
  }

  function errorMessage(e) {
    if (e.kind === "network") return t("network");
    if (e.kind === "interrupted") return t("interrupted");
    return t("error") + (e.detail ? " (" + e.detail + ")" : "");
  }

  function showError(e) {
    const row = append(h("div", { class: "nw-error", role: "alert", "data-testid": "nw-error" }, [
      h("span", { text: errorMessage(e) }),
      h("button", {
        type: "button", class: "nw-retry", "data-testid": "nw-retry", "aria-label": t("retry"),
        title: t("retryAria"), text: t("retry"), onclick: retry,
      }),
    ]));
    state.failed.push(row);
  }

  function clearFailed() { state.failed.forEach((n) => n.remove()); state.failed = []; }

  function setHandoff() {
    if (state.handoff) return;
    state.handoff = true;
    markHandoffButton(true);
    addNotice(t("handoffNotice"), "handoff");
  }

  function markHandoffButton(requested) {
    handoffBtn.disabled = requested;
    handoffBtn.textContent = t(requested ? "handoffRequested" : "handoff");
    handoffBtn.setAttribute("aria-label", t(requested ? "handoffRequested" : "handoff"));
  }

  /* ------------------------------------------------------------------ human handoff */

  const withHuman = () => state.status === "pending_human" || state.status === "human";

  /**
   * The conversation's status changed (a reply, a live event, a refetch): s is
   * {status, assignee, queue_position, waiting}. Idempotent, so repeated events change nothing.
   */
  function applyStatus(s) {
    const prev = state.status, status = s && s.status;
    if (!status) return;
    state.status = status;
    if (status === "pending_human") {
      setHandoff();
      showWaiting(Object.assign({ queue_position: s.queue_position }, s.waiting || {}));
      openEvents();
    } else if (status === "human") {
      state.handoff = true;
      markHandoffButton(true);
      waitBar.hidden = true;
      const name = agentName(s.assignee);
      if (s.assignee && name !== state.joined) {
        state.joined = name;
        addNotice(tf("agentJoined", { name: name }), "agent");
      }
      openEvents();
    } else {                                                // open (back to the bot) or resolved
      closeEvents();
      dropAgentTyping();
      waitBar.hidden = true;
      state.handoff = false;
      state.joined = "";
      state.waiting = {};
      markHandoffButton(false);
      if (status === "resolved" && prev !== "resolved") { addNotice(t("resolvedNotice"), "handoff"); showCsat(); }
      if (status === "open" && (prev === "pending_human" || prev === "human")) addNotice(t("backToBot"), "handoff");
    }
  }

  /** "Waiting for an agent — you are number N in the queue", and the offers once they are made. */
  function showWaiting(w) {
    Object.keys(w).forEach((k) => { if (w[k] != null) state.waiting[k] = w[k]; });
    const n = state.waiting.queue_position;
    waitText.textContent = typeof n === "number" && n > 0 ? tf("waitingQueue", { n: n }) : t("waiting");
    if (state.waiting.outside_hours) {          // nobody is there: the email fallback, at once
      const opens = state.waiting.opens_at ? new Date(state.waiting.opens_at) : null;
      waitText.textContent = opens && !isNaN(opens)
        ? tf("outsideHours", { time: opens.toLocaleString(undefined, { weekday: "short", hour: "2-digit", minute: "2-digit" }) })
        : t("outsideHoursUnknown");
    }
    emailBtn.hidden = !state.waiting.offer_email || state.contactLeft || !emailForm.hidden;
    botBtn.hidden = !state.waiting.offer_bot;
    waitBar.hidden = false;
  }

  function msgIndex(m, i) {
    if (m && typeof m.index === "number") return m.index;
    if (m && typeof m.message_index === "number") return m.message_index;
    return i;
  }

  /** Live agent events: message / typing / status. EventSource reconnects with Last-Event-ID. */
  function openEvents() {
    if (state.events || !state.sessionId || typeof EventSource === "undefined") return;
    clearTimeout(state.eventsRetry);
    const es = state.events = new EventSource(apiBase + sessionPath("/events") + "?site_key=" + encodeURIComponent(siteKey));
    const data = (e) => { try { return JSON.parse(e.data); } catch (err) { return null; } };
    es.addEventListener("open", () => { state.eventsBackoff = 2000; resync(); });
    es.addEventListener("error", () => {
      if (es.readyState !== EventSource.CLOSED) return;     // the browser is retrying by itself
      state.events = null;
      if (!withHuman()) return;
      state.eventsRetry = setTimeout(openEvents, state.eventsBackoff);
      state.eventsBackoff = Math.min(state.eventsBackoff * 2, 30000);
    });
    es.addEventListener("message", (e) => {
      const m = data(e);
      if (!m || typeof m.index !== "number" || state.seen[m.index]) return;
      state.seen[m.index] = true;
      if (m.role === "agent") { addAgentMessage(m); agentShown(m.index); }
      else if (m.role === "system" && m.content) addNotice(String(m.content));
    });
    es.addEventListener("typing", (e) => {
      const d = data(e);
      if (d && d.typing) showAgentTyping(d.name); else dropAgentTyping();
    });
    es.addEventListener("status", (e) => { const d = data(e); if (d) applyStatus(d); });
  }

  function agentShown(index) {
    state.agentShown = Math.max(state.agentShown, index);
    reportSeen();
  }

  /** Tell the server the customer saw the agent's replies (the panel open, the page visible), so
   * the email fallback does not mail what was read here. Best effort: a failure is retried later. */
  function reportSeen() {
    if (!state.sessionId || !state.open || document.visibilityState === "hidden") return;
    if (state.agentShown <= state.seenSent) return;
    const index = state.seenSent = state.agentShown;
    api("POST", sessionPath("/seen"), { index: index }).catch(() => {
      if (state.seenSent === index) state.seenSent = -1;
    });
  }

  function closeEvents() {
    clearTimeout(state.eventsRetry);
    if (state.events) state.events.close();
    state.events = null;
  }

  /** After a (re)connect: show what the stream may have missed, once each (by message index). */
  async function resync() {
    let data;
    try { data = await api("GET", sessionPath("")); } catch (e) { return; }
    let author = null;
    (data.messages || []).forEach((m, i) => {
      const index = msgIndex(m, i);
      if (m && m.role === "agent") author = m.author || author;
      if (state.seen[index]) return;
      state.seen[index] = true;
      if (m && m.role === "agent") { addAgentMessage(m); agentShown(index); }
    });
    if (data.status && data.status !== state.status) {
      applyStatus({ status: data.status, assignee: data.assignee || author, queue_position: data.queue_position, waiting: data.waiting });
    }
  }

  async function cancelHandoff() {
    botBtn.disabled = true;
    try {
      const d = await api("POST", sessionPath("/handoff/cancel"));
      applyStatus({ status: d.status || "open" });
    } catch (e) {
      addNotice(t("cancelFailed"), "error");
    } finally {
      botBtn.disabled = false;
    }
  }

  async function leaveEmail() {
    const email = emailInput.value.trim();
    if (!/^[^\s@]+@[^\s@]+\.[^\s@]+$/.test(email)) { emailStatus.textContent = t("emailInvalid"); emailInput.focus(); return; }
    emailInput.disabled = true;
    try {
      await api("POST", sessionPath("/contact"), { email: email });
      state.contactLeft = true;
      emailForm.hidden = true;
      emailBtn.hidden = true;
      emailStatus.textContent = tf("emailThanks", { email: email });
    } catch (e) {
      emailStatus.textContent = t("emailFailed");
    } finally {
      emailInput.disabled = false;
    }
  }

  /* ------------------------------------------------------------------ actions */

  function submit() {
    if (state.busy) return;
    const text = input.value.trim();
    if (!text) return;
    input.value = "";
    autosize();
    send(text, false);
  }

  function retry() {
    if (state.busy || !state.lastUserText) return;
    send(state.lastUserText, true);
  }

  /** Send `text` (a retry re-sends without adding a second user bubble) and stream the reply. */
  async function send(text, isRetry) {
    clearFailed();
    state.lastUserText = text;
    if (!isRetry) addUserMessage(text);
    setBusy(true);
    let typing = withHuman() ? null : typingIndicator();   // an agent answers in their own time
    let view = null, streamed = "";
    const dropTyping = () => { if (typing) typing.remove(); typing = null; };
    try {
      await state.ready;
      await withSession(() => {
        streamed = "";
        return streamReply(text, {
          token(piece) {
            streamed += piece;
            if (!piece) return;
            dropTyping(); // first token replaces the typing indicator
            if (!view) view = addAssistantMessage();
            view.setText(streamed);
          },
          done(d) {
            dropTyping();
            if (d.reply == null && d.status) {              // a human has the conversation: no bot reply
              if (view) view.row.remove();                  // text streamed before an agent took over
              if (typeof d.message_index === "number") state.seen[d.message_index] = true;
              applyStatus({ status: d.status, waiting: d.waiting,
                            queue_position: d.waiting ? d.waiting.queue_position : undefined });
              return;
            }
            if (typeof d.message_index === "number") state.seen[d.message_index] = true;
            if (!view) view = addAssistantMessage();
            // The final reply is authoritative (the server may have redacted streamed text).
            view.setText(typeof d.reply === "string" && d.reply ? d.reply : streamed);
            view.finish({ citations: d.citations, index: d.message_index, degraded: !!d.degraded, action: d.action });
            if (d.handoff) applyStatus({ status: d.status || "pending_human", waiting: d.waiting });
          },
        });
      });
    } catch (e) {
      if (view) { view.row.classList.add("nw-row-failed"); state.failed.push(view.row); }
      showError(e);
    } finally {
      dropTyping();
      setBusy(false);
    }
  }

  async function requestHandoff() {
    if (state.handoff) return;
    handoffBtn.disabled = true;
    try {
      await state.ready;
      const d = await withSession(() => api("POST", sessionPath("/handoff")));
      setHandoff();
      applyStatus({ status: d.status || "pending_human", assignee: d.assignee, waiting: d.waiting,
                    queue_position: d.queue_position });
    } catch (e) {
      handoffBtn.disabled = false;
      addNotice(t("handoffFailed"), "error");
    }
  }

  /** Re-render a stored session; a 404 (expired) forgets it, and the next send starts a new one. */
  async function restore() {
    const id = store.get();
    if (!id) return;
    state.sessionId = id;
    let data;
    try { data = await api("GET", sessionPath("")); } catch (e) {
      if (e.status === 404) forgetSession();
      return; // other failures: keep the id, the next send will still try it
    }
    let author = null;
    const messages = data.messages || [];
    messages.forEach((m, i) => {
      if (!m) return;
      const index = msgIndex(m, i);
      state.seen[index] = true;
      if (m.role === "user") { addUserMessage(String(m.content || "")); return; }
      if (m.role === "agent") { author = m.author || author; addAgentMessage(m); agentShown(index); return; }
      const view = addAssistantMessage(m.role);
      view.setText(String(m.content || ""));
      // a confirmation still open only if nothing came after it
      view.finish({ citations: m.citations, index: m.role === "assistant" ? index : null, degraded: !!m.degraded,
                    action: i === messages.length - 1 ? m.action : null });
    });
    if (data.status === "pending_human" || data.status === "human") {
      if (data.status === "human") state.joined = agentName(data.assignee || author);   // joined before the reload
      applyStatus({ status: data.status, assignee: data.assignee || author, waiting: data.waiting,
                    queue_position: data.queue_position });
    } else if (data.status) {
      state.status = data.status;
    }
  }

  function reset() { // host-page API: forget the conversation and start afresh on the next send
    closeEvents();
    dropAgentTyping();
    forgetSession();
    state.handoff = false;
    state.status = "open";
    state.seen = {};
    state.joined = "";
    state.waiting = {};
    state.contactLeft = false;
    state.agentShown = state.seenSent = -1;
    waitBar.hidden = true;
    emailForm.hidden = true;
    emailStatus.textContent = "";
    markHandoffButton(false);
    state.failed = [];
    setChildren(log, h("div", { class: "nw-greeting", text: t("greeting") }));
  }

  function mount() {
    document.body.appendChild(host);
    state.ready = restore().catch(() => {});
  }
  document.addEventListener("visibilitychange", reportSeen);
  if (document.body) mount(); else document.addEventListener("DOMContentLoaded", mount);

  window.NorthwindChat = { open: open, close: () => close(false), toggle: toggle, reset: reset };
})();
