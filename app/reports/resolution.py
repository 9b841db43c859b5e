"""Each conversation's outcome, by the rule Intercom Fin's resolution rate uses: the bot resolved
a conversation when the customer confirmed it, or left without asking for more help within a
window (24 hours by default, RESOLUTION_WINDOW_H).

    human_resolved  an agent resolved it (status resolved)
    reopened        an agent had resolved it and the customer wrote again (back with the bot)
    handed_off      it waits for, or is with, an agent (pending_human, human)
    bot_resolved    no agent took part, and the customer gave a thumbs-up to a reply, or the bot's
                    last reply answered and the conversation then stayed quiet for the window
    abandoned       no agent took part, the window passed, and the customer's last message got no
                    answer: no reply at all, or one that did not answer (the help centre had
                    nothing, a clarifying question, an action still asking for its order number)

A conversation with no agent that was active within the window (its last message, the bot's reply
coming seconds after the customer's), without a thumbs-up, is undecided: it counts once the
window has passed. A handoff the customer cancelled before an agent
claimed it leaves the conversation with the bot, judged as if it had none.
"""
from __future__ import annotations

import datetime as dt

from sqlalchemy import and_, case, func, literal, or_

from app.store.models import Conversation

OUTCOMES = ("bot_resolved", "handed_off", "human_resolved", "abandoned", "reopened")
NOT_ANSWERED = frozenset({"unanswerable", "clarified"})           # the reply's grounding
ASKING = frozenset({"needs_input", "needs_confirmation"})         # an action still waiting on the customer


def outcome_sql(now: dt.datetime, window: dt.timedelta, agent_took_part, thumbs_up, last):
    """The conversation's outcome at `now` by the rules above, as one SQL CASE (the database
    counts them; no conversation is shipped to Python): "undecided" while inside the window.
    `agent_took_part` and `thumbs_up` are EXISTS clauses on the conversation; `last` is its last
    message (outer-joined: a missing one reads as NULL, not the bot's)."""
    action_status = last.action["status"].as_string()
    answered = and_(last.role == "assistant", func.coalesce(last.grounding, "").not_in(sorted(NOT_ANSWERED)),
                    or_(action_status.is_(None), action_status.not_in(sorted(ASKING))))
    return case(
        (Conversation.status == "resolved", literal("human_resolved")),
        (Conversation.status.in_(("pending_human", "human")), literal("handed_off")),
        (agent_took_part, literal("reopened")),
        (thumbs_up, literal("bot_resolved")),
        (Conversation.updated_at > now - window, literal("undecided")),
        (answered, literal("bot_resolved")),
        else_=literal("abandoned"))


def resolution_rate(counts: dict[str, int]) -> float | None:
    """The bot's resolution rate: bot_resolved over the decided conversations."""
    decided = sum(counts.get(o, 0) for o in OUTCOMES)
    return round(counts.get("bot_resolved", 0) / decided, 4) if decided else None
