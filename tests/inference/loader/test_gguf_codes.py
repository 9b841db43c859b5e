"""GGUF quantized tensors read as codes (inference/loader/gguf_codes.py), checked against the
gguf package's own dequantizer, and run through the CPU int4 kernel against
dequantize-then-matmul of the file's values."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize
from safetensors.torch import load_file

from inference.loader.gguf_codes import BlockCodes, GGUFFile, decode_blocks, unpermute_rope_rows
from inference.loader.model_loader import gguf_source
from inference.models.gguf_cpu_linear import GGUFCpuLinear, gguf_matmul_available
from inference.models.int4_cpu_linear import Int4CpuLinear, int4_cpu_available
from tests.helpers.gguf_blocks import ALL_KINDS
from tests.helpers.gguf_blocks import random_blocks as _random_blocks

needs_int4 = pytest.mark.skipif(not int4_cpu_available(), reason="torch's CPU int4 kernel does not run here")


TOP_CODE = {"Q4_0": 15, "Q4_1": 15, "Q5_0": 31, "Q5_1": 31, "Q8_0": 127, "Q4_K": 15, "Q5_K": 31, "Q6_K": 63}


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_codes_dequantize_to_what_the_gguf_package_reads(kind):
    out, n = 24, 512
    raw = _random_blocks(kind, out, n, seed=len(kind) + ALL_KINDS.index(kind))
    codes = decode_blocks(raw, "w", kind, out, n)
    want = torch.from_numpy(dequantize(raw, GGMLQuantizationType[kind]).astype(np.float32)).view(out, n)
    assert codes.shape == (out, n)
    assert torch.equal(codes.dequantized(), want)                   # bit for bit
    assert int(codes.codes.max()) == TOP_CODE[kind]                  # every bit plane is read
    assert int(codes.codes.min()) == (-128 if kind == "Q8_0" else 0)


def test_a_short_tensor_is_named_as_truncated():
    raw = _random_blocks("Q4_1", 4, 64, seed=1)[:, :-3]
    with pytest.raises(ValueError, match=r"'blk\.0\.x'.*truncated or corrupt"):
        decode_blocks(raw, "blk.0.x", "Q4_1", 4, 64)


def test_unpermuting_rope_rows_inverts_llama_cpp_s_permutation():
    heads, half = 3, 4
    w = torch.arange(heads * half * 2)
    # llama.cpp's converter: per head, [2, half] -> [half, 2]
    permuted = w.view(heads, 2, half).transpose(1, 2).reshape(-1)
    assert torch.equal(permuted[unpermute_rope_rows(w.numel(), heads)], w)


def _write_gguf(path, tensors: dict[str, tuple[np.ndarray, GGMLQuantizationType | None]]) -> None:
    writer = GGUFWriter(str(path), "llama")
    for name, (data, qtype) in tensors.items():
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_an_unsupported_type_names_the_tensor_and_the_supported_list(tmp_path):
    q3k = np.zeros((8, 110), dtype=np.uint8)            # 8 rows of one 256-weight Q3_K block each
    _write_gguf(tmp_path / "k.gguf", {"blk.0.ffn_down.weight": (q3k, GGMLQuantizationType.Q3_K)})
    f = GGUFFile(tmp_path / "k.gguf")
    with pytest.raises(ValueError, match=r"'blk\.0\.ffn_down\.weight' has type Q3_K.*supported types: F32.*Q4_1.*Q6_K"):
        f.check_supported()


def test_a_truncated_file_is_a_clear_error(tmp_path):
    w = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    path = tmp_path / "t.gguf"
    _write_gguf(path, {"a.weight": (quantize(w, GGMLQuantizationType.Q4_0), GGMLQuantizationType.Q4_0)})
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match="truncated"):
        GGUFFile(path).codes("a.weight")


@needs_int4
@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_int4_kernel_matches_dequantize_then_matmul(kind):
    out, n = 96, 192
    codes = decode_blocks(_random_blocks(kind, out, n, seed=7), "w", kind, out, n)
    x = torch.randn(5, n, generator=torch.Generator().manual_seed(3))
    want = x.double() @ codes.dequantized().double().T
    exact = Int4CpuLinear(codes.codes, codes.scale, codes.zero, torch.float32, torch.float32)
    got = exact(x).double()
    assert (got - want).abs().max() / want.abs().max() < 1e-5
    # bf16 activations with bf16 scales: the layout rounds scales to 8 mantissa bits (drift ~1e-2)
    rounded = Int4CpuLinear(codes.codes, codes.scale, codes.zero, torch.bfloat16, torch.bfloat16)
    drift = float((rounded(x.bfloat16()).double() - want).abs().max() / want.abs().max())
    assert drift < 3e-2


@needs_int4
def test_the_shipped_file_s_codes_are_the_converted_model_s_weights(smollm2_dir):
    """Every weight of layer 0 as codes (q and k un-permuted, q|k|v and gate|up fused) equals
    what transformers' GGUF loader de-quantized into the safetensors copy."""
    from inference.config import ModelConfig
    from inference.loader.gguf_codes import QUANTIZED
    from inference.loader.model_loader import plan_load
    from inference.quantization.gguf_linears import LINEARS, _parts
    f = GGUFFile(gguf_source("smollm2"))
    arch = plan_load(ModelConfig(model="smollm2")).arch
    state = load_file(str(smollm2_dir / "model.safetensors"))
    hf_names = {("self_attn", "qkv_proj"): ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
                ("self_attn", "o_proj"): ["self_attn.o_proj"],
                ("mlp", "gate_up_proj"): ["mlp.gate_proj", "mlp.up_proj"],
                ("mlp", "down_proj"): ["mlp.down_proj"]}
    for key, parts in LINEARS.items():
        codes = BlockCodes.cat(_parts(f, 0, parts, arch, QUANTIZED))
        want = torch.cat([state[f"model.layers.0.{n}.weight"] for n in hf_names[key]])
        assert torch.allclose(codes.dequantized(), want, atol=1e-6, rtol=0), key


