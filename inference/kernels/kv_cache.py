"""Write a step's new K/V into the paged cache: Triton kernel, PyTorch reference, wrapper.

Per layer, one tensor for K and one for V, contiguous:

    [num_blocks, block_size, Hkv, D]
        viewed flat as [num_slots, Hkv, D],  slot = block_id * block_size + offset

    token t:  k[t] (Hkv x D)  --slot_mapping[t]-->  k_cache.view(-1, Hkv, D)[slot]
              slot < 0 marks a padding token (e.g. a CUDA-graph batch padded up): nothing written.

Values are cast to the cache dtype; a float8 e4m3 cache saturates at +-448 (e4m3 has no inf)
rather than turning out-of-range values into NaN.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

FP8_MAX = tl.constexpr(torch.finfo(torch.float8_e4m3fn).max)     # 448

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_CACHE_DTYPES = _DTYPES + (torch.float8_e4m3fn,)
ELEMENTS_PER_PROGRAM = 2048     # heads per program = this // D (rounded to a power of two)


@triton.jit
def _write_kv_cache_kernel(
    k_ptr,                      # [T, Hkv, D], strides (k_token_stride, k_head_stride, 1)
    v_ptr,                      # [T, Hkv, D], strides (v_token_stride, v_head_stride, 1)
    k_cache_ptr,                # [num_slots, Hkv, D] contiguous
    v_cache_ptr,                # [num_slots, Hkv, D] contiguous
    slot_mapping_ptr,           # [T] int64
    k_token_stride,
    k_head_stride,
    v_token_stride,
    v_head_stride,
    HKV: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,      # next_power_of_2(D)
    HEADS_PER_PROGRAM: tl.constexpr,
    FP8: tl.constexpr,          # the cache is float8 e4m3: saturate first
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token)                           # int64 scalar
    if slot < 0:
        # Padding token. (An early return rather than `mask & (slot >= 0)`: the Triton 3.9
        # interpreter turns a scalar bool broadcast into a tensor `&` into int, which tl.load rejects.)
        return
    heads = tl.program_id(1) * HEADS_PER_PROGRAM + tl.arange(0, HEADS_PER_PROGRAM)   # [HPP]
    d = tl.arange(0, BLOCK_D)                                          # [BLOCK_D]
    mask = (heads[:, None] < HKV) & (d[None, :] < D)                   # [HPP, BLOCK_D]
    cache_offsets = slot * (HKV * D) + heads[:, None] * D + d[None, :]  # [HPP, BLOCK_D]

    k = tl.load(k_ptr + token * k_token_stride + heads[:, None] * k_head_stride + d[None, :], mask=mask)
    v = tl.load(v_ptr + token * v_token_stride + heads[:, None] * v_head_stride + d[None, :], mask=mask)
    if FP8:
        # via fp32: the CPU interpreter converts bf16 -> fp8 wrongly
        k = tl.clamp(k.to(tl.float32), -FP8_MAX, FP8_MAX)
        v = tl.clamp(v.to(tl.float32), -FP8_MAX, FP8_MAX)
    tl.store(k_cache_ptr + cache_offsets, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + cache_offsets, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_cache_reference(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             slot_mapping: torch.Tensor) -> None:
    """k, v [T, Hkv, D] -> k_cache/v_cache [num_blocks, block_size, Hkv, D] at slot_mapping (slot < 0 skipped)."""
    hkv, d = k_cache.shape[2], k_cache.shape[3]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    k, v = k[valid], v[valid]
    if k_cache.dtype == torch.float8_e4m3fn:
        limit = torch.finfo(k_cache.dtype).max
        k, v = k.float().clamp(-limit, limit), v.float().clamp(-limit, limit)
    k_cache.view(-1, hkv, d)[slots] = k.to(k_cache.dtype)
    v_cache.view(-1, hkv, d)[slots] = v.to(v_cache.dtype)


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(f"write_kv_cache: {message}")


def write_kv_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """Write k, v [T, Hkv, D] (strided views allowed, last dim contiguous) into their slots, in place.

    slot_mapping [T] int64; slot < 0 writes nothing. Slots must be < num_blocks * block_size and
    distinct: they are not checked (that would need a sync).
    """
    _check(k.dim() == 3, f"k must be 3-D [num_tokens, num_kv_heads, head_dim], got {list(k.shape)}")
    _check(v.shape == k.shape, f"v shape {list(v.shape)} must equal k shape {list(k.shape)}")
    _check(k_cache.dim() == 4, f"k_cache must be 4-D [num_blocks, block_size, num_kv_heads, head_dim], "
                               f"got {list(k_cache.shape)}")
    _check(v_cache.shape == k_cache.shape,
           f"v_cache shape {list(v_cache.shape)} must equal k_cache shape {list(k_cache.shape)}")
    num_tokens, num_kv_heads, head_dim = k.shape
    _check(tuple(k_cache.shape[2:]) == (num_kv_heads, head_dim),
           f"cache heads/head_dim {list(k_cache.shape[2:])} must match k's {[num_kv_heads, head_dim]}")
    _check(k.dtype in _DTYPES and v.dtype == k.dtype,
           f"k and v must share a dtype in {_DTYPES}, got {k.dtype} and {v.dtype}")
    _check(k_cache.dtype in _CACHE_DTYPES and v_cache.dtype == k_cache.dtype,
           f"k_cache and v_cache must share a dtype in {_CACHE_DTYPES}, got {k_cache.dtype} and {v_cache.dtype}")
    _check(k.stride(2) == 1 and v.stride(2) == 1,
           f"k and v last dim must be contiguous, got strides {k.stride()} and {v.stride()}")
    _check(k_cache.is_contiguous() and v_cache.is_contiguous(), "k_cache and v_cache must be contiguous")
    _check(slot_mapping.dim() == 1 and slot_mapping.shape[0] == num_tokens,
           f"slot_mapping must have shape [{num_tokens}], got {list(slot_mapping.shape)}")
    _check(slot_mapping.dtype == torch.int64, f"slot_mapping must be int64, got {slot_mapping.dtype}")
    _check(slot_mapping.is_contiguous(), "slot_mapping must be contiguous")
    for name, t in (("v", v), ("k_cache", k_cache), ("v_cache", v_cache), ("slot_mapping", slot_mapping)):
        _check(t.device == k.device, f"{name} is on {t.device}, k on {k.device}")
    if num_tokens == 0 or num_kv_heads == 0 or head_dim == 0:
        return
    block_d = triton.next_power_of_2(head_dim)
    heads_per_program = min(triton.next_power_of_2(num_kv_heads), max(1, ELEMENTS_PER_PROGRAM // block_d))
    grid = (num_tokens, triton.cdiv(num_kv_heads, heads_per_program))
    _write_kv_cache_kernel[grid](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        HKV=num_kv_heads, D=head_dim, BLOCK_D=block_d, HEADS_PER_PROGRAM=heads_per_program,
        FP8=k_cache.dtype == torch.float8_e4m3fn, num_warps=4,
    )
