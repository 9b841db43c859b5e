"""The embeddable chat widget end to end in a real headless Chromium: `python -m app serve` on the
tiny random model (in-process store and engine), the demo page at /, and app/static/widget.js
driven through its stable data-testid hooks (Playwright CSS locators pierce its open shadow root).

One conversation: open the widget, ask about refunds, watch the reply stream in (the typing
indicator, then text rendered from `token` events before the `done` event finishes the bubble),
see the final reply with a help-centre citation, reload and find the history restored, rate the
reply, ask for a human, and check the stored session through the API.
"""
from __future__ import annotations

import time

import pytest
import requests

from tests.helpers.app_server import app_env, serving
from tests.helpers.browser import chromium_page, needs_chromium

SITE_KEY = "demo-site-key"
KEY = {"X-Site-Key": SITE_KEY}
STORE_KEY = f"nw-chat:{SITE_KEY}:session"          # widget.js: "nw-chat:" + siteKey + ":session"
QUESTION = "How long do refunds take?"

pytestmark = needs_chromium


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Base URL of `python -m app serve` on a free port, stopped at the end of the module."""
    tmp = tmp_path_factory.mktemp("widget-browser")
    with serving(tmp, app_env(tmp, MODEL="random:tiny", CHAT_MAX_TOKENS="48")) as base:
        yield base


@pytest.fixture
def page(server):
    with chromium_page(server) as pg:
        yield pg


# Records every change the widget makes to its shadow DOM, in order. MutationObserver sees each
# mutation (not just the latest state), so the sequence does not depend on how the SSE bytes were
# split into network reads: each `token` event re-renders the bubble's .nw-content once and the
# `done` event renders it once more and then adds the .nw-meta row (feedback buttons).
RECORDER = """() => {
  const shadow = document.querySelector("northwind-chat-widget").shadowRoot;
  const events = window.__nwEvents = [];
  const isEl = (n) => n.nodeType === 1;
  // Only the added/removed node itself: by the time this callback runs, a node added earlier may
  // already hold children that were appended to it later.
  const matches = (n, sel) => isEl(n) && n.matches(sel);
  new MutationObserver((records) => {
    for (const r of records) {
      const added = Array.from(r.addedNodes), removed = Array.from(r.removedNodes);
      if (added.some((n) => matches(n, "[data-testid=nw-typing]"))) events.push({type: "typing+"});
      if (removed.some((n) => matches(n, "[data-testid=nw-typing]"))) events.push({type: "typing-"});
      if (added.length && isEl(r.target) && r.target.classList.contains("nw-content")
          && r.target.parentElement && r.target.parentElement.getAttribute("data-role") === "assistant") {
        events.push({type: "render", text: added.map((n) => n.textContent).join("")});
      }
      if (added.some((n) => matches(n, ".nw-citations"))) events.push({type: "citations"});
      if (added.some((n) => matches(n, ".nw-meta"))) events.push({type: "meta"});
    }
  }).observe(shadow, {childList: true, subtree: true});
}"""

ASSISTANT = "[data-testid=nw-message][data-role=assistant]"
USER = "[data-testid=nw-message][data-role=user]"


def _bubble_text(page, selector: str) -> str:
    return page.locator(f"{selector} .nw-content").inner_text(timeout=5_000).strip()


def test_widget_conversation_in_chromium(server, page):
    from playwright.sync_api import expect

    page, js_errors = page
    started = time.monotonic()
    page.goto("/")
    launcher = page.locator("[data-testid=nw-launcher]")
    expect(launcher).to_be_visible()
    expect(page.locator("[data-testid=nw-panel]")).to_be_hidden()
    page.evaluate(RECORDER)

    # --- open the widget and ask
    launcher.click()
    expect(page.locator("[data-testid=nw-panel]")).to_be_visible()
    expect(launcher).to_have_attribute("aria-expanded", "true")
    page.locator("[data-testid=nw-input]").fill(QUESTION)
    page.locator("[data-testid=nw-send]").click()
    expect(page.locator(USER)).to_have_text(QUESTION)

    # --- the final reply (first turn loads the embedder and the engine: allow a minute)
    expect(page.locator(f"{ASSISTANT} [data-testid=nw-feedback-up]")).to_be_visible(timeout=60_000)
    expect(page.locator("[data-testid=nw-typing]")).to_have_count(0)
    expect(page.locator("[data-testid=nw-input]")).to_be_enabled()
    expect(page.locator("[data-testid=nw-error]")).to_have_count(0)
    expect(page.locator(ASSISTANT)).to_have_count(1)
    reply = _bubble_text(page, ASSISTANT)
    assert reply, "the assistant bubble is empty"

    # --- it streamed: typing indicator first, then text rendered from `token` events before `done`
    events = page.evaluate("() => window.__nwEvents")
    kinds = [e["type"] for e in events]
    renders = [e for e in events if e["type"] == "render"]
    assert "typing+" in kinds and "typing-" in kinds and "meta" in kinds, kinds
    first_render = kinds.index("render")
    assert kinds.index("typing+") < kinds.index("typing-") < first_render, kinds
    # done() renders exactly once, so every earlier render came from a token event.
    assert len(renders) >= 2, f"no text was rendered before the done event: {kinds}"
    assert first_render < kinds.index("meta"), kinds
    assert renders[0]["text"].strip(), "the first streamed render was empty"
    assert kinds.count("meta") == 1, kinds
    print(f"widget events: {kinds}; rendered text lengths: {[len(e['text']) for e in renders]}")

    # --- at least one help-centre citation, linking to a served article
    citations = page.locator(f"{ASSISTANT} [data-testid=nw-citation]")
    expect(citations.first).to_be_visible()
    citation_titles = [t.strip() for t in citations.all_inner_texts()]
    href = citations.first.get_attribute("href")
    assert href and href.startswith(server + "/kb/") and href.endswith(".md"), href
    assert requests.get(href, timeout=10).status_code == 200

    session_id = page.evaluate(f"() => localStorage.getItem({STORE_KEY!r})")
    assert session_id

    # --- reload: the same conversation comes back from the server
    page.reload()
    expect(launcher).to_be_visible()
    expect(launcher).to_have_attribute("aria-expanded", "false")
    launcher.click()
    expect(page.locator("[data-testid=nw-panel]")).to_be_visible()
    expect(page.locator("[data-testid=nw-message]")).to_have_count(2)
    expect(page.locator(USER)).to_have_count(1)
    expect(page.locator(ASSISTANT)).to_have_count(1)
    assert _bubble_text(page, USER) == QUESTION
    assert _bubble_text(page, ASSISTANT) == reply
    restored = page.locator(f"{ASSISTANT} [data-testid=nw-citation]")
    assert [t.strip() for t in restored.all_inner_texts()] == citation_titles
    assert page.evaluate(f"() => localStorage.getItem({STORE_KEY!r})") == session_id

    # --- thumbs up: both buttons lock, the chosen one is pressed, the server said thanks
    up = page.locator(f"{ASSISTANT} [data-testid=nw-feedback-up]")
    down = page.locator(f"{ASSISTANT} [data-testid=nw-feedback-down]")
    for button, name in ((up, "Helpful"), (down, "Not helpful")):     # SVG icons: no emoji font needed
        expect(button.locator("svg")).to_have_count(1)
        expect(button).to_have_accessible_name(name)
        assert button.inner_text().strip() == ""
    up.click()
    expect(page.locator(f"{ASSISTANT} .nw-thanks")).to_have_text("Thanks")
    expect(up).to_be_disabled()
    expect(down).to_be_disabled()
    expect(up).to_have_attribute("aria-pressed", "true")
    expect(down).to_have_attribute("aria-pressed", "false")

    # --- talk to a human
    handoff = page.locator("[data-testid=nw-handoff]")
    expect(handoff).to_be_enabled()
    handoff.click()
    notice = page.locator("[data-testid=nw-notice]")
    expect(notice).to_have_count(1)
    expect(notice).to_contain_text("talk to a human")
    expect(handoff).to_be_disabled()
    expect(handoff).to_have_text("Human requested")

    # --- the stored session, through the API
    resp = requests.get(f"{server}/api/chat/sessions/{session_id}", headers=KEY, timeout=10)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    assert data["status"] == "pending_human"
    messages = data["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert messages[0]["content"] == QUESTION
    assert messages[1]["content"].strip()
    assert [c["title"] for c in messages[1]["citations"]] == citation_titles
    assert all(c["source"].endswith(".md") for c in messages[1]["citations"])

    assert js_errors == [], js_errors
    assert time.monotonic() - started < 90, "the browser test took too long"
