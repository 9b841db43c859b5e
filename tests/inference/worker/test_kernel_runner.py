"""The CUDA runner's kernel path (Triton layers, flat varlen batches, staged inputs) against the
PyTorch reference runner: same greedy tokens and logprobs.

On the CPU the kernels run under the Triton interpreter with the tiny random model (CUDA graphs
and pinned memory are CUDA-only); on a GPU the same tests run on the device, with graphs.
"""
from __future__ import annotations

import random
from unittest.mock import patch

import pytest
import torch

from inference.config import EngineConfig
from inference.kernels.kv_cache import write_kv_cache_reference
from inference.kernels.rotary_kv_cache import rotary_kv_cache_reference
from inference.llm import LLM
from inference.models.fused_decode import fused_decode_forward, fused_decode_plan
from inference.models.norm_folding import fold_norm_weights
from inference.models.triton_layers import use_triton_kernels
from inference.parallel.tp_transform import TPPlan, install_parallel_layers
from inference.sampling_params import SamplingParams
from inference.worker.cuda_runner import CudaModelRunner
from inference.worker.kv_sizing import num_kv_blocks
from tests.conftest import assert_all_blocks_free

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
KW = dict(dtype="float32", max_model_len=256, block_size=4, kv_cache_memory_bytes=1 << 20)


def kernel_llm(mixed_layout: bool | None = None, **kw) -> LLM:
    """An LLM whose runner is the CUDA runner on DEVICE (the CPU: interpreter, eager; with
    mixed_layout, prefill-carrying steps run in the mixed graphs' padded layout, uncaptured)."""
    config = EngineConfig.load(**{"model": "random:tiny", "device": DEVICE, **KW, **kw})

    def build(loaded, cfg):
        if DEVICE == "cpu":
            use_triton_kernels(loaded.model)      # the loader does this itself on CUDA
            blocks = num_kv_blocks(loaded, cfg.cache, cfg.cache.kv_cache_memory_bytes, "kv_cache_memory_bytes")
            return CudaModelRunner(loaded, cfg.cache, cfg.scheduler, blocks, cfg.model.seed, enforce_eager=True,
                                   mixed_layout=mixed_layout)
        from inference.worker.runner_factory import build_runner
        return build_runner(loaded, cfg)

    with patch("inference.core.engine.build_runner", build):
        return LLM.from_config(config)


def reference_llm(ours: LLM, **kw) -> LLM:
    """The PyTorch reference runner on the CPU, with `ours`'s weights (random weights drawn on a
    GPU differ from the CPU's for the same seed)."""
    ref = LLM(ours.config.model.model, device="cpu", **{**KW, **kw})
    with torch.no_grad():
        for mine, theirs in zip(ref.engine.runner.model.parameters(), ours.engine.runner.model.parameters(),
                                strict=True):
            mine.copy_(theirs.cpu())
    return ref


def assert_same_tokens_and_logprobs(got, want) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        for lg, lw in zip(g.outputs[0].logprobs, w.outputs[0].logprobs):
            tok = next(iter(lw))
            assert lg[tok].logprob == pytest.approx(lw[tok].logprob, abs=1e-3)


def prompts(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, 500) for _ in range(13)]                 # a shared prefix: cache hits
    out = []
    for i in range(n):
        own = [rng.randrange(3, 500) for _ in range(rng.randint(1, 40))]
        out.append({"prompt_token_ids": (shared + own) if i % 2 else own})
    return out


# head_dim 16 GQA 2; 128 GQA 4; mixture of experts (fused grouped GEMMs): Mixtral-, Qwen2-MoE-style
@pytest.mark.parametrize("model", ["random:tiny", "random:tiny-gqa", "random:tiny-moe", "random:tiny-qwen2-moe"])
def test_greedy_tokens_and_logprobs_match_reference(model):
    ps = prompts(6, seed=1)
    params = [SamplingParams(max_tokens=random.Random(i).randint(1, 9), temperature=0, ignore_eos=True, logprobs=2)
              for i in range(len(ps))]
    # a small token budget: prompts are split into chunks, decodes and chunks share steps
    kv = dict(kv_cache_memory_bytes=8 << 20) if model.endswith("gqa") else {}
    ours = kernel_llm(model=model, max_num_batched_tokens=24, **kv)
    ref = reference_llm(ours, max_num_batched_tokens=24, **kv)
    assert isinstance(ours.engine.runner, CudaModelRunner)
    assert type(ours.engine.runner.model.norm).__name__ == "TritonRMSNorm"
    got = ours.generate(ps, params, use_tqdm=False)
    assert_same_tokens_and_logprobs(got, ref.generate(ps, params, use_tqdm=False))
    assert_all_blocks_free(ours)


