"""Routing for the fused mixture-of-experts path (inference/kernels/fused_moe.py): the router in one kernel
(softmax, top-k, renormalisation, threshold, expert-load count; reference: `route` in
inference/models/moe.py) and the alignment of assignments by expert for the grouped GEMM:

    assignments (token t, slot j) -> expert ids[t, j]; flat index a = t * k + j
    align:  sort the assignments by expert, pad each expert's run to BLOCK_M rows with a sentinel

        sorted_ids  [ a a a a | a a - - | a a a a a a a a | ... ]   (- = sentinel, never computed)
        block_expert[    e0   |   e1    |   e2   |   e2   | ... ]   one expert per BLOCK_M rows

Sizes depend only on T, k and E, with no host sync, so both can be captured in a CUDA graph.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from inference.kernels.triton_utils import grid_dependency_sync, pdl_options, use_pdl

# The one-program alignment kernel holds every assignment in registers: up to this many.
ALIGN_KERNEL_MAX = 4096


# ---- router ------------------------------------------------------------------------------------
@triton.jit
def _route_kernel(
    LOGITS,                     # [T, E] router logits, any float dtype
    WEIGHTS,                    # [T, TOP_K] fp32 out
    IDS,                        # [T, TOP_K] int64 out
    COUNTS,                     # [E] int64 expert-load counter (COUNT), += kept assignments
    THRESHOLD,                  # [1] fp32 device tensor: read at run time, so graphs follow changes
    E, stride_l,
    TOP_K: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr,
    RENORM: tl.constexpr, COUNT: tl.constexpr, PDL: tl.constexpr,
):
    grid_dependency_sync(PDL)
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, E_PAD)
    valid = offs < E
    logits = tl.load(LOGITS + t * stride_l + offs, mask=valid, other=float("-inf")).to(tl.float32)
    p = tl.exp(logits - tl.max(logits, 0))
    p = tl.where(valid, p, 0.0)
    p = p / tl.sum(p, 0)                                              # softmax over all experts
    q = tl.where(valid, p, -1.0)
    kk = tl.arange(0, K_PAD)
    w = tl.zeros([K_PAD], dtype=tl.float32)
    ids = tl.zeros([K_PAD], dtype=tl.int32)
    for j in tl.static_range(TOP_K):                                  # top-k, best first
        best = tl.max(q, 0)
        idx = tl.min(tl.where(q == best, offs, E_PAD), 0)             # ties: the lowest expert
        w = tl.where(kk == j, best, w)
        ids = tl.where(kk == j, idx, ids)
        q = tl.where(offs == idx, -1.0, q)
    if RENORM:
        w = w / tl.sum(w, 0)
    # the threshold (0 = off keeps everything, renormalising once more changes nothing)
    keep = (w >= tl.load(THRESHOLD)) | (kk == 0)
    w = tl.where(keep & (kk < TOP_K), w, 0.0)
    if RENORM:
        w = w / tl.sum(w, 0)
    kmask = kk < TOP_K
    tl.store(WEIGHTS + t * TOP_K + kk, w, mask=kmask)
    tl.store(IDS + t * TOP_K + kk, ids.to(tl.int64), mask=kmask)
    if COUNT:
        tl.atomic_add(COUNTS + ids, (w > 0).to(tl.int64), mask=kmask)


def fused_route(logits: torch.Tensor, top_k: int, renormalize: bool, threshold: torch.Tensor,
                counts: torch.Tensor | None = None, pdl: bool | None = None):
    """`route` in one kernel: logits [T, E] -> (weights [T, k] fp32, ids [T, k] int64); threshold
    is a [1] fp32 tensor on the logits' device (0 = off); counts [E] int64 (if given) gains each
    expert's kept assignments."""
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"fused_route: logits must be [T, E] with a contiguous last dim, got {tuple(logits.shape)}")
    t, e = logits.shape
    if not 1 <= top_k <= e:
        raise ValueError(f"fused_route: top_k must be in [1, {e}], got {top_k}")
    if threshold.numel() != 1 or threshold.dtype != torch.float32 or threshold.device != logits.device:
        raise ValueError("fused_route: threshold must be a one-element fp32 tensor on the logits' device")
    weights = torch.empty((t, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((t, top_k), dtype=torch.int64, device=logits.device)
    if t == 0:
        return weights, ids
    pdl = use_pdl(logits, pdl)
    _route_kernel[(t,)](logits, weights, ids, counts if counts is not None else ids, threshold, e, logits.stride(0),
                        TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k), E_PAD=triton.next_power_of_2(e),
                        RENORM=renormalize, COUNT=counts is not None, PDL=pdl, num_warps=1, **pdl_options(pdl))
    return weights, ids


# ---- alignment ---------------------------------------------------------------------------------
@triton.jit
def _align_kernel(
    IDS, WEIGHTS,               # [num] expert id (int64) and routing weight (fp32) per assignment
    SORTED,                     # [total] int32 out: assignment per padded row, sentinel num
    BLOCK_EXPERT,               # [total / BLOCK_M] int32 out: expert per row block, -1 past the runs
    num, total, E,
    BLOCK_M: tl.constexpr, NUM_P: tl.constexpr, NB_P: tl.constexpr, FILL: tl.constexpr,
):
    # one program: every assignment in registers, one pass per expert (count, rank by prefix sum)
    offs = tl.arange(0, NUM_P)
    valid = offs < num
    ids = tl.load(IDS + offs, mask=valid, other=0).to(tl.int32)
    live = valid & (tl.load(WEIGHTS + offs, mask=valid, other=0.0) > 0)
    for s in range(0, total, FILL):
        fill = s + tl.arange(0, FILL)
        tl.store(SORTED + fill, tl.zeros([FILL], dtype=tl.int32) + num, mask=fill < total)
    tl.debug_barrier()                  # the sentinels land before any thread scatters over them
    bidx = tl.arange(0, NB_P)
    block_expert = tl.full([NB_P], -1, dtype=tl.int32)
    start = 0
    for e in range(E):
        sel = (live & (ids == e)).to(tl.int32)
        count = tl.sum(sel, 0)
        rank = tl.cumsum(sel, 0) - 1
        tl.store(SORTED + start + rank, offs, mask=sel > 0)
        first = start // BLOCK_M
        nblocks = (count + BLOCK_M - 1) // BLOCK_M
        block_expert = tl.where((bidx >= first) & (bidx < first + nblocks), e, block_expert)
        start += nblocks * BLOCK_M
    tl.store(BLOCK_EXPERT + bidx, block_expert, mask=bidx < total // BLOCK_M)


def align_assignments(ids: torch.Tensor, weights: torch.Tensor, num_experts: int, block_m: int,
                      use_kernel: bool | None = None):
    """ids, weights [T, k] -> (sorted_ids [P] int32, block_expert [P // block_m] int32) with
    P = T*k + E*(block_m - 1) rounded up to block_m. Padding rows hold the sentinel T*k; blocks past
    the last expert's run get expert -1 (skipped). Up to ALIGN_KERNEL_MAX assignments one Triton
    program does it (one launch instead of ~30 small PyTorch ops); above, PyTorch's sort."""
    num = ids.numel()
    total = -(-(num + num_experts * (block_m - 1)) // block_m) * block_m
    if use_kernel is None:
        use_kernel = num <= ALIGN_KERNEL_MAX
    if use_kernel:
        sorted_ids = torch.empty(total, dtype=torch.int32, device=ids.device)
        block_expert = torch.empty(total // block_m, dtype=torch.int32, device=ids.device)
        num_p = max(16, triton.next_power_of_2(num))
        _align_kernel[(1,)](ids.contiguous(), weights.float().contiguous(), sorted_ids, block_expert, num, total,
                            num_experts, BLOCK_M=block_m, NUM_P=num_p,
                            NB_P=max(16, triton.next_power_of_2(total // block_m)), FILL=1024,
                            num_warps=4 if num_p <= 1024 else 8)
        return sorted_ids, block_expert
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
    sorted_ids = torch.full((total + 1,), num, dtype=torch.int32, device=ids.device)   # +1: the drop slot
    dest = torch.where(sorted_key < num_experts, pad_start[expert_of] + rank, total)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    sorted_ids = sorted_ids[:total]
    starts = torch.arange(0, total, block_m, device=ids.device)
    ends = torch.cumsum(padded, 0)                                    # [E] one past each run
    block_expert = torch.searchsorted(ends, starts, right=True).to(torch.int32)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1)
    return sorted_ids, block_expert
