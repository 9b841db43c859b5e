"""Attention kernel microbenchmarks, each beside its ceiling or peer: the whole of
bench/gpu/gpu_kernels.py and the `kernels` section of bench/gpu/gpu_engine.py.

  decode   paged decode attention, bs 64 x ctx 4096, d 128: achieved bandwidth vs the copy ceiling
  prefill  causal prefill attention at 4k, d 128, 32 heads (MHA and GQA-4, and GQA-4 after a cached
           3072-token prefix): TFLOP/s of every PREFILL_VARIANTS entry (the chunk's own K/V from the
           strided qkv rows, pointer loads or TMA) and PAGED_VARIANTS (everything through the block
           table), timed round-robin with torch SDPA (flash, contiguous tensors) as the peer of a
           fresh prompt; outputs poisoned with NaN first and checked against the fp32 reference.
"""
from __future__ import annotations

import torch

from bench.harness import log, rel_err, timed, timed_interleaved
from bench.workloads import paged_cache

# (label, prefill_attention keyword arguments): its defaults first, then A/B variants of them.
# Earlier leaders: journal runs 1, 11 and 27 (bench/journal/README.md finds them); the sweep that
# chose the defaults, with the lazy-rescale and grid-order variants since removed, is
# bench/journal/runs/gpu_kernels_prefill_sweep.json.
# Every one is also a GPU case of tests/inference/kernels/test_attention_kernels.py.
PREFILL_VARIANTS = [
    ("default 64x64/4w/3s", {}),
    ("chunk-major grid", {"heads_first": False}),
    ("paged loops 3s", {"paged_stages": 3}),
    ("64x64/4w/2s", {"num_stages": 2}),
    ("128x64/8w/3s", {"block_m": 128, "num_warps": 8}),
    ("tma", {"tma": True}),
]
# everything through the block table (no k_new / v_new)
PAGED_VARIANTS = [("paged default", {}), ("paged 3s", {"paged_stages": 3})]


def decode_bench(copy_bw: float, gen, sms: int) -> list[dict]:
    from inference.kernels.decode_attention import choose_num_splits, decode_attention, decode_attention_reference
    B, CTX, D, BS = 64, 4096, 128, 16
    result = []
    for h, hkv in ((32, 32), (32, 8)):
        k, v, tables = paged_cache(B, CTX, hkv, D, BS, gen)
        q = torch.randn(B, h, D, device="cuda", generator=gen, dtype=torch.bfloat16)
        lens = torch.full((B,), CTX, dtype=torch.int32, device="cuda")
        nbytes = 2 * B * CTX * hkv * D * 2 + 2 * q.numel() * 2
        ref = decode_attention_reference(q[:4], k, v, tables[:4], lens[:4], D ** -0.5)
        best = None
        for splits in sorted({1, choose_num_splits(B, hkv, CTX, sms)}):
            for block_n in (64, 128):
                for stages in (2, 3):
                    out = torch.full_like(q, float("nan"))

                    def fn():
                        decode_attention(q, k, v, tables, lens, D ** -0.5, num_splits=splits, out=out,
                                         block_n=block_n, num_warps=4, num_stages=stages)
                    try:
                        fn()
                    except Exception as e:                   # e.g. out of shared memory
                        log(f"  decode cfg {splits}/{block_n}/{stages} failed: {type(e).__name__}")
                        continue
                    err = rel_err(out[:4], ref)
                    t = timed(fn, reps=20)
                    row = {"splits": splits, "block_n": block_n, "warps": 4, "stages": stages,
                           "us": t * 1e6, "GBps": nbytes / t / 1e9, "rel_err": err}
                    if err < 2e-2 and (best is None or row["us"] < best["us"]):
                        best = row
        best.update(heads=h, kv_heads=hkv, batch=B, ctx=CTX, fraction_of_copy=best["GBps"] * 1e9 / copy_bw)
        log(f"decode attn H={h} Hkv={hkv}: best {best}")
        result.append(best)
        k = v = None
        torch.cuda.empty_cache()
    return result


