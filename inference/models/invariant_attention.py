"""Prefill attention on the CPU in bf16 whose result for a query row does not depend on how the
prompt was cut into chunks: a full prefill, a chunk after a prefix-cache hit and a chunk of a
chunked prefill give the same bits for the same token. That is what makes greedy decoding give
identical answers whatever the prefix-cache state (inference/models/attention.py).

    scores  = q @ K^T            bf16 matmul (oneDNN, fp32 accumulation), keys padded to 16
    probs   = softmax(scores * scale, masked)    fp32, padded keys at -inf
    out     = probs.bf16 @ V      bf16 matmul over the same padded keys

Facts this rests on, checked on this CPU by tests/inference/models/test_invariant_attention.py:
oneDNN's bf16 matmul gives the same bits for a row whatever the number of other rows, the number
of columns, and zero rows appended to the reduction; torch's softmax gives the same bits for a row
padded with -inf as long as both lengths are multiples of 16. PyTorch's flash attention kernel
does not have the first property (its query and key tiling follows the chunk's length), nor has
fp32 matmul. The same math as Hugging Face's eager bf16 attention; on these shapes about twice
as fast as the flash kernel for a 512-token prompt.
"""
from __future__ import annotations

import torch

KEY_MULTIPLE = 16          # key lengths are padded to this (softmax's invariance needs it)
ROW_TILE = 256             # query tokens per matmul: bounds the fp32 scores' memory


def padded_keys(num_keys: int) -> int:
    return -(-num_keys // KEY_MULTIPLE) * KEY_MULTIPLE


def invariant_prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context_len: int,
                                scale: float) -> torch.Tensor:
    """q [n, H, D]: the chunk's last n tokens of `context_len`; k, v [Hkv, L >= padded_keys(ctx), D]
    the context's keys and values (rows past context_len are ignored). Returns [n, H, D]."""
    n, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[0]
    group = num_heads // num_kv_heads
    width = padded_keys(context_len)
    if k.shape[1] < width:
        pad = width - k.shape[1]
        k = torch.cat((k, k.new_zeros(num_kv_heads, pad, head_dim)), dim=1)
        v = torch.cat((v, v.new_zeros(num_kv_heads, pad, head_dim)), dim=1)
    kt, v = k[:, :width].transpose(1, 2), v[:, :width]                     # [Hkv, D, W], [Hkv, W, D]
    # the query heads of a KV head are rows of one matmul over that head: [Hkv, n * G, D]
    qg = q.view(n, num_kv_heads, group, head_dim).permute(1, 0, 2, 3).reshape(num_kv_heads, n * group, head_dim)
    keys = torch.arange(width, device=q.device)
    out = torch.empty(num_kv_heads, n * group, head_dim, dtype=q.dtype, device=q.device)
    for start in range(0, n, ROW_TILE):
        stop = min(n, start + ROW_TILE)
        positions = torch.arange(context_len - n + start, context_len - n + stop, device=q.device)
        hidden = keys[None, :] > positions[:, None]                        # [rows, W] future or padding
        hidden = hidden.repeat_interleave(group, dim=0)                    # rows in (token, head) order
        scores = torch.matmul(qg[:, start * group:stop * group], kt).float().mul_(scale)
        probs = torch.softmax(scores.masked_fill_(hidden, float("-inf")), dim=-1)
        out[:, start * group:stop * group] = torch.matmul(probs.to(q.dtype), v)
    return out.view(num_kv_heads, n, group, head_dim).permute(1, 0, 2, 3).reshape(n, num_heads, head_dim)
