"""A repository's code as BM25-searchable chunks, for completion context ("snippets from an
indexed repository").

Files with a known language extension are cut into chunks at top-level boundaries (a line that
starts at column 0 after a blank line), at most `max_lines` lines each; identifiers are split
(snake_case, camelCase) into BM25 terms. The index is saved as JSON under the cache folder, keyed
by the repository's name, and built by a Celery job (app/jobs/tasks.py: index_repository).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from rank_bm25 import BM25Okapi

DEFAULT_CACHE = Path(__file__).resolve().parent.parent / ".cache" / "code_index"
SKIP_DIRS = {".git", ".hg", ".svn", "node_modules", ".venv", "venv", "__pycache__", "dist", "build", ".cache",
             "target", ".mypy_cache", ".pytest_cache"}
MAX_FILE_BYTES = 512 * 1024
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CAMEL = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")


def safe_name(name: str) -> str:
    """A repository name or git_url as a file name (and the key the service looks it up by)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def code_terms(text: str) -> list[str]:
    """Identifiers and their snake/camel parts, lower-cased."""
    out = []
    for ident in _IDENT.findall(text):
        low = ident.lower()
        out.append(low)
        parts = [p.lower() for chunk in ident.split("_") for p in _CAMEL.findall(chunk)]
        if len(parts) > 1:
            out.extend(parts)
    return out


@dataclass(frozen=True)
class CodeChunk:
    filepath: str       # relative to the repository root
    start_line: int
    body: str


def chunk_file(text: str, filepath: str, max_lines: int = 40) -> list[CodeChunk]:
    lines = text.splitlines()
    chunks, start = [], 0
    for i in range(1, len(lines) + 1):
        boundary = i == len(lines) or (i - start >= max_lines) or (
            lines[i] and not lines[i][0].isspace() and i > start and not lines[i - 1].strip())
        if boundary:
            body = "\n".join(lines[start:i]).strip("\n")
            if body.strip():
                chunks.append(CodeChunk(filepath, start + 1, body))
            start = i
    return chunks


class CodeIndex:
    def __init__(self, name: str, chunks: list[CodeChunk]):
        self.name, self.chunks = name, chunks
        terms = [code_terms(c.body) or ["_"] for c in chunks]
        self._terms = [set(t) for t in terms]
        self.bm25 = BM25Okapi(terms) if chunks else None

    @classmethod
    def build(cls, name: str, root: str | os.PathLike, extensions: set[str]) -> CodeIndex:
        root = Path(root)
        if not root.is_dir():
            raise ValueError(f"repository {name!r}: {root} is not a directory")
        chunks = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
            for fname in sorted(filenames):
                path = Path(dirpath) / fname
                if path.suffix.lstrip(".").lower() not in extensions or path.stat().st_size > MAX_FILE_BYTES:
                    continue
                text = path.read_text(encoding="utf-8", errors="replace")
                chunks.extend(chunk_file(text, str(path.relative_to(root))))
        return cls(name, chunks)

    def save(self, cache_dir: str | os.PathLike | None = None) -> Path:
        folder = Path(cache_dir or DEFAULT_CACHE)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{safe_name(self.name)}.json"
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps([[c.filepath, c.start_line, c.body] for c in self.chunks]), encoding="utf-8")
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, name: str, cache_dir: str | os.PathLike | None = None) -> CodeIndex | None:
        path = Path(cache_dir or DEFAULT_CACHE) / f"{safe_name(name)}.json"
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return cls(name, [CodeChunk(*row) for row in rows])

    def search(self, query: str, k: int = 3, exclude_file: str | None = None) -> list[CodeChunk]:
        terms = code_terms(query)
        if not terms or self.bm25 is None:
            return []
        wanted = set(terms)
        scores = self.bm25.get_scores(terms)
        out = []
        # (BM25 scores can be <= 0 in a tiny repository: relevance is any shared identifier)
        for i in sorted(range(len(scores)), key=lambda i: -scores[i]):
            if len(out) == k:
                break
            if self._terms[i] & wanted and not (exclude_file and self.chunks[i].filepath == exclude_file):
                out.append(self.chunks[i])
        return out
