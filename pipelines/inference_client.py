"""How the pipelines reach the inference core: one protocol, two transports.

    InProcessClient   the embedded default: an OnlineEngine and the sentence embedder in this
                      process (torch is imported only when it is first used)
    HttpClient        the OpenAI-compatible inference service at INFERENCE_URL
                      (/v1/chat/completions streamed, /v1/embeddings, /tokenize)

`client_from_env()` picks one. Both raise InferenceError when the core cannot answer, so the
caller can fall back (the reliability issue wraps this in a circuit breaker).
"""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from typing import Protocol

import numpy as np


class InferenceError(RuntimeError):
    """The inference core failed or is unreachable."""


class InferenceClient(Protocol):
    def chat_stream(self, messages: list[dict], *, temperature: float = 0.7, top_p: float = 1.0,
                    max_tokens: int = 512) -> Iterator[str]:
        """The assistant's reply to `messages`, as text pieces while it is generated."""

    def embed(self, texts: list[str]) -> np.ndarray:
        """[N, dim] float32 unit vectors."""

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` for the chat model (prompt budgeting)."""

    def max_model_len(self) -> int:
        """The chat model's context length (prompt + generated tokens)."""

    def complete_stream(self, prompt: str, *, max_tokens: int, temperature: float, top_p: float,
                        stop: list[str], seed: int | None = None, request_id: str | None = None) -> Iterator[str]:
        """A raw completion of `prompt` (code completion), as text pieces."""

    def abort(self, request_id: str) -> None:
        """Stop a running complete_stream now (its KV blocks are freed at once)."""

    def usage(self, request_id: str) -> tuple[int, int] | None:
        """(prompt tokens, generated tokens) of a finished complete_stream, if the client knows."""


class InProcessClient:
    def __init__(self, model: str = "smollm2", **engine_args):
        self.model, self.engine_args = model, engine_args
        self._engine = None
        self._embedder = None
        self._lock = threading.Lock()
        self._usage: dict[str, tuple[int, int]] = {}          # request_id -> (prompt, generated)

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
        except (RuntimeError, ValueError) as exc:      # engine down, or the prompt does not fit
            raise InferenceError(str(exc)) from exc
        try:
            for delta in stream:
                if delta.error:
                    raise InferenceError(delta.error)
                if delta.text:
                    yield delta.text
        finally:
            if not stream.finished:
                stream.abort()              # the caller stopped reading: free the KV blocks now

    def complete_stream(self, prompt, *, max_tokens, temperature, top_p, stop, seed=None,
                        request_id=None) -> Iterator[str]:
        from inference.sampling_params import SamplingParams
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=stop or None,
                                seed=seed)
        try:
            stream = self.engine.add_request(prompt, params, request_id)
        except (RuntimeError, ValueError) as exc:
            raise InferenceError(str(exc)) from exc
        usage = [0, 0]
        try:
            for delta in stream:
                if delta.error:
                    raise InferenceError(delta.error)
                usage = [delta.num_prompt_tokens or usage[0], delta.num_output_tokens]
                if delta.text:
                    yield delta.text
        finally:
            if not stream.finished:
                stream.abort()
            if request_id is not None:
                with self._lock:
                    self._usage[request_id] = (usage[0], usage[1])
                    while len(self._usage) > 4096:
                        self._usage.pop(next(iter(self._usage)))

    def abort(self, request_id: str) -> None:
        if self._engine is not None:
            self._engine.abort(request_id)

    def usage(self, request_id: str) -> tuple[int, int] | None:
        with self._lock:
            return self._usage.pop(request_id, None)

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.embedder.embed(texts)

    def count_tokens(self, text: str) -> int:
        return len(self.engine.tokenizer.encode(text))

    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def close(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()


class HttpClient:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 60.0, model: str | None = None):
        import requests
        self.base_url = base_url.rstrip("/")
        self.session = requests.Session()
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout, self.model = timeout, model

    def _request(self, method: str, path: str, **kw):
        import requests
        try:
            resp = self.session.request(method, self.base_url + path, timeout=self.timeout, **kw)
        except requests.RequestException as exc:
            raise InferenceError(f"inference service unreachable at {self.base_url}: {exc}") from exc
        if resp.status_code >= 400:
            raise InferenceError(f"inference service answered {resp.status_code}: {resp.text[:300]}")
        return resp

    def _post(self, path: str, body: dict, stream: bool = False):
        return self._request("POST", path, json=body, stream=stream)

    def chat_stream(self, messages, *, temperature=0.7, top_p=1.0, max_tokens=512) -> Iterator[str]:
        body = {"model": self._served_model(), "messages": messages, "temperature": temperature, "top_p": top_p,
                "max_tokens": max_tokens, "stream": True}
        import requests
        with self._post("/v1/chat/completions", body, stream=True) as resp:
            try:
                for line in resp.iter_lines(decode_unicode=True):
                    if not line or not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        return
                    event = json.loads(data)
                    if "error" in event:
                        raise InferenceError(str(event["error"]))
                    for choice in event.get("choices", []):
                        text = (choice.get("delta") or {}).get("content")
                        if text:
                            yield text
            except (requests.RequestException, ValueError) as exc:     # cut off mid-stream, bad JSON
                raise InferenceError(f"inference stream from {self.base_url} broke: {exc}") from exc
        raise InferenceError(f"inference stream from {self.base_url} ended without [DONE]")

    def _served_model(self) -> str:
        """The model the service serves (GET /v1/models), unless one was given."""
        if not self.model:
            self.model = self._request("GET", "/v1/models").json()["data"][0]["id"]
        return self.model

    def embed(self, texts: list[str]) -> np.ndarray:
        data = self._post("/v1/embeddings", {"input": texts}).json()["data"]
        return np.asarray([d["embedding"] for d in sorted(data, key=lambda d: d["index"])], dtype=np.float32)

    def count_tokens(self, text: str) -> int:
        return int(self._post("/tokenize", {"prompt": text}).json()["count"])

    def max_model_len(self) -> int:
        if getattr(self, "_max_model_len", None) is None:
            self._max_model_len = int(self._post("/tokenize", {"prompt": "x"}).json()["max_model_len"])
        return self._max_model_len


def client_from_env(**engine_args) -> InferenceClient:
    """HttpClient when INFERENCE_URL is set (INFERENCE_API_KEY for its bearer key), else the
    in-process engine on MODEL (default smollm2)."""
    url = os.environ.get("INFERENCE_URL")
    if url:
        return HttpClient(url, os.environ.get("INFERENCE_API_KEY"))
    return InProcessClient(os.environ.get("MODEL", "smollm2"), **engine_args)
