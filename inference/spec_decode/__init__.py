"""Speculative decoding: proposers guess the next k tokens cheaply, one target forward checks them.

    config.py       SpeculativeConfig (vLLM's `speculative_config` dict)
    ngram.py        prompt lookup: copy what followed the last n tokens earlier in the context
    draft_model.py  a smaller model (or the target's own int4 copy) with its own KV cache
    rejection.py    verification: greedy prefix match, or rejection sampling (exact distribution)
    speculator.py   per-request adaptive k, proposals between steps, acceptance counters
"""
