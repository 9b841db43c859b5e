"""Neox-style (rotate-half) rotary embedding, in place: Triton kernel, PyTorch reference, wrapper.

For each head vector x = [x1 | x2] (halves of D) at position p, with c = cos(p * inv_freq) and
s = sin(p * inv_freq) read from one fp32 table row [c | s] (cos_sin_cache[p], D columns):

    out = [x1 * c - x2 * s  |  x2 * c + x1 * s]

All math is fp32; the result is written in x's dtype. x is usually a strided view of the fused
qkv projection, [T, H + Hkv, D] with token stride (H + 2 * Hkv) * D, so rotating it in place
rotates q and k inside the qkv buffer.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256
ELEMENTS_PER_PROGRAM = 2048     # heads per program = this // D (rounded to a power of two)


@triton.jit
def _rotary_kernel(
    positions_ptr,              # [T] int64
    x_ptr,                      # [T, H, D], strides (x_token_stride, x_head_stride, 1)
    cos_sin_ptr,                # [max_pos, D] fp32 contiguous: [cos | sin]
    x_token_stride,
    x_head_stride,
    H,
    HALF_D: tl.constexpr,
    HEADS_PER_PROGRAM: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token)
    d = tl.arange(0, HALF_D)                                           # [HALF_D]
    cos = tl.load(cos_sin_ptr + pos * (2 * HALF_D) + d)                # [HALF_D]
    sin = tl.load(cos_sin_ptr + pos * (2 * HALF_D) + HALF_D + d)       # [HALF_D]

    heads = tl.program_id(1) * HEADS_PER_PROGRAM + tl.arange(0, HEADS_PER_PROGRAM)   # [HPP]
    mask = (heads[:, None] < H) & (d[None, :] < HALF_D)                # [HPP, HALF_D]
    x1_ptrs = x_ptr + token * x_token_stride + heads[:, None] * x_head_stride + d[None, :]
    x1 = tl.load(x1_ptrs, mask=mask, other=0.0).to(tl.float32)         # [HPP, HALF_D]
    x2 = tl.load(x1_ptrs + HALF_D, mask=mask, other=0.0).to(tl.float32)
    out1 = x1 * cos[None, :] - x2 * sin[None, :]
    out2 = x2 * cos[None, :] + x1 * sin[None, :]
    tl.store(x1_ptrs, out1.to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(x1_ptrs + HALF_D, out2.to(x_ptr.dtype.element_ty), mask=mask)


def rotary_reference(positions: torch.Tensor, x: torch.Tensor, cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """positions [T], x [T, H, D], cos_sin_cache [max_pos, D] -> new rotated [T, H, D] (x.dtype)."""
    half = x.shape[-1] // 2
    cos_sin = cos_sin_cache[positions].float()                         # [T, D]
    cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]        # [T, 1, D/2]
    x1, x2 = x[..., :half].float(), x[..., half:].float()              # [T, H, D/2]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def rotary_embedding(positions: torch.Tensor, x: torch.Tensor, cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, H, D] in place (it may be a strided view; last dim contiguous); returns x.

    positions [T] int64 must lie in [0, max_pos): they are not checked (that would need a sync).
    """
    if x.dim() != 3:
        raise ValueError(f"rotary_embedding: x must be 3-D [num_tokens, num_heads, head_dim], got {list(x.shape)}")
    if x.dtype not in _DTYPES:
        raise ValueError(f"rotary_embedding: x dtype must be one of {_DTYPES}, got {x.dtype}")
    num_tokens, num_heads, head_dim = x.shape
    if not (MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM and head_dim & (head_dim - 1) == 0):
        raise ValueError(f"rotary_embedding: head_dim must be a power of two in "
                         f"{MIN_HEAD_DIM}..{MAX_HEAD_DIM}, got {head_dim}")
    if x.stride(2) != 1:
        raise ValueError(f"rotary_embedding: x last dim must be contiguous, got strides {x.stride()}")
    if (num_heads > 1 and x.stride(1) < head_dim) or (num_tokens > 1 and x.stride(0) < num_heads * x.stride(1)):
        raise ValueError(f"rotary_embedding: x rows overlap (strides {x.stride()}); in-place needs distinct heads")
    if positions.dim() != 1 or positions.shape[0] != num_tokens:
        raise ValueError(f"rotary_embedding: positions must have shape [{num_tokens}], got {list(positions.shape)}")
    if positions.dtype != torch.int64:
        raise ValueError(f"rotary_embedding: positions must be int64, got {positions.dtype}")
    if not positions.is_contiguous():
        raise ValueError("rotary_embedding: positions must be contiguous")
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != head_dim:
        raise ValueError(f"rotary_embedding: cos_sin_cache must have shape [max_pos, {head_dim}], "
                         f"got {list(cos_sin_cache.shape)}")
    if cos_sin_cache.dtype != torch.float32:
        raise ValueError(f"rotary_embedding: cos_sin_cache must be float32, got {cos_sin_cache.dtype}")
    if not cos_sin_cache.is_contiguous():
        raise ValueError("rotary_embedding: cos_sin_cache must be contiguous")
    for name, t in (("positions", positions), ("cos_sin_cache", cos_sin_cache)):
        if t.device != x.device:
            raise ValueError(f"rotary_embedding: {name} is on {t.device}, x on {x.device}")
    if num_tokens == 0 or num_heads == 0:
        return x
    heads_per_program = min(triton.next_power_of_2(num_heads), max(1, ELEMENTS_PER_PROGRAM // head_dim))
    grid = (num_tokens, triton.cdiv(num_heads, heads_per_program))
    _rotary_kernel[grid](
        positions, x, cos_sin_cache, x.stride(0), x.stride(1), num_heads,
        HALF_D=head_dim // 2, HEADS_PER_PROGRAM=heads_per_program, num_warps=4,
    )
    return x
