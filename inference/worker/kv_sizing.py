"""How many KV blocks a runner gets, and what one block costs.

On the CPU the cache takes `kv_cache_memory_bytes` (512 MiB by default, or one max_model_len
sequence if more). On CUDA it takes an explicit `kv_cache_memory_bytes`, else what
`gpu_memory_utilization` leaves after the weights and the activation peak of the largest step,
measured by running that step once.
"""
from __future__ import annotations

import logging

import torch

from inference.config import CacheConfig, SchedulerConfig
from inference.loader.model_loader import LoadedModel
from inference.models.attention import kv_row_width
from inference.models.triton_layers import KernelAttentionMetadata
from inference.sampling_params import SamplingParams
from inference.worker.cuda_graphs import mixed_shapes
from inference.worker.sampler import SamplingRow, sample

log = logging.getLogger(__name__)

CPU_KV_CACHE_BYTES = 1 << 29          # default KV cache on the CPU (Qwen2.5-0.5B: 43k tokens), at least one sequence


def kv_cache_dtype(loaded: LoadedModel, cache: CacheConfig) -> torch.dtype:
    """What the cache stores: the model's dtype, float8 e4m3 or int8 rows with their scales (both
    read back in the model's dtype; inference/models/attention.py)."""
    return {"fp8_e4m3": torch.float8_e4m3fn, "int8": torch.int8}.get(cache.kv_cache_dtype, loaded.dtype)


def kv_cache_shape(loaded: LoadedModel, cache: CacheConfig, num_blocks: int) -> tuple[int, int, int, int]:
    """One layer's K (or V) cache: [num_blocks, block_size, num_kv_heads, row width]."""
    arch = loaded.arch
    return (num_blocks, cache.block_size, arch.num_key_value_heads,
            kv_row_width(arch.head_dim, kv_cache_dtype(loaded, cache)))


def kv_bytes_per_block(loaded: LoadedModel, cache: CacheConfig) -> int:
    dtype_bytes = torch.tensor([], dtype=kv_cache_dtype(loaded, cache)).element_size()
    _, block_size, heads, width = kv_cache_shape(loaded, cache, 1)
    return 2 * loaded.arch.num_hidden_layers * block_size * heads * width * dtype_bytes


