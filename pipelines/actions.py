"""Support-chat actions: what a tenant lets the assistant do in its own systems (look an order up,
change its address, start a return), as HTTP calls with arguments the model fills in.

A tenant's actions come from YAML (`actions:` in configs/tenants.yaml names the file):

    - name: get_order_status
      description: Where an order is and when it arrives.
      intents: [order_status]                 # the intents that may call it
      parameters: {type: object, properties: {order_id: {type: string, pattern: "^NW-[0-9]{7}$"}},
                   required: [order_id]}
      ask: {order_id: "What is your order number?"}
      endpoint: {method: GET, url: "{base}/demo/orders/{order_id}", timeout_s: 3,
                 auth: {header: X-Api-Key, env: DEMO_ORDERS_KEY}}
      confirm: false                          # true: it changes something; the customer confirms first
      reply: "Order {order_id} is {status}."  # over the arguments and the endpoint's JSON answer
      replies: {404: "I couldn't find order {order_id}."}

A turn picks an action in `plan`: the intent names the candidates; the model's tool call, held to
the parameters' schema by the grammar, fills the arguments; an argument the customer did not write
is dropped (no invented order numbers) and asked for. `ActionRunner.run` makes the call once per
idempotency key: the key goes to the endpoint as `Idempotency-Key`, and a key already recorded in
the call log returns its recorded outcome instead of calling again.
"""
from __future__ import annotations

import json
import logging
import os
import re
import string
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import quote

import jsonschema
import requests
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipelines.inference_client import InferenceError

log = logging.getLogger(__name__)
_NAME = r"^[a-z][a-z0-9_]{0,63}$"
_FIELDS = string.Formatter()
_UNSET_WARNED: set[str] = set()


class Auth(BaseModel):
    model_config = ConfigDict(extra="forbid")
    header: str = Field(min_length=1)
    env: str = Field(min_length=1)                 # the secret's environment variable, read per call (unset: no header)
    prefix: str = ""                               # "Bearer " for a bearer token


class Endpoint(BaseModel):
    model_config = ConfigDict(extra="forbid")
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "GET"
    url: str = Field(min_length=1)                 # {base} and {parameter} fields, URL-quoted
    timeout_s: float = Field(5.0, gt=0, le=60)
    auth: Auth | None = None


class ActionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=_NAME)
    description: str = Field(min_length=1)
    intents: list[str] = Field(min_length=1)
    parameters: dict[str, Any]
    ask: dict[str, str] = {}
    endpoint: Endpoint
    confirm: bool = False
    confirm_prompt: str = ""                       # the question before a confirmed action runs
    reply: str = Field(min_length=1)
    replies: dict[int, str] = {}                   # the reply for an endpoint status, e.g. 404
    # how a customer asks for the action (regular expressions, any case): a turn that names none
    # of its parameters starts it only if one matches ("where is my order?" but not "how long
    # until my refund arrives?", which the help centre answers)
    requests: list[str] = []

    @field_validator("requests")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        for pattern in value:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {pattern!r}: {exc}") from None
        return value

    @field_validator("parameters")
    @classmethod
    def _schema(cls, value: dict) -> dict:
        try:
            jsonschema.Draft202012Validator.check_schema(value)
        except jsonschema.SchemaError as exc:
            raise ValueError(f"not a JSON Schema: {exc.message}") from None
        if value.get("type") != "object" or not isinstance(value.get("properties"), dict):
            raise ValueError("must be an object schema with properties")
        return value

    @model_validator(mode="after")
    def _templates(self) -> ActionSpec:
        props = set(self.parameters["properties"])
        unknown = set(self.ask) - props
        if unknown:
            raise ValueError(f"ask names parameters the action does not have: {sorted(unknown)}")
        url_fields = template_fields(self.endpoint.url) - {"base"}
        if url_fields - props:
            raise ValueError(f"endpoint.url uses fields that are not parameters: {sorted(url_fields - props)}")
        if self.confirm and not self.confirm_prompt:
            raise ValueError("confirm_prompt is required when confirm is true")
        if template_fields(self.confirm_prompt) - props:
            raise ValueError("confirm_prompt uses fields that are not parameters: "
                             f"{sorted(template_fields(self.confirm_prompt) - props)}")
        return self

    @property
    def required(self) -> list[str]:
        return list(self.parameters.get("required", []))

    def asked_for(self, text: str) -> bool:
        """The message asks for this action in one of the ways `requests` lists."""
        return any(re.search(p, text, re.IGNORECASE) for p in self.requests)

    def named_parameters(self, text: str) -> bool:
        """The message holds a value of a parameter that has a pattern (an order number)."""
        return bool(_pattern_values(self, text, re.IGNORECASE))

    def tool(self) -> dict:
        """The OpenAI tool definition the model sees."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}

    def question(self, parameter: str) -> str:
        return self.ask.get(parameter) or f"What is the {parameter.replace('_', ' ')}?"


def template_fields(template: str) -> set[str]:
    """The top-level field names of a str.format template ("{order_id}", "{items[0]}" -> order_id, items)."""
    try:
        return {re.split(r"[.\[]", f)[0] for _, f, _, _ in _FIELDS.parse(template) if f}
    except ValueError as exc:
        raise ValueError(f"bad template {template!r}: {exc}") from None


def load_actions(path: str | os.PathLike) -> tuple[ActionSpec, ...]:
    """A tenant's actions file: a YAML list of actions. ValueError names the file and the action."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"actions: cannot read {path}: {exc}") from None
    if not isinstance(data, list):
        raise ValueError(f"actions: {path} must be a YAML list of actions")
    specs = []
    for i, item in enumerate(data):
        try:
            specs.append(ActionSpec.model_validate(item))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            name = item.get("name") if isinstance(item, dict) else None
            raise ValueError(f"actions: {path} [{i}] {name or ''}: {where}: {first['msg']}".replace("  ", " ")) \
                from None
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"actions: {path} names an action twice")
    return tuple(specs)


