"""How the pipelines reach the inference core: one protocol, two transports.

    InProcessClient   the embedded default: an OnlineEngine and the sentence embedder in this
                      process (torch is imported only when it is first used)
    HttpClient        the OpenAI-compatible inference service at INFERENCE_URL
                      (/v1/chat/completions streamed, /v1/embeddings, /tokenize)

Both raise InferenceError when the core cannot answer, including when no text arrives within
the first-token time-out or the whole request outlasts its time-out. pipelines/resilience.py's
`client_from_env()` puts the configured primary and hot standby behind circuit breakers.
"""
from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Iterator
from typing import Protocol

import numpy as np

log = logging.getLogger(__name__)


class InferenceError(RuntimeError):
    """The inference core failed or is unreachable."""


class RequestRejected(InferenceError):
    """The inference core refused this request (a 4xx, or a prompt that does not fit): the
    request's fault, not an outage, so it opens no circuit breaker and tries no fallback."""


class InferenceClient(Protocol):
    def chat_stream(self, messages: list[dict], *, temperature: float = 0.7, top_p: float = 1.0,
                    max_tokens: int = 512) -> Iterator[str]:
        """The assistant's reply to `messages`, as text pieces while it is generated."""

    def call_tool(self, messages: list[dict], tools: list[dict], name: str | None = None,
                  max_tokens: int = 160) -> tuple[str, dict] | None:
        """The model's call to one of `tools` (OpenAI function definitions; to `name` if given),
        held to the tools' parameter schemas by the grammar: (tool name, arguments), or None
        when its answer holds no call."""

    def embed(self, texts: list[str]) -> np.ndarray:
        """[N, dim] float32 unit vectors."""

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` for the chat model (prompt budgeting)."""

    def max_model_len(self) -> int:
        """The chat model's context length (prompt + generated tokens)."""

    def complete_stream(self, prompt: str, *, max_tokens: int, temperature: float, top_p: float,
                        stop: list[str], seed: int | None = None, request_id: str | None = None,
                        top_k: int = -1, cache_reuse: int = 0) -> Iterator[str]:
        """A raw completion of `prompt` (code completion), as text pieces. `cache_reuse` > 0: the
        engine may take KV of a moved run of at least that many tokens from a recent request
        (SamplingParams.cache_reuse)."""

    def abort(self, request_id: str) -> None:
        """Stop a running complete_stream now (its KV blocks are freed at once)."""

    def usage(self, request_id: str) -> tuple[int, int, int] | None:
        """(prompt tokens, generated tokens, prompt tokens served from the prefix cache) of a
        finished complete_stream, if the client knows."""


def _deltas(stream, first_token_s: float | None, total_s: float | None) -> Iterator:
    """The stream's deltas, raising InferenceError when the first text is later than
    first_token_s or the whole request passes total_s (the request is aborted either way)."""
    start = time.monotonic()
    seen_text = False
    while not stream.finished:
        now = time.monotonic()
        limits = [t for t in ((start + first_token_s) if first_token_s and not seen_text else None,
                              (start + total_s) if total_s else None) if t is not None]
        try:
            delta = stream.get(timeout=max(0.0, min(limits) - now) if limits else None)
        except queue.Empty:
            stream.abort()
            what = "no first token" if not seen_text else "request not finished"
            raise InferenceError(f"{what} within {min(limits) - start:.1f} s") from None
        seen_text = seen_text or bool(delta.text)
        yield delta


class InProcessClient:
    def __init__(self, model: str = "smollm2", first_token_s: float | None = None, total_s: float | None = None,
                 **engine_args):
        self.model, self.engine_args = model, engine_args
        self.first_token_s, self.total_s = first_token_s, total_s
        self._engine = None
        self._embedder = None
        self._lock = threading.Lock()
        self._usage: dict[str, tuple[int, int, int]] = {}     # request_id -> (prompt, generated, cached)
        self._warming: threading.Thread | None = None
        self.load_error: str | None = None

    def model_loading(self) -> bool:
        """The model is not loaded yet (or failed to load): a completion now would wait for it."""
        return self._engine is None

    def warm(self) -> None:
        """Load the model in the background now (idempotent) rather than on the first request."""
        def load():
            try:
                _ = self.engine
                self.load_error = None
            except Exception as exc:         # noqa: BLE001 - reported by health; the next use retries
                self.load_error = f"{type(exc).__name__}: {exc}"
                log.warning("in-process model %s failed to load: %s", self.model, self.load_error)
        with self._lock:
            if self._engine is not None or (self._warming is not None and self._warming.is_alive()):
                return
            self._warming = threading.Thread(target=load, name=f"load-{self.model}", daemon=True)
            self._warming.start()

    @property
    def engine(self):
        with self._lock:
            if self._engine is None:
                from inference.online_engine import OnlineEngine
                self._engine = OnlineEngine(self.model, **self.engine_args)
            return self._engine

    @property
    def embedder(self):
        with self._lock:
            if self._embedder is None:
                from inference.embeddings import SentenceEmbedder
                self._embedder = SentenceEmbedder()
            return self._embedder

    def chat_stream(self, messages, *, temperature=0.7, top_p=1.0, max_tokens=512) -> Iterator[str]:
        from inference.sampling_params import SamplingParams
        params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens)
        try:
            stream = self.engine.chat(messages, params)
        except ValueError as exc:                      # the prompt does not fit
            raise RequestRejected(str(exc)) from exc
        except RuntimeError as exc:                    # engine down
            raise InferenceError(str(exc)) from exc
        try:
            for delta in _deltas(stream, self.first_token_s, self.total_s):
                if delta.error:
                    raise InferenceError(delta.error)
                if delta.text:
                    yield delta.text
        finally:
            if not stream.finished:
                stream.abort()              # the caller stopped reading: free the KV blocks now

    def call_tool(self, messages, tools, name=None, max_tokens=160) -> tuple[str, dict] | None:
        """The call's fixed text is written into the prompt, not decoded: the model chooses the
        tool's name (a choice among the names, when there are several), then writes only the
        arguments object under its schema. Against decoding the whole tagged call under one
        grammar, that is ~half the decode steps (each forced token still cost a step)."""
        from inference.sampling_params import StructuredOutputsParams
        from inference.server.tool_calls import OPEN
        try:
            tok = self.engine.tokenizer
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tools=tools)
        except RuntimeError as exc:
            raise InferenceError(str(exc)) from exc
        lead = tok.encode("")                         # what encode() puts first (a BOS), to drop

        def then(text: str) -> list[int]:
            more = tok.encode(text)
            return ids + (more[len(lead):] if more[:len(lead)] == lead else more)

        names = [t["function"]["name"] for t in tools]
        head = f'{OPEN}\n{{"name": "'
        if name is None and len(names) == 1:
            name = names[0]
        if name is None:
            picked = self._constrained(then(head), StructuredOutputsParams(choice=[f'{n}"' for n in names]), 32)
            name = picked[:-1]
        if name not in names:
            return None
        params = next(t for t in tools if t["function"]["name"] == name)["function"].get("parameters") \
            or {"type": "object"}
        text = self._constrained(then(f'{head}{name}", "arguments":'), StructuredOutputsParams(json=params),
                                 max_tokens)
        try:
            args = json.loads(text)
        except ValueError:                            # cut at max_tokens
            return None
        return (name, args) if isinstance(args, dict) else None

    def _constrained(self, ids: list[int], structured, max_tokens: int) -> str:
        """Greedy text after `ids`, held to `structured` (StructuredOutputsParams)."""
        from inference.sampling_params import SamplingParams
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, structured_outputs=structured)
        try:
            stream = self.engine.add_request({"prompt_token_ids": ids}, params)
        except ValueError as exc:
            raise RequestRejected(str(exc)) from exc
        except RuntimeError as exc:
            raise InferenceError(str(exc)) from exc
        parts = []
        try:
            for delta in _deltas(stream, self.first_token_s, self.total_s):
                if delta.error:
                    raise InferenceError(delta.error)
                parts.append(delta.text or "")
        finally:
            if not stream.finished:
                stream.abort()
        return "".join(parts)

    def complete_stream(self, prompt, *, max_tokens, temperature, top_p, stop, seed=None,
                        request_id=None, top_k=-1, cache_reuse=0) -> Iterator[str]:
        from inference.sampling_params import SamplingParams
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=stop or None,
                                seed=seed, top_k=top_k, cache_reuse=cache_reuse)
        try:
            stream = self.engine.add_request(prompt, params, request_id)
        except ValueError as exc:
            raise RequestRejected(str(exc)) from exc
        except RuntimeError as exc:
            raise InferenceError(str(exc)) from exc
        usage = [0, 0, 0]
        try:
            for delta in _deltas(stream, self.first_token_s, self.total_s):
                if delta.error:
                    raise InferenceError(delta.error)
                usage = [delta.num_prompt_tokens or usage[0], delta.num_output_tokens,
                         max(usage[2], delta.num_cached_tokens)]
                if delta.text:
                    yield delta.text
        finally:
            if not stream.finished:
                stream.abort()
            if request_id is not None:
                with self._lock:
                    self._usage[request_id] = (usage[0], usage[1], usage[2])
                    while len(self._usage) > 4096:
                        self._usage.pop(next(iter(self._usage)))

    def abort(self, request_id: str) -> None:
        if self._engine is not None:
            self._engine.abort(request_id)

    def usage(self, request_id: str) -> tuple[int, int, int] | None:
        with self._lock:
            return self._usage.pop(request_id, None)

    def embed(self, texts: list[str]) -> np.ndarray:
        try:
            return self.embedder.embed(texts)
        except Exception as exc:        # the embedder failed to load or to run: an outage, not a bug here
            raise InferenceError(f"embedding failed: {type(exc).__name__}: {exc}") from exc

    def count_tokens(self, text: str) -> int:
        try:
            return len(self.engine.tokenizer.encode(text))
        except Exception as exc:        # the engine failed to load
            raise InferenceError(f"tokenizer unavailable: {type(exc).__name__}: {exc}") from exc

    def max_model_len(self) -> int:
        try:
            return self.engine.max_model_len
        except Exception as exc:
            raise InferenceError(f"engine unavailable: {type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()


SMALL_EMBED = 8            # texts: a chat turn's embedding call, answered in milliseconds


class HttpClient:
    def __init__(self, base_url: str, api_key: str | None = None, model: str | None = None,
                 connect_s: float = 2.0, first_token_s: float = 60.0, total_s: float = 120.0):
        """connect_s: TCP connect; first_token_s: the longest wait for the next bytes (headers,
        then each streamed line: the first token's wait is the longest of them; and a turn's
        small embedding call); total_s: the whole request, and the wait for a batch embedding
        (an index build), whose answer comes all at once."""
        import requests
        self.base_url = base_url.rstrip("/")
        self.session = requests.Session()
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"
        self.model = model
        self.timeout = (connect_s, first_token_s)
        self.total_s = total_s
        self._lock = threading.Lock()
        self._open: dict = {}                        # request_id -> its streaming response
        self._aborted: set[str] = set()              # request ids closed by abort()
        self._usage: dict[str, tuple[int, int, int]] = {}  # request_id -> (prompt, generated, cached) tokens

    def _request(self, method: str, path: str, timeout: tuple | None = None, **kw):
        import requests
        try:
            resp = self.session.request(method, self.base_url + path, timeout=timeout or self.timeout, **kw)
        except requests.RequestException as exc:
            raise InferenceError(f"inference service unreachable at {self.base_url}: {exc}") from exc
        if 400 <= resp.status_code < 500 and resp.status_code not in (408, 429):
            raise RequestRejected(f"inference service refused the request ({resp.status_code}): {resp.text[:300]}")
        if resp.status_code >= 400:
            raise InferenceError(f"inference service answered {resp.status_code}: {resp.text[:300]}")
        return resp

    def _post(self, path: str, body: dict, stream: bool = False):
        return self._request("POST", path, json=body, stream=stream)

    def chat_stream(self, messages, *, temperature=0.7, top_p=1.0, max_tokens=512) -> Iterator[str]:
        body = {"model": self._served_model(), "messages": messages, "temperature": temperature, "top_p": top_p,
                "max_tokens": max_tokens, "stream": True}
        for event in self._sse("/v1/chat/completions", body):
            for choice in event.get("choices", []):
                text = (choice.get("delta") or {}).get("content")
                if text:
                    yield text

    def call_tool(self, messages, tools, name=None, max_tokens=160) -> tuple[str, dict] | None:
        choice = {"type": "function", "function": {"name": name}} if name else "required"
        body = {"model": self._served_model(), "messages": messages, "tools": tools, "tool_choice": choice,
                "temperature": 0.0, "max_tokens": max_tokens}
        message = ((self._post("/v1/chat/completions", body).json().get("choices") or [{}])[0].get("message") or {})
        for call in message.get("tool_calls") or []:
            fn = call.get("function") or {}
            try:
                args = json.loads(fn.get("arguments") or "{}")
            except ValueError:
                continue
            if isinstance(args, dict) and isinstance(fn.get("name"), str):
                return fn["name"], args
        return None

    def complete_stream(self, prompt, *, max_tokens, temperature, top_p, stop, seed=None,
                        request_id=None, top_k=-1, cache_reuse=0) -> Iterator[str]:
        body = {"model": self._served_model(), "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
                "top_p": top_p, "top_k": top_k if top_k > 0 else None, "stop": stop or None, "seed": seed,
                "cache_reuse": cache_reuse or None,
                "stream": True,
                "stream_options": {"include_usage": True}}
        usage = (0, 0, 0)
        try:
            for event in self._sse("/v1/completions", {k: v for k, v in body.items() if v is not None}, request_id):
                if event.get("usage"):
                    u = event["usage"]
                    usage = (u["prompt_tokens"], u["completion_tokens"],
                             (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
                for choice in event.get("choices", []):
                    if choice.get("text"):
                        yield choice["text"]
        finally:
            if request_id is not None:
                with self._lock:
                    self._usage[request_id] = usage
                    while len(self._usage) > 4096:
                        self._usage.pop(next(iter(self._usage)))

    def _sse(self, path: str, body: dict, request_id: str | None = None) -> Iterator[dict]:
        """The JSON events of a streamed response up to [DONE]; InferenceError if it breaks, ends
        early or outlasts total_s. A request_id lets `abort` close it (the service then aborts
        the request before its next engine step)."""
        import requests
        deadline = time.monotonic() + self.total_s
        aborted = False
        with self._post(path, body, stream=True) as resp:
            if request_id is not None:
                with self._lock:
                    self._open[request_id] = resp
            # a service that stops sending (hung, SIGSTOP) would hold this thread for the read
            # time-out after every byte it did send: at the deadline the socket is shut down,
            # which wakes the blocked read, so no request outlives total_s
            watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), _shut_down, (resp,))
            watchdog.daemon = True
            watchdog.start()
            try:
                for line in resp.iter_lines(decode_unicode=True):
                    if time.monotonic() > deadline:
                        raise InferenceError(f"inference stream from {self.base_url} outlasted {self.total_s} s")
                    if not line or not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        return
                    event = json.loads(data)
                    if "error" in event:
                        raise InferenceError(str(event["error"]))
                    yield event
            except (requests.RequestException, ValueError, AttributeError) as exc:
                # cut off mid-stream, bad JSON, or closed by abort (urllib3 drops its fp)
                if request_id is not None and request_id in self._aborted:
                    return
                if time.monotonic() >= deadline:
                    raise InferenceError(f"inference stream from {self.base_url} outlasted {self.total_s} s") from exc
                raise InferenceError(f"inference stream from {self.base_url} broke: {exc}") from exc
            finally:
                watchdog.cancel()
                if request_id is not None:
                    with self._lock:
                        self._open.pop(request_id, None)
                        aborted = request_id in self._aborted
                        self._aborted.discard(request_id)
        if aborted:
            return
        raise InferenceError(f"inference stream from {self.base_url} ended without [DONE]")

    def abort(self, request_id: str) -> None:
        """Close a running complete_stream's connection: the service aborts it at once."""
        with self._lock:
            resp = self._open.get(request_id)
            if resp is not None:
                self._aborted.add(request_id)
        if resp is not None:
            resp.close()

    def usage(self, request_id: str) -> tuple[int, int, int] | None:
        with self._lock:
            return self._usage.pop(request_id, None)

    def _served_model(self) -> str:
        """The model the service serves (GET /v1/models), unless one was given."""
        if not self.model:
            self.model = self._request("GET", "/v1/models").json()["data"][0]["id"]
        return self.model

    def embed(self, texts: list[str]) -> np.ndarray:
        timeout = self.timeout if len(texts) <= SMALL_EMBED else (self.timeout[0], self.total_s)
        data = self._request("POST", "/v1/embeddings", json={"input": texts}, timeout=timeout).json()["data"]
        return np.asarray([d["embedding"] for d in sorted(data, key=lambda d: d["index"])], dtype=np.float32)

    def count_tokens(self, text: str) -> int:
        return int(self._post("/tokenize", {"prompt": text}).json()["count"])

    def max_model_len(self) -> int:
        if getattr(self, "_max_model_len", None) is None:
            self._max_model_len = int(self._post("/tokenize", {"prompt": "x"}).json()["max_model_len"])
        return self._max_model_len


def _shut_down(resp) -> None:
    """Wake a read blocked on `resp`'s socket (closing the response alone does not)."""
    import socket
    sock = getattr(getattr(resp.raw, "connection", None), "sock", None)
    try:
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass                                   # already closed
