"""Agent console latency on real servers started on 127.0.0.1 and stopped by this script: embedded
(`python -m app serve`: waitress, SQLite, in-process live events) and production (gunicorn with
app/gunicorn_conf.py, 2 gthread workers, PostgreSQL in a fresh schema of 127.0.0.1:5432/test,
Redis db 10: events cross workers through Redis Streams), both on MODEL=random:tiny.

1. First human reply, one conversation at a time: bot turn, handoff (the agent inbox SSE times its
   `handoff` event from just before that POST), the customer opens the conversation SSE, an agent
   claims; the reply is timed from just before its POST to the customer's reader parsing `event:
   message`. The issue's bound: an agent's reply reaches the widget within 1 s.
2. 20 agents (a thread and a session each) list, open, claim (409: another agent won; counted,
   not an error), reply, resolve for a fixed time while customer threads keep the queue filled.
   The suggestion endpoint (it runs the model) is timed apart, after. No peer runs here (Chatwoot
   cannot); client and server share the machine's cores. Writes bench/results/agent_console.json.

    python -m bench.cpu.agent_console [--quick] [--only embedded|production]
"""
from __future__ import annotations

import argparse
import codecs
import collections
import contextlib
import json
import os
import random
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import redis
import requests
from sqlalchemy import create_engine, text

from app.agent.accounts import AgentAccounts
from app.store.db import Database
from bench.harness import (
    ROOT,
    cpu_model,
    free_port,
    git_commit,
    log,
    nearest_rank,
    result_path,
    stop_process,
    write_result,
)

SITE = {"X-Site-Key": "demo-site-key"}
PG_ROOT, REDIS = "postgresql+psycopg://postgres@127.0.0.1:5432/test", "redis://127.0.0.1:6379/10"
PASSWORD, BOUND_S = "bench-password-1", 1.0
THINK_S = (0.5, 1.5)        # between an agent's rounds of requests: a few times faster than a person
ASKS = ["Where is my parcel?", "I want a refund", "My card was declined", "Can I change my address?"]
SERVERS = {"embedded": "waitress, SQLite, in-process events",
           "production": "gunicorn 2×32 gthread, PostgreSQL, Redis Streams"}


def dist(xs: list[float]) -> dict:
    """ms figures of a list of seconds."""
    ms = [x * 1e3 for x in xs]
    return {"n": len(ms), **{k: nearest_rank(ms, q) for k, q in (("p50_ms", .5), ("p90_ms", .9), ("p99_ms", .99))},
            "max_ms": max(ms, default=None)}


@contextlib.contextmanager
def server(config: str, tmp: Path):
    """(base URL, pid) of the config's server, ready, on a fresh database with agents 0..20."""
    port, schema, root, proc = free_port(), f"bench_{secrets.token_hex(4)}", None, None
    db_url = f"sqlite:///{tmp / 'conversations.db'}"
    env = {**os.environ, "MODEL": "random:tiny", "KB_CACHE_DIR": str(tmp / "kb-cache"), "SECRET_KEY": "bench",
           "AGENT_COOKIE_SECURE": "0", "AGENT_LOGIN_LIMIT": "1000 per minute", "CHAT_MAX_TOKENS": "8",
           "RATE_LIMIT_PER_IP": "100000 per minute", "RATE_LIMIT_PER_SITE_KEY": "100000 per minute",
           "OMP_WAIT_POLICY": "PASSIVE", "PYTHONUNBUFFERED": "1"}
    env.pop("REDIS_URL", None)
    cmd = [sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(port)]
    if config == "production":
        root = create_engine(PG_ROOT)
        with root.begin() as conn:
            conn.execute(text(f"CREATE SCHEMA {schema}"))
        db_url = f"{PG_ROOT}?options=-csearch_path%3D{schema}"
        redis.Redis.from_url(REDIS).flushdb()
        env.update(REDIS_URL=REDIS, WEB_BIND=f"127.0.0.1:{port}", WEB_WORKERS="2", WEB_THREADS="32")
        cmd = [sys.executable, "-m", "gunicorn", "-c", "app/gunicorn_conf.py", "app:create_app()"]
    logf = open(tmp / f"{config}.log", "w")
    try:
        db = Database(db_url)
        db.upgrade()
        for i in range(21):
            AgentAccounts(db).add("demo", f"agent{i}@northwind.test", PASSWORD, f"Agent {i}")
        db.dispose()
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**env, "DATABASE_URL": db_url}, stdout=logf,
                                stderr=subprocess.STDOUT)
        url, t0, streak = f"http://127.0.0.1:{port}", time.monotonic(), 0
        while streak < 10:                 # 10 ready answers in a row: both gunicorn workers, likely
            if proc.poll() is not None or time.monotonic() > t0 + 120:
                raise RuntimeError(f"{config} server not ready (exit {proc.poll()}): "
                                   + Path(logf.name).read_text()[-2000:])
            try:
                streak = streak + 1 if requests.get(f"{url}/readyz", timeout=5).status_code == 200 else 0
            except requests.RequestException:
                streak = 0
            time.sleep(0.1 if streak else 0.5)
        log(f"[{config}] ready in {time.monotonic() - t0:.1f} s at {url}")
        yield url, proc.pid
    finally:
        stop_process(proc)
        logf.close()
        if root is not None:
            with root.begin() as conn:
                conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
            root.dispose()
            redis.Redis.from_url(REDIS).flushdb()