# ---- picking the action and its arguments -----------------------------------------------------

TOOL_SYSTEM = ("You fill in a support tool call for the customer's request. Copy values exactly as the "
               "customer wrote them.")


@dataclass
class Plan:
    spec: ActionSpec
    arguments: dict[str, Any]
    missing: list[str] = field(default_factory=list)


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.casefold()).strip(" .,;:!?\"'")


def grounded(value: Any, said: str) -> bool:
    """The value is in what the customer wrote (case and spacing aside): the model copied it."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return re.search(rf"(?<![\d.]){re.escape(str(value))}(?![\d])", said) is not None
    if isinstance(value, str):
        v = _norm(value)
        return len(v) > 0 and v in _norm(said)
    if isinstance(value, list):
        return len(value) > 0 and all(grounded(v, said) for v in value)
    return False


def _pattern_values(spec: ActionSpec, said: str, flags: int = 0) -> dict[str, str]:
    """Parameters with a `pattern`, found in the text by it (without the model: it is down)."""
    out = {}
    for name, schema in spec.parameters["properties"].items():
        pattern = schema.get("pattern") if isinstance(schema, dict) else None
        if pattern and schema.get("type") == "string":
            m = re.search(pattern.lstrip("^").rstrip("$"), said, flags)
            if m:
                out[name] = m.group(0)
    return out


def _distinct(value: Any) -> Any:
    """A list without repeats (case aside): a small model may name one item until maxItems."""
    if not isinstance(value, list):
        return value
    seen, out = set(), []
    for v in value:
        k = _norm(v) if isinstance(v, str) else json.dumps(v, sort_keys=True)
        if k not in seen:
            seen.add(k)
            out.append(v)
    return out


def _grounded_part(value: Any, said: str) -> Any:
    """A list keeps the elements the customer wrote (the model may add one they did not name)."""
    if isinstance(value, list):
        return [v for v in value if grounded(v, said)]
    return value


def _valid(spec: ActionSpec, name: str, value: Any) -> bool:
    schema = spec.parameters["properties"].get(name)
    if not isinstance(schema, dict):
        return False
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return False
    return True


def customer_text(history: list[dict], text: str, turns: int = 3) -> str:
    """The customer's last few messages and this one: where arguments may come from."""
    said = [m.get("content") or "" for m in history if m.get("role") == "user"][-turns:]
    return "\n".join([*said, text])


def plan(call_tool: Callable[[list[dict], list[dict], str | None], tuple[str, dict] | None],
         specs: tuple[ActionSpec, ...], intent: str, history: list[dict], text: str,
         pending: dict | None = None) -> Plan | None:
    """The action this turn calls and its arguments, or None (answer from the help centre).

    `pending`: the action a previous turn asked a parameter for ({"name", "arguments"}); this
    message may be the answer. Without it, an action is a candidate when this message names one
    of its parameters (an order number) or asks for it as its `requests` say; questions about
    how things work ("how long until my refund arrives?") get the help centre's answer, without
    a model call, even after an earlier message gave an order number."""
    said = customer_text(history, text)
    if pending is not None:
        candidates = [s for s in specs if s.name == pending.get("name")]
    else:
        candidates = [s for s in specs if intent in s.intents and (s.asked_for(text) or s.named_parameters(text))]
    if not candidates:
        return None
    messages = [{"role": "system", "content": TOOL_SYSTEM}, {"role": "user", "content": said}]
    tools = [s.tool() for s in candidates]
    try:
        called = call_tool(messages, tools, candidates[0].name if len(candidates) == 1 else None)
    except InferenceError as exc:
        log.warning("tool call failed (%s); arguments by their patterns", exc)
        called = None
    if called is None:
        spec, raw = candidates[0], _pattern_values(candidates[0], said)
    else:
        spec = next(s for s in candidates if s.name == called[0])
        raw = called[1]
    args = dict(pending.get("arguments") or {}) if pending is not None else {}
    raw = {k: _grounded_part(_distinct(v), said) for k, v in raw.items()}
    args.update({k: v for k, v in raw.items() if grounded(v, said) and _valid(spec, k, v)})
    missing = [p for p in spec.required if p not in args]
    if pending is None and len(missing) == len(spec.required) and spec.required and not spec.asked_for(text):
        return None
    return Plan(spec, args, missing)


