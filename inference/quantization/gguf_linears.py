"""Transform: a model loaded from a GGUF file gets its decoder linears and LM head back from the
file's own quantized codes (inference/loader/gguf_codes.py), fused as our modules are (q|k|v,
gate|up, each part keeping its own type), on the CPU's VNNI kernel (GGUFCpuLinear). Without that
kernel, 4-bit Q4_0 / Q4_1 layers take torch's int4 kernel (Int4CpuLinear). Nothing is re-quantized:
the codes, scales and minimums are the file's.

Tensors of float types keep the dequantized weight the safetensors copy holds.
"""
from __future__ import annotations

import torch

from inference.loader.gguf_codes import QUANTIZED, BlockCodes, GGUFFile, unpermute_rope_rows
from inference.models.gguf_cpu_linear import BLOCK, GGUFCpuLinear, gguf_matmul_available
from inference.models.int4_cpu_linear import Int4CpuLinear, Int8AsTwoInt4CpuLinear
from inference.models.llama import LlamaForCausalLM

FOUR_BIT = ("Q4_0", "Q4_1")


def _parts(f: GGUFFile, layer: int, parts: tuple[str, ...], arch, kinds: tuple[str, ...]) -> list[BlockCodes] | None:
    """The file's codes of the tensors one of our linears fuses, in our row order, or None when one
    is not of `kinds`."""
    names = [f"blk.{layer}.{p}.weight" for p in parts]
    if any(n not in f.tensors or f.kind(n) not in kinds for n in names):
        return None
    codes = []
    for part, name in zip(parts, names):
        c = f.codes(name)
        if part in ("attn_q", "attn_k") and f.permuted_rope_rows:
            heads = arch.num_attention_heads if part == "attn_q" else arch.num_key_value_heads
            c = c.rows(unpermute_rope_rows(c.shape[0], heads))
        codes.append(c)
    return codes


LINEARS = {  # our module path -> the GGUF tensors it fuses, in our row order
    ("self_attn", "qkv_proj"): ("attn_q", "attn_k", "attn_v"),
    ("self_attn", "o_proj"): ("attn_output",),
    ("mlp", "gate_up_proj"): ("ffn_gate", "ffn_up"),
    ("mlp", "down_proj"): ("ffn_down",),
}


def _fits_segments(parts: list[BlockCodes]) -> bool:
    return all(p.shape[0] % BLOCK == 0 for p in parts[:-1])


def use_gguf_codes(model: LlamaForCausalLM, f: GGUFFile, scale_dtype: torch.dtype = torch.bfloat16) -> int:
    """Replace each decoder linear whose GGUF tensors are quantized with a linear over the file's
    codes, in place: the VNNI kernel's GGUFCpuLinear (bf16 models, where it builds, every type),
    else torch's int4 kernel (Q4_0 / Q4_1 without bias). Returns how many were replaced."""
    dtype = model.embed_tokens.weight.dtype
    vnni = gguf_matmul_available() and dtype == torch.bfloat16
    num_replaced = 0
    for i, layer in enumerate(model.layers):
        for (parent, name), names in LINEARS.items():
            owner = getattr(layer, parent)
            linear = getattr(owner, name, None)
            if not isinstance(linear, torch.nn.Linear):
                continue
            parts = _parts(f, i, names, model.arch, QUANTIZED if vnni else FOUR_BIT)
            if parts is None or (vnni and not _fits_segments(parts)) or (not vnni and linear.bias is not None):
                continue
            shape = (sum(p.shape[0] for p in parts), parts[0].shape[1])
            if shape != tuple(linear.weight.shape):
                raise ValueError(f"GGUF layer {i} {'+'.join(names)}: codes {shape} do not match the model's "
                                 f"{parent}.{name} {tuple(linear.weight.shape)}")
            if vnni:
                setattr(owner, name, GGUFCpuLinear(parts, linear.bias))
            else:
                codes = BlockCodes.cat(parts)
                setattr(owner, name, Int4CpuLinear(codes.codes, codes.scale, codes.zero, dtype, scale_dtype))
            num_replaced += 1
    return num_replaced


def use_gguf_lm_head(model: LlamaForCausalLM, f: GGUFFile, scale_dtype: torch.dtype = torch.bfloat16) -> bool:
    """Compute the logits from the file's codes (its `output` tensor, or `token_embd` when the
    embeddings are tied) instead of a 16-bit copy: any quantized type on the VNNI kernel, Q8_0 on
    torch's int4 kernel elsewhere; True when it did."""
    name = "output.weight" if "output.weight" in f.tensors else "token_embd.weight"
    dtype = model.embed_tokens.weight.dtype
    vnni = dtype == torch.bfloat16 and gguf_matmul_available()
    if f.kind(name) not in (QUANTIZED if vnni else ("Q8_0",)):
        return False
    codes = f.codes(name)
    if codes.shape != (model.arch.vocab_size, model.arch.hidden_size):
        raise ValueError(f"GGUF {name}: codes {codes.shape} do not match the model's LM head "
                         f"({model.arch.vocab_size}, {model.arch.hidden_size})")
    if vnni:
        # fp32 logits, as llama.cpp's: in bf16, 31 of the 47 top-1 disagreements with the fp32
        # reference over 2,044 teacher-forced positions were exact ties (bench.cpu.gguf_agreement)
        model.lm_head = GGUFCpuLinear([codes], f32_out=True)
    else:
        model.lm_head = Int8AsTwoInt4CpuLinear(codes.codes, codes.scale, dtype, scale_dtype)
    return True


def use_gguf_embedding(model: LlamaForCausalLM, f: GGUFFile) -> bool:
    """Look token embeddings up in the file's quantized `token_embd` rows (its memory map) instead of
    a 16-bit copy, when the LM head does not read that copy (untied, or already on codes)."""
    from inference.models.gguf_embedding import GGUFEmbedding
    name = "token_embd.weight"
    if model.lm_head is None or name not in f.tensors or f.kind(name) not in QUANTIZED:
        return False
    t = f.tensors[name]
    dim, vocab = (int(x) for x in t.shape)
    if (vocab, dim) != (model.arch.vocab_size, model.arch.hidden_size):
        raise ValueError(f"GGUF {name}: shape {(vocab, dim)} does not match the model's embeddings "
                         f"({model.arch.vocab_size}, {model.arch.hidden_size})")
    model.embed_tokens = GGUFEmbedding(t.data, f.kind(name), vocab, dim, model.embed_tokens.weight.dtype)
    return True
