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

    .venv/bin/python -m bench.cpu.gguf_agreement [--model qwen2.5-coder-0.5b] [--windows 2] [--seq-len 512]
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import time

import torch

from bench.harness import cpu_model, git_commit, result_path, write_result
from configs import shipped
from inference.config import ModelConfig
from inference.loader.model_loader import load_model
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


def compare(test, ref, windows: list[list[int]]) -> dict:
    agree = total = 0
    kl_sum = 0.0
    for ids in windows:
        a = forward_logits(test.model, ids)[:-1]
        b = forward_logits(ref.model, ids)[:-1]
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        total += a.shape[0]
        kl_sum += float(torch.nn.functional.kl_div(a.log_softmax(-1), b.log_softmax(-1), log_target=True,
                                                   reduction="sum"))
    return {"positions": total, "top1_agreement": agree / total, "mean_kl": kl_sum / total}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--windows", type=int, default=2, help="windows of code and of chat each")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--out", default=result_path("gguf_agreement.json"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    ref = load_model(ModelConfig(model=args.model, dtype="float32"))
    tok = ref.tokenizer
    texts = {"code": stdlib_windows(tok, "eval", args.windows, args.seq_len),
             "chat": chat_windows(tok, args.windows, args.seq_len)}
    results = {}
    # the engine on the codes, and the peer floor: the same dequantized weights in plain bf16
    for variant, codes in (("ours: codes, int8 activations", "1"), ("bf16 dequantized weights", "0")):
        os.environ["INFERENCE_GGUF_CODES"] = codes
        test = load_model(ModelConfig(model=args.model, dtype="bfloat16"))
        rows = {name: compare(test, ref, windows) for name, windows in texts.items()}
        n = sum(r["positions"] for r in rows.values())
        rows["all"] = {"positions": n,
                       "top1_agreement": sum(r["top1_agreement"] * r["positions"] for r in rows.values()) / n,
                       "mean_kl": sum(r["mean_kl"] * r["positions"] for r in rows.values()) / n}
        linears = sorted({type(m).__name__ for m in test.model.modules() if "Linear" in type(m).__name__})
        results[variant] = {"linears": linears, "rows": rows}
        del test
    os.environ.pop("INFERENCE_GGUF_CODES")
    print(f"{args.model} against its fp32 dequantized weights, teacher-forced, {cpu_model()}")
    print("| variant | text | positions | top-1 agreement | mean KL |")
    print("|---|---|---|---|---|")
    for variant, res in results.items():
        for name, r in res["rows"].items():
            print(f"| {variant} | {name} | {r['positions']} | {r['top1_agreement']:.4f} | {r['mean_kl']:.5f} |")
    write_result(args.out, {"bench": "gguf_agreement", "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                            "commit": git_commit(), "cpu": cpu_model(), "model": args.model, "seq_len": args.seq_len,
                            "variants": results, "seconds": round(time.perf_counter() - t0, 1)})


if __name__ == "__main__":
    main()
