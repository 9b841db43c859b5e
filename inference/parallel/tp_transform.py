"""The tensor-parallel transform (gpt-fast's tp.py idea): a built Llama model becomes rank r's
shard of it, in place; the model file stays plain.

Two phases, so quantization runs on the shards (shard before quantizing):

1. `shard_model` slices every parameter (`shard_param`) and fixes the head counts; the decoder's
   linear layers stay plain nn.Linear at their usual paths.
2. `install_parallel_layers` (after quantization, before the kernel transforms) wraps the layers
   that need communication (inference/parallel/layers.py).

Per decoder layer, with N ranks, H query heads, Hkv KV heads, intermediate size I:

    qkv_proj  column-parallel: rank r keeps query heads [r*H/N, (r+1)*H/N) and the KV heads they
              use: Hkv/N of them (Hkv >= N), or the one KV head its query heads share (Hkv < N,
              replicated on N/Hkv ranks)
    o_proj    row-parallel: the input columns of the rank's query heads, then all-reduce
    gate_up   column-parallel: rows [r*I/N, (r+1)*I/N) of gate and of up
    down      row-parallel: the same columns, then all-reduce
    embedding / LM head: vocab rows [r*Vr, (r+1)*Vr), Vr = ceil(V/N) (zero rows pad the last rank)

so every rank's KV cache holds only its KV heads and KV capacity grows with N.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import torch
from torch import nn

from inference.models.arch import ModelArch
from inference.models.llama import LlamaForCausalLM
from inference.parallel.comm import TPComm
from inference.parallel.layers import (
    ParallelLMHead,
    RowParallel,
    VocabParallelEmbedding,
)


def check_tp_supported(arch: ModelArch, world_size: int, model: str = "the model") -> None:
    """Raise ValueError (naming tensor_parallel_size) if `arch` cannot be split over world_size."""
    n, h, hkv = world_size, arch.num_attention_heads, arch.num_key_value_heads
    if n == 1:
        return
    if h % n:
        raise ValueError(f"tensor_parallel_size: {n} does not divide the {h} attention heads of {model}")
    if (hkv >= n and hkv % n) or (hkv < n and n % hkv):
        raise ValueError(f"tensor_parallel_size: {n} must divide the {hkv} KV heads of {model} or be a "
                         f"multiple of them (KV heads are then replicated)")
    if arch.intermediate_size % n:
        raise ValueError(f"tensor_parallel_size: {n} does not divide the MLP width {arch.intermediate_size} "
                         f"of {model}")
    if arch.num_experts:
        raise ValueError(f"tensor_parallel_size: mixture-of-experts models ({model}) are not sharded yet")


@dataclass(frozen=True)
class TPPlan:
    """Which slice of every tensor rank `rank` of `world_size` keeps."""
    arch: ModelArch                # the full model's
    rank: int
    world_size: int

    @property
    def num_heads(self) -> int:
        return self.arch.num_attention_heads // self.world_size

    @property
    def num_kv_heads(self) -> int:
        return max(1, self.arch.num_key_value_heads // self.world_size)

    @property
    def first_head(self) -> int:
        return self.rank * self.num_heads

    @property
    def first_kv_head(self) -> int:
        # the KV head of the rank's first query head (all of its query heads share it when replicated)
        return self.first_head // self.arch.num_queries_per_kv

    @property
    def intermediate_size(self) -> int:
        return self.arch.intermediate_size // self.world_size

    @property
    def vocab_rows(self) -> int:
        return -(-self.arch.vocab_size // self.world_size)

    def local_arch(self) -> ModelArch:
        """The shard's shapes (KV cache, kernel choices); vocab and hidden sizes stay global."""
        return dataclasses.replace(self.arch, num_attention_heads=self.num_heads,
                                   num_key_value_heads=self.num_kv_heads, intermediate_size=self.intermediate_size)


_LAYER_PARAM = re.compile(r"layers\.\d+\.(.+)$")


