"""Structured outputs against unconstrained decoding, same engine, same run (issue 31's targets):
output tokens/s with a JSON schema >= 95% of unconstrained at batch 1 and at 16 concurrent, and
grammar compile time <= 50 ms P99 over the bench's schemas.

Throughput: the same prompts and max_tokens, greedy; unconstrained rows run to max_tokens
(ignore_eos), constrained rows to the end of their JSON (a schema whose array of objects is long
enough to take most of max_tokens); tokens/s = output tokens / wall, median of --reps. Compile:
each schema on a fresh backend (no cache), then again (the cache).

    python -m bench.structured [--model qwen2.5-coder-0.5b] [--reps 3] [--max-tokens 96]

Prints a table, writes bench/results/structured.json.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from bench.harness import cpu_model, git_commit, nearest_rank, result_path, write_result

ITEM = {"type": "object", "properties": {"sku": {"type": "string", "maxLength": 10},
                                         "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                                         "note": {"anyOf": [{"type": "string", "maxLength": 24}, {"type": "null"}]}},
        "required": ["sku", "qty", "note"], "additionalProperties": False}
LONG = {"type": "object", "properties": {"items": {"type": "array", "items": ITEM, "minItems": 8, "maxItems": 8}},
        "required": ["items"], "additionalProperties": False}
SCHEMAS = {
    "order_items": LONG,
    "person": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
               "required": ["name", "age"]},
    "status": {"type": "object", "properties": {"order_id": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{4}$"},
                                                "status": {"enum": ["pending", "shipped", "delivered"]}},
               "required": ["order_id", "status"]},
    "address": {"type": "object", "properties": {
        "street": {"type": "string"}, "city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
        "country": {"enum": ["US", "CA", "GB", "DE", "FR"]}, "lines": {"type": "array", "items": {"type": "string"},
                                                                      "maxItems": 3}},
        "required": ["street", "city", "zip", "country"]},
    "tool_call": {"type": "object", "properties": {
        "name": {"enum": ["get_order_status", "change_shipping_address", "start_return"]},
        "arguments": {"type": "object", "properties": {"order_id": {"type": "string"},
                                                       "items": {"type": "array", "items": {"type": "string"}}},
                      "required": ["order_id"]}}, "required": ["name", "arguments"]},
    "nested_optional": {"type": "object", "properties": {
        "a": {"type": "object", "properties": {"b": {"type": "object", "properties": {"c": {"type": "number"}}}}},
        "d": {"type": ["string", "null"]}, "e": {"type": "boolean"}}},
}


def throughput(llm, prompts: list[str], constrained: bool, max_tokens: int, reps: int) -> dict:
    from inference import SamplingParams
    from inference.sampling_params import StructuredOutputsParams
    spec = StructuredOutputsParams(json=LONG) if constrained else None
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=not constrained,
                            structured_outputs=spec)
    rates, tokens = [], 0
    llm.generate(prompts, params, use_tqdm=False)                      # warm: prefix cache, grammar cache
    for _ in range(reps):
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t0
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        rates.append(tokens / wall)
    return {"tok_s": statistics.median(rates), "output_tokens": tokens}


def compile_times(llm) -> dict:
    from inference.sampling_params import StructuredOutputsParams
    backend = llm.engine.new_grammar_backend()           # its own cache: every first compile is cold
    cold, warm = {}, {}
    for name, schema in SCHEMAS.items():
        spec = StructuredOutputsParams(json=schema)
        t0 = time.perf_counter()
        backend.compile(spec)
        cold[name] = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        backend.compile(spec)
        warm[name] = (time.perf_counter() - t0) * 1e3
    return {"cold_ms": cold, "cached_ms": warm, "cold_p99_ms": nearest_rank(list(cold.values()), 0.99)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", default=result_path("structured.json"))
    args = ap.parse_args(argv)
    from inference import LLM
    llm = LLM(args.model, max_model_len=2048)
    compiled = compile_times(llm)
    base = "List the 8 items of order {} as JSON with sku, qty and note."
    rows = {}
    for batch in (1, 16):
        prompts = [base.format(1000 + i) for i in range(batch)]
        free = throughput(llm, prompts, False, args.max_tokens, args.reps)
        json_ = throughput(llm, prompts, True, args.max_tokens, args.reps)
        rows[batch] = {"unconstrained": free, "json_schema": json_, "ratio": json_["tok_s"] / free["tok_s"]}
    print(f"\nStructured outputs, {args.model}, {os.cpu_count()} CPUs, {cpu_model()}")
    print(f"{'batch':>5} {'free tok/s':>11} {'schema tok/s':>13} {'ratio':>6}  (target >= 0.95)")
    for batch, r in rows.items():
        print(f"{batch:>5} {r['unconstrained']['tok_s']:11.1f} {r['json_schema']['tok_s']:13.1f} {r['ratio']:6.2f}")
    print("compile ms (cold / cached): " + ", ".join(
        f"{k} {v:.1f} / {compiled['cached_ms'][k]:.2f}" for k, v in compiled["cold_ms"].items()))
    print(f"compile P99 {compiled['cold_p99_ms']:.1f} ms (target <= 50)")
    write_result(args.out, {"model": args.model, "commit": git_commit(), "cpu": cpu_model(), "cpus": os.cpu_count(),
                            "max_tokens": args.max_tokens, "rows": rows, "compile": compiled})
    return 0


if __name__ == "__main__":
    sys.exit(main())