def login(url: str, i: int) -> requests.Session:
    s = requests.Session()
    r = s.post(f"{url}/api/agent/login", json={"email": f"agent{i}@northwind.test", "password": PASSWORD}, timeout=30)
    r.raise_for_status()
    s.headers["X-CSRF-Token"] = r.json()["csrf_token"]
    return s


def sse_blocks(resp):
    """(event, data, id) of each SSE block as soon as its blank line has arrived."""
    buf, utf8 = "", codecs.getincrementaldecoder("utf-8")()
    for chunk in resp.iter_content(chunk_size=None):
        buf += utf8.decode(chunk)
        while "\n\n" in buf:
            block, buf = buf.split("\n\n", 1)
            fields = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line and line[0] != ":")
            yield fields.get("event"), fields.get("data"), fields.get("id")


def inbox_reader(url: str, agent: requests.Session, seen: dict, stop: threading.Event, streams: list) -> None:
    """Follows GET /api/agent/events, reconnecting with Last-Event-ID as the console does (a stream
    ends after SSE_MAX_S); seen[conversation id] = perf_counter at its first `handoff` event."""
    last = None
    while not stop.is_set():
        with contextlib.suppress(Exception), agent.get(     # Exception: closed under it by the caller
                f"{url}/api/agent/events", stream=True, timeout=(5, 30),
                headers={"Last-Event-ID": last} if last else {}) as r:
            streams.append(r)
            for kind, data, eid in sse_blocks(r):
                last = eid or last
                if kind == "handoff":
                    seen.setdefault(json.loads(data)["conversation"]["id"], time.perf_counter())


def follow_inboxes(url: str, sessions: list[requests.Session]):
    """An inbox stream per agent (each console keeps one open), on a session of its own (one per
    thread) with the agent's cookie: (seen dicts, a function that closes them)."""
    seens, stop, streams = [{} for _ in sessions], threading.Event(), []
    for s, seen in zip(sessions, seens):
        own = requests.Session()
        own.cookies.update(s.cookies)
        threading.Thread(target=inbox_reader, args=(url, own, seen, stop, streams), daemon=True).start()
    time.sleep(0.5)                                   # the streams are open

    def close() -> None:
        stop.set()
        for r in list(streams):
            r.close()
    return seens, close


def new_handoff(http: requests.Session, url: str, bot_turn: bool = True) -> tuple[str, float]:
    """A customer session, a bot turn (else the message goes to the queue after the handoff), a
    handoff: (id, perf_counter just before the handoff POST)."""
    sid = http.post(f"{url}/api/chat/sessions", headers=SITE, timeout=30).json()["session_id"]
    ask = {"content": random.choice(ASKS), "stream": False}
    if bot_turn:
        http.post(f"{url}/api/chat/sessions/{sid}/messages", headers=SITE, timeout=60, json=ask).raise_for_status()
    t = time.perf_counter()
    http.post(f"{url}/api/chat/sessions/{sid}/handoff", headers=SITE, timeout=30).raise_for_status()
    if not bot_turn:
        http.post(f"{url}/api/chat/sessions/{sid}/messages", headers=SITE, timeout=30, json=ask).raise_for_status()
    return sid, t


