"""The CPU C++ kernels (inference/kernels/cpu_ops.cpp) against their PyTorch references, on random
inputs, and their rows' independence from the batch."""
from __future__ import annotations

import pytest
import torch

from inference.kernels.cpu_ops import cpu_ops
from inference.models.arch import ModelArch
from inference.models.attention import write_kv
from inference.models.llama import RMSNorm, RotaryEmbedding, SiluAndMul

pytestmark = pytest.mark.skipif(cpu_ops() is None, reason="the CPU kernels cannot build here")
BF16 = torch.bfloat16


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _close(got, want, tol=1e-2):
    assert got.dtype == want.dtype and got.shape == want.shape
    assert float((got.float() - want.float()).abs().max()) <= tol * max(1.0, float(want.float().abs().max()))


def test_add_rms_norm_matches_the_module():
    g = _gen(0)
    norm = RMSNorm(576, 1e-5)
    norm.weight.requires_grad_(False)
    norm.weight.data = (torch.rand(576, generator=g) + 0.5).to(BF16)
    x, res = (torch.randn(7, 576, generator=g).to(BF16) for _ in range(2))
    out, total = cpu_ops().add_rms_norm(x, res, norm.weight.data, 1e-5)
    want_out, want_total = norm.forward(x, res)
    assert torch.equal(total, want_total)                      # the residual stream: bf16 add, exactly
    _close(out, want_out)
    alone, _ = cpu_ops().add_rms_norm(x, None, norm.weight.data, 1e-5)
    _close(alone, norm.forward(x))
    assert torch.equal(cpu_ops().add_rms_norm(x[3:4], res[3:4], norm.weight.data, 1e-5)[0], out[3:4])


def test_an_fp32_residual_stream_is_added_without_rounding():
    g = _gen(5)
    weight = (torch.rand(896, generator=g) + 0.5).to(BF16)
    x = torch.randn(5, 896, generator=g).to(BF16)
    res = torch.randn(5, 896, generator=g) * 30 + 1e-3            # fp32 values bf16 cannot hold
    out, total = cpu_ops().add_rms_norm(x, res, weight, 1e-6)
    assert total.dtype == torch.float32
    assert torch.equal(total, x.float() + res)                   # the sum stays fp32, bit for bit
    assert not torch.equal(total, total.to(BF16).float())
    h = x.float() + res
    want = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()).to(BF16)
    _close(out, want)
    assert torch.equal(cpu_ops().add_rms_norm(x[2:3], res[2:3], weight, 1e-6)[0], out[2:3])
    with pytest.raises(RuntimeError, match="residual"):
        cpu_ops().add_rms_norm(x, res[:3].contiguous(), weight, 1e-6)


def test_silu_mul_matches_the_module():
    x = torch.randn(5, 2 * 1536, generator=_gen(1)).to(BF16)
    _close(cpu_ops().silu_mul(x), SiluAndMul().forward(x))


def _arch():
    return ModelArch(model_type="llama", vocab_size=64, hidden_size=576, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=9, num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5,
                     rope_theta=100000.0, max_position_embeddings=4096)


def test_rope_write_kv_matches_torch_rope_and_write_kv():
    g = _gen(2)
    rotary = RotaryEmbedding(_arch(), 4096)
    t, h, hkv, d = 6, 9, 3, 64
    qkv = torch.randn(t, (h + 2 * hkv) * d, generator=g).to(BF16)
    positions = torch.tensor([0, 5, 17, 100, 2047, 3000])
    slots = torch.tensor([3, 40, 7, 63, 12, 0])
    caches = [torch.zeros(4, 16, hkv, d, dtype=BF16) for _ in range(4)]
    q = cpu_ops().rope_write_kv(qkv, rotary.cos, rotary.sin, positions, caches[0], caches[1], slots, h, hkv)
    rope = rotary.prepare(positions, BF16)
    qk = rope.apply(qkv[:, :(h + hkv) * d].view(t, h + hkv, d))
    write_kv(caches[2], caches[3], qk[:, h:], qkv[:, (h + hkv) * d:].view(t, hkv, d), slots)
    _close(q, qk[:, :h].contiguous())
    _close(caches[0], caches[2])
    assert torch.equal(caches[1], caches[3])                   # v is copied as it is


def test_a_slot_outside_the_cache_is_an_error_not_a_write():
    cache = torch.zeros(2, 16, 3, 64, dtype=BF16)
    with pytest.raises(RuntimeError, match="outside the cache"):
        cpu_ops().rope_write_kv(torch.zeros(1, 15 * 64, dtype=BF16), torch.zeros(8, 32), torch.zeros(8, 32),
                                torch.tensor([0]), cache, cache.clone(), torch.tensor([32]), 9, 3)


def test_paged_decode_attention_matches_the_reference_and_ignores_the_batch():
    g = _gen(3)
    nb, bs, hkv, d, b = 100, 16, 3, 64, 6
    k_cache = torch.randn(nb, bs, hkv, d, generator=g).to(BF16)
    v_cache = torch.randn(nb, bs, hkv, d, generator=g).to(BF16)
    ctx = torch.tensor([1, 16, 17, 100, 250, 33])
    tables = torch.randperm(nb, generator=g)[:b * 16].view(b, 16)
    q = torch.randn(b, 9, d, generator=g).to(BF16)
    got = cpu_ops().paged_decode_attention(q, k_cache, v_cache, tables, ctx, 0.125)
    for i in range(b):
        _close(got[i], _reference_decode(q[i], k_cache, v_cache, tables[i], int(ctx[i])))
        alone = cpu_ops().paged_decode_attention(q[i:i + 1], k_cache, v_cache, tables[i:i + 1], ctx[i:i + 1], 0.125)
        assert torch.equal(alone, got[i:i + 1])


def _reference_decode(q, k_cache, v_cache, table, ctx):
    k = k_cache[table].reshape(-1, 3, 64)[:ctx].float()                    # [ctx, Hkv, D]
    v = v_cache[table].reshape(-1, 3, 64)[:ctx].float()
    qg = q.float().view(3, 3, 64)                                           # [Hkv, G, D]
    s = torch.einsum("hgd,thd->hgt", qg, k) * 0.125
    out = torch.einsum("hgt,thd->hgd", s.softmax(-1), v)
    return out.reshape(9, 64).to(BF16)


def test_a_context_longer_than_its_block_table_is_an_error():
    cache = torch.zeros(4, 16, 3, 64, dtype=BF16)
    with pytest.raises(RuntimeError, match="do not fit"):
        cpu_ops().paged_decode_attention(torch.zeros(1, 9, 64, dtype=BF16), cache, cache, torch.tensor([[0, 1]]),
                                         torch.tensor([33]), 0.125)
