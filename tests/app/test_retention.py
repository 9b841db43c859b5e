"""CONVERSATION_RETENTION_DAYS: the periodic task deletes conversations last updated before the
cutoff, with their messages, handoffs and feedback, and leaves the rest; Celery beat runs it daily."""
from __future__ import annotations

import datetime as dt

from app import create_app
from app.jobs.tasks import RETENTION_SCHEDULE_S, delete_old_conversations
from app.store.models import Conversation, utcnow

KEY = {"X-Site-Key": "demo-site-key"}


def test_the_retention_task_deletes_only_old_conversations(tiny_client, tmp_path):
    app = create_app({"DATABASE_URL": f"sqlite:///{tmp_path / 'c.db'}", "CONVERSATION_RETENTION_DAYS": 30,
                      "KB_CACHE_DIR": str(tmp_path / "kb"), "REDIS_URL": None, "CHAT_MAX_TOKENS": 4},
                     client=tiny_client)
    web = app.test_client()
    sids = [web.post("/api/chat/sessions", headers=KEY).get_json()["session_id"] for _ in range(3)]
    for sid in sids:
        web.post(f"/api/chat/sessions/{sid}/messages", headers=KEY, json={"content": "hello"})
    web.post(f"/api/chat/sessions/{sids[0]}/handoff", headers=KEY)
    db = app.extensions["db"]
    with db.session() as s:
        s.get(Conversation, sids[0]).updated_at = utcnow() - dt.timedelta(days=31)
        s.get(Conversation, sids[1]).updated_at = utcnow() - dt.timedelta(days=29)
    with app.app_context():
        assert delete_old_conversations() == 1
        assert delete_old_conversations() == 0
    assert web.get(f"/api/chat/sessions/{sids[0]}", headers=KEY).status_code == 404
    assert [web.get(f"/api/chat/sessions/{sid}", headers=KEY).status_code for sid in sids[1:]] == [200, 200]


def test_beat_runs_it_daily():
    from app.worker import celery_app
    entry = celery_app.conf.beat_schedule["delete-old-conversations"]
    assert entry["task"] == delete_old_conversations.name and entry["schedule"] == RETENTION_SCHEDULE_S == 86400
