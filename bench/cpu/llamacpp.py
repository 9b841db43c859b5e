"""llama.cpp as a benchmark peer: build `llama-server` and `llama-bench` once from the vendored
source of the `llama-cpp-python` sdist, cached outside the repository, and run the server.

A bench tool, never a product dependency. The build is CPU-only, native (the machine's
AVX-512 / AMX), Release; about ten minutes on two cores the first time.

    .venv/bin/python -m bench.cpu.llamacpp          # build (or find) it and print the paths
"""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from bench.harness import stop_process, wait_ready

SDIST_NAME, SDIST_VERSION = "llama-cpp-python", "0.3.36"
BINARIES = ("llama-server", "llama-bench")


def cache_dir() -> Path:
    return Path(os.environ.get("LLAMACPP_CACHE_DIR", Path.home() / ".cache" / "support-bench" / "llamacpp"))


def binary(name: str) -> Path:
    return cache_dir() / "build" / "bin" / name


def _source_dir() -> Path:
    root = cache_dir()
    src = root / "src"
    if (src / "CMakeLists.txt").exists():
        return src
    root.mkdir(parents=True, exist_ok=True)
    archives = sorted(root.glob(f"{SDIST_NAME.replace('-', '_')}-{SDIST_VERSION}.tar.gz"))
    if not archives:
        # the sdist itself, through pip's own index settings; --no-build-isolation is not needed:
        # --no-deps with --no-binary only downloads (no metadata build for a pinned sdist)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary=:all:",
                        "-d", str(root), f"{SDIST_NAME}=={SDIST_VERSION}"], check=True)
        archives = sorted(root.glob(f"{SDIST_NAME.replace('-', '_')}-{SDIST_VERSION}.tar.gz"))
    archive = archives[0]
    with tarfile.open(archive) as tar:
        tar.extractall(root / "sdist", filter="data")
    vendored = next((root / "sdist").glob("llama_cpp_python-*/vendor/llama.cpp"))
    vendored.rename(src)
    return src


def build() -> Path:
    """The build folder with bin/llama-server and bin/llama-bench (built on first use)."""
    if all(binary(b).exists() for b in BINARIES):
        return binary(BINARIES[0]).parent.parent
    src, out = _source_dir(), cache_dir() / "build"
    t0 = time.monotonic()
    subprocess.run(["cmake", "-S", str(src), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
                    "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                    "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON"], check=True)
    subprocess.run(["cmake", "--build", str(out), "-j", str(os.cpu_count() or 2), "--target", *BINARIES], check=True)
    print(f"llama.cpp built in {time.monotonic() - t0:.0f} s: {out}", flush=True)
    return out


class LlamaServer:
    """`llama-server` on 127.0.0.1:port serving one GGUF file through its OpenAI API."""

    def __init__(self, gguf: Path, port: int, threads: int = 2, parallel: int = 16, ctx: int = 16 * 2048,
                 alias: str = "smollm2"):
        self.url = f"http://127.0.0.1:{port}"
        self.cmd = [str(binary("llama-server")), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
                    "-t", str(threads), "-tb", str(threads), "-np", str(parallel), "-c", str(ctx),
                    "--no-webui", "-a", alias]
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> LlamaServer:
        build()
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(f"{self.url}/health", self.proc, timeout=120)
        except RuntimeError:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        stop_process(self.proc, 10)

if __name__ == "__main__":
    print(build())
