"""The completion cache: LRU + TTL keyed by the text before the cursor and the request's
settings, exact entries optionally shared through Redis, and "forward" hits when the user typed
the start of a recent suggestion."""
from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict, deque

FORWARD_WINDOW = 8                   # recent suggestions per settings a forward hit may extend


class CompletionCache:
    """LRU + TTL, keyed by the effective prompt and sampling settings. A "forward" hit: the user
    typed exactly the start of a cached suggestion, so the rest of it is the answer. With
    `redis_url`, exact entries are also kept in Redis (with a TTL), shared by every web worker;
    forward hits come from this process's recent entries."""

    def __init__(self, capacity: int = 1024, ttl: float = 600.0, redis_url: str | None = None):
        self.capacity, self.ttl = capacity, ttl
        self._items: OrderedDict[str, tuple[float, str, str, str]] = OrderedDict()   # key -> (t, ctx, settings, text)
        self._lock = threading.Lock()
        self._recent: OrderedDict[str, deque] = OrderedDict()      # settings -> last (t, context, text)
        self.hits = self.forward_hits = self.misses = 0
        self.redis = None
        if redis_url:
            from pipelines.redis_client import connect
            self.redis = connect(redis_url)

    @staticmethod
    def _key(context: str, settings: str) -> str:
        return hashlib.blake2b(f"{settings}\x00{context}".encode(), digest_size=16).hexdigest()

    def lookup(self, context: str, settings: str) -> tuple[str, str] | None:
        """(text, "exact" | "forward") or None."""
        now, key = time.monotonic(), self._key(context, settings)
        with self._lock:
            item = self._items.get(key)
            if item is not None and now - item[0] < self.ttl:
                self._items.move_to_end(key)
                self.hits += 1
                return item[3], "exact"
        if self.redis is not None:
            text = self.redis.get(f"cmpl:{key}")
            if text is not None:
                with self._lock:
                    self.hits += 1
                return text, "exact"
        with self._lock:
            # forward hits come from the last few suggestions with the same settings only: the
            # user keeps typing into the suggestion they were just shown
            for t, ctx, text in reversed(self._recent.get(settings, ())):
                if now - t >= self.ttl or not context.startswith(ctx):
                    continue
                typed = context[len(ctx):]
                if typed and text.startswith(typed) and len(text) > len(typed):
                    self.forward_hits += 1
                    return text[len(typed):], "forward"
            self.misses += 1
            return None

    def get(self, context: str, settings: str) -> str | None:
        found = self.lookup(context, settings)
        return None if found is None else found[0]

    def put(self, context: str, settings: str, text: str) -> None:
        key, now = self._key(context, settings), time.monotonic()
        with self._lock:
            self._items[key] = (now, context, settings, text)
            self._items.move_to_end(key)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
            recent = self._recent.setdefault(settings, deque(maxlen=FORWARD_WINDOW))
            recent.append((now, context, text))
            self._recent.move_to_end(settings)
            while len(self._recent) > 256:                 # settings differ per suffix: keep the last few
                self._recent.popitem(last=False)
        if self.redis is not None:
            self.redis.set(f"cmpl:{key}", text, ex=int(self.ttl))
