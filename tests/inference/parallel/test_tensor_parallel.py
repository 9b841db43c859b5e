"""Tensor parallelism on the CPU (gloo): the transform alone (ranks as threads, tests/helpers/tp_threads.py),
engines of N spawned ranks against TP=1, clear errors for bad sizes, and a killed worker.

Spawned ranks cost ~1-2 s each to start, so engines are module-scoped and shared."""
from __future__ import annotations

import argparse
import copy
import gc
import os
import signal
import threading
import time

import psutil
import pytest
import torch

from inference import LLM, SamplingParams
from inference.config import EngineConfig, ModelConfig
from inference.loader.model_loader import load_model
from inference.loader.weights import build_model, init_random_weights
from inference.models.arch import ModelArch
from inference.models.attention import AttentionMetadata, PrefillChunk
from inference.parallel.loader import load_rank_model
from inference.parallel.tp_transform import (
    TPPlan,
    check_tp_supported,
    install_parallel_layers,
    shard_model,
)
from tests.helpers.tp_threads import run_ranks

TINY_KV = dict(dtype="float32", max_model_len=256, kv_cache_memory_bytes=8 << 20)


# ---- the transform alone -----------------------------------------------------------------------
def _prefill_logits(model, arch: ModelArch, ids: list[int]) -> torch.Tensor:
    """One prefill of `ids` over a fresh paged cache; logits of every position."""
    n = len(ids)
    kv = [(torch.zeros(4, 16, arch.num_key_value_heads, arch.head_dim),
           torch.zeros(4, 16, arch.num_key_value_heads, arch.head_dim)) for _ in range(arch.num_hidden_layers)]
    meta = AttentionMetadata(slot_mapping=torch.arange(n))
    meta.prefills.append(PrefillChunk(0, n, n, torch.tensor([0, 1, 2, 3][:-(-n // 16)]), None))
    with torch.inference_mode():
        return model.compute_logits(model(torch.tensor(ids), torch.arange(n), kv, meta))


def _arch(**kw) -> ModelArch:
    base = dict(model_type="llama", vocab_size=500, hidden_size=96, intermediate_size=192, num_hidden_layers=2,
                num_attention_heads=6, num_key_value_heads=2, head_dim=16, max_position_embeddings=128)
    return ModelArch(**{**base, **kw})


@pytest.mark.parametrize("arch,world", [
    (_arch(attention_bias=True), 2),                                   # o_proj bias: added once
    (_arch(attention_bias=True), 6),                                   # 2 KV heads over 6 ranks: replicated
    # qkv bias, tied, vocab padded
    (_arch(model_type="qwen2", attention_bias=True, tie_word_embeddings=True, num_key_value_heads=3), 3),
])
def test_transform_matches_unsharded_logits(arch, world):
    full = build_model(arch, 128, torch.float32, torch.device("cpu"))
    init_random_weights(full, 3)
    ids = [5, 17, 3, 499, 250, 42, 7, 0, 11]
    ref = _prefill_logits(full, arch, ids)

    def rank(r, comm):
        plan = TPPlan(arch, r, world)
        shard = copy.deepcopy(full)
        shard_model(shard, plan)
        install_parallel_layers(shard, plan, comm)
        return _prefill_logits(shard, plan.local_arch(), ids)

    for logits in run_ranks(world, rank):
        assert logits.shape == ref.shape
        torch.testing.assert_close(logits, ref, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("model,world", [("random:tiny", 4), ("random:tiny-gqa", 2)])
def test_random_shards_are_slices_of_the_unsharded_weights(model, world):
    """The random loader builds on meta and fills only its slice, yet equals TP=1's weights."""
    cfg = ModelConfig(model=model, dtype="float32", max_model_len=128)
    full = load_model(cfg)
    ids = [1, 9, 200, 31, 4]
    ref = _prefill_logits(full.model, full.arch, ids)
    outs = run_ranks(world, lambda r, comm: _prefill_logits(
        (m := load_rank_model(cfg, TPPlan(full.arch, r, world), comm)).model, m.arch, ids))
    for logits in outs:
        torch.testing.assert_close(logits, ref, atol=2e-5, rtol=1e-5)


# ---- bad sizes: clear errors before anything loads or spawns -----------------------------------
@pytest.mark.parametrize("value", [0, -2, True, "2", 1.5])
def test_tensor_parallel_size_must_be_a_positive_integer(value):
    with pytest.raises(ValueError, match="tensor_parallel_size: must be an integer >= 1"):
        EngineConfig.load(model="random:tiny", tensor_parallel_size=value)


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(p.cmdline())}


@pytest.mark.parametrize("args,match", [
    (dict(model="random:tiny", tensor_parallel_size=3), "3 does not divide the 4 attention heads"),
    (dict(model="smollm2", tensor_parallel_size=2), "2 does not divide the 9 attention heads"),
    (dict(model="random:tiny", tensor_parallel_size=2, swap_space=0.01), "swap_space"),
    (dict(model="random:tiny", tensor_parallel_size=2, speculative_config={"method": "ngram",
                                                                          "num_speculative_tokens": 2}),
     "speculative decoding"),
    (dict(model="random:tiny-moe", tensor_parallel_size=2), "mixture-of-experts"),
])
def test_unsupported_tensor_parallel_setups_fail_before_spawning(args, match):
    before = _children()
    with pytest.raises(ValueError, match=match):
        LLM(**{**TINY_KV, **args})
    assert _children() <= before


def test_kv_head_counts_that_do_not_split():
    with pytest.raises(ValueError, match="KV heads"):
        check_tp_supported(_arch(num_attention_heads=12, num_key_value_heads=4, intermediate_size=192), 6)


def test_serve_flag():
    from inference.__main__ import add_engine_args, engine_config
    p = argparse.ArgumentParser()
    add_engine_args(p)
    p.add_argument("--host")
    config = engine_config(p.parse_args(["--model", "random:tiny", "--tensor-parallel-size", "2"]))
    assert config.parallel.tensor_parallel_size == 2
    assert EngineConfig.load(model="random:tiny").parallel.tensor_parallel_size == 1


# ---- engines of spawned ranks ------------------------------------------------------------------
GREEDY = SamplingParams(temperature=0, max_tokens=16)


def _tokens(llm: LLM, prompts, params=GREEDY) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


def _assert_stopped(pids: list[int]) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                                              for p in pids):
        time.sleep(0.05)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert not alive, f"tensor-parallel workers still running: {alive}"


@pytest.fixture(scope="module")
def smollm2_tp3():
    llm = LLM("smollm2", dtype="float32", max_model_len=1024, kv_cache_memory_bytes=256 << 20,
              tensor_parallel_size=3)
    yield llm
    pids = llm.engine.runner.worker_pids
    llm.shutdown()
    _assert_stopped(pids)


def test_smollm2_tp3_greedy_matches_tp1(smollm2_tp3, llm_fp32):
    prompts = ["The capital of France is", "def fibonacci(n):", "Write a haiku about the sea."]
    assert _tokens(smollm2_tp3, prompts) == _tokens(llm_fp32, prompts)
    runner, ref = smollm2_tp3.engine.runner, llm_fp32.engine.runner
    assert runner.kv_caches[0][0].shape[2] == 1              # 3 KV heads over 3 ranks: one each
    assert runner.num_blocks == 3 * ref.num_blocks           # same bytes per rank: 3x the tokens
    assert len(runner.worker_pids) == 2


@pytest.fixture(scope="module")
def tiny_gqa_tp1():
    return LLM("random:tiny-gqa", max_num_batched_tokens=64, **TINY_KV)


@pytest.fixture(scope="module")
def tiny_gqa_tp2():
    llm = LLM("random:tiny-gqa", max_num_batched_tokens=64, tensor_parallel_size=2, **TINY_KV)
    yield llm
    llm.shutdown()


def test_kv_heads_fewer_than_ranks_match_tp1(tiny_gqa_tp2, tiny_gqa_tp1):
    """1 KV head, 2 ranks: replicated. Chunked prefill (budget 64), a prefix-cache hit, seeded sampling."""
    shared = list(range(3, 83))                             # 80 tokens: chunked, then cached
    prompts = [{"prompt_token_ids": shared + [7, 9]}, {"prompt_token_ids": [1, 5, 9, 33]},
               {"prompt_token_ids": shared + [11]}]
    assert _tokens(tiny_gqa_tp2, prompts) == _tokens(tiny_gqa_tp1, prompts)
    seeded = SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=12)
    assert _tokens(tiny_gqa_tp2, prompts, seeded) == _tokens(tiny_gqa_tp1, prompts, seeded)
    assert tiny_gqa_tp2.engine.runner.kv_caches[0][0].shape[2] == 1
    bm = tiny_gqa_tp2.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_int4_weights_quantized_per_rank_match_tp1():
    """Shard, then quantize each shard: int4 groups of 128 fall on shard boundaries here, so the
    codes equal TP=1's and so do the greedy tokens. Also: the LLM going away stops its workers."""
    prompts = [{"prompt_token_ids": [1, 5, 9, 33, 80, 2]}, {"prompt_token_ids": list(range(40, 90))}]
    ref = LLM("random:tiny-gqa", quantization="int4", **TINY_KV)
    llm = LLM("random:tiny-gqa", quantization="int4", tensor_parallel_size=2, **TINY_KV)
    assert _tokens(llm, prompts) == _tokens(ref, prompts)
    pids = llm.engine.runner.worker_pids
    del llm
    gc.collect()
    _assert_stopped(pids)


def test_killed_worker_fails_the_engine_fast_and_leaves_no_process(tiny_gqa_tp2):
    llm = tiny_gqa_tp2
    pids = llm.engine.runner.worker_pids
    threading.Timer(0.5, lambda: os.kill(pids[0], signal.SIGKILL)).start()
    long = SamplingParams(temperature=0, max_tokens=2000, ignore_eos=True)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"tensor-parallel worker 1 exited with code -9"):
        for _ in range(50):          # until the kill lands (one generate may finish before it)
            llm.generate([{"prompt_token_ids": [1, 2, 3]}] * 4, long, use_tqdm=False)
    assert time.monotonic() - start < 30
    with pytest.raises(RuntimeError, match="unusable"):
        llm.generate([{"prompt_token_ids": [1, 2, 3]}], GREEDY, use_tqdm=False)
    assert not llm.engine.states                             # the failed requests were aborted
    _assert_stopped(pids)
