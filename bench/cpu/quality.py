"""Quality of quantized weights on real weights (SmolLM2-135M, CPU): perplexity on held-out text,
KL divergence of next-token distributions and top-1 agreement against the unquantized model.

The text is the running Python's standard library source (inference/quantization/calibration.py:
even-indexed modules calibrate GPTQ / AWQ, odd-indexed ones are evaluated), so anyone with the
same Python reproduces the windows exactly. The unquantized peer is the same model in fp32.

    python -m bench.cpu.quality [--windows 16] [--calib 32] [--seq-len 512] [--out bench/results/quality.json]
                            [--variants "a,b"] [--update]   (--update: replace only those rows of --out)
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from bench.harness import git_commit, result_path, write_result
from inference.config import ModelConfig
from inference.loader.model_loader import load_model
from inference.models.norm_folding import fold_norm_weights
from inference.quantization.calibration import forward_logits, stdlib_windows
from inference.quantization.config import QuantConfig
from inference.quantization.fp8 import fp8_quantize_model
from inference.quantization.sparsity import sparsify_model
from inference.quantization.transform import quantize_model

VARIANTS = {                                     # name -> QuantConfig
    "int8 rtn per-channel": QuantConfig("rtn", 8, -1, True),
    "int4 rtn g128": QuantConfig("rtn", 4, 128),
    "int4 awq g128": QuantConfig("awq", 4, 128),
    "int4 gptq g128": QuantConfig("gptq", 4, 128),
    "int4 gptq g128 act-order": QuantConfig("gptq", 4, 128, act_order=True),
    "int4 awq+gptq g128 act-order": QuantConfig("gptq", 4, 128, act_order=True, awq_scales=True),
    # + one epoch of end-to-end scale tuning against the fp32 model (scale_tuning.py)
    "int4 awq+gptq g128 act-order +tuned": QuantConfig("gptq", 4, 128, act_order=True, awq_scales=True,
                                                       tune_epochs=1),
    "int4 rtn g32": QuantConfig("rtn", 4, 32),
    "int4 awq g32": QuantConfig("awq", 4, 32),
    "int4 gptq g32 act-order": QuantConfig("gptq", 4, 32, act_order=True),
    "int4 awq+gptq g32 act-order": QuantConfig("gptq", 4, 32, act_order=True, awq_scales=True),
    "fp8 w8a8 e4m3": "fp8",                      # inference/quantization/fp8.py
    "2:4 sparse magnitude": "sparse24",          # inference/quantization/sparsity.py (experimental)
    "2:4 sparse wanda": "sparse24-wanda",        # scores |w| * ||x|| over the calibration windows
}
KV_VARIANTS = {"fp8_e4m3 KV cache": torch.float8_e4m3fn,    # unquantized weights, quantized KV
               "int8 KV cache": torch.int8}                  # per (token, head) scales
TARGETS = {"int8_delta_ppl_pct": 0.5, "int4_calibrated_delta_ppl_pct": 5.0}   # the issue's; none for KV


def evaluate(model, windows: list[list[int]], ref: list[torch.Tensor] | None,
             kv_dtype: torch.dtype | None = None) -> tuple[dict, list[torch.Tensor]]:
    nll, n, kl, agree, logps = 0.0, 0, 0.0, 0.0, []
    for i, w in enumerate(windows):
        lp = forward_logits(model, w, kv_dtype).log_softmax(-1)             # [T, V]
        nll -= float(lp[:-1].gather(1, torch.tensor(w[1:])[:, None]).sum())
        n += len(w) - 1
        logps.append(lp)
        if ref is not None:
            r = ref[i]
            kl += float((r.exp() * (r - lp)).sum(-1).mean())
            agree += float((r.argmax(-1) == lp.argmax(-1)).float().mean())
    out = {"ppl": float(torch.tensor(nll / n).exp())}
    if ref is not None:
        out.update(kl=kl / len(windows), top1_agreement=agree / len(windows))
    return out, logps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--windows", type=int, default=16, help="held-out evaluation windows")
    ap.add_argument("--calib", type=int, default=32, help="calibration windows (gptq / awq)")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--variants", default=",".join(list(VARIANTS) + list(KV_VARIANTS)))
    ap.add_argument("--out", default=result_path("quality.json"))
    ap.add_argument("--update", action="store_true",
                    help="add / replace the measured variants' rows in the existing --out table (same "
                         "model, windows and sequence length) instead of writing a new one")
    args = ap.parse_args()
    if args.update and not Path(args.out).exists():
        raise SystemExit(f"--update: {args.out} does not exist (run without --update first)")
    old = json.loads(Path(args.out).read_text()) if args.update else None
    here = (args.model, args.windows, args.calib, args.seq_len, torch.__version__, platform.python_version())
    if old and (old["model"], old["windows"], old["calib_windows"], old["seq_len"], old["torch"],
                old.get("python", here[-1])) != here:
        raise SystemExit(f"--update: {args.out} measured {old['model']} at {old['windows']} / {old['calib_windows']} "
                         f"windows of {old['seq_len']} (torch {old['torch']}, Python {old.get('python')}); "
                         f"this run ({here}) would not be comparable")
    torch.manual_seed(0)
    base = load_model(ModelConfig(model=args.model, dtype="float32"))
    evals = stdlib_windows(base.tokenizer, "eval", args.windows, args.seq_len)
    calib = stdlib_windows(base.tokenizer, "calib", args.calib, args.seq_len)
    ref_metrics, ref = evaluate(base.model, evals, None)
    if old and abs(old["results"]["fp32 (peer)"]["ppl"] / ref_metrics["ppl"] - 1) > 1e-6:
        raise SystemExit(f"--update: the fp32 peer measures {ref_metrics['ppl']:.6f} here, "
                         f"{old['results']['fp32 (peer)']['ppl']:.6f} in {args.out}: the old rows are not comparable")
    linear_bytes = sum(p.numel() * 2 for n, p in base.model.named_parameters() if "layers." in n and "proj" in n)
    rows = {"fp32 (peer)": {**ref_metrics, "delta_ppl_pct": 0.0, "kl": 0.0, "top1_agreement": 1.0,
                            "linear_bytes_vs_bf16": 1.0, "quantize_s": 0.0}}
    print(f"fp32: ppl {ref_metrics['ppl']:.3f} on {args.windows} x {args.seq_len} held-out stdlib tokens", flush=True)
    for name in args.variants.split(","):
        if name in KV_VARIANTS:
            t0 = time.perf_counter()
            m, _ = evaluate(base.model, evals, ref, KV_VARIANTS[name])
            head_dim = base.arch.head_dim
            kv_bytes = 0.5 if KV_VARIANTS[name] == torch.float8_e4m3fn else (head_dim + 4) / (2 * head_dim)
            m.update(delta_ppl_pct=100 * (m["ppl"] / ref_metrics["ppl"] - 1), quantize_s=0.0, linear_bytes_vs_bf16=1.0,
                     kv_bytes_vs_bf16=kv_bytes)
            rows[name] = m
            print(f"{name}: ppl {m['ppl']:.3f} ({m['delta_ppl_pct']:+.2f}%), KL {m['kl']:.4f}, top-1 "
                  f"{m['top1_agreement']:.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
            continue
        fold = name.endswith(" +fold")          # the norm weights folded into the linears first, as a
        cfg = VARIANTS[name.removesuffix(" +fold")]    # CUDA load does for the fused batch-1 layers
        lm = load_model(ModelConfig(model=args.model, dtype="float32"))
        if fold:
            fold_norm_weights(lm.model)
        t0 = time.perf_counter()
        if cfg == "fp8":
            info = fp8_quantize_model(lm.model)
        elif isinstance(cfg, str) and cfg.startswith("sparse24"):
            info = sparsify_model(lm.model, calib if cfg.endswith("wanda") else None)
        else:
            info = quantize_model(lm.model, cfg, None if cfg.method == "rtn" else calib, progress=False)
        seconds = time.perf_counter() - t0
        m, _ = evaluate(lm.model, evals, ref)
        m.update(delta_ppl_pct=100 * (m["ppl"] / ref_metrics["ppl"] - 1), quantize_s=seconds,
                 linear_bytes_vs_bf16=info["linear_bytes_after"] / linear_bytes,
                 config=cfg if isinstance(cfg, str) else cfg.to_hf())
        rows[name] = m
        print(f"{name}: ppl {m['ppl']:.3f} ({m['delta_ppl_pct']:+.2f}%), KL {m['kl']:.4f}, top-1 "
              f"{m['top1_agreement']:.3f} ({seconds:.0f} s)", flush=True)
    commits = {name: git_commit() for name in rows}
    if old:                                      # the other rows keep their figures and commits
        commits = {**old.get("row_commits", {n: old["commit"] for n in old["results"]}), **commits}
        rows = {**old["results"], **rows}
    res = {"model": args.model, "commit": git_commit(), "row_commits": commits, "python": platform.python_version(),
           "torch": torch.__version__, "windows": args.windows, "calib_windows": args.calib, "seq_len": args.seq_len,
           "targets": TARGETS, "results": rows,
           "note": "SmolLM2's only shipped weights are a Q4_1 GGUF (4-bit, group 32, float min): the fp32 "
                   "peer is that model dequantized, so every 4-bit variant re-quantizes 4-bit weights onto "
                   "another grid (integer zero points, other groups)"}
    write_result(args.out, res)
    print(f"\n{'variant':<38} {'ppl':>8} {'d ppl':>8} {'KL':>8} {'top-1':>7} {'bytes':>6}")
    for name, m in rows.items():
        print(f"{name:<38} {m['ppl']:>8.3f} {m['delta_ppl_pct']:>+7.2f}% {m['kl']:>8.4f} {m['top1_agreement']:>7.3f} "
              f"{m['linear_bytes_vs_bf16']:>6.3f}")


if __name__ == "__main__":
    main()
