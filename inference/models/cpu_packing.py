"""CPU transform: re-lay linear weights in oneDNN's blocked format (what Inductor's freezing
does). A matrix-vector product over a packed bf16 weight runs ~2.5x faster than over the plain
[out, in] layout on these CPUs, which is most of batch-1 decode time.

Applied after loading, like every other transform; fp32 models are left plain so exactness tests
compare the same kernels as the reference.

Row buckets: oneDNN builds (JIT-compiles) one primitive per distinct input shape and keeps it in
its primitive cache (1024 entries by default). Each one of these bf16 matmul primitives holds
~565 KB here and costs 3-5 ms to create, and the CPU engine's row count changes every step (the
step's token count, the number of rows that sample), so under steady traffic the cache would grow
by hundreds of MB, one primitive per distinct step size, and once full it evicts and steps wait for
recompiles (found by bench/cpu/soak.py: bench/journal/2026-12-03-docs-history.md).
Rows are padded up to a few sizes per octave instead, so at most 28 sizes up to 512 rows (the
default token budget) ever exist per weight shape: ~80 MB for a model, reached early and then flat.
A padded call costs one extra copy of its input (~10 us) and at most 25% more rows.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

EXACT_ROWS = 8            # up to here rows round to a power of two (memory-bound: padding is ~free)
BUCKETS_PER_OCTAVE = 4    # above it (a power of two): at most 25% padded rows


def padded_rows(num_rows: int) -> int:
    """The row count a packed matmul runs at: 1, 2, 4, 8, then 10, 12, 14, 16, 20, 24, 28, 32, 40...

    Bounds the distinct shapes oneDNN compiles primitives for (see the module docstring)."""
    if num_rows <= EXACT_ROWS:
        return 1 << max(0, num_rows - 1).bit_length()
    step = 1 << (num_rows.bit_length() - BUCKETS_PER_OCTAVE.bit_length())
    return -(-num_rows // step) * step


def cpu_packing_available(dtype: torch.dtype, device: torch.device) -> bool:
    return (device.type == "cpu" and dtype in (torch.bfloat16, torch.float16)
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and _packing_runs(dtype))


@functools.cache
def _packing_runs(dtype: torch.dtype) -> bool:
    """oneDNN's 16-bit packed layout needs AVX-512 (bw/vl/dq) or AVX-NE-CONVERT; on other CPUs
    the reorder raises, and plain nn.Linear layers stay."""
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=dtype), 1)
    except RuntimeError:
        return False
    return True


class PackedLinear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        # Plain attributes, not buffers: the opaque oneDNN layout cannot be moved or saved anyway,
        # and plain attribute reads skip nn.Module.__getattr__ on the hot path.
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)
        self.bias = None if bias is None else bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        num_rows = x.numel() // self.in_features
        padded = padded_rows(num_rows)
        if padded == num_rows:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")
        rows = F.pad(x.reshape(num_rows, self.in_features), (0, 0, 0, padded - num_rows))   # [padded, in]
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed_weight, self.bias, "none", [], "")
        return out[:num_rows].view(*x.shape[:-1], self.out_features)                      # [..., out]


def pack_linear_weights(model: nn.Module) -> None:
    """Replace every nn.Linear (and a tied LM head) with a PackedLinear, in place, and switch
    RMSNorms to LayerNorm's fused kernel (one op instead of several per norm)."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, PackedLinear(child.weight, child.bias))
    for module in model.modules():
        if hasattr(module, "use_layer_norm_kernel"):
            module.use_layer_norm_kernel()
    if getattr(model, "lm_head", False) is None:          # tied embeddings: pack a copy for logits
        model.lm_head = PackedLinear(model.embed_tokens.weight, None)
