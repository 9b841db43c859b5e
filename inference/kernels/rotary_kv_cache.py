"""RoPE on q and k and the KV-cache write of k and v, in one kernel: Triton kernel, PyTorch
reference, wrapper.

At batch 1 these are small per-layer kernels whose time is mostly launch and ramp-up, so one
kernel over the fused qkv rows does both (bench/journal/2026-12-01-batch1-decode-profile.md,
runs 20-21). A token's row of the qkv projection holds H + 2 * Hkv head vectors of D:

    qkv[t]  =  q_0 .. q_{H-1} | k_0 .. k_{Hkv-1} | v_0 .. v_{Hkv-1}        ([T, H + 2 Hkv, D] view)

    q heads   rotated in place                      (inference/kernels/rotary.py's math, fp32)
    k heads   rotated in place, and the rotated value (rounded to qkv's dtype) -> k_cache[slot]
    v heads   -> v_cache[slot], unchanged in qkv

slot_mapping[t] < 0 marks a padding token: its q/k are still rotated, nothing is cached. The cache
values are what `write_kv_cache` stores after `rotary_embedding`: cast to the cache dtype, a float8
e4m3 cache saturated at +-448.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from inference.kernels.kv_cache import write_kv_cache_reference
from inference.kernels.rotary import rotary_reference
from inference.kernels.triton_utils import grid_dependency_sync, pdl_options, use_pdl

FP8_MAX = tl.constexpr(torch.finfo(torch.float8_e4m3fn).max)     # 448

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_CACHE_DTYPES = _DTYPES + (torch.float8_e4m3fn,)
ELEMENTS_PER_PROGRAM = 2048     # heads per program = this // D (rounded to a power of two)


@triton.jit
def _rotary_kv_cache_kernel(
    positions_ptr,              # [T] int64
    slot_mapping_ptr,           # [T] int64
    qkv_ptr,                    # [T, H + 2 Hkv, D], strides (qkv_token_stride, D, 1)
    cos_sin_ptr,                # [max_pos, D] fp32 contiguous: [cos | sin]
    k_cache_ptr,                # [num_slots, Hkv, D] contiguous
    v_cache_ptr,                # [num_slots, Hkv, D] contiguous
    qkv_token_stride,
    H: tl.constexpr,
    HKV: tl.constexpr,
    HALF_D: tl.constexpr,
    HEADS_PER_PROGRAM: tl.constexpr,
    FP8: tl.constexpr,          # the cache is float8 e4m3: saturate first
    PDL: tl.constexpr,          # launched as a programmatic dependent launch (inference/kernels/triton_utils.py)
):
    grid_dependency_sync(PDL)
    D: tl.constexpr = 2 * HALF_D
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token)
    slot = tl.load(slot_mapping_ptr + token)
    d = tl.arange(0, HALF_D)                                           # [HALF_D]
    cos = tl.load(cos_sin_ptr + pos * D + d)                           # [HALF_D]
    sin = tl.load(cos_sin_ptr + pos * D + HALF_D + d)

    heads = tl.program_id(1) * HEADS_PER_PROGRAM + tl.arange(0, HEADS_PER_PROGRAM)   # [HPP]
    in_row = heads < H + 2 * HKV
    rotate = heads < H + HKV                                           # q and k heads
    is_k = rotate & (heads >= H)
    is_v = in_row & (heads >= H + HKV)
    # slot as a [HPP] tensor: a scalar bool `&` a tensor mask breaks tl.load in the interpreter
    cached = (heads * 0 + slot) >= 0
    mask = in_row[:, None] & (d[None, :] < HALF_D)                     # [HPP, HALF_D]
    x1_ptrs = qkv_ptr + token * qkv_token_stride + heads[:, None] * D + d[None, :]
    x1 = tl.load(x1_ptrs, mask=mask, other=0.0)                        # [HPP, HALF_D]
    x2 = tl.load(x1_ptrs + HALF_D, mask=mask, other=0.0)
    x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)
    rot1 = (x1f * cos[None, :] - x2f * sin[None, :]).to(qkv_ptr.dtype.element_ty)
    rot2 = (x2f * cos[None, :] + x1f * sin[None, :]).to(qkv_ptr.dtype.element_ty)
    rot_mask = rotate[:, None] & mask
    tl.store(x1_ptrs, rot1, mask=rot_mask)
    tl.store(x1_ptrs + HALF_D, rot2, mask=rot_mask)

    # the cache rows: rotated k, unrotated v (each row is one of the two, or neither)
    val1 = tl.where(is_k[:, None], rot1, x1)
    val2 = tl.where(is_k[:, None], rot2, x2)
    kv_head = tl.where(is_k, heads - H, heads - H - HKV)               # [HPP]
    cache_off = slot * (HKV * D) + kv_head[:, None] * D + d[None, :]    # [HPP, HALF_D]
    store_cache_halves(k_cache_ptr, v_cache_ptr, cache_off, HALF_D, val1, val2,
                       (is_k & cached)[:, None] & mask, (is_v & cached)[:, None] & mask, FP8)


@triton.jit
def store_cache_halves(k_cache_ptr, v_cache_ptr, off, HALF_D: tl.constexpr, val1, val2, k_mask, v_mask,
                       FP8: tl.constexpr):
    """Both halves of a head's cache row (val1 at off, val2 at off + D/2) into the k cache where
    k_mask, the v cache where v_mask; a float8 cache saturates first (also the fused qkv GEMV's,
    inference/kernels/gemv_fused.py)."""
    if FP8:
        # via fp32: the CPU interpreter converts bf16 -> fp8 wrongly
        val1 = tl.clamp(val1.to(tl.float32), -FP8_MAX, FP8_MAX)
        val2 = tl.clamp(val2.to(tl.float32), -FP8_MAX, FP8_MAX)
    tl.store(k_cache_ptr + off, val1.to(k_cache_ptr.dtype.element_ty), mask=k_mask)
    tl.store(k_cache_ptr + off + HALF_D, val2.to(k_cache_ptr.dtype.element_ty), mask=k_mask)
    tl.store(v_cache_ptr + off, val1.to(v_cache_ptr.dtype.element_ty), mask=v_mask)
    tl.store(v_cache_ptr + off + HALF_D, val2.to(v_cache_ptr.dtype.element_ty), mask=v_mask)


def rotary_kv_cache_reference(positions: torch.Tensor, qkv: torch.Tensor, cos_sin_cache: torch.Tensor,
                              k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                              num_heads: int, num_kv_heads: int) -> None:
    """The unfused path, in place: rotary_reference on q|k of qkv [T, H + 2 Hkv, D], then
    write_kv_cache_reference of the rotated k and v."""
    qk = qkv[:, :num_heads + num_kv_heads]
    qk.copy_(rotary_reference(positions, qk, cos_sin_cache))
    k, v = qkv[:, num_heads:num_heads + num_kv_heads], qkv[:, num_heads + num_kv_heads:]
    write_kv_cache_reference(k, v, k_cache, v_cache, slot_mapping)


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(f"rotary_kv_cache: {message}")


def supports_cache(cache: torch.Tensor) -> bool:
    """Whether the fused kernel writes this cache dtype (an int8 cache carries per-row scales)."""
    return cache.dtype in _CACHE_DTYPES


def rotary_kv_cache(positions: torch.Tensor, qkv: torch.Tensor, cos_sin_cache: torch.Tensor,
                    k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                    num_heads: int, num_kv_heads: int, pdl: bool | None = None) -> None:
    """Rotate q and k of qkv [T, H + 2 Hkv, D] in place and write k (rotated) and v into their
    slots of k_cache / v_cache [num_blocks, block_size, Hkv, D].

    qkv's heads must be packed (head stride D, last dim contiguous); its token stride is free.
    positions [T] int64 in [0, max_pos) and distinct slots < num_slots are not checked (a sync).
    """
    _check(qkv.dim() == 3, f"qkv must be 3-D [num_tokens, H + 2 Hkv, head_dim], got {list(qkv.shape)}")
    num_tokens, num_rows, head_dim = qkv.shape
    _check(num_heads > 0 and num_kv_heads > 0 and num_rows == num_heads + 2 * num_kv_heads,
           f"qkv has {num_rows} heads, want {num_heads} + 2 x {num_kv_heads}")
    _check(qkv.dtype in _DTYPES, f"qkv dtype must be one of {_DTYPES}, got {qkv.dtype}")
    _check(16 <= head_dim <= 256 and head_dim & (head_dim - 1) == 0,
           f"head_dim must be a power of two in 16..256, got {head_dim}")
    _check(qkv.stride(2) == 1 and qkv.stride(1) == head_dim,
           f"qkv heads must be packed (strides [*, {head_dim}, 1]), got {qkv.stride()}")
    _check(num_tokens <= 1 or qkv.stride(0) >= num_rows * head_dim, f"qkv rows overlap (strides {qkv.stride()})")
    _check(k_cache.dim() == 4 and v_cache.shape == k_cache.shape,
           f"caches must be equal 4-D [num_blocks, block_size, Hkv, D], got {list(k_cache.shape)} / "
           f"{list(v_cache.shape)}")
    _check(tuple(k_cache.shape[2:]) == (num_kv_heads, head_dim),
           f"cache heads/head_dim {list(k_cache.shape[2:])} must be {[num_kv_heads, head_dim]}")
    _check(k_cache.dtype in _CACHE_DTYPES and v_cache.dtype == k_cache.dtype,
           f"caches must share a dtype in {_CACHE_DTYPES}, got {k_cache.dtype} and {v_cache.dtype}")
    _check(k_cache.is_contiguous() and v_cache.is_contiguous(), "caches must be contiguous")
    for name, t in (("positions", positions), ("slot_mapping", slot_mapping)):
        _check(t.dim() == 1 and t.shape[0] == num_tokens and t.dtype == torch.int64 and t.is_contiguous(),
               f"{name} must be contiguous int64 [{num_tokens}], got {t.dtype} {list(t.shape)}")
    _check(cos_sin_cache.dim() == 2 and cos_sin_cache.shape[1] == head_dim and cos_sin_cache.dtype == torch.float32
           and cos_sin_cache.is_contiguous(),
           f"cos_sin_cache must be contiguous fp32 [max_pos, {head_dim}], got {cos_sin_cache.dtype} "
           f"{list(cos_sin_cache.shape)}")
    for name, t in (("positions", positions), ("slot_mapping", slot_mapping), ("cos_sin_cache", cos_sin_cache),
                    ("k_cache", k_cache), ("v_cache", v_cache)):
        _check(t.device == qkv.device, f"{name} is on {t.device}, qkv on {qkv.device}")
    if num_tokens == 0:
        return
    heads_per_program = min(triton.next_power_of_2(num_rows), max(1, ELEMENTS_PER_PROGRAM // head_dim))
    grid = (num_tokens, triton.cdiv(num_rows, heads_per_program))
    _rotary_kv_cache_kernel[grid](
        positions, slot_mapping, qkv, cos_sin_cache, k_cache, v_cache, qkv.stride(0),
        H=num_heads, HKV=num_kv_heads, HALF_D=head_dim // 2, HEADS_PER_PROGRAM=heads_per_program,
        FP8=k_cache.dtype == torch.float8_e4m3fn, PDL=use_pdl(qkv, pdl), num_warps=4,
        **pdl_options(use_pdl(qkv, pdl)),
    )
