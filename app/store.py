"""Chat sessions and their history: Redis when REDIS_URL is set, else in process.

Every key carries the tenant id, so a session id from one tenant never opens another tenant's
session (the lookup simply misses). Sessions expire `ttl` seconds after their last write.

    chat:{tenant}:{session}:meta      hash  status, created, handoff_summary
    chat:{tenant}:{session}:messages  list  JSON messages, oldest first
    chat:{tenant}:{session}:feedback  list  JSON feedback records
    chat:{tenant}:{session}:op:{id}   str   index an append got (guards retries, expires with the session)

Appends run as one Lua script guarded by a fresh operation id: a Redis connection that drops
after the write but before the reply makes the client retry (pipelines/redis_client.py), and the
retry then returns the first attempt's index instead of appending the message twice.
"""
from __future__ import annotations

import json
import secrets
import threading
import time

from redis.exceptions import WatchError


def _key(tenant: str, sid: str, part: str) -> str:
    return f"chat:{tenant}:{sid}:{part}"


# KEYS: list to push to, the operation's guard key, keys to refresh the TTL of; ARGV: value, ttl
_APPEND_ONCE = """
local done = redis.call('GET', KEYS[2])
if done then return tonumber(done) end
local n = redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], n - 1, 'EX', ARGV[2])
for i = 1, #KEYS do
  if i ~= 2 then redis.call('EXPIRE', KEYS[i], ARGV[2]) end
end
return n - 1
"""


def new_session_meta() -> tuple[str, dict]:
    """A fresh session id and its first meta fields."""
    return secrets.token_urlsafe(16), {"status": "open", "created": f"{time.time():.3f}"}


def new_op_id() -> str:
    """The guard that makes one append land once, however often it is sent."""
    return secrets.token_hex(8)


class RedisStore:
    def __init__(self, url: str, ttl: int = 7 * 24 * 3600, **connect_kw):
        from pipelines.redis_client import connect
        self.r = connect(url, **connect_kw)
        self.ttl = ttl
        self._append_script = self.r.register_script(_APPEND_ONCE)

    def create(self, tenant: str, sid: str | None = None, meta: dict | None = None) -> str:
        """A new session; `sid` / `meta` replay one created while Redis was down."""
        if sid is None:
            sid, meta = new_session_meta()
        with self.r.pipeline() as p:
            p.hset(_key(tenant, sid, "meta"), mapping=meta)
            p.expire(_key(tenant, sid, "meta"), self.ttl)
            p.execute()
        return sid

    def exists(self, tenant: str, sid: str) -> bool:
        return bool(self.r.exists(_key(tenant, sid, "meta")))

    def meta(self, tenant: str, sid: str) -> dict | None:
        meta = self.r.hgetall(_key(tenant, sid, "meta"))
        return meta or None

    def messages(self, tenant: str, sid: str) -> list[dict]:
        return [json.loads(m) for m in self.r.lrange(_key(tenant, sid, "messages"), 0, -1)]

    def _append_once(self, tenant: str, sid: str, part: str, record: dict, also: tuple[str, ...] = (),
                     op_id: str | None = None) -> int:
        op = _key(tenant, sid, f"op:{op_id or new_op_id()}")
        keys = [_key(tenant, sid, part), op, *(_key(tenant, sid, a) for a in also)]
        return int(self._append_script(keys=keys, args=[json.dumps(record, ensure_ascii=False), self.ttl]))

    def append(self, tenant: str, sid: str, message: dict, op_id: str | None = None) -> int:
        """Appends once (also across retries, and across replays of one `op_id`); returns the
        message's index."""
        return self._append_once(tenant, sid, "messages", message, also=("meta",), op_id=op_id)

    def set_meta(self, tenant: str, sid: str, **fields: str) -> None:
        """Updates an existing session only (a late task must not revive an expired one)."""
        key = _key(tenant, sid, "meta")
        with self.r.pipeline() as p:
            p.exists(key)
            p.ttl(key)
            exists, ttl = p.execute()
        if exists:
            with self.r.pipeline() as p:
                p.hset(key, mapping=fields)
                p.expire(key, max(int(ttl), 1))
                p.execute()

    def add_feedback(self, tenant: str, sid: str, record: dict, op_id: str | None = None) -> None:
        self._append_once(tenant, sid, "feedback", record, op_id=op_id)

    def feedback(self, tenant: str, sid: str) -> list[dict]:
        return [json.loads(m) for m in self.r.lrange(_key(tenant, sid, "feedback"), 0, -1)]


