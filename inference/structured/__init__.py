"""Structured outputs: a request's StructuredOutputsParams (JSON Schema, any JSON object, regex,
fixed choice, EBNF grammar) become a grammar, and the grammar a mask over the vocabulary at every
sampled token, so the output matches by construction.

    backend = grammar_backend(tokenizer, vocab_size, end_ids)   # one per engine
    compiled = backend.compile(params.structured_outputs)       # ValueError on a bad schema / regex;
                                                                # LRU-cached by the constraint's text
    state = compiled.new_state()                                # one per running sequence
    apply_masks(logits, [state or None per row])                # before sampling
    state.try_accept(token)                                     # after it

The sampler (inference/worker/sampler.py) first tries the token chosen without the mask where
that gives the masked choice exactly (greedy, or sampling with no top-k / top-p / min-p: the
exponential race's winner, if allowed, is also the winner among the allowed tokens), and masks and
chooses again only when the grammar rejects it: most steps of a JSON answer build no mask at all.

The backend is xgrammar (inference/structured/xgrammar_backend.py), behind this small interface
(`GrammarBackend`, `GrammarState`) so that llguidance can stand beside it.
"""
from inference.structured.backend import GrammarBackend, GrammarState, apply_masks, grammar_backend

__all__ = ["GrammarBackend", "GrammarState", "apply_masks", "grammar_backend"]