def default_cpu_kv_bytes(loaded: LoadedModel, cache: CacheConfig) -> int:
    """The CPU cache when none is set: CPU_KV_CACHE_BYTES, or one max-length sequence if that is more
    (Qwen2.5-Coder-1.5B at 32k tokens: 896 MiB)."""
    needed = -(-loaded.max_model_len // cache.block_size)
    return max(CPU_KV_CACHE_BYTES, needed * kv_bytes_per_block(loaded, cache))


def num_kv_blocks(loaded: LoadedModel, cache: CacheConfig, kv_bytes: int, source: str) -> int:
    """Blocks that fit in kv_bytes; fails now if one max-length sequence won't. `source` names the
    setting the user should change."""
    bytes_per_block = kv_bytes_per_block(loaded, cache)
    num_blocks = kv_bytes // bytes_per_block
    needed = -(-loaded.max_model_len // cache.block_size)
    if num_blocks < needed:
        need_bytes = needed * bytes_per_block
        raise ValueError(
            f"{source}: {kv_bytes} bytes of KV cache hold {num_blocks} blocks of "
            f"{cache.block_size} tokens, but one sequence of max_model_len={loaded.max_model_len} needs "
            f"{needed} blocks ({need_bytes} bytes = {need_bytes / 2**20:.1f} MiB); raise "
            f"{source} or lower max_model_len")
    return int(num_blocks)


def size_kv_cache(loaded: LoadedModel, cache: CacheConfig, sched: SchedulerConfig) -> int:
    """KV blocks for the GPU: explicit kv_cache_memory_bytes, else what gpu_memory_utilization
    leaves after the weights and the activation peak of the largest step (measured by running it)."""
    if cache.kv_cache_memory_bytes is not None:
        return num_kv_blocks(loaded, cache, cache.kv_cache_memory_bytes, "kv_cache_memory_bytes")
    device = next(loaded.model.parameters()).device
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    _profile_run(loaded, cache, sched, device)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    free, total = torch.cuda.mem_get_info(device)
    non_torch = total - free - torch.cuda.memory_reserved(device)       # CUDA context, other processes
    # Graphs keep their own activations outside the profiled pool: decode graphs their logits
    # (largest bucket), mixed graphs one layer's activations for their largest shape (x2 for the
    # allocator's slack).
    arch = loaded.arch
    mixed_rows = max((d + p for d, p in mixed_shapes(sched.max_num_seqs, sched.max_num_batched_tokens)), default=0)
    per_row = (4 * arch.hidden_size + (arch.num_attention_heads + 2 * arch.num_key_value_heads) * arch.head_dim
               + 3 * arch.intermediate_size) * loaded.dtype.itemsize
    # quantized linears dequantize their weight for steps of >= 256 rows (inference/kernels/quant_matmul.py):
    # the largest such temporary lives in the graph pool too
    dequant = max((m.out_features * m.in_features * loaded.dtype.itemsize for m in loaded.model.modules()
                   if hasattr(m, "qweight") and hasattr(m, "out_features")), default=0)
    graph_reserve = (2 * min(sched.max_num_seqs, 512) * arch.vocab_size * 4 + 2 * mixed_rows * per_row
                     + 2 * dequant + (256 << 20))
    budget = int(total * cache.gpu_memory_utilization) - peak - non_torch - graph_reserve
    log.info("GPU memory: total %.1f GiB, weights+activation peak %.2f GiB, other %.2f GiB -> KV %.2f GiB",
             total / 2**30, peak / 2**30, non_torch / 2**30, budget / 2**30)
    if budget < kv_bytes_per_block(loaded, cache):
        raise ValueError(
            f"gpu_memory_utilization: {cache.gpu_memory_utilization} of {total / 2**30:.1f} GiB leaves no room "
            f"for a KV cache after {peak / 2**30:.2f} GiB of weights and activations and "
            f"{non_torch / 2**30:.2f} GiB used outside PyTorch; raise it or lower max_num_batched_tokens")
    torch.cuda.empty_cache()
    return num_kv_blocks(loaded, cache, budget, "gpu_memory_utilization")


@torch.inference_mode()
def _profile_run(loaded: LoadedModel, cache: CacheConfig, sched: SchedulerConfig, device) -> None:
    """The largest step, on a throwaway KV cache just big enough for it."""
    shape = kv_cache_shape(loaded, cache, -(-sched.max_num_batched_tokens // cache.block_size))
    dtype = kv_cache_dtype(loaded, cache)
    kv = [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
          for _ in range(loaded.arch.num_hidden_layers)]
    run_largest_step(loaded, sched, kv, write_kv=True)


@torch.inference_mode()
def run_largest_step(loaded: LoadedModel, sched: SchedulerConfig, kv_caches, write_kv: bool) -> None:
    """The largest step the scheduler can build: max_num_batched_tokens prefill tokens, then
    logits and top-p sampling with logprobs for max_num_seqs rows. Run once to measure the
    activation peak (profiling), and once more on the real cache (write_kv=False: nothing is
    written) so the allocator already holds that memory when the first big step arrives."""
    device = kv_caches[0][0].device
    num_cache_blocks, block_size = kv_caches[0][0].shape[:2]
    num_tokens = sched.max_num_batched_tokens
    num_blocks = -(-num_tokens // block_size)
    i32 = dict(dtype=torch.int32, device=device)
    slots = torch.arange(num_tokens, device=device) if write_kv else torch.full((num_tokens,), -1, device=device)
    meta = KernelAttentionMetadata(
        slot_mapping=slots,
        prefill_block_tables=(torch.arange(num_blocks, **i32) % num_cache_blocks)[None],
        prefill_query_start=torch.tensor([0, num_tokens], **i32),
        prefill_context_lens=torch.tensor([num_tokens], **i32), max_query_len=num_tokens)
    positions = torch.arange(num_tokens, device=device).clamp_(max=loaded.max_model_len - 1)
    hidden = loaded.model(torch.zeros(num_tokens, dtype=torch.long, device=device), positions, kv_caches, meta)
    rows = min(sched.max_num_seqs, num_tokens)
    logits = loaded.model.compute_logits(hidden[:1].expand(rows, -1).contiguous())
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, logprobs=5)
    sample(logits, [SamplingRow(params, [0], [0], None, []) for _ in range(rows)])
