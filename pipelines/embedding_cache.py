"""Embeddings kept on disk, so a process that starts (or upgrades from degraded mode) loads them
instead of embedding again: the knowledge base's chunks and the intents' examples.

    <cache_dir>/<key>.npy     [N, dim] float32, written to a temporary file and renamed

The key names what was embedded (a fingerprint of the texts or files, and the model); a file
that cannot be read, or holds another number of rows, is a miss.
"""
from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

BATCH = 64                   # texts per embedding call: a few seconds on a CPU at most


def texts_key(prefix: str, model_name: str, texts: Sequence[str]) -> str:
    h = hashlib.sha256(model_name.encode())
    for t in texts:
        h.update(t.encode("utf-8", errors="replace") + b"\x00")
    return f"{prefix}-{h.hexdigest()[:24]}"


def cached_embeddings(embed: Callable, texts: Sequence[str], cache_dir: Path, key: str,
                      known: dict[str, np.ndarray] | None = None) -> tuple[np.ndarray, bool]:
    """([N, dim] embeddings of `texts`, whether any were computed now rather than loaded). On a
    miss only the texts not in `known` (text -> embedding, e.g. the index being replaced) are
    embedded: one new article costs its own texts, not the whole folder's."""
    cache = Path(cache_dir) / f"{key}.npy"
    try:
        vecs = np.load(cache) if cache.exists() else None
    except (OSError, ValueError):
        vecs = None                                     # unreadable cache: a miss
    if vecs is not None and vecs.shape[0] == len(texts):
        return vecs, False
    known = known or {}
    missing = list(dict.fromkeys(t for t in texts if t not in known))
    fresh = dict(known)
    for i in range(0, len(missing), BATCH):
        batch = missing[i:i + BATCH]
        fresh.update(zip(batch, np.asarray(embed(batch), dtype=np.float32)))
    vecs = np.stack([fresh[t] for t in texts]).astype(np.float32) if texts else np.zeros((0, 0), np.float32)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.parent / f"{key}.{os.getpid()}.{threading.get_ident()}.tmp.npy"
    np.save(tmp, vecs)
    tmp.replace(cache)
    return vecs, True
