"""Celery tasks (Redis broker). Tasks take ids, not objects, and run inside the Flask app's
context so they reach the same store and inference client as the web routes.

In the embedded default (no REDIS_URL) Celery runs tasks eagerly; the chat routes then start
them on a background thread so a request never waits for one.

Each task keeps the name it had when this module was app/tasks.py ("app.tasks.run_batch"), so
messages already queued, and beat schedules, still reach it after an upgrade.
"""
from __future__ import annotations

import smtplib
import threading
import time

from celery import Celery, Task, shared_task
from flask import Flask, current_app, has_app_context

from pipelines.inference_client import InferenceError


def celery_init_app(app: Flask) -> Celery:
    class FlaskTask(Task):
        def __call__(self, *args, **kwargs):
            if has_app_context():          # started by a request's app (eager mode): use that one
                return self.run(*args, **kwargs)
            with app.app_context():
                return self.run(*args, **kwargs)

    celery_app = Celery(app.name, task_cls=FlaskTask)
    celery_app.config_from_object(app.config["CELERY"])
    celery_app.set_default()
    app.extensions["celery"] = celery_app
    from app.jobs.outbox import Outbox
    app.extensions["outbox"] = Outbox(publish)
    return celery_app


class BrokerUnavailable(RuntimeError):
    """The Celery broker did not take the task (it is down or unreachable)."""


# one quick retry, not kombu's default three with growing waits: a request must not hang on a
# broker that is down (the caller answers 503 or leaves the task to the outbox)
PUBLISH_RETRY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2}


def publish(task, args: tuple, delay_s: float = 0.0) -> None:
    """Send one task to the broker. The web tier never waits on a task's result (progress is in
    the job store), so it does not subscribe to one either: with the result backend's Redis down,
    that subscription alone retried for ~20 s inside the request."""
    try:
        task.apply_async(args=args, retry=True, retry_policy=PUBLISH_RETRY, ignore_result=True,
                         countdown=delay_s or None)
    except Exception as exc:        # kombu OperationalError, redis ConnectionError, socket errors
        raise BrokerUnavailable(f"the job queue (Celery broker) is unavailable: {type(exc).__name__}") from exc


def start(task, *args, delay_s: float = 0.0) -> None:
    """Queue a task, to run `delay_s` from now; in eager mode run it on a daemon thread instead
    of inside the request. Raises BrokerUnavailable when the broker does not take it."""
    if current_app.extensions["celery"].conf.task_always_eager:
        app = current_app._get_current_object()

        def run() -> None:
            time.sleep(delay_s)
            with app.app_context():
                task.apply(args=args)
        threading.Thread(target=run, daemon=True, name=f"task-{task.name}").start()
    else:
        publish(task, args, delay_s)


def start_or_queue(task, *args, delay_s: float = 0.0) -> None:
    """Queue a task, or, while the broker is down, keep it in this process's outbox
    (app/jobs/outbox.py) until the broker takes it (then it runs without the delay)."""
    try:
        start(task, *args, delay_s=delay_s)
    except BrokerUnavailable:
        current_app.extensions["outbox"].put(task, args)


@shared_task(ignore_result=False, acks_late=True, max_retries=3, default_retry_delay=5,
             name="app.tasks.summarize_handoff")
def summarize_handoff(tenant_id: str, session_id: str) -> str:
    """Write the summary the agent taking the conversation over reads (status unchanged): the
    model's one or two sentences when the transcript supports them, else the customer's own
    words (pipelines/handoff_summary.py)."""
    from pipelines.handoff_summary import summarize
    ext = current_app.extensions["support_chat"]
    store, client = ext["store"], ext["services"].client
    if not store.exists(tenant_id, session_id):
        return ""
    messages = [m for m in store.messages(tenant_id, session_id) if not m.get("blocked")]

    def chat(prompt):
        return "".join(client.chat_stream(prompt, temperature=0.0, max_tokens=96))
    summary, how = summarize(messages, chat, ext["services"].banned)
    if not summary:
        summary = "(no messages)"
    current_app.logger.info("handoff summary for %s: %s", session_id, how)
    store.set_summary(tenant_id, session_id, summary)
    return summary


@shared_task(ignore_result=True, acks_late=True, max_retries=3, default_retry_delay=5, name="app.tasks.draft_faq")
def draft_faq(tenant_id: str, session_id: str) -> dict | None:
    """Draft a help-centre entry from a conversation an agent resolved: the customer's question
    and the agent's answer, worded by the model and verified against that answer alone
    (pipelines/faq_draft.py), PII-redacted, kept pending (or folded into a near-duplicate)."""
    from filters.leakage import LeakFilter
    from pipelines.answer_verifier import SentenceVerifier
    from pipelines.faq_draft import FAQ_RULES, compose, exchange
    ext = current_app.extensions["support_chat"]
    store, services = ext["store"], ext["services"]
    pair = exchange(store.messages(tenant_id, session_id))
    if pair is None:
        return None
    question, answer = (services.clean(text) for text in pair)
    client = services.client

    def chat(messages):
        return "".join(client.chat_stream(messages, temperature=0.0, max_tokens=160))
    verifier = SentenceVerifier([answer], LeakFilter([FAQ_RULES]))
    entry = compose(question, answer, chat, lambda sentence: verifier.check(sentence).ok)

    def embed(texts):
        return client.embed(texts)
    draft = ext["faq_drafts"].add(tenant_id, session_id, services.clean(entry.question), services.clean(entry.answer),
                                  embed=embed)
    current_app.logger.info("FAQ draft %s from %s (%s, merged %d)", draft["id"], session_id, entry.how, draft["merged"])
    return draft


