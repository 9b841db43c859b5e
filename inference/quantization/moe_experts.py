"""Weight-only INT8 / INT4 (round-to-nearest) for mixture-of-experts models: each expert's
stacked weight becomes one QuantLinear per expert; attention, dense and shared-expert linears
become QuantLinears as in dense models; the router stays in the model's dtype (it is tiny and
its top-k choice is sensitive). On the CPU the experts run through the per-expert path; on CUDA
the fused kernel reads their codes (inference/kernels/fused_moe.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inference.models.moe import SparseMoeBlock
from inference.quantization.config import QuantConfig
from inference.quantization.int_quant import dequantize, quantize_rtn, unpack_int4
from inference.quantization.quant_linear import QuantLinear


class QuantExperts(nn.Module):
    """Stands in for a stacked [E, out, in] expert weight, as codes stacked per expert (the layout
    of QuantLinear, one more leading dim):

        qweight  uint8 [E, out, in] (8-bit) or [E, out, ceil(in / 2)] (4-bit)
        scales, zeros  fp32 [E, out, G]

    `linear(e, x)` is expert e's product (the CPU's per-expert path dequantizes it); the fused GPU
    kernel (inference/kernels/fused_moe.py) reads the codes directly."""

    def __init__(self, stacked: torch.Tensor, cfg: QuantConfig):
        super().__init__()
        self.shape, self.dtype = tuple(stacked.shape), stacked.dtype
        self.bits, self.group_len = cfg.bits, cfg.group_len(stacked.shape[2])
        per_expert = [QuantLinear(*quantize_rtn(stacked[e], cfg), cfg) for e in range(stacked.shape[0])]
        for name in ("qweight", "scales", "zeros"):
            self.register_buffer(name, torch.stack([getattr(q, name) for q in per_expert]).contiguous())

    def linear(self, expert: int, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self[expert].to(x.dtype))

    def __getitem__(self, expert: int) -> torch.Tensor:
        """Expert `expert`'s weight, dequantized to the model's dtype."""
        codes = unpack_int4(self.qweight[expert], self.shape[2]) if self.bits == 4 else self.qweight[expert]
        return dequantize(codes, self.scales[expert], self.zeros[expert], self.group_len, self.dtype)

    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scales, self.zeros))


def moe_linear_names(model: nn.Module) -> list[str]:
    """'layers.{i}.{name}' of every plain linear a MoE model's quantization replaces."""
    names = []
    for i, layer in enumerate(model.layers):
        own = ["self_attn.qkv_proj", "self_attn.o_proj"]
        if isinstance(layer.mlp, SparseMoeBlock):
            if layer.mlp.shared_expert is not None:
                own += ["mlp.shared_expert.gate_up_proj", "mlp.shared_expert.down_proj"]
        else:
            own += ["mlp.gate_up_proj", "mlp.down_proj"]
        names += [f"layers.{i}.{n}" for n in own]
    return names


@torch.no_grad()
def quantize_moe_model(model: nn.Module, cfg: QuantConfig) -> dict:
    if cfg.method != "rtn":
        raise ValueError(f"quantize: {cfg.method} calibration is not supported for mixture-of-experts models; "
                         "use rtn (quantization='int8' or 'int4')")
    blocks = [layer.mlp for layer in model.layers if isinstance(layer.mlp, SparseMoeBlock)]
    before = sum(model.get_submodule(n).weight.numel() * model.get_submodule(n).weight.element_size()
                 for n in moe_linear_names(model))
    before += sum(p.numel() * p.element_size() for b in blocks for p in (b.w13, b.w2))
    for name in moe_linear_names(model):
        linear = model.get_submodule(name)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, QuantLinear(*quantize_rtn(linear.weight, cfg), cfg, linear.bias))
    for block in blocks:
        for name in ("w13", "w2"):
            stacked = block._parameters.pop(name).data       # the parameter gives way to a submodule
            setattr(block, name, QuantExperts(stacked, cfg))
    after = sum(m.weight_bytes() for m in model.modules() if isinstance(m, (QuantLinear, QuantExperts)))
    return {"linear_bytes_before": before, "linear_bytes_after": after, "awq_alphas": {}}
