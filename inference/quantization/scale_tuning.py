"""End-to-end tuning of a quantized model's group scales (the quantization-parameter step of
EfficientQAT, Chen et al., 2024): after GPTQ / AWQ has chosen every code and zero point, those
stay fixed and each group's scale s = s0 * exp(theta) is trained, all layers at once, so that
the quantized model's next-token distributions match the unquantized model's on the
calibration windows (KL divergence, Adam, cosine learning rate, one window a step).

Layer-wise methods minimise each linear's own output error; the scales GPTQ picks are already
within ~1% of the least-squares optimum for that error given its codes (measured on SmolLM2).
What they cannot see is how errors compound through the layers and what the LM head makes of
them: that is what this step trains against. The result is an ordinary checkpoint (fp16 scales,
integer codes and zeros, the same format), so loaders and kernels see nothing new.

On SmolLM2-135M, one epoch of it is what brings int4 AWQ + GPTQ act-order at group 128 within the
5% perplexity target (bench/cpu/quality.py; docs/benchmarks.md).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from inference.quantization.calibration import causal_hidden
from inference.quantization.int_quant import dequantize, expand
from inference.quantization.quant_linear import QuantLinear

LEARNING_RATE = 1e-3       # on theta: a step moves a scale by ~0.1%


class _ScaledCodes(torch.autograd.Function):
    """y = x W^T (+ bias) with W = s * (q - z) rebuilt from the codes, differentiable in the scales
    s [out, G] only. Saves x and the scales, never a dense W: a backward rebuilds W for one
    linear at a time (autograd through `dequantize` would keep three [out, in] fp32 tensors a
    linear alive for the whole model until the backward)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scales: torch.Tensor, m: QuantLinear) -> torch.Tensor:
        ctx.m = m
        ctx.save_for_backward(x, scales)
        return F.linear(x, dequantize(m.codes(), scales, m.zeros, m.group_len, x.dtype),
                        None if m.bias is None else m.bias.to(x.dtype))

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        x, scales = ctx.saved_tensors
        m = ctx.m
        gy = grad_y.reshape(-1, m.out_features)
        # W = s * (q - z): the unit weight (q - z) once, then dL/ds[o, g] = the sum over group g's
        # columns i of dL/dW[o, i] * (q[o, i] - z[o, g])
        unit = dequantize(m.codes(), torch.ones_like(scales), m.zeros, m.group_len, torch.float32)
        grad_x = (gy @ (unit * expand(scales, m.group_len, m.in_features)).to(gy.dtype)).view_as(x)
        grad_w = gy.float().t() @ x.reshape(-1, m.in_features).float()              # [out, in]
        gl = m.group_len
        per_col = F.pad(grad_w * unit, (0, -m.in_features % gl))                     # zeros: no weight
        grad_s = per_col.view(m.out_features, -1, gl).sum(-1)
        return grad_x, grad_s.to(scales.dtype), None


@torch.no_grad()
def teacher_hidden(model: nn.Module, windows: list[list[int]]) -> list[torch.Tensor]:
    """The unquantized model's final hidden states [T, hidden] for each window (taken before
    quantizing; the LM head, which stays unquantized, turns them into the target distributions)."""
    return [causal_hidden(model, w) for w in windows]


@torch.enable_grad()
def tune_scales(model: nn.Module, windows: list[list[int]], teacher: list[torch.Tensor], epochs: int,
                lr: float = LEARNING_RATE, progress: bool = True, seed: int = 0) -> dict:
    """Tune every QuantLinear's scales in place (the model's other parameters and their
    requires_grad flags are left as they were; an error or a diverged run keeps the untuned
    scales). Returns the mean training KL of the first and the last epoch."""
    if type(epochs) is not int or epochs < 1:
        raise ValueError(f"scale tuning: epochs must be an integer >= 1, got {epochs!r}")
    if len(teacher) != len(windows) or not windows:
        raise ValueError(f"scale tuning: {len(windows)} windows but {len(teacher)} teacher outputs")
    linears = [m for m in model.modules() if isinstance(m, QuantLinear)]
    if not linears:
        raise ValueError("scale tuning: the model has no quantized linears")
    theta = {m: nn.Parameter(torch.zeros_like(m.scales)) for m in linears}
    frozen = [(p, p.requires_grad) for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    for m in linears:                              # the layers call .forward directly (no hooks)
        m.forward = (lambda x, m=m: _ScaledCodes.apply(x, m.scales * theta[m].exp(), m))
    steps = epochs * len(windows)
    opt = torch.optim.Adam(theta.values(), lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    order = torch.Generator().manual_seed(seed)
    epoch_kl = []
    bar = tqdm(total=steps, desc="Tuning scales", unit="window", disable=not progress, leave=False)
    done = False
    try:
        for _ in range(epochs):
            total = 0.0
            for i in torch.randperm(len(windows), generator=order).tolist():
                with torch.no_grad():
                    target = model.compute_logits(teacher[i]).float().log_softmax(-1)
                logp = model.compute_logits(causal_hidden(model, windows[i])).float().log_softmax(-1)
                loss = (target.exp() * (target - logp)).sum(-1).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                schedule.step()
                total += loss.item()
                bar.update()
            epoch_kl.append(total / len(windows))
        done = all(bool(theta[m].isfinite().all()) for m in linears)
    finally:
        bar.close()
        with torch.no_grad():
            for m in linears:
                del m.forward
                if done:                           # fp16-representable, as the checkpoint stores them
                    m.scales.copy_((m.scales * theta[m].exp()).half().float())
        for p, flag in frozen:
            p.requires_grad_(flag)
    if not done:
        raise ValueError(f"scale tuning diverged (non-finite scales) at lr {lr}; the untuned scales are kept")
    return {"first_epoch_kl": epoch_kl[0], "last_epoch_kl": epoch_kl[-1]}
