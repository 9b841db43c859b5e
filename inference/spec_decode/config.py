"""SpeculativeConfig: the `speculative_config` engine argument, shaped like vLLM's.

    LLM(model="smollm2", speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                             "prompt_lookup_max": 4})
    inference serve --speculative-config '{"method": "draft_model", "model": "random:tiny", ...}'
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

METHODS = ("ngram", "draft_model", "self_int4")
MAX_SPECULATIVE_TOKENS = 16


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int                # k: the most tokens proposed per request per step
    model: str | None = None                   # draft_model: the draft (same tokenizer as the target)
    prompt_lookup_max: int = 4                 # ngram: longest suffix looked up in the context
    prompt_lookup_min: int = 1                 # ngram: shortest one
    # shrink k for a request whose drafts keep being rejected, grow it back as they are accepted
    adaptive: bool = True
    draft_kv_cache_memory_bytes: int | None = None   # draft models' KV cache (None: as the target's)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative_config.method: must be one of {METHODS}, got {self.method!r}")
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"speculative_config.num_speculative_tokens: must be an integer in "
                             f"[1, {MAX_SPECULATIVE_TOKENS}], got {k!r}")
        if self.method == "draft_model" and not (isinstance(self.model, str) and self.model):
            raise ValueError("speculative_config.model: method 'draft_model' needs the draft model's name or path")
        if self.method != "draft_model" and self.model is not None:
            raise ValueError(f"speculative_config.model: only for method 'draft_model' (method "
                             f"{self.method!r} drafts without a second model)")
        for name in ("prompt_lookup_max", "prompt_lookup_min"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"speculative_config.{name}: must be an integer >= 1, got {v!r}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"speculative_config.prompt_lookup_min: {self.prompt_lookup_min} is above "
                             f"prompt_lookup_max {self.prompt_lookup_max}")
        if not isinstance(self.adaptive, bool):
            raise ValueError(f"speculative_config.adaptive: must be true or false, got {self.adaptive!r}")
        b = self.draft_kv_cache_memory_bytes
        if b is not None and (not isinstance(b, int) or isinstance(b, bool) or b <= 0):
            raise ValueError(f"speculative_config.draft_kv_cache_memory_bytes: must be a positive integer, got {b!r}")

    @classmethod
    def parse(cls, value: Any) -> SpeculativeConfig | None:
        """None, a SpeculativeConfig, a dict or its JSON text (the CLI flag)."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"speculative_config: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config: must be a dict (or its JSON), got {type(value).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"speculative_config: unknown keys {unknown}; known: {sorted(known)}")
        for key in ("method", "num_speculative_tokens"):
            if key not in value:
                raise ValueError(f"speculative_config.{key}: required")
        return cls(**value)
