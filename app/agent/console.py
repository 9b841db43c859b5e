"""The agent console page, where support agents answer the customers who asked for a human.

    GET /agent/          the console: a server-rendered shell (templates/agent.html) whose
                         scripts (static/agent*.js) do the rest through the agent API

The page itself needs no login: its script asks GET /api/agent/session and shows the login form
on a 401, so everything that needs an agent lives behind /api/agent (app/agent/api.py). The shell
is rendered in the language the agent asked for (?lang=zh|en, else Accept-Language); the script
switches language in place.
"""
from __future__ import annotations

from flask import Blueprint, make_response, render_template, request

bp = Blueprint("agent_console", __name__, url_prefix="/agent")
LANGS = ("en", "zh")

# The page loads only its own scripts and styles and talks only to its own origin; customer text
# reaches the DOM through textContent, and this keeps a slip from turning into script.
_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'")


def page_lang() -> str:
    """The language asked for: ?lang=, else the browser's Accept-Language, else English."""
    asked = (request.args.get("lang") or "").lower()[:2]
    if asked in LANGS:
        return asked
    best = request.accept_languages.best_match(["en", "zh", "zh-CN", "zh-TW"], default="en")
    return "zh" if best.lower().startswith("zh") else "en"


@bp.get("/")
def console():
    """The agent console (login form, inbox, conversation view, reports)."""
    resp = make_response(render_template("agent.html", lang=page_lang()))
    resp.headers["Content-Security-Policy"] = _CSP
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.headers["Referrer-Policy"] = "same-origin"
    resp.headers["Cache-Control"] = "no-store"
    return resp
