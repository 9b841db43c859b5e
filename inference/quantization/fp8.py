"""FP8 (e4m3) weights and activations: `LLM(quantization="fp8")`.

Each decoder linear keeps its weight in float8 e4m3 with one scale per output channel; each
forward scales every input row (token) by its own max |x| into e4m3 and multiplies with
`torch._scaled_mm`, which applies both scales to the fp32 accumulator:

    y[m, n] = x_scale[m] * w_scale[n] * sum_k x8[m, k] * w8[n, k]

That is what Hopper's FP8 tensor cores do natively (twice bf16's rate). Decode rows (up to
GEMV_MAX_ROWS) take a weight-only FP8 GEMV instead (inference/kernels/quant_gemv.py `gemv_fp8`: x stays
16-bit, so those rows are slightly more exact than the tensor-core path). GPUs before compute
capability 8.9 have no FP8 matmul: asking for fp8 there is an error before any weight is
touched. On the CPU the same arithmetic runs in fp32 (for quality).
"""
from __future__ import annotations

import torch
from torch import nn

from inference.kernels.fp8_quant import per_token_fp8, per_token_fp8_reference
from inference.kernels.quant_gemv import GEMV_MAX_ROWS, gemv_fp8


def check_fp8_supported(device: torch.device, capability: tuple[int, int] | None = None) -> None:
    """Raise a clear error on a GPU without FP8 matmuls (capability: for tests)."""
    if device.type != "cuda":
        return
    major, minor = capability or torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        name = torch.cuda.get_device_name(device) if capability is None else "this GPU"
        raise ValueError(f"quantization='fp8' needs FP8 tensor cores (compute capability 8.9+: Ada, Hopper); "
                         f"{name} is {major}.{minor}. Use quantization='int8' instead")


class Fp8Linear(nn.Module):
    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w8, w_scale = per_token_fp8_reference(linear.weight.detach())       # [N, K], [N, 1]: per channel
        self.register_buffer("weight_fp8", w8)
        self.register_buffer("weight_scale", w_scale.t().contiguous())      # [1, N]
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        m = rows.shape[0]
        if rows.is_cuda and m <= GEMV_MAX_ROWS and rows.dtype != torch.float32:
            # decode: weight-only FP8 GEMV (x stays 16-bit; streams the codes once)
            y = gemv_fp8(rows, self.weight_fp8, self.weight_scale)
        elif rows.is_cuda:
            # one Triton kernel: per-token scales, e4m3 codes, rows zero-padded to the multiple
            # of 16 that cuBLASLt's FP8 GEMM wants
            x8, x_scale = per_token_fp8(rows.contiguous())                  # [M_pad, K], [M_pad, 1]
            out_dtype = x.dtype if x.dtype != torch.float32 else torch.bfloat16
            y = torch._scaled_mm(x8, self.weight_fp8.t(), scale_a=x_scale, scale_b=self.weight_scale,
                                 out_dtype=out_dtype)[:m].to(x.dtype)
        else:
            # the same arithmetic in fp32 (PyTorch before 2.12 has no row-wise CPU _scaled_mm)
            x8, x_scale = per_token_fp8_reference(rows)                     # [M, K], [M, 1]
            y = ((x8.float() @ self.weight_fp8.float().t()) * x_scale * self.weight_scale).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def gemv_weight(self, dtype: torch.dtype):
        """The e4m3 codes as the fused decode GEMVs take them (gemv_fp8's operands); None with a
        bias or 32-bit activations (the FP8 GEMV wants 16-bit x)."""
        if self.bias is not None or dtype not in (torch.float16, torch.bfloat16):
            return None
        from inference.kernels.quant_gemv import GemvWeight  # imports Triton
        return GemvWeight.e4m3(self.weight_fp8, self.weight_scale)

    def weight_bytes(self) -> int:
        return self.weight_fp8.numel() + 4 * self.weight_scale.numel()


def fp8_quantize_model(model: nn.Module) -> dict:
    """Every decoder linear -> Fp8Linear, in place."""
    from inference.quantization.transform import decoder_linears, replace_module
    linears = decoder_linears(model)
    before = sum(m.weight.numel() * m.weight.element_size() for m in linears.values())
    for name, linear in linears.items():
        replace_module(model, name, Fp8Linear(linear))
    after = sum(m.weight_bytes() for m in model.modules() if isinstance(m, Fp8Linear))
    return {"linear_bytes_before": before, "linear_bytes_after": after}
