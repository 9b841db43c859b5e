"""GPTQ (Frantar et al., 2022): quantize a weight column by column and push each column's rounding
error onto the columns not yet quantized, weighted by the inverse Hessian of the layer's inputs
(H = X^T X over calibration rows), so the layer's outputs on those inputs move as little as
possible. Columns are processed in blocks of 128 (the lazy batch update), groups get their
scale and zero point from the already-updated weights when their first column comes up, no
act-order (the on-disk format then needs no permutation).
"""
from __future__ import annotations

import dataclasses

import torch

from inference.quantization.config import QuantConfig
from inference.quantization.int_quant import group_params

BLOCK = 128


def gptq_quantize(w: torch.Tensor, hessian: torch.Tensor, cfg: QuantConfig, damp: float = 0.01
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """W [out, in], H [in, in] -> (codes uint8 [out, in], scales [out, G], zeros [out, G])."""
    out, n = w.shape
    if hessian.shape != (n, n):
        raise ValueError(f"gptq: Hessian {tuple(hessian.shape)} does not match {n} input features")
    w = w.detach().double().clone()
    h = hessian.detach().double().clone()
    dead = torch.diag(h) == 0                      # inputs that never fired: any value is exact
    h[dead, dead] = 1
    w[:, dead] = 0
    h += damp * torch.diag(h).mean() * torch.eye(n, dtype=h.dtype, device=h.device)
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    gl = cfg.group_len(n)
    one_group = dataclasses.replace(cfg, group_size=-1)
    num_groups = cfg.groups(n)
    scales = torch.empty(out, num_groups, dtype=torch.float64, device=w.device)
    zeros = torch.empty(out, num_groups, dtype=torch.float64, device=w.device)
    codes = torch.empty(out, n, dtype=torch.uint8, device=w.device)
    qmax = cfg.qmax
    for b0 in range(0, n, BLOCK):
        b1 = min(b0 + BLOCK, n)
        w1 = w[:, b0:b1].clone()
        err = torch.zeros_like(w1)
        hinv1 = hinv[b0:b1, b0:b1]
        for i in range(b1 - b0):
            col = b0 + i
            if col % gl == 0:                      # a new group: parameters from the updated weights
                g = col // gl
                block = torch.cat((w1[:, i:], w[:, b1:]), dim=1)[:, :gl]
                s, z = group_params(block, one_group)
                scales[:, g], zeros[:, g] = s[:, 0], z[:, 0]
            s, z = scales[:, col // gl], zeros[:, col // gl]
            q = (w1[:, i] / s + z).round().clamp(0, qmax)
            codes[:, col] = q.to(torch.uint8)
            e = (w1[:, i] - (q - z) * s) / hinv1[i, i]
            w1[:, i:] -= e[:, None] * hinv1[i, i:][None, :]
            err[:, i] = e
        w[:, b1:] -= err @ hinv[b0:b1, b1:]
    return codes, scales.float(), zeros.float()
