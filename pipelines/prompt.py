"""Prompt assembly for the support chat: the tenant's system prompt, as much recent conversation
as the token budget leaves room for (oldest turns dropped first), then the retrieved passages
(numbered, so the reply can cite them) with the new message.

Prefix-stable across turns: the system message is the same every turn and the history comes
right after it, so turn N+1's prompt starts with the tokens of turn N's (up to turn N's own
passages, which the stored history does not keep) and the engine's prefix cache -- on the device
or in a lower KV tier -- serves them without recomputing. Passages change with every question,
so they go last, never before the history."""
from __future__ import annotations

from collections.abc import Callable

from pipelines.knowledge_base import Passage

RULES = ("Answer the customer's question using only the help-centre passages given with their latest "
         "message. Be brief, friendly "
         "and specific. If the passages do not answer it, say you are not sure and offer to connect them "
         "with a human agent; never invent policies, prices or order details. Reply in the customer's "
         "language.")
MAX_PASSAGE_WORDS = 160


def format_passages(passages: list[Passage], max_words: int = MAX_PASSAGE_WORDS) -> str:
    lines = []
    for n, p in enumerate(passages, start=1):
        words = p.chunk.text.split()
        text = " ".join(words[:max_words]) + (" ..." if len(words) > max_words else "")
        heading = f"{p.chunk.title} - {p.chunk.section}" if p.chunk.section else p.chunk.title
        lines.append(f"[{n}] {heading}\n{text}")
    return "\n\n".join(lines)


def build_messages(system_prompt: str, passages: list[Passage], history: list[dict], user_text: str,
                   count_tokens: Callable[[str], int], budget: int) -> tuple[list[dict], list[Passage]]:
    """Chat messages within `budget` prompt tokens, and the passages they include: the system
    message, the history, then one user message holding the passages and the new message.
    Passages are dropped from the lowest-ranked up (the best one is shortened before it goes)
    until they fit with the system prompt and the new message; then history is added
    newest-first while it fits."""
    passages = list(passages)
    system = f"{system_prompt.strip()}\n\n{RULES}"
    base_cost = count_tokens(system) + count_tokens(user_text) + 16      # + chat-template overhead
    max_words = MAX_PASSAGE_WORDS
    while True:
        context = ""
        if passages:
            context = "Help-centre passages:\n" + format_passages(passages, max_words) + "\n\nCustomer message:\n"
        used = base_cost + (count_tokens(context) if context else 0)
        if used <= budget or not passages:
            break
        if len(passages) > 1:
            passages.pop()
        elif max_words > 20:            # a small context: keep the best passage, shortened
            max_words //= 2
        else:
            passages.pop()
    kept: list[dict] = []
    for msg in reversed(history):
        if msg.get("role") not in ("user", "assistant") or not msg.get("content") or msg.get("blocked"):
            continue                     # refused turns (injection, banned words) never reach the model
        cost = count_tokens(msg["content"]) + 4
        if used + cost > budget:
            break
        kept.append({"role": msg["role"], "content": msg["content"]})
        used += cost
    messages = [{"role": "system", "content": system}, *reversed(kept),
                {"role": "user", "content": context + user_text}]
    return messages, passages
