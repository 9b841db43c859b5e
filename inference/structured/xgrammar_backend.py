"""The grammar backend on xgrammar: its compiler (with its own cache) over the engine's Hugging
Face tokenizer, and one GrammarMatcher per running request."""
from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict

import torch

from inference.sampling_params import StructuredOutputsParams

CACHE_SIZE = 256          # compiled grammars kept (a schema is compiled once while it is in use)


def error_text(exc: Exception) -> str:
    """xgrammar's first error line without its log prefix (time, C++ file and line)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", first)


def _ebnf_choice(choice: tuple[str, ...]) -> str:
    # JSON's string escapes are valid EBNF string literals in xgrammar's grammar syntax
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choice)


# xgrammar 0.2.9 writes a string with minLength / maxLength as a run of [^"\\\r\n]: a raw tab or
# other control character, which JSON forbids in a string, was allowed there (and json.loads
# rejects the output). Its unbounded strings already exclude \0-\x1f; the bounded ones are made to.
_BOUNDED_CHAR = r'[^\"\\\r\n]'
_JSON_CHAR = r'[^\0-\x1f\"\\]'


def json_schema_ebnf(xgr, schema: str) -> str:
    """The schema's grammar as xgrammar writes it (compact separators), with string characters
    held to what JSON allows unescaped."""
    return str(xgr.Grammar.from_json_schema(schema, any_whitespace=False)).replace(_BOUNDED_CHAR, _JSON_CHAR)


class XGrammarState:
    def __init__(self, matcher, backend: XGrammarBackend):
        self._matcher, self.backend = matcher, backend

    def fill_mask(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def try_accept(self, token: int) -> bool:
        """Advance past `token` if the grammar allows it next (else nothing changes)."""
        return self._matcher.is_terminated() or self._matcher.accept_token(token)

    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()


class CompiledGrammar:
    """A compiled constraint: what a Request carries; each running sequence gets its own state."""

    def __init__(self, compiled, backend: XGrammarBackend):
        self._compiled, self.backend = compiled, backend

    def new_state(self) -> XGrammarState:
        return XGrammarState(self.backend.xgr.GrammarMatcher(self._compiled), self.backend)


class XGrammarBackend:
    name = "xgrammar"

    def __init__(self, tokenizer, vocab_size: int, end_ids: list[int]):
        import xgrammar as xgr
        hf = getattr(tokenizer, "hf", None)
        if hf is None:
            raise ValueError("structured_outputs: this model's tokenizer is not a Hugging Face tokenizer, "
                             "which the grammar backend needs")
        self.xgr = xgr
        self.vocab_size = vocab_size
        self.info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size, stop_token_ids=sorted(set(end_ids)))
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        self._cache: OrderedDict[str, object] = OrderedDict()
        self._lock = threading.Lock()          # the cache: request threads compile, the engine thread matches
        self._compiling = threading.Lock()     # one compile at a time on the shared compiler
        self._batch = None                     # the engine thread's batch matcher, made on first use

    def compile(self, spec: StructuredOutputsParams) -> CompiledGrammar:
        key = spec.key()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        with self._compiling:
            compiled = CompiledGrammar(self._compile(spec), self)
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, spec: StructuredOutputsParams):
        c = self.compiler
        try:
            if spec.json_object:
                return c.compile_builtin_json_grammar()
            if spec.json is not None:
                schema = spec.json if isinstance(spec.json, str) else json.dumps(spec.json)
                json.loads(schema)
                return c.compile_grammar(json_schema_ebnf(self.xgr, schema))
            if spec.regex is not None:
                return c.compile_regex(spec.regex)
            if spec.choice is not None:
                return c.compile_grammar(_ebnf_choice(spec.choice))
            return c.compile_grammar(spec.grammar)
        except (RuntimeError, ValueError, TypeError) as exc:     # xgrammar reports parse errors as these
            raise ValueError(f"structured_outputs.{spec.kind}: {error_text(exc)}") from None

    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        return self.xgr.allocate_token_bitmask(rows, self.vocab_size)

    def fill_masks(self, states: list[XGrammarState], bitmask: torch.Tensor) -> None:
        """One call for the batch: xgrammar fills the rows on its own threads (half the host's
        hardware threads), outside the GIL, instead of one Python call per row."""
        if len(states) == 1:
            states[0].fill_mask(bitmask, 0)
            return
        if self._batch is None:
            self._batch = self.xgr.BatchGrammarMatcher()
        self._batch.batch_fill_next_token_bitmask([s._matcher for s in states], bitmask)
