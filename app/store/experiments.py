"""A/B experiments in the conversation store (table experiments; conversations.experiment_id/arm).

One experiment runs per tenant at a time. It changes one factor of the chat per arm:

    answer_mode     extractive | grounded_generation | free (pipelines/grounded_answer.py)
    system_prompt   the tenant's system prompt text
    max_tokens      a generated reply's token budget: the latency lever (a grounded reply keeps
                    its own cap of 96 as the upper bound)

A conversation gets its arm at its first turn while the experiment runs, and keeps it: the arm is
a hash of the experiment and conversation ids mapped onto the arms' cumulative weights, so the
split follows the weights and the same conversation always lands in the same arm. A conversation
that started before the experiment stays outside it.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import threading
import time

from sqlalchemy import select, update

from app.store.conversations import iso
from app.store.db import Database
from app.store.handoffs import Conflict, NotFound
from app.store.models import Conversation, Experiment, utcnow


def experiment_view(e: Experiment) -> dict:
    return {"id": e.id, "name": e.name, "factor": e.factor, "arms": list(e.arms or []), "status": e.status,
            "started_at": iso(e.started_at), "stopped_at": iso(e.stopped_at)}


def pick_arm(experiment_id: int, conversation_id: str, arms: list[dict]) -> str:
    """The conversation's arm: a uniform draw from the ids' hash against the cumulative weights."""
    digest = hashlib.sha256(f"{experiment_id}:{conversation_id}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2.0 ** 64
    total = 0.0
    for arm in arms:
        total += float(arm["weight"])
        if u < total:
            return arm["name"]
    return arms[-1]["name"]


class ExperimentStore:
    def __init__(self, db: Database, cache_s: float = 2.0):
        self.db, self.cache_s = db, cache_s
        self._cache: dict[str, tuple[float, dict | None]] = {}
        self._lock = threading.Lock()

    def start(self, tenant: str, name: str, factor: str, arms: list[dict]) -> dict:
        """A running experiment; Conflict while another one runs for the tenant."""
        with self.db.session() as s:
            running = s.scalar(select(Experiment).where(Experiment.tenant_id == tenant, Experiment.status == "running"))
            if running is not None:
                raise Conflict(f"experiment {running.id} ({running.name!r}) is running for this tenant; "
                               "stop it before starting another")
            e = Experiment(tenant_id=tenant, name=name, factor=factor, arms=arms, status="running", started_at=utcnow())
            s.add(e)
            s.flush()
            view = experiment_view(e)
        self._cache.pop(tenant, None)
        return view

    def stop(self, tenant: str, experiment_id: int) -> dict:
        with self.db.session() as s:
            e = s.scalar(select(Experiment).where(Experiment.id == experiment_id, Experiment.tenant_id == tenant))
            if e is None:
                raise NotFound(str(experiment_id))
            if e.status != "running":
                raise Conflict(f"experiment {experiment_id} is already stopped")
            e.status, e.stopped_at = "stopped", utcnow()
            s.flush()
            view = experiment_view(e)
        self._cache.pop(tenant, None)
        return view

    def list(self, tenant: str) -> list[dict]:
        with self.db.session(readonly=True) as s:
            return [experiment_view(e) for e in s.scalars(select(Experiment).where(Experiment.tenant_id == tenant)
                                                           .order_by(Experiment.id.desc())).all()]

    def get(self, tenant: str, experiment_id: int) -> dict:
        with self.db.session(readonly=True) as s:
            e = s.scalar(select(Experiment).where(Experiment.id == experiment_id, Experiment.tenant_id == tenant))
            if e is None:
                raise NotFound(str(experiment_id))
            return experiment_view(e)

    def running(self, tenant: str) -> dict | None:
        """The tenant's running experiment (cached for `cache_s`: every chat turn asks)."""
        with self._lock:
            cached = self._cache.get(tenant)
        if cached is None or time.monotonic() - cached[0] > self.cache_s:
            with self.db.session(readonly=True) as s:
                e = s.scalar(select(Experiment).where(Experiment.tenant_id == tenant, Experiment.status == "running"))
                cached = (time.monotonic(), experiment_view(e) if e is not None else None)
            with self._lock:
                self._cache[tenant] = cached
        return cached[1]

    def arm_of(self, tenant: str, conversation_id: str) -> tuple[dict, dict] | None:
        """(experiment, arm) of a conversation in the running experiment: assigned now if the
        conversation has none yet and started after the experiment; None if it is outside."""
        experiment = self.running(tenant)
        if experiment is None:
            return None
        arms = {a["name"]: a for a in experiment["arms"]}
        with self.db.session() as s:
            conv = s.scalar(select(Conversation).where(Conversation.id == conversation_id,
                                                       Conversation.tenant_id == tenant))
            if conv is None or conv.created_at < dt.datetime.fromisoformat(experiment["started_at"]):
                return None
            if conv.experiment_id is None:
                arm = pick_arm(experiment["id"], conversation_id, experiment["arms"])
                s.execute(update(Conversation).where(Conversation.id == conversation_id,
                                                     Conversation.experiment_id.is_(None))
                          .values(experiment_id=experiment["id"], arm=arm))
                return experiment, arms[arm]
            if conv.experiment_id != experiment["id"] or conv.arm not in arms:
                return None
            return experiment, arms[conv.arm]
