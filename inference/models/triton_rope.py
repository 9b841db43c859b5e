"""One step's RoPE on the kernel path, shared by the Triton layers and the fused decode forward
(which checks for it to know the step runs on kernels)."""
from __future__ import annotations

import torch

from inference.kernels.rotary import rotary_embedding


class TritonRope:
    """One step's RoPE: apply(x) rotates x [T, H, D] in place (x may view the fused qkv output)."""

    def __init__(self, positions: torch.Tensor, cos_sin: torch.Tensor):
        self.positions, self.cos_sin = positions, cos_sin

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return rotary_embedding(self.positions, x, self.cos_sin)
