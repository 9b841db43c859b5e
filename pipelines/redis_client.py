"""One way to open Redis for the web tier: short time-outs and retries with exponential backoff
on connection errors, so a Redis restart (a second or two) is ridden out by the requests in
flight instead of turning into errors. Beyond the retries the error reaches the caller.

Callers that have somewhere else to go while Redis is down (the buffered session store, the
breaker state, readiness probes) pass fewer retries and shorter time-outs: for them waiting out
an outage costs more than going on without Redis."""
from __future__ import annotations

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

RETRIES = 8                  # 50 ms doubling, capped at 1 s: ~4 s in all


def connect(url: str, decode_responses: bool = True, retries: int = RETRIES, connect_timeout_s: float = 2.0,
            timeout_s: float = 5.0, **kw) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=decode_responses, socket_connect_timeout=connect_timeout_s,
                                socket_timeout=timeout_s,
                                retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries),
                                retry_on_error=[RedisConnectionError, RedisTimeoutError],
                                health_check_interval=15, **kw)
