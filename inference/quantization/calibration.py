"""Calibration and evaluation text, whole-sequence forward passes, and layer-by-layer input
statistics for GPTQ and AWQ.

The corpus is the running Python's own standard library source (every top-level `*.py` module,
sorted by name): any machine with the same Python rebuilds exactly the same token windows, and
nothing is downloaded. Even-indexed modules calibrate; odd-indexed ones are held out for
evaluation, so quality is never measured on the text the scales were fitted to.
"""
from __future__ import annotations

import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from inference.core.tokenizer import Tokenizer
from inference.models.attention import AttentionMetadata, PrefillChunk, kv_row_width


def stdlib_windows(tokenizer: Tokenizer, split: str, num_windows: int, seq_len: int) -> list[list[int]]:
    """num_windows token windows of seq_len from the stdlib modules of one split ('calib' or 'eval')."""
    if split not in ("calib", "eval"):
        raise ValueError(f"split: 'calib' or 'eval', got {split!r}")
    if num_windows < 1 or seq_len < 2:
        raise ValueError(f"need num_windows >= 1 and seq_len >= 2, got {num_windows}, {seq_len}")
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    files = files[0::2] if split == "calib" else files[1::2]
    windows: list[list[int]] = []
    for path in files:
        ids = tokenizer.encode(path.read_text(encoding="utf-8", errors="replace"))
        for start in range(0, len(ids) - seq_len + 1, seq_len):
            windows.append(ids[start:start + seq_len])
            if len(windows) == num_windows:
                return windows
    raise ValueError(f"the stdlib holds fewer than {num_windows} windows of {seq_len} tokens ({len(windows)})")


def one_sequence_meta(num_tokens: int, device) -> AttentionMetadata:
    """One causal prefill of num_tokens on a one-block cache of num_tokens slots."""
    return AttentionMetadata(slot_mapping=torch.arange(num_tokens, device=device), prefills=[
        PrefillChunk(0, num_tokens, num_tokens, torch.zeros(1, dtype=torch.long, device=device), None)])


