"""Command line: `python -m inference chat` (streamed terminal chat), `generate` (one prompt),
`serve` (the OpenAI-compatible service) and `quantize` (write a GPTQ / AWQ checkpoint)."""
from __future__ import annotations

import argparse
import sys
import time

from inference.config import KV_CACHE_DTYPES, QUANTIZATION, EngineConfig
from inference.sampling_params import SamplingParams


def add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="alias (smollm2), random:<preset>, HF directory or .gguf file")
    p.add_argument("--config", default=None, help="engine YAML (default configs/engine.yaml)")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--block-size", type=int)
    p.add_argument("--kv-cache-memory-bytes", type=int)
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES,
                   help="fp8_e4m3: half the KV bytes; int8: per-row scales, CPU path")
    p.add_argument("--swap-space", type=float,
                   help="GiB of host memory (pinned on CUDA) that keeps prefix-cached KV blocks evicted from the "
                        "device, copied back on a hit (0 = off)")
    p.add_argument("--kv-disk-path", help="directory for the disk KV tier below the host tier")
    p.add_argument("--kv-disk-bytes", type=int, help="size of the disk KV tier in bytes (0 = off)")
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false", default=None)
    p.add_argument("--seed", type=int)
    p.add_argument("--device", help="cpu | cuda[:N]")
    p.add_argument("--gpu-memory-utilization", type=float)
    p.add_argument("--enforce-eager", action="store_true", default=None, help="cuda: no CUDA graphs")
    p.add_argument("--router-weights-threshold", type=float,
                   help="mixture of experts: skip experts whose router weight is below this (0 = off)")
    p.add_argument("--speculative-config", dest="speculative_config", default=None,
                   help='JSON, e.g. {"method": "ngram", "num_speculative_tokens": 4} (ngram | draft_model | self_int4)')
    p.add_argument("--tensor-parallel-size", type=int,
                   help="shard the model over N ranks (one process each; gloo on the CPU, NCCL on GPUs)")
    p.add_argument("--profile", default=None, help="low-latency | balanced | high-throughput (configs/profiles)")
    p.add_argument("--quantization", choices=QUANTIZATION,
                   help="int8/int4/fp8: quantize on load; awq/gptq: the checkpoint's format; "
                        "sparse24: 2:4 pruning on load (experimental)")


def engine_config(args: argparse.Namespace) -> EngineConfig:
    keys = ["model", "dtype", "max_model_len", "block_size", "kv_cache_memory_bytes", "max_num_seqs",
            "max_num_batched_tokens", "enable_prefix_caching", "seed", "device", "gpu_memory_utilization",
            "enforce_eager", "quantization", "kv_cache_dtype", "router_weights_threshold", "speculative_config",
            "swap_space", "kv_disk_path", "kv_disk_bytes", "tensor_parallel_size"]
    overrides = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}
    return EngineConfig.load(args.config, profile=args.profile, **overrides)


def serve(args: argparse.Namespace) -> int:
    import logging
    import os

    import waitress

    from inference.online_engine import OnlineEngine
    from inference.server.app import ServerConfig, create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = engine_config(args)                 # bad flags fail here, before anything listens
    from inference.loader.model_loader import check_model_name
    try:
        check_model_name(config.model.model)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    keys = tuple(args.api_key or [k for k in os.environ.get("INFERENCE_API_KEYS", "").split(",") if k])
    server_config = ServerConfig(served_model_name=args.served_model_name or config.model.model, api_keys=keys,
                                 max_queue_len=args.max_queue_len, max_body_bytes=args.max_body_bytes)
    engines: list[OnlineEngine] = []

    def load() -> OnlineEngine:
        try:
            engines.append(OnlineEngine(config=config))
        except ValueError as exc:
            # a configuration error (a part package missing, a corrupt file, a bad setting) cannot
            # heal: exit non-zero at once, as vLLM does, instead of serving a never-ready endpoint
            logging.getLogger("inference").error("model cannot load: %s", exc)
            os._exit(2)
        return engines[-1]

    from httpkit.shutdown import GracefulShutdown
    app = GracefulShutdown(create_app(load, server_config), float(os.environ.get("SHUTDOWN_DRAIN_S", "30")),
                           on_exit=lambda: [e.shutdown() for e in engines])
    app.install()                                # SIGTERM: refuse new requests, finish streams, exit
    print(f"Serving {server_config.served_model_name} on http://{args.host}:{args.port} "
          f"(auth {'on' if keys else 'off'}); /ready turns 200 once the model is loaded", flush=True)
    # send_bytes=1: SSE chunks leave at once; one thread per open stream. channel_request_lookahead=1
    # keeps reading the socket while a request runs, so waitress.client_disconnected can see a
    # client leave (with 0 it never does, and a non-streaming request runs to the end).
    waitress.serve(app, host=args.host, port=args.port, threads=args.threads, send_bytes=1,
                   channel_request_lookahead=1,
                   connection_limit=args.threads + 64, channel_timeout=300, ident="support-inference")
    return 0