def load_module(path: str):
    """A kernel module from a file (e.g. `git show HEAD:inference/kernels/prefill_attention.py > old.py`),
    to time an earlier version beside the tree's in one run."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("prefill_baseline", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def prefill_case(h: int, hkv: int, prefix: int, new: int, gen, baseline=None, shard=None) -> dict:
    """One chunk of `new` tokens after `prefix` cached ones, every variant (and the baseline
    module's default, and SDPA for a fresh prompt) timed round-robin. shard (i, n): only compile
    every n-th variant from the i-th (fills Triton's cache from parallel processes), no timing."""
    from inference.kernels.prefill_attention import prefill_attention, prefill_attention_reference
    D, BS = 128, 16
    ctx = prefix + new
    k, v, tables = paged_cache(1, ctx, hkv, D, BS, gen)
    qkv = torch.randn(new, (h + 2 * hkv) * D, device="cuda", generator=gen, dtype=torch.bfloat16)
    q = qkv[:, :h * D].view(new, h, D)                       # strided views, as in the engine
    k_new = qkv[:, h * D:(h + hkv) * D].view(new, hkv, D)
    v_new = qkv[:, (h + hkv) * D:].view(new, hkv, D)
    pos = torch.arange(prefix, ctx, device="cuda")
    slots = tables[0, pos // BS].long() * BS + pos % BS
    k.view(-1, hkv, D)[slots] = k_new                        # the cache holds the same K/V
    v.view(-1, hkv, D)[slots] = v_new
    qs = torch.tensor([0, new], dtype=torch.int32, device="cuda")
    lens = torch.tensor([ctx], dtype=torch.int32, device="cuda")
    # causal over the new rows, full over the prefix
    flops = 4 * h * D * (new * prefix + new * (new + 1) / 2)
    variants = [(label, "tma" if kw.get("tma") else "new", prefill_attention, {**kw, "k_new": k_new, "v_new": v_new})
                for label, kw in PREFILL_VARIANTS]
    variants += [(label, "paged", prefill_attention, kw) for label, kw in PAGED_VARIANTS]
    if baseline is not None:
        variants.append(("baseline 64x64/4w/3s", "baseline", baseline.prefill_attention,
                         {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 3,
                          "k_new": k_new, "v_new": v_new}))
    if shard is not None:
        for i, (label, _, attn, kw) in enumerate(variants):
            if i % shard[1] == shard[0]:
                try:
                    attn(q, k, v, tables, qs, lens, new, D ** -0.5, **kw)
                except Exception as e:                       # the timed run reports it
                    log(f"  compile {label}: {type(e).__name__}")
        torch.cuda.synchronize()
        return {}
    ref = prefill_attention_reference(q, k, v, tables, qs, lens, D ** -0.5)
    rows, fns = [], {}
    for label, mode, attn, kw in variants:
        out = torch.full_like(q, float("nan"))              # poisoned: an unwritten element shows

        def fn(attn=attn, kw=kw, out=out):
            attn(q, k, v, tables, qs, lens, new, D ** -0.5, out=out, **kw)
        try:
            fn()
        except Exception as e:                               # e.g. out of shared memory
            log(f"  prefill {label} failed: {type(e).__name__}: {str(e)[:80]}")
            continue
        err = rel_err(out, ref)
        rows.append({"label": label, "mode": mode, "ms": 0.0, "TFLOPs": 0.0, "rel_err": err,
                     **{key: val for key, val in kw.items() if key not in ("k_new", "v_new")}})
        if err < 1e-2:
            fns[label] = fn
        else:
            log(f"  WRONG result: {label} rel_err {err:.3g}")
    ref = None
    sdpa = "torch SDPA"
    if prefix == 0:
        kc = k_new.repeat_interleave(h // hkv, 1).transpose(0, 1)[None].contiguous()
        vc = v_new.repeat_interleave(h // hkv, 1).transpose(0, 1)[None].contiguous()
        qc = q.transpose(0, 1)[None].contiguous()
        fns[sdpa] = lambda: torch.nn.functional.scaled_dot_product_attention(qc, kc, vc, is_causal=True)
    t = timed_interleaved(fns)
    for r in rows:
        if r["label"] in t:
            r.update(ms=t[r["label"]] * 1e3, TFLOPs=flops / t[r["label"]] / 1e12)
    ok = [r for r in rows if r["label"] in t]
    best = {m: min((r for r in ok if r["mode"] == m), key=lambda r: r["ms"], default=None)
            for m in ("paged", "new", "tma", "baseline")}
    res = {"heads": h, "kv_heads": hkv, "prefix": prefix, "tokens": new, "GFLOP": flops / 1e9,
           "default": rows[0], **{f"best_{m}": b for m, b in best.items()}, "all": rows}
    if sdpa in t:
        res["torch_sdpa_TFLOPs"] = flops / t[sdpa] / 1e12
    return res


PREFILL_CASES = ((32, 32, 0, 4096), (32, 8, 0, 4096), (32, 8, 3072, 1024))


def prefill_bench(gen, baseline=None, shard=None) -> list[dict]:
    out = []
    for h, hkv, prefix, new in PREFILL_CASES:
        r = prefill_case(h, hkv, prefix, new, gen, baseline, shard)
        torch.cuda.empty_cache()
        if shard is not None:
            continue
        best = min((b for m, b in r.items() if m.startswith("best_") and b), key=lambda b: b["ms"])
        r.update(best)                              # flat fields of the fastest path for the summary
        log(f"prefill H={h} Hkv={hkv} prefix {prefix} + {new}: "
            + ", ".join(f"{x['label']} {x['TFLOPs']:.0f}" for x in sorted(r["all"], key=lambda x: -x["TFLOPs"]))
            + f" | SDPA {r.get('torch_sdpa_TFLOPs', float('nan')):.0f} TFLOP/s")
        out.append(r)
    return out


def kernel_bench(copy_bw: float, parts: set[str], baseline=None, shard=None) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return {"decode": decode_bench(copy_bw, gen, sms) if "decode" in parts else [],
            "prefill": prefill_bench(gen, baseline, shard) if "prefill" in parts else []}
