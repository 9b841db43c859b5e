"""Incremental detokenisation with stop strings.

A Hugging Face tokenizer decodes through its Rust DecodeStream (one call a token), primed with
the prompt's last tokens. Otherwise text is produced by decoding a sliding window of tokens
(prefix_offset..end) and taking what the window adds beyond its first part
(prefix_offset..read_offset), so byte-level BPE merges and multi-byte characters come out right;
while the newest tokens end in an incomplete UTF-8 character ("\ufffd") nothing new is released.

Text that could still become the start of a stop string is held back until it cannot, so a
stream never shows a partial stop string.
"""
from __future__ import annotations

from inference.core.tokenizer import Tokenizer
from inference.sampling_params import SamplingParams

# Prompt tokens decoded as context before the first output token.
_CONTEXT = 5


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, params: SamplingParams, prompt_token_ids: list[int] = ()):
        self.tokenizer = tokenizer
        self.skip_special = params.skip_special_tokens
        self.stops = params.stop_strings
        self.include_stop = params.include_stop_str_in_output
        self.min_tokens = params.min_tokens
        self.max_stop_len = max((len(s) for s in self.stops), default=0)
        # The prompt's last tokens give the first output token its context (leading spaces).
        self.token_ids: list[int] = list(prompt_token_ids[-_CONTEXT:]) if prompt_token_ids else []
        stream = getattr(tokenizer, "decode_stream", None)
        self._stream = stream(self.token_ids, self.skip_special) if stream is not None else None
        self.prefix_offset = 0
        self.read_offset = len(self.token_ids)
        self.num_output_tokens = 0
        self.text = ""             # all decoded output text (possibly past a stop string)
        self.released = 0          # characters of `text` already handed out
        self.stop_hit: str | None = None

    @property
    def output_text(self) -> str:
        return self.text[:self.released]

    def add_tokens(self, token_ids: list[int]) -> str | None:
        """Decode new tokens; returns the stop string that matched, if any."""
        for token in token_ids:
            self.token_ids.append(token)
            self.num_output_tokens += 1
            before = len(self.text)
            self._decode_step()
            if self.stops and self.stop_hit is None and self.num_output_tokens > self.min_tokens:
                # Search only where a match could newly end.
                lo = max(0, before - self.max_stop_len + 1)
                for stop in self.stops:
                    at = self.text.find(stop, lo)
                    if at != -1:
                        self.stop_hit = stop
                        self.text = self.text[:at + (len(stop) if self.include_stop else 0)]
                        break
            if self.stop_hit is not None:
                return self.stop_hit
        return None

    def take_delta(self, finished: bool) -> str:
        """New text safe to show: everything when finished, else all but a possible stop prefix."""
        end = len(self.text)
        if not finished and self.stops and self.stop_hit is None:
            end = max(self.released, end - self._held_back())
        delta = self.text[self.released:end]
        self.released = end
        return delta

    def _held_back(self) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        best = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(self.text)), best, -1):
                if self.text.endswith(stop[:k]):
                    best = k
                    break
        return best

    def _decode_step(self) -> None:
        if self._stream is not None:
            piece = self._stream.step(self.token_ids[-1])
            if piece:
                self.text += piece
            return
        ids = self.token_ids
        prefix = self.tokenizer.decode(ids[self.prefix_offset:self.read_offset], self.skip_special)
        full = self.tokenizer.decode(ids[self.prefix_offset:], self.skip_special)
        if full.endswith("\ufffd"):
            return                                    # incomplete UTF-8 character: wait
        if len(full) > len(prefix):
            self.text += full[len(prefix):]
        self.prefix_offset, self.read_offset = self.read_offset, len(ids)
