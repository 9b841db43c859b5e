"""GGUF -> cached safetensors directory.

transformers (with the `gguf` package) de-quantizes a GGUF file into a Llama-family model and
its tokenizer; we do that once and keep a plain safetensors copy, so later loads take seconds.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from tqdm.auto import tqdm


def cache_root() -> Path:
    return Path(os.environ.get("INFERENCE_CACHE_DIR", Path.home() / ".cache" / "support-inference"))


def converted_dir(gguf_path: Path) -> Path:
    stat = gguf_path.stat()
    key = hashlib.sha1(f"{gguf_path.resolve()}:{stat.st_size}:{int(stat.st_mtime)}".encode()).hexdigest()[:12]
    return cache_root() / "models" / f"{gguf_path.stem}-{key}"


def convert_gguf(gguf_path: Path) -> Path:
    """Return a safetensors copy of `gguf_path`, converting it on first use."""
    out = converted_dir(gguf_path)
    if (out / "config.json").exists():
        return out
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"Converting {gguf_path.name} to safetensors (first load only) ...", flush=True)
    src_dir, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    hf_model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=torch.float32)
    config = hf_model.config.to_dict()
    config.pop("quantization_config", None)
    config["torch_dtype"] = "float32"
    state = {}
    for key, tensor in tqdm(hf_model.state_dict().items(), desc="Writing safetensors", leave=False):
        if key == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue
        state[key] = tensor.detach().contiguous().clone()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".converting-"))
    try:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2, default=str))
        tokenizer.save_pretrained(str(tmp))
        try:
            os.rename(tmp, out)               # atomic: concurrent first loads both end well
        except OSError:
            if not (out / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
