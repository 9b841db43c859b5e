"""AWQ-style activation-aware scaling (Lin et al., 2023): input channels that carry large
activations matter most, so scale their weight columns up by s (and the inputs down by s) before
round-to-nearest. s = mean|x|^alpha, with alpha picked per layer by a grid search that minimises
the layer's output error on calibration rows. The 1/s on the inputs is folded into whatever
produces them, so the quantized model runs no extra op:

    qkv_proj  <- input_layernorm.weight / s
    gate_up   <- post_attention_layernorm.weight / s
    down_proj <- the up half of gate_up's rows / s     (silu(gate) * up is linear in up)
    o_proj    <- the V rows of qkv_proj / s            (s shared by the query heads of a KV head)

AutoAWQ's weight-clipping search is not done here; the scales carry the gain.
"""
from __future__ import annotations

import torch
from torch import nn

from inference.models.arch import ModelArch
from inference.quantization.calibration import InputStats
from inference.quantization.config import QuantConfig
from inference.quantization.int_quant import dequantize, quantize_rtn

GRID = 11          # alpha in 0, 0.1, ..., 1.0 (alpha 0 is plain RTN, so AWQ never loses to it)


def search_scale(w: torch.Tensor, stats: InputStats, cfg: QuantConfig, kv_heads: int = 0, groups_of: int = 1,
                 ) -> tuple[torch.Tensor, float]:
    """Best per-input-channel scale s [in] for W [out, in] and the alpha it came from. With
    groups_of > 1 the channels come as [kv_heads, groups_of, D] and s is shared by the
    groups_of query heads of each KV head (o_proj under GQA)."""
    x = stats.sample_rows()                                   # [n, in] fp32
    wf = w.detach().float()
    ref = x @ wf.t()
    salience = stats.mean_abs().clamp(min=1e-8)
    if groups_of > 1:
        shared = salience.view(kv_heads, groups_of, -1).mean(1, keepdim=True)          # [Hkv, 1, D]
        salience = shared.expand(kv_heads, groups_of, shared.shape[-1]).reshape(-1)
    best = (float("inf"), None, 0.0)
    for k in range(GRID):
        alpha = k / (GRID - 1)
        s = salience.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()                    # keep the scales around 1
        codes, sc, z = quantize_rtn(wf * s, cfg)
        wq = dequantize(codes, sc, z, cfg.group_len(w.shape[1]))
        err = ((x / s) @ wq.t() - ref).pow(2).mean().item()
        if err < best[0]:
            best = (err, s, alpha)
    return best[1], best[2]


@torch.no_grad()
def apply_awq_scales(layer: nn.Module, arch: ModelArch, stats: dict[str, InputStats], prefix: str,
                     cfg: QuantConfig) -> dict[str, float]:
    """Search and fold the four scales of one decoder layer (before any of its weights is
    quantized). Returns the alpha chosen per linear."""
    attn, mlp = layer.self_attn, layer.mlp
    q_size, kv_size = attn.q_size, attn.kv_size
    inter = arch.intermediate_size
    group = arch.num_attention_heads // arch.num_key_value_heads
    alphas = {}
    # o_proj first: its 1/s lands in qkv's V rows, which qkv's own search must then see
    s, alphas["o_proj"] = search_scale(attn.o_proj.weight, stats[f"{prefix}.self_attn.o_proj"], cfg,
                                       arch.num_key_value_heads, group)
    attn.o_proj.weight.mul_(s.to(attn.o_proj.weight.dtype))
    v_scale = s.view(arch.num_key_value_heads, group, -1)[:, 0].reshape(-1)     # [Hkv * D]
    v_rows = slice(q_size + kv_size, q_size + 2 * kv_size)
    attn.qkv_proj.weight[v_rows] /= v_scale[:, None].to(attn.qkv_proj.weight.dtype)
    if attn.qkv_proj.bias is not None:
        attn.qkv_proj.bias[v_rows] /= v_scale.to(attn.qkv_proj.bias.dtype)
    s, alphas["down_proj"] = search_scale(mlp.down_proj.weight, stats[f"{prefix}.mlp.down_proj"], cfg)
    mlp.down_proj.weight.mul_(s.to(mlp.down_proj.weight.dtype))
    mlp.gate_up_proj.weight[inter:] /= s[:, None].to(mlp.gate_up_proj.weight.dtype)
    for name, linear, norm in (("qkv_proj", attn.qkv_proj, layer.input_layernorm),
                               ("gate_up_proj", mlp.gate_up_proj, layer.post_attention_layernorm)):
        key = f"{prefix}.self_attn.qkv_proj" if name == "qkv_proj" else f"{prefix}.mlp.gate_up_proj"
        s, alphas[name] = search_scale(linear.weight, stats[key], cfg)
        linear.weight.mul_(s.to(linear.weight.dtype))
        norm.weight.div_(s.to(norm.weight.dtype))
    return alphas
