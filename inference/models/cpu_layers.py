"""CPU transform: in a bf16 model, the small ops around the matmuls swapped for the one-pass C++
kernels of inference/kernels/cpu_ops.cpp (as `use_triton_kernels` swaps layers on CUDA):

    RMSNorm           -> residual add + RMSNorm in one pass (five PyTorch ops before)
    SiluAndMul        -> one pass instead of silu, mul and a temporary
    RotaryEmbedding   -> hands the fp32 cos / sin tables and positions to the attention
    LlamaAttention    -> RoPE on q and k and the K/V cache write in one pass over the qkv rows;
                         decodes attend straight from the paged cache (no gathered copy of K/V)

Each kernel's rows depend on their own inputs only (greedy outputs stay batch-invariant). With
another KV-cache dtype (int8, fp8), or where the kernels cannot build, the PyTorch path runs.
"""
from __future__ import annotations

import torch

from inference.kernels.cpu_ops import cpu_ops
from inference.models.attention import attend_prefills
from inference.models.llama import LlamaAttention, RMSNorm, RotaryEmbedding, SiluAndMul, TorchRope


class CpuRope(TorchRope):
    """One step's RoPE: the tables and positions for the kernel, TorchRope's for the fallback."""

    def __init__(self, rotary: RotaryEmbedding, positions: torch.Tensor, dtype: torch.dtype):
        base = RotaryEmbedding.prepare(rotary, positions, dtype)
        super().__init__(base.cos, base.signed_sin)
        self.positions, self.cos_table, self.sin_table = positions, rotary.cos, rotary.sin


class CpuRotaryEmbedding(RotaryEmbedding):
    def prepare(self, positions: torch.Tensor, dtype: torch.dtype) -> CpuRope:
        return CpuRope(self, positions, dtype)


class CpuRMSNorm(RMSNorm):
    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if x.dtype != torch.bfloat16 or x.dim() != 2:
            return super().forward(x, residual)
        out, total = cpu_ops().add_rms_norm(x.contiguous(), None if residual is None else residual.contiguous(),
                                            self.weight, self.eps)
        return out if residual is None else (out, total)


class CpuSiluAndMul(SiluAndMul):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.bfloat16 or x.dim() != 2:
            return super().forward(x)
        return cpu_ops().silu_mul(x.contiguous())


class CpuLlamaAttention(LlamaAttention):
    def forward(self, x, rope, k_cache, v_cache, meta):
        if not (isinstance(rope, CpuRope) and k_cache.dtype == torch.bfloat16 and x.dtype == torch.bfloat16):
            return super().forward(x, rope, k_cache, v_cache, meta)
        ops = cpu_ops()
        num_tokens = x.shape[0]
        qkv = self.qkv_proj.forward(x).contiguous()                      # [T, (H + 2Hkv) * D]
        q = ops.rope_write_kv(qkv, rope.cos_table, rope.sin_table, rope.positions, k_cache, v_cache,
                              meta.slot_mapping, self.num_heads, self.num_kv_heads)      # [T, H, D]
        nd = meta.num_decodes
        if nd == num_tokens:
            out = ops.paged_decode_attention(q, k_cache, v_cache, meta.decode_block_tables,
                                             meta.decode_context_lens, self.attn.scale)
        else:
            out = torch.empty_like(q)
            if nd:
                out[:nd] = ops.paged_decode_attention(q[:nd], k_cache, v_cache, meta.decode_block_tables,
                                                      meta.decode_context_lens, self.attn.scale)
            attend_prefills(q, k_cache, v_cache, meta, self.attn.scale, out)
        return self.o_proj.forward(out.view(num_tokens, self.q_size))


_SWAPS = {RMSNorm: CpuRMSNorm, SiluAndMul: CpuSiluAndMul, RotaryEmbedding: CpuRotaryEmbedding,
          LlamaAttention: CpuLlamaAttention}


def cpu_kernels_available(dtype: torch.dtype, device: torch.device) -> bool:
    return device.type == "cpu" and dtype == torch.bfloat16 and cpu_ops() is not None


def use_cpu_kernels(model: torch.nn.Module) -> None:
    """Swap layers in place (the classes only override forward / prepare; weights stay put).

    The last transform at load: it also copies each decoder layer's submodules into the
    instances' own attributes, so the step's ~400 submodule reads skip nn.Module.__getattr__
    (~0.3 ms a token at batch 1). Layers swapped after this would not be seen by the forward."""
    for module in model.modules():
        swap = _SWAPS.get(type(module))
        if swap is not None:
            module.__class__ = swap
    for layer in getattr(model, "layers", []):
        for module in layer.modules():
            module.__dict__.update(module._modules)

