"""Model architecture description for the Llama family, read from a Hugging Face config.json.

Covers Llama 2/3 (incl. Llama-3 rope scaling), Mistral, Qwen2 (q/k/v bias) and SmolLM2, and the
mixture-of-experts members Mixtral and Qwen2-MoE (routed experts in place of the MLP; Qwen2-MoE
adds a gated shared expert and may keep dense MLPs in some layers).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "mixtral", "qwen2_moe")


@dataclass(frozen=True)
class ModelArch:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    attention_bias: bool = False          # Qwen2: bias on q/k/v projections only
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    sliding_window: int | None = None
    # mixture of experts (num_experts == 0: a dense model)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0        # each routed expert's MLP width
    norm_topk_prob: bool = True           # renormalise the top-k router weights (Mixtral: yes)
    shared_expert_intermediate_size: int = 0   # Qwen2-MoE: an always-on expert, sigmoid-gated
    decoder_sparse_step: int = 1          # Qwen2-MoE: every n-th layer is sparse ...
    mlp_only_layers: tuple[int, ...] = ()  # ... except these, which keep a dense MLP
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type: {self.model_type!r} is not supported "
                             f"(supported: {SUPPORTED_MODEL_TYPES})")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_key_value_heads: must divide num_attention_heads, got "
                             f"{self.num_key_value_heads} for {self.num_attention_heads} heads")
        if self.head_dim % 2:
            raise ValueError(f"head_dim: must be even for rotary embeddings, got {self.head_dim}")
        if self.num_experts:
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise ValueError(f"num_experts_per_tok: must be in [1, num_experts={self.num_experts}], "
                                 f"got {self.num_experts_per_tok}")
            if self.moe_intermediate_size < 1 or self.decoder_sparse_step < 1:
                raise ValueError("moe_intermediate_size and decoder_sparse_step: must be >= 1, got "
                                 f"{self.moe_intermediate_size} and {self.decoder_sparse_step}")
            bad = [i for i in self.mlp_only_layers if not 0 <= i < self.num_hidden_layers]
            if bad:
                raise ValueError(f"mlp_only_layers: {bad} are not layers of a {self.num_hidden_layers}-layer model")
        elif self.model_type in ("mixtral", "qwen2_moe"):
            raise ValueError(f"{self.model_type}: the config names no experts (num_experts / num_local_experts)")

    def is_moe_layer(self, layer: int) -> bool:
        return (self.num_experts > 0 and layer not in self.mlp_only_layers
                and (layer + 1) % self.decoder_sparse_step == 0)

    @property
    def o_proj_bias(self) -> bool:
        # Llama's attention_bias also covers o_proj; Qwen2 has bias on q/k/v only.
        return self.attention_bias and self.model_type not in ("qwen2", "qwen2_moe")

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def eos_token_ids(self) -> list[int]:
        if self.eos_token_id is None:
            return []
        return list(self.eos_token_id) if isinstance(self.eos_token_id, list) else [self.eos_token_id]

    def mlp_params(self, layer: int, active: bool = False) -> int:
        """The layer's MLP parameters (active: only those a token reads, top-k of the experts)."""
        h = self.hidden_size
        if not self.is_moe_layer(layer):
            return 3 * h * self.intermediate_size
        experts = self.num_experts_per_tok if active else self.num_experts
        shared = 3 * h * self.shared_expert_intermediate_size + h if self.shared_expert_intermediate_size else 0
        return experts * 3 * h * self.moe_intermediate_size + h * self.num_experts + shared

    def num_params(self, active: bool = False) -> int:
        h, layers = self.hidden_size, self.num_hidden_layers
        q, kv = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        attn = h * (q + 2 * kv) + q * h + 2 * h
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return layers * attn + sum(self.mlp_params(i, active) for i in range(layers)) + embed + h

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> ModelArch:
        model_type = cfg.get("model_type", "llama")
        if cfg.get("mlp_bias"):
            raise ValueError("mlp_bias: MLP projections with bias are not supported")
        heads = cfg["num_attention_heads"]
        rope = dict(cfg.get("rope_parameters") or {})          # transformers >= 5
        rope_theta = rope.pop("rope_theta", None) or cfg.get("rope_theta", 10000.0)
        scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        if scaling is not None:
            scaling = dict(scaling)
            kind = scaling.get("rope_type", scaling.get("type", "default"))
            if kind not in ("default", "linear", "llama3"):
                raise ValueError(f"rope_scaling: type {kind!r} is not supported (default, linear, llama3)")
            scaling["rope_type"] = kind
        sliding = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
        moe: dict[str, Any] = {}
        if model_type == "mixtral":
            moe = dict(num_experts=cfg.get("num_local_experts", 0),
                       num_experts_per_tok=cfg.get("num_experts_per_tok", 0),
                       moe_intermediate_size=cfg["intermediate_size"], norm_topk_prob=True)
        elif model_type == "qwen2_moe":
            moe = dict(num_experts=cfg.get("num_experts", 0), num_experts_per_tok=cfg.get("num_experts_per_tok", 0),
                       moe_intermediate_size=cfg.get("moe_intermediate_size", 0),
                       norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
                       shared_expert_intermediate_size=cfg.get("shared_expert_intermediate_size", 0),
                       decoder_sparse_step=cfg.get("decoder_sparse_step", 1),
                       mlp_only_layers=tuple(cfg.get("mlp_only_layers") or ()))
        bias = cfg.get("attention_bias", cfg.get("qkv_bias", model_type in ("qwen2", "qwen2_moe")))
        return cls(
            model_type=model_type,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            rope_scaling=scaling,
            attention_bias=bool(bias),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=cfg.get("eos_token_id"),
            sliding_window=sliding,
            **moe,
        )