# ---- running it -------------------------------------------------------------------------------

class CallLog(Protocol):
    """Where calls are recorded (the conversation store): one row per idempotency key."""

    def record(self, key: str, tenant_id: str, conversation_id: str | None, action: str,
               arguments: dict, status: str) -> dict | None:
        """Insert the call; the existing row's view if the key is already there."""

    def claim(self, key: str, from_status: str) -> bool:
        """Move the call from `from_status` to "running"; False if it was not in that status."""

    def finish(self, key: str, status: str, http_status: int | None, latency_ms: float, reply: str) -> None: ...

    def get(self, key: str) -> dict | None: ...


@dataclass
class Outcome:
    status: str                  # succeeded | failed | timeout | unreachable
    reply: str
    http_status: int | None = None
    latency_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"


FAILED = ("I couldn't complete that in our order system just now, so nothing has been changed. Would you like me "
          "to connect you with a human agent?")
FAILED_ZH = "抱歉，订单系统暂时无法完成该操作，没有做任何更改。需要为您转接人工客服吗？"


def render(template: str, values: dict) -> str:
    """The template over the values; lists read as "a, b"."""
    flat = {k: ", ".join(map(str, v)) if isinstance(v, list) else v for k, v in values.items()}
    return template.format_map(flat)


def new_key() -> str:
    return uuid.uuid4().hex


class ActionRunner:
    def __init__(self, log_store: CallLog, base_url: str, session: requests.Session | None = None):
        self.log, self.base_url = log_store, base_url.rstrip("/")
        self.http = session or requests.Session()

    def request(self, spec: ActionSpec, arguments: dict, key: str) -> Outcome:
        """One HTTP call to the action's endpoint (no call log): the outcome with its reply."""
        ep = spec.endpoint
        url_fields = template_fields(ep.url)
        url = ep.url.format(base=self.base_url, **{k: quote(str(arguments[k]), safe="") for k in url_fields
                                                   if k != "base"})
        headers = {"Idempotency-Key": key, "Accept": "application/json"}
        if ep.auth is not None:
            secret = os.environ.get(ep.auth.env)
            if secret:
                headers[ep.auth.header] = ep.auth.prefix + secret
            elif ep.auth.env not in _UNSET_WARNED:   # the endpoint decides: the open demo answers, others 401
                _UNSET_WARNED.add(ep.auth.env)
                log.warning("actions: %s is not set; calling without %s", ep.auth.env, ep.auth.header)
        body = {k: v for k, v in arguments.items() if k not in url_fields}
        t0 = time.perf_counter()
        try:
            resp = self.http.request(ep.method, url, headers=headers, timeout=ep.timeout_s,
                                     json=body if ep.method != "GET" else None, allow_redirects=False)
        except requests.Timeout:
            return Outcome("timeout", FAILED, None, (time.perf_counter() - t0) * 1000)
        except requests.RequestException as exc:
            log.warning("action %s: %s unreachable: %s", spec.name, url, type(exc).__name__)
            return Outcome("unreachable", FAILED, None, (time.perf_counter() - t0) * 1000)
        latency = (time.perf_counter() - t0) * 1000
        try:
            result = resp.json() if resp.content else {}
        except ValueError:
            result = {}
        values = {**(result if isinstance(result, dict) else {}), **arguments}
        template = spec.replies.get(resp.status_code) or (spec.reply if 200 <= resp.status_code < 300 else None)
        status = "succeeded" if 200 <= resp.status_code < 300 else "failed"
        if template is None:
            return Outcome(status, FAILED, resp.status_code, latency)
        try:
            return Outcome(status, render(template, values), resp.status_code, latency)
        except (KeyError, IndexError, ValueError) as exc:
            log.error("action %s: reply template needs %s, which the answer lacks", spec.name, exc)
            return Outcome("failed", FAILED, resp.status_code, latency)

    def run(self, spec: ActionSpec, arguments: dict, key: str, tenant_id: str, conversation_id: str | None,
            claim_from: str | None = None) -> Outcome:
        """Call once per key. `claim_from`: the call is already recorded in that status (awaiting
        confirmation) and runs only if this caller moves it on; a repeat returns the recorded outcome."""
        if claim_from is None:
            existing = self.log.record(key, tenant_id, conversation_id, spec.name, arguments, "running")
            if existing is not None:
                return self.recorded(existing)
        elif not self.log.claim(key, claim_from):
            return self.recorded(self.log.get(key) or {})
        outcome = self.request(spec, arguments, key)
        self.log.finish(key, outcome.status, outcome.http_status, outcome.latency_ms, outcome.reply)
        return outcome

    @staticmethod
    def recorded(row: dict) -> Outcome:
        """A call already made (or running elsewhere): its recorded outcome, never a second call."""
        if row.get("status") in (None, "running", "awaiting_confirmation"):
            return Outcome("running", "That request is already being processed.")
        return Outcome(row["status"], row.get("reply") or FAILED, row.get("http_status"),
                       row.get("latency_ms") or 0.0)


def arguments_json(arguments: dict) -> str:
    return json.dumps(arguments, ensure_ascii=False, sort_keys=True)
