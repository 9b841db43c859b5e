"""The CPU kernels of cpu_ops.cpp and gguf_matmul.cpp, built once per machine with torch's C++ extension loader
(g++ and ninja; the build is cached under ~/.cache/torch_extensions and takes ~40 s the first
time). `cpu_ops()` is None where it cannot build, and the model keeps its PyTorch path.

PyTorch references beside each kernel (what the tests compare them with):
    add_rms_norm(x, residual, w, eps)    RMSNorm.forward in inference/models/llama.py
    rope_write_kv(...)                   TorchRope.apply + write_kv (inference/models/attention.py)
    paged_decode_attention(...)          the decode branch of paged_attention
    silu_mul(x)                          SiluAndMul.forward
    q4_matmul(x, codes, d, m)            x @ dequantized(W)^T (inference/models/gguf_cpu_linear.py)
"""
from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)
SOURCES = [Path(__file__).with_name(n) for n in ("cpu_ops.cpp", "gguf_matmul.cpp")]   # + bf16.h, spin_pool.h


@functools.cache
def cpu_ops():
    """The compiled module, or None (INFERENCE_CPU_KERNELS=0, or no compiler here)."""
    if os.environ.get("INFERENCE_CPU_KERNELS", "1") == "0":
        return None
    try:
        from torch.utils.cpp_extension import load
        return load(name="inference_cpu_ops", sources=[str(p) for p in SOURCES], verbose=False,
                    extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"])
    except Exception as exc:            # no compiler / ninja, or a build error: say so, keep PyTorch's ops
        log.warning("CPU kernels unavailable, using PyTorch ops: %s", str(exc).splitlines()[0] if str(exc) else exc)
        return None
