"""Structured outputs: a request's StructuredOutputsParams (JSON Schema, any JSON object, regex,
fixed choice, EBNF grammar) become a grammar, and the grammar a mask over the vocabulary at every
sampled token, so the output matches by construction.

    backend = grammar_backend(tokenizer, vocab_size, end_ids)   # one per engine
    compiled = backend.compile(params.structured_outputs)       # ValueError on a bad schema / regex;
                                                                # LRU-cached by the constraint's text
    state = compiled.new_state()                                # one per running sequence
    apply_masks(logits, [state or None per row])                # before sampling
    state.accept(token)                                         # after it

The backend is xgrammar (inference/structured/xgrammar_backend.py), behind this small interface
(`GrammarBackend`, `GrammarState`) so that llguidance can stand beside it.
"""
from inference.structured.backend import GrammarBackend, GrammarState, apply_masks, grammar_backend

__all__ = ["GrammarBackend", "GrammarState", "apply_masks", "grammar_backend"]
