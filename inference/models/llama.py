"""Llama-family decoder (Llama 2/3, Mistral, Qwen2, SmolLM2; with mixture-of-experts MLPs, Mixtral and
Qwen2-MoE: models/moe.py) in plain PyTorch over a paged KV cache.

q/k/v and gate/up projections are fused into one matmul each (fewer, larger ops per step);
loaders concatenate the checkpoint's separate weights. Quantization and tensor parallelism are
transforms applied to this module after construction, not branches inside it.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from inference.models.arch import ModelArch
from inference.models.attention import AttentionMetadata, paged_attention, write_kv
from inference.models.moe import SparseMoeBlock


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.mirror_weight: torch.Tensor | None = None     # set by use_layer_norm_kernel()

    def use_layer_norm_kernel(self) -> None:
        """Compute RMSNorm with LayerNorm's fused kernel (CPU transform, see forward)."""
        self.mirror_weight = torch.cat([self.weight.detach(), torch.ones_like(self.weight.detach())])

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Without residual: norm(x). With residual: (norm(x + residual), x + residual)."""
        if residual is not None:
            x = x + residual
            residual = x
        n = x.shape[-1]
        if self.mirror_weight is None:
            out = F.rms_norm(x, (n,), self.weight, self.eps)
        else:
            # [x, -x] has mean 0 and variance mean(x^2), so LayerNorm of it is RMSNorm of x. On
            # the CPU layer_norm is one fused fp32-accumulating kernel; rms_norm is several ops.
            out = F.layer_norm(torch.cat((x, x.neg()), dim=-1), (2 * n,), self.mirror_weight, None, self.eps)[..., :n]
        return out if residual is None else (out, residual)


def rope_inv_freq(arch: ModelArch) -> torch.Tensor:
    d = arch.head_dim
    inv_freq = 1.0 / (arch.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    scaling = arch.rope_scaling or {}
    kind = scaling.get("rope_type", "default")
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        old_len = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = torch.where(medium, smoothed, scaled)
    return inv_freq.float()


class RotaryEmbedding(nn.Module):
    """Neox-style (rotate-half) RoPE with a precomputed cos/sin table."""

    def __init__(self, arch: ModelArch, max_positions: int):
        super().__init__()
        inv_freq = rope_inv_freq(arch)
        t = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)                                  # [P, D/2]
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def prepare(self, positions: torch.Tensor, dtype: torch.dtype) -> TorchRope:
        """Once per step: [T, 1, D] tables shared by every layer; sin carries rotate-half's sign."""
        cos, sin = self.cos[positions], self.sin[positions]               # [T, D/2]
        return TorchRope(torch.cat((cos, cos), dim=-1).unsqueeze(1).to(dtype),
                         torch.cat((-sin, sin), dim=-1).unsqueeze(1).to(dtype))


class TorchRope:
    """One step's RoPE: apply(x) rotates x [T, H, D] (returns a new tensor)."""

    def __init__(self, cos: torch.Tensor, signed_sin: torch.Tensor):
        self.cos, self.signed_sin = cos, signed_sin

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """x*cos + rotate_half(x)*sin, with rotate_half's negation folded into sin."""
        t, h, d = x.shape
        swapped = x.view(t, h, 2, d // 2).flip(2).view(t, h, d)           # [x2, x1]
        return torch.addcmul(x * self.cos, swapped, self.signed_sin)


class LlamaAttention(nn.Module):
    def __init__(self, arch: ModelArch):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(arch.hidden_size, self.q_size + 2 * self.kv_size, bias=arch.attention_bias)
        self.o_proj = nn.Linear(self.q_size, arch.hidden_size, bias=arch.o_proj_bias)
        self.attn = PagedAttention(self.head_dim ** -0.5)

    def forward(self, x, rope, k_cache, v_cache, meta):
        num_tokens = x.shape[0]
        qkv = self.qkv_proj.forward(x)                                    # [T, (H + 2Hkv) * D]
        # q and k are adjacent: rotate both with one op pair.
        qk = qkv[:, :self.q_size + self.kv_size].view(num_tokens, self.num_heads + self.num_kv_heads, self.head_dim)
        qk = rope.apply(qk)                                               # [T, H + Hkv, D]
        q, k = qk.split((self.num_heads, self.num_kv_heads), dim=1)
        v = qkv[:, self.q_size + self.kv_size:].view(num_tokens, self.num_kv_heads, self.head_dim)
        out = self.attn.forward(q, k, v, k_cache, v_cache, meta)         # [T, H, D]
        return self.o_proj.forward(out.reshape(num_tokens, self.q_size))


class PagedAttention(nn.Module):
    """Writes the step's K/V into the paged cache, then attends (PyTorch reference path)."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        return paged_attention(q, k_cache, v_cache, meta, self.scale)


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, 2I] -> silu(x[:, :I]) * x[:, I:]"""
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


class LlamaMLP(nn.Module):
    def __init__(self, arch: ModelArch):
        super().__init__()
        self.intermediate_size = arch.intermediate_size
        self.gate_up_proj = nn.Linear(arch.hidden_size, 2 * arch.intermediate_size, bias=False)
        self.down_proj = nn.Linear(arch.intermediate_size, arch.hidden_size, bias=False)
        self.act = SiluAndMul()

    def forward(self, x):
        return self.down_proj.forward(self.act.forward(self.gate_up_proj.forward(x)))


# a decoder layer's linear layers (what quantization replaces, and quantized checkpoints fill)
DECODER_LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


class LlamaDecoderLayer(nn.Module):
    def __init__(self, arch: ModelArch, layer: int = 0):
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.self_attn = LlamaAttention(arch)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.mlp = SparseMoeBlock(arch) if arch.is_moe_layer(layer) else LlamaMLP(arch)

    def forward(self, x, residual, rope, k_cache, v_cache, meta):
        # .forward directly: nn.Module.__call__'s hook handling costs ~0.5 ms per decode step here.
        if residual is None:
            residual, x = x, self.input_layernorm.forward(x)
        else:
            x, residual = self.input_layernorm.forward(x, residual)
        x = self.self_attn.forward(x, rope, k_cache, v_cache, meta)
        x, residual = self.post_attention_layernorm.forward(x, residual)
        return self.mlp.forward(x), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, arch: ModelArch, max_positions: int):
        super().__init__()
        self.arch = arch
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(arch, i) for i in range(arch.num_hidden_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.rotary = RotaryEmbedding(arch, max_positions)
        if arch.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta) -> torch.Tensor:
        """input_ids, positions: [T] -> final hidden states [T, hidden]."""
        x = self.embed_tokens(input_ids)                                  # [T, hidden]
        return self.decoder_stack(x, self.rotary.prepare(positions, x.dtype), kv_caches, meta)

    def decoder_stack(self, x: torch.Tensor, rope, kv_caches, meta) -> torch.Tensor:
        """Embedded tokens [T, hidden] through the layers and the final norm."""
        residual = None
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            x, residual = layer.forward(x, residual, rope, k_cache, v_cache, meta)
        x, _ = self.norm(x, residual)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[S, hidden] -> logits [S, vocab] in the model's dtype (only for rows that sample)."""
        if self.lm_head is None:
            return F.linear(hidden, self.embed_tokens.weight)
        return self.lm_head.forward(hidden)
