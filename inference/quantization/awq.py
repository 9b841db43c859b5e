"""AWQ-style activation-aware scaling (Lin et al., 2023): input channels that carry large
activations matter most, so scale their weight columns up by s (and the inputs down by s) before
round-to-nearest. s = mean|x|^alpha, with alpha picked per layer by a grid search that minimises
the layer's output error on calibration rows. The 1/s on the inputs is folded into whatever
produces them, so the quantized model runs no extra op:

    qkv_proj  <- input_layernorm.weight / s
    gate_up   <- post_attention_layernorm.weight / s
    down_proj <- the up half of gate_up's rows / s     (silu(gate) * up is linear in up)
    o_proj    <- the V rows of qkv_proj / s            (s shared by the query heads of a KV head)

Then, as AutoAWQ does, each group's range is clipped where that lowers the layer's output error
(`search_clip`), before the weights are rounded.
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from inference.models.arch import ModelArch
from inference.quantization.calibration import InputStats
from inference.quantization.config import QuantConfig
from inference.quantization.int_quant import dequantize, grouped, quantize_rtn

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
        s = salience.pow(alpha).clamp(min=1e-4)               # AutoAWQ's floor: no 1/s blow-up in fp16
        s = s / (s.max() * s.min()).sqrt()                    # keep the scales around 1
        codes, sc, z = quantize_rtn(wf * s, cfg)
        wq = dequantize(codes, sc, z, cfg.group_len(w.shape[1]))
        err = ((x / s) @ wq.t() - ref).pow(2).mean().item()
        if err < best[0]:
            best = (err, s, alpha)
    return best[1], best[2]


CLIP_RATIOS = tuple(1 - 0.05 * i for i in range(10))      # shrink a group's range by up to 45%


def search_clip(w: torch.Tensor, x: torch.Tensor, cfg: QuantConfig, max_rows: int = 256) -> torch.Tensor:
    """AutoAWQ's clipping search: per (output row, group), the shrink of the group's [min, max]
    whose round-to-nearest weights best reproduce that group's share of the output on the
    calibration rows x [n, in]. Returns W clipped to the chosen ranges (RTN's min/max then lands
    on them)."""
    out, n_in = w.shape
    gl = cfg.group_len(n_in)
    wg = grouped(w, gl)                                                    # [out, G, gl]
    pad = wg.shape[1] * gl - n_in
    xg = torch.nn.functional.pad(x[:max_rows].float(), (0, pad)).view(x[:max_rows].shape[0], -1, gl)  # [n, G, gl]
    if pad:                                                                # padded columns carry no input
        wg = wg.clone()
        wg.view(out, -1)[:, n_in:] = 0
    ref = torch.einsum("ngk,ogk->nog", xg, wg)
    lo0, hi0 = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
    one = dataclasses.replace(cfg, group_size=-1)
    best_err = torch.full((out, wg.shape[1]), float("inf"), device=w.device)
    best = wg
    for r in CLIP_RATIOS:
        clipped = wg.clamp(lo0 * r, hi0 * r)
        flat = clipped.reshape(-1, gl)                                     # each (row, group) on its own
        codes, sc, z = quantize_rtn(flat, one)
        deq = dequantize(codes, sc, z, gl).view_as(wg)
        err = (torch.einsum("ngk,ogk->nog", xg, deq) - ref).pow(2).sum(0)     # [out, G]
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best = torch.where(better[..., None], clipped, best)
    return best.reshape(out, -1)[:, :n_in].to(w.dtype)


@torch.no_grad()
def apply_awq_scales(layer: nn.Module, arch: ModelArch, stats: dict[str, InputStats],
                     cfg: QuantConfig) -> dict[str, tuple[float, torch.Tensor]]:
    """Search and fold the four scales of one decoder layer (before any of its weights is
    quantized); exact before rounding. Returns linear name -> (alpha, the scale s)."""
    attn, mlp = layer.self_attn, layer.mlp
    q_size, kv_size = attn.q_size, attn.kv_size
    inter = arch.intermediate_size
    group = arch.num_attention_heads // arch.num_key_value_heads
    chosen = {}
    # o_proj first: its 1/s lands in qkv's V rows, which qkv's own search must then see
    s, alpha = search_scale(attn.o_proj.weight, stats["self_attn.o_proj"], cfg,
                            arch.num_key_value_heads, group)
    chosen["self_attn.o_proj"] = (alpha, s)
    attn.o_proj.weight.mul_(s.to(attn.o_proj.weight.dtype))
    v_scale = s.view(arch.num_key_value_heads, group, -1)[:, 0].reshape(-1)     # [Hkv * D]
    v_rows = slice(q_size + kv_size, q_size + 2 * kv_size)
    attn.qkv_proj.weight[v_rows] /= v_scale[:, None].to(attn.qkv_proj.weight.dtype)
    if attn.qkv_proj.bias is not None:
        attn.qkv_proj.bias[v_rows] /= v_scale.to(attn.qkv_proj.bias.dtype)
    s, alpha = search_scale(mlp.down_proj.weight, stats["mlp.down_proj"], cfg)
    chosen["mlp.down_proj"] = (alpha, s)
    mlp.down_proj.weight.mul_(s.to(mlp.down_proj.weight.dtype))
    mlp.gate_up_proj.weight[inter:] /= s[:, None].to(mlp.gate_up_proj.weight.dtype)
    for name, norm in (("self_attn.qkv_proj", layer.input_layernorm),
                       ("mlp.gate_up_proj", layer.post_attention_layernorm)):
        linear = layer.get_submodule(name)
        s, alpha = search_scale(linear.weight, stats[name], cfg)
        chosen[name] = (alpha, s)
        linear.weight.mul_(s.to(linear.weight.dtype))
        norm.weight.div_(s.to(norm.weight.dtype))
    return chosen


@torch.no_grad()
def apply_awq_clip(layer: nn.Module, stats: dict[str, InputStats], cfg: QuantConfig,
                   chosen: dict[str, tuple[float, torch.Tensor]]) -> None:
    """Clip each scaled linear's groups (`search_clip`) on its scaled inputs. Like AutoAWQ, the q
    and k rows are left alone: attention scores are too sensitive to a shrunk range."""
    attn = layer.self_attn
    for name, (_, s) in chosen.items():
        linear = layer.get_submodule(name)
        x = stats[name].sample_rows() / s
        rows = slice(attn.q_size + attn.kv_size, None) if name == "self_attn.qkv_proj" else slice(None)
        linear.weight[rows] = search_clip(linear.weight[rows], x, cfg)
