"""Paged attention over the block KV cache, PyTorch reference path (CPU; GPU fallback).

KV cache layout, per layer (one tensor for K, one for V):

    [num_blocks, block_size, num_kv_heads, head_dim]
        viewed flat as [num_slots, num_kv_heads, head_dim],  slot = block_id * block_size + offset

A step's tokens arrive as one flat varlen batch, decodes first:

    tokens:  d0 d1 d2 | p0 p0 p0 p0 p0 | p1 p1 p1
             decodes    prefill chunk 0  prefill chunk 1   (a chunk may follow cached blocks)

Every layer first writes the K/V of *all* the step's tokens into their slots, then attends; so a
request may read blocks another request fills in the same step (prefix-cache hits on blocks
being computed right now are safe).

Quantized caches (`kv_cache_dtype`): float8 e4m3 stores the values (saturated at +-448, scale 1);
int8 stores each (token, head) row symmetric with its own fp32 scale in the row's last 4 bytes,
as GGUF's q8_0 blocks carry theirs, so a block stays one self-contained unit:

    int8 row [D + 4] int8:   q_0 q_1 ... q_{D-1} | scale (fp32 bytes)      x ~= q * scale
                             scale = max|x| / 127 over the row's D values
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from inference.models.invariant_attention import invariant_prefill_attention

FP8_E4M3_MAX = 448.0
INT8_SCALE_BYTES = 4                    # an fp32 scale at the end of every int8 (token, head) row


def kv_row_width(head_dim: int, cache_dtype: torch.dtype) -> int:
    """Elements per (token, head) row of the cache: head_dim, plus the scale's bytes for int8."""
    return head_dim + INT8_SCALE_BYTES if cache_dtype == torch.int8 else head_dim


def quantize_int8_rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] -> int8 [..., D + 4]: symmetric codes, then the row's fp32 scale as 4 bytes."""
    scale = (x.abs().amax(-1, keepdim=True).float() / 127.0).clamp(min=1e-8)         # [..., 1]
    q = (x.float() / scale).round().clamp(-127, 127).to(torch.int8)
    return torch.cat([q, scale.view(torch.int8)], dim=-1)


