"""The runner's side of shifted KV reuse (inference/core/kv_reuse.py): copy cache slots, keys
rotated to their new positions.

Keys sit in the cache already rotated for their position (neox RoPE: the pairs are (i, i + D/2)
with angle pos * inv_freq[i]). Rotations compose, so moving a key by `delta` positions is one
more rotation by delta * inv_freq, done in fp32 and rounded once to the cache's dtype. Values
carry no position and are copied as they are.
"""
from __future__ import annotations

import torch

from inference.core.kv_reuse import KVShift


def supports_kv_shift(k_cache: torch.Tensor, head_dim: int) -> bool:
    """Float caches of 2+ bytes whose rows are the head: int8 rows carry scales, fp8 loses too much."""
    return k_cache.dtype in (torch.bfloat16, torch.float16, torch.float32) and k_cache.shape[-1] == head_dim


def rotation(delta: int, inv_freq: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [D/2] of moving a key by `delta` positions (fp32, angles in fp64)."""
    angle = delta * inv_freq.to(torch.float64)
    return angle.cos().float().to(device), angle.sin().float().to(device)


def rotate(keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """keys [T, H, D] (any float dtype) rotated by a `rotation`, in fp32."""
    k = keys.float()
    half = k.shape[-1] // 2
    x1, x2 = k[..., :half], k[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


@torch.inference_mode()
def apply_kv_shifts(kv_caches: list[tuple[torch.Tensor, torch.Tensor]], shifts: list[KVShift],
                    inv_freq: torch.Tensor) -> None:
    """Run a step's copies in order, every layer (before the step's forward reads them)."""
    if not shifts:
        return
    device = kv_caches[0][0].device
    for shift in shifts:
        src = torch.tensor(shift.src_slots, dtype=torch.long, device=device)
        dst = torch.tensor(shift.dst_slots, dtype=torch.long, device=device)
        cos_sin = rotation(shift.delta, inv_freq, device) if shift.delta else None     # once, not per layer
        for k, v in kv_caches:
            keys, values = k.view(-1, *k.shape[2:]), v.view(-1, *v.shape[2:])
            moved = keys.index_select(0, src)
            if cos_sin is not None:
                moved = rotate(moved, *cos_sin).to(k.dtype)
            keys.index_copy_(0, dst, moved)
            values.index_copy_(0, dst, values.index_select(0, src))
