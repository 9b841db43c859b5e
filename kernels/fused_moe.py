"""Fused mixture-of-experts MLP: tokens grouped by expert, one Triton grouped GEMM over all experts
for gate/up and one for down, un-permuted with the routing weights. The reference is
inference/models/moe.py:experts_reference.

    assignments (token t, slot j) -> expert ids[t, j]; flat index a = t * k + j
    align:  sort the assignments by expert, pad each expert's run to BLOCK_M rows with a sentinel

        sorted_ids  [ a a a a | a a - - | a a a a a a a a | ... ]   (- = sentinel, never computed)
        block_expert[    e0   |   e1    |   e2   |   e2   | ... ]   one expert per BLOCK_M rows

    GEMM 1: h[a]   = x[a // k] @ w13[e].T    [T*k, 2I]     (every BLOCK_M tile reads one expert)
            act[a] = silu(h[a, :I]) * h[a, I:]
    GEMM 2: y[a]   = weight[a] * act[a] @ w2[e].T   [T*k, H]
            out[t] = sum_j y[t * k + j]

Every size is fixed by T, k and E, with no host sync: the whole path can be captured in a CUDA
graph. Assignments whose weight is 0 (the router threshold dropped them) are not computed.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.activation import silu_and_mul

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def align_assignments(ids: torch.Tensor, weights: torch.Tensor, num_experts: int, block_m: int):
    """ids, weights [T, k] -> (sorted_ids [P] int32, block_expert [P // block_m] int32) with
    P = T*k + E*(block_m - 1) rounded up to block_m. Padding rows hold the sentinel T*k; blocks past
    the last expert's run get expert -1 (skipped)."""
    num = ids.numel()
    flat = ids.flatten().to(torch.int64)
    live = weights.flatten() > 0
    key = torch.where(live, flat, num_experts)                        # dropped: after every expert
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, key, torch.ones_like(key))
    counts = counts[:num_experts]                                     # [E] live assignments per expert
    padded = (counts + block_m - 1) // block_m * block_m
    pad_start = torch.cumsum(padded, 0) - padded                      # [E] first padded row per expert
    run_start = torch.cumsum(counts, 0) - counts                      # [E] first row in the plain sort
    order = torch.argsort(key, stable=True)                           # [num] assignments by expert
    sorted_key = key[order]
    expert_of = sorted_key.clamp(max=num_experts - 1)                 # (dropped ones go to the drop slot)
    rank = torch.arange(num, device=ids.device) - run_start[expert_of]
    total = -(-(num + num_experts * (block_m - 1)) // block_m) * block_m
    sorted_ids = torch.full((total + 1,), num, dtype=torch.int32, device=ids.device)   # +1: the drop slot
    dest = torch.where(sorted_key < num_experts, pad_start[expert_of] + rank, total)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    sorted_ids = sorted_ids[:total]
    starts = torch.arange(0, total, block_m, device=ids.device)
    ends = torch.cumsum(padded, 0)                                    # [E] one past each run
    block_expert = torch.searchsorted(ends, starts, right=True).to(torch.int32)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1)
    return sorted_ids, block_expert


@triton.jit
def _grouped_gemm_kernel(
    a_ptr,                  # [rows of A, K]: x (A_PER_TOKEN: row = assignment // TOP_K) or act
    b_ptr,                  # [E, N, K] expert weights (nn.Linear layout)
    c_ptr,                  # [T*k, N] out, one row per assignment
    w_ptr,                  # [T*k] routing weights (fp32), read when MUL_WEIGHT
    sorted_ids_ptr,         # [P] int32 assignment per padded row (sentinel = num_assignments)
    block_expert_ptr,       # [P // BLOCK_M] int32 expert per row block (-1: nothing)
    num_assignments,
    N, K,
    stride_am, stride_be, stride_bn, stride_cm,
    TOP_K: tl.constexpr,
    A_PER_TOKEN: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    assign = tl.load(sorted_ids_ptr + rows)                           # [BLOCK_M]
    valid = assign < num_assignments
    a_rows = assign // TOP_K if A_PER_TOKEN else assign
    a_rows = tl.where(valid, a_rows, 0).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)                    # [BLOCK_N]
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + ks[None, :]
    b_ptrs = b_ptr + expert.to(tl.int64) * stride_be + cols[None, :].to(tl.int64) * stride_bn + ks[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kmask = ks < K - k0
        a = tl.load(a_ptrs, mask=valid[:, None] & kmask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=kmask[:, None] & (cols[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if MUL_WEIGHT:
        w = tl.load(w_ptr + tl.where(valid, assign, 0), mask=valid, other=0.0)
        acc = acc * w[:, None]
    c_ptrs = c_ptr + tl.where(valid, assign, 0).to(tl.int64)[:, None] * stride_cm + cols[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & (cols[None, :] < N))


def _grouped_gemm(a, b, out, weights, sorted_ids, block_expert, top_k: int, per_token: bool, mul_weight: bool,
                  block_m: int, block_n: int, block_k: int) -> None:
    n, k = b.shape[1], b.shape[2]
    grid = (block_expert.numel(), triton.cdiv(n, block_n))
    _grouped_gemm_kernel[grid](a, b, out, weights, sorted_ids, block_expert, out.shape[0], n, k,
                               a.stride(0), b.stride(0), b.stride(1), out.stride(0),
                               TOP_K=top_k, A_PER_TOKEN=per_token, MUL_WEIGHT=mul_weight,
                               BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                  block_m: int = 16, block_n: int = 64, block_k: int = 32) -> torch.Tensor:
    """Same contract as experts_reference: x [T, H], w13 [E, 2I, H], w2 [E, H, I], weights [T, k]
    (fp32; 0 = skip), ids [T, k] -> [T, H] in x's dtype."""
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"fused_experts: x [T, H], w13 [E, 2I, H], w2 [E, H, I]; got {list(x.shape)}, "
                         f"{list(w13.shape)}, {list(w2.shape)}")
    t, h = x.shape
    e, two_i, h13 = w13.shape
    if h13 != h or w2.shape != (e, h, two_i // 2):
        raise ValueError(f"fused_experts: shapes do not agree: x {list(x.shape)}, w13 {list(w13.shape)}, "
                         f"w2 {list(w2.shape)}")
    if ids.shape != weights.shape or ids.dim() != 2 or ids.shape[0] != t:
        raise ValueError(f"fused_experts: ids and weights must both be [T={t}, k], got {list(ids.shape)} and "
                         f"{list(weights.shape)}")
    if x.dtype not in _DTYPES or w13.dtype != x.dtype or w2.dtype != x.dtype:
        raise ValueError(f"fused_experts: x, w13, w2 must share one of {_DTYPES}, got {x.dtype}, {w13.dtype}, "
                         f"{w2.dtype}")
    top_k = ids.shape[1]
    if t == 0:
        return torch.zeros_like(x)
    x, w13, w2 = x.contiguous(), w13.contiguous(), w2.contiguous()
    sorted_ids, block_expert = align_assignments(ids, weights, e, block_m)
    flat_w = weights.flatten().float().contiguous()
    h13 = torch.zeros(t * top_k, two_i, dtype=x.dtype, device=x.device)          # [T*k, 2I]
    _grouped_gemm(x, w13, h13, flat_w, sorted_ids, block_expert, top_k, True, False, block_m, block_n, block_k)
    act = silu_and_mul(h13)                                                       # [T*k, I]
    y = torch.zeros(t * top_k, h, dtype=torch.float32, device=x.device)          # [T*k, H]
    _grouped_gemm(act, w2, y, flat_w, sorted_ids, block_expert, 1, False, True, block_m, block_n, block_k)
    return y.view(t, top_k, h).sum(dim=1).to(x.dtype)
