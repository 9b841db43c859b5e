"""Quantized checkpoints in the Hugging Face GPTQ and AWQ layouts: written by `python -m
inference quantize`, read by the loader (ours, or GPTQ / AWQ checkpoints made elsewhere).

Per projection (q/k/v/o/gate/up/down kept separate on disk, as HF names them), with
pack = 32 // bits codes per int32 word:

    GPTQ  qweight int32 [in / pack, out]   codes packed along the input dim, low bits first
          qzeros  int32 [G, out / pack]    (zero - 1) packed along the output dim (GPTQ v1)
          scales  fp16  [G, out]           g_idx int32 [in] = i // group_size
    AWQ   qweight int32 [in, out / 8]      codes packed along the output dim in AWQ's order
          qzeros  int32 [G, out / 8]       zeros, same packing       scales fp16 [G, out]

Every shape is checked against the config's bits and group size (headers only) before any
weight is read, so a checkpoint that does not match its quantization_config fails clearly.
"""
from __future__ import annotations

import json
import shutil
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from inference.models.arch import ModelArch
from inference.quantization.config import QuantConfig
from inference.quantization.quant_linear import QuantLinear
from inference.quantization.transform import replace_module

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)          # nibble k of an AWQ word holds column AWQ_ORDER[k]
# fused module -> its HF projections, in the order their rows are stacked
PROJECTIONS = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
               "self_attn.o_proj": ("self_attn.o_proj",),
               "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
               "mlp.down_proj": ("mlp.down_proj",)}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "generation_config.json")


