"""Speculative decoding: config errors, the n-gram proposer, verification (greedy identity and
rejection sampling that keeps the target's distribution), block accounting, metrics."""
from __future__ import annotations

import collections
import math

import pytest
import torch

from inference.interfaces import ModelRunnerOutput
from inference.sampling_params import SamplingParams
from inference.spec_decode.config import SpeculativeConfig
from inference.spec_decode.ngram import NgramProposer
from inference.spec_decode.rejection import verify_constrained, verify_greedy, verify_sampled
from inference.worker.sampler import SamplingRow
from tests.conftest import assert_all_blocks_free
from tests.helpers.factories import check_block_manager, kv_of, make_request, make_scheduler

CODE = '''def moving_average(values, window):
    """The mean of each run of `window` consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    total = sum(values[:window])
    means = [total / window]
    for i in range(window, len(values)):
        total += values[i] - values[i - window]
        means.append(total / window)
    return means
'''


def edit_prompt() -> str:
    """A code edit: the model rewrites a function it was shown, so most of its output is copied."""
    edited = CODE.replace("values", "samples")
    return ("<|im_start|>user\nRename `values` to `samples` in this function:\n```python\n" + CODE
            + "```<|im_end|>\n<|im_start|>assistant\n```python\n" + edited[:60])


# ---- config -----------------------------------------------------------------------------------
@pytest.mark.parametrize("value, message", [
    ({"method": "medusa", "num_speculative_tokens": 2}, "method: must be one of"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens: must be an integer in [1, 16]"),
    ({"method": "ngram", "num_speculative_tokens": 17}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": True}, "num_speculative_tokens"),
    ({"method": "ngram"}, "num_speculative_tokens: required"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, "needs the draft model"),
    ({"method": "ngram", "num_speculative_tokens": 2, "model": "x"}, "only for method 'draft_model'"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5}, "is above prompt_lookup_max"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 0}, "prompt_lookup_max: must be"),
    ({"method": "ngram", "num_speculative_tokens": 2, "k": 1}, "unknown keys ['k']"),
    ('{"method": "ngram", ', "not valid JSON"),
    ([1, 2], "must be a dict"),
])
def test_bad_speculative_config_is_a_clear_error(value, message):
    with pytest.raises(ValueError, match="speculative_config") as e:
        SpeculativeConfig.parse(value)
    assert message in str(e.value)


def test_speculative_config_from_json_and_engine_args():
    import argparse

    from inference.__main__ import add_engine_args, engine_config
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--model", "random:tiny", "--speculative-config",
                              '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}'])
    args.config = args.profile = None
    config = engine_config(args)
    assert config.speculative == SpeculativeConfig("ngram", 3, prompt_lookup_max=2)


# ---- proposers and verification -----------------------------------------------------------------
def test_ngram_proposes_what_followed_the_latest_longest_match():
    lookup = NgramProposer(1, 3)
    #          0  1  2  3  4  5  6  7  8  9
    tokens = [1, 2, 3, 9, 9, 1, 2, 3, 4, 5, 7, 2, 3]
    assert lookup.propose(tokens, 2) == [4, 5]           # "2 3" last seen at 6-7 (3-gram "7 2 3" unseen)
    assert lookup.propose([5, 6, 7, 1, 5, 6], 4) == [7, 1, 5, 6]
    assert lookup.propose([5, 6, 7, 8], 3) == []         # nothing repeats
    assert NgramProposer(2, 3).propose([1, 4, 2, 1], 3) == []   # only a 1-gram matches, below min
    assert lookup.propose([3, 3], 2) == [3]              # the continuation ends at the last token


def test_verify_greedy_keeps_the_matching_prefix_then_the_targets_token():
    assert verify_greedy([4, 5, 6, 7], [4, 5, 6]) == [4, 5, 6, 7]     # all accepted + bonus
    assert verify_greedy([4, 9, 6, 7], [4, 5, 6]) == [4, 9]           # first mismatch: target's token
    assert verify_greedy([8, 5, 6, 7], [4, 5, 6]) == [8]


def _tv(counts: collections.Counter, probs: torch.Tensor) -> float:
    n = sum(counts.values())
    return 0.5 * sum(abs(counts.get(t, 0) / n - float(probs[t])) for t in range(len(probs)))


