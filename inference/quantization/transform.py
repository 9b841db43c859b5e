"""The quantization transform: every decoder linear of a built model becomes a QuantLinear, in
place (the model file stays plain, as with CPU packing and the Triton layer swap). The embedding
table, the final norm and the LM head stay in the model's dtype, as in GPTQ and AWQ checkpoints.

Apply it before `pack_linear_weights` (CPU) or `use_triton_kernels` (CUDA): AWQ rewrites norm
weights, and those transforms read them.
"""
from __future__ import annotations

import torch
from torch import nn
from tqdm.auto import tqdm

from inference.models.llama import DECODER_LINEARS, LlamaForCausalLM
from inference.quantization.awq import apply_awq_clip, apply_awq_scales
from inference.quantization.calibration import LayerwiseCalibration
from inference.quantization.config import QuantConfig
from inference.quantization.gptq import gptq_quantize
from inference.quantization.int_quant import quantize_rtn
from inference.quantization.quant_linear import QuantLinear
from inference.quantization.scale_tuning import teacher_hidden, tune_scales

SAMPLE_ROWS = 512           # calibration rows AWQ's search evaluates each candidate scale on


def decoder_linears(model: LlamaForCausalLM) -> dict[str, nn.Linear]:
    """'layers.{i}.{DECODER_LINEARS[j]}' -> the nn.Linear."""
    out = {}
    for i, layer in enumerate(model.layers):
        for name in DECODER_LINEARS:
            module = layer.get_submodule(name)
            if not isinstance(module, nn.Linear):
                raise ValueError(f"quantize: layers.{i}.{name} is a {type(module).__name__}, not a plain "
                                 "nn.Linear (quantize before any other transform)")
            out[f"layers.{i}.{name}"] = module
    return out


def replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, new)


@torch.no_grad()
def quantize_model(model: LlamaForCausalLM, cfg: QuantConfig, windows: list[list[int]] | None = None,
                   progress: bool = True) -> dict:
    """Quantize in place. rtn needs no data; gptq and awq calibrate on `windows` (token lists),
    one decoder layer at a time: gptq on the outputs of the layers already quantized, awq on
    the unquantized ones; with cfg.tune_epochs the scales are then tuned end to end against the
    unquantized model's outputs on the same windows. Returns a summary (bytes before/after, AWQ
    alphas, the tuning's training KL)."""
    if model.arch.num_experts:
        if cfg.tune_epochs:
            raise ValueError("quantize: scale tuning (tune_epochs) is for dense models; this one has experts")
        from inference.quantization.moe_experts import quantize_moe_model
        return quantize_moe_model(model, cfg)
    linears = decoder_linears(model)
    if cfg.method != "rtn" and not windows:
        raise ValueError(f"quantize: {cfg.method} needs calibration windows")
    bytes_before = sum(m.weight.numel() * m.weight.element_size() for m in linears.values())
    teacher = teacher_hidden(model, windows) if cfg.tune_epochs else None
    cal = LayerwiseCalibration(model, windows) if cfg.method != "rtn" else None
    alphas = {}
    desc = f"Quantizing ({cfg.method}, {cfg.bits}-bit)"
    for i, layer in enumerate(tqdm(model.layers, desc=desc, unit="layer", disable=not progress, leave=False)):
        if cfg.method == "gptq":
            chosen_alphas = _gptq_layer(layer, model.arch, cal, cfg)
            if chosen_alphas:
                alphas[i] = chosen_alphas
            continue
        stats = None
        if cal is not None:
            stats = cal.stats(layer, list(DECODER_LINEARS), with_hessian=False, sample_rows=SAMPLE_ROWS)
        if cfg.method == "awq":
            # AWQ (as AutoAWQ) feeds the next layer the unquantized layer's outputs; GPTQ (above)
            # the quantized one's, so each layer corrects for the error before it
            cal.advance(layer)
            chosen = apply_awq_scales(layer, model.arch, stats, cfg)
            apply_awq_clip(layer, stats, cfg, chosen)
            alphas[i] = {name: alpha for name, (alpha, _) in chosen.items()}
        for name in DECODER_LINEARS:
            linear = layer.get_submodule(name)
            codes, scales, zeros = quantize_rtn(linear.weight, cfg)
            replace_module(layer, name, QuantLinear(codes, scales, zeros, cfg, linear.bias))
    cal = linears = None                           # the layer-wise states and the replaced fp linears
    tuning = tune_scales(model, windows, teacher, cfg.tune_epochs, progress=progress) if teacher else {}
    bytes_after = sum(m.weight_bytes() for m in model.modules() if isinstance(m, QuantLinear))
    return {"linear_bytes_before": bytes_before, "linear_bytes_after": bytes_after, "awq_alphas": alphas,
            "scale_tuning": tuning}


def _gptq_layer(layer: nn.Module, arch, cal: LayerwiseCalibration, cfg: QuantConfig) -> dict:
    """GPTQ on one decoder layer; the next layer's inputs then come from the quantized layer.
    With cfg.awq_scales, AWQ's scales are searched and folded first (on the same pass's sample
    rows), and each Hessian follows the scaling: x -> x / s makes H -> H / (s s^T). Returns the
    AWQ alphas, if any."""
    stats = cal.stats(layer, list(DECODER_LINEARS), with_hessian=True,
                      sample_rows=SAMPLE_ROWS if cfg.awq_scales else 0)
    hessians = {name: stats[name].hessian for name in DECODER_LINEARS}
    alphas = {}
    if cfg.awq_scales:
        chosen = apply_awq_scales(layer, arch, stats, QuantConfig("awq", cfg.bits, cfg.group_size))
        for name, (alpha, s) in chosen.items():
            s = s.double()
            hessians[name] = hessians[name] / (s[:, None] * s[None, :])
            alphas[name] = alpha
    for name in DECODER_LINEARS:
        linear = layer.get_submodule(name)
        codes, scales, zeros = gptq_quantize(linear.weight, hessians[name], cfg)
        replace_module(layer, name, QuantLinear(codes, scales, zeros, cfg, linear.bias))
    cal.advance(layer)
    return alphas