def _pack(codes: torch.Tensor, bits: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """[rows, n] small ints -> int32 [rows, n / pack], packing along the last dim."""
    pack = 32 // bits
    c = codes.to(torch.int64).view(codes.shape[0], -1, pack)
    if order is not None:
        c = c[:, :, list(order)]
    words = sum(c[:, :, k] << (bits * k) for k in range(pack))
    return (words - ((words >> 31) << 32)).to(torch.int32)            # wrap to signed int32


def _unpack(words: torch.Tensor, bits: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    pack, mask = 32 // bits, (1 << bits) - 1
    w = words.to(torch.int64) & 0xFFFFFFFF
    c = torch.stack([(w >> (bits * k)) & mask for k in range(pack)], dim=-1)   # [rows, n/pack, pack]
    if order is not None:
        c = c[:, :, [order.index(j) for j in range(pack)]]
    return c.reshape(words.shape[0], -1)


def _projection_shapes(arch: ModelArch) -> dict[str, tuple[int, int]]:
    """HF projection -> (out, in)."""
    h, i = arch.hidden_size, arch.intermediate_size
    q, kv = arch.num_attention_heads * arch.head_dim, arch.num_key_value_heads * arch.head_dim
    return {"self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
            "self_attn.o_proj": (h, q), "mlp.gate_proj": (i, h), "mlp.up_proj": (i, h), "mlp.down_proj": (h, i)}


def _expected(cfg: QuantConfig, out: int, n: int) -> dict[str, tuple[int, ...]]:
    g = cfg.groups(n)
    if cfg.method == "awq":
        return {"qweight": (n, out // 8), "qzeros": (g, out // 8), "scales": (g, out)}
    pack = 32 // cfg.bits
    return {"qweight": (n // pack, out), "qzeros": (g, out // pack), "scales": (g, out), "g_idx": (n,)}


# ---- writing ------------------------------------------------------------------------------------

def _encode(linear: QuantLinear, rows: slice, cfg: QuantConfig) -> dict[str, torch.Tensor]:
    codes = linear.codes()[rows]                                           # [out, in]
    scales, zeros = linear.scales[rows].t().contiguous(), linear.zeros[rows].t().contiguous()   # [G, out]
    zeros_i = zeros.round().to(torch.int64)
    if cfg.method == "awq":
        t = {"qweight": _pack(codes.t().contiguous(), 4, AWQ_ORDER), "qzeros": _pack(zeros_i, 4, AWQ_ORDER)}
    else:
        t = {"qweight": _pack(codes, cfg.bits).t().contiguous(),       # packed along in: [in / pack, out]
             "qzeros": _pack(zeros_i - 1, cfg.bits),                    # GPTQ v1 stores zero - 1
             "g_idx": (torch.arange(linear.in_features) // linear.group_len).to(torch.int32)}
    t["scales"] = scales.half()
    if linear.bias is not None:
        t["bias"] = linear.bias.detach()[rows].half()
    return t


def save_quantized(model, cfg: QuantConfig, out_dir: Path, hf_config: dict, tokenizer_dir: Path | None,
                   dtype: torch.dtype = torch.float16) -> Path:
    """Write `model` (already quantized by quantize_model) as an HF-format checkpoint directory."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    arch = model.arch
    shapes = _projection_shapes(arch)
    tensors: dict[str, torch.Tensor] = {}
    for i, layer in enumerate(model.layers):
        for fused, projs in PROJECTIONS.items():
            linear = layer.get_submodule(fused)
            if not isinstance(linear, QuantLinear):
                raise ValueError(f"save_quantized: layers.{i}.{fused} is not quantized")
            start = 0
            for proj in projs:
                out = shapes[proj][0]
                for key, t in _encode(linear, slice(start, start + out), cfg).items():
                    tensors[f"model.layers.{i}.{proj}.{key}"] = t
                start += out
        tensors[f"model.layers.{i}.input_layernorm.weight"] = layer.input_layernorm.weight.detach().to(dtype)
        tensors[f"model.layers.{i}.post_attention_layernorm.weight"] = \
            layer.post_attention_layernorm.weight.detach().to(dtype)
    tensors["model.embed_tokens.weight"] = model.embed_tokens.weight.detach().to(dtype)
    tensors["model.norm.weight"] = model.norm.weight.detach().to(dtype)
    if model.lm_head is not None:
        tensors["lm_head.weight"] = model.lm_head.weight.detach().to(dtype)
    save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, str(out_dir / "model.safetensors"))
    config = {**hf_config, "quantization_config": cfg.to_hf(), "torch_dtype": str(dtype).removeprefix("torch.")}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    for name in TOKENIZER_FILES:
        if tokenizer_dir is not None and (Path(tokenizer_dir) / name).exists():
            shutil.copy(Path(tokenizer_dir) / name, out_dir / name)
    return out_dir


# ---- reading ------------------------------------------------------------------------------------

def check_checkpoint(model_dir: Path, files: list[Path], arch: ModelArch, cfg: QuantConfig) -> dict[str, Path]:
    """Every quantized tensor present with the shape the config implies (headers only).
    Returns tensor name -> file."""
    where: dict[str, Path] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for key in f.keys():
                where[key] = path
                shapes[key] = tuple(f.get_slice(key).get_shape())
    for i in range(arch.num_hidden_layers):
        for proj, (out, n) in _projection_shapes(arch).items():
            for suffix, want in _expected(cfg, out, n).items():
                key = f"model.layers.{i}.{proj}.{suffix}"
                if key not in shapes:
                    raise ValueError(f"checkpoint {model_dir}: {key} is missing for a {cfg.method} checkpoint "
                                     f"(quantization_config: bits={cfg.bits}, group_size={cfg.group_size})")
                if shapes[key] != want:
                    raise ValueError(f"checkpoint {model_dir}: {key} has shape {shapes[key]}, but bits={cfg.bits} "
                                     f"and group_size={cfg.group_size} (quantization_config) imply {want}")
    return where


def _decode(get, prefix: str, cfg: QuantConfig, out: int, n: int):
    scales = get(f"{prefix}.scales").float().t()                                    # [out, G]
    if cfg.method == "awq":
        codes = _unpack(get(f"{prefix}.qweight"), 4, AWQ_ORDER).t()                 # [out, in]
        zeros = _unpack(get(f"{prefix}.qzeros"), 4, AWQ_ORDER).t().float()
    else:
        codes = _unpack(get(f"{prefix}.qweight").t().contiguous(), cfg.bits)       # [out, in]
        zeros = (_unpack(get(f"{prefix}.qzeros"), cfg.bits) + 1).t().float()
        g_idx = get(f"{prefix}.g_idx")
        if not torch.equal(g_idx.long(), torch.arange(n) // cfg.group_len(n)):
            raise ValueError(f"{prefix}.g_idx is not i // group_size: act-order checkpoints are supported only "
                             "with static groups")
    return codes.to(torch.uint8).contiguous(), scales, zeros


def load_quantized(model, model_dir: Path, files: list[Path], cfg: QuantConfig) -> set[str]:
    """Replace the decoder linears with QuantLinears from the checkpoint. Returns the checkpoint
    keys consumed (the loader reads the rest: embeddings, norms, LM head)."""
    arch = model.arch
    where = check_checkpoint(model_dir, files, arch, cfg)
    consumed: set[str] = set()
    shapes = _projection_shapes(arch)
    device = model.embed_tokens.weight.device
    with ExitStack() as stack:
        handles = {p: stack.enter_context(safe_open(str(p), framework="pt", device="cpu")) for p in set(where.values())}

        def get(key: str) -> torch.Tensor:
            consumed.add(key)
            return handles[where[key]].get_tensor(key)
        for i, layer in enumerate(model.layers):
            for fused, projs in PROJECTIONS.items():
                parts = [_decode(get, f"model.layers.{i}.{p}", cfg, *shapes[p]) for p in projs]
                codes, scales, zeros = (torch.cat(x) for x in zip(*parts))
                old = layer.get_submodule(fused)
                bias = None
                if old.bias is not None:               # the architecture has one: the checkpoint must too
                    keys = [f"model.layers.{i}.{p}.bias" for p in projs]
                    missing = [k for k in keys if k not in where]
                    if missing:
                        raise ValueError(f"checkpoint {model_dir}: {missing[0]} is missing (the config asks for "
                                         "biases on this layer)")
                    bias = torch.cat([get(k) for k in keys]).to(old.bias.dtype)
                new = QuantLinear(codes, scales, zeros, cfg, bias)
                replace_module(model, f"layers.{i}.{fused}", new.to(device))
    return consumed
