"""llama.cpp as a benchmark peer: build `llama-server` and `llama-bench` once from the vendored
source of the `llama-cpp-python` sdist, cached outside the repository, and run the server.

A bench tool, never a product dependency. The build is CPU-only, Release, for one of our ISA
levels (AVX-512 with VNNI and BF16, or AVX2); about five minutes on two cores the first time.

    .venv/bin/python -m bench.cpu.llamacpp [avx512_vnni] [avx2]   # build (or find) them, print the paths
"""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from bench.harness import stop_process, wait_ready
from inference.kernels.cpu_ops import cpu_flags

SDIST_NAME, SDIST_VERSION = "llama-cpp-python", "0.3.36"
# the server and llama-bench for speed; llama-perplexity for the agreement peer (gguf_agreement)
BINARIES = ("llama-server", "llama-bench", "llama-perplexity")


def cache_dir() -> Path:
    return Path(os.environ.get("LLAMACPP_CACHE_DIR", Path.home() / ".cache" / "support-bench" / "llamacpp"))


# ISA level (ours, inference/kernels/cpu_ops.py) -> llama.cpp's build for the same level: the
# machine's native flags for the top one, explicit GGML options (GGML_NATIVE=OFF) below it
# (AMX stays off: on a VM that lists AMX in its CPU flags without enabling its tile state,
# -march=native built ggml's AMX kernels and llama-server died of SIGILL; our kernels use none).
# AVX512_BF16 follows the CPU, as our -march=native build does: on an Ice Lake Xeon, which has
# VNNI without BF16, a build with it on would hold instructions that CPU cannot run.
_BF16 = "ON" if "avx512_bf16" in cpu_flags() else "OFF"
LEVEL_OPTIONS = {
    "avx512_vnni": ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
                    "-DGGML_BMI2=ON", "-DGGML_AVX512=ON", "-DGGML_AVX512_VBMI=ON", "-DGGML_AVX512_VNNI=ON",
                    f"-DGGML_AVX512_BF16={_BF16}", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF",
                    "-DGGML_AMX_BF16=OFF"],
    "avx2": ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
             "-DGGML_BMI2=ON", "-DGGML_AVX512=OFF", "-DGGML_AVX_VNNI=OFF"],
}


def build_dir(level: str = "avx512_vnni") -> Path:
    return cache_dir() / ("build" if level == "avx512_vnni" else f"build-{level}")


def binary(name: str, level: str = "avx512_vnni") -> Path:
    return build_dir(level) / "bin" / name


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


def build(level: str = "avx512_vnni") -> Path:
    """The build folder with bin/ holding BINARIES for an ISA level (built on first use)."""
    if all(binary(b, level).exists() for b in BINARIES):
        return build_dir(level)
    src, out = _source_dir(), build_dir(level)
    t0 = time.monotonic()
    subprocess.run(["cmake", "-S", str(src), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release", *LEVEL_OPTIONS[level],
                    "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                    "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON"], check=True)
    subprocess.run(["cmake", "--build", str(out), "-j", str(os.cpu_count() or 2), "--target", *BINARIES], check=True)
    print(f"llama.cpp built in {time.monotonic() - t0:.0f} s: {out}", flush=True)
    return out


def peer_env() -> dict[str, str]:
    """This process's environment without the OpenMP settings `import inference` makes for our engine:
    ggml's CPU backend runs on OpenMP too, and OMP_WAIT_POLICY=PASSIVE put its threads to sleep
    between ops (llama-server decoded the 0.5B at 25 tok/s with it, 45 without, on a Zen 3 VM)."""
    return {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}


class LlamaServer:
    """`llama-server` on 127.0.0.1:port serving one GGUF file through its OpenAI API."""

    def __init__(self, gguf: Path, port: int, threads: int = 2, parallel: int = 16, ctx: int = 16 * 2048,
                 alias: str = "smollm2", level: str = "avx512_vnni", extra: tuple[str, ...] = ()):
        self.level = level
        self.url = f"http://127.0.0.1:{port}"
        self.cmd = [str(binary("llama-server", level)), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
                    "-t", str(threads), "-tb", str(threads), "-np", str(parallel), "-c", str(ctx),
                    "--no-webui", "-a", alias, *extra]
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> LlamaServer:
        build(self.level)
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=peer_env())
        try:
            wait_ready(f"{self.url}/health", self.proc, timeout=120)
        except RuntimeError:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        stop_process(self.proc, 10)

if __name__ == "__main__":
    for level in sys.argv[1:] or ["avx512_vnni"]:
        print(build(level))
