/*
 * Knowledge gaps tab: the clusters of GET /api/agent/knowledge-gaps for a date range (default: the
 * last 30 days), largest first, as a table: the representative question, how often it was asked,
 * why the bot fell short, when it was last seen, and the questions in the cluster. The CSV link
 * downloads the same range from /api/agent/knowledge-gaps.csv.
 */
import { t } from "./agent_i18n.js";
import { $, api, describe, fullTime, h, isoDate, number } from "./agent_util.js";

const REASONS = ["unanswerable", "low_support", "handed_off"];
let last = null;          // the last gaps shown, re-rendered on a language switch

function query() {
  return "?from=" + encodeURIComponent($("gaps-from").value) + "&to=" + encodeURIComponent($("gaps-to").value);
}

export function initGaps() {
  const to = new Date();
  $("gaps-from").value = isoDate(new Date(to.getFullYear(), to.getMonth(), to.getDate() - 29));
  $("gaps-to").value = isoDate(to);
  $("gaps-form").addEventListener("submit", (e) => { e.preventDefault(); loadGaps(); });
}

export async function loadGaps() {
  const error = $("gaps-error");
  error.textContent = "";
  if ($("gaps-from").value > $("gaps-to").value) { error.textContent = t("badRange"); return; }
  $("gaps-csv").setAttribute("href", "/api/agent/knowledge-gaps.csv" + query());
  $("gaps-table").setAttribute("aria-busy", "true");
  try {
    last = await api("GET", "/api/agent/knowledge-gaps" + query());
    renderGaps();
  } catch (e) {
    error.textContent = describe(e);
  } finally {
    $("gaps-table").setAttribute("aria-busy", "false");
  }
}

export function renderGaps() {
  if (!last) return;
  const clusters = Array.isArray(last.clusters) ? last.clusters : [];
  $("gaps-summary").textContent = t("g_summary", { questions: number(last.questions || 0), clusters: number(clusters.length) })
    + (last.method === "words" ? " " + t("g_words") : "");
  const table = $("gaps-table");
  table.textContent = "";
  if (!clusters.length) {
    table.appendChild(h("caption", { class: "muted", text: t("g_empty") }));
    return;
  }
  table.appendChild(h("thead", null, [h("tr", null, ["#", t("g_question"), t("g_size"), t("g_reasons"), t("g_last_seen")]
    .map((label) => h("th", { scope: "col", text: label })))]));
  table.appendChild(h("tbody", null, clusters.map((c, i) => h("tr", { "data-testid": "gap-row" }, [
    h("td", { text: number(i + 1) }),
    h("th", { scope: "row" }, [
      h("span", { class: "gap-label", "data-testid": "gap-label", text: String(c.label || "") }),
      (c.examples || []).length > 1 ? h("details", { class: "gap-examples" }, [
        h("summary", { text: t("g_examples", { n: number(c.examples.length) }) }),
        h("ul", null, c.examples.map((q) => h("li", { text: String(q) }))),
      ]) : null,
    ]),
    h("td", { "data-testid": "gap-size", text: number(c.size) }),
    h("td", { text: REASONS.filter((r) => c.reasons && c.reasons[r])
      .map((r) => t("g_" + r) + " (" + number(c.reasons[r]) + ")").join(" · ") }),
    h("td", { text: c.last_seen ? fullTime(c.last_seen) : t("r_none") }),
  ]))));
}
