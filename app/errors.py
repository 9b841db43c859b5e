"""The error of the support-chat API (/api/chat) and the web app's own routes, and its body:

    {"error": "<message>"}                      (+ Retry-After when the client should retry)

    raise PlainError(404, "unknown or expired session")
    body = validate_body(MessageIn, request.get_json(silent=True), context={...})   # or PlainError

The /v1 routes (completion, jobs, knowledge base) answer in OpenAI's shape instead
(httpkit/errors.py). The chat blueprint renders PlainError with `render`; the app's own handlers
(not found, too large, rate limited, a dependency down) answer with `error_response`, in the
style of the route.
"""
from __future__ import annotations

from typing import Any, TypeVar

from flask import jsonify, request
from pydantic import BaseModel

from httpkit.errors import OpenAIError
from httpkit.validation import InvalidRequest, validate

M = TypeVar("M", bound=BaseModel)


def plain_error_body(message: str) -> dict:
    return {"error": message}


class PlainError(Exception):
    def __init__(self, status: int, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after

    @property
    def headers(self) -> dict:
        return {"Retry-After": str(self.retry_after)} if self.retry_after else {}

    def body(self) -> dict:
        return plain_error_body(self.message)


def validate_body(model: type[M], data: Any, *, context: dict | None = None) -> M:
    """The body parsed by its model, or the PlainError that says what is wrong with it."""
    try:
        return validate(model, data, context=context)
    except InvalidRequest as exc:
        raise PlainError(exc.status, exc.message) from None


def render(exc: PlainError):
    return jsonify(exc.body()), exc.status, exc.headers


def error_response(status: int, message: str, headers: dict | None = None, type_: str | None = None,
                   code: str | None = None):
    """An error the app itself raises (404, 405, 413, 429, 503, 500) in the style of the route it
    answers: OpenAI's object under /v1/, the plain {"error": "..."} elsewhere."""
    if request.path.startswith("/v1/"):
        body = OpenAIError(status, message, type_=type_, code=code).body()
    else:
        body = plain_error_body(message)
    return jsonify(body), status, headers or {}
