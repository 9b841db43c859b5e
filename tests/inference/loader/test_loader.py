"""Model loading: GGUF conversion cache, random presets, bad checkpoints."""
from __future__ import annotations

import json

import pytest
import torch

from inference.config import ModelConfig
from inference.loader import gguf
from inference.loader.model_loader import load_model, resolve_model_dir
from inference.loader.presets import PRESETS
from inference.models.arch import ModelArch


def test_smollm2_converted_once_then_reused(smollm2_dir, monkeypatch):
    assert (smollm2_dir / "model.safetensors").exists() and (smollm2_dir / "tokenizer.json").exists()
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 30 and cfg["num_key_value_heads"] == 3 and cfg["tie_word_embeddings"]
    called = []
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", lambda *a, **k: called.append(a))
    assert resolve_model_dir("smollm2") == smollm2_dir          # cached: no conversion
    assert not called


def test_gguf_cache_dir_follows_env(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERENCE_CACHE_DIR", str(tmp_path))
    fake = tmp_path / "m.gguf"
    fake.write_bytes(b"GGUF")
    assert gguf.converted_dir(fake).parent == tmp_path / "models"


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_describe_valid_architectures(preset):
    arch = ModelArch.from_hf_config(PRESETS[preset])
    assert arch.num_attention_heads % arch.num_key_value_heads == 0
    if preset == "llama-2-7b":
        assert 6.5e9 < arch.num_params() < 7e9


def test_random_tiny_loads_deterministically():
    a = load_model(ModelConfig(model="random:tiny", dtype="float32", seed=3))
    b = load_model(ModelConfig(model="random:tiny", dtype="float32", seed=3))
    for (na, pa), (_, pb) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert torch.equal(pa, pb), na
    assert a.max_model_len == PRESETS["tiny"]["max_position_embeddings"]


def test_a_random_model_takes_a_tokenizer_directory(smollm2_dir):
    from inference.core.tokenizer import ByteTokenizer, HFTokenizer
    assert isinstance(load_model(ModelConfig(model="random:tiny", dtype="float32")).tokenizer, ByteTokenizer)
    loaded = load_model(ModelConfig(model="random:tiny", dtype="float32", tokenizer=str(smollm2_dir)))
    assert isinstance(loaded.tokenizer, HFTokenizer) and loaded.tokenizer.encode("hello")


def test_bad_checkpoints_are_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**PRESETS["tiny"], "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="model_type"):
        load_model(ModelConfig(model=str(tmp_path)))
    (tmp_path / "config.json").write_text(json.dumps(PRESETS["tiny"]))
    with pytest.raises(ValueError, match="safetensors"):
        load_model(ModelConfig(model=str(tmp_path)))
    with pytest.raises(ValueError, match="max_model_len"):
        load_model(ModelConfig(model="random:tiny", max_model_len=10 ** 6))
    with pytest.raises(ValueError, match="random preset"):
        load_model(ModelConfig(model="random:nope"))


def test_auto_dtype_is_bf16_for_gguf_codes_on_a_cpu_without_bf16(monkeypatch):
    """An AVX-512 VNNI CPU without AVX512_BF16 (Intel Xeon family 6 model 207) still runs a GGUF
    file on its codes: the kernels need int8 dot products, not bf16 arithmetic. Other models stay fp32."""
    from inference.config import ModelConfig
    from inference.loader import model_loader
    from inference.models.gguf_cpu_linear import gguf_matmul_available
    monkeypatch.setattr(model_loader, "_cpu_has_bf16", lambda: False)
    gguf = model_loader.plan_load(ModelConfig(model="smollm2")).dtype
    assert gguf == (torch.bfloat16 if gguf_matmul_available() else torch.float32)
    assert model_loader.plan_load(ModelConfig(model="random:tiny")).dtype == torch.float32
    assert model_loader.plan_load(ModelConfig(model="smollm2", quantization="int8")).dtype == torch.float32
    monkeypatch.setenv("INFERENCE_GGUF_CODES", "0")
    assert model_loader.plan_load(ModelConfig(model="smollm2")).dtype == torch.float32
