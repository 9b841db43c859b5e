/*
 * Agent console strings, English and Chinese, and the language choice:
 * ?lang=zh|en first, then the agent's last toggle (localStorage), then navigator.language (zh* -> zh).
 * "{name}"-style placeholders are filled by t(key, {name: ...}); values are plain text.
 */
const STRINGS = {
  en: {
    pageTitle: "Support console", title: "Support console", skipToConversation: "Skip to the conversation",
    loading: "Loading…", langToggle: "中文", langToggleLabel: "切换到中文", logout: "Log out",
    shortcuts: "Shortcuts", shortcutsTitle: "Keyboard shortcuts", close: "Close",
    loginTitle: "Sign in to the support console", email: "Email", password: "Password", signIn: "Sign in",
    signingIn: "Signing in…", loginFailed: "Wrong email or password.", loginMissing: "Enter your email and password.",
    tooMany: "Too many attempts. Try again in a little while.", sessionExpired: "Your session has ended. Please sign in again.",
    signedInAs: "Signed in as {name}",
    inbox: "Inbox", conversations: "Conversations", tabWaiting: "Waiting", tabActive: "Active",
    tabOpen: "With the bot", tabResolved: "Resolved", tabReports: "Reports", tabGaps: "Knowledge gaps", tabFaq: "FAQ drafts", tabWebhooks: "Webhooks", loadMore: "Load more",
    empty_pending_human: "Nobody is waiting for an agent.", empty_human: "No conversations with an agent.",
    empty_open: "No conversations with the bot.", empty_resolved: "No resolved conversations.",
    live: "Live", reconnecting: "Reconnecting…", offline: "Offline — retrying",
    unread: "Unread", queuePosition: "#{n} in queue", assignedTo: "Agent: {name}", you: "you",
    unassigned: "Not claimed yet", noSummary: "No summary yet.", noMessages: "(no messages yet)",
    conversation: "Conversation", conversationTitle: "Conversation {id}", selectConversation: "Select a conversation from the inbox.",
    status_pending_human: "Waiting for an agent", status_human: "With an agent", status_open: "With the bot",
    status_resolved: "Resolved", contact: "Contact: {email}",
    claim: "Claim", claimed: "Claimed", resolve: "Resolve", refresh: "Refresh",
    claimedByOther: "{name} has already claimed this conversation.", claimConflict: "This conversation can no longer be claimed.",
    summary: "Handoff summary", transcript: "Transcript", feedback: "Customer feedback", noFeedback: "No feedback yet.",
    role_user: "Customer", role_assistant: "Assistant", role_agent: "Agent", role_system: "System",
    agentAuthor: "{name} (agent)", sources: "Sources:", grounding: "Grounding: {value}", action: "Action: {name}, {status}",
    thumbsUp: "Helpful", thumbsDown: "Not helpful", onMessage: "on message {n}", csat: "Rating {n} of 5",
    replyLabel: "Reply to the customer", replyHint: "Ctrl+Enter sends", suggest: "Suggest reply",
    suggesting: "Asking the assistant…", suggestionLabel: "Suggested by the assistant — edit before sending",
    suggestionEmpty: "The assistant has no suggestion for this conversation.",
    useSuggestion: "Replace my draft with this suggestion", send: "Send", sending: "Sending…",
    replyEmpty: "Write a reply first.", replyNotClaimed: "Claim the conversation before replying.",
    replyClaimFirst: "Claim this conversation to reply.", replyResolved: "This conversation is resolved.",
    replyOther: "{name} is handling this conversation.",
    announceHandoff: "New handoff: {summary}", announceMessage: "New message from a customer",
    announceClaimed: "Conversation claimed", announceResolved: "Conversation resolved", announceSent: "Reply sent",
    error: "Something went wrong: {message}", network: "Cannot reach the server. Check your connection.",
    from: "From", to: "To", apply: "Show", reportsLoading: "Loading the report…",
    r_conversations: "Conversations", r_bot_resolved: "Resolved by the bot", r_handoff_rate: "Handed to an agent",
    r_resolution: "Resolution rate", r_outcomes: "{resolved} resolved · {abandoned} abandoned · {undecided} undecided",
    r_first_response: "Median first agent response", r_csat: "Customer satisfaction", r_csat_value: "{avg} / 5", r_csat_count: "{n} ratings", r_csat_one: "1 rating",
    r_none: "—", chartCaption: "Conversations and handoffs per day", chartLabel: "Bar chart: {summary}",
    chartSeriesConversations: "Conversations", chartSeriesHandoffs: "Handoffs", chartEmpty: "No conversations in this period.",
    g_csv: "Download CSV", g_summary: "{questions} questions the help centre fell short on, in {clusters} groups.",
    g_words: "(Grouped by shared words: the embedding model is unavailable.)", g_empty: "No knowledge gaps in this period.",
    g_question: "Question", g_size: "Times asked", g_reasons: "Why", g_last_seen: "Last seen",
    g_examples: "{n} ways it was asked", g_unanswerable: "not in the help centre", g_low_support: "weak answer",
    g_handed_off: "handed to an agent",
    f_intro: "Drafted from agents' answers to questions the bot could not answer. Approve to publish an entry to the help centre; the bot answers from it within seconds.",
    f_empty: "No drafts waiting.", f_question: "Question", f_answer: "Answer", f_approve: "Approve and publish",
    f_reject: "Reject", f_approved: "Published to the help centre", f_rejected: "Draft rejected",
    f_merged: "Asked in {n} conversations", f_once: "Asked in 1 conversation",
    x_title: "Experiments", x_name: "Name", x_factor: "Changes", x_control: "Control", x_treatment: "Treatment",
    x_share: "Treatment share (%)", x_start: "Start", x_stop: "Stop", x_running: "running", x_stopped: "stopped",
    x_empty: "No experiments yet.", x_arm: "Arm", x_vs_resolution: "Resolution vs control",
    x_vs_handoff: "Handoffs vs control", x_first_text: "First text (median)", x_significant: "significant",
    w_url: "URL", w_events: "Events", w_add: "Add webhook", w_delete: "Delete", w_empty: "No webhooks yet.",
    w_secret: "Signing secret (shown once; keep it to verify X-Webhook-Signature):", w_secret_hint: "secret {hint}",
    w_event: "Event", w_status: "Status", w_attempts: "Attempts", w_result: "Last result", w_time: "Created",
    w_pending: "pending", w_delivered: "delivered", w_failed: "failed", w_no_deliveries: "No deliveries yet.",
    showTable: "Show as a table", date: "Date", csatAverage: "Average rating", badRange: "The start date must be before the end date.",
    sc_next: "Next conversation", sc_prev: "Previous conversation", sc_open: "Open the selected conversation",
    sc_claim: "Claim", sc_reply: "Go to the reply box", sc_send: "Send the reply (in the reply box)",
    sc_suggest: "Suggest a reply", sc_resolve: "Resolve", sc_tabs: "Switch tab", sc_help: "Show these shortcuts",
    sc_escape: "Leave the reply box / close this dialog",
    seconds: "{n} s", minutes: "{m} min {s} s", hours: "{h} h {m} min",
  },
  zh: {
    pageTitle: "客服控制台", title: "客服控制台", skipToConversation: "跳到对话",
    loading: "加载中…", langToggle: "English", langToggleLabel: "Switch to English", logout: "退出登录",
    shortcuts: "快捷键", shortcutsTitle: "键盘快捷键", close: "关闭",
    loginTitle: "登录客服控制台", email: "邮箱", password: "密码", signIn: "登录",
    signingIn: "正在登录…", loginFailed: "邮箱或密码不正确。", loginMissing: "请输入邮箱和密码。",
    tooMany: "尝试次数过多,请稍后再试。", sessionExpired: "登录已过期,请重新登录。",
    signedInAs: "当前登录:{name}",
    inbox: "收件箱", conversations: "对话列表", tabWaiting: "等待中", tabActive: "处理中",
    tabOpen: "机器人对话", tabResolved: "已解决", tabReports: "报表", tabGaps: "知识缺口", tabFaq: "FAQ 草稿", tabWebhooks: "Webhook", loadMore: "加载更多",
    empty_pending_human: "目前没有等待人工的客户。", empty_human: "没有人工处理中的对话。",
    empty_open: "没有机器人对话。", empty_resolved: "没有已解决的对话。",
    live: "实时", reconnecting: "正在重新连接…", offline: "连接中断,正在重试",
    unread: "未读", queuePosition: "排队第 {n} 位", assignedTo: "客服:{name}", you: "你",
    unassigned: "尚未认领", noSummary: "暂无摘要。", noMessages: "(暂无消息)",
    conversation: "对话", conversationTitle: "对话 {id}", selectConversation: "请从收件箱中选择一个对话。",
    status_pending_human: "等待人工", status_human: "人工处理中", status_open: "机器人对话",
    status_resolved: "已解决", contact: "联系方式:{email}",
    claim: "认领", claimed: "已认领", resolve: "标记为已解决", refresh: "刷新",
    claimedByOther: "{name} 已认领此对话。", claimConflict: "此对话已无法认领。",
    summary: "转人工摘要", transcript: "对话记录", feedback: "客户反馈", noFeedback: "暂无反馈。",
    role_user: "客户", role_assistant: "智能助手", role_agent: "客服", role_system: "系统",
    agentAuthor: "{name}(客服)", sources: "参考资料:", grounding: "依据:{value}", action: "操作:{name},{status}",
    thumbsUp: "有帮助", thumbsDown: "没有帮助", onMessage: "针对第 {n} 条消息", csat: "评分 {n}/5",
    replyLabel: "回复客户", replyHint: "Ctrl+Enter 发送", suggest: "建议回复",
    suggesting: "正在询问智能助手…", suggestionLabel: "由智能助手建议——发送前请修改确认",
    suggestionEmpty: "智能助手对此对话没有建议。",
    useSuggestion: "用此建议替换我的草稿", send: "发送", sending: "发送中…",
    replyEmpty: "请先输入回复内容。", replyNotClaimed: "请先认领此对话再回复。",
    replyClaimFirst: "认领此对话后即可回复。", replyResolved: "此对话已解决。",
    replyOther: "{name} 正在处理此对话。",
    announceHandoff: "新的转人工请求:{summary}", announceMessage: "客户发来新消息",
    announceClaimed: "已认领对话", announceResolved: "对话已解决", announceSent: "回复已发送",
    error: "出现问题:{message}", network: "无法连接服务器,请检查网络。",
    from: "开始日期", to: "结束日期", apply: "查看", reportsLoading: "正在加载报表…",
    r_conversations: "对话数", r_bot_resolved: "机器人解决占比", r_handoff_rate: "转人工比例",
    r_resolution: "解决率", r_outcomes: "已解决 {resolved} · 放弃 {abandoned} · 待定 {undecided}",
    r_first_response: "人工首次响应时间中位数", r_csat: "客户满意度", r_csat_value: "{avg} / 5", r_csat_count: "{n} 条评分", r_csat_one: "1 条评分",
    r_none: "—", chartCaption: "每日对话数与转人工数", chartLabel: "柱状图:{summary}",
    chartSeriesConversations: "对话", chartSeriesHandoffs: "转人工", chartEmpty: "此期间没有对话。",
    g_csv: "下载 CSV", g_summary: "帮助中心未能解答的问题 {questions} 个,共 {clusters} 组。",
    g_words: "(按共同词语分组:向量模型暂不可用。)", g_empty: "此期间没有知识缺口。",
    g_question: "问题", g_size: "提问次数", g_reasons: "原因", g_last_seen: "最近出现",
    g_examples: "{n} 种问法", g_unanswerable: "帮助中心没有", g_low_support: "回答依据不足",
    g_handed_off: "转人工",
    f_intro: "根据人工客服对机器人无法回答的问题所作的答复生成。批准后即发布到帮助中心,机器人几秒内即可据此回答。",
    f_empty: "没有待审核的草稿。", f_question: "问题", f_answer: "答案", f_approve: "批准并发布",
    f_reject: "拒绝", f_approved: "已发布到帮助中心", f_rejected: "已拒绝草稿",
    f_merged: "在 {n} 个对话中被问到", f_once: "在 1 个对话中被问到",
    x_title: "实验", x_name: "名称", x_factor: "变量", x_control: "对照组", x_treatment: "实验组",
    x_share: "实验组占比(%)", x_start: "开始", x_stop: "停止", x_running: "进行中", x_stopped: "已停止",
    x_empty: "还没有实验。", x_arm: "分组", x_vs_resolution: "解决率差异", x_vs_handoff: "转人工差异",
    x_first_text: "首句时间(中位数)", x_significant: "显著",
    w_url: "URL", w_events: "事件", w_add: "添加 Webhook", w_delete: "删除", w_empty: "还没有 Webhook。",
    w_secret: "签名密钥(只显示一次,请保存以校验 X-Webhook-Signature):", w_secret_hint: "密钥 {hint}",
    w_event: "事件", w_status: "状态", w_attempts: "尝试次数", w_result: "最近结果", w_time: "创建时间",
    w_pending: "待发送", w_delivered: "已送达", w_failed: "失败", w_no_deliveries: "还没有发送记录。",
    showTable: "以表格显示", date: "日期", csatAverage: "平均评分", badRange: "开始日期必须早于结束日期。",
    sc_next: "下一个对话", sc_prev: "上一个对话", sc_open: "打开选中的对话",
    sc_claim: "认领", sc_reply: "跳到回复框", sc_send: "发送回复(在回复框中)",
    sc_suggest: "建议回复", sc_resolve: "标记为已解决", sc_tabs: "切换标签页", sc_help: "显示快捷键",
    sc_escape: "离开回复框 / 关闭此窗口",
    seconds: "{n} 秒", minutes: "{m} 分 {s} 秒", hours: "{h} 小时 {m} 分",
  },
};

