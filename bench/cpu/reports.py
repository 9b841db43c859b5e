"""The agent console's reports over a large conversation store: `GET /api/agent/reports` with
--conversations (100,000 by default) conversations of one tenant in PostgreSQL (the machine's,
127.0.0.1:5432, database `test`, in a schema of its own that is dropped afterwards).

The store is seeded as traffic leaves it: 1-4 exchanges per conversation over 30 days, the bot's
groundings mixed (quoted, generated, unanswerable, clarified), 12% handed to an agent (most
claimed and resolved), thumbs-ups and CSAT ratings, and a second tenant with a tenth as many.
Timed, each --reps times after a warm-up, P50 / P99:
  - the endpoint for the last 7 days and for 30 days, through the app (Flask test client, a
    logged-in agent), which computes every conversation's outcome (app/reports/resolution.py);
  - the peer: the same range's conversations-and-handoffs statement alone, what the report ran
    before outcomes were added.

Prints a table, writes bench/results/reports.json.

    python -m bench.cpu.reports [--conversations 100000] [--reps 30]
"""
from __future__ import annotations

import argparse
import datetime as dt
import random
import secrets
import time

from bench.harness import cpu_model, git_commit, host_times, nearest_rank, result_path, write_result

POSTGRES_ROOT = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
PASSWORD = "bench-password-123"
GROUNDINGS = ["quoted"] * 5 + ["verified_generated"] * 3 + ["unanswerable", "clarified"]


def seed(db, tenant: str, n: int, now: dt.datetime, rng: random.Random, agent_id: int) -> None:
    from sqlalchemy import insert

    from app.store.models import Conversation, Feedback, Handoff, Message
    convs, msgs, handoffs, feedback = [], [], [], []
    for i in range(n):
        sid = f"{tenant}-{i:07d}"
        created = now - dt.timedelta(seconds=rng.uniform(0, 30 * 86400))
        exchanges = rng.randint(1, 4)
        t = created
        for k in range(exchanges):
            msgs.append({"conversation_id": sid, "seq": 2 * k, "role": "user", "content": "a question",
                         "created_at": t, "citations": []})
            t += dt.timedelta(seconds=rng.uniform(1, 5))
            msgs.append({"conversation_id": sid, "seq": 2 * k + 1, "role": "assistant", "content": "an answer",
                         "grounding": rng.choice(GROUNDINGS), "created_at": t, "citations": []})
            t += dt.timedelta(seconds=rng.uniform(5, 120))
        status = "open"
        if rng.random() < 0.12:
            claimed = rng.random() < 0.85
            resolved = claimed and rng.random() < 0.9
            status = "resolved" if resolved else "human" if claimed else "pending_human"
            handoffs.append({"conversation_id": sid, "tenant_id": tenant, "requested_at": t,
                             "claimed_by": agent_id if claimed else None,
                             "claimed_at": t + dt.timedelta(seconds=60) if claimed else None,
                             "first_reply_at": t + dt.timedelta(seconds=90) if claimed else None,
                             "resolved_at": t + dt.timedelta(seconds=600) if resolved else None})
            if resolved and rng.random() < 0.4:
                feedback.append({"conversation_id": sid, "kind": "csat", "rating": str(rng.randint(1, 5)),
                                 "comment": "", "created_at": t + dt.timedelta(seconds=700)})
        elif rng.random() < 0.05:
            feedback.append({"conversation_id": sid, "kind": "message", "message_index": 1, "rating": "up",
                             "comment": "", "created_at": t})
        convs.append({"id": sid, "tenant_id": tenant, "status": status, "summary": "",
                      "num_messages": 2 * exchanges, "created_at": created, "updated_at": t})
    with db.session() as s:
        for table, rows in ((Conversation, convs), (Message, msgs), (Handoff, handoffs), (Feedback, feedback)):
            for j in range(0, len(rows), 5000):
                s.execute(insert(table), rows[j:j + 5000])


