"""Every environment variable the web side reads, parsed once into one typed object.

`create_app` builds a `WebSettings()` (or takes one), and copies the values its views read into
the Flask config, where a test or an embedding caller may override them per app. A malformed
value (CHAT_MAX_TOKENS=abc) fails at startup with the variable's name, not on the first request.
"""
from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_REPO_ROOT = str(Path(__file__).resolve().parent.parent)   # the checkout / install root


class WebSettings(BaseSettings):
    model_config = SettingsConfigDict(extra="ignore", frozen=True)

    # stores: sessions, Celery broker, rate-limit counters; in-process stores without REDIS_URL
    redis_url: str | None = None
    celery_broker_url: str | None = None                  # default: REDIS_URL
    # the broker redelivers an unacknowledged task after this long: above the longest task
    celery_visibility_timeout_s: int = Field(7200, gt=0)
    # the conversation store (app/store/db.py): SQLite in the instance folder unless set
    database_url: str | None = None
    db_auto_migrate: bool = True                            # apply migrations when an app starts
    conversation_retention_days: int = Field(90, gt=0)      # older conversations are deleted (app/jobs/tasks.py)
    handoff_wait_s: float = Field(300.0, gt=0)              # unanswered this long: offer email or the bot
    # a customer silent this long after the bot answered counts as resolved (app/reports/resolution.py)
    resolution_window_h: float = Field(24.0, gt=0, le=24 * 30)
    # the agent console's sessions (app/agent/auth.py): the key that signs session cookies and CSRF
    # tokens (unset: a random one kept in the instance folder), Secure cookies (unset: unless plain
    # http to a loopback address), login attempts allowed per client IP and per email
    secret_key: str | None = Field(None, repr=False)
    agent_cookie_secure: bool | None = None
    agent_login_limit: str = "10 per minute"
    # outgoing webhooks (httpkit/webhooks.py): hosts, IPs or CIDRs a webhook may call although
    # private or loopback (comma-separated), one attempt's timeout, attempts, first retry delay
    webhook_allow_hosts: str = ""
    webhook_timeout_s: float = Field(5.0, gt=0, le=60)
    webhook_max_attempts: int = Field(5, ge=1, le=20)
    webhook_retry_base_s: float = Field(10.0, ge=0)
    # the email fallback (app/jobs/mail.py): agents' replies to customers who left an email address;
    # unset SMTP_HOST: not mailed (agents still see the address)
    smtp_host: str | None = None
    smtp_port: int = Field(25, gt=0, lt=65536)
    smtp_from: str = "support@localhost"
    smtp_username: str | None = None
    smtp_password: str | None = Field(None, repr=False)
    smtp_starttls: bool = False
    # how long after an agent's reply its email waits: replies the customer sees in the widget in
    # the meantime are not mailed, and a burst of replies goes out as one email
    email_reply_delay_s: float = Field(120.0, ge=0, le=86400)
    # config files (resolved by `configs`: these override the shipped ones)
    kb_path: str | None = None
    kb_cache_dir: str | None = None
    faq_path: str | None = None                             # approved FAQ drafts' articles (default: instance/faq)
    intents_path: str | None = None
    banned_words_path: str | None = None
    tenants_path: str | None = None
    demo_orders_path: str | None = None                     # the demo order service's seed (app/chat/demo_orders.py)
    # where an action's {base} points (pipelines/actions.py): default, this app on WEB_BIND's port
    actions_base_url: str | None = None
    # support chat generation and admission
    chat_temperature: float = Field(0.7, ge=0)
    grounded_temperature: float = Field(0.7, ge=0)          # the grounded_generation answer mode's
    chat_max_tokens: int = Field(512, gt=0)
    chat_prompt_budget: int = Field(1400, gt=0)             # prompt tokens
    chat_build_wait_s: float = Field(1.0, ge=0)             # first pipeline build before degrading
    chat_rebuild_max_s: float = Field(2.0, gt=0)            # longest wait between rebuild attempts
    chat_max_turns: int = Field(48, gt=0)                   # turns in flight; more get 503
    # code completion
    model: str = "qwen2.5-coder-0.5b"                       # the model name responses report
    completion_api_keys: str = ""                           # comma-separated; hashed at startup
    completion_repo_roots: str | None = None                # os.pathsep-separated; default: the checkout
    # processes
    inference_url: str | None = None                        # the inference service, when not in-process
    shutdown_drain_s: float = Field(30.0, ge=0)
    web_connection_limit: int = Field(2000, gt=0)
    worker_metrics_port: int = Field(9808, ge=0)            # Celery worker metrics; 0: off
    web_bind: str = "0.0.0.0:8000"                          # gunicorn (app/gunicorn_conf.py)
    web_workers: int = Field(2, gt=0)
    web_threads: int = Field(64, gt=0)
    # live-event (SSE) streams held open per process; each holds a request thread, so keep it
    # well under the threads (WEB_THREADS, or `serve --threads`); past it a stream gets 503
    sse_max_streams: int = Field(32, gt=0)
    web_timeout_s: int = Field(180, gt=0)
    web_graceful_s: int = Field(30, ge=0)

    def flask_config(self) -> dict:
        """The Flask config keys `create_app` and the views read."""
        return {
            "REDIS_URL": self.redis_url,
            "DATABASE_URL": self.database_url, "DB_AUTO_MIGRATE": self.db_auto_migrate,
            "CONVERSATION_RETENTION_DAYS": self.conversation_retention_days, "HANDOFF_WAIT_S": self.handoff_wait_s,
            "RESOLUTION_WINDOW_H": self.resolution_window_h,
            "SMTP_HOST": self.smtp_host, "SMTP_PORT": self.smtp_port, "SMTP_FROM": self.smtp_from,
            "SMTP_USERNAME": self.smtp_username, "SMTP_PASSWORD": self.smtp_password,
            "SMTP_STARTTLS": self.smtp_starttls, "EMAIL_REPLY_DELAY_S": self.email_reply_delay_s,
            "WEBHOOK_ALLOW_HOSTS": self.webhook_allow_hosts, "WEBHOOK_TIMEOUT_S": self.webhook_timeout_s,
            "WEBHOOK_MAX_ATTEMPTS": self.webhook_max_attempts, "WEBHOOK_RETRY_BASE_S": self.webhook_retry_base_s,
            "SECRET_KEY": self.secret_key, "AGENT_COOKIE_SECURE": self.agent_cookie_secure,
            "AGENT_LOGIN_LIMIT": self.agent_login_limit,
            "KB_PATH": self.kb_path, "KB_CACHE_DIR": self.kb_cache_dir, "FAQ_PATH": self.faq_path,
            "INTENTS_PATH": self.intents_path,
            "BANNED_WORDS_PATH": self.banned_words_path, "TENANTS_PATH": self.tenants_path,
            "DEMO_ORDERS_PATH": self.demo_orders_path,
            "ACTIONS_BASE_URL": self.actions_base_url or f"http://127.0.0.1:{self.web_bind.rsplit(':', 1)[-1]}",
            "CHAT_TEMPERATURE": self.chat_temperature,
            "GROUNDED_TEMPERATURE": self.grounded_temperature, "CHAT_MAX_TOKENS": self.chat_max_tokens,
            "CHAT_PROMPT_BUDGET": self.chat_prompt_budget, "CHAT_BUILD_WAIT_S": self.chat_build_wait_s,
            "CHAT_REBUILD_MAX_S": self.chat_rebuild_max_s, "CHAT_MAX_TURNS": self.chat_max_turns,
            "SSE_MAX_STREAMS": self.sse_max_streams,
            "CELERY_BROKER_URL": self.celery_broker_url,
            "CELERY_VISIBILITY_TIMEOUT_S": self.celery_visibility_timeout_s,
            "COMPLETION_MODEL_NAME": self.model,
            "COMPLETION_API_KEYS": [k for k in self.completion_api_keys.split(",") if k],
            "COMPLETION_REPO_ROOTS": [r for r in (self.completion_repo_roots or DEFAULT_REPO_ROOT).split(os.pathsep)
                                      if r],
        }
