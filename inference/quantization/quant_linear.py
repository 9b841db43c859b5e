"""A linear layer with integer weights: what the quantization transform puts in place of nn.Linear.

    qweight  uint8 [out, ceil(in / 2)] (4-bit, two codes per byte) or [out, in] (8-bit)
    scales   fp32 [out, G]      zeros  fp32 [out, G]      (G groups along the input dim)

On the CPU, forward dequantizes the weight to the activations' dtype and multiplies; on CUDA it
runs the W8A16 / W4A16 Triton kernel (inference/kernels/quant_matmul.py), which reads the codes directly.
The weight bytes the model holds are the codes plus the group parameters (`weight_bytes`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inference.quantization.config import QuantConfig
from inference.quantization.int_quant import dequantize, pack_int4, unpack_int4


class QuantLinear(nn.Module):
    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, cfg: QuantConfig,
                 bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = codes.shape
        if scales.shape != (self.out_features, cfg.groups(self.in_features)) or zeros.shape != scales.shape:
            raise ValueError(f"QuantLinear: scales {tuple(scales.shape)} / zeros {tuple(zeros.shape)} do not match "
                             f"{self.out_features} x {cfg.groups(self.in_features)} groups")
        self.bits, self.group_len = cfg.bits, cfg.group_len(self.in_features)
        self.register_buffer("qweight", pack_int4(codes) if cfg.bits == 4 else codes.to(torch.uint8))
        # fp16-representable, as both checkpoint formats store them: loaded == quantized in memory
        self.register_buffer("scales", scales.half().float().contiguous())
        self.register_buffer("zeros", zeros.float().contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    def codes(self) -> torch.Tensor:
        """uint8 codes [out, in]."""
        return unpack_int4(self.qweight, self.in_features) if self.bits == 4 else self.qweight

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize(self.codes(), self.scales, self.zeros, self.group_len, dtype)

    use_kernel: bool = False        # tests: the Triton kernel on the CPU too (interpreter)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        if x.is_cuda or self.use_kernel:
            from inference.kernels.quant_matmul import quant_matmul  # imports Triton
            y = quant_matmul(x.reshape(-1, self.in_features), self.qweight, self.scales, self.zeros, self.bits,
                             self.group_len).view(*x.shape[:-1], self.out_features)
            return y if bias is None else y + bias
        return F.linear(x, self.dequantized(x.dtype), bias)

    def gemv_weight(self, dtype: torch.dtype):
        """The codes as the fused decode GEMVs take them (inference/kernels/gemv_fused.py); None with a bias."""
        if self.bias is not None:
            return None
        from inference.kernels.quant_gemv import GemvWeight  # imports Triton
        return GemvWeight(self.qweight, self.scales, self.zeros, self.bits, min(self.group_len, self.in_features))

    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scales, self.zeros))

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, bits={self.bits}, group={self.group_len}"
