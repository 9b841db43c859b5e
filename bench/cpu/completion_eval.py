"""Infill evaluation of the completion pipeline on real code (the CPU default, SmolLM2).

Tasks are cut from real source: single-line and multi-line holes from functions in Python's own
standard library (textwrap, heapq, bisect, colorsys, fnmatch, shlex), scored by exact match
after stripping whitespace; and whole function bodies of small functions (below) whose unit
tests then run against the completed code (pass rate). Deterministic (temperature 0, fixed seed
for choosing holes). Prints a table, writes bench/results/completion_eval.json.

    python -m bench.cpu.completion_eval [--line-holes 30 --multi-holes 10]
"""
from __future__ import annotations

import argparse
import ast
import bisect
import colorsys
import fnmatch
import heapq
import inspect
import random
import shlex
import textwrap
import time

from bench.harness import result_path, write_result
from pipelines.completion import CompletionRequest, service_for
from pipelines.inference_client import InProcessClient

MODULES = [textwrap, heapq, bisect, colorsys, fnmatch, shlex]

# Whole-body tasks: signature + docstring are the prefix, the body is the hole, tests judge it.
BODY_TASKS = [
    ("def is_palindrome(s):\n    \"\"\"True if s reads the same backwards, ignoring case.\"\"\"\n",
     ["assert is_palindrome('Abba')", "assert not is_palindrome('abc')", "assert is_palindrome('')"]),
    ("def factorial(n):\n    \"\"\"n! for n >= 0.\"\"\"\n",
     ["assert factorial(0) == 1", "assert factorial(5) == 120"]),
    ("def fib(n):\n    \"\"\"The n-th Fibonacci number, fib(0) = 0, fib(1) = 1.\"\"\"\n",
     ["assert fib(0) == 0", "assert fib(1) == 1", "assert fib(10) == 55"]),
    ("def count_vowels(text):\n    \"\"\"How many of a, e, i, o, u (any case) text contains.\"\"\"\n",
     ["assert count_vowels('Hello World') == 3", "assert count_vowels('xyz') == 0"]),
    ("def flatten(lists):\n    \"\"\"One list with the items of every list in lists, in order.\"\"\"\n",
     ["assert flatten([[1, 2], [3], []]) == [1, 2, 3]", "assert flatten([]) == []"]),
    ("def clamp(x, lo, hi):\n    \"\"\"x limited to the range [lo, hi].\"\"\"\n",
     ["assert clamp(5, 0, 3) == 3", "assert clamp(-1, 0, 3) == 0", "assert clamp(2, 0, 3) == 2"]),
    ("def unique_sorted(items):\n    \"\"\"The distinct items, sorted ascending.\"\"\"\n",
     ["assert unique_sorted([3, 1, 3, 2]) == [1, 2, 3]"]),
    ("def word_count(text):\n    \"\"\"A dict from each whitespace-separated word to how often it occurs.\"\"\"\n",
     ["assert word_count('a b a') == {'a': 2, 'b': 1}", "assert word_count('') == {}"]),
]


def functions(module) -> list[tuple[str, ast.FunctionDef]]:
    source = inspect.getsource(module)
    tree = ast.parse(source)
    return [(source, node) for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
            and node.end_lineno - node.lineno >= 4]


def line_holes(rng: random.Random, count: int, span: int) -> list[tuple[str, str, str]]:
    """(prefix, hole, suffix) with `span` consecutive non-blank, non-docstring lines removed."""
    pool = [f for m in MODULES for f in functions(m)]
    tasks, tries = [], 0
    while len(tasks) < count and tries < 10000:
        tries += 1
        source, fn = rng.choice(pool)
        lines = source.splitlines(keepends=True)
        body_start = fn.body[1].lineno if (isinstance(fn.body[0], ast.Expr) and len(fn.body) > 1) else fn.body[0].lineno
        start = (rng.randrange(body_start - 1, fn.end_lineno - span + 1)
                 if fn.end_lineno - span + 1 > body_start - 1 else None)
        if start is None:
            continue
        hole = lines[start:start + span]
        if any(not h.strip() or h.strip().startswith(("#", '"""')) for h in hole):
            continue
        indent = hole[0][: len(hole[0]) - len(hole[0].lstrip())]
        prefix = "".join(lines[:start]) + indent
        tasks.append((prefix, "".join(hole)[len(indent):].rstrip("\n"), "".join(lines[start + span:])))
    return tasks


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--line-holes", type=int, default=30)
    ap.add_argument("--multi-holes", type=int, default=10)
    ap.add_argument("--out", default=result_path("completion_eval.json"))
    args = ap.parse_args()
    client = InProcessClient("smollm2")
    service = service_for(client)
    rng = random.Random(0)
    res: dict = {"model": "smollm2 (no FIM tokens: prefix prompt + suffix-aware trimming)",
                 "template": service.template.family}
    t0 = time.perf_counter()
    try:
        for name, span, n in (("single_line", 1, args.line_holes), ("multi_line", 3, args.multi_holes)):
            exact = 0
            for prefix, hole, suffix in line_holes(rng, n, span):
                req = CompletionRequest(prefix=prefix, suffix=suffix, language="python", temperature=0.0,
                                        max_tokens=64 * span)
                got = service.complete(req).texts[0]
                exact += " ".join(got.split()) == " ".join(hole.split())
            res[name] = {"tasks": n, "exact_match": exact / max(1, n)}
        passed = 0
        for prefix, tests in BODY_TASKS:
            req = CompletionRequest(prefix=prefix + "    ", suffix="\n", language="python", temperature=0.0,
                                    max_tokens=128, stop=["\ndef ", "\nclass ", "\nif __name__"])
            body = service.complete(req).texts[0]
            scope: dict = {}
            try:
                exec(prefix + "    " + body + "\n" + "\n".join(tests), scope)           # noqa: S102 - the eval's point
                passed += 1
            except Exception:
                pass
        res["function_body"] = {"tasks": len(BODY_TASKS), "unit_test_pass_rate": passed / len(BODY_TASKS)}
    finally:
        client.close()
    res["wall_s"] = time.perf_counter() - t0
    print("| task | n | score |\n|---|---|---|")
    print(f"| single-line holes (stdlib) | {res['single_line']['tasks']} | "
          f"exact match {res['single_line']['exact_match']:.0%} |")
    print(f"| 3-line holes (stdlib) | {res['multi_line']['tasks']} | "
          f"exact match {res['multi_line']['exact_match']:.0%} |")
    print(f"| whole function bodies | {len(BODY_TASKS)} | "
          f"unit tests pass {res['function_body']['unit_test_pass_rate']:.0%} |")
    write_result(args.out, res)


if __name__ == "__main__":
    main()
