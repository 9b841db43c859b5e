/*
 * Experiments, on the reports tab: start an A/B test of the chat (answer mode or system prompt,
 * a control and a treatment with the treatment's share), stop it, and read each arm's results
 * against the control (GET /api/agent/experiments): conversations, resolution and handoff rates
 * with their 95% intervals, CSAT, median time to the first text, and whether a difference is
 * significant (p < 0.05).
 */
import { t } from "./agent_i18n.js";
import { $, api, describe, h, number, percent } from "./agent_util.js";

let experiments = null;

export function initExperiments() {
  $("experiment-form").addEventListener("submit", (e) => { e.preventDefault(); startExperiment(); });
}

export async function loadExperiments() {
  $("experiments-error").textContent = "";
  try {
    experiments = (await api("GET", "/api/agent/experiments")).experiments || [];
    renderExperiments();
  } catch (e) {
    $("experiments-error").textContent = describe(e);
  }
}

async function startExperiment() {
  const share = Number($("experiment-share").value) / 100;
  const body = {
    name: $("experiment-name").value.trim(), factor: $("experiment-factor").value,
    arms: [{ name: "control", weight: Math.round((1 - share) * 1000) / 1000, value: $("experiment-control").value },
      { name: "treatment", weight: Math.round(share * 1000) / 1000, value: $("experiment-treatment").value }],
  };
  $("experiments-error").textContent = "";
  try {
    await api("POST", "/api/agent/experiments", body);
    await loadExperiments();
  } catch (e) {
    $("experiments-error").textContent = describe(e);
  }
}

async function stopExperiment(id) {
  try {
    await api("POST", "/api/agent/experiments/" + id + "/stop");
    await loadExperiments();
  } catch (e) {
    $("experiments-error").textContent = describe(e);
  }
}

function rate(value, ci) {
  if (value == null) return t("r_none");
  return percent(value) + (ci ? " (" + percent(ci[0]) + "–" + percent(ci[1]) + ")" : "");
}

function versus(v, key) {
  if (!v || !v[key]) return t("r_none");
  const d = v[key];
  const sign = d.difference > 0 ? "+" : "";
  return sign + number(Math.round(d.difference * 1000) / 10, 1) + " pts, p = " + number(d.p_value, 3)
    + (v[key + "_significant"] ? " · " + t("x_significant") : "");
}

export function renderExperiments() {
  if (!experiments) return;
  const list = $("experiment-list");
  list.textContent = "";
  $("experiments-empty").hidden = experiments.length > 0;
  $("experiments-empty").textContent = t("x_empty");
  experiments.forEach((x) => {
    const results = x.results || [];
    list.appendChild(h("li", { class: "card faq-card", "data-testid": "experiment", "data-status": x.status }, [
      h("div", { class: "webhook-head" }, [
        h("strong", { text: x.name + " · " + x.factor + " · " + t("x_" + x.status) }),
        x.status === "running" ? h("button", { type: "button", class: "btn", "data-testid": "experiment-stop",
          text: t("x_stop"), onclick: () => stopExperiment(x.id) }) : null,
      ]),
      h("table", { class: "gaps-table", "data-testid": "experiment-results" }, [
        h("thead", null, [h("tr", null, [t("x_arm"), t("r_conversations"), t("r_resolution"), t("x_vs_resolution"),
          t("r_handoff_rate"), t("x_vs_handoff"), t("r_csat"), t("x_first_text")]
          .map((label) => h("th", { scope: "col", text: label })))]),
        h("tbody", null, results.map((r) => h("tr", { "data-testid": "experiment-arm" }, [
          h("th", { scope: "row", text: r.arm + " (" + percent(r.weight) + ")", title: r.value }),
          h("td", { text: number(r.conversations) }),
          h("td", { text: rate(r.resolution_rate, r.resolution_ci) }), h("td", { text: versus(r.vs_control, "resolution") }),
          h("td", { text: rate(r.handoff_rate, r.handoff_ci) }), h("td", { text: versus(r.vs_control, "handoff") }),
          h("td", { text: r.csat_average == null ? t("r_none") : number(r.csat_average, 2) }),
          h("td", { text: r.first_text_p50_ms == null ? t("r_none") : number(Math.round(r.first_text_p50_ms)) + " ms" }),
        ]))),
      ]),
    ]));
  });
}