def first_reply(url: str, n: int, deadline: float) -> dict:
    agent, customer, sent, reply, post, lost = login(url, 0), requests.Session(), {}, [], [], []
    (seen,), close_inbox = follow_inboxes(url, [login(url, 20)])
    for i in range(n):
        if time.perf_counter() > deadline:
            break
        sid, sent[sid] = new_handoff(customer, url)
        got, done = {}, threading.Event()
        with customer.get(f"{url}/api/chat/sessions/{sid}/events", params={"site_key": "demo-site-key"},
                          stream=True, timeout=(5, 10)) as r:
            blocks = sse_blocks(r)
            next(blocks)                              # "retry:": the stream follows the channel now

            def read():
                with contextlib.suppress(Exception):  # closed under it: the reply was lost
                    got["t"] = next(time.perf_counter() for kind, _, _ in blocks if kind == "message")
                done.set()
            threading.Thread(target=read, daemon=True).start()
            agent.post(f"{url}/api/agent/conversations/{sid}/claim", timeout=30).raise_for_status()
            t0 = time.perf_counter()
            resp = agent.post(f"{url}/api/agent/conversations/{sid}/messages", timeout=30,
                              json={"content": f"Hi, this is Agent 0 (#{i}). Let me check."})
            post.append(time.perf_counter() - t0)
            done.wait(5.0)
            if "t" in got:
                reply.append(got["t"] - t0)
            else:
                lost.append({"conversation": sid, "reply_status": resp.status_code, "body": resp.text[:300]})
        agent.post(f"{url}/api/agent/conversations/{sid}/resolve", timeout=30)
    time.sleep(1.0)                                   # the last handoff event
    close_inbox()
    return {"reply_to_widget": dist(reply), "reply_post": dist(post),
            "handoff_to_inbox": dist([seen[s] - t for s, t in sent.items() if s in seen]),
            "lost_replies": lost, "handoffs_not_seen": [s for s in sent if s not in seen],
            "within_bound": sum(x <= BOUND_S for x in reply)}


class Stats:
    """endpoint -> latencies and status counts, shared by the agent threads."""

    def __init__(self):
        self.lock, self.lat, self.failures = threading.Lock(), collections.defaultdict(list), []
        self.codes = collections.defaultdict(collections.Counter)

    def call(self, name: str, s: requests.Session, method: str, url: str, **kw):
        t0 = time.perf_counter()
        try:
            r = s.request(method, url, timeout=30, **kw)
        except requests.RequestException as exc:
            r, code = None, type(exc).__name__
        else:
            code = r.status_code
        with self.lock:
            if r is not None:
                self.lat[name].append(time.perf_counter() - t0)
            self.codes[name][code] += 1
            if (r is None or r.status_code >= 400 and (name, code) != ("claim", 409)) and len(self.failures) < 10:
                self.failures.append({"request": f"{method} {url}", "status": code, "body": r.text[:300] if r else ""})
        return r


def cpu_seconds(pid: int) -> dict:
    """CPU seconds so far of the server (with its gunicorn workers) and of this client process."""
    used = lambda p: sum(p.cpu_times()[:2])                # noqa: E731 - user + system
    server = psutil.Process(pid)
    return {"server": sum(map(used, [server, *server.children(recursive=True)])), "client": used(psutil.Process())}


def agent_loop(i: int, s: requests.Session, url: str, stats: Stats, queue: dict, deadline: float) -> None:
    rng, mine, api = random.Random(i), [], f"{url}/api/agent/conversations"
    time.sleep(rng.uniform(*THINK_S))             # agents do not all start in the same instant
    while time.perf_counter() < deadline:
        r = stats.call("list pending", s, "GET", api, params={"status": "pending_human"})
        pending = r.json()["conversations"] if r is not None and r.ok else []
        queue["pending"], queue["empty"] = len(pending), queue.get("empty", 0) + (not pending)
        stats.call("list human", s, "GET", api, params={"status": "human"})
        if pending and len(mine) < 3:             # an agent handles up to 3 chats at once
            cid = rng.choice(pending[:5])["id"]
            stats.call("open", s, "GET", f"{api}/{cid}")
            r = stats.call("claim", s, "POST", f"{api}/{cid}/claim")
            if r is not None and r.status_code == 200:
                mine.append(cid)
        if mine:
            cid = rng.choice(mine)
            stats.call("open", s, "GET", f"{api}/{cid}")
            stats.call("reply", s, "POST", f"{api}/{cid}/messages", json={"content": f"Agent {i} here, on it."})
            if rng.random() < 0.3:
                stats.call("resolve", s, "POST", f"{api}/{cid}/resolve")
                mine.remove(cid)
        time.sleep(rng.uniform(*THINK_S))


