"""Webhooks end to end through the app: an agent subscribes a real HTTP receiver on loopback
(allow-listed), the conversation's events arrive signed, a failed attempt is retried, every
attempt is in the delivery log; unsafe URLs and bad input get a 400, and a receiver that hangs
never holds up a chat turn."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from app.store.handoffs import NotFound
from app.store.webhooks import MAX_WEBHOOKS, TooMany, WebhookStore
from httpkit import webhooks
from httpkit.webhooks import UnsafeURL, check, check_url, deliver, signature, verify
from tests.app.test_chat_api import TENANTS
from tests.helpers.agent_app import agent_app, signed_in
from tests.helpers.databases import BACKENDS, migrated_database

KEY = {"X-Site-Key": "demo-site-key"}
EVENTS = ["conversation.created", "message.created", "handoff.requested", "conversation.resolved", "csat.submitted"]


class Receiver:
    """A webhook endpoint: the first attempt of each delivery gets a 500, the next a 200; with
    `hold` set, requests wait until it is cleared (a hanging receiver)."""

    def __init__(self):
        self.received: list[tuple[dict, bytes, dict]] = []       # (headers, body, parsed), 2xx answered
        self.attempts: dict[str, int] = {}
        self.hold = threading.Event()
        self.held = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if receiver.hold.is_set():
                    receiver.held.set()
                    while receiver.hold.is_set():
                        time.sleep(0.05)
                delivery = self.headers["X-Webhook-Delivery"]
                receiver.attempts[delivery] = receiver.attempts.get(delivery, 0) + 1
                status = 500 if receiver.attempts[delivery] == 1 else 200
                if status == 200:
                    receiver.received.append((dict(self.headers), body, json.loads(body)))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/support"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self) -> list[str]:
        return [p["event"] for _h, _b, p in self.received]


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    yield r
    r.hold.clear()
    r.server.shutdown()


@pytest.fixture(scope="module")
def app(tiny_client, tmp_path_factory):
    return agent_app(tiny_client, tmp_path_factory.mktemp("webhooks"), TENANTS, WEBHOOK_ALLOW_HOSTS="127.0.0.1",
                     WEBHOOK_RETRY_BASE_S=0.05, WEBHOOK_TIMEOUT_S=10.0)


@pytest.mark.parametrize("url,why", [
    ("ftp://example.com/hook", "scheme"), ("http://127.0.0.1:9/x", "private or reserved"),
    ("http://localhost/x", "private or reserved"), ("http://10.1.2.3/x", "private or reserved"),
    ("http://169.254.169.254/latest/meta-data", "private or reserved"), ("http://[::1]/x", "private or reserved"),
    ("http://[::ffff:192.168.0.1]/x", "private or reserved"), ("http://100.64.0.1/x", "private or reserved"),
    ("http://0.0.0.0/x", "private or reserved"), ("http://user:pw@93.184.216.34/x", "user name"),
    ("http:///nohost", "no host"), ("http://93.184.216.34:99999/x", "port"),
])
def test_unsafe_urls_are_refused(url, why):
    with pytest.raises(UnsafeURL, match=why):
        check_url(url)


def test_allow_list_and_public_addresses_pass():
    assert check_url("https://93.184.216.34/hook") == "https://93.184.216.34/hook"
    assert check_url("http://127.0.0.1:8080/x", allow=["127.0.0.1"])
    assert check_url("http://10.1.2.3/x", allow=["10.0.0.0/8"])
    with pytest.raises(UnsafeURL):
        check_url("http://10.1.2.3/x", allow=["192.168.0.0/16"])


def test_the_request_goes_to_the_checked_address_with_the_urls_host():
    target = check("https://93.184.216.34:8443/hook?x=1")
    assert target.pinned() == ("https://93.184.216.34:8443/hook?x=1", {"Host": "93.184.216.34:8443"},
                               {"sni_hostname": "93.184.216.34"})
    v6 = webhooks.Target("http://hooks.example.test/a", webhooks.ipaddress.ip_address("2606:2800:220:1::1"))
    assert v6.pinned() == ("http://[2606:2800:220:1::1]/a", {"Host": "hooks.example.test"}, {})


def test_a_name_that_rebinds_after_the_check_is_still_called_at_the_checked_address(monkeypatch):
    """DNS rebinding: the name answers an allowed address to the check, then another to any later
    lookup. The attempt must reach the checked address (the receiver), with the URL's Host."""
    lookups = []
    real = webhooks.socket.getaddrinfo

    def rebinding(host, port, *args, **kwargs):
        lookups.append(host)
        if host == "hooks.rebind.test":
            address = "127.0.0.1" if len(lookups) == 1 else "127.0.0.2"
            return real(address, port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(webhooks.socket, "getaddrinfo", rebinding)
    receiver = Receiver()
    port, delivery = receiver.server.server_port, "rebind-1"
    receiver.attempts[delivery] = 1                       # answered 200 at once
    try:
        attempt = deliver(f"http://hooks.rebind.test:{port}/hooks/support", "whsec_x", "message.created", delivery,
                          b'{"event": "message.created"}', allow=["127.0.0.1/32"], timeout_s=5.0)
    finally:
        receiver.server.shutdown()
    assert attempt.ok, attempt
    headers = next(h for h, _b, _p in receiver.received if h["X-Webhook-Delivery"] == delivery)
    assert headers["Host"] == f"hooks.rebind.test:{port}"
    assert lookups.count("hooks.rebind.test") == 1


def test_signatures_verify_and_reject_tampering_and_replays():
    now = int(time.time())
    header = signature("whsec_x", now, b'{"a":1}')
    assert verify("whsec_x", header, b'{"a":1}')
    assert not verify("whsec_x", header, b'{"a":2}')
    assert not verify("whsec_y", header, b'{"a":1}')
    assert not verify("whsec_x", signature("whsec_x", now - 3600, b"{}"), b"{}")
    assert not verify("whsec_x", "garbage", b"{}")


def test_a_conversations_events_arrive_signed_retried_and_logged(app, receiver):
    dana, olga, customer = signed_in(app, "dana@northwind.test"), signed_in(app, "olga@other.test"), app.test_client()
    for body, why in [({"url": "http://192.168.1.10/x", "events": EVENTS}, "private"),
                      ({"url": receiver.url, "events": []}, "events"),
                      ({"url": receiver.url, "events": ["message.deleted"]}, "events"),
                      ({"url": "gopher://x", "events": EVENTS}, "scheme"), ({"events": EVENTS}, "url")]:
        resp = dana.post("/api/agent/webhooks", headers=dana.csrf, json=body)
        assert resp.status_code == 400 and why in resp.get_json()["error"], (body, resp.get_json())
    assert dana.post("/api/agent/webhooks", json={"url": receiver.url, "events": EVENTS}).status_code == 400  # CSRF
    assert dana.get("/api/agent/webhooks").get_json()["webhooks"] == []
    created = dana.post("/api/agent/webhooks", headers=dana.csrf, json={"url": receiver.url, "events": EVENTS})
    assert created.status_code == 201
    hook = created.get_json()
    secret = hook["secret"]
    listed = dana.get("/api/agent/webhooks").get_json()["webhooks"]
    assert listed[0]["id"] == hook["id"] and "secret" not in listed[0] and listed[0]["secret_hint"] == "…" + secret[-4:]

    sid = customer.post("/api/chat/sessions", headers=KEY).get_json()["session_id"]
    customer.post(f"/api/chat/sessions/{sid}/messages", headers=KEY, json={"content": "How long do refunds take?"})
    customer.post(f"/api/chat/sessions/{sid}/handoff", headers=KEY)
    dana.post(f"/api/agent/conversations/{sid}/claim", headers=dana.csrf)
    dana.post(f"/api/agent/conversations/{sid}/messages", headers=dana.csrf, json={"content": "Refunds take 5 days."})
    dana.post(f"/api/agent/conversations/{sid}/resolve", headers=dana.csrf)
    customer.post(f"/api/chat/sessions/{sid}/csat", headers=KEY, json={"rating": 4, "comment": "ok"})

    expected = ["conversation.created", "message.created", "message.created", "handoff.requested", "message.created",
                "conversation.resolved", "csat.submitted"]
    deadline = time.monotonic() + 30
    while sorted(receiver.events()) != sorted(expected) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sorted(receiver.events()) == sorted(expected)
    for headers, body, payload in receiver.received:
        assert verify(secret, headers["X-Webhook-Signature"], body)
        assert headers["X-Webhook-Event"] == payload["event"] and payload["data"]["conversation_id"] == sid
        assert payload["id"] == headers["X-Webhook-Delivery"] and payload["tenant"] == "demo"
    roles = sorted(p["data"]["message"]["role"] for _h, _b, p in receiver.received if p["event"] == "message.created")
    assert roles == ["agent", "assistant", "user"]
    csat = next(p for _h, _b, p in receiver.received if p["event"] == "csat.submitted")
    assert csat["data"]["rating"] == 4

    log = dana.get(f"/api/agent/webhooks/{hook['id']}/deliveries").get_json()["deliveries"]
    assert len(log) == 7 and all(d["status"] == "delivered" and d["attempts"] == 2 for d in log)
    assert all(d["last_status_code"] == 200 for d in log)
    assert olga.get(f"/api/agent/webhooks/{hook['id']}/deliveries").status_code == 404     # another tenant's
    assert dana.get(f"/api/agent/webhooks/{hook['id']}/deliveries?limit=0").status_code == 400

    # a receiver that hangs: the chat turn answers while the delivery still waits
    receiver.hold.set()
    try:
        turn = customer.post(f"/api/chat/sessions/{sid}/messages", headers=KEY, json={"content": "one more thing"})
        assert turn.status_code == 200 and turn.get_json()["reply"]
        assert receiver.held.wait(10)
        assert receiver.hold.is_set()                      # the delivery is still held by the receiver
    finally:
        receiver.hold.clear()
    assert olga.delete(f"/api/agent/webhooks/{hook['id']}", headers=olga.csrf).status_code == 404
    assert dana.delete(f"/api/agent/webhooks/{hook['id']}", headers=dana.csrf).get_json() == {"ok": True}
    assert dana.get(f"/api/agent/webhooks/{hook['id']}/deliveries").status_code == 404


@pytest.fixture(params=BACKENDS)
def db(request, tmp_path):
    with migrated_database(request.param, tmp_path) as database:
        yield database


def test_the_webhook_store_on_both_databases(db):
    """Subscriptions per tenant and event, and the delivery log's states, on SQLite and PostgreSQL."""
    store = WebhookStore(db, cache_s=0.0)
    hook = store.add("demo", "https://93.184.216.34/hook", ["message.created", "csat.submitted"])
    assert hook["secret"].startswith("whsec_") and "secret" not in store.list("demo")[0]
    assert [s[0] for s in store.subscribers("demo", "csat.submitted")] == [hook["id"]]
    assert store.subscribers("demo", "handoff.requested") == [] and store.subscribers("other", "csat.submitted") == []
    delivery = store.enqueue(hook["id"], "csat.submitted", {"data": {"rating": 5}})
    store.record(delivery, ok=False, final=False, status_code=500, error="HTTP 500")
    found, url, secret = store.delivery(delivery)
    assert found["status"] == "pending" and found["attempts"] == 1
    assert url.endswith("/hook") and secret == hook["secret"]
    store.record(delivery, ok=True, final=False, status_code=200, error="")
    log = store.deliveries("demo", hook["id"])
    assert log[0]["status"] == "delivered" and log[0]["attempts"] == 2 and log[0]["finished_at"]
    with pytest.raises(NotFound):
        store.deliveries("other", hook["id"])
    for _ in range(MAX_WEBHOOKS - 1):
        store.add("demo", "https://93.184.216.34/more", ["message.created"])
    with pytest.raises(TooMany):
        store.add("demo", "https://93.184.216.34/one-too-many", ["message.created"])
    store.remove("demo", hook["id"])
    assert store.delivery(delivery) is None                                  # the log goes with it
