"""`python -m inference quantize`: load a model in fp32, calibrate (GPTQ / AWQ) on the stdlib
corpus, quantize, and write an HF-format GPTQ or AWQ checkpoint that `LLM(model=DIR)` loads."""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from inference.config import ModelConfig
from inference.loader.model_loader import load_model, resolve_model_dir
from inference.loader.presets import preset_config
from inference.quantization.calibration import stdlib_windows
from inference.quantization.checkpoint import save_quantized
from inference.quantization.config import QuantConfig
from inference.quantization.transform import quantize_model

SAVE_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def quantize_to_dir(model: str, method: str, bits: int, group_size: int, out: str | Path, symmetric: bool = False,
                    num_windows: int = 32, seq_len: int = 512, device: str = "cpu", save_dtype: str = "float16",
                    progress: bool = True, act_order: bool = False, awq_scales: bool = False,
                    tune_epochs: int = 0) -> dict:
    """Returns a summary: bytes before and after, seconds, the output directory."""
    cfg = QuantConfig(method, bits, group_size, symmetric, act_order, awq_scales, tune_epochs)   # bad values: fail here
    if save_dtype not in SAVE_DTYPES:
        raise ValueError(f"save dtype: must be one of {sorted(SAVE_DTYPES)}, got {save_dtype!r}")
    if method != "rtn" and device != "cpu":
        raise ValueError(f"--method {method}: calibration runs the model's PyTorch layers, on the CPU for now "
                         "(--device cpu)")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out {out} exists and is not empty")
    model_dir = resolve_model_dir(model)
    hf_config = json.loads((model_dir / "config.json").read_text()) if model_dir else \
        preset_config(model.removeprefix("random:"))
    if hf_config.get("quantization_config"):
        raise ValueError(f"{model!r} is already quantized ({hf_config['quantization_config'].get('quant_method')})")
    t0 = time.perf_counter()
    loaded = load_model(ModelConfig(model=model, dtype="float32", device=device), fold_norms=False)
    windows = None if method == "rtn" else stdlib_windows(loaded.tokenizer, "calib", num_windows, seq_len)
    summary = quantize_model(loaded.model, cfg, windows, progress=progress)
    save_quantized(loaded.model, cfg, out, hf_config, model_dir, SAVE_DTYPES[save_dtype])
    summary.update(out=str(out), seconds=time.perf_counter() - t0, config=cfg.to_hf())
    return summary
