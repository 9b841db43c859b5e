"""The error of the OpenAI-style APIs (every /v1 route: the inference service's and the web app's
completion, job and knowledge-base routes), and its body:

    {"error": {"message": str, "type": str, "param": str | null, "code": str | null}}

    raise OpenAIError(404, "unknown job")                      # in a view; the app renders .body()
    req = validate_request(CompletionRequest, body)            # the model, or an OpenAIError (400...)

`type` follows the status unless given: invalid_request_error below 500, else server_error.
No web framework here: each app registers a handler that renders `.body()` with `.status` and
`.headers`.
"""
from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

from httpkit.validation import InvalidRequest, validate

M = TypeVar("M", bound=BaseModel)


def openai_error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, type_: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type_ or ("invalid_request_error" if status < 500 else "server_error")
        self.headers = headers or {}

    @classmethod
    def invalid(cls, exc: InvalidRequest) -> OpenAIError:
        """A request a model (or a validator) refused: its status, message, field and code."""
        return cls(exc.status, exc.message, exc.param, code=exc.code)

    def body(self) -> dict:
        return openai_error_body(self.message, self.type, self.param, self.code)


def validate_request(model: type[M], data: Any, *, context: dict | None = None) -> M:
    """The request parsed by its model, or the OpenAIError that says what is wrong with it."""
    try:
        return validate(model, data, context=context)
    except InvalidRequest as exc:
        raise OpenAIError.invalid(exc) from None
