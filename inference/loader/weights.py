"""Build a model on the meta device, then fill it from safetensors or with random weights.

Building on `meta` first means a 7B model never exists in fp32 on the host: each parameter is
allocated once, in its final dtype, on its final device.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from tqdm.auto import tqdm

from inference.models.arch import ModelArch
from inference.models.llama import DECODER_LINEARS, LlamaForCausalLM, RotaryEmbedding

# checkpoint name -> (our parameter name, shard index within a fused parameter)
_LAYER_RULES = [
    (r"self_attn\.q_proj\.(weight|bias)", "self_attn.qkv_proj.{}", 0),
    (r"self_attn\.k_proj\.(weight|bias)", "self_attn.qkv_proj.{}", 1),
    (r"self_attn\.v_proj\.(weight|bias)", "self_attn.qkv_proj.{}", 2),
    (r"self_attn\.o_proj\.(weight|bias)", "self_attn.o_proj.{}", None),
    (r"mlp\.gate_proj\.weight", "mlp.gate_up_proj.weight", 0),
    (r"mlp\.up_proj\.weight", "mlp.gate_up_proj.weight", 1),
    (r"mlp\.down_proj\.weight", "mlp.down_proj.weight", None),
    (r"input_layernorm\.weight", "input_layernorm.weight", None),
    (r"post_attention_layernorm\.weight", "post_attention_layernorm.weight", None),
]
_IGNORED = re.compile(r".*(rotary_emb\.inv_freq|\.masked_bias|\.attn\.bias)$")


_DECODER_LINEAR = re.compile(r"layers\.\d+\.(" + "|".join(map(re.escape, DECODER_LINEARS)) + ")$")


def build_model(arch: ModelArch, max_positions: int, dtype: torch.dtype, device: torch.device,
                skip_decoder_linears: bool = False) -> LlamaForCausalLM:
    """Uninitialised model: every parameter allocated once in `dtype` on `device`. With
    skip_decoder_linears the decoder's linear layers stay on `meta` (a quantized checkpoint
    replaces them), so a dense copy of their weights never exists."""
    with torch.device("meta"):
        model = LlamaForCausalLM(arch, max_positions)
    for module_name, module in model.named_modules():
        if skip_decoder_linears and _DECODER_LINEAR.match(module_name):
            continue
        for name, param in list(module._parameters.items()):
            if param is not None:
                module._parameters[name] = nn.Parameter(
                    torch.empty(param.shape, dtype=dtype, device=device), requires_grad=False)
    model.rotary = RotaryEmbedding(arch, max_positions).to(device)
    return model.eval()


def init_random_weights(model: LlamaForCausalLM, seed: int) -> None:
    """Deterministic N(0, 0.02) weights (norms = 1, biases small), like HF's init."""
    device = next(model.parameters()).device
    # Draw on the weights' device: a 7B model's 6.7e9 normals take minutes on a host CPU.
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("layernorm.weight") or name == "norm.weight":
            param.data.fill_(1.0)
            continue
        std = 0.02 if name.endswith("weight") else 0.002
        # Fill in row slabs so a 7B model never needs a second full fp32 copy on the host.
        flat = param.data.view(param.shape[0], -1)
        step = max(1, (1 << 24) // max(1, flat.shape[1]))
        for start in range(0, flat.shape[0], step):
            rows = flat[start:start + step]
            rows.copy_(torch.randn(rows.shape, generator=gen, device=device) * std)


def checkpoint_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model: no *.safetensors weights in {model_dir}")
    return files


def load_safetensors(model: LlamaForCausalLM, model_dir: Path, skip: frozenset[str] = frozenset()) -> None:
    """Copy a Hugging Face Llama-family checkpoint into `model`, fusing q/k/v and gate/up.
    `skip`: checkpoint keys already consumed (a quantized checkpoint's projections)."""
    params = dict(model.named_parameters())
    arch = model.arch
    q, kv, inter = arch.num_attention_heads * arch.head_dim, arch.num_key_value_heads * arch.head_dim, arch.intermediate_size
    qkv_offsets = [(0, q), (q, kv), (q + kv, kv)]
    gate_up_offsets = [(0, inter), (inter, inter)]
    loaded: set[str] = set()
    files = checkpoint_files(model_dir)
    total = 0
    for path in files:                              # headers only: cheap
        with safe_open(str(path), framework="pt", device="cpu") as f:
            total += len(f.keys())
    with tqdm(total=total, desc=f"Loading {model_dir.name}", unit="tensor", leave=False) as bar:
        for path in files:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for key in f.keys():
                    bar.update(1)
                    if key in skip:
                        continue
                    target = _target(key, qkv_offsets, gate_up_offsets)
                    if target is None:
                        continue
                    name, rows = target
                    if name == "lm_head.weight" and model.lm_head is None:
                        continue                    # tied: the embedding already serves
                    if name not in params:
                        raise ValueError(f"checkpoint tensor {key!r} has no place in this model ({name})")
                    dest = params[name].data if rows is None else params[name].data[rows[0]:rows[0] + rows[1]]
                    tensor = f.get_tensor(key)
                    if tensor.shape != dest.shape:
                        raise ValueError(f"checkpoint tensor {key!r}: shape {tuple(tensor.shape)} "
                                         f"does not match the model's {tuple(dest.shape)}")
                    dest.copy_(tensor)
                    loaded.add(name if rows is None else f"{name}[{rows[0]}]")
    expected = _expected_names(model, qkv_offsets, gate_up_offsets)
    missing = sorted(expected - loaded)
    if missing:
        raise ValueError(f"checkpoint in {model_dir} lacks {len(missing)} tensors, e.g. {missing[:3]}")


def _target(key: str, qkv_offsets, gate_up_offsets):
    if _IGNORED.match(key):
        return None
    key = key.removeprefix("model.")
    if key in ("embed_tokens.weight", "norm.weight", "lm_head.weight"):
        return key, None
    m = re.match(r"layers\.(\d+)\.(.+)$", key)
    if not m:
        raise ValueError(f"checkpoint tensor {key!r} is not a Llama-family weight")
    layer, rest = m.groups()
    for pattern, name, shard in _LAYER_RULES:
        mm = re.fullmatch(pattern, rest)
        if mm:
            name = name.format(*mm.groups())
            offsets = qkv_offsets if "qkv" in name else gate_up_offsets
            return f"layers.{layer}.{name}", None if shard is None else offsets[shard]
    raise ValueError(f"checkpoint tensor {key!r} is not a Llama-family weight")


def _expected_names(model, qkv_offsets, gate_up_offsets) -> set[str]:
    # quantized linears (they hold `qweight`) were filled by the quantized checkpoint's loader
    quantized = tuple(f"{n}." for n, m in model.named_modules() if hasattr(m, "qweight"))
    names = set()
    for name, _ in model.named_parameters():
        if quantized and name.startswith(quantized):
            continue
        if name.endswith("qkv_proj.weight") or name.endswith("qkv_proj.bias"):
            names.update(f"{name}[{o}]" for o, _ in qkv_offsets)
        elif name.endswith("gate_up_proj.weight"):
            names.update(f"{name}[{o}]" for o, _ in gate_up_offsets)
        else:
            names.add(name)
    return names
