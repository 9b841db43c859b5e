"""Tokenizers: a Hugging Face tokenizer from the model directory, or a byte tokenizer for
`random:` models (which have no vocabulary of their own, but must still take text prompts)."""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Protocol


class Tokenizer(Protocol):
    eos_token_id: int | None

    def encode(self, text: str) -> list[int]: ...
    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str: ...
    def decode_stream(self, context: list[int], skip_special_tokens: bool = True) -> DecodeStep | None: ...
    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None) -> list[int]: ...


class DecodeStep(Protocol):
    def step(self, token_id: int) -> str | None: ...


# Special tokens that end a generation wherever a vocabulary has them (llama.cpp's end-of-generation
# set): end of text / turn, and the FIM and repository separators a completion must not run past.
END_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "<|end|>",
              "<|fim_pad|>", "<|file_sep|>", "<|repo_name|>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")


# Tools for a chat template that does not render them: the call format Qwen2.5's template asks for
# (inference/server/tool_calls.py parses it)
TOOLS_SYSTEM = ("You can call these tools. To call one, answer with only\n"
                "<tool_call>\n{{\"name\": <tool name>, \"arguments\": <arguments object>}}\n</tool_call>\n"
                "Tools (JSON):\n{tools}")


def with_tools_system(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fallback for a template without tools: the definitions in a system message first."""
    return [{"role": "system", "content": TOOLS_SYSTEM.format(tools=json.dumps(tools))}, *messages]


class HFTokenizer:
    """A Hugging Face tokenizer shared by request threads (encode) and the engine loop (decode).

    The Rust tokenizer object is not safe for concurrent use ("Already borrowed"), so calls are
    serialised; each takes microseconds.
    """

    def __init__(self, path: str | Path):
        from transformers import AutoTokenizer
        self.hf = AutoTokenizer.from_pretrained(str(path))
        self.eos_token_id = self.hf.eos_token_id
        self.vocab_size = len(self.hf)
        special = {t.content: i for i, t in self.hf.added_tokens_decoder.items() if t.special}
        self.end_token_ids = frozenset(special[t] for t in END_TOKENS if t in special)
        self._lock = threading.Lock()

    def encode(self, text: str) -> list[int]:
        with self._lock:
            return self.hf.encode(text, add_special_tokens=True)

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        with self._lock:
            return self.hf.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def decode_stream(self, context: list[int], skip_special_tokens: bool = True) -> HFDecodeStep | None:
        """An incremental decoder for one sequence (the Rust tokenizer's DecodeStream: one call a
        token, ~2 us, against two transformers decodes of a window, ~16 us, on a 2-vCPU Xeon),
        primed with `context`, the prompt's last tokens; None where its text could differ from
        decode's (a tokenizer whose decode cleans up spaces before punctuation)."""
        if getattr(self.hf, "clean_up_tokenization_spaces", False) or getattr(self.hf, "_tokenizer", None) is None:
            return None
        return HFDecodeStep(self, context, skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The model's own template (Qwen2.5's renders `tools`, OpenAI-shaped function definitions);
        a template that does not render tools gets them in a system message of ours (TOOLS_SYSTEM)."""
        if not self.hf.chat_template:
            raise ValueError("messages: this model's tokenizer has no chat template")
        if tools and "tools" not in self.hf.chat_template:
            messages, tools = with_tools_system(messages, tools), None
        with self._lock:
            text = self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                               tools=tools)
            return self.hf.encode(text, add_special_tokens=False)


class HFDecodeStep:
    """One sequence's incremental decoder: `step(token)` is the text that token completes, or None
    while it ends inside a multi-byte character."""

    def __init__(self, tokenizer: HFTokenizer, context: list[int], skip_special_tokens: bool):
        from tokenizers.decoders import DecodeStream
        self._rust, self._lock = tokenizer.hf._tokenizer, tokenizer._lock
        self._stream = DecodeStream(ids=list(context), skip_special_tokens=skip_special_tokens)

    def step(self, token_id: int) -> str | None:
        with self._lock:
            return self._stream.step(self._rust, token_id)


class ByteTokenizer:
    """UTF-8 bytes shifted past three special ids (0 pad, 1 bos, 2 eos); ids past 258 wrap."""
    NUM_SPECIAL = 3

    def __init__(self, vocab_size: int, eos_token_id: int | None = 2):
        if vocab_size < 256 + self.NUM_SPECIAL:
            raise ValueError(f"vocab_size: a byte tokenizer needs >= 259 ids, got {vocab_size}")
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id

    def encode(self, text: str) -> list[int]:
        return [1] + [b + self.NUM_SPECIAL for b in text.encode("utf-8")]

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        data = bytes((t - self.NUM_SPECIAL) % 256 for t in token_ids
                     if not (skip_special_tokens and t < self.NUM_SPECIAL))
        return data.decode("utf-8", errors="replace")

    def decode_stream(self, context: list[int], skip_special_tokens: bool = True) -> None:
        return None                               # decoding a byte window is already cheap

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None) -> list[int]:
        """`role: content` lines; tools come first in a system message, and an assistant's
        tool calls as their JSON (a message's content may be null beside them)."""
        if tools:
            messages = with_tools_system(messages, tools)
        text = "".join(f"{m['role']}: {m.get('content') or ''}"
                       f"{json.dumps(m['tool_calls']) if m.get('tool_calls') else ''}\n" for m in messages)
        return self.encode(text + ("assistant: " if add_generation_prompt else ""))
