"""Business hours and the email fallback: hours in a tenant's time zone; outside them a handoff
offers the email fallback at once, and the agent's later reply is mailed over SMTP to a real
server on loopback (aiosmtpd). An address that would add headers is refused."""
from __future__ import annotations

import datetime as dt
import time

import pytest
from aiosmtpd.controller import Controller

from app import create_app
from app.agent.accounts import AgentAccounts
from app.business_hours import parse_hours
from tests.helpers.net import free_port

UTC = dt.UTC
SHANGHAI = {"timezone": "Asia/Shanghai", "mon-fri": "09:00-18:00", "sat": ["10:00-12:00", "13:00-16:00"],
            "sun": "closed"}


def at(*args) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)


def test_hours_are_read_in_the_tenants_time_zone():
    hours = parse_hours(SHANGHAI, "tenants: 'x'")
    assert hours.is_open(at(2026, 12, 7, 2, 0))                    # Monday 10:00 in Shanghai
    assert not hours.is_open(at(2026, 12, 7, 10, 0))               # Monday 18:00: closed
    assert hours.next_open(at(2026, 12, 7, 10, 0)) == at(2026, 12, 8, 1, 0)
    assert not hours.is_open(at(2026, 12, 12, 4, 30))              # Saturday 12:30: the lunch break
    assert hours.next_open(at(2026, 12, 12, 4, 30)) == at(2026, 12, 12, 5, 0)
    assert hours.next_open(at(2026, 12, 13, 3, 0)) == at(2026, 12, 14, 1, 0)     # Sunday: Monday 09:00
    weekend = parse_hours({"timezone": "Europe/London", "fri-mon": "00:00-24:00"}, "t")
    assert weekend.is_open(at(2026, 12, 13, 23, 59)) and not weekend.is_open(at(2026, 12, 9, 12, 0))
    assert parse_hours(None, "t") is None
    assert parse_hours({"timezone": "UTC"}, "t").next_open(at(2026, 1, 1)) is None          # never open


@pytest.mark.parametrize("spec,why", [
    ({"mon": "09:00-17:00"}, "needs a timezone"), ({"timezone": "Mars/Olympus"}, "not an IANA"),
    ({"timezone": "UTC", "funday": "09:00-17:00"}, "mon..sun"), ({"timezone": "UTC", "mon": "9-5"}, "HH:MM"),
    ({"timezone": "UTC", "mon": "18:00-09:00"}, "start before"), ({"timezone": "UTC", "mon": "09:00-24:30"}, "24:00"),
])
def test_bad_hours_name_the_field(spec, why):
    with pytest.raises(ValueError, match=why):
        parse_hours(spec, "tenants: 'demo'")


class Inbox:
    def __init__(self):
        self.envelopes = []

    async def handle_DATA(self, server, session, envelope):
        self.envelopes.append(envelope)
        return "250 OK"


@pytest.fixture(scope="module")
def smtp():
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port())
    controller.start()
    yield controller, inbox
    controller.stop()


TENANTS = """tenants:
  demo:
    name: Northwind Goods
    site_key: demo-site-key
    allowed_origins: ["http://localhost:*"]
    system_prompt: You help Northwind customers.
    business_hours:
      timezone: Pacific/Kiritimati
      mon-sun: closed
"""
KEY = {"X-Site-Key": "demo-site-key"}
PASSWORD = "correct horse battery"


def mail_app(tiny_client, tmp_path, controller, delay_s: float):
    (tmp_path / "tenants.yaml").write_text(TENANTS, encoding="utf-8")
    app = create_app({"TENANTS_PATH": str(tmp_path / "tenants.yaml"), "KB_CACHE_DIR": str(tmp_path / "kbcache"),
                      "CHAT_MAX_TOKENS": 16, "REDIS_URL": None, "FAQ_PATH": str(tmp_path / "faq"),
                      "DATABASE_URL": f"sqlite:///{tmp_path / 'conversations.db'}",
                      "SMTP_HOST": controller.hostname, "SMTP_PORT": controller.port,
                      "SMTP_FROM": "help@northwind.test", "EMAIL_REPLY_DELAY_S": delay_s}, client=tiny_client)
    AgentAccounts(app.extensions["db"]).add("demo", "dana@northwind.test", PASSWORD, name="Dana")
    return app


def agent(app):
    dana = app.test_client()
    dana.csrf = {"X-CSRF-Token": dana.post("/api/agent/login", json={"email": "dana@northwind.test",
                                                                      "password": PASSWORD}).get_json()["csrf_token"]}
    return dana


def wait_for(inbox, count: int, to: str = "me@example.org", timeout_s: float = 20.0) -> list:
    """The envelopes to `to`, once there are `count` of them (or at the timeout)."""
    deadline = time.monotonic() + timeout_s
    while len(mailed := [e for e in inbox.envelopes if e.rcpt_tos == [to]]) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return mailed


