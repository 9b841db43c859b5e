"""Human handoff end to end in a real headless Chromium: a customer in the chat widget and a
support agent in the console at /agent/, two browser contexts against one `python -m app serve`
(tiny random model, in-process store and events, SQLite in the test's tmp folder).

1. the customer asks the bot, then asks for a human; the agent, signed in beforehand, sees the
   handoff appear live in the Waiting tab (no reload); the customer writes again while waiting
   (queue place, then the "leave your email" / "back to the assistant" offers) and leaves an email
2. the agent opens the conversation (bot citations as links, contact email), claims it with the
   `c` shortcut (the assistant's suggested draft loads, marked as one), types (the customer sees
   "Dana is typing…") and sends with Ctrl+Enter
3. the customer sees the reply live, with the agent's name, and still after a reload
4. the agent resolves; the customer rates 5 stars with a comment; the agent's view shows it; the
   bot answers the customer again; reports, knowledge gaps, shortcuts help and Chinese in the console

Screenshots of both contexts at each step go to test-artifacts/agent-console/ (git-ignored).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.helpers.app_server import app_env, serving
from tests.helpers.paths import REPO_ROOT

CHROMIUM = "/usr/bin/chromium"
SITE_KEY = "demo-site-key"
AGENT_EMAIL = "dana@example.com"
AGENT_NAME = "Dana"
AGENT_PASSWORD = "correct horse battery staple"
CUSTOMER_EMAIL = "customer@example.org"
QUESTION = "How long do refunds take?"
FOLLOW_UP = "Can I return an item that arrived damaged?"
REPLY = "Hi, this is Dana. Yes: damaged items can be returned for free."
COMMENT = "Dana sorted it out quickly"
ARTIFACTS = REPO_ROOT / "test-artifacts" / "agent-console"
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--no-first-run"]

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no Chromium at {CHROMIUM}")


def _server_env(tmp) -> dict:
    return app_env(tmp, MODEL="random:tiny", CHAT_MAX_TOKENS="48",
                   HANDOFF_WAIT_S="2",       # the email / back-to-the-bot offers come after 2 s of waiting
                   WEBHOOK_ALLOW_HOSTS="127.0.0.1")       # the webhook test's receiver listens on loopback


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Base URL of `python -m app serve` with one agent (added with `python -m app agents add`)."""
    tmp = tmp_path_factory.mktemp("agent-console")
    env = _server_env(tmp)
    with serving(tmp, env) as base:
        add = [sys.executable, "-m", "app", "agents", "add", "--tenant", "demo", "--email", AGENT_EMAIL,
               "--name", AGENT_NAME, "--password-stdin"]
        added = subprocess.run(add, input=AGENT_PASSWORD + "\n", text=True, cwd=REPO_ROOT, env=env,
                               capture_output=True, timeout=120)
        assert added.returncode == 0, f"agents add failed: {added.stdout}\n{added.stderr}"
        yield base


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright
    pw = sync_playwright().start()
    chromium = None
    try:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, timeout=30_000, args=LAUNCH_ARGS)
        yield chromium
    finally:
        if chromium is not None:
            chromium.close()
        pw.stop()


