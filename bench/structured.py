"""Structured outputs against unconstrained decoding, same engine, same run (issue 31's targets):
output tokens/s with a JSON schema >= 95% of unconstrained at batch 1 and at 16 concurrent, and
grammar compile time <= 50 ms P99 over the bench's schemas.

Throughput: the same prompts and max_tokens, greedy; unconstrained rows run to max_tokens
(ignore_eos), constrained rows to the end of their JSON (a schema whose array of objects is long
enough to take most of max_tokens); tokens/s = output tokens / wall, median of --reps. Compile:
each schema on a fresh backend (no cache), then again (the cache).

Validity: every schema of the bench, at temperature 0 and 1, a batch of --batches' largest size
each, checked with jsonschema; every constrained output of the throughput rows is checked too.

    python -m bench.structured [--model qwen2.5-coder-0.5b] [--reps 3] [--max-tokens 96]
    python -m bench.structured --device cuda --model random:qwen2.5-0.5b --tokenizer DIR \
        --batches 1 16 64 --out bench/results/structured_gpu.json

A random-weight model with the real tokenizer (the GPU machine has no model files) writes
nonsense, but inside the grammar: the mask's cost and the outputs' validity are what it measures.
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
    rates, tokens, invalid = [], 0, 0
    llm.generate(prompts, params, use_tqdm=False)                      # warm: prefix cache, grammar cache
    for _ in range(reps):
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t0
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        rates.append(tokens / wall)
        if constrained:
            invalid += sum(not _valid(o.outputs[0].text, LONG) for o in outs if o.outputs[0].finish_reason == "stop")
    return {"tok_s": statistics.median(rates), "output_tokens": tokens, **({"invalid": invalid} if constrained else {})}


def _valid(text: str, schema: dict) -> bool:
    import json

    import jsonschema
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def validity(llm, batch: int, max_tokens: int) -> dict:
    """Each schema at temperature 0 and 1, `batch` prompts at a time: outputs that ended (stop)
    and match their schema, of those that ended; a cut one (length) is counted apart."""
    from inference import SamplingParams
    from inference.sampling_params import StructuredOutputsParams
    out = {}
    for name, schema in SCHEMAS.items():
        for temperature in (0.0, 1.0):
            params = SamplingParams(max_tokens=4 * max_tokens, temperature=temperature, seed=7,
                                    structured_outputs=StructuredOutputsParams(json=schema))
            prompts = [f"Reply with a JSON {name.replace('_', ' ')} for customer {i}." for i in range(batch)]
            done = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
            ended = [o for o in done if o.finish_reason == "stop"]
            bad = [o.text for o in ended if not _valid(o.text, schema)]
            out[f"{name}@{temperature:g}"] = {"ended": len(ended), "cut": len(done) - len(ended),
                                              "valid": len(ended) - len(bad), "invalid_examples": bad[:3]}
    return out


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
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokenizer", default=None, help="a tokenizer directory (for a random: model)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--out", default=result_path("structured.json"))
    args = ap.parse_args(argv)
    from inference import LLM
    llm = LLM(args.model, max_model_len=2048, device=args.device, tokenizer=args.tokenizer)
    compiled = compile_times(llm)
    valid = validity(llm, max(args.batches), args.max_tokens)
    base = "List the 8 items of order {} as JSON with sku, qty and note."
    rows = {}
    for batch in args.batches:
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
    ended = sum(v["ended"] for v in valid.values())
    good = sum(v["valid"] for v in valid.values())
    print(f"valid: {good} of {ended} ended outputs over {len(valid)} schema x temperature cells "
          f"({sum(v['cut'] for v in valid.values())} cut by max_tokens); throughput rows' invalid: "
          f"{sum(r['json_schema']['invalid'] for r in rows.values())} (target: all valid)")
    device = args.device
    if device.startswith("cuda"):
        import torch
        device = torch.cuda.get_device_name()
    write_result(args.out, {"model": args.model, "commit": git_commit(), "cpu": cpu_model(), "cpus": os.cpu_count(),
                            "device": device, "max_tokens": args.max_tokens, "rows": rows, "compile": compiled,
                            "validity": valid})
    return 0


if __name__ == "__main__":
    sys.exit(main())
