"""Config: YAML < environment < keyword arguments, validated on construction."""
from __future__ import annotations

import dataclasses

import pytest

from inference.config import EngineConfig


def test_yaml_env_and_kwargs_precedence(tmp_path):
    path = tmp_path / "engine.yaml"
    path.write_text("model: {model: random:tiny, max_model_len: 128}\n"
                    "scheduler: {max_num_seqs: 7, max_num_batched_tokens: 64}\n"
                    "cache: {block_size: 8}\n")
    env = {"INFERENCE_SCHEDULER_MAX_NUM_SEQS": "9", "INFERENCE_CACHE_ENABLE_PREFIX_CACHING": "false"}
    cfg = EngineConfig.load(path, env=env, max_num_batched_tokens=32)
    assert cfg.model.model == "random:tiny" and cfg.model.max_model_len == 128
    assert cfg.scheduler.max_num_seqs == 9                    # env beats YAML
    assert cfg.scheduler.max_num_batched_tokens == 32         # kwargs beat YAML
    assert cfg.cache.enable_prefix_caching is False and cfg.cache.block_size == 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.cache.block_size = 32                             # frozen


def test_default_yaml_loads():
    cfg = EngineConfig.load(env={})
    assert cfg.model.model == "qwen2.5-coder-0.5b" and cfg.cache.block_size == 16


@pytest.mark.parametrize("kwargs, message", [
    ({"block_size": 12}, "^block_size"), ({"max_num_seqs": 0}, "^max_num_seqs"),
    ({"dtype": "float8"}, "^dtype"), ({"scheduling_policy": "lifo"}, "^policy"),
    ({"max_model_len": 0}, "^max_model_len"), ({"kv_cache_memory_bytes": 0}, "^kv_cache_memory_bytes"),
    ({"gpu_magic": 1}, "unknown engine argument"),
])
def test_bad_values_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig.load(env={}, **kwargs)


def test_speculative_config_from_profile_env_and_flags(tmp_path):
    from inference.spec_decode.config import SpeculativeConfig
    low = EngineConfig.load(env={}, profile="low-latency")
    assert low.speculative == SpeculativeConfig("ngram", 8)
    assert EngineConfig.load(env={}, profile="balanced").speculative is None
    assert EngineConfig.load(env={}, profile="low-latency", speculative_config=None).speculative is None
    env = {"INFERENCE_SPECULATIVE_CONFIG": '{"method": "ngram", "num_speculative_tokens": 2}'}
    assert EngineConfig.load(env=env).speculative == SpeculativeConfig("ngram", 2)
    assert EngineConfig.load(env={"INFERENCE_SPECULATIVE_CONFIG": "none"}, profile="low-latency").speculative is None
    path = tmp_path / "engine.yaml"
    path.write_text("speculative: {method: ngram, num_speculative_tokens: 0}\n")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        EngineConfig.load(path, env={})


def test_bad_env_and_unknown_yaml_keys(tmp_path):
    with pytest.raises(ValueError, match="INFERENCE_SCHEDULER_MAX_NUM_SEQS"):
        EngineConfig.load(env={"INFERENCE_SCHEDULER_MAX_NUM_SEQS": "many"})
    path = tmp_path / "engine.yaml"
    path.write_text("cache: {blok_size: 8}\n")
    with pytest.raises(ValueError, match="blok_size"):
        EngineConfig.load(path, env={})


def test_profiles_layer_between_yaml_and_flags():
    low = EngineConfig.load(env={}, profile="low-latency")
    high = EngineConfig.load(env={}, profile="high-throughput")
    assert low.scheduler.max_num_seqs < EngineConfig.load(env={}, profile="balanced").scheduler.max_num_seqs \
        < high.scheduler.max_num_seqs
    assert low.model.model == "qwen2.5-coder-0.5b"                       # the rest comes from engine.yaml
    flagged = EngineConfig.load(env={}, profile="high-throughput", max_num_seqs=3)
    assert flagged.scheduler.max_num_seqs == 3                           # explicit flags win
    assert flagged.scheduler.max_num_batched_tokens == high.scheduler.max_num_batched_tokens
    with pytest.raises(ValueError, match="^profile.*low-latency"):
        EngineConfig.load(env={}, profile="fastest")


def test_the_cpu_kv_default_holds_one_full_length_sequence():
    """Qwen2.5-Coder-1.5B at its 32k context needs 896 MiB of KV: the 512 MiB default grows to fit it,
    while a smaller model keeps 512 MiB; an explicit size that cannot hold one sequence still fails."""
    import torch

    from inference.config import CacheConfig
    from inference.loader.presets import preset_config
    from inference.models.arch import ModelArch
    from inference.worker.kv_sizing import CPU_KV_CACHE_BYTES, default_cpu_kv_bytes, num_kv_blocks

    class Loaded:                       # what the sizing reads of a LoadedModel
        def __init__(self, preset, max_len):
            self.arch = ModelArch.from_hf_config(preset_config(preset))
            self.max_model_len, self.dtype = max_len, torch.bfloat16

    cache = CacheConfig()
    big = Loaded("qwen2-7b", 32768)                 # 28 layers, 4 KV heads of 128: 56 KiB a token
    assert default_cpu_kv_bytes(big, cache) == 32768 * 28 * 2 * 4 * 128 * 2 > CPU_KV_CACHE_BYTES
    assert num_kv_blocks(big, cache, default_cpu_kv_bytes(big, cache), "x") == 2048
    assert default_cpu_kv_bytes(Loaded("smollm2-135m", 2048), cache) == CPU_KV_CACHE_BYTES
    with pytest.raises(ValueError, match="raise kv_cache_memory_bytes"):
        num_kv_blocks(big, cache, CPU_KV_CACHE_BYTES, "kv_cache_memory_bytes")
