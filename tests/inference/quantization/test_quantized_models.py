"""Quantized models end to end: the transform, AWQ's folding, GPTQ / AWQ checkpoints on disk
(checked against the formats' own definitions), loading, engine arguments, bad input."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from inference import LLM, SamplingParams
from inference.config import ModelConfig
from inference.loader.model_loader import load_model
from inference.models.llama import DECODER_LINEARS
from inference.quantization.awq import apply_awq_scales
from inference.quantization.calibration import LayerwiseCalibration, forward_logits, stdlib_windows
from inference.quantization.config import QuantConfig
from inference.quantization.quant_linear import QuantLinear
from inference.quantization.scale_tuning import teacher_hidden, tune_scales
from inference.quantization.transform import quantize_model
from inference.quantization.workflow import quantize_to_dir
from tests.conftest import assert_all_blocks_free

TINY = "random:tiny-gqa"          # head_dim 128, 4 query heads per KV head


def tiny(seed: int = 0):
    return load_model(ModelConfig(model=TINY, dtype="float32", seed=seed))


def rand_ids(n: int, seed: int, vocab: int) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_awq_folding_keeps_the_unquantized_function():
    # Scaling weight columns up and folding 1/s into norms, up rows and V rows must not change
    # the model at all before rounding: the logits stay put on unseen tokens.
    lm = tiny(1)
    vocab = lm.arch.vocab_size
    calib = [rand_ids(48, s, vocab) for s in range(3)]
    probe = rand_ids(40, 99, vocab)
    before = forward_logits(lm.model, probe)
    cal = LayerwiseCalibration(lm.model, calib)
    cfg = QuantConfig("awq", 4, 32)
    alphas = []
    for layer in lm.model.layers:
        alphas.append(apply_awq_scales(layer, lm.arch, cal.stats(layer, list(DECODER_LINEARS), False, 64), cfg))
        cal.advance(layer)
    assert any(a > 0 for layer in alphas for a, _ in layer.values()), "every scale search chose alpha 0"
    after = forward_logits(lm.model, probe)
    assert torch.allclose(before, after, atol=2e-4, rtol=1e-4), float((before - after).abs().max())


@pytest.mark.parametrize("method,bits,group,act_order,awq_scales,tune", [
    ("rtn", 8, -1, False, False, 0), ("gptq", 4, 32, False, False, 0), ("gptq", 4, 64, True, False, 0),
    ("gptq", 4, 32, True, True, 1), ("awq", 4, 64, False, False, 1)])
def test_quantized_checkpoint_round_trip(tmp_path, method, bits, group, act_order, awq_scales, tune):
    """quantize -> write the HF-format directory -> load it: the same logits as the model in memory
    (act-order too: static groups keep g_idx = i // group_size, which the loader checks; tuned
    scales too: they are ordinary fp16 scales)."""
    lm = tiny(2)
    vocab = lm.arch.vocab_size
    calib = [rand_ids(64, s, vocab) for s in range(4)]
    cfg = QuantConfig(method, bits, group, symmetric=method == "rtn", act_order=act_order, awq_scales=awq_scales,
                      tune_epochs=tune)
    info = quantize_model(lm.model, cfg, None if method == "rtn" else calib, progress=False)
    assert bool(info["scale_tuning"]) == bool(tune)
    probe = rand_ids(33, 7, vocab)
    want = forward_logits(lm.model, probe)
    from inference.loader.presets import preset_config
    from inference.quantization.checkpoint import save_quantized
    save_quantized(lm.model, cfg, tmp_path, preset_config("tiny-gqa"), None, torch.float32)
    qc = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == ("awq" if method == "awq" else "gptq") and qc["bits"] == bits
    assert QuantConfig.from_hf(qc) == cfg and qc.get("scale_tuning_epochs", 0) == tune
    if method != "awq":
        assert qc["desc_act"] == qc["static_groups"] == act_order
        with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
            g_idx = f.get_tensor("model.layers.0.mlp.down_proj.g_idx").long()
        assert torch.equal(g_idx, torch.arange(len(g_idx)) // cfg.group_len(len(g_idx)))
    loaded = load_model(ModelConfig(model=str(tmp_path), dtype="float32"))
    assert sum(isinstance(m, QuantLinear) for m in loaded.model.modules()) == 4 * loaded.arch.num_hidden_layers
    got = forward_logits(loaded.model, probe)
    assert torch.allclose(got, want, atol=1e-5), float((got - want).abs().max())


def test_scale_tuning_lowers_its_objective_and_keeps_codes_and_zeros():
    # GPTQ's codes and zero points stay; the tuned scales, as stored (fp16-representable), must
    # bring the next-token distributions closer to the unquantized model's on the tuning windows.
    # (Whether that carries over to unseen text is bench/cpu/quality.py's question, on real weights:
    # a tiny random model with a few windows of random tokens overfits them.)
    lm = tiny(3)
    vocab = lm.arch.vocab_size
    calib = [rand_ids(64, s, vocab) for s in range(8)]
    ref = [forward_logits(lm.model, w).log_softmax(-1) for w in calib]
    teacher = teacher_hidden(lm.model, calib)
    quantize_model(lm.model, QuantConfig("awq", 4, 32), calib, progress=False)

    def kl() -> float:
        return sum(float((r.exp() * (r - forward_logits(lm.model, w).log_softmax(-1))).sum(-1).mean())
                   for r, w in zip(ref, calib)) / len(calib)
    linears = [m for m in lm.model.modules() if isinstance(m, QuantLinear)]
    before = [(m.qweight.clone(), m.zeros.clone(), m.scales.clone()) for m in linears]
    kl_before = kl()
    lm.model.norm.weight.requires_grad_(True)      # the caller's flags come back as they were
    flags = {n: p.requires_grad for n, p in lm.model.named_parameters()}
    info = tune_scales(lm.model, calib, teacher, epochs=3, lr=3e-3, progress=False)
    assert {n: p.requires_grad for n, p in lm.model.named_parameters()} == flags
    assert all(p.grad is None for p in lm.model.parameters())
    assert info["last_epoch_kl"] < info["first_epoch_kl"]
    kl_after = kl()
    assert kl_after < 0.8 * kl_before, (kl_before, kl_after)
    for m, (codes, zeros, scales) in zip(linears, before):
        assert torch.equal(m.qweight, codes) and torch.equal(m.zeros, zeros)
        assert not torch.equal(m.scales, scales) and torch.equal(m.scales, m.scales.half().float())
        assert not m.scales.requires_grad
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="epochs must be an integer >= 1"):
            tune_scales(lm.model, calib, teacher, epochs=bad)
    tuned = [m.scales.clone() for m in linears]         # an error mid-run keeps the scales it had
    with pytest.raises(RuntimeError):            # a teacher of the wrong length, found mid-epoch
        tune_scales(lm.model, calib, teacher[:-1] + [teacher[-1][:0]], epochs=1, progress=False)
    assert all(torch.equal(m.scales, s) for m, s in zip(linears, tuned))
    assert all("forward" not in vars(m) for m in linears)
    with pytest.raises(ValueError, match="needs calibration windows"):
        QuantConfig("rtn", 4, 128, tune_epochs=1)
    for bad in (-1, True):
        with pytest.raises(ValueError, match="integer >= 0"):
            QuantConfig("gptq", 4, 128, tune_epochs=bad)
    with pytest.raises(ValueError, match="scale_tuning_epochs must be an integer"):
        QuantConfig.from_hf({**QuantConfig("gptq", 4, 128).to_hf(), "scale_tuning_epochs": "x"})


def test_awq_scaling_divides_each_hessian_by_s_s():
    # GPTQ after AWQ reuses the pass's Hessians: x -> x / s must turn H into H / (s s^T) for
    # every linear, the o_proj (s shared within a KV head's query heads) and down_proj too
    lm = tiny(5)
    cal = LayerwiseCalibration(lm.model, [rand_ids(40, s, lm.arch.vocab_size) for s in range(3)])
    layer = lm.model.layers[0]
    before = cal.stats(layer, list(DECODER_LINEARS), with_hessian=True, sample_rows=256)
    chosen = apply_awq_scales(layer, lm.arch, before, QuantConfig("awq", 4, 32))
    after = cal.stats(layer, list(DECODER_LINEARS), with_hessian=True, sample_rows=0)
    for name, (_, s) in chosen.items():
        s = s.double()
        want = before[name].hessian / (s[:, None] * s[None, :])
        got = after[name].hessian
        assert torch.allclose(got, want, rtol=1e-3, atol=1e-5 * float(want.abs().max())), name


def test_a_permuted_g_idx_is_a_clear_error(tmp_path):
    # act-order without static groups (HF GPTQ's desc_act g_idx) is refused, by config and by g_idx
    lm = tiny(2)
    cfg = QuantConfig("gptq", 4, 32, act_order=True)
    quantize_model(lm.model, cfg, [rand_ids(48, s, lm.arch.vocab_size) for s in range(2)], progress=False)
    from inference.loader.presets import preset_config
    from inference.quantization.checkpoint import save_quantized
    save_quantized(lm.model, cfg, tmp_path, preset_config("tiny-gqa"), None, torch.float32)
    config = json.loads((tmp_path / "config.json").read_text())
    with pytest.raises(ValueError, match="static_groups"):
        QuantConfig.from_hf({**config["quantization_config"], "static_groups": False})
    path = tmp_path / "model.safetensors"
    tensors = load_file(str(path))
    key = "model.layers.0.mlp.down_proj.g_idx"
    tensors[key] = tensors[key].flip(0).contiguous()
    save_file(tensors, str(path))
    with pytest.raises(ValueError, match="g_idx"):
        load_model(ModelConfig(model=str(tmp_path), dtype="float32"))


def _dequant_from_format(f, prefix: str, qc: dict) -> torch.Tensor:
    """W [out, in] straight from the on-disk format's definition (independent of our unpacker)."""
    bits, group = qc["bits"], qc["group_size"]
    qweight = f.get_tensor(f"{prefix}.qweight").to(torch.int64) & 0xFFFFFFFF
    qzeros = f.get_tensor(f"{prefix}.qzeros").to(torch.int64) & 0xFFFFFFFF
    scales = f.get_tensor(f"{prefix}.scales").float()
    mask, pack = (1 << bits) - 1, 32 // bits
    if qc["quant_method"] == "gptq":
        n, out = qweight.shape[0] * pack, qweight.shape[1]
        i = torch.arange(n)
        q = (qweight[i // pack] >> (bits * (i % pack))[:, None]) & mask                    # [in, out]
        g = f.get_tensor(f"{prefix}.g_idx").long()
        o = torch.arange(out)
        z = ((qzeros[:, o // pack] >> (bits * (o % pack))[None, :]) & mask) + 1             # [G, out]
        return (scales[g] * (q - z[g])).t()
    order = [0, 2, 4, 6, 1, 3, 5, 7]                                   # nibble k holds column order[k]
    n, out = qweight.shape[0], qweight.shape[1] * 8
    col = torch.arange(out)
    nib = torch.tensor([order.index(c % 8) for c in range(out)])
    q = (qweight[:, col // 8] >> (4 * nib)[None, :]) & 0xF                                 # [in, out]
    z = (qzeros[:, col // 8] >> (4 * nib)[None, :]) & 0xF
    g = torch.arange(n) // group
    return (scales[g] * (q - z[g])).t()


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_written_tensors_follow_the_hf_formats(tmp_path, method):
    lm = tiny(3)
    calib = [rand_ids(64, s, lm.arch.vocab_size) for s in range(3)]
    cfg = QuantConfig(method, 4, 64)
    quantize_model(lm.model, cfg, calib, progress=False)
    from inference.loader.presets import preset_config
    from inference.quantization.checkpoint import save_quantized
    save_quantized(lm.model, cfg, tmp_path, preset_config("tiny-gqa"), None, torch.float32)
    qc = cfg.to_hf()
    attn = lm.model.layers[1].self_attn
    q_rows, kv_rows = attn.q_size, attn.kv_size
    mine = attn.qkv_proj.dequantized()
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        for proj, rows in (("q_proj", slice(0, q_rows)), ("v_proj", slice(q_rows + kv_rows, q_rows + 2 * kv_rows))):
            w = _dequant_from_format(f, f"model.layers.1.self_attn.{proj}", qc)
            assert torch.allclose(w, mine[rows], atol=1e-6), proj


def test_mismatched_checkpoint_is_a_clear_error_before_loading(tmp_path):
    summary = quantize_to_dir(TINY, "rtn", 4, 32, tmp_path / "q", progress=False, save_dtype="float32")
    cfg_path = tmp_path / "q" / "config.json"
    config = json.loads(cfg_path.read_text())
    config["quantization_config"]["bits"] = 8                 # the tensors are 4-bit
    cfg_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"qweight has shape .* bits=8"):
        load_model(ModelConfig(model=summary["out"], dtype="float32"))
    config["quantization_config"].update(bits=4, group_size=64)
    cfg_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="group_size=64"):
        load_model(ModelConfig(model=summary["out"], dtype="float32"))
    config["quantization_config"].update(group_size=32)
    cfg_path.write_text(json.dumps(config))
    tensors = load_file(str(tmp_path / "q" / "model.safetensors"))
    tensors["model.layers.0.mlp.down_proj.g_idx"] = tensors["model.layers.0.mlp.down_proj.g_idx"].flip(0)
    save_file(tensors, str(tmp_path / "q" / "model.safetensors"))
    with pytest.raises(ValueError, match="act-order"):
        load_model(ModelConfig(model=summary["out"], dtype="float32"))


def test_engine_arguments_and_their_errors(tmp_path):
    with pytest.raises(ValueError, match="quantization: must be one of"):
        LLM(TINY, quantization="nf4")
    with pytest.raises(ValueError, match="not a quantized checkpoint"):
        load_model(ModelConfig(model="smollm2", quantization="awq"))
    out = quantize_to_dir(TINY, "gptq", 4, 32, tmp_path / "g", num_windows=2, seq_len=32, progress=False)["out"]
    with pytest.raises(ValueError, match="is a gptq checkpoint"):
        load_model(ModelConfig(model=out, quantization="awq"))
    with pytest.raises(ValueError, match="already quantized"):
        load_model(ModelConfig(model=out, quantization="int8"))
    with pytest.raises(ValueError, match="not empty"):
        quantize_to_dir(TINY, "rtn", 4, 32, tmp_path / "g", progress=False)
    # a loaded GPTQ checkpoint serves through the engine, and frees every block
    llm = LLM(out, quantization="gptq", dtype="float32", max_model_len=128, kv_cache_memory_bytes=4 << 20)
    outs = llm.generate([{"prompt_token_ids": rand_ids(20, s, 500)} for s in range(3)],
                        SamplingParams(max_tokens=6, temperature=0, ignore_eos=True), use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 6 for o in outs)
    assert_all_blocks_free(llm)


def test_int8_on_load_tracks_the_full_precision_model(llm_fp32):
    """SmolLM2 with int8 weights (round-to-nearest on load) against fp32 on held-out stdlib text."""
    q = load_model(ModelConfig(model="smollm2", dtype="float32", quantization="int8"))
    ref = llm_fp32.engine.runner.model
    window = stdlib_windows(q.tokenizer, "eval", 1, 256)[0]
    lq, lr = forward_logits(q.model, window).log_softmax(-1), forward_logits(ref, window).log_softmax(-1)
    kl = float((lr.exp() * (lr - lq)).sum(-1).mean())
    agree = float((lq.argmax(-1) == lr.argmax(-1)).float().mean())
    assert kl < 0.02 and agree > 0.93, (kl, agree)


def test_quantize_cli(tmp_path):
    out = tmp_path / "cli"
    ok = subprocess.run([sys.executable, "-m", "inference", "quantize", "--model", TINY, "--method", "awq",
                         "--group-size", "32", "--calib-windows", "2", "--seq-len", "32", "--out", str(out)],
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert "awq format" in ok.stdout and (out / "model.safetensors").exists()
    bad = subprocess.run([sys.executable, "-m", "inference", "quantize", "--model", TINY, "--method", "awq",
                          "--bits", "8", "--out", str(tmp_path / "bad")], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "awq is a 4-bit method" in bad.stderr
    assert not (tmp_path / "bad").exists(), "a bad argument must fail before anything is written"


def kv_cache_kl(llm_fp32, kv_dtype) -> float:
    """Mean KL of next-token distributions, full-precision cache vs a kv_dtype cache, on held-out text."""
    model = llm_fp32.engine.runner.model
    window = stdlib_windows(llm_fp32.get_tokenizer(), "eval", 1, 256)[0]
    a = forward_logits(model, window).log_softmax(-1)
    b = forward_logits(model, window, kv_dtype).log_softmax(-1)
    return float((a.exp() * (a - b)).sum(-1).mean())


def test_fp8_kv_cache(llm_fp32):
    from inference.models.attention import write_kv
    # saturates instead of NaN past e4m3's range, and reads back in the model's dtype
    k_cache = torch.zeros(2, 4, 1, 8, dtype=torch.float8_e4m3fn)
    v_cache = torch.zeros_like(k_cache)
    k = torch.tensor([1000.0, -1000.0, 0.3, 2.0]).repeat(2).view(1, 1, 8)
    write_kv(k_cache, v_cache, k, k, torch.tensor([5]))
    got = k_cache.view(-1, 1, 8)[5].float()
    assert not got.isnan().any() and got[0, 0] == 448 and got[0, 1] == -448
    # twice the tokens of a bf16 cache in the same bytes
    kw = dict(dtype="bfloat16", max_model_len=256, kv_cache_memory_bytes=16 << 20)
    fp8 = LLM("smollm2", kv_cache_dtype="fp8_e4m3", **kw)
    bf16 = LLM("smollm2", **kw)
    assert fp8.engine.runner.num_blocks in (2 * bf16.engine.runner.num_blocks, 2 * bf16.engine.runner.num_blocks + 1)
    outs = fp8.generate(["def add(a, b):", "The capital of France is"],
                        SamplingParams(max_tokens=8, temperature=0), use_tqdm=False)
    assert all(o.outputs[0].token_ids for o in outs)
    assert_all_blocks_free(fp8)
    # next-token distributions stay close to the full-precision cache on held-out text
    kl = kv_cache_kl(llm_fp32, torch.float8_e4m3fn)
    assert kl < 0.05, kl
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLM("smollm2", kv_cache_dtype="int4", **kw)


def test_int8_kv_cache_rows_carry_their_scales():
    from inference.models.attention import dequantize_int8_rows, gather_blocks, quantize_int8_rows, write_kv
    gen = torch.Generator().manual_seed(3)
    k = torch.randn(5, 2, 16, generator=gen) * torch.tensor([0.01, 30.0])[None, :, None]   # heads far apart
    rows = quantize_int8_rows(k)
    assert rows.shape == (5, 2, 20) and rows.dtype == torch.int8
    back = dequantize_int8_rows(rows, torch.float32)
    # each row's error is within half a step of its own scale, whatever the other rows hold
    step = k.abs().amax(-1, keepdim=True) / 127
    assert ((back - k).abs() <= step / 2 + 1e-7).all()
    k_cache = torch.zeros(3, 4, 2, 20, dtype=torch.int8)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.tensor([9, 0, 5, 11, 2])
    write_kv(k_cache, v_cache, k, -k, slots)
    got = gather_blocks(k_cache, torch.tensor([[2, 0, 1]]), torch.float32)[0]            # [12, 2, 16]
    order = {s: i for i, s in enumerate(slots.tolist())}
    for slot, i in order.items():
        block, off = divmod(slot, 4)
        pos = [2, 0, 1].index(block) * 4 + off
        torch.testing.assert_close(got[pos], back[i])
    torch.testing.assert_close(gather_blocks(v_cache, torch.tensor([[0]]), torch.float32)[0, 0], -back[order[0]])


def test_int8_kv_cache_engine(llm_fp32):
    # 68 bytes per 64 values (SmolLM2's head_dim): blocks are 0.53x bf16's, so ~1.9x as many
    kw = dict(dtype="bfloat16", max_model_len=256, kv_cache_memory_bytes=16 << 20)
    int8 = LLM("smollm2", kv_cache_dtype="int8", **kw)
    bf16 = LLM("smollm2", **kw)
    assert int8.engine.runner.kv_caches[0][0].shape[-1] == 64 + 4
    r = int8.engine.runner
    assert r.num_blocks == (16 << 20) // (2 * 30 * r.block_size * 3 * 68)        # 30 layers, 3 KV heads
    assert r.num_blocks >= int(1.8 * bf16.engine.runner.num_blocks)
    # prompts whose first greedy tokens are clear winners ("def add(a, b):" is an exact bf16 tie)
    prompts = ["def add(a, b):\n    return", "1, 2, 3, 4,"]
    outs = int8.generate(prompts, SamplingParams(max_tokens=8, temperature=0), use_tqdm=False)
    want = bf16.generate(prompts,
                         SamplingParams(max_tokens=8, temperature=0), use_tqdm=False)
    assert [o.outputs[0].token_ids[:3] for o in outs] == [o.outputs[0].token_ids[:3] for o in want]
    assert_all_blocks_free(int8)
    kl = kv_cache_kl(llm_fp32, torch.int8)
    assert 0 < kl < 0.02, kl


def test_int8_kv_cache_is_refused_on_cuda_with_a_reason():
    from inference.config import EngineConfig
    from inference.worker.runner_factory import build_runner
    config = EngineConfig.load(model="random:tiny", kv_cache_dtype="int8")
    loaded = type("Loaded", (), {"device": torch.device("cuda")})()
    with pytest.raises(ValueError, match="CPU path only.*fp8_e4m3"):
        build_runner(loaded, config)


def test_qwen2_biases_round_trip_and_missing_biases_are_an_error(tmp_path):
    """A Qwen2-shaped checkpoint (q/k/v biases): quantized, written, loaded with every weight off
    the meta device and the same logits; the same checkpoint without one bias fails clearly."""
    from inference.loader.presets import preset_config
    from inference.loader.weights import build_model, init_random_weights
    from inference.models.arch import ModelArch
    from inference.quantization.checkpoint import save_quantized
    hf = {**preset_config("tiny"), "model_type": "qwen2"}
    arch = ModelArch.from_hf_config(hf)
    model = build_model(arch, 256, torch.float32, torch.device("cpu"))
    init_random_weights(model, 5)
    assert model.layers[0].self_attn.qkv_proj.bias is not None
    cfg = QuantConfig("rtn", 4, 32)
    quantize_model(model, cfg, progress=False)
    save_quantized(model, cfg, tmp_path / "q", hf, None, torch.float32)
    probe = rand_ids(21, 3, arch.vocab_size)
    loaded = load_model(ModelConfig(model=str(tmp_path / "q"), dtype="float32"))
    assert all(p.device.type == "cpu" for p in loaded.model.parameters())      # nothing left on meta
    assert torch.allclose(forward_logits(loaded.model, probe), forward_logits(model, probe), atol=1e-5)
    tensors = load_file(str(tmp_path / "q" / "model.safetensors"))
    del tensors["model.layers.1.self_attn.k_proj.bias"]
    save_file(tensors, str(tmp_path / "q" / "model.safetensors"))
    with pytest.raises(ValueError, match="k_proj.bias is missing"):
        load_model(ModelConfig(model=str(tmp_path / "q"), dtype="float32"))


def test_calibrated_quantization_runs_on_the_cpu_only_for_now(tmp_path):
    with pytest.raises(ValueError, match="--device cpu"):
        quantize_to_dir(TINY, "gptq", 4, 32, tmp_path / "x", device="cuda", progress=False)


def test_fp8_weights_and_activations():
    from inference.quantization.fp8 import Fp8Linear, check_fp8_supported
    gen = torch.Generator().manual_seed(4)
    linear = torch.nn.Linear(64, 48, bias=True)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(48, 64, generator=gen) * 0.05)
    x = torch.randn(2, 7, 64, generator=gen) * torch.rand(2, 7, 1, generator=gen) * 5   # rows of mixed scale
    want = linear(x)
    layer = Fp8Linear(linear)
    got = layer(x)
    assert layer.weight_fp8.dtype == torch.float8_e4m3fn and got.shape == want.shape
    rel = float((got - want).norm() / want.norm())
    assert 0 < rel < 0.06, rel                                   # e4m3 keeps 3 mantissa bits
    # the whole model through the engine, and a clear error on GPUs without FP8
    llm = LLM(TINY, quantization="fp8", dtype="float32", max_model_len=128, kv_cache_memory_bytes=4 << 20)
    assert any(isinstance(m, Fp8Linear) for m in llm.engine.runner.model.modules())
    out = llm.generate({"prompt_token_ids": rand_ids(12, 1, 500)}, SamplingParams(max_tokens=4, ignore_eos=True),
                       use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
    with pytest.raises(ValueError, match=r"compute capability 8\.9\+.*8\.0"):
        check_fp8_supported(torch.device("cuda"), capability=(8, 0))
    check_fp8_supported(torch.device("cuda"), capability=(9, 0))
