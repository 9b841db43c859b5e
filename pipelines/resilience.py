"""The fallback chain in front of the inference core: primary -> hot standby -> degraded.

    FallbackClient.chat_stream(...)
        primary  (breaker closed or half-open)  --first token-->  stream it
            | InferenceError / time-out before the first token: count a failure, try the next
        standby  (e.g. a smaller or quantized model, configs/reliability.yaml)
            | the same
        InferenceError("no inference endpoint answered")  ->  the pipelines degrade:
            chat: the best knowledge-base excerpt with its citation and an offer of a human
            completion: an empty completion, at once

Each endpoint has a pybreaker circuit breaker. After `fail_max` consecutive failures it opens
and calls skip the endpoint without waiting on its time-outs; after `reset_timeout_s` the next
call is a half-open probe, and one success closes it again, so the primary comes back without
an operator. With REDIS_URL the breaker state lives in Redis (every web worker agrees); without
it, in this process (the embedded default). Once a stream has produced text it cannot switch
endpoints (the user has seen the words): a failure then is recorded and raised to the caller.
"""
from __future__ import annotations

import collections
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pybreaker
import yaml

from configs import shipped
from pipelines.inference_client import (
    HttpClient,
    InferenceClient,
    InferenceError,
    InProcessClient,
    RequestRejected,
)

log = logging.getLogger(__name__)
DEFAULT_CONFIG = shipped("reliability.yaml")


@dataclass(frozen=True)
class Timeouts:
    connect_s: float = 2.0           # TCP connect to an HTTP endpoint
    first_token_s: float = 20.0      # request sent -> first generated text
    total_s: float = 120.0           # the whole request

    def __post_init__(self) -> None:
        for name in ("connect_s", "first_token_s", "total_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"timeouts.{name}: must be a positive number of seconds, got {value!r}")
        if self.first_token_s > self.total_s:
            raise ValueError(f"timeouts: first_token_s ({self.first_token_s}) exceeds total_s ({self.total_s})")


@dataclass(frozen=True)
class BreakerPolicy:
    fail_max: int = 3                # consecutive failures that open the breaker
    reset_timeout_s: float = 30.0    # open -> half-open probe after this long

    def __post_init__(self) -> None:
        if not isinstance(self.fail_max, int) or self.fail_max < 1:
            raise ValueError(f"breaker.fail_max: must be an integer >= 1, got {self.fail_max!r}")
        if not isinstance(self.reset_timeout_s, (int, float)) or self.reset_timeout_s <= 0:
            raise ValueError(f"breaker.reset_timeout_s: must be positive, got {self.reset_timeout_s!r}")


@dataclass(frozen=True)
class ReliabilityConfig:
    primary_url: str | None = None           # None: the in-process engine
    standby_url: str | None = None           # None: no hot standby
    standby_model: str | None = None         # in-process standby model when no standby_url
    timeouts: Timeouts = field(default_factory=Timeouts)
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)

    @classmethod
    def load(cls, path: str | Path | None = None, env: dict | None = None) -> ReliabilityConfig:
        """configs/reliability.yaml, then INFERENCE_URL / INFERENCE_STANDBY_URL / STANDBY_MODEL
        and BREAKER_FAIL_MAX / BREAKER_RESET_S / TIMEOUT_{CONNECT,FIRST_TOKEN,TOTAL}_S from env."""
        env = os.environ if env is None else env
        raw = yaml.safe_load(Path(path or DEFAULT_CONFIG).read_text()) or {}
        unknown = set(raw) - {"primary_url", "standby_url", "standby_model", "timeouts", "breaker"}
        if unknown:
            raise ValueError(f"reliability config: unknown keys {sorted(unknown)}")
        timeouts = dict(raw.get("timeouts") or {})
        breaker = dict(raw.get("breaker") or {})
        for key, name in (("connect_s", "TIMEOUT_CONNECT_S"), ("first_token_s", "TIMEOUT_FIRST_TOKEN_S"),
                          ("total_s", "TIMEOUT_TOTAL_S")):
            if env.get(name):
                timeouts[key] = float(env[name])
        if env.get("BREAKER_FAIL_MAX"):
            breaker["fail_max"] = int(env["BREAKER_FAIL_MAX"])
        if env.get("BREAKER_RESET_S"):
            breaker["reset_timeout_s"] = float(env["BREAKER_RESET_S"])
        try:
            return cls(primary_url=env.get("INFERENCE_URL") or raw.get("primary_url"),
                       standby_url=env.get("INFERENCE_STANDBY_URL") or raw.get("standby_url"),
                       standby_model=env.get("STANDBY_MODEL") or raw.get("standby_model"),
                       timeouts=Timeouts(**timeouts), breaker=BreakerPolicy(**breaker))
        except TypeError as exc:                     # an unknown key inside timeouts / breaker
            raise ValueError(f"reliability config: {exc}") from exc