def feeder(url: str, queue: dict, made: list, deadline: float) -> None:
    http = requests.Session()
    while time.perf_counter() < deadline:
        if queue.get("pending", 0) >= 15:         # enough waiting: the queue stays bounded
            time.sleep(0.2)
            continue
        with contextlib.suppress(requests.RequestException):
            made.append(new_handoff(http, url, bot_turn=False))     # the agent API is what is loaded


def concurrent_agents(url: str, pid: int, num_agents: int, duration_s: float, num_feeders: int = 3) -> dict:
    stats, queue, made = Stats(), {}, []
    sessions = [login(url, i) for i in range(1, num_agents + 1)]      # scrypt: before the clock starts
    seens, close_inboxes = follow_inboxes(url, sessions)
    deadline = time.perf_counter() + duration_s
    feeders = [threading.Thread(target=feeder, args=(url, queue, made, deadline)) for _ in range(num_feeders)]
    agents = [threading.Thread(target=agent_loop, args=(i, s, url, stats, queue, deadline + 2.0))
              for i, s in enumerate(sessions, 1)]
    for t in feeders:
        t.start()
    time.sleep(2.0)                                   # a queue to start from
    t0, cpu0 = time.perf_counter(), cpu_seconds(pid)
    for t in agents:
        t.start()
    for t in agents + feeders:
        t.join(duration_s + 60)
    wall = time.perf_counter() - t0
    cpu = {k: (v - cpu0[k]) / wall for k, v in cpu_seconds(pid).items()}       # cores busy, on average
    time.sleep(1.0)                                   # the last handoff events
    close_inboxes()
    fanout = [seen[sid] - t for seen in seens for sid, t in made if sid in seen]
    codes = {k: dict(v) for k, v in stats.codes.items()}
    every = [x for v in stats.lat.values() for x in v]
    bad = {k: sum(n for c, n in v.items() if not (isinstance(c, int) and (c < 400 or (k, c) == ("claim", 409))))
           for k, v in codes.items()}
    s, sugg = login(url, 1), []                       # the suggestion (runs the model): apart, one at a time
    for cid, _ in made[-5:]:
        t = time.perf_counter()
        r = stats.call("suggestion", s, "GET", f"{url}/api/agent/conversations/{cid}/suggestion")
        if r is not None and r.ok:
            sugg.append(time.perf_counter() - t)
    return {"agents": num_agents, "seconds": wall, "handoffs_made": len(made), "requests": len(every),
            "req_per_s": len(every) / wall, "cores_busy": cpu, "empty_pending_lists": queue.get("empty", 0),
            "server_cpu_ms_per_agent_request": cpu["server"] / (len(every) / wall) * 1e3,
            "handoff_to_inboxes": dist(fanout), "handoffs_missed": len(made) * len(seens) - len(fanout),
            "overall": dist(every), "errors": sum(bad.values()), "errors_by_endpoint": bad,
            "status_5xx": sum(n for v in codes.values() for c, n in v.items() if isinstance(c, int) and c >= 500),
            "claim_conflicts": codes.get("claim", {}).get(409, 0), "failures": stats.failures,
            "endpoints": {k: {**dist(v), "codes": {str(c): n for c, n in codes[k].items()}}
                          for k, v in stats.lat.items() if k != "suggestion"},
            "suggestion": {**dist(sugg), "codes": {str(c): n for c, n in codes.get("suggestion", {}).items()}}}


def fmt(d: dict, *keys: str) -> str:
    return " / ".join("-" if d.get(k) is None else f"{d[k]:.0f}" if d[k] >= 100 else f"{d[k]:.1f}" for k in keys)


