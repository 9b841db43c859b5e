"""Answer accuracy of the support chat, end to end: the real app (`python -m app serve`, its
default model on the CPU, or MODEL) driven through its HTTP API with streamed replies, on an evaluation set of questions
whose correct replies must state known facts of the help centre.

Per reply it scores:
- fact stated: every fact group of the item appears in the reply (case-insensitive substring,
  whitespace collapsed; a group is a list of equivalent spellings);
- hallucination: the reply contains a number (price, duration, count, percentage) that none of
  the articles it cites contains;
- unanswerable handled (items the KB cannot answer): the reply offers a human (or hands off)
  and states no unsupported number;
- leaked instructions: the reply repeats prompt scaffolding or the tenant's system prompt;
- first-sentence latency: from the POST to the end of the first streamed sentence.

Each run is a row keyed by --label and the evaluation set, so a baseline and later pipelines sit
side by side in bench/results/answers.json. Prints a table.

    python -m bench.cpu.answers [--eval bench/data/answers_eval.yaml] [--label baseline] [--limit N]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from bench.harness import (
    ROOT,
    cpu_model,
    free_port,
    git_commit,
    log,
    percentile,
    result_path,
    stop_process,
    write_result,
)

SITE_KEY = "demo-site-key"
SENTENCE_END = re.compile(r"[.!?。！？](\s|$)")
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
OFFERS_HUMAN = re.compile(r"\b(human|agent|person|someone from our team|support team|colleague)\b|人工|客服",
                          re.IGNORECASE)
SCAFFOLDING = ("help-centre passages", "help-center passages", "customer message:", "use only the help-centre",
               "passages:", "[1]", "[2]", "system prompt")


def normalize(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def facts_stated(reply: str, facts: list[list[str]]) -> bool:
    text = normalize(reply)
    return all(any(normalize(alt) in text for alt in group) for group in facts)


def unsupported_numbers(reply: str, cited_text: str) -> list[str]:
    """Numbers in the reply that no cited article contains (1-digit list markers aside)."""
    source = normalize(cited_text)
    out = []
    for m in NUMBER.finditer(reply):
        n = m.group(0).rstrip(".,")
        if len(n) == 1 and reply[m.end():m.end() + 1] in (".", ")"):     # "1." / "2)" list markers
            continue
        if n not in source:
            out.append(n)
    return out


def leaked(reply: str, system_prompt: str) -> list[str]:
    text = normalize(reply)
    hits = [s for s in SCAFFOLDING if s in text]
    words = normalize(system_prompt).split()
    # any run of 8 consecutive words of the system prompt
    for i in range(max(0, len(words) - 7)):
        if " ".join(words[i:i + 8]) in text:
            hits.append("system prompt: " + " ".join(words[i:i + 8]))
            break
    return hits


@contextlib.contextmanager
def app_server(kb: Path, log_file, tenants_path: Path | None = None):
    """`python -m app serve` on a free loopback port with `kb` as its help centre."""
    port = free_port()
    cache = tempfile.mkdtemp(prefix="answers-kb-cache-")
    env = {**os.environ, "KB_PATH": str(kb), "KB_CACHE_DIR": cache, "PYTHONUNBUFFERED": "1",
           **({"TENANTS_PATH": str(tenants_path)} if tenants_path else {}),
           "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
           # one client asks far faster than a person: the per-IP and per-key limits stay out of it
           "RATE_LIMIT_PER_IP": "100000 per second", "RATE_LIMIT_PER_SITE_KEY": "100000 per second"}
    proc = subprocess.Popen([sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(port)],
                            cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the app exited with {proc.returncode} (log: {log_file.name})")
            with contextlib.suppress(httpx.TransportError):        # ready, and the model loaded
                if httpx.get(f"{url}/readyz", timeout=5).status_code == 200 and \
                        httpx.get(f"{url}/v1/health", timeout=5).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("the app was not ready after 600 s")
            time.sleep(0.5)
        yield url
    finally:
        stop_process(proc)


def ask(http: httpx.Client, url: str, sid: str, text: str) -> dict:
    """One streamed turn: the done payload, plus the first-sentence and whole-reply times."""
    start = time.perf_counter()
    for _ in range(20):                   # the chat's rate limit: wait as told, then ask again
        with http.stream("POST", f"{url}/api/chat/sessions/{sid}/messages", headers={"X-Site-Key": SITE_KEY},
                         json={"content": text, "stream": True}) as r:
            if r.status_code != 429:
                return _read_turn(r, start)
            r.read()
        time.sleep(float(r.headers.get("Retry-After", "1")))
        start = time.perf_counter()
    raise RuntimeError("turn failed: still rate limited after 20 tries")


def _read_turn(r, start: float) -> dict:
    first = None
    so_far = ""
    done = None
    event = None
    if r.status_code != 200:
        r.read()
        raise RuntimeError(f"turn failed: {r.status_code} {r.text[:200]}")
    if r.headers.get("content-type", "").startswith("application/json"):
        # an earlier turn handed the conversation to a human: this one waits for them, no bot reply
        r.read()
        total = time.perf_counter() - start
        return {"reply": "", "handoff": True, "citations": [], "intent": "human_agent", "first_sentence_s": total,
                "total_s": total}
    for line in r.iter_lines():
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
            if event == "token":
                so_far += data["text"]
                if first is None and SENTENCE_END.search(so_far):
                    first = time.perf_counter() - start
            elif event == "done":
                done = data
            elif event == "error":
                raise RuntimeError(f"stream error: {data}")
    total = time.perf_counter() - start
    if done is None:
        raise RuntimeError("stream ended without a done event")
    done["first_sentence_s"] = first if first is not None else total
    done["total_s"] = total
    return done


def run(items: list[dict], kb: Path, url: str, system_prompt: str) -> list[dict]:
    rows = []
    with httpx.Client(timeout=300) as http:
        for i, item in enumerate(items):
            sid = http.post(f"{url}/api/chat/sessions", headers={"X-Site-Key": SITE_KEY}).json()["session_id"]
            for turn in item["turns"]:
                done = ask(http, url, sid, turn)
            reply = done["reply"]
            # a citation's source is the article's path under the KB's parent ("kb/refunds.md")
            cited = "\n".join((kb / Path(c["source"]).name).read_text(encoding="utf-8")
                              for c in done.get("citations", []) if (kb / Path(c["source"]).name).is_file())
            row = {"id": item["id"], "kind": item["kind"], "question": item["turns"][-1], "reply": reply,
                   "citations": [c["source"] for c in done.get("citations", [])], "handoff": done.get("handoff"),
                   "intent": done.get("intent"), "grounding": done.get("grounding"),
                   "first_sentence_s": round(done["first_sentence_s"], 3),
                   "total_s": round(done["total_s"], 3), "unsupported_numbers": unsupported_numbers(reply, cited),
                   "leaks": leaked(reply, system_prompt)}
            if item["kind"] == "unanswerable":
                row["handled"] = bool((done.get("handoff") or OFFERS_HUMAN.search(reply))
                                      and not row["unsupported_numbers"])
            else:
                row["correct"] = facts_stated(reply, item["facts"])
            rows.append(row)
            log(f"[{i + 1}/{len(items)}] {item['kind']:12} {'ok ' if row.get('correct', row.get('handled')) else 'BAD'}"
                f" {row['first_sentence_s']:6.2f} s  {item['turns'][-1][:50]!r} -> {reply[:90]!r}")
    return rows


def summarize(rows: list[dict]) -> dict:
    answerable = [r for r in rows if r["kind"] != "unanswerable"]
    unanswerable = [r for r in rows if r["kind"] == "unanswerable"]
    first = [r["first_sentence_s"] for r in rows]
    by_kind = {}
    for kind in sorted({r["kind"] for r in rows}):
        rs = [r for r in rows if r["kind"] == kind]
        ok = sum(bool(r.get("correct", r.get("handled"))) for r in rs)
        by_kind[kind] = {"n": len(rs), "ok": ok, "rate": round(ok / len(rs), 4)}
    return {
        "n": len(rows),
        "accuracy": round(sum(r["correct"] for r in answerable) / len(answerable), 4) if answerable else None,
        "hallucination_rate": round(sum(bool(r["unsupported_numbers"]) for r in rows) / len(rows), 4),
        "unanswerable_handled": (round(sum(r["handled"] for r in unanswerable) / len(unanswerable), 4)
                                 if unanswerable else None),
        "leaked_instruction_replies": sum(bool(r["leaks"]) for r in rows),
        "first_sentence_p50_s": round(percentile(first, 50), 3),
        "first_sentence_p99_s": round(percentile(first, 99), 3),
        "by_kind": by_kind,
        "grounding": {k: sum(r.get("grounding") == k for r in rows)
                      for k in sorted({str(r.get("grounding")) for r in rows}) if k != "None"},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--eval", default=str(ROOT / "bench" / "data" / "answers_eval.yaml"))
    ap.add_argument("--label", default="current", help="the row's name, e.g. baseline")
    ap.add_argument("--limit", type=int, default=0, help="only the first N items (quick checks)")
    ap.add_argument("--every", type=int, default=1, help="every k-th item only (a spread-out sample)")
    ap.add_argument("--url", help="an app already serving this eval set's KB (default: start one)")
    ap.add_argument("--answer-mode", choices=("extractive", "grounded_generation", "free"),
                    help="serve the demo tenant with this answer_mode (default: as configs/tenants.yaml says)")
    ap.add_argument("--out", default=result_path("answers.json"))
    args = ap.parse_args()
    spec = yaml.safe_load(Path(args.eval).read_text(encoding="utf-8"))
    kb = (ROOT / spec["kb"]).resolve()
    items = spec["items"][::args.every]
    items = items[:args.limit] if args.limit else items
    tenants = yaml.safe_load((ROOT / "configs" / "tenants.yaml").read_text(encoding="utf-8"))["tenants"]
    demo = next(t for t in tenants.values() if t["site_key"] == SITE_KEY)
    system_prompt = demo["system_prompt"]
    tenants_path = None
    if args.answer_mode:
        demo["answer_mode"] = args.answer_mode
        tenants_path = Path(tempfile.mkdtemp(prefix="answers-tenants-")) / "tenants.yaml"
        tenants_path.write_text(yaml.safe_dump({"tenants": tenants}, allow_unicode=True), encoding="utf-8")
    with tempfile.NamedTemporaryFile("w", prefix="answers-app-", suffix=".log", delete=False) as log_file:
        if args.url:
            rows = run(items, kb, args.url, system_prompt)
        else:
            with app_server(kb, log_file, tenants_path) as url:
                rows = run(items, kb, url, system_prompt)
    summary = summarize(rows)
    key = f"{args.label}:{Path(args.eval).stem}" + (f":every{args.every}" if args.every > 1 else "")
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.exists() else {"runs": {}}
    mode = args.answer_mode or demo.get("answer_mode", "free")
    result["runs"][key] = {"label": args.label, "answer_mode": mode, "eval": os.path.relpath(args.eval, ROOT),
                           "kb": spec["kb"], "commit": git_commit(), "cpu": cpu_model(),
                           "time": time.strftime("%Y-%m-%d %H:%M:%S"), **summary, "items": rows}
    write_result(out, result)
    log(f"\n{'run':40} {'n':>4} {'accuracy':>9} {'halluc.':>8} {'unans.':>7} {'leaks':>6} {'1st P50':>8} "
        f"{'1st P99':>8}")
    for name, r in result["runs"].items():
        def pct(v):
            return "-" if v is None else f"{100 * v:.1f}%"
        log(f"{name:40} {r['n']:>4} {pct(r['accuracy']):>9} {pct(r['hallucination_rate']):>8} "
            f"{pct(r['unanswerable_handled']):>7} {r['leaked_instruction_replies']:>6} "
            f"{r['first_sentence_p50_s']:>7.2f}s {r['first_sentence_p99_s']:>7.2f}s")
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
