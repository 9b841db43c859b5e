"""The one place that builds a runner, for a single process and for each tensor-parallel rank."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from inference.config import EngineConfig
from inference.loader.model_loader import LoadedModel
from inference.worker.kv_sizing import default_cpu_kv_bytes, num_kv_blocks, size_kv_cache
from inference.worker.model_runner import ModelRunner

if TYPE_CHECKING:
    from inference.parallel.comm import TPComm


def build_runner(loaded: LoadedModel, config: EngineConfig, comm: TPComm | None = None) -> ModelRunner:
    """The runner for the model's device. On CUDA the KV cache is sized from free memory.

    With `comm` (a tensor-parallel rank) every rank takes the smallest block count any rank can
    hold, so block ids mean the same slots everywhere; host / disk KV tiers are single-process
    only, so they are attached only without `comm`."""
    cache = config.cache

    def agreed(num_blocks: int) -> int:
        return num_blocks if comm is None else comm.min_int(num_blocks, loaded.device)

    if loaded.device.type == "cuda":
        if cache.kv_cache_dtype == "int8":
            raise ValueError("kv_cache_dtype='int8' runs on the CPU path only: the CUDA attention kernels read "
                             "'auto' or 'fp8_e4m3' caches (fp8_e4m3 takes the same bytes per token)")
        from inference.worker.cuda_runner import CudaModelRunner  # imports Triton kernels
        torch.cuda.set_device(loaded.device)     # cuda:N: kernels launch on the current device
        num_blocks = agreed(size_kv_cache(loaded, cache, config.scheduler))
        runner: ModelRunner = CudaModelRunner(loaded, cache, config.scheduler, num_blocks, config.model.seed,
                                              config.model.enforce_eager)
    else:
        kv_bytes = cache.kv_cache_memory_bytes or default_cpu_kv_bytes(loaded, cache)
        runner = ModelRunner(loaded, cache, agreed(num_kv_blocks(loaded, cache, kv_bytes, "kv_cache_memory_bytes")),
                             config.model.seed)
    if comm is None:
        runner.attach_kv_tiers(cache)
    return runner
