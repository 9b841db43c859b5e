"""Engine behaviour on the real SmolLM2 weights: caching, preemption, chunking, seeds, stops, n, logprobs."""
from __future__ import annotations

import pytest

from inference import LLM, SamplingParams
from tests.conftest import assert_all_blocks_free

pytestmark = pytest.mark.slow

SHARED = ("You are a support assistant for an online store. Answer briefly and politely. "
          "Customers ask about orders, refunds and shipping. ")
PROMPTS = [SHARED + q for q in ("Where is my order?", "How do I get a refund?",
                                "Do you ship to Canada?", "Can I change my address?")] + [
    "Write a haiku about the sea.", "def add(a, b):"]
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def reference(llm_fp32):
    return [o.outputs[0].token_ids for o in llm_fp32.generate(PROMPTS, GREEDY, use_tqdm=False)]


def _tokens(llm, prompts=PROMPTS, params=GREEDY):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def test_prefix_caching_on_off_same_outputs_and_hits(reference):
    on = LLM("smollm2", dtype="float32", max_model_len=512, kv_cache_memory_bytes=64 << 20,
             enable_prefix_caching=True)
    assert _tokens(on) == reference
    again = _tokens(on)                         # second pass: every shared block is a hit
    assert again == reference
    stats = on.engine.scheduler.stats()
    assert stats.prefix_cache_hits >= 4 * (len(on.get_tokenizer().encode(SHARED)) // 16) * 16
    off = LLM("smollm2", dtype="float32", max_model_len=512, kv_cache_memory_bytes=64 << 20,
              enable_prefix_caching=False)
    assert _tokens(off) == reference
    assert off.engine.scheduler.stats().prefix_cache_hits == 0
    assert_all_blocks_free(on)
    assert_all_blocks_free(off)


def test_tiny_kv_cache_forces_preemption_same_outputs(reference):
    # 46,080 bytes per token in fp32: 12 blocks of 16 = 192 tokens, one max-length sequence.
    llm = LLM("smollm2", dtype="float32", max_model_len=192, kv_cache_memory_bytes=12 * 16 * 46080,
              block_size=16, enable_prefix_caching=False)
    assert llm.engine.block_manager.num_blocks == 12
    assert _tokens(llm) == reference
    assert llm.engine.scheduler.num_preemptions > 0
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("budget", [7, 16, 33])
def test_chunked_prefill_at_several_chunk_sizes(reference, budget):
    llm = LLM("smollm2", dtype="float32", max_model_len=512, kv_cache_memory_bytes=64 << 20,
              max_num_batched_tokens=budget)
    assert _tokens(llm) == reference
    assert_all_blocks_free(llm)


def test_kv_cache_too_small_fails_at_startup():
    with pytest.raises(ValueError, match="kv_cache_memory_bytes.*max_model_len=2048"):
        LLM("smollm2", dtype="float32", max_model_len=2048, kv_cache_memory_bytes=1 << 20)


def test_seed_reproducible_across_batch_compositions(llm_fp32):
    seeded = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=1234, max_tokens=16, ignore_eos=True)
    other = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    alone = _tokens(llm_fp32, ["Tell me a joke."], seeded)[0]
    mixed = llm_fp32.generate(["Hello there", "Tell me a joke.", "Why is the sky blue?"],
                              [other, seeded, other], use_tqdm=False)
    assert mixed[1].outputs[0].token_ids == alone
    different = _tokens(llm_fp32, ["Tell me a joke."], SamplingParams(temperature=0.9, top_p=0.95, top_k=50,
                                                                        seed=99, max_tokens=16, ignore_eos=True))[0]
    assert different != alone
    assert_all_blocks_free(llm_fp32)


def test_stop_strings_and_stop_token_ids(llm_fp32):
    base = llm_fp32.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=30), use_tqdm=False)[0]
    text = base.outputs[0].text
    assert "8," in text
    out = llm_fp32.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=30, stop=["8,", "zzz"]),
                            use_tqdm=False)[0].outputs[0]
    assert out.text == text[:text.index("8,")] and out.finish_reason == "stop" and out.stop_reason == "8,"
    inc = llm_fp32.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=30, stop="8,",
                                                          include_stop_str_in_output=True), use_tqdm=False)[0]
    assert inc.outputs[0].text == text[:text.index("8,") + 2]
    stop_id = base.outputs[0].token_ids[3]
    first = base.outputs[0].token_ids.index(stop_id)
    by_id = llm_fp32.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[stop_id]),
                              use_tqdm=False)[0].outputs[0]
    assert by_id.token_ids == base.outputs[0].token_ids[:first + 1]
    assert by_id.finish_reason == "stop" and by_id.stop_reason == stop_id
    assert_all_blocks_free(llm_fp32)


