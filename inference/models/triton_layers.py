"""CUDA transform: the model's PyTorch layers swapped for Triton-kernel ones with the same math.

`use_triton_kernels(model)` is applied by the loader on CUDA (as `pack_linear_weights` is on the
CPU); the model code itself has no device branches. The swapped layers:

    nn.Linear         -> at one row (batch-1 decode), a Triton GEMV that streams the weight faster
                         than cuBLAS does at M=1 (inference/kernels/quant_gemv.py `gemv`); F.linear otherwise
    RMSNorm           -> fused residual-add + RMSNorm (one pass, residual updated in place)
    SiluAndMul        -> one kernel instead of silu, mul and a temporary
    RotaryEmbedding   -> in-place RoPE on the q/k part of the fused qkv output, from positions
    LlamaAttention    -> RoPE and the KV-cache write in one kernel over the qkv rows
    PagedAttention    -> slot-mapped KV write + paged decode (split-K) and varlen prefill kernels
    LlamaForCausalLM  -> at one token, where every layer qualifies, the fused decode layers
                         (inference/models/fused_decode.py: six kernels a layer instead of ten)
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from inference.kernels.activation import silu_and_mul
from inference.kernels.decode_attention import decode_attention
from inference.kernels.kv_cache import write_kv_cache
from inference.kernels.prefill_attention import prefill_attention
from inference.kernels.quant_gemv import GemvWeight, gemv
from inference.kernels.rms_norm import rms_norm
from inference.kernels.rotary_kv_cache import rotary_kv_cache, supports_cache
from inference.models.fused_decode import (
    fused_decode_forward,
    fused_decode_plan,
    takes_fused_decode,
)
from inference.models.llama import (
    LlamaAttention,
    LlamaForCausalLM,
    PagedAttention,
    RMSNorm,
    RotaryEmbedding,
    SiluAndMul,
)
from inference.models.triton_rope import TritonRope


@dataclass
class KernelAttentionMetadata:
    """One step's flat batch for the kernels: decodes first, then prefill chunks."""
    slot_mapping: torch.Tensor                  # [T] int64; -1 = padding row, nothing written
    num_decodes: int = 0
    decode_block_tables: torch.Tensor | None = None   # [num_decodes, width] int32 (row stride may be wider)
    decode_context_lens: torch.Tensor | None = None   # [num_decodes] int32, tokens incl. the new one
    num_splits: int = 1                         # split-K factor of the decode kernel
    prefill_block_tables: torch.Tensor | None = None  # [P, width] int32
    prefill_query_start: torch.Tensor | None = None   # [P + 1] int32, offsets after the decodes
    prefill_context_lens: torch.Tensor | None = None  # [P] int32, cached + new tokens
    max_query_len: int = 0


class TritonLinear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.shape[0] == 1 and self.bias is None and x.dtype == self.weight.dtype:
            return gemv(x, self.weight)                                   # [1, out]
        return F.linear(x, self.weight, self.bias)

    def gemv_weight(self, dtype: torch.dtype) -> GemvWeight | None:
        """The weight as the fused decode GEMVs take it (None: this layer cannot)."""
        if self.bias is not None or self.weight.dtype != dtype or not self.weight.is_contiguous():
            return None
        return GemvWeight.plain(self.weight)


class TritonRMSNorm(RMSNorm):
    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return rms_norm(x, self.weight, self.eps, residual)


class TritonSiluAndMul(SiluAndMul):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(x)


class TritonRotaryEmbedding(RotaryEmbedding):
    cos_sin: torch.Tensor                       # [max_positions, D] fp32: cos half | sin half

    def prepare(self, positions: torch.Tensor, dtype: torch.dtype) -> TritonRope:
        return TritonRope(positions, self.cos_sin)


