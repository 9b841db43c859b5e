"""Background job status (repository and knowledge-base indexing) and batch-generation jobs:
Redis when REDIS_URL is set, else in process. (Conversations are in the database:
app/store/conversations.py.)
"""
from __future__ import annotations

import json
import threading

from redis.exceptions import WatchError


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