const LANG_KEY = "nw-agent:lang";
let current = "en";

function saved() {
  try { return localStorage.getItem(LANG_KEY); } catch (e) { return null; }
}

/** The language to start in (see the header comment). */
export function initialLang() {
  const asked = new URLSearchParams(location.search).get("lang");
  const pick = (asked || saved() || navigator.language || "en").toLowerCase();
  return pick.indexOf("zh") === 0 ? "zh" : "en";
}

export function lang() { return current; }

/** The locale for dates and numbers. */
export function locale() { return current === "zh" ? "zh-CN" : "en-GB"; }

export function setLang(next, remember) {
  current = next === "zh" ? "zh" : "en";
  document.documentElement.lang = current === "zh" ? "zh-CN" : "en";
  if (remember) {
    try { localStorage.setItem(LANG_KEY, current); } catch (e) { /* not kept */ }
    const url = new URL(location.href);
    url.searchParams.set("lang", current);
    history.replaceState(history.state, "", url.pathname + url.search + url.hash);
  }
}

/** The string for `key` in the current language, with {placeholders} filled from `vars`. */
export function t(key, vars) {
  const s = STRINGS[current][key] != null ? STRINGS[current][key] : (STRINGS.en[key] != null ? STRINGS.en[key] : key);
  return !vars ? s : s.replace(/\{(\w+)\}/g, (m, name) => (vars[name] != null ? String(vars[name]) : m));
}

/** Translate the static shell: data-i18n (text), data-i18n-aria (aria-label), data-i18n-title. */
export function translateShell(root) {
  root.querySelectorAll("[data-i18n]").forEach((el) => { el.textContent = t(el.getAttribute("data-i18n")); });
  root.querySelectorAll("[data-i18n-aria]").forEach((el) => { el.setAttribute("aria-label", t(el.getAttribute("data-i18n-aria"))); });
  root.querySelectorAll("[data-i18n-title]").forEach((el) => { el.setAttribute("title", t(el.getAttribute("data-i18n-title"))); });
  document.title = t("pageTitle");
}
