"""Scenarios 1-3 and 5: the inference service down at boot, killed mid-stream, hung, and the
embedding model failing. Each returns a ScenarioResult (tests/e2e/faults/test_faults.py asserts on
it; bench/cpu/faults.py prints it)."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import requests

from tests.e2e.faults.harness import (
    API_KEY,
    SITE_KEY,
    Customer,
    InferenceService,
    ScenarioResult,
    Tally,
    WebApp,
    done_event,
    fill_embedding_cache,
    lost_messages,
    time_to_full_answer,
    wait_until,
)

QUESTIONS = ["How long do refunds take?", "What does delivery to Canada cost?", "How long is the warranty?",
             "Can I change my shipping address?", "How do I reset my password?", "Do you ship to Spain?"]
SLOW_MODEL = "random:smollm2-135m"       # ~30 tok/s here: a reply is still streaming when the fault hits


def _degraded_answers_ok(replies: list[dict | None]) -> bool:
    """Every reply came, is marked degraded and quotes a cited help-centre excerpt."""
    return all(r is not None and r["degraded"] and r["citations"] and "**" in r["reply"] for r in replies)


def down_at_boot(workdir: Path, embedder=None) -> ScenarioResult:
    """1. The inference service is down while the web tier starts, then starts. KB_CACHE_DIR
    holds the embeddings from an earlier run (pass `embedder=None` for a cold cache: then the
    upgrade embeds the whole knowledge base over HTTP first)."""
    result = ScenarioResult("1 inference down at web boot, then started")
    service = InferenceService("random:tiny")                # its port is reserved, nothing listens yet
    web = WebApp(workdir, service.url)
    tally = Tally()
    if embedder is not None:
        result.details["cache_filled_s"] = fill_embedding_cache(workdir / "kb-cache", embedder)
    try:
        web.start()
        def ready_body():
            status, body = web.readyz()
            return body if status == 200 else None
        ready = wait_until(ready_body, 10)
        result.checks["readyz 200 degraded while down"] = bool(ready) and ready["status"] == "degraded" \
            and ready["dependencies"]["kb_index"]["mode"] == "lexical"
        customer = Customer(web.url, tally)
        sid = customer.new_session()
        replies = [customer.say(sid, q) for q in QUESTIONS]
        result.checks["degraded answers quote a cited excerpt"] = _degraded_answers_ok(replies)
        result.checks["every turn within 2 s"] = tally.slowest_s < 2.0
        human = customer.say(sid, "I want to talk to a human agent")
        result.checks["'talk to a human' still hands off"] = bool(human and human["handoff"])
        t0 = time.monotonic()
        comp = requests.post(f"{web.url}/v1/completions", headers=API_KEY, timeout=10,
                             json={"prompt": "def add(a, b):\n    return", "max_tokens": 8})
        tally.record(comp.status_code, comp.headers, time.monotonic() - t0)
        result.checks["completion empty with X-Inference-Degraded"] = comp.status_code == 200 and \
            comp.headers.get("X-Inference-Degraded") == "1" and comp.json()["choices"][0]["text"] == ""
        result.details["slowest_degraded_turn_s"] = round(tally.slowest_s, 3)
        back = service.start()
        result.recovery_s = time_to_full_answer(customer, sid, back)
        result.recovery_bound_s = WebApp.BREAKER_RESET_S + 5
        def ready_again():      # the full pipeline is rebuilt on a retry after the first full answer
            status, body = web.readyz()
            return status == 200 and body["status"] == "ready" and body["dependencies"]["kb_index"]["mode"] == "hybrid"
        result.checks["readyz ready after recovery"] = bool(wait_until(ready_again, 10))
        result.lost = lost_messages(customer, tally.accepted)
        return result.take(tally)
    finally:
        web.close()
        service.close()


FAULT_AFTER_S = 2.0     # into a streamed turn: the service is prefilling or generating its reply


def _streamed_turn(customer: Customer, sid: str, content: str, out: dict) -> None:
    """A streamed turn read to its end (on a thread): out gets status, headers, reply, ended."""
    resp = customer.http.post(f"{customer.base}/api/chat/sessions/{sid}/messages", headers=SITE_KEY, stream=True,
                              json={"content": content, "stream": True}, timeout=customer.timeout)
    reply = done_event(resp.iter_lines(decode_unicode=True)) if resp.status_code == 200 else \
        {"stream_error": resp.text[:200]}
    out.update(status=resp.status_code, headers=resp.headers, reply=reply, ended=time.monotonic())


def _fault_mid_stream(workdir: Path, service: InferenceService | None, name: str, fault: str, env: dict,
                      embedder=None) -> ScenarioResult:
    """A stream of the full pipeline is running when the service is SIGKILLed ("kill") or
    SIGSTOPped ("hang"). With `embedder`, KB_CACHE_DIR is filled first (a quick full build)."""
    result = ScenarioResult(name)
    if embedder is not None:
        result.details["cache_filled_s"] = fill_embedding_cache(workdir / "kb-cache", embedder)
    env = {**env, "TENANTS_PATH": str(_generating_tenants(workdir))}
    own = service is None
    service = service or InferenceService(SLOW_MODEL)
    tally = Tally()
    web = None
    try:
        if not service.alive():
            service.start()
        web = WebApp(workdir, service.url, **env)
        web.start()
        if not wait_until(lambda: web.readyz()[1]["status"] == "ready", 120):
            raise RuntimeError(f"the full pipeline never came up before the fault: {web.readyz()}")
        customer = Customer(web.url, tally)
        sid = customer.new_session()
        started, out = time.monotonic(), {}
        turn = threading.Thread(target=_streamed_turn, args=(customer, sid, "How long do refunds take?", out))
        turn.start()
        time.sleep(FAULT_AFTER_S)
        t_fault = time.monotonic()
        service.kill() if fault == "kill" else service.pause()
        turn.join(web.timeout_total_s + 30)
        reply, ended = out.get("reply", {"stream_error": "no answer"}), out.get("ended", time.monotonic())
        result.checks["the turn was still streaming at the fault"] = ended > t_fault
        tally.record(out.get("status", 0), out.get("headers", {}), ended - started)
        if "stream_error" not in reply:
            tally.accepted.append((sid, "How long do refunds take?"))
            tally.degraded += bool(reply.get("degraded"))
        result.details["stream_end_after_fault_s"] = round(ended - t_fault, 2)
        result.details["stream_held_s"] = round(ended - started, 2)
        result.checks["the open stream ends with a degraded done event"] = reply.get("degraded") is True
        during = [customer.say(sid, q) for q in QUESTIONS[1:5]]
        result.checks["later turns are degraded answers"] = _degraded_answers_ok(during)
        result.checks["no request held past TIMEOUT_TOTAL_S"] = tally.slowest_s <= web.timeout_total_s + 0.5
        deps = web.readyz()[1]["dependencies"]
        result.checks["the breaker opened"] = deps["inference_primary"]["breaker"] == "open"
        back = service.start() if fault == "kill" else (service.resume() or time.monotonic())
        result.recovery_s = time_to_full_answer(customer, sid, back)
        result.recovery_bound_s = WebApp.BREAKER_RESET_S + 5
        result.lost = lost_messages(customer, tally.accepted)
        return result.take(tally)
    finally:
        if web is not None:
            web.close()
        if own:
            service.close()
        elif service.alive():
            service.resume()


def _generating_tenants(workdir: Path) -> Path:
    """The shipped tenants with answer_mode free: the reply is generated, so a stream is open
    when the fault strikes (a quoted reply would be over before it)."""
    import yaml

    from configs import shipped
    data = yaml.safe_load(shipped("tenants.yaml").read_text(encoding="utf-8"))
    for spec in data["tenants"].values():
        spec["answer_mode"] = "free"
    path = workdir / "tenants-free.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


def killed_mid_stream(workdir: Path, service: InferenceService | None = None, embedder=None) -> ScenarioResult:
    """2. SIGKILL while a reply streams; later turns degraded; back when the service restarts."""
    return _fault_mid_stream(workdir, service, "2 inference killed (SIGKILL) mid-stream", "kill",
                             {"CHAT_MAX_TOKENS": "200"}, embedder)


def hung(workdir: Path, service: InferenceService | None = None, embedder=None) -> ScenarioResult:
    """3. SIGSTOP while a reply streams: the time-outs fire, no thread is held past the total.
    TIMEOUT_FIRST_TOKEN_S (3 s) is the longest silence between bytes; TIMEOUT_TOTAL_S (20 s)
    leaves a full 100-token reply of this model (~6 s alone) room when the service comes back."""
    return _fault_mid_stream(workdir, service, "3 inference hung (SIGSTOP)", "hang",
                             {"CHAT_MAX_TOKENS": "100", "TIMEOUT_FIRST_TOKEN_S": "3", "TIMEOUT_TOTAL_S": "20"},
                             embedder)


class FlakyEmbedder:
    """The real sentence embedder, made to raise inside embed while `failing` is set."""

    def __init__(self, real):
        self.real, self.failing = real, threading.Event()

    def embed(self, texts):
        if self.failing.is_set():
            raise RuntimeError("embedding model failed (fault injected)")
        return self.real.embed(texts)


def embeddings_failing(workdir: Path, embedder=None) -> ScenarioResult:
    """5. The embedding model raises, at boot and after the full pipeline was built: BM25-only
    retrieval, and still an answer (the web app in this process, served on loopback)."""
    from waitress.server import create_server

    from app import create_app
    from inference.embeddings import SentenceEmbedder
    from pipelines.inference_client import InProcessClient
    from pipelines.resilience import (
        BreakerPolicy,
        Endpoint,
        FallbackClient,
        make_breaker,
    )
    result = ScenarioResult("5 embedding model failing (raises in embed)")
    real = embedder or SentenceEmbedder()
    result.details["cache_filled_s"] = fill_embedding_cache(workdir / "kb-cache", real)
    flaky = FlakyEmbedder(real)
    engine = InProcessClient("random:tiny", dtype="float32", max_model_len=1024, kv_cache_memory_bytes=32 << 20)
    engine._embedder = flaky
    client = FallbackClient([Endpoint("primary", engine, make_breaker(
        "primary", BreakerPolicy(fail_max=2, reset_timeout_s=WebApp.BREAKER_RESET_S)))])
    app = create_app({"KB_CACHE_DIR": str(workdir / "kb-cache"), "REDIS_URL": None, "CHAT_MAX_TOKENS": 4,
                      "CHAT_BUILD_WAIT_S": 1.0, "CHAT_REBUILD_MAX_S": 1.0}, client=client)
    server = create_server(app, host="127.0.0.1", port=0, threads=8)
    threading.Thread(target=server.run, daemon=True).start()
    tally = Tally()
    try:
        customer = Customer(f"http://127.0.0.1:{server.effective_port}", tally)
        flaky.failing.set()                                      # failing from the start
        sid = customer.new_session()
        at_boot = [customer.say(sid, q) for q in QUESTIONS[:3]]
        result.checks["failing at boot: BM25 answers with a citation"] = _degraded_answers_ok(at_boot)
        flaky.failing.clear()
        first = time_to_full_answer(customer, sid, time.monotonic())
        flaky.failing.set()                                      # and again, after the full build
        later = [customer.say(sid, q) for q in QUESTIONS[3:]]
        result.checks["failing after the build: BM25 answers with a citation"] = _degraded_answers_ok(later)
        flaky.failing.clear()
        result.recovery_s = time_to_full_answer(customer, sid, time.monotonic())
        result.recovery_bound_s = WebApp.BREAKER_RESET_S + 5
        result.details["recovery_from_boot_s"] = first
        result.checks["recovered from the boot failure"] = first is not None and first <= result.recovery_bound_s
        result.lost = lost_messages(customer, tally.accepted)
        return result.take(tally)
    finally:
        server.close()
        client.close()
