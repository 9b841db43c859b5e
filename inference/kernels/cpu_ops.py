"""The CPU kernels of cpu_ops.cpp and gguf_matmul.cpp, built once per machine with torch's C++ extension loader
(g++ and ninja; the build is cached under ~/.cache/torch_extensions and takes ~40 s the first
time). `cpu_ops()` is None where it cannot build, and the model keeps its PyTorch path.

PyTorch references beside each kernel (what the tests compare them with):
    add_rms_norm(x, residual, w, eps)    RMSNorm.forward in inference/models/llama.py
    rope_write_kv(...)                   TorchRope.apply + write_kv (inference/models/attention.py)
    paged_decode_attention(...)          the decode branch of paged_attention
    paged_prefill_attention(...)         invariant_prefill_attention (inference/models/invariant_attention.py)
    silu_mul(x)                          SiluAndMul.forward
    gguf_linear(x, codes, ...)           x @ dequantized(W)^T + bias (inference/models/gguf_cpu_linear.py)
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
SOURCES = [HERE / n for n in ("cpu_ops.cpp", "cpu_prefill_attention.cpp", "gguf_matmul.cpp")]
HEADERS = [HERE / n for n in ("bf16.h", "lanes.h", "spin_pool.h", "gguf_blocks_avx2.h")]

# ISA levels of the GGUF kernels, best first: the CPU flags each needs and the compiler flags of its
# build. Each level is its own module, so a lower one can be forced (INFERENCE_CPU_ISA) and tested
# on a machine that has a higher one. Their results are bit-identical (gguf_blocks_avx2.h).
ISA_LEVELS = {
    "avx512_vnni": ({"avx512f", "avx512bw", "avx512_vnni", "f16c"}, ["-march=native"]),
    "avx2": ({"avx2", "fma", "f16c"}, ["-march=haswell", "-mtune=generic"]),
}


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def supported_isa_levels() -> list[str]:
    """The levels this CPU runs, best first (empty: none, the PyTorch ops run)."""
    flags = cpu_flags()
    return [name for name, (needs, _) in ISA_LEVELS.items() if needs <= flags]


def selected_isa() -> str | None:
    """INFERENCE_CPU_ISA (auto, or a level name) resolved against this CPU; a level the CPU lacks is
    a ValueError naming the ones it has."""
    levels = supported_isa_levels()
    asked = os.environ.get("INFERENCE_CPU_ISA", "auto")
    if asked == "auto":
        return levels[0] if levels else None
    if asked not in ISA_LEVELS:
        raise ValueError(f"INFERENCE_CPU_ISA={asked!r}: one of auto, {', '.join(ISA_LEVELS)}")
    if asked not in levels:
        raise ValueError(f"INFERENCE_CPU_ISA={asked!r}: this CPU runs {', '.join(levels) or 'none of them'}")
    return asked


def _sources_tag() -> str:
    """torch's loader rebuilds when sources or flags change, not headers: the headers' hash is a flag."""
    return hashlib.sha1(b"".join(h.read_bytes() for h in HEADERS)).hexdigest()[:12]


@functools.cache
def cpu_ops():
    """The compiled module of the selected ISA level, or None (INFERENCE_CPU_KERNELS=0, a CPU without
    AVX2, or no compiler here)."""
    if os.environ.get("INFERENCE_CPU_KERNELS", "1") == "0":
        return None
    isa = selected_isa()
    if isa is None:
        log.warning("CPU kernels unavailable: this CPU has neither AVX-512 VNNI nor AVX2 + FMA + F16C")
        return None
    module = cpu_ops_at(isa)
    if module is not None:
        log.info("CPU kernels: ISA level %s (this CPU runs %s; INFERENCE_CPU_ISA forces one)", isa,
                 ", ".join(supported_isa_levels()))
    return module


@functools.cache
def cpu_ops_at(isa: str):
    """The module built for one ISA level (tests compare levels in one process), or None."""
    try:
        from torch.utils.cpp_extension import load
        module = load(name=f"inference_cpu_ops_{isa}", sources=[str(p) for p in SOURCES], verbose=False,
                      extra_cflags=["-O3", *ISA_LEVELS[isa][1], "-fopenmp", f"-DKERNEL_HEADERS={_sources_tag()}"],
                      extra_ldflags=["-fopenmp"])
    except Exception as exc:            # no compiler / ninja, or a build error: say so, keep PyTorch's ops
        log.warning("CPU kernels unavailable, using PyTorch ops: %s", str(exc).splitlines()[0] if str(exc) else exc)
        return None
    return module


def cpu_isa() -> str:
    """The level the kernels run at ("none" without them): for logs, /metrics and benchmarks."""
    ops = cpu_ops()
    return "none" if ops is None else ops.gguf_matmul_isa()