def _page(browser, server, **kw):
    context = browser.new_context(base_url=server, **{"locale": "en-US", **kw})
    context.set_default_timeout(15_000)
    context.set_default_navigation_timeout(15_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    # the console's Content-Security-Policy allows only its own scripts and styles: a violation
    # (an inline style or script slipping in) is logged, not thrown
    page.on("console", lambda msg: errors.append(msg.text) if "Content Security Policy" in msg.text else None)
    return page, errors


def test_handoff_between_widget_and_agent_console(server, browser):
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob("*.png"):
        old.unlink()
    customer, customer_errors = _page(browser, server, viewport={"width": 900, "height": 760})
    agent, agent_errors = _page(browser, server, viewport={"width": 1360, "height": 860})

    def snap(step: str) -> None:
        customer.screenshot(path=str(ARTIFACTS / f"{step}-customer.png"))
        agent.screenshot(path=str(ARTIFACTS / f"{step}-agent.png"))

    w = lambda testid: customer.locator(f"[data-testid={testid}]")  # noqa: E731  (pierces the shadow root)
    a = lambda testid: agent.locator(f"[data-testid={testid}]")     # noqa: E731

    # --- the customer asks the bot first (the first turn loads the embedder and the engine)
    customer.goto("/")
    w("nw-launcher").click()
    w("nw-input").fill(QUESTION)
    w("nw-send").click()
    expect(customer.locator("[data-role=assistant] [data-testid=nw-feedback-up]")).to_be_visible(timeout=60_000)
    customer.locator("[data-role=assistant] [data-testid=nw-feedback-up]").click()
    expect(customer.locator("[data-role=assistant] .nw-thanks")).to_have_text("Thanks")

    # --- the agent signs in (the page shows the login form on the session check's 401)
    agent.goto("/agent/")
    expect(a("login-email")).to_be_visible()
    a("login-email").fill(AGENT_EMAIL)
    a("login-password").fill("not the password")
    a("login-submit").click()
    expect(a("login-error")).not_to_be_empty()
    a("login-password").fill(AGENT_PASSWORD)
    a("login-submit").click()
    expect(a("agent-name")).to_contain_text(AGENT_NAME)
    expect(a("tab-pending_human")).to_have_attribute("aria-selected", "true")
    expect(a("live-status")).to_have_text("Live")
    expect(a("inbox-item")).to_have_count(0)
    agent.evaluate("() => { window.__sameDocument = true; }")     # gone if the page reloads
    snap("01-signed-in")

    # --- 1. the customer asks for a human: the handoff appears in the Waiting tab, live
    w("nw-handoff").click()
    expect(w("nw-handoff")).to_have_text("Human requested")
    item = a("inbox-item")
    expect(item).to_have_count(1, timeout=10_000)
    expect(item).to_have_attribute("data-status", "pending_human")
    expect(a("count-pending_human")).to_have_text("1")
    expect(item.locator("[data-testid=unread]")).to_have_count(1)
    assert agent.evaluate("() => window.__sameDocument === true"), "the console reloaded"
    snap("02-handoff-live")

    # --- the customer writes while waiting: no bot reply, a queue place, then the offers
    time.sleep(2.2)                                   # past HANDOFF_WAIT_S
    w("nw-input").fill(FOLLOW_UP)
    w("nw-send").click()
    expect(customer.locator("[data-testid=nw-message][data-role=user]")).to_have_count(2)
    expect(w("nw-waiting-text")).to_contain_text("number 1 in the queue")
    expect(w("nw-offer-bot")).to_be_visible()
    w("nw-offer-email").click()
    w("nw-email").fill(CUSTOMER_EMAIL)
    w("nw-email-send").click()
    expect(w("nw-email-status")).to_contain_text("Thanks")
    expect(customer.locator("[data-testid=nw-message][data-role=assistant]")).to_have_count(1)
    expect(item.locator(".item-last, .item-title").last).to_contain_text("damaged")    # the message event
    snap("03-waiting")

    # --- 2. the agent opens it, claims it (c), gets the suggested draft, types, sends (Ctrl+Enter)
    item.click()
    transcript = a("transcript")
    expect(transcript.locator("[data-testid=message]")).to_have_count(3)
    expect(transcript.locator("[data-role=assistant] a[data-testid=citation]").first).to_be_visible()
    href = transcript.locator("[data-role=assistant] a[data-testid=citation]").first.get_attribute("href")
    assert href and href.startswith(server + "/kb/"), href
    expect(a("conv-contact")).to_contain_text(CUSTOMER_EMAIL)
    expect(a("feedback-item")).to_have_attribute("data-rating", "up")          # the thumbs up on the bot reply
    expect(a("conv-status")).to_have_text("Waiting for an agent")
    expect(a("reply-send")).to_be_disabled()
    item.focus()
    agent.keyboard.press("c")
    expect(a("conv-status")).to_have_text("With an agent")
    expect(a("claim")).to_have_text("Claimed")
    expect(a("tab-human")).to_have_attribute("aria-selected", "true")     # the list follows the claim
    expect(item).to_have_attribute("aria-current", "true")
    expect(a("reply-input")).to_be_focused()
    expect(a("suggestion-note")).to_be_visible(timeout=30_000)
    expect(a("suggestion-note")).to_contain_text("Suggested by the assistant")
    assert a("reply-input").input_value().strip(), "the suggested draft is not in the reply box"
    expect(customer.locator("[data-testid=nw-notice]").last).to_have_text(f"{AGENT_NAME} joined the conversation")
    expect(w("nw-waiting")).to_be_hidden()
    snap("04-claimed")

    a("reply-input").fill("")
    expect(a("suggestion-note")).to_be_hidden()
    a("reply-input").press_sequentially(REPLY[:20], delay=15)
    expect(w("nw-agent-typing")).to_contain_text(f"{AGENT_NAME} is typing", timeout=5_000)
    snap("05-typing")
    a("reply-input").press_sequentially(REPLY[20:], delay=2)
    expect(a("conv-status")).to_have_text("With an agent")    # the "e", "c", "r" typed fired no shortcut
    sent_at = time.monotonic()
    a("reply-input").press("Control+Enter")
    expect(transcript.locator("[data-role=agent]")).to_have_count(1)
    expect(transcript.locator("[data-role=agent]")).to_contain_text(REPLY)
    expect(a("reply-input")).to_have_value("")

    # --- 3. the customer sees it live, with the agent's name
    agent_msg = customer.locator("[data-testid=nw-message][data-role=agent]")
    expect(agent_msg).to_have_count(1, timeout=5_000)
    print(f"agent reply reached the widget in {time.monotonic() - sent_at:.2f} s")
    expect(agent_msg.locator("[data-testid=nw-agent-name]")).to_have_text(f"{AGENT_NAME} (support)")
    expect(agent_msg).to_contain_text(REPLY)
    expect(w("nw-agent-typing")).to_have_count(0)
    snap("06-reply")

    # --- a reload keeps the agent's message (and its name) and listens again
    customer.reload()
    w("nw-launcher").click()
    expect(agent_msg).to_have_count(1)
    expect(agent_msg.locator("[data-testid=nw-agent-name]")).to_have_text(f"{AGENT_NAME} (support)")
    expect(customer.locator("[data-testid=nw-notice]", has_text="joined the conversation")).to_have_count(0)
    expect(w("nw-handoff")).to_be_disabled()

    # --- 4. resolve; the customer rates 5 with a comment; the agent's view shows the rating
    a("resolve").click()
    expect(a("conv-status")).to_have_text("Resolved")
    expect(w("nw-csat")).to_be_visible(timeout=5_000)
    w("nw-csat-submit").click()
    expect(w("nw-csat")).to_contain_text("Choose a rating first")
    w("nw-csat-5").click()
    expect(w("nw-csat-5")).to_have_attribute("aria-pressed", "true")
    w("nw-csat-comment").fill(COMMENT)
    snap("07-rating")
    w("nw-csat-submit").click()
    expect(w("nw-csat-thanks")).to_have_text("Thanks for your rating")
    expect(w("nw-handoff")).to_be_enabled()
    csat = a("csat")
    expect(csat).to_have_count(1, timeout=20_000)            # the view looks again while resolved
    expect(csat).to_have_attribute("data-rating", "5")
    expect(csat.locator("[data-testid=csat-comment]")).to_have_text(COMMENT)
    a("tab-resolved").click()
    expect(a("inbox-item")).to_have_count(1)
    snap("08-rated")

    # --- after the resolve, the bot answers the customer again
    w("nw-input").fill("Do you ship internationally?")
    w("nw-send").click()
    expect(customer.locator("[data-role=assistant] [data-testid=nw-feedback-up]")).to_have_count(2, timeout=30_000)

    # --- a second handoff, given up on: "Go back to the assistant" after the wait
    a("tab-pending_human").click()
    w("nw-handoff").click()
    expect(a("inbox-item")).to_have_count(1, timeout=10_000)
    time.sleep(2.2)
    w("nw-input").fill("Still there?")
    w("nw-send").click()
    expect(w("nw-offer-bot")).to_be_visible()
    w("nw-offer-bot").click()
    expect(customer.locator("[data-testid=nw-notice]").last).to_contain_text("back with the assistant")
    expect(w("nw-waiting")).to_be_hidden()
    expect(w("nw-handoff")).to_be_enabled()
    expect(a("inbox-item")).to_have_count(0, timeout=10_000)                  # the status event

    # --- reports, the shortcuts help, and the console in Chinese
    a("reports-tab").click()
    expect(a("report-conversations")).to_contain_text("1")
    expect(a("report-resolution_rate")).to_contain_text("%")          # the conversation came back: reopened
    expect(a("reports-bars")).to_be_visible()
    agent.keyboard.press("6")                        # knowledge gaps: the questions asked before each handoff
    expect(a("gaps-tab")).to_have_attribute("aria-selected", "true")
    expect(a("gap-row").first).to_be_visible()
    expect(a("gaps-summary")).to_contain_text("questions the help centre fell short on")
    expect(a("gaps-table")).to_contain_text("handed to an agent")
    assert "from=" in a("gaps-csv").get_attribute("href")
    snap("09-gaps")
    a("reports-tab").click()
    agent.keyboard.press("?")
    expect(a("shortcuts-dialog")).to_be_visible()
    snap("09-reports")
    agent.keyboard.press("Escape")
    expect(a("shortcuts-dialog")).to_be_hidden()
    expect(a("lang-toggle").locator("svg.icon")).to_have_count(1)           # a globe drawn inline, not an emoji
    expect(a("lang-toggle")).to_have_accessible_name("切换到中文")
    a("lang-toggle").click()
    expect(a("tab-pending_human")).to_contain_text("等待中")
    expect(a("report-conversations")).to_contain_text("对话数")
    assert "lang=zh" in agent.url
    agent.goto("/agent/?lang=zh")
    expect(a("tab-resolved")).to_contain_text("已解决")
    expect(a("agent-name")).to_contain_text(AGENT_NAME)              # the session survived the reload
    snap("10-chinese")
    a("logout").click()
    expect(a("login-email")).to_be_visible()
    agent.reload()
    expect(a("login-email")).to_be_visible()

    # --- a browser whose language is Chinese gets the console in Chinese
    zh, zh_errors = _page(browser, server, locale="zh-CN")
    zh.goto("/agent/")
    expect(zh.locator("[data-testid=login-submit]")).to_have_text("登录")
    expect(zh.locator("html")).to_have_attribute("lang", "zh-CN")
    zh.screenshot(path=str(ARTIFACTS / "11-login-zh.png"))
    assert zh_errors == [], zh_errors

    assert customer_errors == [], customer_errors
    assert agent_errors == [], agent_errors


GAP_QUESTION = "Can you engrave a name on a wooden cutting board?"
GAP_ANSWER = "We engrave up to 20 characters on any wooden cutting board, at no extra cost."


def test_the_faq_loop_from_a_gap_to_the_bots_answer(server, browser):
    """The help centre has no answer: the question shows as a knowledge gap; the customer asks for a
    human, the agent answers and resolves; the FAQ draft appears, the agent edits and approves it;
    a new customer asking the same gets the answer from the bot."""
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    customer, customer_errors = _page(browser, server, viewport={"width": 900, "height": 760})
    agent, agent_errors = _page(browser, server, viewport={"width": 1360, "height": 860})
    w = lambda testid: customer.locator(f"[data-testid={testid}]")  # noqa: E731
    a = lambda testid: agent.locator(f"[data-testid={testid}]")     # noqa: E731

    customer.goto("/")
    w("nw-launcher").click()
    w("nw-input").fill(GAP_QUESTION)
    w("nw-send").click()
    expect(customer.locator("[data-testid=nw-message][data-role=assistant]")).to_have_count(1, timeout=60_000)
    assert "20 characters" not in customer.locator("[data-role=assistant]").last.inner_text()
    w("nw-handoff").click()
    expect(w("nw-handoff")).to_have_text("Human requested")

    agent.goto("/agent/")
    a("login-email").fill(AGENT_EMAIL)
    a("login-password").fill(AGENT_PASSWORD)
    a("login-submit").click()
    expect(a("agent-name")).to_contain_text(AGENT_NAME)
    a("gaps-tab").click()                                            # the gap: asked, then handed off
    expect(a("gaps-table")).to_contain_text(GAP_QUESTION)
    a("tab-pending_human").click()
    item = a("inbox-item").filter(has_text="engrave")
    expect(item).to_have_count(1, timeout=10_000)
    item.click()
    a("claim").click()
    expect(a("conv-status")).to_have_text("With an agent")
    a("reply-input").fill(f"Hi, {AGENT_NAME} here. {GAP_ANSWER}")
    a("reply-input").press("Control+Enter")
    expect(customer.locator("[data-testid=nw-message][data-role=agent]")).to_contain_text(GAP_ANSWER)
    a("resolve").click()
    expect(a("conv-status")).to_have_text("Resolved")

    agent.keyboard.press("7")                                        # the FAQ drafts tab
    draft = None
    for _ in range(60):                                              # the draft task runs after the resolve
        answers = [a("faq-answer").nth(i).input_value() for i in range(a("faq-answer").count())]
        found = [i for i, text in enumerate(answers) if "20 characters" in text]
        if found:
            draft = a("faq-draft").nth(found[0])
            break
        time.sleep(1)
        a("faq-tab").click()
    assert draft is not None, "no FAQ draft from the agent's answer"
    assert AGENT_NAME not in draft.locator("[data-testid=faq-answer]").input_value()
    draft.locator("[data-testid=faq-question]").fill("Can you engrave a cutting board?")
    agent.screenshot(path=str(ARTIFACTS / "12-faq-draft-agent.png"))
    approved_at = time.monotonic()
    draft.locator("[data-testid=faq-approve]").click()
    expect(a("faq-announce")).to_have_text("Published to the help centre")
    expect(a("faq-answer").filter(has_text="20 characters")).to_have_count(0)

    asker, asker_errors = _page(browser, server, viewport={"width": 900, "height": 760})
    asker.goto("/")
    asker.locator("[data-testid=nw-launcher]").click()
    answered = None
    for attempt in range(20):                                        # the index picks the article up in seconds
        asker.locator("[data-testid=nw-input]").fill(GAP_QUESTION)
        asker.locator("[data-testid=nw-send]").click()
        replies = asker.locator("[data-testid=nw-message][data-role=assistant]")
        expect(replies).to_have_count(attempt + 1, timeout=30_000)
        if "20 characters" in replies.last.inner_text():
            answered = time.monotonic() - approved_at
            break
        time.sleep(1)
    assert answered is not None, "the bot never answered from the approved FAQ"
    print(f"approved FAQ used by the bot {answered:.1f} s after approval")
    asker.screenshot(path=str(ARTIFACTS / "13-faq-answer-customer.png"))
    assert customer_errors == [] and agent_errors == [] and asker_errors == [], (customer_errors, agent_errors,
                                                                                 asker_errors)


def test_a_webhook_added_in_the_console_shows_its_deliveries(server, browser):
    """The agent adds a webhook to a receiver on loopback; its secret shows once; a customer's
    conversation is delivered, signed, and the delivery log in the tab says so. A private address
    is refused with the reason."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from playwright.sync_api import expect

    from httpkit.webhooks import verify
    got = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.append((self.headers["X-Webhook-Signature"], body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *_args):
            pass
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        agent, agent_errors = _page(browser, server, viewport={"width": 1360, "height": 860})
        a = lambda testid: agent.locator(f"[data-testid={testid}]")     # noqa: E731
        agent.goto("/agent/")
        a("login-email").fill(AGENT_EMAIL)
        a("login-password").fill(AGENT_PASSWORD)
        a("login-submit").click()
        expect(a("agent-name")).to_contain_text(AGENT_NAME)
        agent.keyboard.press("8")
        a("webhook-url").fill("http://10.0.0.7/hook")
        a("webhook-add").click()
        expect(a("webhooks-error")).to_contain_text("private")
        a("webhook-url").fill(f"http://127.0.0.1:{receiver.server_port}/hook")
        a("webhook-add").click()
        expect(a("webhook-secret-value")).to_contain_text("whsec_")
        secret = a("webhook-secret-value").inner_text()
        expect(a("webhook")).to_have_count(1)

        customer = agent.context.browser.new_context(base_url=server).new_page()
        created = customer.request.post(server + "/api/chat/sessions", headers={"X-Site-Key": SITE_KEY})
        assert created.status == 201
        for _ in range(50):
            if got:
                break
            time.sleep(0.1)
        assert got and verify(secret, got[0][0], got[0][1])
        assert json.loads(got[0][1])["event"] == "conversation.created"
        a("faq-tab").click()
        a("webhooks-tab").click()                                     # the log is read again
        expect(a("delivery").first).to_have_attribute("data-status", "delivered")
        agent.screenshot(path=str(ARTIFACTS / "14-webhooks-agent.png"))
        a("webhook-delete").click()
        expect(a("webhook")).to_have_count(0)

        a("reports-tab").click()                                      # an A/B experiment, started and stopped
        a("experiment-share").fill("150")
        a("experiment-name").fill("Quote or generate")
        a("experiment-start").click()
        expect(a("experiment")).to_have_count(0)                      # the browser refuses a share over 99
        a("experiment-share").fill("30")
        a("experiment-treatment").fill("poetry")
        a("experiment-start").click()
        expect(a("experiments-error")).to_contain_text("unknown answer mode")
        a("experiment-treatment").fill("grounded_generation")
        a("experiment-start").click()
        running = a("experiment").first
        expect(running).to_have_attribute("data-status", "running")
        expect(running.locator("[data-testid=experiment-arm]")).to_have_count(2)
        expect(running).to_contain_text("treatment (30%)")
        agent.screenshot(path=str(ARTIFACTS / "15-experiment-agent.png"))
        running.locator("[data-testid=experiment-stop]").click()
        expect(a("experiment").first).to_have_attribute("data-status", "stopped")
        assert agent_errors == [], agent_errors
    finally:
        receiver.shutdown()
