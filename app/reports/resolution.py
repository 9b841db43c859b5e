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
from dataclasses import dataclass

OUTCOMES = ("bot_resolved", "handed_off", "human_resolved", "abandoned", "reopened")
NOT_ANSWERED = frozenset({"unanswerable", "clarified"})           # the reply's grounding
ASKING = frozenset({"needs_input", "needs_confirmation"})         # an action still waiting on the customer


@dataclass(frozen=True)
class Facts:
    """What the outcome is read from, for one conversation."""
    status: str                            # open | pending_human | human | resolved
    agent_took_part: bool                  # an agent claimed one of its handoffs
    thumbs_up: bool                        # the customer rated a reply up
    last_activity_at: dt.datetime | None    # the conversation's last change (its last message)
    last_role: str | None                  # who wrote the last message
    last_grounding: str | None             # that message's grounding, if the bot's
    last_action_status: str | None         # that message's action's status, if the bot's


def outcome(f: Facts, now: dt.datetime, window: dt.timedelta) -> str | None:
    """The conversation's outcome at `now`, or None while it is undecided."""
    if f.status == "resolved":
        return "human_resolved"
    if f.status in ("pending_human", "human"):
        return "handed_off"
    if f.agent_took_part:
        return "reopened"
    if f.thumbs_up:
        return "bot_resolved"
    if f.last_activity_at is not None and now - f.last_activity_at < window:
        return None
    answered = (f.last_role == "assistant" and f.last_grounding not in NOT_ANSWERED
                and f.last_action_status not in ASKING)
    return "bot_resolved" if answered else "abandoned"


def resolution_rate(counts: dict[str, int]) -> float | None:
    """The bot's resolution rate: bot_resolved over the decided conversations."""
    decided = sum(counts.get(o, 0) for o in OUTCOMES)
    return round(counts.get("bot_resolved", 0) / decided, 4) if decided else None