@pytest.mark.parametrize("with_draft_probs", [True, False])
def test_rejection_sampling_emits_the_targets_distribution(with_draft_probs):
    """Drafts drawn from q (or fixed, one-hot q): the first emitted token follows p0 and, after an
    accepted first draft, the second follows p1, whatever q is."""
    vocab, k, trials = 6, 2, 6000
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(k + 1, vocab, generator=gen) * 1.5
    p = torch.softmax(logits, dim=-1)
    q = torch.softmax(torch.randn(k, vocab, generator=gen) * 1.5, dim=-1)
    row = SamplingRow(SamplingParams(temperature=1.0), [], [], None, [])
    first, second = collections.Counter(), collections.Counter()
    accepted_any = 0
    for _ in range(trials):
        draft = (torch.multinomial(q, 1, generator=gen).flatten().tolist() if with_draft_probs else [2, 4])
        out = verify_sampled(logits, draft, row, q if with_draft_probs else None, gen)
        first[out[0]] += 1
        if out[0] == draft[0] and len(out) > 1:
            second[out[1]] += 1
            accepted_any += 1
    assert _tv(first, p[0]) < 0.03
    assert accepted_any > 500 and _tv(second, p[1]) < 0.05


def test_rejection_sampling_with_top_k_never_leaves_the_targets_support():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]] * 3)
    row = SamplingRow(SamplingParams(temperature=1.0, top_k=2), [], [], None, [])
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        out = verify_sampled(logits, [3, 2], row, None, gen)    # drafts outside the top 2: rejected
        assert len(out) == 1 and out[0] in (0, 1)


# ---- through the engine ---------------------------------------------------------------------------
def _spec_llm(method: str, k: int = 4, **extra):
    """k fixed (not adaptive): cost-aware k depends on measured step times, and these tests need
    drafts to be made whatever the machine's load (the rule has its own test)."""
    from inference import LLM
    spec = {"method": method, "num_speculative_tokens": k, "adaptive": False, **extra}
    if method == "draft_model":
        spec.setdefault("model", "smollm2")        # the same tokenizer; a real draft would be smaller
    return LLM("smollm2", dtype="float32", max_model_len=1024, kv_cache_memory_bytes=256 << 20,
               speculative_config=spec)


@pytest.mark.parametrize("method", ["ngram", "draft_model", "self_int4"])
def test_greedy_output_is_identical_to_plain_greedy(llm_fp32, method):
    prompts = [edit_prompt(), "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n"]
    params = SamplingParams(max_tokens=40, temperature=0)
    expected = [o.outputs[0].token_ids for o in llm_fp32.generate(prompts, params, use_tqdm=False)]
    llm = _spec_llm(method)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == expected
    stats = llm.engine.speculator.stats
    assert stats.num_drafts > 0 and 0 < stats.num_accepted_tokens <= stats.num_draft_tokens
    assert_all_blocks_free(llm)
    if method != "ngram":
        proposer = llm.engine.speculator.proposer
        assert not proposer.seqs and proposer.block_manager.num_free_blocks == proposer.block_manager.num_blocks


def test_stops_inside_accepted_drafts_are_honoured(llm_fp32):
    """max_tokens, stop strings and stop ids end the output exactly where plain decoding does,
    even when the step that reached them accepted several drafts."""
    llm = _spec_llm("ngram", k=8)
    plain = llm_fp32.generate([edit_prompt()], SamplingParams(max_tokens=60, temperature=0), use_tqdm=False)
    text, ids = plain[0].outputs[0].text, plain[0].outputs[0].token_ids
    stop_word = text[30:38]
    for params in (SamplingParams(max_tokens=13, temperature=0),
                   SamplingParams(max_tokens=60, temperature=0, stop=[stop_word]),
                   SamplingParams(max_tokens=60, temperature=0, stop_token_ids=[ids[21]])):
        want = llm_fp32.generate([edit_prompt()], params, use_tqdm=False)[0].outputs[0]
        got = llm.generate([edit_prompt()], params, use_tqdm=False)[0].outputs[0]
        assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, want.text, want.finish_reason)
    assert llm.engine.speculator.stats.num_accepted_tokens > 10
    assert_all_blocks_free(llm)


