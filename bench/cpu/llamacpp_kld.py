"""llama.cpp's agreement with a reference we compute: `llama-perplexity --kl-divergence`, fed a
base-logits file written from our fp32 logits, so llama.cpp runs on exactly our token windows and is
scored against exactly our reference.

The file is llama-perplexity's own (tools/perplexity/perplexity.cpp, `--kl-divergence-base`):
"_logits_", n_ctx (u32), n_vocab and n_chunk (i32), the chunks' tokens (i32), then for each chunk
the positions n_ctx/2 .. n_ctx-2 as two f32 (scale, min log-prob) and one u16 per vocabulary entry,
log p = scale * q + min, over the top 16 nats. llama.cpp scores only those positions (the second
half of each window); `second_half` picks the same positions of our logits.
"""
from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch

from bench.cpu.llamacpp import binary, build, peer_env


def second_half(logits: torch.Tensor) -> torch.Tensor:
    """The positions llama-perplexity scores in a window of n tokens: n//2 .. n-2 (each predicts the next)."""
    n = logits.shape[0]
    return logits[n // 2:n - 1]


def _quantized_log_probs(logits: torch.Tensor) -> np.ndarray:
    """[positions, 4 + vocab padded to even] u16 rows, as llama-perplexity writes them."""
    logits = logits.double()
    top = logits.max(-1, keepdim=True).values
    low = torch.maximum(logits.min(-1, keepdim=True).values, top - 16)
    lse = torch.logsumexp(logits - top, -1, keepdim=True)
    min_log_prob = (low - top - lse).float()
    scale = ((top - low) / 65535.0).float()
    q = torch.where(logits > low, torch.round((logits - low) / scale.double()), torch.zeros_like(logits))
    vocab = logits.shape[1]
    width = 2 * ((vocab + 1) // 2) + 4
    out = np.zeros((logits.shape[0], width), dtype=np.uint16)
    head = torch.cat([scale, min_log_prob], -1).numpy().astype(np.float32)
    out[:, :4] = head.view(np.uint16).reshape(-1, 4)
    out[:, 4:4 + vocab] = q.clamp(0, 65535).numpy().astype(np.uint16)
    return out


def write_base(path: Path, windows: list[list[int]], ref_logits: list[torch.Tensor]) -> None:
    n_ctx = len(windows[0])
    if any(len(w) != n_ctx for w in windows):
        raise ValueError("llama-perplexity's base file needs windows of one length")
    vocab = ref_logits[0].shape[1]
    with open(path, "wb") as f:
        f.write(b"_logits_")
        f.write(np.array([n_ctx], dtype=np.uint32).tobytes())
        f.write(np.array([vocab, len(windows)], dtype=np.int32).tobytes())
        f.write(np.array(windows, dtype=np.int32).tobytes())
        for logits in ref_logits:
            f.write(_quantized_log_probs(second_half(logits)).tobytes())


_SAME_TOP = re.compile(r"Same top p:\s*([\d.]+)\s*±\s*([\d.]+)\s*%")
_MEAN_KLD = re.compile(r"Mean\s+KLD:\s*([-\d.]+)")


def llamacpp_agreement(gguf: Path, windows: list[list[int]], ref_logits: list[torch.Tensor], level: str,
                       threads: int = 2) -> dict:
    """llama.cpp (built for `level`) on the GGUF file, teacher-forced on `windows`, against `ref_logits`:
    top-1 agreement and mean KL over the second half of each window."""
    build(level)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.kld"
        write_base(base, windows, ref_logits)
        n_ctx = len(windows[0])
        cmd = [str(binary("llama-perplexity", level)), "-m", str(gguf), "--kl-divergence",
               "--kl-divergence-base", str(base), "-c", str(n_ctx), "-b", str(n_ctx), "-t", str(threads)]
        run = subprocess.run(cmd, capture_output=True, text=True, env=peer_env(), timeout=1800)
    log = run.stdout + run.stderr
    same, kld = _SAME_TOP.search(log), _MEAN_KLD.search(log)
    if run.returncode != 0 or not same or not kld:
        raise RuntimeError(f"llama-perplexity failed (exit {run.returncode}):\n{log[-2000:]}")
    positions = len(windows) * (n_ctx - 1 - n_ctx // 2)
    return {"positions": positions, "top1_agreement": float(same.group(1)) / 100,
            "top1_stderr": float(same.group(2)) / 100, "mean_kl": float(kld.group(1))}