def test_max_tokens_min_tokens_and_eos(llm_fp32):
    eos = llm_fp32.get_tokenizer().eos_token_id
    out = llm_fp32.chat([{"role": "user", "content": "Say hi."}], SamplingParams(temperature=0, max_tokens=200),
                        use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] == eos and len(out.token_ids) < 200
    forced = llm_fp32.chat([{"role": "user", "content": "Say hi."}],
                           SamplingParams(temperature=0, max_tokens=len(out.token_ids) + 10,
                                          min_tokens=len(out.token_ids) + 5), use_tqdm=False)[0].outputs[0]
    assert len(forced.token_ids) >= len(out.token_ids) + 5
    assert eos not in forced.token_ids[:len(out.token_ids) + 5]
    short = llm_fp32.generate("Hello", SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
                              use_tqdm=False)[0].outputs[0]
    assert len(short.token_ids) == 3 and short.finish_reason == "length"


def test_n_samples_and_logprobs(llm_fp32):
    out = llm_fp32.generate("My favourite colour is", SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8,
                                                                     ignore_eos=True, logprobs=3), use_tqdm=False)[0]
    assert [o.index for o in out.outputs] == [0, 1, 2]
    assert len({tuple(o.token_ids) for o in out.outputs}) > 1
    for o in out.outputs:
        assert len(o.logprobs) == 8
        for token, lps in zip(o.token_ids, o.logprobs):
            assert token in lps and len(lps) in (3, 4)
            assert all(lp.logprob <= 0 for lp in lps.values())
            ranks = sorted(lp.rank for t, lp in lps.items() if t != token or lp.rank <= 3)
            assert ranks[:3] == [1, 2, 3]
        assert o.cumulative_logprob == pytest.approx(sum(lps[t].logprob for t, lps in zip(o.token_ids, o.logprobs)))
    assert out.metrics.first_token_time >= out.metrics.arrival_time
    assert out.metrics.finished_time >= out.metrics.first_token_time
    assert_all_blocks_free(llm_fp32)


def test_penalties_change_output(llm_fp32):
    prompt = "List the word 'cat' many times: cat cat cat"
    plain = _tokens(llm_fp32, [prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    for kw in ({"repetition_penalty": 1.8}, {"frequency_penalty": 1.5}, {"presence_penalty": 1.5}):
        pen = _tokens(llm_fp32, [prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, **kw))[0]
        assert pen != plain, kw
        assert len(set(pen)) >= len(set(plain))


@pytest.mark.parametrize("kwargs, param", [
    ({"max_tokens": 0}, "max_tokens"), ({"temperature": -0.5}, "temperature"), ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"), ({"n": 0}, "n"), ({"top_k": -3}, "top_k"), ({"logprobs": 50}, "logprobs"),
    ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"), ({"stop": [""]}, "stop"),
])
def test_bad_sampling_params_name_the_parameter(kwargs, param):
    with pytest.raises(ValueError, match=f"^{param}"):
        SamplingParams(**kwargs)


def test_bad_prompts_rejected_before_scheduling_and_engine_keeps_serving(llm_fp32):
    too_long = {"prompt_token_ids": [100] * 1024}
    for prompt, param in (("", "prompt"), ({"prompt_token_ids": []}, "prompt"), (too_long, "prompt"),
                          ({"prompt_token_ids": [10 ** 9]}, "prompt_token_ids"), (42, "prompt")):
        with pytest.raises(ValueError, match=f"^{param}"):
            llm_fp32.generate(["Hello", prompt], SamplingParams(max_tokens=2), use_tqdm=False)
        assert not llm_fp32.engine.scheduler.has_unfinished()     # nothing was scheduled
    ok = llm_fp32.generate("Hello", SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    assert len(ok[0].outputs[0].token_ids) == 2
    with pytest.raises(ValueError, match="^model"):
        LLM("no-such-model")
    with pytest.raises(ValueError, match="^dtype"):
        LLM("random:tiny", dtype="int3")
    assert_all_blocks_free(llm_fp32)
