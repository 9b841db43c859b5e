"""Mixture-of-experts layers: the router's top-k and threshold, the expert reference against a dense
computation, checkpoints in both expert layouts, the expert-load metric, and bad input caught
before any weight is read. Logits against HF's Mixtral / Qwen2-MoE: tests/inference/models/test_hf_equivalence.py."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from inference import LLM, SamplingParams
from inference.loader.presets import preset_config
from inference.models.arch import ModelArch
from inference.models.moe import SparseMoeBlock, experts_reference, moe_blocks, route, set_router_threshold
from tests.conftest import assert_all_blocks_free
from tests.inference.models.test_hf_equivalence import CONFIGS, _save_hf_model

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def test_route_renormalises_and_thresholds():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.26, 0.25, 0.25, 0.24]]))
    w, ids = route(logits, 2, renormalize=False)
    assert ids.tolist() == [[0, 1], [0, 1]] and torch.allclose(w[0], torch.tensor([0.5, 0.3]))
    w, _ = route(logits, 2, renormalize=True)
    assert torch.allclose(w[0], torch.tensor([0.625, 0.375]))
    # threshold 0.45 of the renormalised weights: row 0 drops its second expert, row 1 keeps both;
    # what is kept is renormalised again
    w, _ = route(logits, 2, renormalize=True, threshold=0.45)
    assert w[0].tolist() == [1.0, 0.0] and (w[1] > 0.45).all()
    # the best expert always stays, however high the threshold
    w, _ = route(logits, 3, renormalize=False, threshold=0.9)
    assert (w[:, 0] > 0).all() and (w[:, 1:] == 0).all()


@pytest.mark.parametrize("renormalize,threshold", [(True, 0.0), (False, 0.0), (True, 0.4)])
def test_expert_reference_matches_a_dense_computation(renormalize, threshold):
    gen = torch.Generator().manual_seed(int(threshold * 10) + renormalize)
    t, h, inter, e, k = 37, 24, 40, 6, 2
    x = torch.randn(t, h, generator=gen)
    w13, w2 = torch.randn(e, 2 * inter, h, generator=gen) * 0.2, torch.randn(e, h, inter, generator=gen) * 0.2
    weights, ids = route(torch.randn(t, e, generator=gen), k, renormalize, threshold)
    dense = torch.stack([torch.nn.functional.silu(x @ w13[j, :inter].T) * (x @ w13[j, inter:].T) @ w2[j].T
                         for j in range(e)], dim=1)                                   # [T, E, H]
    expected = (dense.gather(1, ids[:, :, None].expand(t, k, h)) * weights[:, :, None]).sum(1)
    torch.testing.assert_close(experts_reference(x, w13, w2, weights, ids), expected, rtol=1e-5, atol=1e-5)


def _decisive_router(llm: LLM) -> LLM:
    """Random N(0, 0.02) routers give every expert ~1/E: sharpen them so some weights are small."""
    for _, block in moe_blocks(llm.engine.runner.model):
        block.gate.weight.data *= 60
    return llm


def test_threshold_skips_experts_and_keeps_blocks_accounted():
    prompt = {"prompt_token_ids": list(range(3, 40))}
    exact = _decisive_router(LLM("random:tiny-moe", dtype="float32", max_model_len=128, kv_cache_memory_bytes=8 << 20))
    base = exact.generate(prompt, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    full = sum(map(sum, exact.engine.expert_load().values()))
    assert full == 2 * 2 * (37 + 11)                    # layers x top-2 x tokens computed
    assert_all_blocks_free(exact)
    skip = _decisive_router(LLM("random:tiny-moe", dtype="float32", max_model_len=128,
                                kv_cache_memory_bytes=8 << 20, router_weights_threshold=0.3))
    out = skip.generate(prompt, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    assert len(out) == len(base)
    assert sum(map(sum, skip.engine.expert_load().values())) < full
    assert_all_blocks_free(skip)


def test_router_kernel_follows_set_router_threshold():
    """The GPU transform's one-kernel router (TRITON_INTERPRET on the CPU) reads its threshold from a
    device tensor, so a threshold set after the swap (or after graphs were captured) takes effect."""
    from inference.kernels.moe_routing import fused_route
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(5)
    block = SparseMoeBlock(ModelArch.from_hf_config(preset_config("tiny-moe")))
    for p in block.parameters():
        p.data = torch.randn(p.shape, generator=gen) * 0.2    # router logits ~N(0, 1.6): some 2nd weights < 0.3
    block = block.to(device)
    x = torch.randn(21, block.w13.shape[2], generator=gen).to(device)
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([torch.nn.Module()])
    model.layers[0].mlp = block
    want = {}
    for th in (0.0, 0.3):
        set_router_threshold(model, th)
        want[th] = (block.forward(x), block.expert_tokens.sum().item())
        block.expert_tokens.zero_()
    assert not torch.allclose(want[0.0][0], want[0.3][0]) and want[0.3][1] < want[0.0][1] == 2 * 21
    block.use_router_kernel(fused_route)
    for th in (0.3, 0.0):
        set_router_threshold(model, th)
        got = block.forward(x)
        torch.testing.assert_close(got, want[th][0], rtol=1e-5, atol=1e-5)
        assert block.expert_tokens.sum().item() == want[th][1]
        block.expert_tokens.zero_()


@pytest.mark.parametrize("bad,match", [
    (dict(router_weights_threshold=1.0), "router_weights_threshold: must be a number in \\[0, 1\\)"),
    (dict(router_weights_threshold=-0.1), "router_weights_threshold"),
    (dict(model="random:tiny", router_weights_threshold=0.2), "not a mixture-of-experts model"),
    (dict(quantization="fp8"), "quantized with int8 or int4 \\(round-to-nearest\\) only so far"),
])
def test_bad_engine_arguments_are_refused_before_loading(bad, match):
    with pytest.raises(ValueError, match=match):
        LLM(**{"model": "random:tiny-moe", "dtype": "float32", **bad})


@pytest.fixture()
def mixtral_dir(tmp_path):
    kind, cfg = CONFIGS["mixtral"]
    hf = _save_hf_model(kind, cfg, tmp_path / "hf")
    return tmp_path / "hf", hf


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def test_checkpoint_and_config_disagreeing_on_experts_is_refused(mixtral_dir):
    path, _ = mixtral_dir
    _edit_config(path, num_local_experts=3)               # the checkpoint holds 4
    with pytest.raises(ValueError, match="expert 3, but config.json says num_experts=3|num_experts=3"):
        LLM(str(path), dtype="float32", max_model_len=64, kv_cache_memory_bytes=4 << 20)
    _edit_config(path, num_local_experts=5)               # one expert short
    with pytest.raises(ValueError, match="num_experts=5|lacks"):
        LLM(str(path), dtype="float32", max_model_len=64, kv_cache_memory_bytes=4 << 20)
    _edit_config(path, num_local_experts=4, num_experts_per_tok=5)
    with pytest.raises(ValueError, match="num_experts_per_tok: must be in \\[1, num_experts=4\\]"):
        LLM(str(path), dtype="float32", max_model_len=64, kv_cache_memory_bytes=4 << 20)


def test_stacked_expert_layout_loads_like_per_expert_tensors(mixtral_dir, tmp_path):
    """transformers >= 5 holds experts stacked ([E, 2I, H] gate_up, [E, H, I] down): same model."""
    path, _ = mixtral_dir
    tensors = {}
    for f in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    stacked, layers = {}, {k.split(".")[2] for k in tensors if ".experts." in k}
    for key, value in tensors.items():
        if ".experts." not in key:
            stacked[key] = value
    for layer in layers:
        pre = f"model.layers.{layer}.block_sparse_moe.experts"
        n = len({k for k in tensors if k.startswith(pre) and k.endswith(".w1.weight")})
        stacked[f"{pre}.gate_up_proj"] = torch.stack(
            [torch.cat([tensors[f"{pre}.{e}.w1.weight"], tensors[f"{pre}.{e}.w3.weight"]]) for e in range(n)])
        stacked[f"{pre}.down_proj"] = torch.stack([tensors[f"{pre}.{e}.w2.weight"] for e in range(n)])
    out = tmp_path / "stacked"
    out.mkdir()
    save_file(stacked, str(out / "model.safetensors"))
    (out / "config.json").write_text((path / "config.json").read_text())
    prompt = {"prompt_token_ids": list(range(5, 30))}
    args = dict(dtype="float32", max_model_len=64, kv_cache_memory_bytes=4 << 20)
    a = LLM(str(path), **args).generate(prompt, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    b = LLM(str(out), **args).generate(prompt, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    assert a == b


def test_expert_load_is_exported_by_the_service():
    import time

    from prometheus_client.parser import text_string_to_metric_families

    from inference.online_engine import OnlineEngine
    from inference.server.app import ServerConfig, create_app
    engine = OnlineEngine("random:tiny-qwen2-moe", dtype="float32", max_model_len=128, kv_cache_memory_bytes=8 << 20)
    try:
        app = create_app(lambda: engine, ServerConfig(served_model_name="moe"))
        web = app.test_client()
        deadline = time.time() + 30
        while web.get("/ready").status_code != 200 and time.time() < deadline:
            time.sleep(0.05)
        r = web.post("/v1/completions", json={"model": "moe", "prompt": [5, 6, 7, 8, 9], "max_tokens": 4,
                                              "ignore_eos": True, "temperature": 0})
        assert r.status_code == 200
        samples = [s for fam in text_string_to_metric_families(web.get("/metrics").get_data(as_text=True))
                   for s in fam.samples if s.name == "inference:moe_expert_tokens_total"]
        assert {s.labels["layer"] for s in samples} == {"0"}           # layer 1 is dense (mlp_only_layers)
        assert len(samples) == 8 and sum(s.value for s in samples) == 2 * (5 + 3)
    finally:
        engine.shutdown()


@pytest.mark.parametrize("quantization,tol", [("int8", 2e-3), ("int4", 5e-2)])
def test_quantized_experts_stay_close_to_the_unquantized_model(quantization, tol):
    args = dict(dtype="float32", max_model_len=128, kv_cache_memory_bytes=8 << 20)
    prompt = {"prompt_token_ids": list(range(7, 60))}
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=20)
    for model in ("random:tiny-moe", "random:tiny-qwen2-moe"):
        base = LLM(model, **args)
        quant = LLM(model, quantization=quantization, **args)
        blocks = moe_blocks(quant.engine.runner.model)
        assert blocks and all(type(b.w13).__name__ == "QuantExperts" for _, b in blocks)
        want = base.generate(prompt, params, use_tqdm=False)[0].outputs[0].logprobs[0]
        got = quant.generate(prompt, params, use_tqdm=False)[0].outputs[0].logprobs[0]
        # random weights give a flat next-token distribution: compare the logprobs both top-20s hold
        common = set(want) & set(got)
        assert len(common) >= 12, model
        assert max(abs(want[t].logprob - got[t].logprob) for t in common) < tol, model
        assert_all_blocks_free(quant)
        # ... which hardly moves with the MLPs: check each sparse layer's own output too
        x = torch.randn(29, quant.engine.arch.hidden_size, generator=torch.Generator().manual_seed(3))
        for (_, b), (_, q) in zip(moe_blocks(base.engine.runner.model), blocks, strict=True):
            ref, out = b.forward(x), q.forward(x)
            assert float((out - ref).norm() / ref.norm()) < {"int8": 0.02, "int4": 0.2}[quantization], model


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graphs_replay_the_fused_moe_path_like_eager_steps():
    """On the GPU the router kernel and fused experts run inside the captured decode / mixed graphs:
    same tokens as eager steps (same kernels), logprobs close to the CPU reference."""
    prompts = [{"prompt_token_ids": list(range(3 + i, 40 + i))} for i in range(3)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1)
    args = dict(dtype="float32", max_model_len=128, kv_cache_memory_bytes=8 << 20)
    outs = {}
    for name, kw in (("graphs", dict(device="cuda")), ("eager", dict(device="cuda", enforce_eager=True)),
                     ("cpu", dict(device="cpu"))):
        llm = LLM("random:tiny-moe", **args, **kw)
        outs[name] = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
        assert_all_blocks_free(llm)
    for g, e, c in zip(outs["graphs"], outs["eager"], outs["cpu"], strict=True):
        assert g.token_ids == e.token_ids
        # first token: same prefix everywhere, so compare its logprob with the CPU's (TF32 dots on the GPU)
        tok = c.token_ids[0]
        if tok in g.logprobs[0]:
            assert abs(g.logprobs[0][tok].logprob - c.logprobs[0][tok].logprob) < 2e-2
