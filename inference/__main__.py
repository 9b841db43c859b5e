"""Command line: `python -m inference chat` (streamed terminal chat) and `generate` (one prompt)."""
from __future__ import annotations

import argparse
import sys
import time

from inference.config import EngineConfig
from inference.sampling_params import SamplingParams


def add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="alias (smollm2), random:<preset>, HF directory or .gguf file")
    p.add_argument("--config", default=None, help="engine YAML (default configs/engine.yaml)")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--block-size", type=int)
    p.add_argument("--kv-cache-memory-bytes", type=int)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false", default=None)
    p.add_argument("--seed", type=int)


def engine_config(args: argparse.Namespace) -> EngineConfig:
    keys = ["model", "dtype", "max_model_len", "block_size", "kv_cache_memory_bytes", "max_num_seqs",
            "max_num_batched_tokens", "enable_prefix_caching", "seed"]
    overrides = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}
    return EngineConfig.load(args.config, **overrides)


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference")
    sub = parser.add_subparsers(dest="command", required=True)
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
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
