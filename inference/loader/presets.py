"""`random:<preset>` architectures: real model shapes with random weights, for benchmarks and tests."""
from __future__ import annotations

from typing import Any

_LLAMA2_7B = dict(model_type="llama", vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                  num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                  max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0,
                  bos_token_id=1, eos_token_id=2)

_LLAMA3_8B = dict(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                  num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                  max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0,
                  bos_token_id=128000, eos_token_id=128001)

PRESETS: dict[str, dict[str, Any]] = {
    # A few-MB model for tests: GQA 4:2, untied embeddings.
    "tiny": dict(model_type="llama", vocab_size=512, hidden_size=64, intermediate_size=128,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 max_position_embeddings=1024, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2),
    # Real attention shapes at test size: head_dim 128, GQA 4:1, block-crossing contexts.
    "tiny-gqa": dict(model_type="llama", vocab_size=512, hidden_size=512, intermediate_size=768,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                     max_position_embeddings=1024, rms_norm_eps=1e-5, rope_theta=500000.0,
                     bos_token_id=1, eos_token_id=2),
    "smollm2-135m": dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2),
    "llama-2-7b": _LLAMA2_7B,
    "llama-2-13b": {**_LLAMA2_7B, "hidden_size": 5120, "intermediate_size": 13824,
                    "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 40},
    "llama-3-8b": _LLAMA3_8B,
    # 70B shapes (tensor-parallel benchmarks): GQA 64:8, ~138 GB in bf16
    "llama-2-70b": {**_LLAMA2_7B, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                    "num_attention_heads": 64, "num_key_value_heads": 8},
    "llama-3-70b": {**_LLAMA3_8B, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                    "num_attention_heads": 64, "num_key_value_heads": 8},
    "llama-3.1-8b": {**_LLAMA3_8B, "max_position_embeddings": 131072,
                     "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
    "mistral-7b": dict(model_type="mistral", vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                       max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=1000000.0,
                       bos_token_id=1, eos_token_id=2),
    # Qwen2.5-Coder-0.5B's shapes (the default model's GGUF: untied head, QKV bias)
    "qwen2.5-0.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
                         bos_token_id=151643, eos_token_id=151645),
    "qwen2-7b": dict(model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                     num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                     max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
                     bos_token_id=151643, eos_token_id=151645),
}


PRESETS.update({
    # mixture of experts at test size: Mixtral-style (4 experts, top 2) and Qwen2-MoE-style (shared
    # expert, no renormalisation, layer 1 dense)
    "tiny-moe": dict(model_type="mixtral", vocab_size=512, hidden_size=64, intermediate_size=96,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                     num_experts_per_tok=2, max_position_embeddings=1024, rms_norm_eps=1e-5, bos_token_id=1,
                     eos_token_id=2),
    "tiny-qwen2-moe": dict(model_type="qwen2_moe", vocab_size=512, hidden_size=64, intermediate_size=128,
                           moe_intermediate_size=32, shared_expert_intermediate_size=64, num_experts=8,
                           num_experts_per_tok=2, mlp_only_layers=[1], num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                           rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2),
    # 46.7 B parameters, 12.9 B active per token (2 of 8 experts): ~93 GB in bf16
    "mixtral-8x7b": dict(model_type="mixtral", vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=32768,
                         rms_norm_eps=1e-5, rope_theta=1000000.0, bos_token_id=1, eos_token_id=2),
})


def preset_config(name: str) -> dict[str, Any]:
    if name not in PRESETS:
        raise ValueError(f"model: unknown random preset {name!r}; known: {sorted(PRESETS)}")
    return dict(PRESETS[name])