def test_outside_hours_the_handoff_takes_an_email_and_the_reply_is_mailed(tiny_client, tmp_path, smtp):
    controller, inbox = smtp
    inbox.envelopes.clear()
    app = mail_app(tiny_client, tmp_path, controller, delay_s=0.0)
    customer = app.test_client()
    sid = customer.post("/api/chat/sessions", headers=KEY).get_json()["session_id"]
    customer.post(f"/api/chat/sessions/{sid}/messages", headers=KEY, json={"content": "Can I change my address?"})
    handoff = customer.post(f"/api/chat/sessions/{sid}/handoff", headers=KEY).get_json()
    waiting = handoff["waiting"]
    assert waiting["outside_hours"] is True and waiting["offer_email"] is True and waiting["opens_at"] is None
    for bad in ("me@example.org\r\nBcc: spy@evil.test", "me@example.org>, spy@evil.test", "me@example.org\nX: y",
                "<me@example.org>", "me@@example.org"):
        resp = customer.post(f"/api/chat/sessions/{sid}/contact", headers=KEY, json={"email": bad})
        assert resp.status_code == 400 and "email" in resp.get_json()["error"], bad
    assert customer.post(f"/api/chat/sessions/{sid}/contact", headers=KEY,
                         json={"email": "Me@Example.org"}).status_code == 200

    dana = agent(app)
    csrf = dana.csrf
    dana.post(f"/api/agent/conversations/{sid}/claim", headers=csrf)
    sent = dana.post(f"/api/agent/conversations/{sid}/messages", headers=csrf,
                     json={"content": "Yes: change it in My Orders until the order ships."})
    assert sent.status_code == 201
    wait_for(inbox, 1)
    assert len(inbox.envelopes) == 1
    envelope = inbox.envelopes[0]
    assert envelope.rcpt_tos == ["me@example.org"] and envelope.mail_from == "help@northwind.test"
    text = envelope.content.decode()
    assert "Subject: Re: your question to Northwind Goods" in text
    assert "change it in My Orders until the order ships" in text and "Can I change my address?" in text
    assert "Dana (Northwind Goods support) replied" in text

    controller_port, app.config["SMTP_PORT"] = app.config["SMTP_PORT"], free_port()     # the mail server is down
    try:
        down = dana.post(f"/api/agent/conversations/{sid}/messages", headers=csrf, json={"content": "One more."})
        assert down.status_code == 201                            # the reply is stored and shown; mail retries
    finally:
        app.config["SMTP_PORT"] = controller_port


def test_replies_seen_in_the_widget_are_not_mailed_and_a_burst_is_one_email(tiny_client, tmp_path, smtp):
    """EMAIL_REPLY_DELAY_S after a reply: what the customer saw in the widget (POST .../seen) is not
    mailed; three replies in a row go out as one email holding all three."""
    controller, inbox = smtp
    app = mail_app(tiny_client, tmp_path, controller, delay_s=0.5)
    customer = app.test_client()
    sid = customer.post("/api/chat/sessions", headers=KEY).get_json()["session_id"]
    customer.post(f"/api/chat/sessions/{sid}/messages", headers=KEY, json={"content": "Where is my parcel?"})
    customer.post(f"/api/chat/sessions/{sid}/handoff", headers=KEY)
    assert customer.post(f"/api/chat/sessions/{sid}/contact", headers=KEY,
                         json={"email": "burst@example.org"}).status_code == 200
    for bad in ({"index": -1}, {"index": "three"}, {}, {"index": 1.5}):
        resp = customer.post(f"/api/chat/sessions/{sid}/seen", headers=KEY, json=bad)
        assert resp.status_code == 400 and "error" in resp.get_json(), bad
    dana = agent(app)
    dana.post(f"/api/agent/conversations/{sid}/claim", headers=dana.csrf)

    read = dana.post(f"/api/agent/conversations/{sid}/messages", headers=dana.csrf,
                     json={"content": "It left the depot this morning."}).get_json()["message"]
    assert customer.post(f"/api/chat/sessions/{sid}/seen", headers=KEY,
                         json={"index": read["index"]}).status_code == 200
    time.sleep(1.5)                                   # past the delay: the seen reply is not mailed
    assert wait_for(inbox, 0, "burst@example.org") == []

    for text in ("Tracking code NW-4471.", "It should arrive tomorrow.", "Anything else?"):
        dana.post(f"/api/agent/conversations/{sid}/messages", headers=dana.csrf, json={"content": text})
    wait_for(inbox, 1, "burst@example.org")
    time.sleep(1.0)                                   # no second email follows
    mailed = wait_for(inbox, 1, "burst@example.org")
    assert len(mailed) == 1
    text = mailed[0].content.decode()
    assert "NW-4471" in text and "arrive tomorrow" in text and "Anything else?" in text
    assert "left the depot" not in text and "Where is my parcel?" in text
