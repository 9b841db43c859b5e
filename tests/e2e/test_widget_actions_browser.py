"""An action's confirm flow in the widget, in a real headless Chromium: `python -m app serve` on
the default model (Qwen2.5-Coder-0.5B), the demo order service it serves, and app/static/widget.js.

Ask to change an order's delivery address; the reply asks first, with Confirm / Cancel; nothing
changes until Confirm; the confirmation's reply replaces the buttons; a reload shows no buttons
again; the order service holds one change.
"""
from __future__ import annotations

import time

import pytest
import requests

from tests.helpers.app_server import app_env, serving
from tests.helpers.browser import chromium_page, needs_chromium

KEY = {"X-Site-Key": "demo-site-key"}
ASSISTANT = "[data-testid=nw-message][data-role=assistant]"
ASK = "Please change the delivery address of order NW-5520018 to 5 Park Row, Leeds LS2 8AA"

pytestmark = needs_chromium


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("widget-actions")
    with serving(tmp, app_env(tmp, MODEL="qwen2.5-coder-0.5b", CHAT_MAX_TOKENS="64"), timeout_s=120) as base:
        yield base


def test_a_change_is_confirmed_in_the_widget_and_runs_once(server):
    from playwright.sync_api import expect

    before = requests.get(f"{server}/demo/orders/NW-5520018", timeout=10).json()
    assert before["address"] != "5 Park Row, Leeds LS2 8AA" and before["history"] == []
    started = time.monotonic()
    with chromium_page(server) as (page, js_errors):
        page.goto("/")
        page.locator("[data-testid=nw-launcher]").click()
        page.locator("[data-testid=nw-input]").fill(ASK)
        page.locator("[data-testid=nw-send]").click()

        confirm = page.locator(f"{ASSISTANT} [data-testid=nw-action-confirm]")
        expect(confirm).to_be_visible(timeout=90_000)          # first turn: the model and embedder load
        expect(page.locator(f"{ASSISTANT} [data-testid=nw-action-cancel]")).to_have_text("Cancel")
        expect(page.locator(ASSISTANT).first).to_contain_text("Shall I change the delivery address of order "
                                                              "NW-5520018 to 5 Park Row, Leeds LS2 8AA?")
        assert requests.get(f"{server}/demo/orders/NW-5520018", timeout=10).json()["history"] == []

        confirm.click()
        expect(page.locator(ASSISTANT)).to_have_count(2)
        expect(page.locator(ASSISTANT).nth(1)).to_contain_text(
            "Done: order NW-5520018 will now be delivered to 5 Park Row, Leeds LS2 8AA.")
        expect(page.locator("[data-testid=nw-action]")).to_have_count(0)

        page.reload()
        page.locator("[data-testid=nw-launcher]").click()
        expect(page.locator(ASSISTANT)).to_have_count(2)
        expect(page.locator("[data-testid=nw-action]")).to_have_count(0)     # answered: no buttons again
        assert js_errors == [], js_errors

    after = requests.get(f"{server}/demo/orders/NW-5520018", timeout=10).json()
    assert after["address"] == "5 Park Row, Leeds LS2 8AA" and len(after["history"]) == 1
    assert time.monotonic() - started < 150