@pytest.mark.parametrize("model", ["random:tiny", "random:tiny-gqa"])
def test_batch_one_decode_takes_the_fused_layers_with_folded_norms(model):
    # one sequence: every decode step is one token, the fused path (six kernels a layer); the
    # norms get random weights first (in both models), then ours folds them into its linears;
    # eager, so that each step calls forward (a graph replay would not)
    ours = kernel_llm(model=model, enforce_eager=True)
    ref = reference_llm(ours)
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for (name, mine), (_, theirs) in zip(ours.engine.runner.model.named_parameters(),
                                             ref.engine.runner.model.named_parameters(), strict=True):
            if name.endswith("layernorm.weight"):
                mine.copy_(torch.rand(mine.shape, generator=gen) + 0.5)
                theirs.copy_(mine)
    model_ = ours.engine.runner.model
    assert fold_norm_weights(model_) == len(model_.layers)
    assert fused_decode_plan(model_)
    ps = prompts(2, seed=9)[1:]
    params = SamplingParams(max_tokens=7, temperature=0, ignore_eos=True, logprobs=2)
    with patch("inference.models.triton_layers.fused_decode_forward", wraps=fused_decode_forward) as fused:
        got = ours.generate(ps, params, use_tqdm=False)
    assert fused.call_count == 6                                       # the 6 steps after the prompt's
    assert_same_tokens_and_logprobs(got, ref.generate(ps, params, use_tqdm=False))
    assert_all_blocks_free(ours)


def test_fold_norm_weights_keeps_the_model_function():
    # the PyTorch model (no kernels): random norm weights, greedy tokens and logprobs before and
    # after folding them into qkv / gate_up
    ps = prompts(3, seed=4)
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, logprobs=2)
    llm = LLM("random:tiny-gqa", device="cpu", **KW)
    model = llm.engine.runner.model
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight"):
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
    want = llm.generate(ps, params, use_tqdm=False)
    qkv = model.layers[0].self_attn.qkv_proj.weight.clone()
    assert fold_norm_weights(model) == len(model.layers)
    assert all(bool((layer.input_layernorm.weight == 1).all()) for layer in model.layers)
    assert not torch.equal(qkv, model.layers[0].self_attn.qkv_proj.weight)
    assert_same_tokens_and_logprobs(llm.generate(ps, params, use_tqdm=False), want)


def test_fused_decode_plan_declines_what_it_cannot_fuse():
    moe = kernel_llm(model="random:tiny-moe").engine.runner.model
    assert not moe.fused_decode                                        # routers read the norm
    dense = kernel_llm(model="random:tiny").engine.runner.model
    assert dense.fused_decode
    with torch.no_grad():
        dense.layers[1].post_attention_layernorm.weight[3] = 2.0        # an unfolded norm weight
    assert not fused_decode_plan(dense)
    # tensor parallelism: the all-reduces after o_proj / down_proj are not in the fused layers
    tp = kernel_llm(model="random:tiny").engine.runner.model
    assert tp.fused_decode
    install_parallel_layers(tp, TPPlan(tp.arch, 0, 1), comm=None)
    assert not tp.fused_decode and not fused_decode_plan(tp)


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_quantized_experts_on_the_kernel_path_match_reference(quantization):
    # int8 / int4 experts read as codes by the fused MoE kernels (and QuantLinear attention)
    ps = prompts(4, seed=3)
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=2)
    ours = kernel_llm(model="random:tiny-moe", quantization=quantization, max_num_batched_tokens=24)
    ref = reference_llm(ours, max_num_batched_tokens=24, quantization=quantization)
    with torch.no_grad():                       # the same codes as ours (drawn on ours's device)
        for (name, mine), (_, theirs) in zip(ref.engine.runner.model.named_buffers(),
                                             ours.engine.runner.model.named_buffers(), strict=True):
            if name.endswith(("qweight", "scales", "zeros")):
                mine.copy_(theirs.cpu())
    experts = ours.engine.runner.model.layers[0].mlp
    assert type(experts.w13).__name__ == "QuantExperts" and experts.experts.__name__ == "fused_experts"
    got = ours.generate(ps, [params] * len(ps), use_tqdm=False)
    assert_same_tokens_and_logprobs(got, ref.generate(ps, [params] * len(ps), use_tqdm=False))
    assert_all_blocks_free(ours)


