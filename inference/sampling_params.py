"""SamplingParams, shaped like vLLM's; every field is validated before anything is scheduled."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

# Below this temperature sampling is greedy (as in vLLM): 1/T would overflow fp32 logits.
_SAMPLING_EPS = 1e-5


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# top_k beyond the vocabulary keeps every token; the bound keeps it a 32-bit integer on the device
MAX_TOP_K = 2**31 - 1


@dataclass(frozen=True)
class StructuredOutputsParams:
    """What the output must match (vLLM's shape); exactly one of them. The engine compiles it into
    a grammar (inference/structured/) that masks every sampled token.

        json         a JSON Schema (dict, or its JSON text)
        json_object  any JSON object (OpenAI's response_format {"type": "json_object"})
        regex        a regular expression the whole output matches
        choice       one of these strings, exactly
        grammar      a context-free grammar in EBNF (GBNF, as llama.cpp and xgrammar write it)
    """
    json: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | list[str] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        given = [k for k in ("json", "regex", "choice", "grammar") if getattr(self, k) is not None]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            raise ValueError("structured_outputs: give exactly one of json, json_object, regex, choice, grammar; "
                             f"got {given or 'none'}")
        if self.json is not None and not isinstance(self.json, (dict, str)):
            raise ValueError(f"structured_outputs.json: must be a JSON Schema object, got {type(self.json).__name__}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name}: must be a non-empty string")
        if self.choice is not None:
            if (not isinstance(self.choice, (list, tuple)) or not self.choice
                    or any(not isinstance(c, str) or not c for c in self.choice)):
                raise ValueError("structured_outputs.choice: must be a non-empty list of non-empty strings")
            object.__setattr__(self, "choice", tuple(self.choice))

    @property
    def kind(self) -> str:
        """Which field is given: json, json_object, regex, choice or grammar."""
        return "json_object" if self.json_object else next(
            k for k in ("json", "regex", "choice", "grammar") if getattr(self, k) is not None)

    def key(self) -> str:
        """A stable text of the constraint (the grammar cache's key)."""
        import json as _json
        value = True if self.json_object else getattr(self, self.kind)
        return f"{self.kind}:" + (value if isinstance(value, str) else _json.dumps(value, sort_keys=True))


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0          # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1                   # -1 or 0 = off
    min_p: float = 0.0
    repetition_penalty: float = 1.0   # HF-style, over prompt + output tokens
    presence_penalty: float = 0.0     # OpenAI-style, over output tokens
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None       # number of top logprobs per generated token
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None
    # shifted KV reuse (llama.cpp's --cache-reuse): > 0 lets this request take the KV of a run of at
    # least that many prompt tokens from a recent request, where the run sits at another position,
    # rotated to its new one (inference/core/kv_reuse.py). Faster, and approximate: the run's KV
    # was computed after other tokens. 0 (default): every prompt token not in the exact prefix cache
    # is computed.
    cache_reuse: int = 0
    _stop_list: list[str] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"{name}: {why}, got {getattr(self, name)!r}")

        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise bad("n", "must be an integer >= 1")
        for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
            if not _is_number(getattr(self, name)):
                raise bad(name, "must be a finite number")
        if self.temperature < 0:
            raise bad("temperature", "must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "must be in (0, 1]")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or not -1 <= self.top_k <= MAX_TOP_K:
            raise bad("top_k", f"must be -1 (off), 0 (off) or a positive integer up to {MAX_TOP_K}")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "must be in [0, 1]")
        if self.repetition_penalty <= 0:
            raise bad("repetition_penalty", "must be > 0")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise bad("presence_penalty", "must be in [-2, 2]")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise bad("frequency_penalty", "must be in [-2, 2]")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise bad("max_tokens", "must be an integer >= 1")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise bad("min_tokens", "must be an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"must be <= max_tokens ({self.max_tokens})")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= 20):
            raise bad("logprobs", "must be an integer in [0, 20]")
        if self.seed is not None and (not isinstance(self.seed, int) or not 0 <= self.seed <= 2**63 - 1 - self.n):
            raise bad("seed", "must be an integer in [0, 2**63 - n)")
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not isinstance(s, str) or not s for s in stops):
            raise bad("stop", "must be a non-empty string or a list of non-empty strings")
        self._stop_list = stops
        if self.stop_token_ids is not None and (not isinstance(self.stop_token_ids, (list, tuple)) or any(
                not isinstance(t, int) or t < 0 for t in self.stop_token_ids)):
            raise bad("stop_token_ids", "must be a list of non-negative integers")
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise bad("structured_outputs", "must be a StructuredOutputsParams")
        if not isinstance(self.cache_reuse, int) or isinstance(self.cache_reuse, bool) or self.cache_reuse < 0:
            raise bad("cache_reuse", "must be an integer >= 0 (0: off)")


    @property
    def stop_strings(self) -> list[str]:
        return self._stop_list

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _SAMPLING_EPS

    @property
    def needs_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    def for_child(self, index: int) -> SamplingParams:
        """The params of the index-th of n samples: n=1, a distinct seed if one was given."""
        from dataclasses import replace
        return replace(self, n=1, seed=None if self.seed is None else self.seed + index)
