"""Paged decode and varlen prefill attention kernels vs their fp32 PyTorch references.

On the CPU they run under the Triton interpreter (TRITON_INTERPRET=1, set in tests/conftest.py)
at small shapes; on a GPU the `gpu` cases run real shapes (head dim 64/128, GQA 1/4/8, block size
16/32, contexts up to 32k). Every case draws fresh random inputs, scatters the sequences over a
shuffled block pool, and poisons the output with NaN before the kernel runs.
"""
from __future__ import annotations

import math

import pytest
import torch

from inference.kernels.decode_attention import (
    SPLIT_CHOICES,
    choose_num_splits,
    decode_attention,
    decode_attention_reference,
)
from inference.kernels.prefill_attention import prefill_attention, prefill_attention_reference

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
gpu_only = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
# bf16 operands with fp32 accumulation land between 1e-3 and 1e-2 relative error (bench/journal/METHOD.md)
TOL = {torch.float32: 2e-3 if CUDA else 1e-5, torch.bfloat16: 1.5e-2, torch.float16: 5e-3}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not out.isnan().any(), "output has NaN (an unwritten element or a bad softmax)"
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def make_cache(total_tokens_per_seq: list[int], block_size: int, hkv: int, d: int, dtype, gen, cache_dtype=None):
    """Random K/V cache with each sequence's blocks drawn from a shuffled pool (+ spare blocks);
    in cache_dtype (e.g. float8 e4m3) when given, else in dtype."""
    need = [math.ceil(n / block_size) for n in total_tokens_per_seq]
    num_blocks = sum(need) + 3
    k = torch.randn(num_blocks, block_size, hkv, d, generator=gen, device=DEVICE).to(cache_dtype or dtype)
    v = torch.randn(num_blocks, block_size, hkv, d, generator=gen, device=DEVICE).to(cache_dtype or dtype)
    perm = torch.randperm(num_blocks, generator=gen, device=DEVICE).to(torch.int32)
    width = max(need)
    tables = torch.zeros(len(need), width + 2, dtype=torch.int32, device=DEVICE)  # spare columns
    used = 0
    for i, nb in enumerate(need):
        tables[i, :nb] = perm[used:used + nb]
        used += nb
    return k, v, tables


def strided_q(num_tokens: int, num_heads: int, hkv: int, d: int, dtype, gen) -> torch.Tensor:
    """q as the engine sees it: a view into a fused [T, (H + 2 Hkv) * D] qkv output."""
    qkv = torch.randn(num_tokens, (num_heads + 2 * hkv) * d, generator=gen, device=DEVICE).to(dtype)
    return qkv[:, :num_heads * d].view(num_tokens, num_heads, d)


def run_decode(ctx_lens, num_heads, hkv, d, block_size, dtype, num_splits, seed, block_n=64, cache_dtype=None,
               words=None, q_scale=1.0):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    k, v, tables = make_cache(ctx_lens, block_size, hkv, d, dtype, gen, cache_dtype)
    q = strided_q(len(ctx_lens), num_heads, hkv, d, dtype, gen)
    q.mul_(q_scale)
    lens = torch.tensor(ctx_lens, dtype=torch.int32, device=DEVICE)
    out = torch.full((len(ctx_lens), num_heads, d), float("nan"), dtype=dtype, device=DEVICE)
    scale = d ** -0.5
    decode_attention(q, k, v, tables, lens, scale, num_splits=num_splits, out=out, block_n=block_n, words=words)
    ref = decode_attention_reference(q, k, v, tables, lens, scale)
    return rel_err(out, ref)