@torch.inference_mode()
def forward_hidden(model: nn.Module, token_ids: list[int], kv_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Final hidden states [T, hidden] of one sequence, causal, on a throwaway one-block KV cache
    (the engine's PyTorch attention path) stored in kv_dtype (default: the model's)."""
    return causal_hidden(model, token_ids, kv_dtype)


def causal_hidden(model: nn.Module, token_ids: list[int], kv_dtype: torch.dtype | None = None) -> torch.Tensor:
    """forward_hidden in the caller's grad mode (scale tuning backpropagates through it)."""
    device = next(model.parameters()).device
    dtype = kv_dtype or model.embed_tokens.weight.dtype
    arch = model.arch
    t = len(token_ids)
    shape = (1, t, arch.num_key_value_heads, kv_row_width(arch.head_dim, dtype))
    kv = [(torch.empty(shape, dtype=dtype, device=device), torch.empty(shape, dtype=dtype, device=device))
          for _ in range(arch.num_hidden_layers)]
    ids = torch.tensor(token_ids, device=device)
    return model(ids, torch.arange(t, device=device), kv, one_sequence_meta(t, device))


def forward_logits(model: nn.Module, token_ids: list[int], kv_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Next-token logits [T, vocab] (fp32) at every position of one sequence."""
    with torch.inference_mode():
        return model.compute_logits(forward_hidden(model, token_ids, kv_dtype)).float()


@dataclass
class InputStats:
    """What calibration keeps of one linear layer's inputs."""
    num_rows: int = 0
    abs_sum: torch.Tensor | None = None         # [in] sum of |x| over every row (AWQ's salience)
    xtx: torch.Tensor | None = None             # [in, in] fp64 sum of x x^T (GPTQ), when asked for
    sample: list[torch.Tensor] = field(default_factory=list)   # the first rows, up to sample_rows

    def add(self, x: torch.Tensor, with_hessian: bool, sample_rows: int, per_call: int) -> None:
        """One forward's inputs; keeps per_call of its rows, evenly spaced from the first (the
        attention sink every later token leans on), so the sample spans the windows."""
        x = x.reshape(-1, x.shape[-1]).float()
        self.num_rows += x.shape[0]
        a = x.abs().sum(0)
        self.abs_sum = a if self.abs_sum is None else self.abs_sum + a
        if with_hessian:                        # fp32 products per call, summed in fp64
            h = (x.t() @ x).double()
            self.xtx = h if self.xtx is None else self.xtx + h
        have = sum(t.shape[0] for t in self.sample)
        if have < sample_rows:
            take = min(per_call, sample_rows - have, x.shape[0])
            rows = torch.linspace(0, x.shape[0] - 1, take, device=x.device).round().long()
            self.sample.append(x[rows].clone())

    @property
    def hessian(self) -> torch.Tensor | None:
        """GPTQ's H = X^T X / n [in, in] (fp64): a mean, so its size does not grow with the rows."""
        return None if self.xtx is None else self.xtx / max(1, self.num_rows)

    def mean_abs(self) -> torch.Tensor:
        return self.abs_sum / max(1, self.num_rows)

    def sample_rows(self) -> torch.Tensor:
        return torch.cat(self.sample)


@dataclass
class WindowState:
    """One calibration window between two decoder layers."""
    x: torch.Tensor
    residual: torch.Tensor | None
    rope: object
    meta: AttentionMetadata
    kv: tuple[torch.Tensor, torch.Tensor]          # one layer's throwaway cache, reused by every layer


class LayerwiseCalibration:
    """Calibration one decoder layer at a time: only that layer's input statistics exist at any
    moment (a 70B model's Hessians would not fit otherwise), and `advance` decides what the next
    layer sees: the layer's outputs after quantizing it (GPTQ's sequential scheme) or before.

        cal = LayerwiseCalibration(model, windows)
        for i, layer in enumerate(model.layers):
            stats = cal.stats(layer, names, with_hessian, sample_rows)   # runs layer i as it is
            ... quantize layer i ...
            cal.advance(layer)                                         # runs it again
    """

    def __init__(self, model: nn.Module, windows: list[list[int]]):
        device = model.embed_tokens.weight.device
        dtype = model.embed_tokens.weight.dtype
        arch = model.arch
        self.states = []
        with torch.no_grad():
            for w in windows:
                t = len(w)
                ids, pos = torch.tensor(w, device=device), torch.arange(t, device=device)
                x = model.embed_tokens(ids)
                shape = (1, t, arch.num_key_value_heads, arch.head_dim)
                self.states.append(WindowState(x, None, model.rotary.prepare(pos, dtype), one_sequence_meta(t, device),
                                               (torch.empty(shape, dtype=dtype, device=device),
                                                torch.empty(shape, dtype=dtype, device=device))))

    def _run(self, layer: nn.Module, st: WindowState):
        return layer.forward(st.x, st.residual, st.rope, st.kv[0], st.kv[1], st.meta)

    @torch.no_grad()
    def stats(self, layer: nn.Module, names: list[str], with_hessian: bool, sample_rows: int) -> dict[str, InputStats]:
        """Input statistics of layer.get_submodule(name) for each name, over every window. The
        layer calls `linear.forward(x)` directly (no __call__, so no hooks fire): each forward is
        shadowed by an instance attribute while the layer runs."""
        modules = {name: layer.get_submodule(name) for name in names}
        stats = {name: InputStats() for name in names}
        per_call = -(-sample_rows // max(1, len(self.states)))

        def wrap(name: str, forward):
            def capture(x, *args, **kwargs):
                stats[name].add(x, with_hessian, sample_rows, per_call)
                return forward(x, *args, **kwargs)
            return capture
        for name, m in modules.items():
            m.forward = wrap(name, m.forward)
        try:
            for st in self.states:
                self._run(layer, st)
        finally:
            for m in modules.values():
                del m.forward
        return stats

    @torch.no_grad()
    def advance(self, layer: nn.Module) -> None:
        """Every window through `layer` as it is now: the next layer's inputs."""
        for st in self.states:
            st.x, st.residual = self._run(layer, st)
