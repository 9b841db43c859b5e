"""Small helpers shared by the Triton kernels."""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634      # softmax runs in base 2: exp(x) = exp2(x * LOG2E)


@triton.jit
def dot(a, b, DOT_FP32: tl.constexpr):
    """tl.dot with fp32 accumulation; with DOT_FP32 the operands are upcast first (see `dot_fp32`)."""
    if DOT_FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    if a.dtype == tl.float32:            # fp32 models are the exactness mode: no TF32
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


def dot_fp32(t: torch.Tensor) -> bool:
    """Triton 3.9's CPU interpreter computes bf16/fp16 tl.dot wrongly (off by ~1e10); on CPU
    tensors (interpreter only) the kernels upcast dot operands to fp32. GPUs use the 16-bit dot."""
    return t.device.type == "cpu" and t.dtype != torch.float32


def f16_dot(q: torch.Tensor, cache: torch.Tensor) -> bool:
    """A float8 cache with 16-bit q on a GPU: the attention dots run in fp16 (q cast once per
    tile, fp32 accumulation). e4m3 -> fp16 is one packed instruction per two values on Hopper,
    e4m3 -> bf16 goes through fp32; with bf16 dots the attention over a float8 cache is slower than
    over a bf16 cache, for half the bytes (bench/journal/2026-12-01-fp8-regression-and-gemv-conversions.md,
    run 29). fp16 holds every e4m3 value exactly and q, p in [0, 1] with more mantissa than bf16."""
    return (cache.dtype == torch.float8_e4m3fn and q.dtype in (torch.bfloat16, torch.float16)
            and not dot_fp32(q))


def check_paged_attention_inputs(name: str, q: torch.Tensor, k_cache: torch.Tensor,
                                 v_cache: torch.Tensor) -> tuple[int, int, int, int]:
    """Shared checks of the attention wrappers: q [T, H, D] (last dim contiguous) and equal paged
    caches [NB, BS, Hkv, D] of q's dtype, or float8 e4m3 (upcast to q's dtype as tiles load).
    Returns (num_heads, head_dim, block_size, num_kv_heads)."""
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"{name}: want q [T, H, D] and equal caches [NB, BS, Hkv, D]; got "
                         f"q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}")
    _, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_dim = k_cache.shape
    if cache_dim != head_dim or num_heads % num_kv_heads:
        raise ValueError(f"{name}: head_dim {head_dim} vs cache {cache_dim}, "
                         f"{num_heads} heads not a multiple of {num_kv_heads} KV heads")
    if head_dim & (head_dim - 1) or head_dim < 16:
        raise ValueError(f"{name}: head_dim must be a power of two >= 16, got {head_dim}")
    if q.stride(2) != 1 or k_cache.stride() != v_cache.stride() or k_cache.stride(3) != 1:
        raise ValueError(f"{name}: q and the caches need a contiguous last dim and equal cache strides")
    if (q.dtype != k_cache.dtype and k_cache.dtype != torch.float8_e4m3fn) or k_cache.dtype != v_cache.dtype:
        raise ValueError(f"{name}: the caches must be in q's dtype or float8_e4m3fn; "
                         f"got q {q.dtype}, cache {k_cache.dtype}/{v_cache.dtype}")
    return num_heads, head_dim, block_size, num_kv_heads


# Programmatic dependent launch (Hopper+): a kernel launched with launch_pdl may start while the
# kernel before it drains; its first act is to wait for that kernel's results (gdc_wait), and it
# lets the next kernel launch (gdc_launch_dependents): one-wave kernels at once, the GEMV after its
# loop. In a CUDA graph of many short kernels this hides part of each launch's ramp-up
# (measured: bench/journal/2026-12-01-batch1-decode-profile.md, runs 22-26).
try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    HAS_PDL = True
except ImportError:                     # an older Triton: kernels launch the ordinary way
    HAS_PDL = False


@triton.jit
def grid_dependency_wait(PDL: tl.constexpr):
    """Before the kernel reads or writes anything an earlier kernel touches."""
    if PDL:
        gdc_wait()


@triton.jit
def grid_dependency_launch(PDL: tl.constexpr):
    """From here the next kernel may launch (once every program of this one got here or exited)."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def grid_dependency_sync(PDL: tl.constexpr):
    """Both, first thing: for one-wave kernels, whose successors can then launch at once."""
    grid_dependency_wait(PDL)
    grid_dependency_launch(PDL)


@functools.cache
def _pdl_default(device_index: int) -> bool:
    # KERNELS_PDL=0 turns it off (read once per device: an A/B switch for benchmarks and a way
    # out should a driver mishandle it)
    return (HAS_PDL and os.environ.get("KERNELS_PDL", "1") != "0"
            and torch.cuda.get_device_capability(device_index)[0] >= 9)


def use_pdl(t: torch.Tensor, pdl: bool | None = None) -> bool:
    """pdl, or by default: on a CUDA device of compute capability >= 9 with a Triton that has it."""
    if pdl is None:
        return t.is_cuda and _pdl_default(t.device.index if t.device.index is not None else torch.cuda.current_device())
    return bool(pdl)


def pdl_options(pdl: bool) -> dict:
    """Launch keyword arguments for a kernel taking PDL (only passed when on)."""
    return {"launch_pdl": True} if pdl else {}
