"""Teacher-forced agreement of a GGUF model run on its own codes (bf16 activations, the engine's
CPU kernels) with the fp32 model on the same file's dequantized values, over code and chat text.

At every position of each window, both models see the same tokens; we count how often their
next-token argmax agrees (top-1 agreement), and the KL divergence of their distributions. The
reference is exact: the fp32 weights are the file's dequantized values (transformers' GGUF loader,
bit-exact with ours, tests/inference/loader/test_gguf_codes.py), so the figure measures the
engine's arithmetic (int8 activations, bf16 storage), not the file's quantization.

Text: the Python standard library's held-out modules (code) and the shipped help-centre articles
rendered as chat turns through the model's own template (chat), `--windows` of each, `--seq-len`
tokens long.

The peer: llama.cpp (built for this CPU's best ISA level, or `--peer-levels`) on the same file,
the same windows and the same fp32 reference, through `llama-perplexity --kl-divergence`
(bench/cpu/llamacpp_kld.py). It scores the second half of each window only, so every variant is
also reported on those positions.

    .venv/bin/python -m bench.cpu.gguf_agreement [--model qwen2.5-coder-0.5b] [--windows 2] [--seq-len 512]
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import time

import torch

from bench.cpu.llamacpp_kld import llamacpp_agreement, second_half
from bench.harness import cpu_model, git_commit, result_path, write_result
from configs import shipped
from inference.config import ModelConfig
from inference.kernels.cpu_ops import supported_isa_levels
from inference.loader.model_loader import gguf_source, load_model
from inference.quantization.calibration import forward_logits, stdlib_windows


def chat_windows(tokenizer, count: int, seq_len: int) -> list[list[int]]:
    """Help-centre articles as a question (the title) and an answer (the body), templated."""
    windows = []
    for path in sorted(shipped("kb").glob("*.md")):
        text = path.read_text()
        title, _, body = text.partition("\n")
        messages = [{"role": "user", "content": title.lstrip("# ").strip() + "?"},
                    {"role": "assistant", "content": body.strip()}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=False)
        if len(ids) >= seq_len:
            windows.append(ids[:seq_len])
        if len(windows) == count:
            return windows
    if not windows:
        raise SystemExit(f"no help-centre article is {seq_len} tokens long; pass a smaller --seq-len")
    return windows


def _agreement(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int, float]:
    """(agreeing positions, positions, KL sum) of test logits a against reference logits b."""
    kl = torch.nn.functional.kl_div(a.log_softmax(-1), b.log_softmax(-1), log_target=True, reduction="sum")
    return int((a.argmax(-1) == b.argmax(-1)).sum()), a.shape[0], float(kl)


def compare(test, windows: list[list[int]], ref_logits: list[torch.Tensor]) -> dict:
    """Every position, and the second half of each window alone (the positions llama.cpp scores)."""
    sums = {"all": [0, 0, 0.0], "second_half": [0, 0, 0.0]}
    for ids, b in zip(windows, ref_logits):
        a = forward_logits(test.model, ids)
        for part, (x, y) in (("all", (a[:-1], b[:-1])), ("second_half", (second_half(a), second_half(b)))):
            sums[part] = [s + v for s, v in zip(sums[part], _agreement(x, y))]
    (agree, total, kl), (agree2, total2, kl2) = sums["all"], sums["second_half"]
    return {"positions": total, "top1_agreement": agree / total, "mean_kl": kl / total,
            "second_half": {"positions": total2, "top1_agreement": agree2 / total2, "mean_kl": kl2 / total2}}


def _pooled(rows: dict) -> dict:
    """The rows of each text pooled by their positions."""
    n = sum(r["positions"] for r in rows.values())
    out = {"positions": n}
    for key in ("top1_agreement", "mean_kl"):
        out[key] = sum(r[key] * r["positions"] for r in rows.values()) / n
    if all("second_half" in r for r in rows.values()):
        out["second_half"] = _pooled({k: r["second_half"] for k, r in rows.items()})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--windows", type=int, default=2, help="windows of code and of chat each")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--out", default=result_path("gguf_agreement.json"))
    ap.add_argument("--peer-levels", default=None,
                    help="llama.cpp builds to score too (default: this CPU's best level; 'none' to skip)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    ref = load_model(ModelConfig(model=args.model, dtype="float32"))
    tok = ref.tokenizer
    texts = {"code": stdlib_windows(tok, "eval", args.windows, args.seq_len),
             "chat": chat_windows(tok, args.windows, args.seq_len)}
    ref_logits = {name: [forward_logits(ref.model, ids) for ids in windows] for name, windows in texts.items()}
    del ref
    results = {}
    # the engine on the codes, and the peer floor: the same dequantized weights in plain bf16
    for variant, codes in (("ours: codes, int8 activations", "1"), ("bf16 dequantized weights", "0")):
        os.environ["INFERENCE_GGUF_CODES"] = codes
        test = load_model(ModelConfig(model=args.model, dtype="bfloat16"))
        rows = {name: compare(test, windows, ref_logits[name]) for name, windows in texts.items()}
        rows["all"] = _pooled(rows)
        linears = sorted({type(m).__name__ for m in test.model.modules() if "Linear" in type(m).__name__})
        results[variant] = {"linears": linears, "rows": rows}
        del test
    os.environ.pop("INFERENCE_GGUF_CODES")
    levels = supported_isa_levels()[:1] if args.peer_levels is None else \
        [lv for lv in args.peer_levels.split(",") if lv != "none"]
    for level in levels:
        rows = {name: llamacpp_agreement(gguf_source(args.model), windows, ref_logits[name], level)
                for name, windows in texts.items()}
        rows["all"] = _pooled(rows)
        results[f"llama.cpp {level}"] = {"rows": rows, "scored": "second half of each window"}
    print(f"{args.model} against its fp32 dequantized weights, teacher-forced, {cpu_model()}")
    print("| variant | text | positions | top-1 agreement | mean KL | 2nd-half positions | top-1 | mean KL |")
    print("|---|---|---|---|---|---|---|---|")
    for variant, res in results.items():
        for name, r in res["rows"].items():
            half = r.get("second_half", r)
            cells = ("", "", "") if "second_half" not in r else \
                (r["positions"], f"{r['top1_agreement']:.4f}", f"{r['mean_kl']:.5f}")
            print(f"| {variant} | {name} | {' | '.join(map(str, cells))} | {half['positions']} | "
                  f"{half['top1_agreement']:.4f} | {half['mean_kl']:.5f} |")
    write_result(args.out, {"bench": "gguf_agreement", "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                            "commit": git_commit(), "cpu": cpu_model(), "model": args.model, "seq_len": args.seq_len,
                            "variants": results, "seconds": round(time.perf_counter() - t0, 1)})


if __name__ == "__main__":
    main()