def shard_param(name: str, full: torch.Tensor, plan: TPPlan) -> torch.Tensor:
    """Rank plan.rank's part of the full parameter `name` (a new contiguous tensor; the full one
    itself for replicated parameters: norms)."""
    d = plan.arch.head_dim
    if name in ("embed_tokens.weight", "lm_head.weight"):
        rows, lo = plan.vocab_rows, plan.rank * plan.vocab_rows
        part = full[lo:lo + rows]
        if part.shape[0] < rows:                                      # the last rank's padding
            part = torch.cat([part, part.new_zeros(rows - part.shape[0], *part.shape[1:])])
        return part.contiguous()
    m = _LAYER_PARAM.match(name)
    sub = m.group(1) if m else ""
    if sub.startswith("self_attn.qkv_proj."):
        q_size, kv_size = plan.arch.num_attention_heads * d, plan.arch.num_key_value_heads * d
        q = full[plan.first_head * d:(plan.first_head + plan.num_heads) * d]
        kv = slice(plan.first_kv_head * d, (plan.first_kv_head + plan.num_kv_heads) * d)
        k, v = full[q_size:q_size + kv_size][kv], full[q_size + kv_size:][kv]
        return torch.cat([q, k, v]).contiguous()                      # [(h + 2 hkv) * D, ...]
    if sub == "self_attn.o_proj.weight":
        return full[:, plan.first_head * d:(plan.first_head + plan.num_heads) * d].contiguous()
    if sub in ("self_attn.o_proj.bias", "mlp.down_proj.bias"):
        return full.clone() if plan.rank == 0 else torch.zeros_like(full)   # added once by the all-reduce
    if sub == "mlp.gate_up_proj.weight":
        i, lo = plan.intermediate_size, plan.rank * plan.intermediate_size
        total = plan.arch.intermediate_size
        return torch.cat([full[lo:lo + i], full[total + lo:total + lo + i]]).contiguous()
    if sub == "mlp.down_proj.weight":
        lo = plan.rank * plan.intermediate_size
        return full[:, lo:lo + plan.intermediate_size].contiguous()
    return full                                                       # norms: replicated


def _resize_linear(linear: nn.Linear) -> None:
    linear.out_features, linear.in_features = linear.weight.shape


@torch.no_grad()
def shard_model(model: LlamaForCausalLM, plan: TPPlan) -> None:
    """Phase 1, in place: every parameter becomes its shard (works on `meta` models too: the
    random-weight loader fills the shards afterwards) and attention modules get the rank's head counts."""
    check_tp_supported(plan.arch, plan.world_size)
    for name, param in list(model.named_parameters()):
        module_name, _, attr = name.rpartition(".")
        module = model.get_submodule(module_name)
        module._parameters[attr] = nn.Parameter(shard_param(name, param.data, plan), requires_grad=False)
    for layer in model.layers:
        attn = layer.self_attn
        attn.num_heads, attn.num_kv_heads = plan.num_heads, plan.num_kv_heads
        attn.q_size, attn.kv_size = plan.num_heads * plan.arch.head_dim, plan.num_kv_heads * plan.arch.head_dim
        _resize_linear(attn.qkv_proj)
        _resize_linear(attn.o_proj)
        layer.mlp.intermediate_size = plan.intermediate_size
        _resize_linear(layer.mlp.gate_up_proj)
        _resize_linear(layer.mlp.down_proj)
    model.embed_tokens.num_embeddings = plan.vocab_rows
    if model.lm_head is not None:
        _resize_linear(model.lm_head)
    model.arch = plan.local_arch()


def install_parallel_layers(model: LlamaForCausalLM, plan: TPPlan, comm: TPComm) -> None:
    """Phase 2, in place: all-reduce after o_proj and down_proj, vocab-parallel embedding and LM
    head (a tied model's head shares the embedding shard's weight)."""
    for layer in model.layers:
        layer.self_attn.o_proj = RowParallel(layer.self_attn.o_proj, comm)
        layer.mlp.down_proj = RowParallel(layer.mlp.down_proj, comm)
    weight = model.embed_tokens.weight
    model.embed_tokens = VocabParallelEmbedding(weight.data, plan.rank * plan.vocab_rows, comm)
    head = model.lm_head
    if head is None:
        head = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
        head.weight = model.embed_tokens.weight
    model.lm_head = ParallelLMHead(head, plan.arch.vocab_size, comm)
    if getattr(model, "fused_decode", False):
        # the fused batch-1 layers (inference/models/fused_decode.py) call the GEMV kernels
        # directly: no all-reduce after o_proj / down_proj. Off, whichever transform ran first.
        model.fused_decode = False
