"""RMSNorm weights folded into the linear layers that read the norm (CUDA, at load):

    (rms_norm(x) * g) @ W^T  ==  rms_norm(x) @ (W * g)^T

so a dense layer's two norms get weight 1 and the batch-1 decode path can apply each norm as one
scalar per row in the GEMV that follows it (inference/kernels/gemv_fused.py, inference/models/fused_decode.py).
Every other step runs the unit-weight norm and the same folded weights: the same function, one
bf16 rounding of W * g instead of one of x * g. Only unquantized CUDA loads fold
(inference/loader/model_loader.py `load_model`): codes taken of W * g lose quality (SmolLM2 at int8
and int4, bench/cpu/quality.py "+fold": bench/journal/2026-12-02-what-is-left.md), so
quantized models keep their norms (and take the fused path only where those are 1 already, as in
random-weight models).
"""
from __future__ import annotations

import torch
from torch import nn

from inference.models.llama import LlamaForCausalLM, LlamaMLP


def _foldable(linear: nn.Module) -> bool:
    return isinstance(linear, nn.Linear) and linear.bias is None      # plain (or its Triton class), not quantized


@torch.no_grad()
def fold_norm_weights(model: LlamaForCausalLM) -> int:
    """Fold each dense layer's input / post-attention norm weights into qkv_proj / gate_up_proj
    (layers whose linears are plain and bias-free; MoE layers' routers read the norm as well and
    keep theirs). Returns the number of layers folded."""
    folded = 0
    for layer in model.layers:
        pairs = ((layer.input_layernorm, layer.self_attn.qkv_proj),
                 (layer.post_attention_layernorm, getattr(layer.mlp, "gate_up_proj", None)))
        if not isinstance(layer.mlp, LlamaMLP) or not all(_foldable(linear) for _, linear in pairs):
            continue
        for norm, linear in pairs:
            w = linear.weight
            w.copy_((w.float() * norm.weight.float()[None, :]).to(w.dtype))
            norm.weight.fill_(1.0)
        folded += 1
    return folded
