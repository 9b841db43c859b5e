"""2:4 structured sparsity (experimental): `LLM(quantization="sparse24")`.

In every run of 4 consecutive input weights of a row, the 2 least important are zeroed:

    row  w0 w1 w2 w3 | w4 w5 w6 w7 | ...       importance = |w|           (magnitude, no data)
    keep  .  x  x  . |  x  .  .  x | ...       importance = |w| * ||x_k|| (Wanda: with calibration
                                                                           inputs, ||x_k|| per input channel)

Hopper's sparse tensor cores skip the zeros: on CUDA the pruned weight becomes PyTorch's
semi-structured sparse tensor (half the values plus 2-bit indices, ~0.56x the bf16 bytes) and
F.linear dispatches to its CUTLASS / cuSPARSELt kernels. On the CPU the masked weight stays
dense: the same products, for quality measurements. No retraining, so quality drops: this is a
measured experiment (bench/cpu/quality.py, bench/gpu/quant_gpu.py), not a default.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# PyTorch's semi-structured kernels in bf16/fp16: rows a multiple of 32, columns of 64
SPARSE_MIN_ROWS, SPARSE_MIN_COLS = 32, 64


def mask_2_4(weight: torch.Tensor, input_norms: torch.Tensor | None = None) -> torch.Tensor:
    """bool [N, K]: True where a weight is kept, exactly 2 of every 4 along K.

    input_norms [K]: ||x_k|| over calibration inputs (Wanda's score |w_k| * ||x_k||); None: |w|."""
    n, k = weight.shape
    if k % 4:
        raise ValueError(f"2:4 sparsity: the input dim must be a multiple of 4, got {k}")
    score = weight.detach().float().abs()
    if input_norms is not None:
        if input_norms.shape != (k,):
            raise ValueError(f"2:4 sparsity: input_norms must be [{k}], got {tuple(input_norms.shape)}")
        score = score * input_norms.float().to(score.device)[None, :]
    keep = score.view(n, k // 4, 4).topk(2, dim=-1).indices                # [N, K/4, 2]
    mask = torch.zeros(n, k // 4, 4, dtype=torch.bool, device=weight.device)
    mask.scatter_(-1, keep, True)
    return mask.view(n, k)


class SparseLinear(nn.Module):
    """A decoder linear with a 2:4-pruned weight (semi-structured sparse on CUDA)."""

    def __init__(self, linear: nn.Linear, input_norms: torch.Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach()
        pruned = w * mask_2_4(w, input_norms)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        if w.is_cuda:
            if w.dtype not in (torch.bfloat16, torch.float16):
                raise ValueError(f"2:4 sparsity on CUDA needs bf16 or fp16 weights, got {w.dtype}")
            if self.out_features % SPARSE_MIN_ROWS or self.in_features % SPARSE_MIN_COLS:
                raise ValueError(f"2:4 sparsity on CUDA: a [{self.out_features}, {self.in_features}] weight is not "
                                 f"a multiple of [{SPARSE_MIN_ROWS}, {SPARSE_MIN_COLS}]")
            from torch.sparse import to_sparse_semi_structured
            self.weight = nn.Parameter(to_sparse_semi_structured(pruned.contiguous()), requires_grad=False)
        else:
            self.weight = nn.Parameter(pruned, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        y = F.linear(rows, self.weight, None if self.bias is None else self.bias.to(x.dtype))
        # the sparse kernels compute (W x^T)^T: a transposed view; the layers after want rows
        return y.contiguous().view(*x.shape[:-1], self.out_features)

    def weight_bytes(self) -> int:
        """The compressed form: on CUDA what it holds; on the CPU what it would hold in 16 bits
        (half the values, 2 bits of position per kept value)."""
        w = self.weight
        if w.is_cuda:
            return sum(t.numel() * t.element_size() for t in (w.packed, w.meta) if t is not None)
        return w.numel() + w.numel() // 8

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, 2:4"


@torch.no_grad()
def sparsify_model(model: nn.Module, windows: list[list[int]] | None = None) -> dict:
    """Every decoder linear -> SparseLinear, in place. windows (calibration token lists): Wanda's
    scores, one layer at a time on the pruned layers' outputs; None: magnitude pruning."""
    from inference.models.llama import DECODER_LINEARS
    from inference.quantization.calibration import LayerwiseCalibration
    from inference.quantization.transform import decoder_linears, replace_module
    before = sum(m.weight.numel() * 2 for m in decoder_linears(model).values())     # as bf16
    cal = LayerwiseCalibration(model, windows) if windows else None
    for layer in model.layers:
        stats = cal.stats(layer, list(DECODER_LINEARS), with_hessian=True, sample_rows=0) if cal else None
        for name in DECODER_LINEARS:
            norms = stats[name].xtx.diagonal().float().clamp(min=0).sqrt() if stats else None    # ||x_k||
            replace_module(layer, name, SparseLinear(layer.get_submodule(name), norms))
        if cal is not None:
            cal.advance(layer)
    after = sum(m.weight_bytes() for m in model.modules() if isinstance(m, SparseLinear))
    return {"linear_bytes_before": before, "linear_bytes_after": after}
