"""The support-chat pipeline for one turn:

    message -> input compliance (PII redacted, banned terms blocked or masked, injection refused)
            -> intent (embedding) -> an action of the tenant's (pipelines.chat_actions), if one fits
            -> handoff / clarify shortcuts
            -> follow-up resolved with the previous question; Chinese read through the glossary
            -> knowledge-base search -> answer selection (pipelines.answer_selection)
            -> nothing answers it: say so, offer a human; two articles disagree: ask which
            -> reply by the tenant's answer_mode (pipelines.grounded_answer): quoted spans, or
               generation verified sentence by sentence in StreamGuard -> reply + citations

`respond` yields ("token", text) events while the reply streams and ends with ("done", ChatReply).
Canned replies (blocked, handoff, clarify, not found) never call the model. If generation fails,
the reply degrades to the best passage with its citation and an offer of a human.

Without embeddings (a lexical pipeline: detector and knowledge base built with `embed=None`, or
the embedding call failing this turn) the turn takes the keyword path: keyword intent (so "talk
to a human" still hands off) and BM25 retrieval, answered with the best excerpt, degraded.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import numpy as np

from filters.banned_words import BannedWordFilter
from filters.injection import detect_injection
from filters.leakage import LeakFilter, strip_markers
from filters.pii import published_pii, redact_pii
from filters.stream_guard import StreamGuard
from pipelines import followup
from pipelines.actions import ActionRunner, ActionSpec
from pipelines.answer_selection import AnswerSelector, Selection
from pipelines.answer_spans import Span
from pipelines.answer_verifier import SentenceVerifier
from pipelines.chat_actions import ChatActions, answers_confirmation
from pipelines.grounded_answer import (
    GROUNDED_RULES,
    clarifying_question,
    grounded_messages,
    missing_facts,
    quoted_reply,
    translation_keeps_facts,
    translation_messages,
)
from pipelines.inference_client import InferenceClient, InferenceError
from pipelines.intent import IntentDetector, IntentResult
from pipelines.knowledge_base import Chunk, KnowledgeBase, Passage
from pipelines.prompt import RULES, build_messages
from pipelines.query_translation import Glossary, has_cjk

log = logging.getLogger(__name__)
GROUNDED_MAX_TOKENS = 96          # a grounded reply is a sentence or two
# the chunks of the SPAN_K sentences closest to the question (cosine >= SPAN_MIN) join the passages
SPAN_K, SPAN_MIN = 5, 0.55
# a message to the human side that asks for facts (hours, phone, email), not for a person now
_ASKS_DETAILS = re.compile(r"\b(?:hours?|phone|number|e-?mail|address|opening|what times?|when (?:are|is|do)|"
                           r"how (?:long|quickly|fast|soon))\b|几点|电话|邮箱|时间", re.I)

CANNED = {
    "blocked": (("I'm sorry, I can't help with that request. Is there anything else about your order or our "
                "store I can help with?"), "抱歉，我无法协助处理该请求。还有其他关于订单或商店的问题吗？"),
    "injection": (("I can only help with questions about our store, orders and products. What can I help you "
                  "with?"), "我只能回答与本店、订单和商品相关的问题。请问有什么可以帮您？"),
    "handoff": (("I'm connecting you with a human agent now. They'll see this conversation, so you won't need "
                "to repeat yourself."), "正在为您转接人工客服，他们会看到本次对话记录，您无需重复说明。"),
    "clarify": (("I want to make sure I help with the right thing. Is this about an order, shipping, a return "
                "or refund, your account, or a product? You can also ask for a human agent."),
                "我想确认一下您的问题：是关于订单、配送、退货退款、账户还是商品？您也可以要求转人工客服。"),
    "not_found": (("I couldn't find that in our help centre, so I'd rather not guess. Would you like me to "
                  "connect you with a human agent?"),
                  "我在帮助中心没有找到相关内容，不想随意猜测。需要为您转接人工客服吗？"),
    "degraded": ("Our assistant is busy right now. Here is what our help centre says:",
                 "助手暂时繁忙，以下是帮助中心的相关内容："),
    "greeting": ("Hello! How can I help you today? You can ask about orders, shipping, returns, your account "
                 "or our products.", "您好！请问有什么可以帮您？您可以咨询订单、配送、退货、账户或商品相关问题。"),
}


def canned(key: str, text: str) -> str:
    english, chinese = CANNED[key]
    return chinese if has_cjk(text) else english


class MessageTooLong(ValueError):
    """The message alone does not fit the model's context."""