def test_sampled_outputs_follow_the_targets_distribution(llm_fp32):
    """The second and third sampled tokens (drafted by n-gram and verified by rejection sampling)
    against their exact marginals, expanded from the target's top-3 log-probabilities."""
    top_k, n, temperature = 3, 300, 1.0
    # repeats (so n-gram drafts), but no certain continuation (so drafts are often rejected)
    prompt = {"prompt_token_ids":
              llm_fp32.get_tokenizer().encode("Pick words: cat dog sun cat sun dog dog cat sun cat dog")}
    probe = SamplingParams(max_tokens=1, temperature=0, logprobs=top_k)

    def next_dist(prefixes):
        outs = llm_fp32.generate([{"prompt_token_ids": prompt["prompt_token_ids"] + list(pre)} for pre in prefixes],
                                 probe, use_tqdm=False)
        dists = []
        for out in outs:
            top = sorted(out.outputs[0].logprobs[0].items(), key=lambda kv: kv[1].rank)[:top_k]
            z = sum(math.exp(lp.logprob / temperature) for _, lp in top)
            dists.append({t: math.exp(lp.logprob / temperature) / z for t, lp in top})
        return dists

    level = {(): 1.0}
    marginals = []
    for _ in range(3):
        prefixes = list(level)
        nxt = {}
        for pre, dist in zip(prefixes, next_dist(prefixes)):
            for t, pr in dist.items():
                nxt[pre + (t,)] = level[pre] * pr
        level = nxt
        marg = collections.defaultdict(float)
        for seq, pr in level.items():
            marg[seq[-1]] += pr
        marginals.append(marg)
    llm = _spec_llm("ngram", k=3)
    outs = llm.generate([prompt], SamplingParams(n=n, max_tokens=3, temperature=temperature, top_k=top_k, seed=11),
                        use_tqdm=False)[0].outputs
    stats = llm.engine.speculator.stats
    assert 0.2 * stats.num_draft_tokens < stats.num_accepted_tokens < 0.9 * stats.num_draft_tokens, stats
    for pos in (1, 2):
        counts = collections.Counter(o.token_ids[pos] for o in outs)
        tv = 0.5 * sum(abs(counts.get(t, 0) / n - marginals[pos].get(t, 0.0))
                       for t in set(counts) | set(marginals[pos]))
        assert tv < 0.09, (pos, tv, counts, dict(marginals[pos]))
    assert_all_blocks_free(llm)


def test_draft_model_with_another_tokenizer_is_refused_before_serving():
    from inference import LLM
    with pytest.raises(ValueError, match="does not share the target's tokenizer"):
        LLM("smollm2", dtype="float32", max_model_len=256, kv_cache_memory_bytes=64 << 20,
            speculative_config={"method": "draft_model", "model": "random:tiny", "num_speculative_tokens": 2})


