"""What a quantized model is: method, bits, group size, symmetry. Validated before any weight is
touched, and mapped to and from the `quantization_config` of a Hugging Face checkpoint.

    method  bits  groups              zero point   calibration   on disk (HF format)
    rtn     4/8   128 (4) / channel   4: yes       none          GPTQ layout (`quant_method: gptq`)
    gptq    4/8   128 (4) / channel   4: yes       GPTQ          GPTQ layout (act-order: static groups)
                                                   (+ AWQ scales folded first, `awq_scales`)
    gptq and awq may then tune their scales end to end (`tune_epochs`, scale_tuning.py): same format.
    awq     4     128                 yes          AWQ scales    AWQ GEMM layout (`quant_method: awq`)

`LLM(quantization=...)` also takes the shorthands "int8" (rtn, 8 bits, per output channel,
symmetric) and "int4" (rtn, 4 bits, group 128, asymmetric), "fp8" (fp8.py: e4m3 weights and
activations, not an integer format) and the experimental "sparse24" (sparsity.py: 2:4 pruning).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

METHODS = ("rtn", "gptq", "awq")
SHORTHANDS = ("int8", "int4")


@dataclass(frozen=True)
class QuantConfig:
    method: str = "rtn"
    bits: int = 4
    group_size: int = 128            # -1: one group per output channel (the whole input row)
    symmetric: bool = False          # no zero point (int8 default); 4-bit defaults to asymmetric
    act_order: bool = False          # gptq: columns by decreasing activation energy, static groups
    awq_scales: bool = False         # gptq: fold AWQ's scales into the layer first, then GPTQ
    tune_epochs: int = 0             # gptq / awq: epochs of end-to-end scale tuning (scale_tuning.py)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"quantization method: must be one of {METHODS}, got {self.method!r}")
        if self.bits not in (4, 8):
            raise ValueError(f"quantization bits: must be 4 or 8, got {self.bits!r}")
        if self.method == "awq" and self.bits != 4:
            raise ValueError(f"quantization: awq is a 4-bit method, got bits={self.bits}")
        # >= 32: a 4-bit K tile of the GPU kernel feeds tl.dot half its columns, and that needs 16
        if self.group_size != -1 and (self.group_size < 32 or self.group_size & (self.group_size - 1)):
            raise ValueError(f"quantization group_size: must be -1 (per channel) or a power of two >= 32, "
                             f"got {self.group_size!r}")
        if (self.act_order or self.awq_scales) and self.method != "gptq":
            raise ValueError(f"quantization: act_order and awq_scales are gptq options, got method={self.method!r}")
        if self.awq_scales and (self.bits != 4 or self.symmetric):
            raise ValueError("quantization: awq_scales searches 4-bit asymmetric groups (bits=4, symmetric=False)")
        if type(self.tune_epochs) is not int or self.tune_epochs < 0:
            raise ValueError(f"quantization tune_epochs: must be an integer >= 0, got {self.tune_epochs!r}")
        if self.tune_epochs and self.method == "rtn":
            raise ValueError("quantization: scale tuning (tune_epochs) needs calibration windows: method gptq or awq, "
                             "not rtn")
        if self.method == "awq" and self.symmetric:
            raise ValueError("quantization: awq stores a zero point per group (symmetric=False)")

    @property
    def qmax(self) -> int:
        return (1 << self.bits) - 1

    def groups(self, in_features: int) -> int:
        """Groups per output row. The last one may be shorter (SmolLM2's 576 features at group
        128: 4 groups of 128 and one of 64), as GPTQ's g_idx = i // group_size allows."""
        return 1 if self.group_size == -1 else -(-in_features // self.group_size)

    def group_len(self, in_features: int) -> int:
        return in_features if self.group_size == -1 else self.group_size

    @classmethod
    def from_engine_arg(cls, name: str) -> QuantConfig:
        """LLM(quantization=...) for on-the-fly quantization (no calibration data)."""
        if name == "int8":
            return cls("rtn", 8, -1, True)
        if name == "int4":
            return cls("rtn", 4, 128, False)
        raise ValueError(f"quantization={name!r} quantizes no weights on load; it names a checkpoint format "
                         f"(use `python -m inference quantize --method {name}` to make one), or one of {SHORTHANDS}")

    def to_hf(self) -> dict[str, Any]:
        tuned = {"scale_tuning_epochs": self.tune_epochs} if self.tune_epochs else {}   # a record only
        if self.method == "awq":
            return {"quant_method": "awq", "bits": 4, "group_size": self.group_size, "zero_point": True,
                    "version": "gemm", **tuned}
        # act-order with static groups: g_idx stays i // group_size, the layout every GPTQ loader reads
        return {**tuned, "quant_method": "gptq", "bits": self.bits, "group_size": self.group_size,
                "desc_act": self.act_order, "static_groups": self.act_order, "sym": self.symmetric,
                "checkpoint_format": "gptq", "true_sequential": False,
                "quantizer": "inference-awq-gptq" if self.awq_scales else f"inference-{self.method}"}

    @classmethod
    def from_hf(cls, qc: dict[str, Any]) -> QuantConfig:
        """From a checkpoint's quantization_config; a clear error for what this engine cannot load."""
        method = qc.get("quant_method")
        bits, group = qc.get("bits"), qc.get("group_size", 128)
        tuned = qc.get("scale_tuning_epochs", 0)
        if type(tuned) is not int or tuned < 0:
            raise ValueError(f"quantization_config: scale_tuning_epochs must be an integer >= 0, got {tuned!r}")
        if method == "awq":
            if qc.get("version", "gemm").lower() != "gemm":
                raise ValueError(f"quantization_config: AWQ version {qc.get('version')!r} is not supported "
                                 "(only the GEMM layout)")
            if not qc.get("zero_point", True):
                raise ValueError("quantization_config: AWQ without zero points is not supported")
            return cls("awq", bits, group, False, tune_epochs=tuned)
        if method == "gptq":
            # act-order is fine with static groups (g_idx = i // group_size, which the loader checks);
            # without them g_idx is a permutation the kernels do not follow
            if qc.get("desc_act") and not qc.get("static_groups"):
                raise ValueError("quantization_config: GPTQ with desc_act (act-order) is not supported "
                                 "without static_groups")
            if qc.get("checkpoint_format", "gptq") != "gptq":
                raise ValueError(f"quantization_config: GPTQ checkpoint_format {qc.get('checkpoint_format')!r} "
                                 "is not supported (only 'gptq')")
            made_here = str(qc.get("quantizer", "")).removeprefix("inference-")
            if made_here == "rtn":
                return cls("rtn", bits, group, bool(qc.get("sym", True)))
            return cls("gptq", bits, group, bool(qc.get("sym", True)), act_order=bool(qc.get("desc_act")),
                       awq_scales=made_here == "awq-gptq", tune_epochs=tuned)
        raise ValueError(f"quantization_config: quant_method {method!r} is not supported; "
                         "checkpoints in GPTQ or AWQ format are")