@dataclass
class ChatReply:
    reply: str
    intent: str
    confidence: float
    citations: list[dict] = field(default_factory=list)      # [{"title", "source"}]
    handoff: bool = False
    degraded: bool = False
    blocked: str | None = None                                # why the input was refused, if it was
    grounding: str | None = None                              # pipelines.grounded_answer.OUTCOMES, if answered
    action: dict | None = None                                # the action this reply took or asks about


@dataclass
class Tenant:
    tenant_id: str
    name: str
    system_prompt: str
    banned_input_policy: str = "block"                        # block | mask
    answer_mode: str = "extractive"                           # pipelines.grounded_answer.ANSWER_MODES
    actions: tuple[ActionSpec, ...] = ()                      # what the assistant may do (pipelines.actions)
    max_tokens: int | None = None                             # a reply's token budget (None: the chat's)


class SupportChat:
    def __init__(self, client: InferenceClient, detector: IntentDetector, kb: KnowledgeBase,
                 banned: BannedWordFilter, temperature: float = 0.7, max_tokens: int = 512,
                 prompt_budget: int = 1400, top_k: int = 5, glossary: Glossary | None = None,
                 selector: AnswerSelector | None = None, action_runner: ActionRunner | None = None,
                 grounded_temperature: float | None = None):
        self.client, self.detector, self.kb, self.banned = client, detector, kb, banned
        self.temperature, self.max_tokens, self.prompt_budget, self.top_k = (
            temperature, max_tokens, prompt_budget, top_k)
        # the grounded_generation mode's sampling: its sentences must pass the verifier
        self.grounded_temperature = temperature if grounded_temperature is None else grounded_temperature
        self.glossary = glossary or Glossary()
        self.selector = selector or AnswerSelector(kb)
        self.actions = ChatActions(client, action_runner, self._translated) if action_runner is not None else None

    def clean_input(self, text: str, tenant: Tenant) -> tuple[str, str | None]:
        """(text with PII redacted and, under the mask policy, banned terms masked; why it is
        blocked or None). Only the cleaned text may reach the model, the logs or storage."""
        clean, _ = redact_pii(text)
        if self.banned.contains(clean):
            if tenant.banned_input_policy == "block":
                return self.banned.mask(clean)[0], "banned_words"
            clean = self.banned.mask(clean)[0]
        if detect_injection(clean).flagged:
            return clean, "prompt_injection"
        return clean, None

    def check_fits(self, clean_text: str) -> None:
        """Raises MessageTooLong when the message alone cannot fit the model's context (checked
        before a reply starts streaming; an unreachable model is left to respond's fallback)."""
        try:
            context = self.client.max_model_len()
            budget = min(self.prompt_budget, context - min(self.max_tokens, context // 2) - 8)
            fits = self.client.count_tokens(clean_text) + 16 <= budget
        except InferenceError:
            return
        if not fits:
            raise MessageTooLong(f"content: too long for the model's context (at most about {budget} tokens)")

    def respond(self, tenant: Tenant, history: list[dict], clean_text: str,
                blocked: str | None = None, conversation_id: str | None = None) -> Iterator[tuple[str, object]]:
        """One turn for an already cleaned message (see clean_input). `conversation_id`: where an
        action's call is recorded."""
        if blocked is not None:
            reply = canned("blocked" if blocked == "banned_words" else "injection", clean_text)
            yield from self._canned(reply, ChatReply(reply, "blocked", 1.0, blocked=blocked))
            return
        qvec = None
        resolved = followup.resolve(history, clean_text)
        query = self.glossary.to_english(resolved.query)
        if not (self.detector.lexical_only or self.kb.lexical_only):
            try:
                texts = [clean_text] if query == clean_text else [clean_text, query]
                vecs = np.asarray(self.client.embed(texts), dtype=np.float32)
                qvec, svec = vecs[0], vecs[-1]
            except InferenceError:
                pass
        if qvec is None:
            yield from self._respond_lexical(clean_text, tenant.tenant_id)
            return
        intent = self.detector.classify(qvec, clean_text)
        # a yes or no to the bot's "Shall I ...?" is that answer, whatever the intent reads in it
        if self.actions is not None and tenant.actions and (
                intent.intent != "human_agent" or answers_confirmation(history, clean_text)):
            acted = self.actions.turn(tenant.tenant_id, tenant.actions, intent.intent, history, clean_text,
                                      conversation_id, has_cjk(clean_text))
            if acted is not None:
                yield from self._canned(acted.reply, ChatReply(acted.reply, intent.intent, intent.confidence,
                                                               action=acted.action))
                return
        mode = tenant.answer_mode
        # "what are your agents' hours?" asks about the human side: answered when the help centre can
        wants_human = intent.intent == "human_agent"
        if wants_human and (mode == "free" or not _ASKS_DETAILS.search(clean_text)):
            yield from self._handoff(clean_text, intent)
            return
        if intent.intent == "greeting" and mode != "free":
            reply = canned("greeting", clean_text)
            yield from self._canned(reply, ChatReply(reply, intent.intent, intent.confidence))
            return
        found = [] if intent.intent == "greeting" else self.kb.search(query, svec, self.top_k,
                                                                       tenant=tenant.tenant_id)
        if intent.intent != "greeting" and mode != "free":
            # a sentence that matches the question well brings its chunk in, under the chunk gate too
            have = {p.chunk for p in found}
            found += [p for p in self.kb.search_spans(svec, SPAN_K, SPAN_MIN, tenant=tenant.tenant_id)
                      if p.chunk not in have]
        if not found and intent.intent != "greeting":
            yield from self._handoff(clean_text, intent) if wants_human else self._nothing_found(clean_text, intent)
            return
        if mode == "free":
            yield from self._generate_free(tenant, history, clean_text, found, intent)
            return
        focus = self.glossary.to_english(resolved.focus) if resolved.focus else ""
        selection = self.selector.select(query, svec, found, focus=focus, avoid=resolved.previous_reply,
                                         translated=query != resolved.query,
                                         focus_vec=qvec if resolved.is_followup and query == resolved.query else None)
        if wants_human and not selection.answerable:
            yield from self._handoff(clean_text, intent)
            return
        if selection.conflict is not None:
            reply = clarifying_question(*selection.conflict, clean_text)
            cites = _citations([s.chunk for s in selection.conflict])
            yield from self._canned(reply, ChatReply(reply, intent.intent, intent.confidence, cites,
                                                     grounding="clarified"))
            return
        if not selection.answerable:
            reply = canned("not_found", clean_text)
            yield from self._canned(reply, ChatReply(reply, intent.intent, intent.confidence,
                                                     grounding="unanswerable"))
            return
        citations = _citations([s.chunk for s in selection.spans])
        if mode == "extractive":
            reply = quoted_reply(selection.spans, clean_text)
            if has_cjk(clean_text):          # the quote in the customer's language, figures checked
                reply = self._translated(reply)
            yield from self._canned(reply, ChatReply(reply, intent.intent, intent.confidence, citations,
                                                     grounding="quoted"))
            return
        yield from self._generate_grounded(tenant, history, clean_text, selection, intent, citations)

    def resolve_action(self, tenant: Tenant, conversation_id: str, key: str, confirm: bool,
                       chinese: bool = False) -> ChatReply | None:
        """The customer's Confirm / Cancel on an action this conversation asked about (None: not
        its action, or actions are off)."""
        if self.actions is None:
            return None
        acted = self.actions.resolve(tenant.tenant_id, tenant.actions, conversation_id, key, confirm, chinese)
        if acted is None:
            return None
        reply = self.banned.mask(acted.reply)[0]
        return ChatReply(reply, "action", 1.0, action=acted.action)

    def _nothing_found(self, text: str, intent: IntentResult) -> Iterator[tuple[str, object]]:
        """Nothing relevant: ask what it is about when even the intent is unsure, else say so."""
        key = "clarify" if not intent.confident else "not_found"
        reply = canned(key, text)
        yield from self._canned(reply, ChatReply(reply, intent.intent, intent.confidence,
                                                 grounding="unanswerable" if key == "not_found" else None))

    def _leak_filter(self, tenant: Tenant) -> LeakFilter:
        return LeakFilter([tenant.system_prompt, RULES, GROUNDED_RULES])

    def _stream(self, messages: list[dict], guard: StreamGuard, parts: list[str],
                max_tokens: int | None = None, temperature: float | None = None) -> Iterator[tuple[str, object]]:
        context = self.client.max_model_len()
        temperature = self.temperature if temperature is None else temperature
        for piece in self.client.chat_stream(messages, temperature=temperature,
                                             max_tokens=min(max_tokens or self.max_tokens, context // 2)):
            out = guard.feed(piece)
            if out:
                parts.append(out)
                yield "token", out
        tail = guard.finish()
        if tail:
            parts.append(tail)
            yield "token", tail

    def _generate_grounded(self, tenant: Tenant, history: list[dict], clean_text: str, selection: Selection,
                           intent: IntentResult, citations: list[dict]) -> Iterator[tuple[str, object]]:
        """The model writes from the selected spans; StreamGuard releases only verified sentences.
        A Chinese question gets the verified reply in Chinese (the spans and the verifier are English)."""
        english = self._grounded_english(tenant, history, clean_text, selection, intent, citations)
        if not has_cjk(clean_text):
            yield from english
            return
        done = next(value for kind, value in english if kind == "done")
        text = self._translated(done.reply)
        yield "token", text
        yield "done", replace(done, reply=text)

    def _translated(self, reply: str) -> str:
        """The reply in Chinese, through the output filters, if the model's translation keeps its
        numbers; else the reply as it is."""
        guard = StreamGuard(self.banned, allowed_pii=published_pii([reply]))
        try:
            pieces = self.client.chat_stream(translation_messages(reply), temperature=0.0,
                                             max_tokens=len(reply) // 2 + 32)
            text = "".join(guard.feed(p) for p in pieces) + guard.finish()
        except InferenceError as exc:
            log.warning("translation failed (%s); answering in English", exc)
            return reply
        return text.strip() if translation_keeps_facts(reply, text) else reply

    def _grounded_english(self, tenant: Tenant, history: list[dict], clean_text: str, selection: Selection,
                          intent: IntentResult, citations: list[dict]) -> Iterator[tuple[str, object]]:
        sources = [s.chunk.text for s in selection.spans]
        spans, vecs = self.kb.spans(list(dict.fromkeys(s.chunk for s in selection.spans)))
        chosen = [i for i, s in enumerate(spans) if s in selection.spans]
        if vecs is not None:
            vecs = vecs[chosen]
        verifier = SentenceVerifier(sources, self._leak_filter(tenant), names=(tenant.name,),
                                    embed=self.client.embed, source_vecs=vecs,
                                    span_texts=[f"{spans[i].lead} {spans[i].text}".strip() for i in chosen],
                                    answer_span=_as_stated(selection.spans[0]))

        guard = StreamGuard(self.banned, sentence_check=_kept_if(lambda t: verifier.check(t).ok),
                            allowed_pii=published_pii(sources))
        parts: list[str] = []
        messages = grounded_messages(tenant.system_prompt, selection, history, clean_text)
        try:
            yield from self._stream(messages, guard, parts, min(tenant.max_tokens or GROUNDED_MAX_TOKENS,
                                                                GROUNDED_MAX_TOKENS), self.grounded_temperature)
        except InferenceError as exc:
            log.warning("generation failed (%s); answering from the help centre", exc)
            yield from self._degraded(clean_text, [Passage(s.chunk, 0.0, 0.0) for s in selection.spans],
                                      intent, parts)
            return
        said = "".join(parts).strip()
        if not said or missing_facts(said, selection.spans, clean_text, known=(tenant.name,)):
            quote = self.banned.mask(quoted_reply(selection.spans, clean_text))[0]
            piece = f"{' ' if said else ''}{quote}"
            parts.append(piece)
            yield "token", piece
        outcome = "sentence_dropped" if guard.num_dropped or not said else "verified_generated"
        yield "done", ChatReply("".join(parts).strip(), intent.intent, intent.confidence, citations,
                                grounding=outcome)

    def _generate_free(self, tenant: Tenant, history: list[dict], clean_text: str, found: list[Passage],
                       intent: IntentResult) -> Iterator[tuple[str, object]]:
        """The model writes from the retrieved passages; only leaked sentences are held back."""
        try:
            # the prompt and the reply share the model's context
            context = self.client.max_model_len()
            max_tokens = min(tenant.max_tokens or self.max_tokens, context // 2)
            # the pieces are counted one by one, the service counts the templated whole: keep
            # 1/32 of the context as slack (a turn over it would be refused and degrade)
            budget = min(self.prompt_budget, context - max_tokens - 8 - context // 32)
            messages, passages = build_messages(tenant.system_prompt, found, history, clean_text,
                                                self.client.count_tokens, budget)
        except InferenceError as exc:
            log.warning("prompt not built (%s); answering from the help centre", exc)
            yield from self._degraded(clean_text, found, intent, [])
            return
        if found and not passages:        # no room for any passage: don't let the model guess
            reply = canned("not_found", clean_text)
            yield from self._canned(reply, ChatReply(reply, intent.intent, intent.confidence))
            return
        leak = self._leak_filter(tenant)
        guard = StreamGuard(self.banned, sentence_check=_kept_if(lambda t: not leak.leaks(t)))
        parts: list[str] = []
        try:
            yield from self._stream(messages, guard, parts)
        except InferenceError as exc:
            log.warning("generation failed (%s); answering from the help centre", exc)
            yield from self._degraded(clean_text, passages, intent, parts)
            return
        cites = _citations([p.chunk for p in passages])
        yield "done", ChatReply("".join(parts).strip(), intent.intent, intent.confidence, cites,
                                grounding="free")

    def _respond_lexical(self, text: str, tenant_id: str) -> Iterator[tuple[str, object]]:
        """No embeddings (the inference service is down, or the pipeline was built while it was):
        keyword intent and BM25 retrieval; the reply quotes the best help-centre excerpt with its
        citation and offers a human, or hands off when that is what was asked."""
        intent = self.detector.classify(None, text)
        if intent.intent == "human_agent":
            yield from self._handoff(text, intent)
            return
        passages = self.kb.search_lexical(text, 1, tenant=tenant_id)
        if passages:
            yield from self._degraded(text, passages, intent, [])
            return
        reply = f"{canned('degraded', text).split(':')[0]}. {canned('not_found', text)}"
        yield from self._canned(reply, ChatReply(reply, intent.intent, intent.confidence, degraded=True))

    def _handoff(self, text: str, intent: IntentResult) -> Iterator[tuple[str, object]]:
        reply = canned("handoff", text)
        yield from self._canned(reply, ChatReply(reply, intent.intent, intent.confidence, handoff=True))

    def _degraded(self, text: str, passages: list[Passage], intent, parts: list[str]) -> Iterator[tuple[str, object]]:
        """The model failed: end what was said, then the best passage with its citation."""
        if parts:
            parts.append("\n\n")
            yield "token", "\n\n"
        fallback = self.banned.mask(self._degraded_text(text, passages))[0]
        parts.append(fallback)
        yield "token", fallback
        cites = _citations([p.chunk for p in passages])[:1]
        yield "done", ChatReply("".join(parts), intent.intent, intent.confidence, cites,
                                handoff=False, degraded=True)

    def _degraded_text(self, text: str, passages: list[Passage]) -> str:
        if not passages:
            return canned("not_found", text)
        best = passages[0].chunk
        excerpt = " ".join(best.text.split()[:80])
        return (f"{canned('degraded', text)}\n\n**{best.title}**: {excerpt}\n\n"
                f"{canned('not_found', text).split('. ')[-1]}")

    def _canned(self, reply: str, result: ChatReply) -> Iterator[tuple[str, object]]:
        """A reply not written by the model (a quote, a canned line): the output filter still
        applies, so a help-centre sentence with a banned term is masked like a generated one."""
        masked = self.banned.mask(reply)[0]
        yield "token", masked
        yield "done", result if masked == reply else replace(result, reply=self.banned.mask(result.reply)[0])


def _as_stated(span: Span) -> str:
    """A span with what frames it: its list's lead, or else its section's heading ("Items that
    can't be returned" over "- Opened socks and underwear")."""
    return f"{span.lead or span.chunk.section} {span.text}".strip()


def _citations(chunks: list[Chunk]) -> list[dict]:
    seen, out = set(), []
    for c in chunks:
        if c.source not in seen:
            seen.add(c.source)
            out.append({"title": c.title, "source": f"kb/{c.source}"})
    return out


def _kept_if(ok: Callable[[str], bool]) -> Callable[[str], str | None]:
    """A StreamGuard sentence check: the sentence without "[1]" markers if `ok` says so, else None."""
    def check(sentence: str) -> str | None:
        sentence = strip_markers(sentence) + (" " if sentence[-1:].isspace() else "")
        return sentence if ok(sentence) else None
    return check