class MemoryStore:
    """The embedded default's store: same interface, same tenant-scoped keys, in this process."""

    def __init__(self, ttl: int = 7 * 24 * 3600):
        self.ttl = ttl
        self._data: dict[str, dict] = {}          # "tenant:sid" -> {"meta", "messages", "feedback", "expires"}
        self._lock = threading.Lock()
        self._created = 0

    def _get(self, tenant: str, sid: str) -> dict | None:
        item = self._data.get(f"{tenant}:{sid}")
        if item is not None and item["expires"] < time.time():
            self._data.pop(f"{tenant}:{sid}", None)
            return None
        return item

    def create(self, tenant: str) -> str:
        sid, meta = new_session_meta()
        with self._lock:
            self._created += 1
            if self._created % 256 == 0:      # sweep expired sessions now and then
                now = time.time()
                for key in [k for k, v in self._data.items() if v["expires"] < now]:
                    del self._data[key]
            self._data[f"{tenant}:{sid}"] = {"meta": meta,
                                             "messages": [], "feedback": [], "expires": time.time() + self.ttl}
        return sid

    def exists(self, tenant: str, sid: str) -> bool:
        return self._get(tenant, sid) is not None

    def meta(self, tenant: str, sid: str) -> dict | None:
        item = self._get(tenant, sid)
        return dict(item["meta"]) if item else None

    def messages(self, tenant: str, sid: str) -> list[dict]:
        item = self._get(tenant, sid)
        return [dict(m) for m in item["messages"]] if item else []

    def append(self, tenant: str, sid: str, message: dict) -> int:
        with self._lock:
            item = self._get(tenant, sid)
            if item is None:                  # expired meanwhile: nothing to add to
                return -1
            item["messages"].append(dict(message))
            item["expires"] = time.time() + self.ttl
            return len(item["messages"]) - 1

    def set_meta(self, tenant: str, sid: str, **fields: str) -> None:
        with self._lock:
            item = self._get(tenant, sid)
            if item is not None:
                item["meta"].update(fields)

    def add_feedback(self, tenant: str, sid: str, record: dict) -> None:
        with self._lock:
            item = self._get(tenant, sid)
            if item is not None:
                item["feedback"].append(dict(record))

    def feedback(self, tenant: str, sid: str) -> list[dict]:
        item = self._get(tenant, sid)
        return [dict(f) for f in item["feedback"]] if item else []


class JobStore:
    """Background job status (repository indexing): Redis hash `job:{id}` when REDIS_URL is set,
    else a dict. Entries expire after `ttl` seconds."""

    def __init__(self, url: str | None, ttl: int = 7 * 24 * 3600):
        self.ttl = ttl
        self._mem: dict[str, dict] = {}
        self._lock = threading.Lock()
        self.r = None
        if url:
            from pipelines.redis_client import connect
            self.r = connect(url)

    def set(self, job_id: str, **fields) -> None:
        fields = {k: json.dumps(v) for k, v in fields.items()}
        if self.r is not None:
            with self.r.pipeline() as p:
                p.hset(f"job:{job_id}", mapping=fields)
                p.expire(f"job:{job_id}", self.ttl)
                p.execute()
        else:
            with self._lock:
                self._mem.setdefault(job_id, {}).update(fields)

    def get(self, job_id: str) -> dict | None:
        raw = self.r.hgetall(f"job:{job_id}") if self.r is not None else dict(self._mem.get(job_id, {}))
        return {k: json.loads(v) for k, v in raw.items()} or None