@shared_task(bind=True, ignore_result=True, acks_late=True, max_retries=None, name="app.tasks.deliver_webhook")
def deliver_webhook(self, delivery_id: str) -> None:
    """POST one event to its webhook (httpkit/webhooks.py: SSRF-checked, signed, no redirects);
    a failure is retried after WEBHOOK_RETRY_BASE_S, doubling, until WEBHOOK_MAX_ATTEMPTS
    attempts. Each attempt is recorded in the delivery log."""
    import json
    import time

    from httpkit.webhooks import deliver
    config = current_app.config
    store = current_app.extensions["webhooks"]
    allow = [h for h in config["WEBHOOK_ALLOW_HOSTS"].split(",") if h.strip()]
    eager = current_app.extensions["celery"].conf.task_always_eager
    while True:
        found = store.delivery(delivery_id)
        if found is None or found[0]["status"] != "pending":
            return                                        # the webhook was deleted, or it is done
        delivery, url, secret = found
        body = json.dumps({"id": delivery_id, **delivery["payload"]}, separators=(",", ":"),
                          ensure_ascii=False).encode()
        attempt = deliver(url, secret, delivery["event"], delivery_id, body, allow, config["WEBHOOK_TIMEOUT_S"])
        attempts = delivery["attempts"] + 1
        final = attempts >= config["WEBHOOK_MAX_ATTEMPTS"]
        store.record(delivery_id, attempt.ok, final, attempt.status_code, attempt.error)
        if attempt.ok or final:
            return
        delay = config["WEBHOOK_RETRY_BASE_S"] * 2 ** (attempts - 1)
        if not eager:
            raise self.retry(countdown=delay)
        time.sleep(delay)                                 # in-process: this task's own thread waits


class MailUnavailable(Exception):
    """The SMTP server did not take the message (retried)."""


@shared_task(bind=True, ignore_result=True, acks_late=True, autoretry_for=(MailUnavailable,), retry_backoff=5,
             retry_backoff_max=300, max_retries=5, name="app.tasks.email_agent_reply")
def email_agent_reply(self, tenant_id: str, session_id: str, index: int) -> bool:
    """The email fallback: queued EMAIL_REPLY_DELAY_S after an agent's reply, it mails the agent
    replies the customer has neither seen in the widget nor been mailed, in one email, to the
    address they left, over SMTP_HOST; retried with backoff while the server refuses or is down.
    A reply followed by another is left to the later reply's task, so a burst of replies makes
    one email. False when there is nothing to send: no SMTP_HOST, no address, a later reply
    pending, or every reply already seen or mailed."""
    from app.jobs.mail import agent_reply_message, send
    config = current_app.config
    ext = current_app.extensions["support_chat"]
    store = ext["store"]
    if not config["SMTP_HOST"]:
        return False
    to, replies, messages = store.unmailed_replies(tenant_id, session_id)
    if not to or not replies or replies[-1][0] != index:        # nothing new, or a later reply's task sends it
        return False
    tenant = ext["tenants"].by_id(tenant_id)
    first = replies[0][0]
    message = agent_reply_message(config["SMTP_FROM"], to, tenant.tenant.name if tenant else tenant_id,
                                  [m for _i, m in replies], [m for m in messages[:first] if m["role"] == "user"][-1:])
    try:
        send(message, config["SMTP_HOST"], config["SMTP_PORT"], config["SMTP_USERNAME"], config["SMTP_PASSWORD"],
             config["SMTP_STARTTLS"])
    except (OSError, smtplib.SMTPException) as exc:
        raise MailUnavailable(f"{type(exc).__name__}: {exc}") from exc
    store.mark_emailed(tenant_id, session_id, index)
    return True


# Celery beat runs it daily (the worker's beat schedule, app/worker.py); the embedded default
# runs it from `python -m app serve` at start and every day after.
RETENTION_SCHEDULE_S = 24 * 3600


