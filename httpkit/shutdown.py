"""Graceful shutdown of a WSGI server (the web app and the inference service both run waitress):

    SIGTERM / SIGINT
      -> on_drain() (e.g. end open live-event streams: their clients reconnect elsewhere)
      -> draining: new requests get 503 {"error": "shutting down"} with Retry-After (a load
         balancer retries them on another replica), health checks fail
      -> in-flight requests, streamed replies included, run to their end, for at most
         `drain_s` seconds
      -> on_exit() (e.g. stop the engine), then the process exits 0

A request counts as in flight until its response iterable is closed, so a chat reply streamed
over SSE keeps the process alive until its last event is sent.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)
DRAINING_BODY = b'{"error": "shutting down: retry on another replica"}'


class _Tracked:
    """A response iterable that reports its end (close) once."""

    def __init__(self, result: Iterable[bytes], done: Callable[[], None]):
        self._result, self._done, self._closed = result, done, False

    def __iter__(self):
        return iter(self._result)

    def close(self) -> None:
        try:
            if hasattr(self._result, "close"):
                self._result.close()
        finally:
            if not self._closed:
                self._closed = True
                self._done()


class GracefulShutdown:
    """WSGI middleware + signal handling. Wrap the app, then `install()` in the main thread."""

    def __init__(self, app, drain_s: float = 30.0, on_exit: Callable[[], None] | None = None,
                 exit: Callable[[int], None] = os._exit, flush_s: float = 1.0,
                 on_drain: Callable[[], None] | None = None):
        """flush_s: how long the server gets, once the last response is closed, to write what it
        still buffers to the sockets (waitress closes the iterable before its output is sent)."""
        self.app, self.drain_s, self.on_exit, self._exit, self.flush_s = app, drain_s, on_exit, exit, flush_s
        self.on_drain = on_drain
        self.draining = False
        self.in_flight = 0
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)

    def __call__(self, environ, start_response):
        if self.draining:
            # (no Connection: close: WSGI apps may not set hop-by-hop headers; waitress refuses them)
            start_response("503 Service Unavailable", [("Content-Type", "application/json"), ("Retry-After", "5")])
            return [DRAINING_BODY]
        with self._lock:
            self.in_flight += 1
        try:
            result = self.app(environ, start_response)
        except BaseException:
            self._finished()
            raise
        return _Tracked(result, self._finished)

    def _finished(self) -> None:
        with self._lock:
            self.in_flight -= 1
            self._idle.notify_all()

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, _frame) -> None:
        if self.draining:                  # a second signal: stop now
            self._exit(1)
            return
        self.draining = True
        log.warning("signal %s: draining %d in-flight request(s), at most %.0f s", signum, self.in_flight, self.drain_s)
        threading.Thread(target=self.drain_and_exit, name="graceful-shutdown", daemon=True).start()

    def drain_and_exit(self) -> None:
        deadline = time.monotonic() + self.drain_s
        if self.on_drain is not None:
            try:
                self.on_drain()
            except Exception:                   # draining must go on whatever the hook does
                log.exception("shutdown: on_drain failed")
        with self._lock:
            while self.in_flight > 0 and time.monotonic() < deadline:
                self._idle.wait(timeout=max(0.0, deadline - time.monotonic()))
            left = self.in_flight
        if left:
            log.warning("shutdown: %d request(s) still running after %.0f s; exiting anyway", left, self.drain_s)
        time.sleep(self.flush_s)
        try:
            if self.on_exit is not None:
                self.on_exit()
        finally:
            logging.shutdown()
            self._exit(0)
