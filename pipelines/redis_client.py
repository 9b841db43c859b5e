"""One way to open Redis for the web tier: short time-outs and retries with exponential backoff
on connection errors, so a Redis restart (a second or two) is ridden out by the requests in
flight instead of turning into errors. Beyond the retries the error reaches the caller."""
from __future__ import annotations

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

RETRIES = 8                  # 50 ms doubling, capped at 1 s: ~4 s in all


def connect(url: str, decode_responses: bool = True, **kw) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=decode_responses, socket_connect_timeout=2, socket_timeout=5,
                                retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), RETRIES),
                                retry_on_error=[RedisConnectionError, RedisTimeoutError],
                                health_check_interval=15, **kw)