@shared_task(ignore_result=True, acks_late=True, name="app.tasks.delete_old_conversations")
def delete_old_conversations() -> int:
    """Delete conversations older than CONVERSATION_RETENTION_DAYS (messages, handoffs and
    feedback with them), and agent sessions that ended more than a day ago."""
    days = current_app.config["CONVERSATION_RETENTION_DAYS"]
    deleted = current_app.extensions["support_chat"]["store"].delete_older_than(days)
    sessions = current_app.extensions["agent_sessions"].delete_ended()
    current_app.logger.info("retention: deleted %d conversations older than %d days, %d ended agent sessions",
                            deleted, days, sessions)
    return deleted


@shared_task(ignore_result=False, acks_late=True, max_retries=2, default_retry_delay=5, time_limit=1800,
             name="app.tasks.index_repository")
def index_repository(job_id: str, name: str, path: str) -> int:
    """Build the BM25 code index of a repository folder for completion context."""
    from pipelines.code_index import CodeIndex, safe_name
    ext = current_app.extensions["completion"]
    jobs = ext["jobs"]
    jobs.set(job_id, status="running")
    try:
        index = CodeIndex.build(name, path, ext["extensions"])
        index.save(current_app.config.get("CODE_INDEX_DIR"))
    except Exception as exc:                               # recorded for the status endpoint
        jobs.set(job_id, status="failed", error=f"{type(exc).__name__}: {exc}")
        raise
    jobs.set(job_id, status="done", num_chunks=len(index.chunks))
    service = ext.get("service")
    if service is not None:
        service.indexes[safe_name(name)] = index
    return len(index.chunks)


@shared_task(bind=True, ignore_result=False, acks_late=True, autoretry_for=(InferenceError,), retry_backoff=2,
             retry_backoff_max=60, max_retries=5, time_limit=1800, name="app.tasks.index_knowledge_base")
def index_knowledge_base(self, job_id: str) -> int:
    """Re-embed the help centre's articles if they changed, into the embeddings cache the web
    workers share (KB_CACHE_DIR, keyed by the folder's fingerprint): their next search loads it
    instead of embedding on a request thread. Running it again is harmless: an unchanged folder
    is a cache hit. No embedding endpoint answering (InferenceError) retries with backoff."""
    jobs = current_app.extensions["completion"]["jobs"]
    jobs.set(job_id, status="running")
    try:
        kb = current_app.extensions["support_chat"]["services"].knowledge_base()
    except InferenceError as exc:
        if self.request.retries >= self.max_retries:
            jobs.set(job_id, status="failed", error=f"embeddings unavailable: {exc}")
        raise
    except Exception as exc:                              # a bad folder: recorded for the status endpoint
        jobs.set(job_id, status="failed", error=f"{type(exc).__name__}: {exc}")
        raise
    jobs.set(job_id, status="done", fingerprint=kb.fingerprint, num_chunks=len(kb.chunks),
             num_articles=len({c.source for c in kb.chunks}))
    return len(kb.chunks)


BATCH_TIME_LIMIT_S = 3600


@shared_task(bind=True, ignore_result=True, acks_late=True, autoretry_for=(InferenceError,), retry_backoff=2,
             retry_backoff_max=60, retry_jitter=True, max_retries=5, soft_time_limit=BATCH_TIME_LIMIT_S - 60,
             time_limit=BATCH_TIME_LIMIT_S, name="app.tasks.run_batch")
def run_batch(self, job_id: str) -> None:
    """Generate every item of a batch job, in order, writing each result under its index.

    Safe to run again (a redelivery after a worker died, a retry): finished jobs return at once,
    done items are skipped, and only one run may move the job to its final status. An
    InferenceError (no endpoint answered) retries the task with exponential backoff; a
    cancellation is seen between items."""
    jobs = current_app.extensions["completion"]["batches"]
    job = jobs.get(job_id)
    if job is None or job["status"] in ("done", "failed", "cancelled"):
        return
    jobs.set(job_id, status="running", attempts=job.get("attempts", 0) + 1)
    try:
        _generate_items(jobs, job_id)
    except InferenceError as exc:
        if self.request.retries >= self.max_retries:           # the last try: the job fails, visibly
            jobs.finish(job_id, "failed", error=f"inference unavailable: {exc}")
        raise


def _generate_items(jobs, job_id: str) -> None:
    client = current_app.extensions["support_chat"]["services"].client
    items, done = jobs.items(job_id), set(jobs.results(job_id))
    for index, item in enumerate(items):
        if index in done:
            continue
        if jobs.get(job_id)["status"] == "cancelled":
            return
        params = {"max_tokens": item.get("max_tokens", 128), "temperature": item.get("temperature", 0.0)}
        if "messages" in item:
            text = "".join(client.chat_stream(item["messages"], top_p=item.get("top_p", 1.0), **params))
        else:
            text = "".join(client.complete_stream(item["prompt"], top_p=item.get("top_p", 1.0),
                                                  stop=item.get("stop") or [], seed=item.get("seed"), **params))
        count = jobs.put_result(job_id, index, {"index": index, "text": text})
        jobs.set(job_id, done=count)
    jobs.finish(job_id, "done", done=len(items))
