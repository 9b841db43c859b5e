"""Scenarios 4 and 6: Redis down at web boot and restarted mid-traffic; the Celery broker down.
Each returns a ScenarioResult."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import redis
import requests

from tests.e2e.faults.harness import (
    API_KEY,
    SITE_KEY,
    Customer,
    InferenceService,
    RedisServer,
    ScenarioResult,
    Tally,
    WebApp,
    fill_embedding_cache,
    lost_messages,
    wait_until,
)


def _redis_dep(web: WebApp) -> dict:
    return web.readyz()[1]["dependencies"]["redis"]


def redis_outage(workdir: Path, service: InferenceService, embedder=None) -> ScenarioResult:
    """4. REDIS_URL set and Redis down when the web tier starts; then started; then restarted
    (append-only file on) in the middle of traffic. Rate limits are real ones (per IP).
    Conversations are in the database, so Redis (limits, live events, the broker) going away
    loses no turn."""
    result = ScenarioResult("4 Redis down at web boot, then restarted mid-traffic")
    if embedder is not None:
        result.details["cache_filled_s"] = fill_embedding_cache(workdir / "kb-cache", embedder)
    store = RedisServer(data_dir=str(workdir / "redis"))
    (workdir / "redis").mkdir(exist_ok=True)
    web = WebApp(workdir, service.url, store.redis_url, RATE_LIMIT_PER_IP="3000 per minute")
    tally = Tally()
    try:
        web.start()
        result.checks["readyz 200 with Redis down"] = wait_until(lambda: web.readyz()[0] == 200, 30) is True
        customer = Customer(web.url, tally)
        sids = [customer.new_session() for _ in range(3)]
        for i, sid in enumerate(sids):
            for j in range(2):
                customer.say(sid, f"Where is my order NW-{i}{j}?")
        handoff = requests.post(f"{web.url}/api/chat/sessions/{sids[0]}/handoff", headers=SITE_KEY, timeout=10)
        tally.record(handoff.status_code, handoff.headers, 0.0, handoff.text)
        result.checks["chat answered while Redis was down"] = len(tally.accepted) == 6
        back = store.start()
        seen_up = wait_until(lambda: _redis_dep(web)["state"] == "up", 30)
        result.recovery_s = round(time.monotonic() - back, 2) if seen_up else None
        result.recovery_bound_s = WebApp.BREAKER_RESET_S + 5
        # traffic on the three sessions while Redis restarts
        stop = threading.Event()

        def talk():
            n = 0
            while not stop.is_set():
                customer.say(sids[n % 3], f"Do you ship to Spain? ({n})")
                n += 1
        talker = threading.Thread(target=talk)
        talker.start()
        time.sleep(1.5)
        store.stop()
        time.sleep(1.0)                                  # down for a moment, as in a rolling restart
        store.start()
        time.sleep(2.0)
        stop.set()
        talker.join(60)
        result.lost = lost_messages(customer, tally.accepted)
        direct = redis.Redis(port=store.port, decode_responses=True)
        sessions = [requests.get(f"{web.url}/api/chat/sessions/{sid}", headers=SITE_KEY, timeout=10).json()
                    for sid in sids]
        said = [sum(1 for m in s["messages"] if m["role"] == "user") for s in sessions]
        result.checks["every accepted message is in the database once"] = \
            said == [sum(1 for sid, _ in tally.accepted if sid == s) for s in sids]
        result.checks["the handoff reached the broker"] = direct.llen("celery") >= 1 and \
            sessions[0]["status"] == "pending_human"
        result.details["turns_answered"] = len(tally.accepted)
        return result.take(tally)
    finally:
        web.close()
        store.close()


def broker_outage(workdir: Path, service: InferenceService, embedder=None) -> ScenarioResult:
    """6. The Celery broker down (the store's Redis up): a handoff is accepted and its summary
    task queued once the broker returns; a job submit gets 503 + Retry-After and its retry with
    the same Idempotency-Key is accepted once the broker is back."""
    result = ScenarioResult("6 Celery broker down")
    if embedder is not None:
        result.details["cache_filled_s"] = fill_embedding_cache(workdir / "kb-cache", embedder)
    store, broker = RedisServer(), RedisServer()
    web = WebApp(workdir, service.url, store.redis_url, CELERY_BROKER_URL=broker.redis_url)
    tally = Tally()
    try:
        store.start()
        web.start()
        customer = Customer(web.url, tally)
        sid = customer.new_session()
        customer.say(sid, "Where is my order?")
        t0 = time.monotonic()
        handoff = requests.post(f"{web.url}/api/chat/sessions/{sid}/handoff", headers=SITE_KEY, timeout=10)
        tally.record(handoff.status_code, handoff.headers, time.monotonic() - t0, handoff.text)
        result.checks["handoff accepted while the broker is down"] = handoff.status_code == 200
        deps = wait_until(lambda: web.readyz()[1]["dependencies"]["celery_broker"], 5)
        result.checks["readyz names the broker down, one task waiting"] = deps["state"] == "down" \
            and deps["outbox_pending"] == 1
        job = {"requests": [{"prompt": "hello", "max_tokens": 2}]}
        headers = {**API_KEY, "Idempotency-Key": "nightly-1"}
        t0 = time.monotonic()
        refused = requests.post(f"{web.url}/v1/jobs", json=job, headers=headers, timeout=10)
        tally.record(refused.status_code, refused.headers, time.monotonic() - t0, refused.text)
        result.details["job_submit_refused"] = f"{refused.status_code} " \
            f"Retry-After {refused.headers.get('Retry-After')} {refused.text[:200]}"
        result.checks["job submit: 503 with Retry-After"] = refused.status_code == 503 and \
            int(refused.headers.get("Retry-After", "0")) >= 1 and \
            refused.json()["error"]["type"] == "service_unavailable" and \
            "unavailable" in refused.json()["error"]["message"]
        back = broker.start()
        sent = wait_until(lambda: web.readyz()[1]["dependencies"]["celery_broker"]["outbox_pending"] == 0, 30)
        result.recovery_s = round(time.monotonic() - back, 2) if sent else None
        result.recovery_bound_s = WebApp.BREAKER_RESET_S + 5
        t0 = time.monotonic()
        retried = requests.post(f"{web.url}/v1/jobs", json=job, headers=headers, timeout=10)
        tally.record(retried.status_code, retried.headers, time.monotonic() - t0, retried.text)
        result.checks["the retried submit is accepted"] = retried.status_code == 202
        queued = redis.Redis(port=broker.port).llen("celery")
        result.checks["both tasks are on the broker"] = queued == 2
        result.details["tasks_on_broker"] = queued
        result.lost = lost_messages(customer, tally.accepted)
        return result.take(tally)
    finally:
        web.close()
        broker.close()
        store.close()