class _LogStateChanges(pybreaker.CircuitBreakerListener):
    def state_change(self, cb, old_state, new_state) -> None:
        log.warning("circuit breaker %s: %s -> %s", cb.name, old_state and old_state.name, new_state.name)


def make_breaker(name: str, policy: BreakerPolicy, redis_url: str | None = None,
                 namespace: str = "breaker") -> pybreaker.CircuitBreaker:
    """A breaker whose state is shared through Redis (keys under `{namespace}:{name}`) when
    redis_url is set; every web worker of one deployment uses the same namespace."""
    storage = None
    if redis_url:
        from pipelines.breaker_storage import SharedBreakerStorage
        from pipelines.redis_client import connect
        # bytes replies; fast failure: a breaker read must not wait out Redis retries
        fast = connect(redis_url, decode_responses=False, retries=0, connect_timeout_s=0.5, timeout_s=1.0)
        storage = SharedBreakerStorage(fast, f"{namespace}:{name}")
    return pybreaker.CircuitBreaker(fail_max=policy.fail_max, reset_timeout=policy.reset_timeout_s,
                                    state_storage=storage, name=name, listeners=[_LogStateChanges()],
                                    exclude=[RequestRejected],
                                    throw_new_error_on_trip=False)


@dataclass
class Endpoint:
    name: str                                # "primary" | "standby"
    client: InferenceClient
    breaker: pybreaker.CircuitBreaker


def _record_failure(breaker: pybreaker.CircuitBreaker, exc: Exception) -> None:
    """Count a failure that happened outside `breaker.calling()` (mid-stream)."""
    def fail():
        raise exc
    try:
        breaker.call(fail)
    except Exception:        # noqa: BLE001 - the failure itself, or CircuitBreakerError once it opens
        pass