def chat(args: argparse.Namespace) -> int:
    from inference.online_engine import OnlineEngine
    engine = OnlineEngine(config=engine_config(args))
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens)
    messages: list[dict[str, str]] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    print(f"Chatting with {engine.config.model.model}. Empty line or Ctrl-D quits, /reset starts over.")
    try:
        while True:
            try:
                user = input("\nyou> ").strip()
            except EOFError:
                break
            if not user:
                break
            if user == "/reset":
                messages = messages[:1] if args.system else []
                continue
            messages.append({"role": "user", "content": user})
            print("bot> ", end="", flush=True)
            reply, start, n = [], time.perf_counter(), 0
            stream = engine.chat(messages, params)
            try:
                for delta in stream:
                    print(delta.text, end="", flush=True)
                    reply.append(delta.text)
                    n = delta.num_output_tokens
            except KeyboardInterrupt:
                stream.abort()
                print(" [stopped]", end="")
            dt = time.perf_counter() - start
            print(f"\n   ({n} tokens, {n / dt:.1f} tok/s)", file=sys.stderr)
            messages.append({"role": "assistant", "content": "".join(reply)})
    finally:
        engine.shutdown()
    return 0


def generate(args: argparse.Namespace) -> int:
    from inference.llm import LLM
    llm = LLM.from_config(engine_config(args))
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens)
    out = llm.generate([args.prompt], params, use_tqdm=False)[0]
    print(out.outputs[0].text)
    return 0


def quantize(args: argparse.Namespace) -> int:
    from inference.quantization.workflow import quantize_to_dir
    s = quantize_to_dir(args.model, args.method, args.bits, args.group_size, args.out, symmetric=args.symmetric,
                        num_windows=args.calib_windows, seq_len=args.seq_len, device=args.device,
                        save_dtype=args.save_dtype, act_order=args.act_order, awq_scales=args.awq_scales,
                        tune_epochs=args.tune_epochs)
    print(f"wrote {s['out']} ({s['config']['quant_method']} format, {args.method}, {args.bits}-bit, group "
          f"{args.group_size}) in {s['seconds']:.0f} s; decoder linears {s['linear_bytes_before'] / 2**20:.1f} MiB "
          f"-> {s['linear_bytes_after'] / 2**20:.1f} MiB. Load it with LLM(model={s['out']!r}).")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP service")
    add_engine_args(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--threads", type=int, default=512, help="WSGI threads = concurrent open requests")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--api-key", action="append", help="accepted Bearer key (repeatable; or INFERENCE_API_KEYS)")
    p.add_argument("--max-queue-len", type=int, default=256, help="waiting requests beyond this get 429")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20)
    p.set_defaults(fn=serve)
    for name, fn in (("chat", chat), ("generate", generate)):
        p = sub.add_parser(name)
        add_engine_args(p)
        p.add_argument("--temperature", type=float, default=0.7)
        p.add_argument("--top-p", type=float, default=0.95)
        p.add_argument("--max-tokens", type=int, default=512)
        if name == "chat":
            p.add_argument("--system", default=None, help="system prompt")
        else:
            p.add_argument("prompt")
        p.set_defaults(fn=fn)
    p = sub.add_parser("quantize", help="write a GPTQ- or AWQ-format quantized checkpoint")
    p.add_argument("--model", required=True, help="alias, random:<preset>, HF directory or .gguf file")
    p.add_argument("--method", required=True, choices=["rtn", "awq", "gptq"])
    p.add_argument("--bits", type=int, default=4, help="4 or 8 (awq: 4)")
    p.add_argument("--group-size", type=int, default=128, help="-1: one group per output channel")
    p.add_argument("--symmetric", action="store_true", help="no zero point (GPTQ format's sym=True)")
    p.add_argument("--act-order", action="store_true",
                   help="gptq: quantize columns by decreasing activation energy (static groups: same format)")
    p.add_argument("--awq-scales", action="store_true", help="gptq: fold AWQ's scales in first (4-bit)")
    p.add_argument("--tune-epochs", type=int, default=0,
                   help="gptq/awq: then tune the group scales end to end against the unquantized model "
                        "for this many epochs over the calibration windows (same format)")
    p.add_argument("--calib-windows", type=int, default=32, help="stdlib text windows for gptq/awq")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--device", default="cpu")
    p.add_argument("--save-dtype", default="float16", help="dtype of the tensors left unquantized")
    p.add_argument("--out", required=True)
    p.set_defaults(fn=quantize)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