def rows(r: dict) -> list[tuple[str, str]]:
    """(metric, figure) of one config's result, in table order."""
    fr, ag = r["first_reply"], r["agents"]
    return [("first agent reply → widget SSE, P50 / P90 / P99 / max ms (bound: 1 s)",
             fmt(fr["reply_to_widget"], "p50_ms", "p90_ms", "p99_ms", "max_ms")
             + f" ({fr['within_bound']} of {fr['reply_to_widget']['n']} within 1 s)"),
            ("  the reply POST alone, P50 / P99 ms", fmt(fr["reply_post"], "p50_ms", "p99_ms")),
            ("handoff POST → agent inbox SSE, P50 / P99 / max ms",
             fmt(fr["handoff_to_inbox"], "p50_ms", "p99_ms", "max_ms")),
            ("lost replies / unseen handoffs", f"{len(fr['lost_replies'])} / {len(fr['handoffs_not_seen'])}"),
            (f"{ag['agents']} agents: agent API P99 (headline) / P50 ms",
             f"**{fmt(ag['overall'], 'p99_ms')}** / {fmt(ag['overall'], 'p50_ms')}"),
            ("  requests, req/s, handoffs made", f"{ag['requests']}, {ag['req_per_s']:.0f}, {ag['handoffs_made']}"),
            ("  cores busy: server / client; server CPU ms per agent request (all its work)",
             f"{ag['cores_busy']['server']:.2f} / {ag['cores_busy']['client']:.2f}; "
             f"{ag['server_cpu_ms_per_agent_request']:.1f}"),
            (f"  handoff → all {ag['agents']} inbox streams, P50 / P99 / max ms; missed",
             fmt(ag["handoff_to_inboxes"], "p50_ms", "p99_ms", "max_ms") + f"; {ag['handoffs_missed']}"),
            ("  errors / 5xx / claim 409s (not errors)", f"{ag['errors']} / {ag['status_5xx']} / "
                                                          f"{ag['claim_conflicts']}"),
            *((f"  {k}: n, P50 / P99 ms", f"{e['n']}, {fmt(e, 'p50_ms', 'p99_ms')}")
              for k, e in sorted(ag["endpoints"].items())),
            ("suggestion (runs the model; apart) P50 / max ms", fmt(ag["suggestion"], "p50_ms", "max_ms"))]


def table(results: dict) -> str:
    cols = {c: dict(rows(r)) for c, r in results.items()}
    out = ["| metric | " + " | ".join(f"{c} ({SERVERS[c]})" for c in results) + " |", "|---|" + "---|" * len(results)]
    for label in dict.fromkeys(k for c in cols.values() for k in c):
        out.append(f"| {label} | " + " | ".join(c.get(label, "-") for c in cols.values()) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="10 conversations, 10 s of load")
    ap.add_argument("--only", choices=tuple(SERVERS))
    ap.add_argument("--conversations", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--agents", type=int, default=20)
    ap.add_argument("--out", default=result_path("agent_console.json"))
    args = ap.parse_args()
    n, secs = (10, 10.0) if args.quick else (args.conversations, args.seconds)
    results = {}
    for config in [args.only] if args.only else list(SERVERS):
        with tempfile.TemporaryDirectory(prefix=f"agent-console-{config}-") as tmp, \
                server(config, Path(tmp)) as (url, pid):
            fr = first_reply(url, n, time.perf_counter() + 180)
            log(f"[{config}] first reply: {fr['reply_to_widget']}")
            ag = concurrent_agents(url, pid, args.agents, secs)
            log(f"[{config}] agents: overall {ag['overall']}, errors {ag['errors']}, 5xx {ag['status_5xx']}")
            results[config] = {"server": SERVERS[config], "first_reply": fr, "agents": ag}
    print(table(results))
    machine = {"nproc": len(os.sched_getaffinity(0)), "cpu": cpu_model()}
    write_result(args.out, {"commit": git_commit(), "machine": machine, "quick": args.quick, "conversations": n,
                            "load_seconds": secs, "bound_reply_s": BOUND_S,
                            "peer": "none (Chatwoot cannot run here)", "results": results})


if __name__ == "__main__":
    main()