def test_fp8_kv_cache_matches_reference():
    # float8 e4m3 KV: the Triton write saturates and casts as the reference does, the attention
    # kernels upcast the cached bytes; prefill and decode both read the quantized cache. The CPU
    # interpreter's fp32 -> fp8 cast misrounds next to powers of two (a GPU rounds as PyTorch; the
    # write kernel has its own test on e4m3-exact values), so there the cache write is PyTorch's.
    if not CUDA:
        with (patch("inference.models.triton_layers.write_kv_cache", write_kv_cache_reference),
              patch("inference.models.triton_layers.rotary_kv_cache", rotary_kv_cache_reference),
              patch("inference.models.triton_layers.takes_fused_decode", lambda *a: False)):
            return _fp8_kv_cache_matches_reference()
    _fp8_kv_cache_matches_reference()


def _fp8_kv_cache_matches_reference():
    ps = prompts(5, seed=7)
    params = [SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=2) for _ in ps]
    kw = dict(kv_cache_memory_bytes=8 << 20, max_num_batched_tokens=24, kv_cache_dtype="fp8_e4m3")
    ours = kernel_llm(model="random:tiny-gqa", **kw)
    assert ours.engine.runner.kv_caches[0][0].dtype == torch.float8_e4m3fn
    ref = reference_llm(ours, **kw)
    got = ours.generate(ps, params, use_tqdm=False)
    assert_same_tokens_and_logprobs(got, ref.generate(ps, params, use_tqdm=False))
    exact = reference_llm(ours, **{**kw, "kv_cache_dtype": "auto"}).generate(ps, params, use_tqdm=False)
    assert any(g.outputs[0].logprobs[0] != e.outputs[0].logprobs[0] for g, e in zip(got, exact))   # it did quantize
    assert_all_blocks_free(ours)


@pytest.mark.parametrize("model", ["random:tiny", "random:tiny-gqa"])
def test_mixed_layout_matches_reference(model):
    # Prefill-carrying steps in the mixed graphs' layout: decodes padded to their bucket, chunks
    # after them, padding rows that write no KV and sit in no chunk. On a GPU these steps replay
    # captured graphs (kernel_llm's default there); on the CPU the same layout runs eagerly.
    ps = prompts(9, seed=4)
    params = [SamplingParams(max_tokens=random.Random(i).randint(2, 8), temperature=0, ignore_eos=True, logprobs=1)
              for i in range(len(ps))]
    kv = dict(kv_cache_memory_bytes=8 << 20) if model.endswith("gqa") else {}
    ours = kernel_llm(mixed_layout=True, model=model, max_num_batched_tokens=40, **kv)
    ref = reference_llm(ours, max_num_batched_tokens=40, **kv)
    runner = ours.engine.runner
    assert runner.mixed_shapes, "no mixed shapes"
    if DEVICE == "cuda":
        assert all(shape in runner.graphs for shape in runner.mixed_shapes), "mixed graphs not captured"
    steps = []
    launch = runner._launch

    def spy(sched, prev):
        steps.append(sorted(it.num_scheduled_tokens for it in sched.scheduled))
        return launch(sched, prev)
    with patch.object(runner, "_launch", spy):
        got = ours.generate(ps, params, use_tqdm=False)
    mixed = [s for s in steps if s[0] == 1 and s[-1] > 1]
    assert len(mixed) >= 2 and any(sum(t > 1 for t in s) >= 2 for s in steps), steps   # decodes + chunks
    assert_same_tokens_and_logprobs(got, ref.generate(ps, params, use_tqdm=False))
    assert_all_blocks_free(ours)


