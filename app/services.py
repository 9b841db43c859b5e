"""What the chat routes need, built once per app: the inference client, intent detector,
knowledge base and banned-word list.

The chat pipeline comes in two builds:

    lexical   keyword intent + BM25 retrieval, no embeddings: built in milliseconds from the
              files alone, so the web tier answers (degraded) whatever is down
    full      embedding intent + hybrid retrieval + generation: needs the embedding endpoint
              (the in-process embedder, or the inference service's /v1/embeddings)

A background builder tries the full build at start and, while it fails, again with backoff
(0.5 s doubling to `CHAT_REBUILD_MAX_S`); the chat routes serve the lexical build meanwhile and
switch to the full one the moment it exists, with no restart. A chat turn waits for the first
attempt at most `CHAT_BUILD_WAIT_S` (the embedded default's start: the embedder loads in a few
seconds, and a turn then would rather wait than be degraded).
"""
from __future__ import annotations

import logging
import threading
import time

from filters.banned_words import BannedWordFilter
from filters.pii import redact_pii
from pipelines.actions import ActionRunner, CallLog
from pipelines.inference_client import InferenceClient
from pipelines.intent import IntentDetector, load_intents
from pipelines.knowledge_base import KnowledgeBase
from pipelines.resilience import client_from_env
from pipelines.support_chat import SupportChat

log = logging.getLogger(__name__)


