"""Our engine against HF transformers: greedy tokens on SmolLM2, logprobs on random tiny configs."""
from __future__ import annotations

import pytest
import torch

from inference import LLM, SamplingParams
from tests.conftest import assert_all_blocks_free

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "Here is a list of fruits: apple, banana,",
    "1, 2, 3, 4,",
    "Translate to French: Good morning, how are you?",
]
NEW_TOKENS = 24


def hf_greedy(hf, prompt_ids: list[int], n: int, eos: int) -> list[int]:
    ids = torch.tensor([prompt_ids])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                      eos_token_id=eos, pad_token_id=eos)[0, len(prompt_ids):].tolist()
    return out


@pytest.mark.slow
def test_greedy_matches_hf_alone_and_batched(llm_fp32, hf_smollm2):
    hf, tok = hf_smollm2
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS)
    batched = llm_fp32.generate(PROMPTS, params, use_tqdm=False)
    for prompt, out in zip(PROMPTS, batched):
        assert out.prompt_token_ids == tok(prompt).input_ids
        expected = hf_greedy(hf, out.prompt_token_ids, NEW_TOKENS, tok.eos_token_id)
        assert out.outputs[0].token_ids == expected, prompt
        alone = llm_fp32.generate(prompt, params, use_tqdm=False)[0]
        assert alone.outputs[0].token_ids == expected, prompt
    assert_all_blocks_free(llm_fp32)


@pytest.mark.slow
def test_mixed_batch_with_different_lengths_matches_hf(llm_fp32, hf_smollm2):
    hf, tok = hf_smollm2
    long_prompt = " ".join(["The quick brown fox jumps over the lazy dog."] * 12)
    prompts = [long_prompt, "Hi", PROMPTS[2]]
    lengths = [5, 17, 11]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    outs = llm_fp32.generate(prompts, params, use_tqdm=False)
    for out, n in zip(outs, lengths):
        ids = torch.tensor([out.prompt_token_ids])
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, pad_token_id=0)[0, ids.shape[1]:].tolist()
        got = out.outputs[0].token_ids
        # HF's min_new_tokens masks EOS; compare up to the first EOS either side could emit.
        k = next((i for i, t in enumerate(got) if t == tok.eos_token_id), n)
        assert got[:k] == ref[:k]
        assert len(got) == n and out.outputs[0].finish_reason == "length"


TINY = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
CONFIGS = {
    "llama-gqa-untied": ("llama", dict(TINY, tie_word_embeddings=False)),
    "llama-mqa-tied": ("llama", dict(TINY, num_key_value_heads=1, tie_word_embeddings=True)),
    "llama3-rope-scaling": ("llama", dict(TINY, rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64})),
    "llama-linear-rope-bias": ("llama", dict(TINY, attention_bias=True,
                                             rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "qwen2-bias": ("qwen2", dict(TINY, tie_word_embeddings=False)),
    "mistral": ("mistral", dict(TINY, sliding_window=4096)),
    "head-dim-override": ("llama", dict(TINY, head_dim=32)),
    # mixture of experts: Mixtral (renormalised top-2 of 4), Qwen2-MoE (shared expert, top-2 of 6 as
    # is, layer 1 dense), Qwen2-MoE with renormalisation and every 2nd layer sparse
    "mixtral": ("mixtral", dict(TINY, num_local_experts=4, num_experts_per_tok=2)),
    "qwen2-moe-shared": ("qwen2_moe", dict(TINY, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
                                           shared_expert_intermediate_size=48, mlp_only_layers=[1])),
    "qwen2-moe-norm-topk": ("qwen2_moe", dict(TINY, num_experts=4, num_experts_per_tok=3, moe_intermediate_size=40,
                                              shared_expert_intermediate_size=24, norm_topk_prob=True,
                                              decoder_sparse_step=2)),
}


def _save_hf_model(kind: str, cfg: dict, path) -> torch.nn.Module:
    import transformers
    config_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
                  "mistral": transformers.MistralConfig, "mixtral": transformers.MixtralConfig,
                  "qwen2_moe": transformers.Qwen2MoeConfig}[kind]
    model_cls = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
                 "mistral": transformers.MistralForCausalLM, "mixtral": transformers.MixtralForCausalLM,
                 "qwen2_moe": transformers.Qwen2MoeForCausalLM}[kind]
    torch.manual_seed(hash(str(sorted(cfg.items()))) % 2**31)
    model = model_cls(config_cls(**cfg)).eval()
    with torch.no_grad():           # HF inits biases to zero; make them matter
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            elif name.endswith(("gate.weight", "shared_expert_gate.weight")):   # routers: no near-ties
                p.add_(torch.randn_like(p) * 0.5)
    model.save_pretrained(path, max_shard_size="200KB")   # sharded: exercises the index file
    return model


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logprobs_close_to_hf_on_random_configs(name, tmp_path):
    kind, cfg = CONFIGS[name]
    hf = _save_hf_model(kind, cfg, tmp_path)
    assert (tmp_path / "model.safetensors.index.json").exists()
    # The HF directory has no tokenizer: pass token ids; the byte tokenizer only serves decoding.
    llm = LLM(str(tmp_path), dtype="float32", max_model_len=256,
              kv_cache_memory_bytes=8 << 20, block_size=4)
    gen = torch.Generator().manual_seed(len(name))
    prompt = torch.randint(3, cfg["vocab_size"], (37,), generator=gen).tolist()
    n = 12
    out = llm.generate({"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True,
                                                                     logprobs=5), use_tqdm=False)[0]
    tokens = out.outputs[0].token_ids
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        ref = torch.log_softmax(hf(ids).logits[0].float(), dim=-1)           # [L, vocab]
    for step, (token, lps) in enumerate(zip(tokens, out.outputs[0].logprobs)):
        row = ref[len(prompt) - 1 + step]
        assert token == int(row.argmax()), f"step {step}"
        for tid, lp in lps.items():
            assert abs(lp.logprob - float(row[tid])) < 2e-4, (step, tid)
        assert len(lps) == 5
    assert_all_blocks_free(llm)
