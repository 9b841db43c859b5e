"""Fused mixture-of-experts MLP: tokens grouped by expert, one Triton grouped GEMM over all experts
for gate/up and one for down, un-permuted with the routing weights. The reference is
inference/models/moe.py:experts_reference. The router kernel and the alignment of assignments
by expert (sorted_ids / block_expert, one expert per BLOCK_M rows) are in inference/kernels/moe_routing.py.

    GEMM 1: h[a]   = x[a // k] @ w13[e].T    [T*k, 2I]     (every BLOCK_M tile reads one expert)
            act[a] = silu(h[a, :I]) * h[a, I:]
    GEMM 2: y[a]   = weight[a] * act[a] @ w2[e].T   [T*k, H]
            out[t] = sum_j y[t * k + j]

A few tokens (decode at batch 1-2, MOE_GEMV_MAX_TOKENS) take a GEMV path instead: no alignment,
no tensor-core tile of 16 rows for one, each assignment streams its expert's rows straight:

    gemv up:   grid (T*k, I / BLOCK_N)   act[a, n] = silu(x[t] . w13[e, n]) * (x[t] . w13[e, I + n])
    gemv down: grid (T, H / BLOCK_N)     out[t, n] = sum_j weight[t, j] * act[t*k + j] . w2[e_j, n]

Quantized experts (int8 / int4 QuantExperts) take the dense decode GEMV's loop there instead
(inference/kernels/quant_gemv.py `_row_sums`: its tiles, one slab of codes a step, its packed code
conversions), the expert's codes and group parameters offset per assignment.

Every size is fixed by T, k and E, with no host sync: the whole path can be captured in a CUDA
graph. Assignments whose weight is 0 (the router threshold dropped them) are not computed, and
their expert rows are not read.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from inference.kernels.activation import silu_and_mul
from inference.kernels.moe_routing import align_assignments
from inference.kernels.quant_gemv import INTERPRETER_ROWS, _row_sums, gemv_config
from inference.kernels.triton_utils import (
    dot,
    dot_fp32,
    grid_dependency_launch,
    grid_dependency_wait,
    pdl_options,
    use_pdl,
)

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Up to this many tokens the GEMV path runs (each token re-reads its experts' rows; the grouped
# GEMM reads each used expert once). H200 layer sweep: bench/journal/2026-12-01-moe.md.
MOE_GEMV_MAX_TOKENS = 2

# ---- quantized expert weights ------------------------------------------------------------------
@triton.jit
def _dequant(w_ptr, s_ptr, z_ptr, rows_w, rows_s, k, mask, BITS: tl.constexpr, GROUP_LEN: tl.constexpr):
    """fp32 weights at (row, k) of int8 / int4 codes (inference/quantization/int_quant.py layout:
    two 4-bit codes per byte, the even column in the low nibble; w = (code - zero) * scale per
    group of GROUP_LEN columns). rows_w / rows_s: each row's offset into the codes and into the
    scales / zeros, broadcastable against the column indices k."""
    if BITS == 8:
        code = tl.load(w_ptr + rows_w + k, mask=mask, other=0).to(tl.float32)
    else:
        byte = tl.load(w_ptr + rows_w + k // 2, mask=mask, other=0).to(tl.int32)
        code = ((byte >> ((k % 2) * 4)) & 15).to(tl.float32)
    g = k // GROUP_LEN
    scale = tl.load(s_ptr + rows_s + g, mask=mask, other=0.0)
    zero = tl.load(z_ptr + rows_s + g, mask=mask, other=0.0)
    return (code - zero) * scale


# ---- grouped GEMM ------------------------------------------------------------------------------
@triton.jit
def _grouped_gemm_kernel(
    a_ptr,                  # [rows of A, K]: x (A_PER_TOKEN: row = assignment // TOP_K) or act
    b_ptr,                  # [E, N, K] expert weights (nn.Linear layout), or their codes (BITS)
    s_ptr, z_ptr,           # BITS: [E, N, G] fp32 scales / zeros (unused for 16/32-bit weights)
    c_ptr,                  # [T*k, N] out, one row per assignment
    w_ptr,                  # [T*k] routing weights (fp32), read when MUL_WEIGHT
    sorted_ids_ptr,         # [P] int32 assignment per padded row (sentinel = num_assignments)
    block_expert_ptr,       # [P // BLOCK_M] int32 expert per row block (-1: nothing)
    num_assignments,
    N, K,
    stride_am, stride_be, stride_bn, stride_cm, stride_se, stride_sn,
    TOP_K: tl.constexpr,
    A_PER_TOKEN: tl.constexpr,
    BITS: tl.constexpr,         # 0: b holds the weights; 8 / 4: integer codes
    GROUP_LEN: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_FP32: tl.constexpr,     # the interpreter's 16-bit dot is wrong: upcast there (triton_utils.dot_fp32)
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
    if BITS != 0:
        rows_w = expert.to(tl.int64) * stride_be + cols[None, :].to(tl.int64) * stride_bn    # [1, BLOCK_N]
        rows_s = expert.to(tl.int64) * stride_se + cols[None, :].to(tl.int64) * stride_sn
    for k0 in range(0, K, BLOCK_K):
        kmask = ks < K - k0
        a = tl.load(a_ptrs, mask=valid[:, None] & kmask[None, :], other=0.0)
        if BITS == 0:
            b = tl.load(b_ptrs, mask=kmask[:, None] & (cols[None, :] < N), other=0.0)
        else:
            b = _dequant(b_ptr, s_ptr, z_ptr, rows_w, rows_s, (k0 + ks)[:, None],
                         kmask[:, None] & (cols[None, :] < N), BITS, GROUP_LEN).to(a.dtype)
        acc += dot(a, b, DOT_FP32)      # fp32 operands: IEEE, not TF32 (the exactness mode)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if MUL_WEIGHT:
        w = tl.load(w_ptr + tl.where(valid, assign, 0), mask=valid, other=0.0)
        acc = acc * w[:, None]
    c_ptrs = c_ptr + tl.where(valid, assign, 0).to(tl.int64)[:, None] * stride_cm + cols[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & (cols[None, :] < N))


def choose_config(num_tokens: int, top_k: int, num_experts: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) of the grouped GEMM by the mean rows per
    expert: row tiles about as tall as an expert's run, long K slabs while the weights stream
    (memory-bound), large tiles once there are rows enough for the tensor cores. The leaders of
    the H200 sweep at Mixtral's shape (bench/gpu/moe_gpu.py layer; bench/journal/2026-12-01-moe.md,
    M2-M3)."""
    rows = num_tokens * top_k / num_experts
    if rows <= 8:
        return (16, 64, 128, 4, 4)
    if rows <= 32:
        return (32, 64, 128, 4, 4)
    if rows <= 96:
        return (64, 128, 64, 8, 3)
    return (128, 256, 64, 8, 3)         # big, compute-bound steps: beats 128 x 128 there (M2-M3)


