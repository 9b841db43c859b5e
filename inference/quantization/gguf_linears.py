"""Transform: a model loaded from a GGUF file gets its decoder linears back from the file's own
4-bit codes (inference/loader/gguf_codes.py), fused as our modules are (q|k|v, gate|up), on the
CPU's int4 kernel (inference/models/int4_cpu_linear.py). Nothing is re-quantized: the codes,
scales and minimums are the file's.

Tensors of other types (Q8_0 or float decoder weights) keep the dequantized weight the
safetensors copy holds; `gguf_plan` says which layers take the codes.
"""
from __future__ import annotations

import torch

from inference.loader.gguf_codes import BlockCodes, GGUFFile, unpermute_rope_rows
from inference.models.gguf_cpu_linear import GGUFCpuLinear, GGUFQ8CpuLinear, gguf_matmul_available
from inference.models.int4_cpu_linear import Int4CpuLinear, Int8AsTwoInt4CpuLinear
from inference.models.llama import LlamaForCausalLM

FOUR_BIT = ("Q4_0", "Q4_1")


def _fused(f: GGUFFile, layer: int, parts: tuple[str, ...], arch) -> BlockCodes | None:
    names = [f"blk.{layer}.{p}.weight" for p in parts]
    if any(n not in f.tensors or f.kind(n) not in FOUR_BIT for n in names):
        return None
    codes = []
    for part, name in zip(parts, names):
        c = f.codes(name)
        if part in ("attn_q", "attn_k"):
            heads = arch.num_attention_heads if part == "attn_q" else arch.num_key_value_heads
            c = c.rows(unpermute_rope_rows(c.shape[0], heads))
        codes.append(c)
    return BlockCodes.cat(codes)


LINEARS = {  # our module path -> the GGUF tensors it fuses, in our row order
    ("self_attn", "qkv_proj"): ("attn_q", "attn_k", "attn_v"),
    ("self_attn", "o_proj"): ("attn_output",),
    ("mlp", "gate_up_proj"): ("ffn_gate", "ffn_up"),
    ("mlp", "down_proj"): ("ffn_down",),
}


def use_gguf_codes(model: LlamaForCausalLM, f: GGUFFile, scale_dtype: torch.dtype = torch.bfloat16) -> int:
    """Replace each decoder linear whose GGUF tensors are all 4-bit with a linear over the file's
    codes, in place: the VNNI kernel's GGUFCpuLinear (bf16 models, where it builds), else torch's
    int4 kernel. Returns how many were replaced."""
    dtype = model.embed_tokens.weight.dtype
    vnni = gguf_matmul_available()
    num_replaced = 0
    for i, layer in enumerate(model.layers):
        for (parent, name), parts in LINEARS.items():
            owner = getattr(layer, parent)
            linear = getattr(owner, name, None)
            if not isinstance(linear, torch.nn.Linear) or linear.bias is not None:
                continue
            codes = _fused(f, i, parts, model.arch)
            if codes is None:
                continue
            if codes.shape != tuple(linear.weight.shape):
                raise ValueError(f"GGUF layer {i} {'+'.join(parts)}: codes {codes.shape} do not match the model's "
                                 f"{parent}.{name} {tuple(linear.weight.shape)}")
            if vnni and dtype == torch.bfloat16:
                setattr(owner, name, GGUFCpuLinear(codes.codes, codes.scale, codes.zero))
            else:
                setattr(owner, name, Int4CpuLinear(codes.codes, codes.scale, codes.zero, dtype, scale_dtype))
            num_replaced += 1
    return num_replaced


def use_gguf_lm_head(model: LlamaForCausalLM, f: GGUFFile, scale_dtype: torch.dtype = torch.bfloat16) -> bool:
    """Compute the logits from the file's Q8_0 codes (its `output` tensor, or `token_embd` when the
    embeddings are tied) instead of a 16-bit copy; True when it did."""
    name = "output.weight" if "output.weight" in f.tensors else "token_embd.weight"
    if f.kind(name) != "Q8_0":
        return False
    codes = f.codes(name)
    if codes.shape != (model.arch.vocab_size, model.arch.hidden_size):
        raise ValueError(f"GGUF {name}: codes {codes.shape} do not match the model's LM head "
                         f"({model.arch.vocab_size}, {model.arch.hidden_size})")
    dtype = model.embed_tokens.weight.dtype
    if dtype == torch.bfloat16 and gguf_matmul_available():
        model.lm_head = GGUFQ8CpuLinear(codes.codes, codes.scale)
    else:
        model.lm_head = Int8AsTwoInt4CpuLinear(codes.codes, codes.scale, dtype, scale_dtype)
    return True
