"""Prompt assembly for the support chat: the tenant's system prompt, the retrieved passages
(numbered, so the reply can cite them), and as much recent conversation as the token budget
leaves room for (oldest turns dropped first; the new message always stays)."""
from __future__ import annotations

from collections.abc import Callable

from pipelines.knowledge_base import Passage

RULES = ("Answer the customer's question using only the help-centre passages below. Be brief, friendly "
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
    """Chat messages within `budget` prompt tokens, and the passages they include. Passages are
    dropped from the lowest-ranked up (the best one is shortened before it goes) until the system
    prompt fits with the new message; then history is added newest-first while it fits."""
    passages = list(passages)
    user_cost = count_tokens(user_text) + 16                              # + chat-template overhead
    max_words = MAX_PASSAGE_WORDS
    while True:
        system = f"{system_prompt.strip()}\n\n{RULES}"
        if passages:
            system += "\n\nHelp-centre passages:\n" + format_passages(passages, max_words)
        used = count_tokens(system) + user_cost
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
    messages = [{"role": "system", "content": system}, *reversed(kept), {"role": "user", "content": user_text}]
    return messages, passages