def new_kv_rows(k, v, tables, chunks, num_heads, hkv, d, dtype):
    """The chunks' own K/V as the engine hands them over: strided views of one fused qkv buffer
    (in dtype), row for row with q, holding what the cache holds at the chunk's positions."""
    block_size = k.shape[1]
    rows = []
    for i, (p, n) in enumerate(chunks):
        pos = torch.arange(p, p + n, device=k.device)
        rows.append(tables[i, pos // block_size].long() * block_size + pos % block_size)
    slots = torch.cat(rows)
    qkv = torch.full((slots.numel(), (num_heads + 2 * hkv) * d), float("nan"), dtype=dtype, device=k.device)
    k_new = qkv[:, num_heads * d:(num_heads + hkv) * d].view(-1, hkv, d)
    v_new = qkv[:, (num_heads + hkv) * d:].view(-1, hkv, d)
    k_new.copy_(k.float().view(-1, hkv, d)[slots])
    v_new.copy_(v.float().view(-1, hkv, d)[slots])
    return k_new, v_new


def run_prefill(chunks, num_heads, hkv, d, block_size, dtype, seed, new_kv=True, cache_dtype=None, key_growth=0.0,
                **kernel):
    """chunks: [(cached_prefix_len, query_len)]; new_kv: the chunks' K/V also passed as k_new/v_new
    (the engine's path), else read from the cache only; kernel: prefill_attention's tile and
    variant arguments (block_m, block_n, num_stages, heads_first, tma, ...), its defaults where left out.
    key_growth: the keys of a sequence's i-th block scaled by 1 + key_growth * i, so the scores,
    and each row's running max, grow along the sequence (the online softmax keeps rescaling)."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    ctx = [p + n for p, n in chunks]
    k, v, tables = make_cache(ctx, block_size, hkv, d, dtype, gen, cache_dtype)
    if key_growth:
        pos_of_block = torch.zeros(k.shape[0], device=DEVICE)
        for i, n in enumerate(ctx):
            used = tables[i, :math.ceil(n / block_size)].long()
            pos_of_block[used] = torch.arange(used.numel(), device=DEVICE, dtype=torch.float32)
        k.mul_((1 + key_growth * pos_of_block).view(-1, 1, 1, 1).to(k.dtype))
    starts = [0]
    for _, n in chunks:
        starts.append(starts[-1] + n)
    q = strided_q(starts[-1], num_heads, hkv, d, dtype, gen)
    out = torch.full((starts[-1], num_heads, d), float("nan"), dtype=dtype, device=DEVICE)
    qs = torch.tensor(starts, dtype=torch.int32, device=DEVICE)
    lens = torch.tensor(ctx, dtype=torch.int32, device=DEVICE)
    scale = d ** -0.5
    k_new, v_new = new_kv_rows(k, v, tables, chunks, num_heads, hkv, d, dtype) if new_kv else (None, None)
    prefill_attention(q, k, v, tables, qs, lens, max(n for _, n in chunks), scale, out=out,
                      k_new=k_new, v_new=v_new, **kernel)
    ref = prefill_attention_reference(q, k, v, tables, qs, lens, scale)
    return rel_err(out, ref)


# ---- small shapes: CPU interpreter in CI (and the GPU too) ------------------------------------

@pytest.mark.parametrize("num_heads,hkv", [(4, 4), (8, 2), (8, 1)])          # GQA 1 / 4 / 8
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_small(num_heads, hkv, num_splits, dtype):
    ctx = [1, 17, 40, 5]                                    # odd lengths, a 1-token context
    err = run_decode(ctx, num_heads, hkv, 32, 16, dtype, num_splits, seed=num_heads * 7 + hkv + num_splits,
                     block_n=16)
    assert err < TOL[dtype], err


def test_decode_more_splits_than_tiles():
    # 7 splits over 20 tokens with 16-token tiles: most splits are empty and must weigh nothing
    assert run_decode([20, 3], 4, 2, 16, 8, torch.float32, 7, seed=3, block_n=16) < TOL[torch.float32]


@pytest.mark.parametrize("chunks", [
    [(0, 19)],                            # plain causal prefill, odd length
    [(13, 6), (0, 33), (32, 1)],          # prefix-cache hits / later chunks of chunked prefill
])
@pytest.mark.parametrize("hkv", [4, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["tma", "pointers", "cache_only"])
def test_prefill_small(chunks, hkv, dtype, mode):
    err = run_prefill(chunks, 4, hkv, 32, 8, dtype, seed=len(chunks) * 11 + hkv, block_m=16, block_n=16,
                      new_kv=mode != "cache_only", tma=mode == "tma")
    assert err < TOL[dtype], err


@pytest.mark.parametrize("block_m,block_n", [(32, 16), (32, 32), (16, 32)])
@pytest.mark.parametrize("tma", [True, False])
def test_prefill_tiles_and_partial_prefix(block_m, block_n, tma):
    # prefix lengths off the key tile (partial masked prefix tile), several query tiles per chunk,
    # a chunk shorter than one tile after a long prefix
    chunks = [(21, 70), (0, 45), (37, 3), (16, 33)]
    err = run_prefill(chunks, 4, 2, 16, 8, torch.float32, seed=block_m + block_n, block_m=block_m, block_n=block_n,
                      tma=tma)
    assert err < TOL[torch.float32], err


@pytest.mark.parametrize("mode", ["tma", "pointers", "cache_only"])
@pytest.mark.parametrize("heads_first", [True, False])
def test_prefill_growing_scores(mode, heads_first):
    # scores growing along the sequence (by ~100 in log2 units): a row's running max jumps from
    # key tile to key tile, so a missed or wrong rescale of acc and l shows (or overflows)
    chunks = [(21, 70), (0, 45), (37, 3)]
    err = run_prefill(chunks, 4, 2, 16, 8, torch.float32, seed=7, block_m=32, block_n=16, key_growth=4.0,
                      new_kv=mode != "cache_only", tma=mode == "tma", heads_first=heads_first)
    assert err < TOL[torch.float32], err


def test_prefill_tma_needs_packed_rows():
    q = torch.randn(2, 4, 32)
    k = torch.randn(6, 8, 2, 32)
    tables = torch.zeros(2, 3, dtype=torch.int32)
    qs, lens = torch.tensor([0, 1, 2], dtype=torch.int32), torch.ones(2, dtype=torch.int32)
    kv = torch.randn(2, 2, 64)[:, :, :32]                       # head stride 64 != D: heads not packed
    with pytest.raises(ValueError, match="tma needs"):
        prefill_attention(q, k, k, tables, qs, lens, 1, 1.0, k_new=kv, v_new=kv, tma=True)


def test_choose_num_splits():
    assert choose_num_splits(1, 8, 32768, num_sms=132) == 32          # batch 1, long context (pow2)
    assert choose_num_splits(256, 32, 4096, num_sms=132) == 1           # plenty of programs
    assert choose_num_splits(1, 8, 10, num_sms=132) == 1                # one tile of context
    for b in (1, 3, 17, 64, 200):
        for ctx in (1, 100, 1000, 40000):
            assert choose_num_splits(b, 8, ctx, num_sms=132) in SPLIT_CHOICES


def test_bad_inputs_are_value_errors():
    q = torch.randn(2, 4, 32)
    k = torch.randn(6, 8, 2, 32)
    tables = torch.zeros(2, 3, dtype=torch.int32)
    lens = torch.ones(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="int32"):
        decode_attention(q, k, k, tables.long(), lens, 1.0)
    with pytest.raises(ValueError, match="head_dim"):
        decode_attention(torch.randn(2, 4, 16), k, k, tables, lens, 1.0)
    with pytest.raises(ValueError, match="KV heads"):
        decode_attention(torch.randn(2, 3, 32), k, k, tables, lens, 1.0)
    with pytest.raises(ValueError, match="caches must be in q.s dtype"):
        decode_attention(q.bfloat16(), k, k, tables, lens, 1.0)
    with pytest.raises(ValueError, match="num_splits"):
        decode_attention(q, k, k, tables, lens, 1.0, num_splits=0)
    with pytest.raises(ValueError, match="disagree"):
        prefill_attention(q, k, k, tables, torch.zeros(2, dtype=torch.int32), lens, 1, 1.0)
    qs = torch.tensor([0, 1, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match="both"):
        prefill_attention(q, k, k, tables, qs, lens, 1, 1.0, k_new=torch.randn(2, 2, 32))
    with pytest.raises(ValueError, match="k_new/v_new"):
        prefill_attention(q, k, k, tables, qs, lens, 1, 1.0, k_new=torch.randn(2, 4, 32), v_new=torch.randn(2, 4, 32))
    with pytest.raises(ValueError, match="powers of two"):
        prefill_attention(q, k, k, tables, qs, lens, 1, 1.0, block_m=48, block_n=16)


FP8 = torch.float8_e4m3fn


@pytest.mark.parametrize("words", [True, False])
@pytest.mark.parametrize("num_heads,hkv", [(4, 4), (8, 2)])
def test_decode_fp8_cache(num_heads, hkv, words):
    # the cache in e4m3, read as words of four codes (the default) or as float8 tiles; the
    # reference reads the same bytes in fp32
    for splits in (1, 2):
        assert run_decode([1, 17, 40], num_heads, hkv, 32, 16, torch.bfloat16, splits, seed=hkv + splits,
                          block_n=16, cache_dtype=FP8, words=words) < TOL[torch.bfloat16]
    # q past fp16's 65504 (bf16 holds it): the dots run in fp16 with the softmax scale folded in
    # first, so q * scale must fit, not q
    assert run_decode([5, 40], num_heads, hkv, 32, 16, torch.bfloat16, 1, seed=hkv, block_n=16, cache_dtype=FP8,
                      words=words, q_scale=4e4) < TOL[torch.bfloat16]


@pytest.mark.parametrize("new_kv", [True, False])
def test_prefill_fp8_cache(new_kv):
    # a cached prefix in e4m3 and the chunk's own K/V from the bf16 qkv rows
    assert run_prefill([(20, 13), (0, 9)], 4, 2, 32, 16, torch.bfloat16, seed=3, block_m=16, block_n=16,
                       new_kv=new_kv, cache_dtype=FP8) < TOL[torch.bfloat16]


# ---- real shapes: GPU only ------------------------------------------------------------------

@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("num_heads,hkv", [(32, 32), (32, 8), (64, 8)])
@pytest.mark.parametrize("block_size", [16, 32])
def test_decode_real_shapes(d, num_heads, hkv, block_size):
    gen = torch.Generator().manual_seed(d + num_heads + hkv + block_size)
    ctx = [1, 7, 4099] + torch.randint(1, 3000, (13,), generator=gen).tolist()
    for splits in (1, choose_num_splits(len(ctx), hkv, max(ctx), 132)):
        assert run_decode(ctx, num_heads, hkv, d, block_size, torch.bfloat16, splits, seed=splits + d) < 1.5e-2


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("num_heads,hkv", [(32, 32), (32, 8)])
def test_fp8_cache_real_shapes(num_heads, hkv):
    ctx = [1, 4099, 777, 16384]
    splits = choose_num_splits(len(ctx), hkv, max(ctx), 132)
    for words in (True, False):
        assert run_decode(ctx, num_heads, hkv, 128, 16, torch.bfloat16, splits, seed=hkv, cache_dtype=FP8,
                          words=words) < 1.5e-2
        assert run_decode(ctx, num_heads, hkv, 128, 16, torch.bfloat16, 1, seed=hkv, cache_dtype=FP8,
                          words=words) < 1.5e-2
    chunks = [(0, 777), (1000, 255), (4095, 1)]
    assert run_prefill(chunks, num_heads, hkv, 128, 16, torch.bfloat16, seed=hkv, cache_dtype=FP8) < 1.5e-2


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("hkv", [32, 8])
def test_decode_long_context(hkv):
    ctx = [32768, 20001]
    splits = choose_num_splits(len(ctx), hkv, max(ctx), 132)
    assert splits > 1
    assert run_decode(ctx, 32, hkv, 128, 16, torch.bfloat16, splits, seed=hkv) < 1.5e-2


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("num_heads,hkv", [(32, 32), (32, 8), (32, 4)])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("tma", [True, False])
def test_prefill_real_shapes(d, num_heads, hkv, block_size, tma):
    chunks = [(0, 1), (0, 777), (1000, 255), (4095, 1), (16, 2049)]
    assert run_prefill(chunks, num_heads, hkv, d, block_size, torch.bfloat16, seed=d + hkv, tma=tma) < 1.5e-2


@gpu_only
@pytest.mark.gpu
def test_prefill_long_context():
    assert run_prefill([(28000, 4768), (0, 8191)], 32, 8, 128, 16, torch.bfloat16, seed=5) < 1.5e-2


# the variants bench/gpu/gpu_kernels.py times (PREFILL_VARIANTS; {} = the wrapper's defaults)
PREFILL_GPU_CONFIGS = [
    {},
    {"heads_first": False},
    {"paged_stages": 3},
    {"num_stages": 2},
    {"block_m": 128, "num_warps": 8},
    {"tma": True},
]


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", range(len(PREFILL_GPU_CONFIGS)))
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("num_heads,hkv", [(32, 32), (32, 8)])
def test_prefill_tile_configs(cfg, d, num_heads, hkv):
    kw = PREFILL_GPU_CONFIGS[cfg]
    chunks = [(0, 1), (0, 777), (1000, 255), (4095, 1), (16, 2049)]
    assert run_prefill(chunks, num_heads, hkv, d, 16, torch.bfloat16, seed=d + hkv + cfg, **kw) < 1.5e-2
    paged = {key: val for key, val in kw.items() if key != "tma"}             # no k_new / v_new: no TMA
    assert run_prefill(chunks[1:4], num_heads, hkv, d, 16, torch.bfloat16, seed=cfg, new_kv=False, **paged) < 1.5e-2
    # scores growing along a 4k prompt and after a prefix (the running max keeps moving)
    assert run_prefill([(0, 4096), (700, 1300)], num_heads, hkv, d, 16, torch.bfloat16, seed=cfg + 1,
                       key_growth=0.02, **kw) < 1.5e-2
