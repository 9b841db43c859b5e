"""Tasks whose publish failed because the Celery broker was down, sent again once it is back.

A handoff must not fail because the broker is down: the handoff itself is in the session store
at once (status pending_human); only its summary task waits here. A thread retries the oldest
task with backoff (0.5 s doubling to 5 s) and sends the rest in order once one goes through.
The outbox lives in this web process: one killed while the broker is down loses what waits
(the log and `num_pending` say how many), never the handoff status.
"""
from __future__ import annotations

import collections
import logging
import threading

log = logging.getLogger(__name__)


class Outbox:
    def __init__(self, publish, max_delay_s: float = 5.0):
        """`publish(task, args)` sends one task to the broker or raises."""
        self.publish, self.max_delay_s = publish, max_delay_s
        self._pending: collections.deque[tuple] = collections.deque()     # (task, args), oldest first
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.num_sent = 0

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def put(self, task, args: tuple) -> None:
        with self._lock:
            self._pending.append((task, args))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._drain, name="celery-outbox", daemon=True)
                self._thread.start()
        log.warning("Celery broker unavailable: %s queued in this process (%d waiting)", task.name, self.num_pending)

    def _drain(self) -> None:
        delay = 0.5
        while True:
            with self._lock:
                if not self._pending:
                    self._thread = None
                    return
                task, args = self._pending[0]
            try:
                self.publish(task, args)
            except Exception as exc:              # noqa: BLE001 - still down: wait and try again
                log.debug("outbox: publish of %s failed: %s", task.name, exc)
                self._wake.wait(delay)
                delay = min(self.max_delay_s, delay * 2)
                continue
            delay = 0.5
            with self._lock:
                self._pending.popleft()
                self.num_sent += 1
