/*
 * Reports tab: the figures of GET /api/agent/reports for a date range (default: the last 7 days)
 * and a daily bar chart drawn as inline SVG with createElementNS (no library), with the same
 * numbers as a table for screen readers and for copying.
 */
import { t } from "./agent_i18n.js";
import { $, api, describe, duration, h, isoDate, number, percent } from "./agent_util.js";
import { initExperiments, loadExperiments, renderExperiments } from "./agent_experiments.js";

const SVG = "http://www.w3.org/2000/svg";
let last = null;          // the last report shown, re-rendered on a language switch

function svg(tag, attrs, text) {
  const el = document.createElementNS(SVG, tag);
  Object.keys(attrs || {}).forEach((k) => el.setAttribute(k, String(attrs[k])));
  if (text != null) el.textContent = text;
  return el;
}

function defaultRange() {
  const to = new Date();
  const from = new Date(to.getFullYear(), to.getMonth(), to.getDate() - 6);
  return { from: isoDate(from), to: isoDate(to) };
}

export function initReports() {
  const range = defaultRange();
  $("reports-from").value = range.from;
  $("reports-to").value = range.to;
  $("reports-form").addEventListener("submit", (e) => { e.preventDefault(); loadReports(); });
  initExperiments();
}

export async function loadReports() {
  loadExperiments();
  const from = $("reports-from").value, to = $("reports-to").value;
  const error = $("reports-error");
  error.textContent = "";
  if (from && to && from > to) { error.textContent = t("badRange"); return; }
  $("reports-cards").setAttribute("aria-busy", "true");
  try {
    last = await api("GET", "/api/agent/reports?from=" + encodeURIComponent(from) + "&to=" + encodeURIComponent(to));
    renderReports();
  } catch (e) {
    error.textContent = describe(e);
  } finally {
    $("reports-cards").setAttribute("aria-busy", "false");
  }
}

export function renderReports() {
  renderExperiments();
  if (!last) return;
  const r = last;
  const csat = r.csat_average == null ? t("r_none") : t("r_csat_value", { avg: number(r.csat_average, 2) });
  const ratings = r.csat_count ? t(Number(r.csat_count) === 1 ? "r_csat_one" : "r_csat_count", { n: number(r.csat_count) }) : null;
  const o = r.outcomes || {};
  const outcomes = t("r_outcomes", { resolved: number(o.bot_resolved || 0), abandoned: number(o.abandoned || 0),
    undecided: number(r.undecided || 0) });
  const cards = [
    ["conversations", t("r_conversations"), number(r.conversations)],
    ["resolution_rate", t("r_resolution"), r.resolution_rate == null ? t("r_none") : percent(r.resolution_rate), outcomes],
    ["bot_resolved_share", t("r_bot_resolved"), percent(r.bot_resolved_share)],
    ["handoff_rate", t("r_handoff_rate"), percent(r.handoff_rate)],
    ["median_first_human_response_s", t("r_first_response"),
      r.median_first_human_response_s == null ? t("r_none") : duration(r.median_first_human_response_s)],
    ["csat_average", t("r_csat"), csat, ratings],
  ];
  const dl = $("reports-cards");
  dl.textContent = "";
  cards.forEach((c) => {
    dl.appendChild(h("div", { class: "card stat", "data-testid": "report-" + c[0] }, [
      h("dt", { text: c[1] }), h("dd", { text: c[2] }), c[3] ? h("dd", { class: "stat-sub", text: c[3] }) : null,
    ]));
  });
  const daily = Array.isArray(r.daily) ? r.daily : [];
  const chart = $("reports-chart");
  chart.textContent = "";
  chart.appendChild(daily.some((d) => d.conversations || d.handoffs) ? barChart(daily)
    : h("p", { class: "muted", text: t("chartEmpty") }));
  renderTable(daily);
}