class FallbackClient:
    """An InferenceClient over an ordered list of endpoints (see the module docstring).

    It keeps plain counts for the metrics exporter (monitoring/reliability_metrics.py):
    `fallbacks[(endpoint, reason)]` for every endpoint skipped ("open") or failed ("error");
    `last_endpoint` names the one that answered last."""

    def __init__(self, endpoints: list[Endpoint]):
        if not endpoints:
            raise ValueError("FallbackClient: at least one endpoint is needed")
        self.endpoints = endpoints
        self.fallbacks: collections.Counter[tuple[str, str]] = collections.Counter()
        self._lock = threading.Lock()
        self.last_endpoint: str | None = None

    def _fell_back(self, ep: Endpoint, reason: str) -> None:
        with self._lock:
            self.fallbacks[(ep.name, reason)] += 1

    def _stream(self, method: str, *args, **kw) -> Iterator[str]:
        errors = []
        for ep in self.endpoints:
            it = None
            try:
                with ep.breaker.calling():
                    it = iter(getattr(ep.client, method)(*args, **kw))
                    first = next(it, None)             # the endpoint answers or raises here
            except pybreaker.CircuitBreakerError:
                errors.append(f"{ep.name}: circuit open")
                self._fell_back(ep, "open")
                continue
            except RequestRejected:
                if it is not None and hasattr(it, "close"):
                    it.close()
                raise
            except InferenceError as exc:
                errors.append(f"{ep.name}: {exc}")
                self._fell_back(ep, "error")
                if it is not None and hasattr(it, "close"):
                    it.close()
                continue
            self.last_endpoint = ep.name
            if first is None:
                return
            yield first
            try:
                yield from it
            except InferenceError as exc:
                _record_failure(ep.breaker, exc)
                raise
            return
        raise InferenceError("no inference endpoint answered (" + "; ".join(errors) + ")")

    def chat_stream(self, messages, **kw) -> Iterator[str]:
        return self._stream("chat_stream", messages, **kw)

    def complete_stream(self, prompt, **kw) -> Iterator[str]:
        return self._stream("complete_stream", prompt, **kw)

    def _call(self, method: str, *args):
        errors = []
        for ep in self.endpoints:
            try:
                with ep.breaker.calling():
                    value = getattr(ep.client, method)(*args)
                self.last_endpoint = ep.name
                return value
            except pybreaker.CircuitBreakerError:
                errors.append(f"{ep.name}: circuit open")
                self._fell_back(ep, "open")
            except RequestRejected:
                raise
            except InferenceError as exc:
                errors.append(f"{ep.name}: {exc}")
                self._fell_back(ep, "error")
        raise InferenceError(f"no inference endpoint answered {method} (" + "; ".join(errors) + ")")

    def embed(self, texts: list[str]) -> np.ndarray:
        return self._call("embed", texts)

    def call_tool(self, messages, tools, name=None, max_tokens=160):
        return self._call("call_tool", messages, tools, name, max_tokens)

    def count_tokens(self, text: str) -> int:
        return self._call("count_tokens", text)

    def max_model_len(self) -> int:
        return self._call("max_model_len")

    def abort(self, request_id: str) -> None:
        for ep in self.endpoints:
            try:
                ep.client.abort(request_id)
            except (InferenceError, AttributeError):
                pass

    def usage(self, request_id: str) -> tuple[int, int, int] | None:
        for ep in self.endpoints:
            found = ep.client.usage(request_id) if hasattr(ep.client, "usage") else None
            if found is not None:
                return found
        return None

    def model_loading(self) -> bool:
        """The primary's model is still loading (an in-process engine; a remote one answers for itself)."""
        loading = getattr(self.endpoints[0].client, "model_loading", None)
        return bool(loading and loading())

    def warm(self) -> None:
        """Load every in-process model now, in the background."""
        for ep in self.endpoints:
            if hasattr(ep.client, "warm"):
                ep.client.warm()

    def in_process_engine(self):
        """The primary's engine if it runs in this process (its tokenizer picks the FIM template)."""
        return getattr(self.endpoints[0].client, "engine", None)

    def breaker_states(self) -> dict[str, str]:
        """endpoint name -> 'closed' | 'open' | 'half-open'."""
        return {ep.name: ep.breaker.current_state for ep in self.endpoints}

    def close(self) -> None:
        for ep in self.endpoints:
            if hasattr(ep.client, "close"):
                ep.client.close()


def client_from_env(redis_url: str | None = None, config_path: str | None = None, **engine_args) -> FallbackClient:
    """The configured chain (configs/reliability.yaml, INFERENCE_URL, INFERENCE_STANDBY_URL,
    STANDBY_MODEL, INFERENCE_API_KEY): the primary is the HTTP service at its URL or else the
    in-process engine on MODEL (default qwen2.5-coder-0.5b), then the standby if one is configured, each
    behind a circuit breaker (state in Redis when redis_url is given)."""
    cfg = ReliabilityConfig.load(config_path)
    t = cfg.timeouts
    key = os.environ.get("INFERENCE_API_KEY")

    def build(url: str | None, model: str) -> InferenceClient:
        if url:
            return HttpClient(url, key, connect_s=t.connect_s, first_token_s=t.first_token_s, total_s=t.total_s)
        return InProcessClient(model, first_token_s=t.first_token_s, total_s=t.total_s, **engine_args)

    endpoints = [Endpoint("primary", build(cfg.primary_url, os.environ.get("MODEL", "qwen2.5-coder-0.5b")),
                          make_breaker("primary", cfg.breaker, redis_url))]
    if cfg.standby_url or cfg.standby_model:
        endpoints.append(Endpoint("standby", build(cfg.standby_url, cfg.standby_model or "smollm2"),
                                  make_breaker("standby", cfg.breaker, redis_url)))
    return FallbackClient(endpoints)
