"""GPTQ (Frantar et al., 2022): quantize a weight column by column and push each column's rounding
error onto the columns not yet quantized, weighted by the inverse Hessian of the layer's inputs
(H = X^T X / n over calibration rows), so the layer's outputs on those inputs move as little as
possible. The standard pieces:

- dampening: H += damp * mean(diag H) * I (damp 0.01), so the Cholesky factor exists;
- lazy batch updates: columns go in blocks of 128, the rest of W is updated once per block;
- act-order (`act_order=True`): columns in order of decreasing diag(H), so the loudest inputs
  are rounded first, while the most columns are still free to absorb their error;
- static groups: whatever the order, group g is still columns [g * G, (g + 1) * G) (g_idx =
  i // group_size, the layout the loader and the kernels read), so act-order needs no new
  checkpoint format. A group's scale and zero point are fixed when its first column comes up,
  from the group's weights as updated by then (the pending updates of the current block too);
- `clip_search` (on by default): those parameters by the reference GPTQ quantizer's MSE grid
  (the shrink of the group's range with the least |w - q(w)|^2.4 error) rather than min / max.

On SmolLM2-135M at group 128 the clip search, act-order and AWQ's scales folded in first
(QuantConfig.awq_scales) each lower the perplexity loss (bench/cpu/quality.py; docs/benchmarks.md).
Quantizing a layer's linears one after another on the already-quantized ones' outputs ("true
sequential" within a layer) is no better there, so a layer's Hessians come from one pass; the next
layer sees the quantized one.
"""
from __future__ import annotations

import torch

from inference.quantization.config import QuantConfig

BLOCK = 128
CLIP_GRID = 100            # the reference quantizer's grid: shrink the range by 1% steps ...
CLIP_MAX_SHRINK = 0.8      # ... down to 20% of it
CLIP_NORM = 2.4


def _params(w: torch.Tensor, cfg: QuantConfig, clip_search: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point [out] for one group's weights W [out, k] (the rules of
    int_quant.group_params, on fp64 weights)."""
    qmax = cfg.qmax

    def fit(lo, hi):
        if cfg.symmetric:
            scale = (2 * torch.maximum(lo.abs(), hi.abs()) / qmax).clamp(min=1e-10)
            zero = torch.full_like(scale, (qmax + 1) / 2)
        else:
            scale = ((hi - lo) / qmax).clamp(min=1e-10)
            zero = (-lo / scale).round().clamp(1, qmax)        # GPTQ v1 stores zero - 1: zeros start at 1
        return scale.clamp(min=1e-6).half().double(), zero     # fp16-representable, as stored

    lo, hi = w.amin(1).clamp(max=0), w.amax(1).clamp(min=0)
    scale, zero = fit(lo, hi)
    if not clip_search:
        return scale, zero
    best = torch.full_like(scale, float("inf"))
    for k in range(int(CLIP_MAX_SHRINK * CLIP_GRID)):
        r = 1 - k / CLIP_GRID
        s, z = fit(lo * r, hi * r)
        q = (w / s[:, None] + z[:, None]).round().clamp(0, qmax)
        err = ((q - z[:, None]) * s[:, None] - w).abs().pow(CLIP_NORM).sum(1)
        better = err < best
        best = torch.where(better, err, best)
        scale, zero = torch.where(better, s, scale), torch.where(better, z, zero)
    return scale, zero


def gptq_quantize(w: torch.Tensor, hessian: torch.Tensor, cfg: QuantConfig, damp: float = 0.01,
                  act_order: bool | None = None, clip_search: bool = True
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """W [out, in], H [in, in] -> (codes uint8 [out, in], scales [out, G], zeros [out, G]), in
    W's own column order and group layout whatever the order of quantization.
    act_order: None follows cfg.act_order."""
    act_order = cfg.act_order if act_order is None else act_order
    out, n = w.shape
    if hessian.shape != (n, n):
        raise ValueError(f"gptq: Hessian {tuple(hessian.shape)} does not match {n} input features")
    w = w.detach().double().clone()
    h = hessian.detach().double().clone()
    dead = torch.diag(h) == 0                      # inputs that never fired: any value is exact
    h[dead, dead] = 1
    w[:, dead] = 0
    gl = cfg.group_len(n)
    group_of = torch.arange(n, device=w.device) // gl                  # [in] original column -> group
    perm = torch.argsort(torch.diag(h), descending=True, stable=True) if act_order else \
        torch.arange(n, device=w.device)
    w, h = w[:, perm], h[perm][:, perm]            # from here on, column j is original column perm[j]
    pos = torch.argsort(perm)                      # original column -> its position j
    h += damp * torch.diag(h).mean() * torch.eye(n, dtype=h.dtype, device=h.device)
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    num_groups = cfg.groups(n)
    scales = torch.zeros(out, num_groups, dtype=torch.float64, device=w.device)
    zeros = torch.zeros(out, num_groups, dtype=torch.float64, device=w.device)
    fixed = [False] * num_groups
    codes = torch.empty(out, n, dtype=torch.uint8, device=w.device)
    qmax = cfg.qmax
    perm_groups = group_of[perm].tolist()
    for b0 in range(0, n, BLOCK):
        b1 = min(b0 + BLOCK, n)
        w1 = w[:, b0:b1].clone()
        err = torch.zeros_like(w1)
        hinv1 = hinv[b0:b1, b0:b1]
        for i in range(b1 - b0):
            g = perm_groups[b0 + i]
            if not fixed[g]:                       # the group's first column: parameters from its
                cols = pos[g * gl:(g + 1) * gl]    # weights as they stand now (none quantized yet)
                inside, later = cols[cols < b1], cols[cols >= b1]
                current = torch.empty(out, len(cols), dtype=w.dtype, device=w.device)
                current[:, cols < b1] = w1[:, inside - b0]
                if len(later):                     # beyond this block: add its pending updates
                    current[:, cols >= b1] = w[:, later] - err[:, :i] @ hinv[b0:b0 + i, later]
                scales[:, g], zeros[:, g] = _params(current, cfg, clip_search)
                fixed[g] = True
            s, z = scales[:, g], zeros[:, g]
            q = (w1[:, i] / s + z).round().clamp(0, qmax)
            codes[:, b0 + i] = q.to(torch.uint8)
            e = (w1[:, i] - (q - z) * s) / hinv1[i, i]
            w1[:, i:] -= e[:, None] * hinv1[i, i:][None, :]
            err[:, i] = e
        w[:, b1:] -= err @ hinv[b0:b1, b1:]
    return codes[:, pos], scales.float(), zeros.float()