def times(fn, reps: int) -> list[float]:
    """Milliseconds of each call, after a warm-up."""
    return [1e3 * t for t in host_times(fn, reps)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conversations", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default=result_path("reports.json"))
    args = ap.parse_args()
    from sqlalchemy import create_engine, exists, select, text

    from app import create_app
    from app.agent.accounts import AgentAccounts
    from app.store.db import Database
    from app.store.models import Conversation, Handoff
    from pipelines.inference_client import InProcessClient

    schema = f"bench_{secrets.token_hex(4)}"
    root = create_engine(POSTGRES_ROOT)
    with root.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    url = f"{POSTGRES_ROOT}?options=-csearch_path%3D{schema}"
    client = InProcessClient("random:tiny", dtype="float32", max_model_len=256, kv_cache_memory_bytes=8 << 20)
    try:
        app = create_app({"DATABASE_URL": url, "REDIS_URL": None, "AGENT_LOGIN_LIMIT": "1000 per minute"},
                         client=client)
        db: Database = app.extensions["db"]
        accounts = AgentAccounts(db)
        agent_id = accounts.add("demo", "lead@northwind.test", PASSWORD).id
        now = dt.datetime.now(dt.UTC)
        t0 = time.perf_counter()
        rng = random.Random(7)
        seed(db, "demo", args.conversations, now, rng, agent_id)
        seed(db, "other", args.conversations // 10, now, rng, agent_id)
        with root.begin() as conn:
            conn.execute(text(f"ANALYZE {schema}.conversations, {schema}.messages, {schema}.handoffs, "
                              f"{schema}.feedback"))
        seed_s = time.perf_counter() - t0
        web = app.test_client()
        resp = web.post("/api/agent/login", json={"email": "lead@northwind.test", "password": PASSWORD})
        assert resp.status_code == 200, resp.get_json()
        rows = {}
        for days in (7, 30):
            start = (now - dt.timedelta(days=days - 1)).date()
            path = f"/api/agent/reports?from={start.isoformat()}&to={now.date().isoformat()}"
            body = web.get(path).get_json()

            def endpoint(path=path):
                r = web.get(path)
                assert r.status_code == 200, r.get_json()
            lo = dt.datetime.combine(start, dt.time(0), dt.UTC)
            hi = dt.datetime.combine(now.date() + dt.timedelta(days=1), dt.time(0), dt.UTC)

            def peer(lo=lo, hi=hi):
                with db.session(readonly=True) as s:
                    handed = exists().where(Handoff.conversation_id == Conversation.id)
                    s.execute(select(Conversation.created_at, handed).where(
                        Conversation.tenant_id == "demo", Conversation.num_messages > 0,
                        Conversation.created_at >= lo, Conversation.created_at < hi)).all()
            ours, before = times(endpoint, args.reps), times(peer, args.reps)
            rows[f"{days}d"] = {"conversations": body["conversations"], "resolution_rate": body["resolution_rate"],
                                "outcomes": body["outcomes"], "undecided": body["undecided"],
                                "endpoint_p50_ms": round(nearest_rank(ours, 0.5), 1),
                                "endpoint_p99_ms": round(nearest_rank(ours, 0.99), 1),
                                "peer_statement_p50_ms": round(nearest_rank(before, 0.5), 1),
                                "peer_statement_p99_ms": round(nearest_rank(before, 0.99), 1)}
    finally:
        client.close()
        with root.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        root.dispose()
    print(f"Reports over {args.conversations:,} conversations (PostgreSQL), seeded in {seed_s:.0f} s")
    print(f"{'range':>6} {'in range':>9} {'endpoint P50':>13} {'P99':>8} {'peer P50':>9} {'P99':>8}  resolution")
    for name, r in rows.items():
        print(f"{name:>6} {r['conversations']:>9,} {r['endpoint_p50_ms']:>11.1f}ms {r['endpoint_p99_ms']:>6.1f}ms "
              f"{r['peer_statement_p50_ms']:>7.1f}ms {r['peer_statement_p99_ms']:>6.1f}ms  {r['resolution_rate']}")
    result = {"bench": "reports", "commit": git_commit(), "cpu": cpu_model(), "conversations": args.conversations,
              "reps": args.reps, "seed_s": round(seed_s, 1), "rows": rows}
    print(f"wrote {write_result(args.out, result)}")


if __name__ == "__main__":
    main()