def dequantize_int8_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int8 [..., D + 4] -> [..., D] in dtype."""
    scale = rows[..., -INT8_SCALE_BYTES:].contiguous().view(torch.float32)           # [..., 1]
    return (rows[..., :-INT8_SCALE_BYTES].float() * scale).to(dtype)


@dataclass
class PrefillChunk:
    query_start: int               # first token of the chunk in the flat batch
    query_len: int
    context_len: int               # cached tokens before the chunk + query_len
    block_table: torch.Tensor      # [ceil(context_len / block_size)] the blocks holding the context
    causal_mask: torch.Tensor | None   # [query_len, context_len] bool; None -> plain causal


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor                 # [num_tokens] where each new K/V goes
    num_decodes: int = 0                       # the first num_decodes tokens are decodes
    decode_block_tables: torch.Tensor | None = None   # [num_decodes, max_blocks], padded with block 0
    decode_context_len: int = 0                # longest decode context
    decode_mask: torch.Tensor | None = None    # [num_decodes, 1, 1, max_blocks * block_size] bool;
                                               # None when every decode has decode_context_len tokens
                                               # (always set on the CPU in bf16: batch-invariant decode)
    decode_context_lens: torch.Tensor | None = None   # [num_decodes] int64 tokens incl. the new one (CPU)
    prefills: list[PrefillChunk] = field(default_factory=list)


def gather_blocks(cache: torch.Tensor, block_tables: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """cache [num_blocks, block_size, Hkv, D], tables [B, nb] -> [B, nb * block_size, Hkv, D]
    in `dtype` (a float8 cache is read back in the model's dtype).

    Whole blocks are copied (contiguous runs of block_size * Hkv * D elements), which is several
    times cheaper than gathering slot by slot.
    """
    b, nb = block_tables.shape
    _, block_size, hkv, d = cache.shape
    if cache.dtype == torch.int8:
        rows = cache.index_select(0, block_tables.reshape(-1))             # [B * nb, bs, Hkv, D + 4]
        return dequantize_int8_rows(rows, dtype or torch.float32).view(b, nb * block_size, hkv, d - INT8_SCALE_BYTES)
    if cache.dtype == torch.float8_e4m3fn:      # no float8 index_select on the CPU: gather bytes
        raw = cache.view(torch.uint8).index_select(0, block_tables.reshape(-1))
        return raw.view(cache.dtype).view(b, nb * block_size, hkv, d).to(dtype or torch.float32)
    out = cache.index_select(0, block_tables.reshape(-1)).view(b, nb * block_size, hkv, d)
    return out if dtype is None or out.dtype == dtype else out.to(dtype)


def bottom_right_causal_mask(query_len: int, context_len: int, device: torch.device) -> torch.Tensor:
    """Query i (absolute position context_len - query_len + i) sees keys 0..that position."""
    q_pos = torch.arange(context_len - query_len, context_len, device=device)[:, None]
    k_pos = torch.arange(context_len, device=device)[None, :]
    return k_pos <= q_pos                      # [query_len, context_len]


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """k, v: [num_tokens, num_kv_heads, head_dim] -> their slots in the flat cache."""
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    if k_cache.dtype == torch.int8:
        width = head_dim + INT8_SCALE_BYTES
        k_cache.view(-1, num_kv_heads, width).index_copy_(0, slot_mapping, quantize_int8_rows(k))
        v_cache.view(-1, num_kv_heads, width).index_copy_(0, slot_mapping, quantize_int8_rows(v))
        return
    if k_cache.dtype == torch.float8_e4m3fn:
        # e4m3 has no inf: saturate instead of turning NaN; PyTorch's CPU index_copy_ has no
        # float8 kernel, so the bytes go through a uint8 view
        k8 = k.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(k_cache.dtype).view(torch.uint8)
        v8 = v.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(v_cache.dtype).view(torch.uint8)
        k_cache.view(torch.uint8).view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k8)
        v_cache.view(torch.uint8).view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v8)
        return
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


# A chunk of at most this many tokens after earlier context (speculative verification, the tail
# of a chunked prefill) attends like the decodes do: the query heads of a KV head are rows of one
# attention over that head, no K/V copied per query head (expanding them is many times slower for a
# few tokens over a long context: bench/journal/2026-12-01-speculative-decoding.md)
SHORT_CHUNK = 64


def _short_chunk_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor,
                           ctx: int, causal_mask: torch.Tensor, scale: float) -> torch.Tensor:
    """q: [n, H, D] -> [n, H, D] over the first ctx cached tokens of `table` [1, blocks]."""
    n, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[-2]
    group = num_heads // num_kv_heads
    qg = q.view(n, num_kv_heads, group, head_dim).transpose(0, 1).reshape(1, num_kv_heads, n * group, head_dim)
    kg = gather_blocks(k_cache, table, q.dtype)[:, :ctx].transpose(1, 2)             # [1, Hkv, ctx, D]
    vg = gather_blocks(v_cache, table, q.dtype)[:, :ctx].transpose(1, 2)
    mask = causal_mask.repeat_interleave(group, dim=0) if group > 1 else causal_mask   # [n * G, ctx]
    og = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=mask, scale=scale)       # [1, Hkv, n * G, D]
    return og.view(num_kv_heads, n, group, head_dim).transpose(0, 1).reshape(n, num_heads, head_dim)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """q: [num_tokens, num_heads, head_dim] -> [num_tokens, num_heads, head_dim].

    The K/V of this step's tokens must already be written (see `write_kv`).
    """
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[-2]
    group = num_heads // num_kv_heads
    nd = meta.num_decodes
    od = None
    if nd:
        # GQA without copying K/V: the `group` query heads sharing a KV head act as its
        # `group` query rows; decodes attend to their whole context, so no causal mask.
        qd = q[:nd].view(nd, num_kv_heads, group, head_dim)                  # [B, Hkv, G, D]
        kd = gather_blocks(k_cache, meta.decode_block_tables, q.dtype)       # [B, L_pad, Hkv, D]
        vd = gather_blocks(v_cache, meta.decode_block_tables, q.dtype)
        if meta.decode_mask is None:                                         # equal lengths: trim
            kd, vd = kd[:, :meta.decode_context_len], vd[:, :meta.decode_context_len]
        od = F.scaled_dot_product_attention(qd, kd.transpose(1, 2), vd.transpose(1, 2),
                                            attn_mask=meta.decode_mask, scale=scale)
        od = od.reshape(nd, num_heads, head_dim)
        if nd == num_tokens:
            return od
    out = torch.empty_like(q)
    if od is not None:
        out[:nd] = od
    attend_prefills(q, k_cache, v_cache, meta, scale, out)
    return out


def attend_prefills(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                    scale: float, out: torch.Tensor) -> None:
    """The prefill chunks' rows of q [T, H, D] attend over the cache (their K/V written already),
    into the same rows of out."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[-2]
    group = num_heads // num_kv_heads
    invariant = q.device.type == "cpu" and q.dtype == torch.bfloat16
    for chunk in meta.prefills:
        s, n, ctx = chunk.query_start, chunk.query_len, chunk.context_len
        table = chunk.block_table[None]
        if invariant:                  # same bits per token however the prompt was chunked
            kp = gather_blocks(k_cache, table, q.dtype)[0].transpose(0, 1)     # [Hkv, blocks * bs, D]
            vp = gather_blocks(v_cache, table, q.dtype)[0].transpose(0, 1)
            out[s:s + n] = invariant_prefill_attention(q[s:s + n], kp, vp, ctx, scale)
            continue
        if chunk.causal_mask is not None and n <= SHORT_CHUNK:
            out[s:s + n] = _short_chunk_attention(q[s:s + n], k_cache, v_cache, table, ctx, chunk.causal_mask, scale)
            continue
        qp = q[s:s + n].transpose(0, 1)                                      # [H, n, D]
        kp = gather_blocks(k_cache, table, q.dtype)[0, :ctx].transpose(0, 1)   # [Hkv, ctx, D]
        vp = gather_blocks(v_cache, table, q.dtype)[0, :ctx].transpose(0, 1)
        if group > 1:
            kp = kp[:, None].expand(num_kv_heads, group, ctx, head_dim).reshape(num_heads, ctx, head_dim)
            vp = vp[:, None].expand(num_kv_heads, group, ctx, head_dim).reshape(num_heads, ctx, head_dim)
        if chunk.causal_mask is None:
            op = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=scale)
        else:
            op = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=chunk.causal_mask, scale=scale)
        out[s:s + n] = op.transpose(0, 1)
