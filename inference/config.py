"""Engine configuration: frozen dataclasses built once from YAML + environment + keyword args.

Nothing here is read at import time; `EngineConfig.load(...)` is called by the engine's builder
and the result is passed down explicitly.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from configs import shipped
from inference.spec_decode.config import SpeculativeConfig

DTYPES = ("auto", "float32", "bfloat16", "float16")
POLICIES = ("fcfs", "priority")
QUANTIZATION = ("int8", "int4", "fp8", "awq", "gptq", "sparse24")
KV_CACHE_DTYPES = ("auto", "fp8_e4m3", "int8")


@dataclass(frozen=True)
class ModelConfig:
    model: str = "qwen2.5-coder-0.5b"
    dtype: str = "auto"
    max_model_len: int | None = None
    seed: int = 0
    tokenizer: str | None = None
    device: str = "cpu"
    enforce_eager: bool = False        # CUDA: no CUDA graphs (debugging, or to save their memory)
    # int8 / int4: round-to-nearest on load; awq / gptq: the checkpoint's format (also detected
    # from its quantization_config when left None). See inference/quantization/config.py.
    quantization: str | None = None
    # mixture-of-experts models: skip an expert whose normalised router weight is below this for a
    # token (its top expert always runs); 0 = off, exact
    router_weights_threshold: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.router_weights_threshold, (int, float)) \
                or isinstance(self.router_weights_threshold, bool) \
                or not 0.0 <= self.router_weights_threshold < 1.0:
            raise ValueError("router_weights_threshold: must be a number in [0, 1), "
                             f"got {self.router_weights_threshold!r}")
        if not isinstance(self.model, str) or not self.model:
            raise ValueError("model: must be a non-empty model name or path")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: must be one of {DTYPES}, got {self.dtype!r}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len: must be >= 1, got {self.max_model_len}")
        if self.quantization is not None and self.quantization not in QUANTIZATION:
            raise ValueError(f"quantization: must be one of {QUANTIZATION} or None, got {self.quantization!r}")


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    kv_cache_memory_bytes: int | None = None   # None: 512 MiB on the CPU, sized from free memory on a GPU
    gpu_memory_utilization: float = 0.9        # share of the GPU's memory the engine may use
    enable_prefix_caching: bool = True
    # "auto": the model's dtype; "fp8_e4m3": half the bytes of bf16 per cached token (values
    # stored as float8 e4m3 with scale 1, vLLM's default without calibrated scales, saturating at
    # +-448); the CUDA kernels upcast it to the model's dtype as tiles load. "int8": symmetric,
    # one fp32 scale per (token, head) row, 0.52x the bytes of bf16 at head_dim 128 (CPU path)
    kv_cache_dtype: str = "auto"
    # Tiered KV cache (inference/core/kv_tiers.py): prefix-cached blocks evicted from the device pool
    # move to this many GiB of (pinned, on CUDA) host memory instead of being forgotten, and a
    # later prefix hit copies them back up. vLLM's name; 0 = off.
    swap_space: float = 0.0
    # below the host tier: a file of kv_disk_bytes in the directory kv_disk_path (0 = off)
    kv_disk_path: str | None = None
    kv_disk_bytes: int = 0

    def __post_init__(self) -> None:
        self._check_tiers()
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype: must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size: must be a power of two >= 1, got {self.block_size}")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise ValueError(f"kv_cache_memory_bytes: must be > 0, got {self.kv_cache_memory_bytes}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization: must be in (0, 1], got {self.gpu_memory_utilization}")

    def _check_tiers(self) -> None:
        swap = self.swap_space
        if not isinstance(swap, (int, float)) or isinstance(swap, bool) or not 0 <= swap < float("inf"):
            raise ValueError(f"swap_space: must be a number of GiB >= 0 (0 = no host KV tier), got {swap!r}")
        if not isinstance(self.kv_disk_bytes, int) or isinstance(self.kv_disk_bytes, bool) or self.kv_disk_bytes < 0:
            raise ValueError("kv_disk_bytes: must be an integer >= 0 (0 = no disk KV tier), "
                             f"got {self.kv_disk_bytes!r}")
        if self.kv_disk_path is not None and (not isinstance(self.kv_disk_path, str) or not self.kv_disk_path):
            raise ValueError(f"kv_disk_path: must be a directory path, got {self.kv_disk_path!r}")
        if self.kv_disk_bytes and self.kv_disk_path is None:
            raise ValueError("kv_disk_bytes: the disk KV tier needs kv_disk_path (a directory for its file)")
        if self.kv_disk_path is not None and not self.kv_disk_bytes:
            raise ValueError("kv_disk_path: set kv_disk_bytes > 0 to size the disk KV tier")
        if self.kv_disk_bytes and not swap:
            raise ValueError("kv_disk_bytes: the disk KV tier sits below the host tier; set swap_space > 0 too")
        if swap and not self.enable_prefix_caching:
            raise ValueError("swap_space: the host KV tier keeps prefix-cached blocks; it needs "
                             "enable_prefix_caching=True")

    @property
    def swap_space_bytes(self) -> int:
        return int(self.swap_space * 2**30)


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 128
    enable_chunked_prefill: bool = True
    policy: str = "fcfs"

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens: must be >= 1, got {self.max_num_batched_tokens}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs: must be >= 1, got {self.max_num_seqs}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy: must be one of {POLICIES}, got {self.policy!r}")


@dataclass(frozen=True)
class ParallelConfig:
    # ranks the model is sharded over (inference/parallel/): one process each, rank 0 in the
    # engine's; 1 = no tensor parallelism, no extra process
    tensor_parallel_size: int = 1
    # how long a collective (gloo) waits for a peer before the step fails
    collective_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        n = self.tensor_parallel_size
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"tensor_parallel_size: must be an integer >= 1, got {n!r}")
        t = self.collective_timeout_s
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not t > 0:
            raise ValueError(f"collective_timeout_s: must be a number of seconds > 0, got {t!r}")


@dataclass(frozen=True)
class SamplingDefaults:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 256


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    sampling: SamplingDefaults = field(default_factory=SamplingDefaults)
    speculative: SpeculativeConfig | None = None        # off unless asked for
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    # vLLM-named engine arguments -> (section, field)
    ENGINE_ARGS = {
        "model": ("model", "model"),
        "dtype": ("model", "dtype"),
        "max_model_len": ("model", "max_model_len"),
        "seed": ("model", "seed"),
        "tokenizer": ("model", "tokenizer"),
        "device": ("model", "device"),
        "enforce_eager": ("model", "enforce_eager"),
        "quantization": ("model", "quantization"),
        "router_weights_threshold": ("model", "router_weights_threshold"),
        "gpu_memory_utilization": ("cache", "gpu_memory_utilization"),
        "block_size": ("cache", "block_size"),
        "kv_cache_memory_bytes": ("cache", "kv_cache_memory_bytes"),
        "enable_prefix_caching": ("cache", "enable_prefix_caching"),
        "kv_cache_dtype": ("cache", "kv_cache_dtype"),
        "swap_space": ("cache", "swap_space"),
        "kv_disk_path": ("cache", "kv_disk_path"),
        "kv_disk_bytes": ("cache", "kv_disk_bytes"),
        "max_num_batched_tokens": ("scheduler", "max_num_batched_tokens"),
        "max_num_seqs": ("scheduler", "max_num_seqs"),
        "enable_chunked_prefill": ("scheduler", "enable_chunked_prefill"),
        "scheduling_policy": ("scheduler", "policy"),
        "tensor_parallel_size": ("parallel", "tensor_parallel_size"),
    }

    @classmethod
    def load(cls, path: str | os.PathLike | None = None, env: dict[str, str] | None = None,
             profile: str | None = None, **engine_args: Any) -> EngineConfig:
        """YAML (default `configs/engine.yaml`) < profile (`configs/profiles/<name>.yaml`)
        < environment `INFERENCE_<SECTION>_<KEY>` < keyword arguments (explicit flags)."""
        path = Path(path) if path else shipped("engine.yaml")
        section_cls = {"model": ModelConfig, "cache": CacheConfig,
                       "scheduler": SchedulerConfig, "sampling": SamplingDefaults, "parallel": ParallelConfig}
        values: dict[str, dict[str, Any]] = {name: {} for name in section_cls}
        layers = [path] if path.exists() else []
        if profile is not None:
            profile_path = shipped("profiles", f"{profile}.yaml")
            if not profile_path.exists():
                known = sorted(p.stem for p in shipped("profiles").glob("*.yaml"))
                raise ValueError(f"profile: unknown profile {profile!r}; known: {known}")
            layers.append(profile_path)
        speculative: Any = None       # a whole section: the last layer that names it wins
        for layer in layers:
            raw = yaml.safe_load(layer.read_text()) or {}
            if not isinstance(raw, dict) or set(raw) - set(section_cls) - {"speculative"}:
                raise ValueError(f"{layer}: top-level keys must be among {sorted([*section_cls, 'speculative'])}")
            if "speculative" in raw:
                speculative = raw.pop("speculative")
            for name, sub in raw.items():
                unknown = set(sub or {}) - {f.name for f in dataclasses.fields(section_cls[name])}
                if unknown:
                    raise ValueError(f"{layer}: unknown keys in section {name!r}: {sorted(unknown)}")
                values[name].update(sub or {})
        env = os.environ if env is None else env
        for name, klass in section_cls.items():
            for f in dataclasses.fields(klass):
                key = f"INFERENCE_{name.upper()}_{f.name.upper()}"
                if key in env:
                    values[name][f.name] = _parse_env(key, env[key], f.type)
        if "INFERENCE_SPECULATIVE_CONFIG" in env:              # JSON, or "none"
            text = env["INFERENCE_SPECULATIVE_CONFIG"]
            speculative = None if text.strip().lower() in ("", "none", "null") else text
        if "speculative_config" in engine_args:                # None here turns it off
            speculative = engine_args.pop("speculative_config")
        speculative = SpeculativeConfig.parse(speculative)
        for arg, value in engine_args.items():
            if arg not in cls.ENGINE_ARGS:
                raise ValueError(f"unknown engine argument {arg!r}; known: "
                                 f"{sorted([*cls.ENGINE_ARGS, 'speculative_config'])}")
            section, key = cls.ENGINE_ARGS[arg]
            values[section][key] = value
        return cls(**{name: section_cls[name](**values[name]) for name in section_cls}, speculative=speculative)


def _parse_env(key: str, text: str, type_name: Any) -> Any:
    type_name = str(type_name)
    if text.lower() in ("none", "null", ""):
        return None
    try:
        if "bool" in type_name:
            if text.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(text)
            return text.lower() in ("1", "true", "yes")
        if "int" in type_name:
            return int(text)
        if "float" in type_name:
            return float(text)
    except ValueError:
        raise ValueError(f"environment {key}={text!r}: expected {type_name}") from None
    return text
