"""The batch-1 decode step as six kernels a dense layer (inference/kernels/gemv_fused.py):

    qkv GEMV (norm scale, RoPE, KV write) -> decode attention (split + merge)
    -> o GEMV (+ residual, sum of squares) -> gate_up GEMV (norm scale, SiLU-and-mul)
    -> down GEMV (+ residual, sum of squares)

instead of ten (two residual-add + RMSNorm kernels, RoPE + KV write and SiLU-and-mul on their
own). It needs unit norm weights (inference/models/norm_folding.py folds them into the linears at
load) and linears the GEMV streams (`gemv_weight`: plain, int8 / int4, fp8). Any other step, or a
model where a layer does not qualify (MoE, biases, TP shards, a pre-quantized checkpoint's norms),
runs the ordinary forward; `fused_decode_plan` says which.
"""
from __future__ import annotations

import torch

from inference.kernels.gemv_fused import (
    STATS_LANES,
    GemvWeight,
    RopeKV,
    gemv_residual,
    gemv_rope_kv,
    gemv_silu,
    norm_stats,
)
from inference.kernels.rms_norm import rms_norm
from inference.kernels.rotary_kv_cache import supports_cache
from inference.models.llama import LlamaForCausalLM, LlamaMLP
from inference.models.triton_rope import TritonRope


def _gemv(linear, dtype: torch.dtype) -> GemvWeight | None:
    fn = getattr(linear, "gemv_weight", None)
    return fn(dtype) if fn is not None else None


def fused_decode_plan(model: LlamaForCausalLM) -> bool:
    """Whether every layer can take the fused batch-1 path (checked once, after the transforms)."""
    dtype = model.embed_tokens.weight.dtype
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if not isinstance(mlp, LlamaMLP):
            return False
        linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        if any(_gemv(linear, dtype) is None for linear in linears):
            return False
        if not all(bool((norm.weight == 1).all()) for norm in (layer.input_layernorm, layer.post_attention_layernorm)):
            return False
    return len(model.layers) > 0


def takes_fused_decode(input_ids: torch.Tensor, kv_caches, rope) -> bool:
    """This step: one token, a cache the fused KV write handles, the kernel RoPE."""
    return (input_ids.shape[0] == 1 and bool(kv_caches) and supports_cache(kv_caches[0][0])
            and isinstance(rope, TritonRope))


def fused_decode_forward(model: LlamaForCausalLM, h: torch.Tensor, rope, kv_caches, meta) -> torch.Tensor:
    """h [1, hidden]: the embedded token (updated in place as the residual stream) -> the final
    norm's output [1, hidden]."""
    dtype = h.dtype
    layers = model.layers
    stats = torch.empty((2 * len(layers) + 1, h.shape[0], STATS_LANES), dtype=torch.float64, device=h.device)
    norm_stats(h, stats)
    rows = rope.cos_sin.index_select(0, rope.positions)                      # [1, D]: every layer's
    for i, (layer, (k_cache, v_cache)) in enumerate(zip(layers, kv_caches)):
        attn, mlp = layer.self_attn, layer.mlp
        rope_kv = RopeKV(rope.positions, rope.cos_sin, k_cache, v_cache, meta.slot_mapping,
                         attn.num_heads, attn.num_kv_heads, rows)
        qkv = gemv_rope_kv(h, _gemv(attn.qkv_proj, dtype), stats[2 * i], layer.input_layernorm.eps, rope_kv)
        q, k, v = qkv.view(1, -1, attn.head_dim).split((attn.num_heads, attn.num_kv_heads, attn.num_kv_heads), dim=1)
        out = attn.attn.attend(q, k, v, k_cache, v_cache, meta)                  # [1, H, D]
        gemv_residual(out.reshape(1, attn.q_size), _gemv(attn.o_proj, dtype), h, stats[2 * i + 1])
        act = gemv_silu(h, _gemv(mlp.gate_up_proj, dtype), stats[2 * i + 1], layer.post_attention_layernorm.eps)
        gemv_residual(act, _gemv(mlp.down_proj, dtype), h, stats[2 * i + 2])
    return rms_norm(h, model.norm.weight, model.norm.eps)
