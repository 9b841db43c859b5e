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


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_device_bitmask_path_blocks_what_the_host_path_blocks(llm_fp32, device):
    """On CUDA the packed bitmask crosses to the device and xgrammar's kernel applies it; here it
    is run on CPU tensors too, against the host path (numpy), over all rows and over some."""
    import torch

    from inference.structured.backend import apply_bitmask_on_device, apply_masks
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    backend = llm_fp32.engine.new_grammar_backend()
    grammar = backend.compile(StructuredOutputsParams(choice=["red", "green", "blue"]))
    states = [grammar.new_state(), grammar.new_state(), grammar.new_state()]
    one = backend.allocate_bitmask(1)
    states[2].fill_mask(one, 0)
    allowed = [t for t in range(32 * one.shape[1]) if (int(one[0, t // 32]) >> (t % 32)) & 1]
    assert states[2].try_accept(allowed[-1])                     # row 2 one token in: another mask
    logits = torch.randn(3, llm_fp32.engine.arch.vocab_size, generator=torch.Generator().manual_seed(3))
    for rows in ([0, 1, 2], [0, 2]):
        use = [states[i] if i in rows else None for i in range(3)]
        want = logits.clone()
        apply_masks(want, use)                                   # CPU logits: the numpy path
        got = logits.clone().to(device)
        picked = [i for i in rows if use[i] is not None]
        bitmask = backend.allocate_bitmask(len(picked))
        for j, i in enumerate(picked):
            use[i].fill_mask(bitmask, j)
        apply_bitmask_on_device(got, bitmask, picked)
        assert torch.equal(got.cpu().isinf(), want.isinf()) and torch.equal(got.cpu(), want)
        assert (want[1].isinf().sum() == 0) == (rows == [0, 2]) and 0 < (~want[0].isinf()).sum() < 40
        assert not torch.equal(want[0].isinf(), want[2].isinf())


@pytest.mark.slow
def test_json_strings_with_length_bounds_refuse_raw_control_characters(llm_fp32):
    """xgrammar 0.2.9 let a length-bounded string hold a raw tab, which json.loads rejects (seen
    on a random-weight model on the GPU: 20 of 503 outputs); the backend's grammar does not."""
    schema = {"type": "object", "properties": {"sku": {"type": "string", "maxLength": 10},
                                               "note": {"type": "string"}}, "required": ["sku", "note"]}
    grammar = llm_fp32.engine.new_grammar_backend().compile(StructuredOutputsParams(json=schema))

    def accepts(text: str) -> bool:
        matcher = grammar.backend.xgr.GrammarMatcher(grammar._compiled)
        return matcher.accept_string(text) and matcher.is_completed()
    assert accepts('{"sku": "AB-12", "note": "tab\\\\tescaped"}')
    for bad in ('{"sku": "AB\t12", "note": "x"}', '{"sku": "AB", "note": "x\ty"}', '{"sku": "AB\x01", "note": "x"}',
                '{"sku": "ABCDEFGHIJK", "note": "x"}'):
        assert not accepts(bad), bad


@pytest.mark.slow
def test_check_first_and_mask_first_choose_the_same_greedy_tokens(llm_fp32, monkeypatch):
    """The two orders (INFERENCE_GRAMMAR_ORDER) differ in cost, not in what greedy decoding picks:
    the unmasked argmax is kept only when the grammar allows it, which is the masked argmax."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer"}}, "required": ["name", "age"]}
    params = SamplingParams(max_tokens=48, temperature=0, structured_outputs=StructuredOutputsParams(json=schema))
    prompts = ["A person:", "Customer record:", "JSON for Ada Lovelace:"]
    texts = {}
    for order in ("check_first", "mask_first"):
        monkeypatch.setenv("INFERENCE_GRAMMAR_ORDER", order)
        texts[order] = [o.outputs[0].text for o in llm_fp32.generate(prompts, params, use_tqdm=False)]
        assert all(set(json.loads(t)) == {"name", "age"} for t in texts[order]), texts[order]
    assert texts["check_first"] == texts["mask_first"]
    assert_all_blocks_free(llm_fp32)


def test_an_unknown_grammar_order_names_the_choices(monkeypatch):
    from inference.worker.sampler import grammar_order
    monkeypatch.setenv("INFERENCE_GRAMMAR_ORDER", "sideways")
    with pytest.raises(ValueError, match="one of auto, check_first, mask_first"):
        grammar_order()
