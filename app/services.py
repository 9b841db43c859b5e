"""What the chat routes need, built once per app and lazily (the embedder and the engine take
seconds to load): the inference client, intent detector, knowledge base and banned-word list."""
from __future__ import annotations

import logging
import threading

from filters.banned_words import BannedWordFilter
from pipelines.inference_client import InferenceClient, client_from_env
from pipelines.intent import IntentDetector, load_intents
from pipelines.knowledge_base import KnowledgeBase
from pipelines.support_chat import SupportChat

log = logging.getLogger(__name__)


class ChatServices:
    def __init__(self, config: dict, client: InferenceClient | None = None):
        self.config = config
        self._client = client
        self._chat: SupportChat | None = None
        self._lock = threading.Lock()
        self.banned = BannedWordFilter.from_file(config.get("BANNED_WORDS_PATH"))

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
        with self._lock:
            chat = self._chat
        if chat is not None:
            chat.kb.rebuild()
            return chat.kb
        # no chat in this process (a worker): building the index fills the shared embeddings cache
        return KnowledgeBase(self.client.embed, self.config.get("KB_PATH"), self.config.get("KB_CACHE_DIR"))

    @property
    def ready(self) -> bool:
        """The chat pipeline is built (what /readyz reports)."""
        return self._chat is not None

    def warm_up(self) -> None:
        """Build the chat pipeline (sentence embedder, intent examples, knowledge-base index) now,
        not on the first chat turn: built lazily, it made every request of the first ~10-20 s after
        a start queue behind it. Run it on a thread at start (python -m app serve, gunicorn)."""
        try:
            chat = self.chat
            log.info("chat pipeline ready: %d intents, %d knowledge-base chunks", len(chat.detector.names),
                     len(chat.kb.chunks))
        except Exception:                      # the first chat turn builds it again
            log.exception("warm-up failed; the first chat turn will retry")

    @property
    def chat(self) -> SupportChat:
        client = self.client
        with self._lock:
            if self._chat is None:
                detector = IntentDetector(load_intents(self.config.get("INTENTS_PATH")), client.embed)
                kb = KnowledgeBase(client.embed, self.config.get("KB_PATH"), self.config.get("KB_CACHE_DIR"))
                self._chat = SupportChat(client, detector, kb, self.banned,
                                         temperature=self.config["CHAT_TEMPERATURE"],
                                         max_tokens=self.config["CHAT_MAX_TOKENS"],
                                         prompt_budget=self.config["CHAT_PROMPT_BUDGET"])
            return self._chat
