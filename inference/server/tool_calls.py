"""Tool calling on the chat endpoint: the tools rendered into the prompt, the grammar that holds a
`required` or named call to the tools' schemas, and the model's calls parsed into OpenAI's
`message.tool_calls`.

The call format is Qwen2.5's (its chat template renders `tools` and asks for it):

    <tool_call>
    {"name": "get_order_status", "arguments": {"order_id": "AB1234"}}
    </tool_call>

Small models often answer with the bare JSON object instead, and a whole answer that is one (or a
list of them) naming an offered tool is taken as calls too.

A model whose chat template does not render tools (SmolLM2's) gets them in a system message of ours
that asks for the same format (TOOLS_SYSTEM, inference/core/tokenizer.py).
"""
from __future__ import annotations

import json
import re
import uuid
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def call_schema(tools: list[dict], name: str | None = None) -> dict:
    """The JSON Schema of one call: {"name": one of the tools (or `name`), "arguments": its parameters}."""
    options = []
    for tool in tools:
        fn = tool["function"]
        if name is not None and fn["name"] != name:
            continue
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        options.append({"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": params},
                        "required": ["name", "arguments"], "additionalProperties": False})
    return options[0] if len(options) == 1 else {"anyOf": options}


def call_grammar(tools: list[dict], name: str | None = None) -> str:
    """EBNF (xgrammar's) of exactly one call in the tag format, to one of `tools` or to `name`."""
    import xgrammar as xgr
    grammar = xgr.Grammar.concat(xgr.Grammar.from_ebnf(f'root ::= "{OPEN}\\n"'),
                                 xgr.Grammar.from_json_schema(json.dumps(call_schema(tools, name)),
                                                              any_whitespace=False),
                                 xgr.Grammar.from_ebnf(f'root ::= "\\n{CLOSE}"'))
    return str(grammar)


def check_parameters(tools: list[dict]) -> None:
    """ValueError naming the tool whose parameters are not a JSON Schema the grammar backend takes."""
    import xgrammar as xgr

    from inference.structured.xgrammar_backend import error_text
    for i, tool in enumerate(tools):
        params = tool["function"].get("parameters")
        if params is None:
            continue
        try:
            xgr.Grammar.from_json_schema(json.dumps(params))
        except (RuntimeError, ValueError, TypeError) as exc:
            raise ValueError(f"tools[{i}].function.parameters: {error_text(exc)}") from None


def _openai_call(body: Any, names: set[str] | None) -> dict[str, Any] | None:
    if not isinstance(body, dict) or not isinstance(body.get("name"), str):
        return None
    if names is not None and body["name"] not in names:
        return None
    args = body.get("arguments", {})
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": body["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}}


def parse_calls(text: str, names: set[str] | None = None) -> tuple[str | None, list[dict[str, Any]]]:
    """(the text outside the calls, or None if there is none; the calls in OpenAI's shape). A call
    whose JSON does not parse stays in the text. `names`: the offered tools (a bare JSON answer
    counts as a call only if it names one of them)."""
    calls, kept, last = [], [], 0
    for m in CALL.finditer(text):
        try:
            call = _openai_call(json.loads(m.group(1)), None)
        except ValueError:
            call = None
        if call is None:
            continue
        kept.append(text[last:m.start()])
        last = m.end()
        calls.append(call)
    if not calls and names and text.strip()[:1] in ("{", "["):
        try:
            body = json.loads(text.strip())
        except ValueError:
            return text, []
        bare = [_openai_call(b, names) for b in (body if isinstance(body, list) else [body])]
        return (None, bare) if bare and all(bare) else (text, [])
    kept.append(text[last:])
    content = "".join(kept).strip()
    return (content or None) if calls else text, calls


def safe_prefix(text: str) -> int:
    """How much of a streamed text can go out as content now: up to a call's start, or up to a
    trailing partial '<tool_call>'; nothing of an answer that starts as JSON (a bare call)."""
    if text.lstrip()[:1] in ("{", "["):
        return 0
    at = text.find(OPEN)
    if at >= 0:
        return at
    for k in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if text.endswith(OPEN[:k]):
            return len(text) - k
    return len(text)


def template_messages(messages: list[dict]) -> list[dict]:
    """OpenAI messages as chat templates take them: a call's arguments as an object, not a JSON string."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = dict(c.get("function", {}))
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except ValueError:
                        pass
                calls.append({**c, "function": fn})
            m["tool_calls"] = calls
        if m.get("content") is None:
            m["content"] = ""
        out.append(m)
    return out
