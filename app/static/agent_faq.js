/*
 * FAQ drafts tab: the help-centre entries drafted from agents' answers (GET /api/agent/faq-drafts),
 * each with its question and answer editable; Approve publishes the edited text to the help centre,
 * Reject drops the draft. The most often asked come first.
 */
import { t } from "./agent_i18n.js";
import { $, api, describe, h, number } from "./agent_util.js";

let drafts = null;        // the pending drafts shown, re-rendered on a language switch

export async function loadFaq() {
  const error = $("faq-error");
  error.textContent = "";
  try {
    drafts = (await api("GET", "/api/agent/faq-drafts?status=pending")).drafts || [];
    renderFaq();
  } catch (e) {
    error.textContent = describe(e);
  }
}

export function renderFaq() {
  if (!drafts) return;
  const list = $("faq-list");
  list.textContent = "";
  $("faq-empty").hidden = drafts.length > 0;
  $("faq-empty").textContent = t("f_empty");
  drafts.forEach((d) => list.appendChild(card(d)));
}

function card(d) {
  const qId = "faq-q-" + d.id, aId = "faq-a-" + d.id;
  const question = h("input", { id: qId, class: "faq-question", "data-testid": "faq-question", maxlength: "300" });
  question.value = d.question;
  const answer = h("textarea", { id: aId, class: "faq-answer", "data-testid": "faq-answer", maxlength: "2000", rows: "3" });
  answer.value = d.answer;
  const status = h("p", { class: "error", role: "alert", "data-testid": "faq-status" });
  const decide = async (verb, body) => {
    status.textContent = "";
    try {
      await api("POST", "/api/agent/faq-drafts/" + d.id + "/" + verb, body);
      drafts = drafts.filter((x) => x.id !== d.id);
      renderFaq();
      $("faq-announce").textContent = t(verb === "approve" ? "f_approved" : "f_rejected");
    } catch (e) {
      status.textContent = describe(e);
    }
  };
  return h("li", { class: "card faq-card", "data-testid": "faq-draft" }, [
    h("label", { for: qId, text: t("f_question") }), question,
    h("label", { for: aId, text: t("f_answer") }), answer,
    h("p", { class: "muted", text: d.merged ? t("f_merged", { n: number(d.merged + 1) }) : t("f_once") }),
    h("div", { class: "faq-actions" }, [
      h("button", { type: "button", class: "btn btn-primary", "data-testid": "faq-approve", text: t("f_approve"),
        onclick: () => decide("approve", { question: question.value, answer: answer.value }) }),
      h("button", { type: "button", class: "btn", "data-testid": "faq-reject", text: t("f_reject"),
        onclick: () => decide("reject") }),
    ]),
    status,
  ]);
}