@pytest.mark.parametrize("mixed_layout", [False, True])
def test_ngram_speculation_on_the_kernel_path_keeps_greedy_outputs(mixed_layout):
    # Verification rows go through the prefill kernels (a chunk of 1 + k tokens per request),
    # beside plain decodes and prefill chunks; greedy output must not change. k stays fixed: under the
    # interpreter a verification step is so much slower than a decode that cost-aware k would stop drafting.
    rng = random.Random(5)
    loops = [[rng.randrange(3, 500) for _ in range(rng.randint(3, 6))] for _ in range(3)]
    ps = [{"prompt_token_ids": loop * 4} for loop in loops] + prompts(2, seed=6)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    ours = kernel_llm(mixed_layout=mixed_layout, max_num_batched_tokens=64,
                      speculative_config={"method": "ngram", "num_speculative_tokens": 4, "adaptive": False})
    ref = reference_llm(ours, max_num_batched_tokens=64)
    got = ours.generate(ps, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids
                                                     for o in ref.generate(ps, params, use_tqdm=False)]
    stats = ours.engine.speculator.stats
    assert stats.num_draft_tokens > 10 and stats.num_accepted_tokens > 0, stats
    assert_all_blocks_free(ours)


def test_preemption_under_cache_pressure_keeps_outputs():
    # 20 blocks of 4 tokens for 5 requests that want up to ~30 tokens each: preemption by recompute
    ps = prompts(5, seed=2)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    small = kernel_llm(kv_cache_memory_bytes=20 * 4 * 2 * 2 * 16 * 2 * 4, max_model_len=80)
    ref = reference_llm(small, max_model_len=80)
    got = [o.outputs[0].token_ids for o in small.generate(ps, params, use_tqdm=False)]
    want = [o.outputs[0].token_ids for o in ref.generate(ps, params, use_tqdm=False)]
    assert got == want
    assert small.engine.scheduler.num_preemptions > 0, "the cache was meant to be too small"
    assert_all_blocks_free(small)


gpu_only = pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device")


@gpu_only
@pytest.mark.gpu
def test_cuda_graphs_match_eager_and_cover_decode_batches():
    ps = prompts(37, seed=3)                        # 37 decodes: padded to the 48-row graph
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    graphs = kernel_llm(dtype="bfloat16")
    assert graphs.engine.runner.graphs, "no CUDA graphs were captured"
    eager = kernel_llm(dtype="bfloat16", enforce_eager=True)
    got = [o.outputs[0].token_ids for o in graphs.generate(ps, params, use_tqdm=False)]
    want = [o.outputs[0].token_ids for o in eager.generate(ps, params, use_tqdm=False)]
    assert got == want
    assert_all_blocks_free(graphs)


@gpu_only
@pytest.mark.gpu
def test_cuda_startup_errors_are_clear():
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        LLM("random:llama-2-7b", device="cuda", kv_cache_memory_bytes=None, gpu_memory_utilization=0.05)
    with pytest.raises(ValueError, match="kv_cache_memory_bytes.*max_model_len=256"):
        kernel_llm(kv_cache_memory_bytes=4096)


@gpu_only
@pytest.mark.gpu
def test_cuda_prompt_longer_than_context_is_rejected_and_engine_keeps_serving():
    llm = kernel_llm(dtype="bfloat16")
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate({"prompt_token_ids": [5] * 300}, SamplingParams(max_tokens=2), use_tqdm=False)
    out = llm.generate({"prompt_token_ids": [5] * 30}, SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 2
    assert_all_blocks_free(llm)


def test_startup_warm_up_step_writes_no_kv():
    # The CUDA runner runs the largest possible step on the live cache at startup (to reserve its
    # memory before traffic arrives); it must leave every cached K/V untouched.
    from inference.loader.model_loader import load_model
    from inference.worker.kv_sizing import run_largest_step
    config = EngineConfig.load(**{"model": "random:tiny", "device": DEVICE, **KW, "max_num_batched_tokens": 24})
    loaded = load_model(config.model)
    if DEVICE == "cpu":
        use_triton_kernels(loaded.model)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    shape = (8, 4, loaded.arch.num_key_value_heads, loaded.arch.head_dim)
    kv = [(torch.randn(shape, generator=gen, device=DEVICE), torch.randn(shape, generator=gen, device=DEVICE))
          for _ in range(loaded.arch.num_hidden_layers)]
    before = [(k.clone(), v.clone()) for k, v in kv]
    run_largest_step(loaded, config.scheduler, kv, write_kv=False)
    for (k, v), (k0, v0) in zip(kv, before):
        assert torch.equal(k, k0) and torch.equal(v, v0)
