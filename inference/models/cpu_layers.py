"""CPU transform: in a bf16 model, the small ops around the matmuls swapped for the one-pass C++
kernels of inference/kernels/cpu_ops.cpp (as `use_triton_kernels` swaps layers on CUDA):

    RMSNorm           -> residual add + RMSNorm in one pass (five PyTorch ops before)
    SiluAndMul        -> one pass instead of silu, mul and a temporary
    RotaryEmbedding   -> hands the fp32 cos / sin tables and positions to the attention
    LlamaAttention    -> RoPE on q and k and the K/V cache write in one pass over the qkv rows;
                         decodes attend straight from the paged cache (no gathered copy of K/V)
    LlamaForCausalLM  -> a step of decodes runs all decoder layers in one C++ call when every layer's
                         linears are GGUF blocks (INFERENCE_CPU_DECODE_STACK=0: layer by layer)

Each kernel's rows depend on their own inputs only (greedy outputs stay batch-invariant). With
another KV-cache dtype (int8, fp8), or where the kernels cannot build, the PyTorch path runs.
"""
from __future__ import annotations

import os

import torch

from inference.kernels.cpu_ops import cpu_ops
from inference.models.attention import attend_prefills
from inference.models.gguf_cpu_linear import BLOCK, GGUFCpuLinear
from inference.models.llama import (
    LlamaAttention,
    LlamaForCausalLM,
    LlamaMLP,
    RMSNorm,
    RotaryEmbedding,
    SiluAndMul,
    TorchRope,
)


class CpuRope:
    """One step's RoPE: the fp32 tables and positions for the kernel; TorchRope's per-token tables
    only if a layer falls back to PyTorch's ops (an int8 / fp8 KV cache)."""

    def __init__(self, rotary: RotaryEmbedding, positions: torch.Tensor, dtype: torch.dtype):
        self.rotary, self.positions, self.dtype = rotary, positions, dtype
        self.cos_table, self.sin_table = rotary.cos, rotary.sin
        self._torch: TorchRope | None = None

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        if self._torch is None:
            self._torch = RotaryEmbedding.prepare(self.rotary, self.positions, self.dtype)
        return self._torch.apply(x)


class CpuRotaryEmbedding(RotaryEmbedding):
    def prepare(self, positions: torch.Tensor, dtype: torch.dtype) -> CpuRope:
        return CpuRope(self, positions, dtype)


class CpuRMSNorm(RMSNorm):
    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if x.dtype != torch.bfloat16 or x.dim() != 2:
            return super().forward(x, residual)
        if residual is not None:
            # the residual stream is kept in fp32 from the first layer on, as llama.cpp keeps it: the
            # embedding (bf16) widens exactly, and each layer's output is added without rounding
            residual = residual.float().contiguous()
        out, total = cpu_ops().add_rms_norm(x.contiguous(), residual, self.weight, self.eps)
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
            if self.head_dim % 16 == 0 and k_cache.shape[1] % 16 == 0:
                # causal over the cache in place; each row's bits do not depend on the chunking, as
                # with invariant_prefill_attention (attend_prefills), which this replaces here
                for chunk in meta.prefills:
                    s, n = chunk.query_start, chunk.query_len
                    out[s:s + n] = ops.paged_prefill_attention(q[s:s + n], k_cache, v_cache, chunk.block_table,
                                                               chunk.context_len, self.attn.scale)
            else:
                attend_prefills(q, k_cache, v_cache, meta, self.attn.scale, out)
        return self.o_proj.forward(out.view(num_tokens, self.q_size))


class CpuLlamaForCausalLM(LlamaForCausalLM):
    """A step of decodes only runs the decoder layers in one C++ call (cpu_ops.cpp decode_layers)
    when every layer qualifies (`decode_stack`); any other step runs the layers one by one. Both
    call the same kernels in the same order: the same bits."""
    # (per layer: its tensors, per layer: its description), built once at load
    decode_stack: tuple[list[list[torch.Tensor]], list[list[int]]] | None = None
    decodes_from_context_lens = True        # with a bf16 KV cache: the runner builds no decode mask

    def forward(self, input_ids, positions, kv_caches, meta):
        if (self.decode_stack is None or meta.num_decodes != input_ids.shape[0] or meta.decode_context_lens is None
                or kv_caches[0][0].dtype != torch.bfloat16):
            return super().forward(input_ids, positions, kv_caches, meta)
        attn = self.layers[0].self_attn
        x, residual = cpu_ops().decode_layers(
            self.embed_tokens(input_ids), *self.decode_stack, [k for k, _ in kv_caches], [v for _, v in kv_caches],
            self.rotary.cos, self.rotary.sin, positions, meta.slot_mapping, meta.decode_block_tables,
            meta.decode_context_lens, attn.num_heads, attn.num_kv_heads, attn.attn.scale, self.norm.eps)
        x, _ = self.norm.forward(x, residual)
        return x


def _decode_stack(model: LlamaForCausalLM) -> tuple[list[list[torch.Tensor]], list[list[int]]] | None:
    """Each layer's tensors and description for decode_layers, or None when a layer does not qualify
    (MoE, linears that are not GGUF blocks of whole 16-row blocks, norms of another eps)."""
    stack, descs = [], []
    eps = model.norm.eps
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears = (attn.qkv_proj, attn.o_proj, getattr(mlp, "gate_up_proj", None), getattr(mlp, "down_proj", None))
        if (not isinstance(mlp, LlamaMLP) or not isinstance(attn, CpuLlamaAttention)
                or not all(isinstance(li, GGUFCpuLinear) and li.out_features % BLOCK == 0 for li in linears)
                or any(n.eps != eps or n.weight.dtype != torch.bfloat16
                       for n in (layer.input_layernorm, layer.post_attention_layernorm))):
            return None
        tensors = [layer.input_layernorm.weight.detach(), layer.post_attention_layernorm.weight.detach()]
        desc: list[int] = []
        for linear in linears:
            t, d = linear.stack_entry()
            tensors += t
            desc += d
        stack.append(tensors)
        descs.append(desc)
    return stack, descs


_SWAPS = {RMSNorm: CpuRMSNorm, SiluAndMul: CpuSiluAndMul, RotaryEmbedding: CpuRotaryEmbedding,
          LlamaAttention: CpuLlamaAttention, LlamaForCausalLM: CpuLlamaForCausalLM}


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
    if isinstance(model, CpuLlamaForCausalLM) and os.environ.get("INFERENCE_CPU_DECODE_STACK", "1") != "0":
        model.decode_stack = _decode_stack(model)