@needs_int4
def test_q8_0_as_two_int4_halves_matches_dequantize_then_matmul():
    from inference.models.int4_cpu_linear import Int8AsTwoInt4CpuLinear
    out, n = 80, 256
    codes = decode_blocks(_random_blocks("Q8_0", out, n, seed=11), "w", "Q8_0", out, n)
    x = torch.randn(3, n, generator=torch.Generator().manual_seed(5))
    want = x.double() @ codes.dequantized().double().T
    exact = Int8AsTwoInt4CpuLinear(codes.codes, codes.scale, torch.float32, torch.float32)
    assert float((exact(x).double() - want).abs().max() / want.abs().max()) < 1e-5
    rounded = Int8AsTwoInt4CpuLinear(codes.codes, codes.scale, torch.bfloat16, torch.bfloat16)
    assert float((rounded(x.bfloat16()).double() - want).abs().max() / want.abs().max()) < 3e-2


@needs_int4
def test_the_shipped_model_on_codes_drifts_no_more_than_bf16_itself(smollm2_dir):
    """Logits of the shipped model on its codes (bf16 scales and activations) against the fp32
    model on the same dequantized values: the scale rounding may add at most a little to the
    drift of plain bf16 (the dequantized weights in bf16), and the greedy tokens agree."""
    from inference import LLM, SamplingParams
    prompt = "The lighthouse keeper climbed the stairs every evening because"
    params = SamplingParams(max_tokens=1, temperature=0, logprobs=20)

    def top(dtype, codes: str):
        import os
        os.environ["INFERENCE_GGUF_CODES"] = codes
        llm = LLM("smollm2", dtype=dtype, enable_prefix_caching=False)
        try:
            out = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
            return out.token_ids[0], out.logprobs[0]
        finally:
            llm.shutdown()
            del os.environ["INFERENCE_GGUF_CODES"]
    ref_tok, ref = top("float32", "0")
    plain_tok, plain = top("bfloat16", "0")
    codes_tok, on_codes = top("bfloat16", "1")
    assert codes_tok == ref_tok == plain_tok
    shared = [t for t in ref if t in plain and t in on_codes]
    drift = max(abs(on_codes[t].logprob - ref[t].logprob) for t in shared)
    plain_drift = max(abs(plain[t].logprob - ref[t].logprob) for t in shared)
    print(f"top-20 logprob drift vs fp32: codes {drift:.3f}, plain bf16 {plain_drift:.3f}")
    assert drift < max(0.25, 2 * plain_drift)


def test_the_lean_header_reader_agrees_with_the_gguf_package():
    from gguf import GGUFReader

    from inference.loader.gguf_reader import read_gguf
    path = gguf_source("smollm2")
    meta, tensors = read_gguf(path)
    ref = GGUFReader(path)
    assert [t.name for t in ref.tensors] == list(tensors)
    for t in ref.tensors:
        ours = tensors[t.name]
        assert (ours.type_name, ours.shape) == (t.tensor_type.name, tuple(int(x) for x in t.shape))
        assert np.array_equal(ours.data, np.asarray(t.data).view(np.uint8).reshape(-1))
    f = ref.fields["general.architecture"]
    assert meta["general.architecture"] == bytes(f.parts[f.data[0]]).decode() == "llama"
    assert meta["llama.block_count"] == 30


@pytest.mark.skipif(not gguf_matmul_available(), reason="no AVX-512 VNNI build of the GGUF kernels here")
def test_the_default_model_runs_every_linear_on_its_codes_and_agrees_with_fp32():
    """Qwen2.5-Coder-0.5B Q4_K_M: each decoder linear, the LM head and the embeddings on the file's
    own blocks (Q5_0, Q8_0, Q4_K, Q6_K), teacher-forced against the fp32 dequantized model on held-out
    code (bench/cpu/gguf_agreement.py measures 2,000+ tokens: 0.977)."""
    from inference.config import ModelConfig
    from inference.loader.model_loader import load_model
    from inference.models.gguf_embedding import GGUFEmbedding
    from inference.quantization.calibration import forward_logits, stdlib_windows
    test = load_model(ModelConfig(model="qwen2.5-coder-0.5b", dtype="bfloat16"))
    model = test.model
    assert isinstance(model.embed_tokens, GGUFEmbedding) and isinstance(model.lm_head, GGUFCpuLinear)
    types = set()
    for layer in model.layers:
        for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
            assert isinstance(linear, GGUFCpuLinear)
            types.update(linear.types)
    assert types == {"Q5_0", "Q8_0", "Q4_K", "Q6_K"}
    assert model.layers[0].self_attn.qkv_proj.bias is not None
    ref = load_model(ModelConfig(model="qwen2.5-coder-0.5b", dtype="float32"))
    ids = torch.tensor([[7, 151643, 1000, 23]])
    assert torch.equal(model.embed_tokens(ids), ref.model.embed_tokens(ids).bfloat16())
    window = stdlib_windows(test.tokenizer, "eval", 1, 256)[0]
    got, want = forward_logits(model, window), forward_logits(ref.model, window)
    agreement = float((got.argmax(-1) == want.argmax(-1)).float().mean())
    assert agreement >= 0.95, agreement