def _grouped_gemm(a, b, out, weights, sorted_ids, block_expert, top_k: int, per_token: bool, mul_weight: bool,
                  config: tuple[int, int, int, int, int]) -> None:
    block_m, block_n, block_k, warps, stages = config
    n, k = b.shape[1], b.shape[2]
    codes, scales, zeros, bits, group_len = _weight_operands(b)
    if bits:
        # the dequantized tile, its scales and zeros stay in registers / shared memory too: the
        # 16-bit leaders' big tiles (128 x 256, 3 stages) need 1.5x the H200's 227 KB
        block_n, block_k, stages = min(block_n, 128), min(block_k, 64), min(stages, 2)
    grid = (block_expert.numel(), triton.cdiv(n, block_n))
    _grouped_gemm_kernel[grid](a, codes, scales, zeros, out, weights, sorted_ids, block_expert, out.shape[0], n, k,
                               a.stride(0), codes.stride(0), codes.stride(1), out.stride(0), scales.stride(0),
                               scales.stride(1),
                               TOP_K=top_k, A_PER_TOKEN=per_token, BITS=bits, GROUP_LEN=group_len,
                               MUL_WEIGHT=mul_weight,
                               BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, DOT_FP32=dot_fp32(a),
                               num_warps=warps, num_stages=stages)


