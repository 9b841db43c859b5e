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

# checkpoint name -> (our parameter name, fused-parameter kind, shard index within it); an `e`
# group is the expert index (its slice of a stacked [E, ...] expert parameter)
_LAYER_RULES = [
    (r"self_attn\.q_proj\.(weight|bias)", "self_attn.qkv_proj.{}", "qkv", 0),
    (r"self_attn\.k_proj\.(weight|bias)", "self_attn.qkv_proj.{}", "qkv", 1),
    (r"self_attn\.v_proj\.(weight|bias)", "self_attn.qkv_proj.{}", "qkv", 2),
    (r"self_attn\.o_proj\.(weight|bias)", "self_attn.o_proj.{}", None, None),
    (r"mlp\.gate_proj\.weight", "mlp.gate_up_proj.weight", "mlp", 0),
    (r"mlp\.up_proj\.weight", "mlp.gate_up_proj.weight", "mlp", 1),
    (r"mlp\.down_proj\.weight", "mlp.down_proj.weight", None, None),
    (r"input_layernorm\.weight", "input_layernorm.weight", None, None),
    (r"post_attention_layernorm\.weight", "post_attention_layernorm.weight", None, None),
    # mixture of experts: Mixtral (block_sparse_moe, w1 = gate, w3 = up, w2 = down), Qwen2-MoE
    (r"(?:block_sparse_moe|mlp)\.gate\.weight", "mlp.gate.weight", None, None),
    (r"block_sparse_moe\.experts\.(?P<e>\d+)\.w1\.weight", "mlp.w13", "expert", 0),
    (r"block_sparse_moe\.experts\.(?P<e>\d+)\.w3\.weight", "mlp.w13", "expert", 1),
    (r"block_sparse_moe\.experts\.(?P<e>\d+)\.w2\.weight", "mlp.w2", None, None),
    (r"mlp\.experts\.(?P<e>\d+)\.gate_proj\.weight", "mlp.w13", "expert", 0),
    (r"mlp\.experts\.(?P<e>\d+)\.up_proj\.weight", "mlp.w13", "expert", 1),
    (r"mlp\.experts\.(?P<e>\d+)\.down_proj\.weight", "mlp.w2", None, None),
    # transformers >= 5 in memory: all experts stacked already, gate rows then up rows
    (r"(?:block_sparse_moe|mlp)\.experts\.gate_up_proj", "mlp.w13", None, None),
    (r"(?:block_sparse_moe|mlp)\.experts\.down_proj", "mlp.w2", None, None),
    (r"mlp\.shared_expert\.gate_proj\.weight", "mlp.shared_expert.gate_up_proj.weight", "shared", 0),
    (r"mlp\.shared_expert\.up_proj\.weight", "mlp.shared_expert.gate_up_proj.weight", "shared", 1),
    (r"mlp\.shared_expert\.down_proj\.weight", "mlp.shared_expert.down_proj.weight", None, None),
    (r"mlp\.shared_expert_gate\.weight", "mlp.shared_expert_gate.weight", None, None),
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
        for name, buf in list(module._buffers.items()):       # counters (expert load): zeros, own dtype
            if buf is not None and buf.is_meta and not buf.is_floating_point():
                module._buffers[name] = torch.zeros(buf.shape, dtype=buf.dtype, device=device)
    model.rotary = RotaryEmbedding(arch, max_positions).to(device)
    return model.eval()


def init_random_weights(model: LlamaForCausalLM, seed: int) -> None:
    """Deterministic N(0, 0.02) weights (norms = 1, biases small), like HF's init."""
    device = next(model.parameters()).device
    # Draw on the weights' device: a 7B model's 6.7e9 normals take minutes on a host CPU.
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, param in model.named_parameters():
        fill_random_(name, param.data, gen)


def fill_random_(name: str, tensor: torch.Tensor, gen: torch.Generator) -> None:
    """One parameter's random init, drawn from `gen` (tensor-parallel ranks replay the same
    draws per full parameter and keep their slice: inference/parallel/loader.py)."""
    if name.endswith("layernorm.weight") or name == "norm.weight":
        tensor.fill_(1.0)
        return
    std = 0.02 if name.endswith("weight") else 0.002
    # Fill in row slabs so a 7B model never needs a second full fp32 copy on the host.
    flat = tensor.view(tensor.shape[0], -1)
    step = max(1, (1 << 24) // max(1, flat.shape[1]))
    for start in range(0, flat.shape[0], step):
        rows = flat[start:start + step]
        rows.copy_(torch.randn(rows.shape, generator=gen, device=tensor.device) * std)


def checkpoint_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model: no *.safetensors weights in {model_dir}")
    return files


def _offsets(arch: ModelArch) -> dict[str, list[tuple[int, int]]]:
    """Row ranges of each shard within a fused parameter, by kind."""
    q, kv = arch.num_attention_heads * arch.head_dim, arch.num_key_value_heads * arch.head_dim
    def gate_up(n: int) -> list[tuple[int, int]]:
        return [(0, n), (n, n)]
    return {"qkv": [(0, q), (q, kv), (q + kv, kv)], "mlp": gate_up(arch.intermediate_size),
            "expert": gate_up(arch.moe_intermediate_size), "shared": gate_up(arch.shared_expert_intermediate_size)}


def load_safetensors(model: LlamaForCausalLM, model_dir: Path, skip: frozenset[str] = frozenset()) -> None:
    """Copy a Hugging Face Llama-family checkpoint into `model`, fusing q/k/v and gate/up and
    stacking experts. Every tensor's place and shape, and that none is missing, are checked from
    the files' headers before any weight is read. `skip`: checkpoint keys already consumed (a
    quantized checkpoint's projections)."""
    params = dict(model.named_parameters())
    arch = model.arch
    offsets = _offsets(arch)
    files = checkpoint_files(model_dir)
    plan: list[tuple[Path, str, str, int | None, tuple[int, int] | None]] = []
    for path in files:                              # headers only: cheap
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for key in f.keys():
                if key in skip:
                    continue
                target = _target(key, offsets)
                if target is None:
                    continue
                name, expert, rows = target
                if name == "lm_head.weight" and model.lm_head is None:
                    continue                        # tied: the embedding already serves
                if name not in params:
                    raise ValueError(f"checkpoint tensor {key!r} has no place in this model ({name})")
                if expert is not None and expert >= arch.num_experts:
                    raise ValueError(f"checkpoint tensor {key!r}: expert {expert}, but config.json says "
                                     f"num_experts={arch.num_experts}")
                dest = _dest(params[name], expert, rows)
                shape = tuple(f.get_slice(key).get_shape())
                if shape != tuple(dest.shape):
                    hint = f" (config.json: num_experts={arch.num_experts})" if name.endswith("mlp.gate.weight") else ""
                    raise ValueError(f"checkpoint tensor {key!r}: shape {shape} does not match the model's "
                                     f"{tuple(dest.shape)}{hint}")
                plan.append((path, key, name, expert, rows))
    loaded = set()
    for _, _, name, expert, rows in plan:
        if expert is None and name.endswith((".w13", ".w2")):      # the whole stack at once
            loaded |= _expert_entries(name, params[name].shape[0], offsets)
        else:
            loaded.add(_loaded_name(name, expert, rows))
    missing = sorted(_expected_names(model, offsets) - loaded)
    if missing:
        raise ValueError(f"checkpoint in {model_dir} lacks {len(missing)} tensors, e.g. {missing[:3]}")
    with tqdm(total=len(plan), desc=f"Loading {model_dir.name}", unit="tensor", leave=False) as bar:
        for path in files:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for p, key, name, expert, rows in plan:
                    if p == path:
                        _dest(params[name], expert, rows).copy_(f.get_tensor(key))
                        bar.update(1)


def _dest(param: torch.Tensor, expert: int | None, rows: tuple[int, int] | None) -> torch.Tensor:
    dest = param.data if expert is None else param.data[expert]
    return dest if rows is None else dest[rows[0]:rows[0] + rows[1]]


def _loaded_name(name: str, expert: int | None, rows: tuple[int, int] | None) -> str:
    return name + ("" if expert is None else f"[expert {expert}]") + ("" if rows is None else f"[{rows[0]}]")


def _target(key: str, offsets: dict[str, list[tuple[int, int]]]):
    """(our parameter, expert index or None, row range or None) for a checkpoint key; None: ignored."""
    if _IGNORED.match(key):
        return None
    key = key.removeprefix("model.")
    if key in ("embed_tokens.weight", "norm.weight", "lm_head.weight"):
        return key, None, None
    m = re.match(r"layers\.(\d+)\.(.+)$", key)
    if not m:
        raise ValueError(f"checkpoint tensor {key!r} is not a Llama-family weight")
    layer, rest = m.groups()
    for pattern, name, kind, shard in _LAYER_RULES:
        mm = re.fullmatch(pattern, rest)
        if mm:
            groups = mm.groupdict()
            plain = [g for i, g in enumerate(mm.groups(), 1) if i not in mm.re.groupindex.values()]
            name = name.format(*plain)
            expert = int(groups["e"]) if "e" in groups else None
            return f"layers.{layer}.{name}", expert, None if shard is None else offsets[kind][shard]
    raise ValueError(f"checkpoint tensor {key!r} is not a Llama-family weight")


def _expert_entries(name: str, num_experts: int, offsets) -> set[str]:
    """What loading every expert of a stacked expert parameter records."""
    rows = [None] if name.endswith(".w2") else offsets["expert"]
    return {_loaded_name(name, e, r) for e in range(num_experts) for r in rows}


def _expected_names(model, offsets) -> set[str]:
    # quantized linears (they hold `qweight`) were filled by the quantized checkpoint's loader
    quantized = tuple(f"{n}." for n, m in model.named_modules() if hasattr(m, "qweight"))
    shards = {"qkv_proj.weight": "qkv", "qkv_proj.bias": "qkv", "shared_expert.gate_up_proj.weight": "shared",
              "gate_up_proj.weight": "mlp"}
    names = set()
    for name, param in model.named_parameters():
        if quantized and name.startswith(quantized):
            continue
        kind = next((k for suffix, k in shards.items() if name.endswith(suffix)), None)
        if name.endswith((".w13", ".w2")):
            names.update(_expert_entries(name, param.shape[0], offsets))
            continue
        if kind is None:
            names.add(name)
        else:
            names.update(f"{name}[{o}]" for o, _ in offsets[kind])
    return names