class BatchStore(JobStore):
    """Batch-generation jobs: their status (as JobStore), their input items, one result per item
    index, and idempotency keys per tenant. Results are keyed by index, so a task that runs again
    after its worker died skips what is done and never writes an item twice."""

    def _key(self, job_id: str, part: str) -> str:
        return f"job:{job_id}:{part}"

    def create(self, job_id: str, tenant_id: str, items: list[dict], idempotency_key: str | None) -> str:
        """Store a new job, or return the job an earlier request with the same key created."""
        if idempotency_key:
            ikey = f"idem:{tenant_id}:{idempotency_key}"
            if self.r is not None:
                if not self.r.set(ikey, job_id, nx=True, ex=self.ttl):
                    return self.r.get(ikey)
            else:
                with self._lock:
                    existing = self._mem.setdefault("__idem__", {}).setdefault(ikey, job_id)
                if existing != job_id:
                    return existing
        payload = [json.dumps(i) for i in items]
        if self.r is not None:
            with self.r.pipeline() as p:           # MULTI: DEL first, so a retried EXEC pushes no duplicates
                p.delete(self._key(job_id, "items"))
                p.rpush(self._key(job_id, "items"), *payload)
                p.expire(self._key(job_id, "items"), self.ttl)
                p.execute()
        else:
            with self._lock:
                self._mem[self._key(job_id, "items")] = payload
        self.set(job_id, tenant=tenant_id, status="queued", total=len(items), done=0, kind="generate")
        return job_id

    def discard(self, job_id: str, tenant_id: str, idempotency_key: str | None) -> None:
        """Forget a job that was never queued (its idempotency key too, if it still names it)."""
        ikey = f"idem:{tenant_id}:{idempotency_key}" if idempotency_key else None
        keys = [f"job:{job_id}", self._key(job_id, "items"), self._key(job_id, "results")]
        if self.r is not None:
            if ikey and self.r.get(ikey) == job_id:
                keys.append(ikey)
            self.r.delete(*keys)
            return
        with self._lock:
            for key in keys:
                self._mem.pop(key, None)
            idem = self._mem.get("__idem__", {})
            if ikey and idem.get(ikey) == job_id:
                del idem[ikey]

    def items(self, job_id: str) -> list[dict]:
        raw = self.r.lrange(self._key(job_id, "items"), 0, -1) if self.r is not None else \
            list(self._mem.get(self._key(job_id, "items"), []))
        return [json.loads(x) for x in raw]

    def put_result(self, job_id: str, index: int, result: dict) -> int:
        """Record item `index`'s result (again is a no-op); returns how many are done."""
        key = self._key(job_id, "results")
        if self.r is not None:
            with self.r.pipeline() as p:
                p.hsetnx(key, str(index), json.dumps(result))
                p.expire(key, self.ttl)
                p.hlen(key)
                return p.execute()[2]
        with self._lock:
            results = self._mem.setdefault(key, {})
            results.setdefault(str(index), json.dumps(result))
            return len(results)

    def results(self, job_id: str) -> dict[int, dict]:
        key = self._key(job_id, "results")
        raw = self.r.hgetall(key) if self.r is not None else dict(self._mem.get(key, {}))
        return {int(k): json.loads(v) for k, v in raw.items()}

    def finish(self, job_id: str, status: str, **fields) -> bool:
        """Move a running job to a final status once; False if it already had one."""
        final = ("done", "failed", "cancelled")
        if self.r is not None:
            # a transaction on the status field: of two racing workers only one finishes the job
            with self.r.pipeline() as p:
                while True:
                    try:
                        p.watch(f"job:{job_id}")
                        current = json.loads(p.hget(f"job:{job_id}", "status") or "null")
                        if current in final:
                            p.reset()
                            return False
                        p.multi()
                        p.hset(f"job:{job_id}", mapping={k: json.dumps(v) for k, v in
                                                         {"status": status, **fields}.items()})
                        p.hincrby(f"job:{job_id}", "finished_times", 1)
                        p.execute()
                        return True
                    except WatchError:                # someone wrote in between; look again
                        continue
        with self._lock:
            job = self._mem.setdefault(job_id, {})
            if json.loads(job.get("status", "null")) in final:
                return False
            job.update({k: json.dumps(v) for k, v in {"status": status, **fields}.items()})
            job["finished_times"] = json.dumps(json.loads(job.get("finished_times", "0")) + 1)
            return True
