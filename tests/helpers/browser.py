"""Debian's headless Chromium through Playwright, for the widget's browser tests."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

CHROMIUM = "/usr/bin/chromium"
needs_chromium = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no Chromium at {CHROMIUM}")


@contextlib.contextmanager
def chromium_page(base_url: str) -> Iterator[tuple[object, list[str]]]:
    """(a page whose relative URLs resolve against base_url, the page's uncaught JS errors)."""
    from playwright.sync_api import sync_playwright
    pw = sync_playwright().start()
    browser = None
    try:
        browser = pw.chromium.launch(executable_path=CHROMIUM, timeout=30_000, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--no-first-run"])
        context = browser.new_context(base_url=base_url, locale="en-US")
        context.set_default_timeout(15_000)
        context.set_default_navigation_timeout(15_000)
        pg = context.new_page()
        errors: list[str] = []
        pg.on("pageerror", lambda exc: errors.append(str(exc)))
        yield pg, errors
    finally:
        if browser is not None:
            browser.close()
        pw.stop()