class TritonLlamaAttention(LlamaAttention):
    def forward(self, x, rope, k_cache, v_cache, meta):
        if not (isinstance(rope, TritonRope) and supports_cache(k_cache)):
            return super().forward(x, rope, k_cache, v_cache, meta)
        num_tokens = x.shape[0]
        qkv = self.qkv_proj.forward(x).view(num_tokens, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
        # q and k rotated in place, rotated k and v into their cache slots: one kernel
        rotary_kv_cache(rope.positions, qkv, rope.cos_sin, k_cache, v_cache, meta.slot_mapping,
                        self.num_heads, self.num_kv_heads)
        q, k, v = qkv.split((self.num_heads, self.num_kv_heads, self.num_kv_heads), dim=1)
        out = self.attn.attend(q, k, v, k_cache, v_cache, meta)            # [T, H, D]
        return self.o_proj.forward(out.reshape(num_tokens, self.q_size))


class TritonPagedAttention(PagedAttention):
    def forward(self, q, k, v, k_cache, v_cache, meta: KernelAttentionMetadata) -> torch.Tensor:
        write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        return self.attend(q, k, v, k_cache, v_cache, meta)

    def attend(self, q, k, v, k_cache, v_cache, meta: KernelAttentionMetadata) -> torch.Tensor:
        """Attention of q [T, H, D] over the cache, whose slots for this step are written already."""
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)          # [T, H, D]
        nd = meta.num_decodes
        if nd:
            decode_attention(q[:nd], k_cache, v_cache, meta.decode_block_tables, meta.decode_context_lens,
                             self.scale, num_splits=meta.num_splits, out=out[:nd])
        if meta.max_query_len:
            # the chunks' own K/V come straight from k/v (views of the qkv output), not the cache;
            # a float8 cache is read back instead, so a prompt sees the same K/V its decodes will
            # (as the reference path and vLLM's fp8 KV do)
            own = k_cache.dtype == k.dtype
            prefill_attention(q[nd:], k_cache, v_cache, meta.prefill_block_tables, meta.prefill_query_start,
                              meta.prefill_context_lens, meta.max_query_len, self.scale, out=out[nd:],
                              k_new=k[nd:] if own else None, v_new=v[nd:] if own else None)
        return out


class TritonLlamaForCausalLM(LlamaForCausalLM):
    fused_decode: bool = False                  # set by use_triton_kernels (fused_decode_plan)

    def forward(self, input_ids, positions, kv_caches, meta):
        if not self.fused_decode:
            return super().forward(input_ids, positions, kv_caches, meta)
        x = self.embed_tokens(input_ids)                                  # [T, hidden]
        rope = self.rotary.prepare(positions, x.dtype)
        if takes_fused_decode(input_ids, kv_caches, rope):
            return fused_decode_forward(self, x, rope, kv_caches, meta)
        return self.decoder_stack(x, rope, kv_caches, meta)


_SWAPS = {nn.Linear: TritonLinear, LlamaForCausalLM: TritonLlamaForCausalLM, RMSNorm: TritonRMSNorm,
          SiluAndMul: TritonSiluAndMul, PagedAttention: TritonPagedAttention,
          RotaryEmbedding: TritonRotaryEmbedding, LlamaAttention: TritonLlamaAttention}


def use_triton_kernels(model: LlamaForCausalLM) -> None:
    """Swap layers in place. The Triton classes only override forward/prepare and keep the same
    parameters, so re-classing each instance keeps every weight where the loader put it."""
    for module in model.modules():
        swap = _SWAPS.get(type(module))
        if swap is not None:
            module.__class__ = swap
    from inference.models.moe import moe_blocks
    for _, block in moe_blocks(model):     # experts: one grouped GEMM pair instead of a loop (graph-safe)
        from inference.kernels.fused_moe import fused_experts
        from inference.kernels.moe_routing import fused_route
        block.experts = fused_experts
        block.use_router_kernel(fused_route)
    rotary = model.rotary
    rotary.cos_sin = torch.cat((rotary.cos, rotary.sin), dim=-1).contiguous()   # [P, D]
    if isinstance(model, TritonLlamaForCausalLM):
        # KERNELS_FUSED_DECODE=0: the ten-kernel layer (an A/B switch for benchmarks, a way out)
        model.fused_decode = os.environ.get("KERNELS_FUSED_DECODE", "1") != "0" and fused_decode_plan(model)
