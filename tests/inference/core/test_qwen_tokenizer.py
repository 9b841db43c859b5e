"""The default model's tokenizer, as the GGUF file defines it: FIM and repository tokens are single
special ids that user text cannot split, generation ends at its end-of-generation tokens, and the
chat template renders tools."""
from __future__ import annotations

import pytest

from inference.core.tokenizer import HFTokenizer
from inference.loader.model_loader import resolve_model_dir


@pytest.fixture(scope="module")
def tok() -> HFTokenizer:
    return HFTokenizer(resolve_model_dir("qwen2.5-coder-0.5b"))


@pytest.mark.parametrize("special", ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>",
                                     "<|file_sep|>"])
def test_fim_and_repository_tokens_are_one_id_each(tok, special):
    prefix, suffix = "def area(r):\n    return 3.14159 *", "\n\nprint(area(2))\n"
    ids = tok.encode(f"{special}{prefix}{special}{suffix}")
    sid = tok.hf.convert_tokens_to_ids(special)
    assert ids.count(sid) == 2
    assert tok.decode(ids, skip_special_tokens=False) == f"{special}{prefix}{special}{suffix}"


def test_end_of_generation_tokens_include_endoftext_and_the_fim_pad(tok):
    ids = {tok.hf.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_end|>", "<|fim_pad|>", "<|file_sep|>")}
    assert ids <= tok.end_token_ids
    assert tok.eos_token_id in tok.end_token_ids
    assert tok.hf.convert_tokens_to_ids("def") not in tok.end_token_ids


def test_the_chat_template_renders_tools(tok):
    tools = [{"type": "function", "function": {"name": "order_status", "description": "Where an order is.",
                                               "parameters": {"type": "object",
                                                              "properties": {"order_id": {"type": "string"}}}}}]
    text = tok.decode(tok.apply_chat_template([{"role": "user", "content": "Where is order 42?"}], tools=tools),
                      skip_special_tokens=False)
    assert "# Tools" in text and '"name": "order_status"' in text and "<tool_call>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_a_template_without_tools_gets_them_in_a_system_message():
    """SmolLM2's template does not render tools: they go in a system message of ours, which asks
    for Qwen's <tool_call> format (inference/server/tool_calls.py parses it)."""
    smol = HFTokenizer(resolve_model_dir("smollm2"))
    assert "tools" not in smol.hf.chat_template
    tools = [{"type": "function", "function": {"name": "order_status", "parameters": {"type": "object"}}}]
    text = smol.decode(smol.apply_chat_template([{"role": "user", "content": "Where is order 42?"}], tools=tools),
                       skip_special_tokens=False)
    assert "<tool_call>" in text and '"name": "order_status"' in text
    assert text.index("order_status") < text.index("Where is order 42?")