/** Grouped bars (conversations, handoffs) per day; the viewBox scales it to the container. */
function barChart(daily) {
  const W = 640, H = 220, PAD_L = 36, PAD_B = 34, PAD_T = 12;
  const plotW = W - PAD_L - 8, plotH = H - PAD_B - PAD_T;
  const peak = Math.max(1, ...daily.map((d) => Math.max(Number(d.conversations) || 0, Number(d.handoffs) || 0)));
  const tick = niceStep(peak), max = Math.ceil(peak / tick) * tick;
  const step = plotW / daily.length;
  const barW = Math.max(2, Math.min(24, step / 2 - 3));
  const total = daily.reduce((a, d) => a + (Number(d.conversations) || 0), 0);
  const root = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img", class: "bars", "data-testid": "reports-bars",
    "aria-label": t("chartLabel", { summary: t("r_conversations") + " " + total }) });
  for (let v = 0; v <= max; v += tick) {          // labelled gridlines at whole, round counts
    const y = PAD_T + plotH * (1 - v / max);
    root.appendChild(svg("line", { x1: PAD_L, x2: W - 8, y1: y, y2: y, class: "grid" }));
    root.appendChild(svg("text", { x: PAD_L - 6, y: y + 4, "text-anchor": "end", class: "axis" }, number(v)));
  }
  const every = Math.ceil(daily.length / 10);         // at most ~10 date labels
  daily.forEach((d, i) => {
    const x0 = PAD_L + i * step + step / 2;
    [["conversations", -barW - 1, "bar-conv", t("chartSeriesConversations")],
      ["handoffs", 1, "bar-handoff", t("chartSeriesHandoffs")]].forEach((s) => {
      const value = Number(d[s[0]]) || 0;
      const hgt = plotH * value / max;
      const bar = svg("rect", { x: x0 + s[1], y: PAD_T + plotH - hgt, width: barW, height: Math.max(hgt, 0), class: s[2],
        "data-testid": "bar-" + s[0] });
      bar.appendChild(svg("title", null, String(d.date) + " · " + s[3] + ": " + value));
      root.appendChild(bar);
    });
    if (i % every === 0) {
      root.appendChild(svg("text", { x: x0, y: H - PAD_B + 16, "text-anchor": "middle", class: "axis" },
        String(d.date || "").slice(5)));
    }
  });
  const legend = svg("g", { class: "legend", transform: "translate(" + PAD_L + "," + (H - 8) + ")" });
  [["bar-conv", t("chartSeriesConversations"), 0], ["bar-handoff", t("chartSeriesHandoffs"), 140]].forEach((l) => {
    legend.appendChild(svg("rect", { x: l[2], y: -9, width: 10, height: 10, class: l[0] }));
    legend.appendChild(svg("text", { x: l[2] + 14, y: 0, class: "axis" }, l[1]));
  });
  root.appendChild(legend);
  return root;
}

/** A gridline step of 1, 2 or 5 times a power of ten, giving about four steps up to `peak`. */
function niceStep(peak) {
  const raw = Math.max(1, peak / 4), mag = Math.pow(10, Math.floor(Math.log10(raw)));
  return [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
}

function renderTable(daily) {
  const table = $("reports-table");
  table.textContent = "";
  table.appendChild(h("thead", null, [h("tr", null, [
    t("date"), t("chartSeriesConversations"), t("chartSeriesHandoffs"), t("r_resolution"), t("csatAverage"),
  ].map((label) => h("th", { scope: "col", text: label })))]));
  table.appendChild(h("tbody", null, daily.map((d) => h("tr", null, [
    h("th", { scope: "row", text: String(d.date || "") }),
    h("td", { text: number(d.conversations) }), h("td", { text: number(d.handoffs) }),
    h("td", { text: d.resolution_rate == null ? t("r_none") : percent(d.resolution_rate) }),
    h("td", { text: d.csat_average == null ? t("r_none") : number(d.csat_average, 2) }),
  ]))));
}