# ---- GEMV path (a few tokens) ------------------------------------------------------------------
@triton.jit
def _gemv_up_kernel(
    X, W13, ACT, WEIGHTS, IDS,  # x [T, H], w13 [E, 2I, H], act [T*k, I] out, weights / ids [T*k]
    I, H, stride_xm, stride_we, stride_wn, stride_am,  # noqa: E741
    TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):
    grid_dependency_wait(PDL)
    a = tl.program_id(0).to(tl.int64)
    if tl.load(WEIGHTS + a) == 0:       # dropped by the threshold: nothing reads its act row
        grid_dependency_launch(PDL)
        return
    expert = tl.load(IDS + a).to(tl.int64)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < I
    x_row = X + (a // TOP_K) * stride_xm
    g_rows = W13 + expert * stride_we + rn.to(tl.int64)[:, None] * stride_wn            # [BLOCK_N, 1]
    u_rows = g_rows + I * stride_wn
    acc_g = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_mask = rk < H
        x = tl.load(x_row + rk, mask=k_mask, other=0.0).to(tl.float32)[None, :]    # [1, BLOCK_K]
        m = n_mask[:, None] & k_mask[None, :]
        g = tl.load(g_rows + rk[None, :], mask=m, other=0.0)
        u = tl.load(u_rows + rk[None, :], mask=m, other=0.0)
        acc_g += tl.sum(g.to(tl.float32) * x, 1)
        acc_u += tl.sum(u.to(tl.float32) * x, 1)
    grid_dependency_launch(PDL)
    act = acc_g * tl.sigmoid(acc_g) * acc_u
    tl.store(ACT + a * stride_am + rn, act.to(ACT.dtype.element_ty), mask=n_mask)


@triton.jit
def _gemv_down_kernel(
    ACT, W2, OUT, WEIGHTS, IDS,  # act [T*k, I], w2 [E, H, I], out [T, H], weights / ids [T*k]
    H, I, stride_am, stride_we, stride_wn, stride_om,  # noqa: E741
    TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):
    grid_dependency_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < H
    out = tl.zeros([BLOCK_N], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        a = t * TOP_K + j
        weight = tl.load(WEIGHTS + a)
        k_end = tl.where(weight != 0, I, 0)     # dropped: every load masked off, no bytes read
        expert = tl.load(IDS + a).to(tl.int64)
        w_rows = W2 + expert * stride_we + rn.to(tl.int64)[:, None] * stride_wn
        act_row = ACT + a * stride_am
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for k0 in range(0, I, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            k_mask = rk < k_end
            x = tl.load(act_row + rk, mask=k_mask, other=0.0).to(tl.float32)[None, :]
            w = tl.load(w_rows + rk[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            acc += tl.sum(w.to(tl.float32) * x, 1)
        out += weight * acc
    grid_dependency_launch(PDL)
    tl.store(OUT + t * stride_om + rn, out.to(OUT.dtype.element_ty), mask=n_mask)


# ---- GEMV path over quantized experts: the dense decode GEMV's loop (inference/kernels/quant_gemv.py) ----
@triton.jit
def _qgemv_up_kernel(
    X, QW, S, Z, ACT, WEIGHTS, IDS,   # x [T, H], codes [E, 2I, H'], scales / zeros [E, 2I, G], act [T*k, I]
    I, H, group_len, num_groups, stride_xm, stride_qe, stride_qn, stride_se, stride_sn, stride_am,  # noqa: E741
    TOP_K: tl.constexpr, BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_TILE: tl.constexpr, CONVERT: tl.constexpr, EMULATE: tl.constexpr, PDL: tl.constexpr,
):
    """act[a, n] = silu(x . gate row n) * (x . up row n) of assignment a's expert: one program
    streams BLOCK_N gate rows, then the BLOCK_N up rows I below them."""
    grid_dependency_wait(PDL)
    a = tl.program_id(0).to(tl.int64)
    if tl.load(WEIGHTS + a) == 0:       # dropped by the threshold: nothing reads its act row
        grid_dependency_launch(PDL)
        return
    expert = tl.load(IDS + a).to(tl.int64)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < I
    x_row = X + (a // TOP_K) * stride_xm
    qw, s, z = QW + expert * stride_qe, S + expert * stride_se, Z + expert * stride_se
    g = _row_sums(x_row, qw, s, z, rn, n_mask, H, group_len, num_groups, stride_qn, stride_sn,
                  BITS, BLOCK_N, BLOCK_K, GROUP_TILE, CONVERT, EMULATE, False)
    u = _row_sums(x_row, qw, s, z, rn + I, n_mask, H, group_len, num_groups, stride_qn, stride_sn,
                  BITS, BLOCK_N, BLOCK_K, GROUP_TILE, CONVERT, EMULATE, False)
    grid_dependency_launch(PDL)
    tl.store(ACT + a * stride_am + rn, (g * tl.sigmoid(g) * u).to(ACT.dtype.element_ty), mask=n_mask)


@triton.jit
def _qgemv_down_kernel(
    ACT, QW, S, Z, OUT, WEIGHTS, IDS,  # act [T*k, I], codes [E, H, I'], scales / zeros [E, H, G], out [T, H]
    H, I, group_len, num_groups, stride_am, stride_qe, stride_qn, stride_se, stride_sn, stride_om,  # noqa: E741
    TOP_K: tl.constexpr, BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_TILE: tl.constexpr, CONVERT: tl.constexpr, EMULATE: tl.constexpr, PDL: tl.constexpr,
):
    """out[t, n] = sum_j weight[t, j] * act[t*k + j] . row n of expert e_j (dropped ones: not read)."""
    grid_dependency_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < H
    out = tl.zeros([BLOCK_N], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        a = t * TOP_K + j
        weight = tl.load(WEIGHTS + a)
        if weight != 0:
            expert = tl.load(IDS + a).to(tl.int64)
            out += weight * _row_sums(ACT + a * stride_am, QW + expert * stride_qe, S + expert * stride_se,
                                      Z + expert * stride_se, rn, n_mask, I, group_len, num_groups, stride_qn,
                                      stride_sn, BITS, BLOCK_N, BLOCK_K, GROUP_TILE, CONVERT, EMULATE, False)
    grid_dependency_launch(PDL)
    tl.store(OUT + t * stride_om + rn, out.to(OUT.dtype.element_ty), mask=n_mask)


def _experts_gemv(x, w13, w2, weights, ids, block_n: int | None = None, num_warps: int = 4, pdl: bool | None = None):
    t, h = x.shape
    if block_n is None:                 # 2 rows on the GPU; the interpreter wants few, large programs
        block_n = 2 if x.device.type == "cuda" else INTERPRETER_ROWS
    two_i = w13.shape[1]
    inter, top_k = two_i // 2, ids.shape[1]
    flat_w = weights.flatten().float().contiguous()
    flat_ids = ids.flatten().contiguous()
    pdl = use_pdl(x, pdl)
    act = torch.empty((t * top_k, inter), dtype=x.dtype, device=x.device)         # [T*k, I]
    out = torch.empty((t, h), dtype=x.dtype, device=x.device)                     # [T, H]
    if not isinstance(w13, torch.Tensor):
        return _quant_experts_gemv(x, w13, w2, flat_w, flat_ids, top_k, act, out, pdl)
    _gemv_up_kernel[(t * top_k, triton.cdiv(inter, block_n))](
        x, w13, act, flat_w, flat_ids, inter, h, x.stride(0), w13.stride(0), w13.stride(1), act.stride(0),
        TOP_K=top_k, BLOCK_N=block_n, BLOCK_K=min(1024, triton.next_power_of_2(h)), PDL=pdl,
        num_warps=num_warps, **pdl_options(pdl))
    _gemv_down_kernel[(t, triton.cdiv(h, block_n))](
        act, w2, out, flat_w, flat_ids, h, inter, act.stride(0), w2.stride(0), w2.stride(1), out.stride(0),
        TOP_K=top_k, BLOCK_N=block_n, BLOCK_K=min(1024, triton.next_power_of_2(inter)), PDL=pdl,
        num_warps=num_warps, **pdl_options(pdl))
    return out


def _quant_experts_gemv(x, q13, q2, flat_w, flat_ids, top_k: int, act, out, pdl: bool):
    """The GEMV path over QuantExperts: the dense decode GEMV's tiles and code conversions
    (inference/kernels/quant_gemv.py gemv_config) for I rows of H (up) and H rows of I (down)."""
    t, h = x.shape
    inter = act.shape[1]
    emulate = x.device.type != "cuda"
    cfg = gemv_config(inter, h, q13.bits, q13.group_len, q13.qweight, x.dtype)
    _qgemv_up_kernel[(t * top_k, triton.cdiv(inter, cfg["BLOCK_N"]))](
        x, q13.qweight, q13.scales, q13.zeros, act, flat_w, flat_ids, inter, h, q13.group_len, q13.scales.shape[2],
        x.stride(0), q13.qweight.stride(0), q13.qweight.stride(1), q13.scales.stride(0), q13.scales.stride(1),
        act.stride(0), TOP_K=top_k, EMULATE=emulate, PDL=pdl, **cfg, **pdl_options(pdl))
    cfg = gemv_config(h, inter, q2.bits, q2.group_len, q2.qweight, x.dtype)
    _qgemv_down_kernel[(t, triton.cdiv(h, cfg["BLOCK_N"]))](
        act, q2.qweight, q2.scales, q2.zeros, out, flat_w, flat_ids, h, inter, q2.group_len, q2.scales.shape[2],
        act.stride(0), q2.qweight.stride(0), q2.qweight.stride(1), q2.scales.stride(0), q2.scales.stride(1),
        out.stride(0), TOP_K=top_k, EMULATE=emulate, PDL=pdl, **cfg, **pdl_options(pdl))
    return out


def _weight_operands(w):
    """(codes or weights [E, N, K'], scales [E, N, G], zeros, bits, group_len) for a stacked weight
    tensor (bits 0; scales / zeros stand in as unused pointers) or quantized experts (QuantExperts,
    inference/quantization/moe_experts.py)."""
    if isinstance(w, torch.Tensor):
        return w, w, w, 0, 1
    return w.qweight, w.scales, w.zeros, w.bits, w.group_len


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                  block_m: int | None = None, block_n: int | None = None, block_k: int | None = None,
                  config: tuple[int, int, int, int, int] | None = None, gemv: bool | None = None) -> torch.Tensor:
    """Same contract as experts_reference: x [T, H], w13 [E, 2I, H], w2 [E, H, I], weights [T, k]
    (fp32; 0 = skip), ids [T, k] -> [T, H] in x's dtype. w13 / w2 may be quantized experts
    (int8 / int4 codes, dequantized as the tiles load).

    gemv: the GEMV path (default: up to MOE_GEMV_MAX_TOKENS tokens); otherwise the grouped GEMM
    with `config` (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages; default choose_config), whose first
    three block_m / block_n / block_k override."""
    if x.dim() != 2 or len(w13.shape) != 3 or len(w2.shape) != 3:
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
    if isinstance(w13, torch.Tensor) != isinstance(w2, torch.Tensor):
        raise ValueError("fused_experts: w13 and w2 must both be weight tensors or both quantized experts")
    if x.dtype not in _DTYPES or w13.dtype != x.dtype or w2.dtype != x.dtype:
        raise ValueError(f"fused_experts: x, w13, w2 must share one of {_DTYPES}, got {x.dtype}, {w13.dtype}, "
                         f"{w2.dtype}")
    top_k = ids.shape[1]
    if t == 0:
        return torch.zeros_like(x)
    x = x.contiguous()
    if isinstance(w13, torch.Tensor):
        w13, w2 = w13.contiguous(), w2.contiguous()
    if gemv is None:
        gemv = t <= MOE_GEMV_MAX_TOKENS
    if gemv:
        return _experts_gemv(x, w13, w2, weights, ids)
    cfg = list(config or choose_config(t, top_k, e))
    for i, override in enumerate((block_m, block_n, block_k)):
        if override is not None:
            cfg[i] = override
    config = tuple(cfg)
    sorted_ids, block_expert = align_assignments(ids, weights, e, config[0])
    flat_w = weights.flatten().float().contiguous()
    # rows of dropped assignments stay unwritten in h13 / act: no sorted row points at them
    h13 = torch.empty(t * top_k, two_i, dtype=x.dtype, device=x.device)         # [T*k, 2I]
    _grouped_gemm(x, w13, h13, flat_w, sorted_ids, block_expert, top_k, True, False, config)
    act = silu_and_mul(h13)                                                       # [T*k, I]
    y = torch.zeros(t * top_k, h, dtype=torch.float32, device=x.device)          # [T*k, H]
    _grouped_gemm(act, w2, y, flat_w, sorted_ids, block_expert, 1, False, True, config)
    return y.view(t, top_k, h).sum(dim=1).to(x.dtype)
