"""Support-chat action round trips on the CPU: the chat API on the default model (Qwen2.5-Coder-0.5B,
in process), the demo order service on a loopback socket, one conversation at a time.

Kinds of turn, each `--reps` times with a different order number / address / item:
    lookup     "Where is my order NW-...?"            intent -> tool call -> GET -> templated reply
    ask        "Where is my order?"                    intent -> tool call -> the question for the number
    confirm    "Please change the address of ..."      intent -> tool call -> the confirmation question
    run        the Confirm button (POST .../actions/<id>) -> POST -> templated reply
    kb         "How do I track an order?"              the help-centre turn the same pipeline takes
               when no action fits (the peer row: what a turn costs without an action)

Issue 31's target: intent -> call -> reply P99 <= 2 s, excluding the endpoint's own time (its
latency as the call log records it is subtracted). Prints a table, writes
bench/results/actions.json.

    OMP_WAIT_POLICY=PASSIVE python -m bench.cpu.actions [--reps 20]
"""
from __future__ import annotations

import argparse
import datetime as dt
import statistics
import tempfile
import time
from pathlib import Path

from app import create_app
from bench.harness import cpu_model, git_commit, nearest_rank, result_path, write_result
from pipelines.inference_client import InProcessClient

KEY = {"X-Site-Key": "demo-site-key"}
ORDERS = ["NW-4417302", "NW-5520018", "NW-3108842", "NW-2290451", "NW-7700001"]      # the last one: 404
STREETS = ["Park Row", "Mill Lane", "Quay Street", "Elm Street", "Castle Walk"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--out", default=result_path("actions.json"))
    args = ap.parse_args()
    import threading

    from werkzeug.serving import make_server

    tmp = Path(tempfile.mkdtemp())
    client = InProcessClient(args.model, max_model_len=2048, kv_cache_memory_bytes=64 << 20)
    app = create_app({"KB_CACHE_DIR": str(tmp / "kb"), "DATABASE_URL": f"sqlite:///{tmp / 'c.db'}",
                      "REDIS_URL": None}, client=client)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    app.config["ACTIONS_BASE_URL"] = f"http://127.0.0.1:{server.server_port}"
    services = app.extensions["support_chat"]["services"]
    services.start()
    services.wait_first_attempt(300)
    calls = services.call_log
    web = app.test_client()

    def session() -> str:
        return web.post("/api/chat/sessions", headers=KEY).get_json()["session_id"]

    def endpoint_ms(sid: str, since: int) -> float:
        return sum(c["latency_ms"] or 0.0 for c in calls.for_conversation("demo", sid)[since:])

    def turn(sid: str, text: str) -> tuple[dict, float]:
        before = len(calls.for_conversation("demo", sid))
        t0 = time.perf_counter()
        body = web.post(f"/api/chat/sessions/{sid}/messages", headers=KEY, json={"content": text}).get_json()
        return body, (time.perf_counter() - t0) * 1000 - endpoint_ms(sid, before)

    def click(sid: str, key: str) -> tuple[dict, float]:
        before = len(calls.for_conversation("demo", sid))
        t0 = time.perf_counter()
        body = web.post(f"/api/chat/sessions/{sid}/actions/{key}", headers=KEY, json={"confirm": True}).get_json()
        return body, (time.perf_counter() - t0) * 1000 - endpoint_ms(sid, before)

    turn(session(), "Where is my order NW-4417302?")                # warm-up: first prefill, caches
    times: dict[str, list[float]] = {k: [] for k in ("lookup", "ask", "confirm", "run", "kb")}
    outcomes: dict[str, dict[str, int]] = {k: {} for k in times}

    def note(kind: str, body: dict, ms: float) -> None:
        times[kind].append(ms)
        status = (body.get("action") or {}).get("status", "none")
        outcomes[kind][status] = outcomes[kind].get(status, 0) + 1

    for i in range(args.reps):
        order = ORDERS[i % len(ORDERS)]
        note("lookup", *turn(session(), f"Hi, where is my order {order}?"))
        note("ask", *turn(session(), "Where is my order?" if i % 2 else "Has my package shipped yet?"))
        sid = session()
        body, ms = turn(sid, f"Please change the delivery address of order NW-5520018 to {10 + i} "
                             f"{STREETS[i % len(STREETS)]}, Leeds LS2 8AA")
        note("confirm", body, ms)
        if (body.get("action") or {}).get("status") == "needs_confirmation":
            note("run", *click(sid, body["action"]["id"]))
        note("kb", *turn(session(), "How do I track an order?" if i % 2 else "How long does shipping take?"))
    services.stop()
    server.shutdown()
    client.close()

    rows = {k: {"turns": len(v), "p50_ms": round(statistics.median(v), 1), "p90_ms": round(nearest_rank(v, 0.9), 1),
                "p99_ms": round(nearest_rank(v, 0.99), 1), "max_ms": round(max(v), 1), "outcomes": outcomes[k]}
            for k, v in times.items() if v}
    print(f"Action round trips, {args.model} in process, {cpu_model()}; endpoint time subtracted")
    print("| turn | turns | P50 ms | P90 ms | P99 ms | max ms | outcomes |")
    print("|---|---|---|---|---|---|---|")
    for k, r in rows.items():
        print(f"| {k} | {r['turns']} | {r['p50_ms']} | {r['p90_ms']} | {r['p99_ms']} | {r['max_ms']} | "
              f"{r['outcomes']} |")
    action_p99 = max(rows[k]["p99_ms"] for k in ("lookup", "ask", "confirm", "run") if k in rows)
    print(f"action turns P99 {action_p99:.0f} ms (target <= 2000)")
    write_result(args.out, {"bench": "actions", "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                            "commit": git_commit(), "cpu": cpu_model(), "model": args.model, "reps": args.reps,
                            "rows": rows, "action_p99_ms": action_p99, "target_p99_ms": 2000})


if __name__ == "__main__":
    main()
