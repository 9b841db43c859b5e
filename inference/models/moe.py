"""Mixture-of-experts MLP (Mixtral, Qwen2-MoE) in plain PyTorch: a router picks top-k experts per
token; the experts' weights are stacked so a fused kernel can run them all as one grouped GEMM.

    x [T, H] ── gate ── softmax ── top-k (renormalised: Mixtral; as is: Qwen2-MoE unless
                                          norm_topk_prob) ── threshold (optional)
             └─ tokens grouped by expert ── w13[e] ── SiLU(gate) * up ── w2[e] ── x weight ── sum
             └─ Qwen2-MoE: + sigmoid(shared_expert_gate(x)) * shared_expert(x)

    w13: [E, 2I, H]  (each expert's gate rows, then its up rows)      w2: [E, H, I]

The forward here is the reference the fused GPU kernel is checked against: one matmul pair per
expert that received tokens. `router_weights_threshold` (engine argument, 0 = off) drops an
expert whose normalised weight is below it for that token (the token's top expert always stays),
saving its compute at some cost in fidelity.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inference.models.arch import ModelArch


def route(logits: torch.Tensor, top_k: int, renormalize: bool, threshold: float = 0.0):
    """logits [T, E] -> (weights [T, k] fp32, expert ids [T, k] int64). Dropped experts (below
    `threshold`) get weight 0; with `renormalize` the kept weights sum to 1."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if threshold > 0:
        keep = weights >= threshold
        keep[:, 0] = True                              # topk is sorted: the best expert stays
        weights = weights * keep
        if renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def experts_reference(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
                      ids: torch.Tensor) -> torch.Tensor:
    """sum_j weights[t, j] * expert_{ids[t, j]}(x[t]) for x [T, H], one matmul pair per used expert.
    Zero-weight assignments (dropped by the threshold) are not computed."""
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    flat_ids = ids.flatten()                                          # [T * k]
    flat_w = weights.flatten()
    live = flat_w > 0
    order = torch.argsort(flat_ids.masked_fill(~live, w13.shape[0]), stable=True)
    counts = torch.bincount(flat_ids[live], minlength=w13.shape[0]).tolist()
    start = 0
    top_k = ids.shape[1]
    for expert, n in enumerate(counts):
        if n == 0:
            continue
        sel = order[start:start + n]                                  # assignments to this expert
        start += n
        tokens = sel // top_k
        h = _expert_linear(w13, expert, x[tokens])                     # [n, 2I]
        gate, up = h.chunk(2, dim=-1)
        y = _expert_linear(w2, expert, F.silu(gate) * up)              # [n, H]
        out.index_add_(0, tokens, y.float() * flat_w[sel, None])
    return out.to(x.dtype)


def _expert_linear(w, expert: int, x: torch.Tensor) -> torch.Tensor:
    """x @ w[expert].T, for a stacked weight or quantized experts (which have their own kernel)."""
    return w.linear(expert, x) if hasattr(w, "linear") else F.linear(x, w[expert])


class SharedExpert(nn.Module):
    """Qwen2-MoE's always-on expert, scaled per token by sigmoid(shared_expert_gate(x))."""

    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj.forward(x).chunk(2, dim=-1)
        return self.down_proj.forward(F.silu(gate) * up)


class SparseMoeBlock(nn.Module):
    def __init__(self, arch: ModelArch):
        super().__init__()
        h, inter, e = arch.hidden_size, arch.moe_intermediate_size, arch.num_experts
        self.num_experts, self.top_k, self.renormalize = e, arch.num_experts_per_tok, arch.norm_topk_prob
        self.gate = nn.Linear(h, e, bias=False)
        self.w13 = nn.Parameter(torch.empty(e, 2 * inter, h))
        self.w2 = nn.Parameter(torch.empty(e, h, inter))
        self.shared_expert = self.shared_expert_gate = None
        if arch.shared_expert_intermediate_size:
            self.shared_expert = SharedExpert(h, arch.shared_expert_intermediate_size)
            self.shared_expert_gate = nn.Linear(h, 1, bias=False)
        self.threshold = 0.0                           # set by set_router_threshold
        # GPU transform (use_router_kernel): one-kernel router, threshold read from a device tensor
        self.router_kernel = None
        self.threshold_tensor: torch.Tensor | None = None
        # tokens routed to each expert, cumulative (read at scrape time: the expert-load metric)
        self.register_buffer("expert_tokens", torch.zeros(e, dtype=torch.int64), persistent=False)
        self.experts = experts_reference               # a GPU transform swaps in the fused kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, H] -> [T, H]"""
        logits = self.gate.forward(x)
        if self.router_kernel is not None:
            weights, ids = self.router_kernel(logits, self.top_k, self.renormalize, self.threshold_tensor,
                                              self.expert_tokens)
        else:
            weights, ids = route(logits, self.top_k, self.renormalize, self.threshold)
            # on the device, no host sync: the engine reads the counts when it reports stats
            self.expert_tokens.index_add_(0, ids.flatten(), (weights > 0).flatten().long())
        out = self.experts(x, self.w13, self.w2, weights, ids)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate.forward(x)) * self.shared_expert.forward(x)
        return out

    def use_router_kernel(self, kernel) -> None:
        """Route with `kernel` (inference/kernels/moe_routing.py:fused_route: softmax, top-k, threshold and the
        expert-load count in one launch). Its threshold lives in a device tensor, so CUDA graphs
        captured once follow set_router_threshold."""
        self.router_kernel = kernel
        self.threshold_tensor = torch.full((1,), self.threshold, dtype=torch.float32, device=self.gate.weight.device)


def moe_blocks(model: nn.Module) -> list[tuple[int, SparseMoeBlock]]:
    """(layer index, block) for every sparse layer of `model`."""
    return [(i, layer.mlp) for i, layer in enumerate(model.layers) if isinstance(layer.mlp, SparseMoeBlock)]


def set_router_threshold(model: nn.Module, threshold: float) -> None:
    if not 0.0 <= threshold < 1.0:
        raise ValueError(f"router_weights_threshold: must be in [0, 1), got {threshold!r}")
    blocks = moe_blocks(model)
    if threshold and not blocks:
        raise ValueError("router_weights_threshold: the model has no mixture-of-experts layers")
    for _, block in blocks:
        block.threshold = float(threshold)
        if block.threshold_tensor is not None:
            block.threshold_tensor.fill_(block.threshold)


def expert_load(model: nn.Module) -> dict[int, list[int]]:
    """Tokens routed to each expert per sparse layer since the model was built (cumulative, so a
    reader on another thread never races a reset)."""
    return {i: block.expert_tokens.tolist() for i, block in moe_blocks(model)}
