/*
 * Webhooks tab: the tenant's webhooks (GET /api/agent/webhooks), a form to add one (its signing
 * secret is shown once, right after), Delete, and each webhook's delivery log: event, status,
 * attempts, the last HTTP status or error, and when.
 */
import { t } from "./agent_i18n.js";
import { $, api, describe, fullTime, h, number } from "./agent_util.js";

const EVENTS = ["conversation.created", "message.created", "handoff.requested", "conversation.resolved", "csat.submitted"];
let hooks = null;
const logs = {};          // webhook id -> deliveries shown

export function initWebhooks() {
  const box = $("webhook-events");
  EVENTS.forEach((ev) => {
    const id = "webhook-event-" + ev.replace(".", "-");
    const input = h("input", { type: "checkbox", id: id, value: ev, checked: true, "data-testid": "webhook-event" });
    box.appendChild(h("label", { for: id, class: "webhook-event" }, [input, " " + ev]));
  });
  $("webhook-form").addEventListener("submit", (e) => { e.preventDefault(); addWebhook(); });
}

export async function loadWebhooks() {
  $("webhooks-error").textContent = "";
  try {
    hooks = (await api("GET", "/api/agent/webhooks")).webhooks || [];
    await Promise.all(hooks.map((w) => api("GET", "/api/agent/webhooks/" + w.id + "/deliveries?limit=20")
      .then((r) => { logs[w.id] = r.deliveries || []; }, () => { logs[w.id] = []; })));
    renderWebhooks();
  } catch (e) {
    $("webhooks-error").textContent = describe(e);
  }
}

async function addWebhook() {
  const events = Array.from(document.querySelectorAll("[data-testid=webhook-event]")).filter((c) => c.checked).map((c) => c.value);
  $("webhooks-error").textContent = "";
  try {
    const created = await api("POST", "/api/agent/webhooks", { url: $("webhook-url").value.trim(), events: events });
    $("webhook-secret").hidden = false;
    $("webhook-secret-value").textContent = created.secret;
    $("webhook-url").value = "";
    await loadWebhooks();
  } catch (e) {
    $("webhooks-error").textContent = describe(e);
  }
}

async function removeWebhook(id) {
  try {
    await api("DELETE", "/api/agent/webhooks/" + id);
    await loadWebhooks();
  } catch (e) {
    $("webhooks-error").textContent = describe(e);
  }
}

export function renderWebhooks() {
  if (!hooks) return;
  const list = $("webhook-list");
  list.textContent = "";
  $("webhooks-empty").hidden = hooks.length > 0;
  $("webhooks-empty").textContent = t("w_empty");
  hooks.forEach((w) => {
    const rows = logs[w.id] || [];
    list.appendChild(h("li", { class: "card faq-card", "data-testid": "webhook" }, [
      h("div", { class: "webhook-head" }, [
        h("code", { class: "webhook-url", text: w.url }),
        h("button", { type: "button", class: "btn", "data-testid": "webhook-delete", text: t("w_delete"),
          onclick: () => removeWebhook(w.id) }),
      ]),
      h("p", { class: "muted", text: (w.events || []).join(", ") + " · " + t("w_secret_hint", { hint: w.secret_hint }) }),
      rows.length ? h("table", { class: "gaps-table", "data-testid": "webhook-deliveries" }, [
        h("thead", null, [h("tr", null, [t("w_event"), t("w_status"), t("w_attempts"), t("w_result"), t("w_time")]
          .map((label) => h("th", { scope: "col", text: label })))]),
        h("tbody", null, rows.map((d) => h("tr", { "data-testid": "delivery", "data-status": d.status }, [
          h("td", { text: d.event }), h("td", { text: t("w_" + d.status) }), h("td", { text: number(d.attempts) }),
          h("td", { text: d.last_error || (d.last_status_code ? "HTTP " + d.last_status_code : "") }),
          h("td", { text: d.created_at ? fullTime(d.created_at) : "" }),
        ]))),
      ]) : h("p", { class: "muted", text: t("w_no_deliveries") }),
    ]));
  });
}
