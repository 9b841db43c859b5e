"""The CPU kernels must build where their tools are: otherwise the engine silently falls back to
PyTorch's ops and the kernel tests skip."""
from __future__ import annotations

import shutil

import pytest

from inference.kernels.cpu_ops import cpu_ops


@pytest.mark.skipif(not (shutil.which("g++") and shutil.which("ninja")), reason="no g++ / ninja here")
def test_the_cpu_kernels_build_where_g_plus_plus_and_ninja_exist():
    assert cpu_ops() is not None, "inference/kernels/cpu_ops.cpp or gguf_matmul.cpp failed to build (see the log)"
    assert cpu_ops().pool_threads() >= 1