class ChatServices:
    def __init__(self, config: dict, client: InferenceClient | None = None, call_log: CallLog | None = None):
        self.config = config
        self.call_log = call_log                      # where support-chat actions are recorded
        self._client = client
        self._full: SupportChat | None = None
        self._lexical: SupportChat | None = None
        self._lock = threading.RLock()            # lexical() builds under it and reads .client
        self._builder: threading.Thread | None = None
        self._first_attempt = threading.Event()          # set once the first full build ended
        self._stop = threading.Event()
        self.num_build_attempts = 0
        self.last_build_error: str | None = None
        self.full_since: float | None = None             # time.time() the full pipeline came up
        self.banned = BannedWordFilter.from_file(config.get("BANNED_WORDS_PATH"))
        self.kb_banned_terms: dict[str, list[str]] = {}      # article -> banned terms in it (last index)

    def clean(self, text: str) -> str:
        """Text as it may be stored and shown: PII redacted, banned terms masked (agents' replies,
        comments, messages the bot does not answer)."""
        return self.banned.mask(redact_pii(text)[0])[0]

    @property
    def client(self) -> InferenceClient:
        with self._lock:
            if self._client is None:
                self._client = client_from_env(self.config.get("REDIS_URL"), **self.config.get("ENGINE_ARGS", {}))
            return self._client

    @property
    def built_client(self) -> InferenceClient | None:
        """The client if it exists already (metrics must not load a model to report on it)."""
        return self._client

    def knowledge_base(self) -> KnowledgeBase:
        """The chat's knowledge base, brought up to date with its folder now (raises if that fails)."""
        chat = self._full
        if chat is not None:
            chat.kb.rebuild()
            return chat.kb
        # no full pipeline in this process (a worker): building the index fills the shared cache
        return KnowledgeBase(self.client.embed, self.config.get("KB_PATH"), self.config.get("KB_CACHE_DIR"),
                             faq_path=self.config.get("FAQ_PATH"))

    # ---- the two builds --------------------------------------------------------------------
    def check_articles(self, chunks) -> None:
        """Index-time compliance: every banned term an article contains is logged (file and term)
        and counted (web_kb_banned_terms); replies that quote it are masked like generated ones."""
        found: dict[str, set[str]] = {}
        for chunk in chunks:
            for match in self.banned.find(chunk.text):
                found.setdefault(chunk.source, set()).add(match.term)
        for source, terms in sorted(found.items()):
            log.warning("knowledge base: kb/%s contains banned term(s) %s; replies quoting it are masked",
                        source, ", ".join(sorted(terms)))
        self.kb_banned_terms = {source: sorted(terms) for source, terms in found.items()}

    def _pipeline(self, embed) -> SupportChat:
        kb = KnowledgeBase(embed, self.config.get("KB_PATH"), self.config.get("KB_CACHE_DIR"),
                           on_index=self.check_articles, faq_path=self.config.get("FAQ_PATH"))
        detector = IntentDetector(load_intents(self.config.get("INTENTS_PATH")), embed,
                                  cache_dir=kb.cache_dir if embed is not None else None)
        runner = ActionRunner(self.call_log, self.config["ACTIONS_BASE_URL"]) if self.call_log is not None else None
        return SupportChat(self.client, detector, kb, self.banned, temperature=self.config["CHAT_TEMPERATURE"],
                           grounded_temperature=self.config["GROUNDED_TEMPERATURE"],
                           max_tokens=self.config["CHAT_MAX_TOKENS"], prompt_budget=self.config["CHAT_PROMPT_BUDGET"],
                           action_runner=runner)

    def lexical(self) -> SupportChat:
        """The pipeline that needs no embeddings (built on first use; a bad intents or KB file
        raises ValueError here, which is a configuration error, not an outage)."""
        with self._lock:
            if self._lexical is None:
                self._lexical = self._pipeline(None)
            return self._lexical

    def try_full_build(self) -> bool:
        """One attempt at the full pipeline; True once it exists."""
        if self._full is not None:
            return True
        self.num_build_attempts += 1
        try:
            # the embeddings may all come from KB_CACHE_DIR: ask the endpoint itself first (with
            # the breaker open, this is its half-open probe)
            self.client.embed(["readiness probe"])
            chat = self._pipeline(self.client.embed)
        except Exception as exc:  # noqa: BLE001 - InferenceError (down), or a model that fails to load
            self.last_build_error = f"{type(exc).__name__}: {exc}"
            return False
        self._full, self.full_since, self.last_build_error = chat, time.time(), None
        log.info("chat pipeline ready: %d intents, %d knowledge-base chunks", len(chat.detector.names),
                 len(chat.kb.chunks))
        return True

    def _build_until_full(self) -> None:
        delay, cap = 0.5, float(self.config.get("CHAT_REBUILD_MAX_S", 2.0))
        try:
            ok = self.try_full_build()
        finally:
            self._first_attempt.set()
        if not ok:
            log.warning("full chat pipeline unavailable (%s); serving degraded answers and retrying",
                        self.last_build_error)
        while not ok and not self._stop.wait(delay):
            ok = self.try_full_build()
            delay = min(cap, delay * 2)
        if ok and self.num_build_attempts > 1:
            log.warning("full chat pipeline restored after %d attempts", self.num_build_attempts)

    def start(self) -> None:
        """Start the background builder (idempotent). `python -m app serve` and gunicorn call it
        at start; the first chat turn does otherwise."""
        with self._lock:
            if self._builder is None:
                self._builder = threading.Thread(target=self._build_until_full, name="chat-pipeline", daemon=True)
                self._builder.start()
                warm = getattr(self.client, "warm", None)
                if warm is not None:            # load the in-process model now, not on the first request
                    warm()

    def stop(self) -> None:
        self._stop.set()

    def wait_first_attempt(self, timeout: float | None = None) -> bool:
        """Block until the first full build ended (either way); False on time-out."""
        return self._first_attempt.wait(timeout)

    @property
    def chat(self) -> SupportChat:
        """The full pipeline if it is built, else the lexical one."""
        if self._full is not None:
            return self._full
        self.start()
        self._first_attempt.wait(float(self.config.get("CHAT_BUILD_WAIT_S", 1.0)))
        return self.chat_now()

    def chat_now(self) -> SupportChat:
        """The full pipeline if it is built, else the lexical one, without waiting."""
        return self._full or self.lexical()

    # ---- readiness -------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """Customers can be served (maybe degraded): the first full build ended either way."""
        return self._full is not None or self._first_attempt.is_set()

    @property
    def pipeline_state(self) -> str:
        """'full' | 'lexical' | 'building' (the first attempt is still running)."""
        if self._full is not None:
            return "full"
        return "lexical" if self._first_attempt.is_set() else "building"
