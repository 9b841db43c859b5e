"""Structured outputs in the engine (inference/structured/): the constraint's validation, and the
offline LLM on SmolLM2 (its Hugging Face tokenizer) held to a choice, a regex and a JSON schema,
greedy and sampled, n > 1, with every KV block returned."""
from __future__ import annotations

import json
import re

import pytest

from inference import SamplingParams
from inference.sampling_params import StructuredOutputsParams
from tests.conftest import assert_all_blocks_free


@pytest.mark.parametrize("kwargs, words", [
    ({}, "exactly one"), ({"regex": "a", "choice": ["b"]}, "exactly one"), ({"regex": ""}, "regex"),
    ({"choice": []}, "choice"), ({"choice": ["a", 3]}, "choice"), ({"json": 5}, "json"),
])
def test_a_constraint_is_exactly_one_valid_kind(kwargs, words):
    with pytest.raises(ValueError, match=words):
        StructuredOutputsParams(**kwargs)


def test_the_cache_key_does_not_depend_on_key_order():
    a = StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "string"}}})
    b = StructuredOutputsParams(json={"properties": {"a": {"type": "string"}}, "type": "object"})
    assert a.key() == b.key() != StructuredOutputsParams(json_object=True).key()


@pytest.mark.slow
def test_outputs_match_their_constraint(llm_fp32):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "sunny": {"type": "boolean"}},
              "required": ["city", "sunny"], "additionalProperties": False}
    cases = [(StructuredOutputsParams(choice=["red", "green", "blue"]), lambda t: t in ("red", "green", "blue")),
             (StructuredOutputsParams(regex=r"[0-9]{2}:[0-9]{2}"), lambda t: re.fullmatch(r"[0-9]{2}:[0-9]{2}", t)),
             (StructuredOutputsParams(json=schema), lambda t: set(json.loads(t)) == {"city", "sunny"})]
    for spec, ok in cases:
        for params in (SamplingParams(max_tokens=40, temperature=0, structured_outputs=spec),
                       SamplingParams(max_tokens=40, temperature=1.0, n=3, seed=5, structured_outputs=spec)):
            out = llm_fp32.generate(["The weather today:"], params, use_tqdm=False)[0]
            assert len(out.outputs) == params.n
            for o in out.outputs:
                assert o.finish_reason == "stop" and ok(o.text), (spec, o.text)
    with pytest.raises(ValueError, match="structured_outputs.regex"):
        llm_fp32.generate(["x"], SamplingParams(structured_outputs=StructuredOutputsParams(regex="[")), use_tqdm=False)
    assert_all_blocks_free(llm_fp32)