def test_random_draft_model_keeps_blocks_and_metrics_consistent():
    """A draft that is mostly wrong (another random model), sampled and greedy requests mixed, under
    a small KV cache: every block comes back, and the exporter shows the counters."""
    from inference import LLM
    from monitoring.engine_metrics import EngineMetrics
    llm = LLM("random:tiny", dtype="float32", kv_cache_memory_bytes=1 << 20, max_num_seqs=8, max_model_len=256,
              speculative_config={"method": "draft_model", "model": "random:tiny-gqa", "num_speculative_tokens": 3,
                                  "draft_kv_cache_memory_bytes": 4 << 20, "adaptive": False})
    prompts = [{"prompt_token_ids": [5 + i, 6, 7, 8] * (3 + i)} for i in range(12)]
    params = [SamplingParams(max_tokens=20 + i, temperature=0 if i % 2 else 0.8, seed=i, ignore_eos=True)
              for i in range(12)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [20 + i for i in range(12)]
    assert_all_blocks_free(llm)
    proposer = llm.engine.speculator.proposer
    assert proposer.block_manager.num_free_blocks == proposer.block_manager.num_blocks
    metrics = EngineMetrics("tiny")
    metrics.observe(llm.engine.idle_stats())
    text = metrics.render()[0].decode()
    stats = llm.engine.speculator.stats
    assert f'inference:spec_decode_num_draft_tokens_total{{model_name="tiny"}} {float(stats.num_draft_tokens)}' in text
    assert f'inference:spec_decode_num_accepted_tokens_total{{model_name="tiny"}} ' \
           f'{float(stats.num_accepted_tokens)}' in text
    assert 'spec_decode_num_accepted_tokens_per_pos_total{model_name="tiny",position="0"}' in text


# ---- scheduler: drafts are extra scheduled tokens -----------------------------------------------
def test_rejected_drafts_give_back_their_computed_tokens():
    """Partial acceptance across steps: computed counts roll back, the KV the next step reads is
    always the request's real tokens (the fake KV cache checks), and every block is freed."""
    s = make_scheduler(num_blocks=12, block_size=4, max_num_batched_tokens=32)
    req = make_request("a", 5, max_tokens=12)
    s.add_request(req)
    out = s.schedule()                                     # prefill 5 -> first token
    kv_of(s).run(out)
    s.update_from_output(out, ModelRunnerOutput(sampled_token_ids={"a": 100}))
    accepts = [2, 0, 3]
    for step, num_accepted in enumerate(accepts):
        proposed = [200 + step * 10 + j for j in range(3)]
        req.spec_token_ids = list(proposed)
        out = s.schedule()
        (item,) = out.scheduled
        assert item.num_scheduled_tokens == 4 and item.spec_token_ids == proposed and not req.spec_token_ids
        kv_of(s).run(out)
        before = req.num_tokens
        drafts = item.spec_token_ids
        result = ModelRunnerOutput(sampled_token_ids={"a": 300 + step},
                                   accepted_draft_ids={"a": drafts[:num_accepted]})
        (updated,) = s.update_from_output(out, result)
        assert updated == (req, [*drafts[:num_accepted], 300 + step])
        assert req.num_tokens == before + num_accepted + 1
        assert req.num_computed_tokens == req.num_tokens - 1
        check_block_manager(s.block_manager)
    # drafts are trimmed so every accepted draft plus the bonus token fits max_tokens
    req.spec_token_ids = [7, 7, 7, 7, 7]
    out = s.schedule()
    assert out.scheduled[0].spec_token_ids == [7] * (req.max_tokens - req.num_output_tokens - 1)
    kv_of(s).run(out)
    drafts = out.scheduled[0].spec_token_ids
    (updated,) = s.update_from_output(out, ModelRunnerOutput(sampled_token_ids={"a": 1},
                                                             accepted_draft_ids={"a": drafts}))
    assert req.num_output_tokens == req.max_tokens and req.status.is_finished
    assert s.block_manager.num_free_blocks == s.block_manager.num_blocks


def test_streaming_with_speculation_delivers_every_token_once_and_aborts_cleanly(llm_fp32):
    """The background-loop engine: several tokens can arrive in one step; the stream's deltas still
    concatenate to the plain output, and an abort mid-stream frees everything."""
    import time

    from inference import OnlineEngine
    engine = OnlineEngine("smollm2", dtype="float32", max_model_len=1024, kv_cache_memory_bytes=128 << 20,
                          speculative_config={"method": "ngram", "num_speculative_tokens": 6, "adaptive": False})
    try:
        params = SamplingParams(temperature=0, max_tokens=48)
        want = llm_fp32.generate([edit_prompt()], params, use_tqdm=False)[0].outputs[0]
        deltas = list(engine.add_request(edit_prompt(), params))
        assert "".join(d.text for d in deltas) == want.text
        assert [t for d in deltas for t in d.token_ids] == want.token_ids
        assert any(len(d.token_ids) > 1 for d in deltas)             # accepted drafts arrive together
        stream = engine.add_request(edit_prompt(), SamplingParams(temperature=0, max_tokens=400, ignore_eos=True))
        next(iter(stream))
        stream.abort()
        bm = engine.engine.block_manager
        deadline = time.monotonic() + 10
        while (bm.num_free_blocks != bm.num_blocks or engine.engine.states) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert bm.num_free_blocks == bm.num_blocks and not engine.engine.states
        assert not engine.engine.speculator.acceptance
    finally:
        engine.shutdown()


def test_drafts_stop_when_they_cost_more_than_they_give_and_probes_continue():
    """Cost-aware k: a request whose drafts are mostly rejected stops drafting once verification
    is measured to cost more than it yields (one probe draft every PROBE_EVERY steps); a request
    whose drafts are accepted keeps drafting."""
    from inference.interfaces import ScheduledRequest, SchedulerOutput
    from inference.spec_decode.speculator import PROBE_EVERY, Speculator

    spec = Speculator(SpeculativeConfig("ngram", 6), proposer=None)
    good, bad = make_request("good", 4, max_tokens=500), make_request("bad", 4, max_tokens=500)

    def step(drafts: bool, seconds: float):
        item = ScheduledRequest(good, 3, 1 + 2 * drafts, [0], True, [7, 7] if drafts else [])
        spec.observe_step(SchedulerOutput([item], [], 1), seconds)

    for _ in range(20):                                   # plain 10 ms, with drafts 16 ms: ratio 1.6
        step(False, 0.010)
        step(True, 0.016)
    assert spec.cost.ratio == pytest.approx(1.6, rel=0.05)
    spec.acceptance["good"] = (9.0, 10.0)                 # 90% accepted
    spec.acceptance["bad"] = (1.0, 10.0)                  # 10%: 1.1 tokens per step < 1.6
    assert spec.num_drafts_for(good) == 6
    ks = [spec.num_drafts_for(bad) for _ in range(3 * PROBE_EVERY)]
    assert ks.count(1) == 3 and ks.count(0) == 3 * PROBE_EVERY - 3
    # prefill-carrying steps say nothing about decode cost
    before = (spec.cost.plain_s, spec.cost.spec_s)
    spec.observe_step(SchedulerOutput([ScheduledRequest(good, 0, 40, [0, 1, 2], True)], [], 40), 1.0)
    assert (spec.cost.plain_s, spec.cost.spec_s) == before


# ---- structured outputs under speculation ---------------------------------------------------------
class _Allowed:
    """A grammar over a small vocabulary for the verification math: position j allows `sets[j]`
    (the real grammar backend is exercised through the engine below)."""

    class backend:
        @staticmethod
        def allocate_bitmask(rows: int) -> torch.Tensor:
            return torch.zeros(rows, 1, dtype=torch.int32)

        @staticmethod
        def fill_masks(states, bitmask: torch.Tensor) -> None:
            for j, state in enumerate(states):
                state.fill_mask(bitmask, j)

    def __init__(self, sets: list[set[int]]):
        self.sets, self.pos = sets, 0

    def fill_mask(self, bitmask: torch.Tensor, row: int) -> None:
        bitmask[row, 0] = sum(1 << t for t in self.sets[self.pos])

    def try_accept(self, token: int) -> bool:
        if token not in self.sets[self.pos]:
            return False
        self.pos += 1
        return True

    def is_terminated(self) -> bool:
        return self.pos == len(self.sets)


def test_constrained_verification_keeps_the_masked_distribution_and_rejects_forbidden_drafts():
    vocab, trials = 6, 6000
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(3, vocab, generator=gen) * 1.5
    sets = [{0, 2, 4}, {1, 2, 3}, {5}]
    masked_p = [torch.softmax(logits[j].masked_fill(torch.tensor([t not in s for t in range(vocab)]),
                                                    float("-inf")), -1) for j, s in enumerate(sets)]
    first, second = collections.Counter(), collections.Counter()
    for _ in range(trials):
        row = SamplingRow(SamplingParams(temperature=1.0), [], [], None, [], _Allowed(sets))
        out = verify_constrained(logits, [2, 3], row, None, gen)
        assert row.grammar.pos == len(out) and all(t in sets[j] for j, t in enumerate(out))
        first[out[0]] += 1
        if out[0] == 2 and len(out) > 1:
            second[out[1]] += 1
    assert _tv(first, masked_p[0]) < 0.03 and _tv(second, masked_p[1]) < 0.05
    for _ in range(200):                                       # a draft the grammar forbids: never kept
        row = SamplingRow(SamplingParams(temperature=1.0), [], [], None, [], _Allowed(sets))
        assert verify_constrained(logits, [1, 1], row, None, gen)[0] in sets[0]
    greedy = SamplingRow(SamplingParams(temperature=0), [], [], None, [], _Allowed(sets))
    want0 = int(masked_p[0].argmax())
    out = verify_constrained(logits, [want0, int(masked_p[1].argmax())], greedy, None, gen)
    assert out == [want0, int(masked_p[1].argmax()), 5] and greedy.grammar.pos == 3


@pytest.mark.slow
def test_structured_outputs_with_speculation_match_plain_constrained_decoding(llm_fp32):
    """n-gram drafts copied from the prompt are checked against the JSON grammar: greedy output is
    the plain constrained output token for token, drafts are accepted, sampled output parses."""
    import json

    from inference.sampling_params import StructuredOutputsParams
    schema = {"type": "object", "properties": {"id": {"type": "string"}, "items": {"type": "array",
              "items": {"type": "string"}, "maxItems": 4}}, "required": ["id", "items"], "additionalProperties": False}
    record = '{"id": "NW-4417302", "items": ["kettle", "blender", "toaster"]}'
    prompt = (f"<|im_start|>user\nCopy this JSON exactly: {record}<|im_end|>\n<|im_start|>assistant\n")
    spec = StructuredOutputsParams(json=schema)
    greedy = SamplingParams(max_tokens=48, temperature=0, structured_outputs=spec)
    want = llm_fp32.generate([prompt], greedy, use_tqdm=False)[0].outputs[0]
    llm = _spec_llm("ngram", k=6)
    got = llm.generate([prompt], greedy, use_tqdm=False)[0].outputs[0]
    assert got.token_ids == want.token_ids and json.loads(got.text)["id"]
    assert llm.engine.speculator.stats.num_accepted_tokens > 0
    sampled = llm.generate([prompt] * 4, SamplingParams(max_tokens=64, temperature=1.0, seed=5,
                                                        structured_outputs=spec), use_tqdm=False)
    for out in sampled:
        if out.outputs[0].finish_reason == "stop":
            assert set(json.loads(out.outputs[0].text)) == {"id", "items"}
    assert_all_blocks_free(llm)
