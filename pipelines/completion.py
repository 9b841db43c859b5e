"""Code completion for IDEs: request shapes (Tabby's and OpenAI's legacy completions), context
within token budgets, FIM prompt templates, stop rules, trimming, cancellation and a cache.

    request -> CompletionRequest -> context (snippets as path-labelled comments + prefix end +
    suffix start, each within its budget) -> FIM template of the model's family -> cache? ->
    engine (temperature 0.2, top_p 0.95, max 128 tokens, stops) -> trim -> text

A newer request from the same user for the same file cancels the older one: the older one's
engine request is aborted (its KV blocks freed at once) and it returns "" at once.

The request bodies are pydantic models (pipelines/completion_schemas.py, also in the web app's
/openapi.json); `parse_tabby` / `parse_openai` validate with them and raise InvalidRequest (a
ValueError naming the field) for a bad one.
"""
from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from configs import resolve
from httpkit.validation import InvalidRequest, validate
from pipelines.code_index import DEFAULT_CACHE as DEFAULT_INDEX_DIR
from pipelines.code_index import CodeIndex, safe_name
from pipelines.completion_cache import CompletionCache
from pipelines.completion_schemas import MAX_SEED, MAX_SEGMENT_CHARS, InfillIn, OpenAICompletionIn, TabbyCompletionIn
from pipelines.completion_text import after_typed, cut_dedent, repetition_start, split_typed, trim_completion
from pipelines.inference_client import InferenceClient, InferenceError

FORWARD_WINDOW = 8                   # recent suggestions per settings a forward hit may extend


@dataclass(frozen=True)
class Snippet:
    filepath: str
    body: str


@dataclass
class CompletionRequest:
    prefix: str
    suffix: str = ""
    language: str = "generic"
    filepath: str | None = None
    user: str | None = None
    snippets: list[Snippet] = field(default_factory=list)
    temperature: float = 0.2
    top_p: float = 0.95
    max_tokens: int = 128
    stop: list[str] = field(default_factory=list)
    n: int = 1
    seed: int | None = None
    stream: bool = False
    repository: str | None = None       # git_url / name of an indexed repository
    top_k: int = -1
    n_indent: int = 0                   # llama.cpp's: end at a later line indented less than this
    t_max_predict_ms: int | None = None     # llama.cpp's: stop at a line end once this has passed


@dataclass
class Prompt:
    text: str                 # what the engine gets
    key: str                  # the cache key: ends with what precedes the cursor
    typed: str                # spaces and tabs at the cursor that the text leaves out (completion_text.py)
    line_is_blank: bool       # the cursor's line holds only whitespace so far
    after_blank: bool         # the prefix ends in a space or tab
    stops: list[str]


def repo_label(repository: str | None) -> str:
    """A repository's name for the prompt: the last part of its git URL or path."""
    name = (repository or "").rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1].removesuffix(".git")
    return name or "project"


# ---- request shapes ------------------------------------------------------------------------------
def parse_tabby(body: Any) -> CompletionRequest:
    """Tabby's /v1/completions body; InvalidRequest (a ValueError) names what is wrong."""
    req = validate(TabbyCompletionIn, body)
    seg = req.segments
    snippets = [Snippet(s.filepath or "snippet", s.body[:MAX_SEGMENT_CHARS])
                for items in (seg.declarations, seg.relevant_snippets_from_changed_files,
                              seg.relevant_snippets_from_recently_opened_files) for s in items or ()]
    if seg.clipboard:
        snippets.append(Snippet("clipboard", seg.clipboard[:MAX_SEGMENT_CHARS]))
    return CompletionRequest(
        prefix=seg.prefix[-MAX_SEGMENT_CHARS:], suffix=(seg.suffix or "")[:MAX_SEGMENT_CHARS],
        language=(req.language or "generic").lower(), filepath=seg.filepath, user=req.user, snippets=snippets,
        repository=seg.git_url, temperature=_given(req.temperature, 0.2), seed=req.seed)


def parse_openai(body: Any) -> CompletionRequest:
    """OpenAI's legacy /v1/completions body (prompt = the text before the cursor)."""
    req = validate(OpenAICompletionIn, body)
    prompt = req.prompt if isinstance(req.prompt, str) else req.prompt[0]
    stop = [req.stop] if isinstance(req.stop, str) and req.stop else list(req.stop or [])
    return CompletionRequest(
        prefix=prompt[-MAX_SEGMENT_CHARS:], suffix=(req.suffix or "")[:MAX_SEGMENT_CHARS],
        language=(req.language or "generic").lower(), user=req.user, filepath=req.filepath,
        temperature=_given(req.temperature, 0.2), top_p=_given(req.top_p, 0.95), max_tokens=_given(req.max_tokens, 128),
        stop=stop, n=_given(req.n, 1), seed=req.seed, stream=req.stream, repository=req.repository)


DEFAULT_N_PREDICT = 128


def parse_infill(body: Any) -> CompletionRequest:
    """llama.cpp's /infill body: the cursor is after input_prefix + prompt (the current line up to
    it); input_extra chunks are context from other files. Without a temperature sampler in
    `samplers` (llama.vscode sends top_k, top_p, infill) the choice is greedy."""
    req = validate(InfillIn, body)
    samplers = req.samplers if isinstance(req.samplers, list) else list(req.samplers or "")
    greedy = req.samplers is not None and "temperature" not in samplers and "t" not in samplers
    n_predict = DEFAULT_N_PREDICT if req.n_predict in (None, -1) else req.n_predict
    return CompletionRequest(
        prefix=(req.input_prefix + req.prompt)[-MAX_SEGMENT_CHARS:], suffix=req.input_suffix[:MAX_SEGMENT_CHARS],
        snippets=[Snippet(c.filename or "tmp", c.text[:MAX_SEGMENT_CHARS]) for c in req.input_extra or ()],
        temperature=0.0 if greedy else _given(req.temperature, 0.2), top_p=_given(req.top_p, 0.95),
        top_k=_given(req.top_k, -1), max_tokens=n_predict, stop=list(req.stop or []),
        seed=None if req.seed in (None, -1) else req.seed, stream=req.stream, n_indent=req.n_indent or 0,
        t_max_predict_ms=req.t_max_predict_ms or None)


def parse_request(body: Any) -> tuple[CompletionRequest, bool]:
    """Either dialect: (the request, whether it is Tabby's, which has `segments`)."""
    tabby = isinstance(body, dict) and "segments" in body
    return (parse_tabby(body) if tabby else parse_openai(body)), tabby


def _given(value, default):
    return default if value is None else value


# ---- configuration -------------------------------------------------------------------------------
@dataclass(frozen=True)
class LanguageRules:
    name: str
    comment: str
    stops: tuple[str, ...]


class Languages:
    def __init__(self, path: str | os.PathLike | None = None):
        data = yaml.safe_load(resolve("languages.yaml", path).read_text(encoding="utf-8"))
        self.rules = {name: LanguageRules(name, spec.get("comment", "#"), tuple(spec.get("stops", [])))
                      for name, spec in data["languages"].items()}
        self.by_ext = {ext: name for name, spec in data["languages"].items() for ext in spec.get("extensions", [])}

    def get(self, language: str, filepath: str | None = None) -> LanguageRules:
        """Rules by language id, else by the file's extension, else generic (never an error)."""
        if language in self.rules:
            return self.rules[language]
        ext = (filepath or "").rsplit(".", 1)[-1].lower() if filepath and "." in filepath else ""
        return self.rules.get(self.by_ext.get(ext, "generic"), self.rules["generic"])


@dataclass(frozen=True)
class FimTemplate:
    family: str
    template: str
    repo_name: str = ""           # "<|repo_name|>{name}\n": repository-level context (Qwen2.5-Coder)
    file_sep: str = ""            # "<|file_sep|>{path}\n"

    @property
    def uses_suffix(self) -> bool:
        return "{suffix}" in self.template

    @property
    def fim_marker(self) -> str:
        """The template's last special token ("<|fim_middle|>"); '' for a family whose prompt
        ends with the prefix."""
        return self.template.rsplit("}", 1)[-1] if self.uses_suffix else ""

    @property
    def uses_files(self) -> bool:
        """Other files go before the prompt as repository files, not as comments."""
        return bool(self.file_sep)

    def render(self, prefix: str, suffix: str) -> str:
        return self.template.replace("{prefix}", prefix).replace("{suffix}", suffix)

    def file_block(self, path: str, body: str) -> str:
        return self.file_sep.replace("{path}", path) + body + ("" if not body or body.endswith("\n") else "\n")

    def repo_head(self, name: str) -> str:
        return self.repo_name.replace("{name}", name)


def _template(name: str, spec: dict) -> FimTemplate:
    return FimTemplate(name, spec["template"], spec.get("repo_name", ""), spec.get("file_sep", ""))


def choose_fim_template(vocab, model_type: str | None = None, path: str | os.PathLike | None = None,
                        family: str | None = None) -> FimTemplate:
    """The family whose FIM tokens the tokenizer has (or whose model_type matches); `plain`
    for a model without them. `family` forces one (FIM_FAMILY)."""
    families = yaml.safe_load(resolve("fim_templates.yaml", path).read_text(encoding="utf-8"))["families"]
    family = family or os.environ.get("FIM_FAMILY")
    if family:
        if family not in families:
            raise ValueError(f"FIM family {family!r} is not one of {sorted(families)}")
        return _template(family, families[family])
    for name, spec in families.items():
        tokens = spec.get("tokens") or []
        by_model_type = model_type and model_type in (spec.get("model_types") or [])
        if (tokens and all(t in vocab for t in tokens)) or by_model_type:
            return _template(name, spec)
    return _template("plain", families["plain"])


# ---- context and trimming ------------------------------------------------------------------------
def fit_end(text: str, budget: int, count: Callable[[str], int]) -> str:
    """The end of `text` within `budget` tokens, starting at a line boundary when cut."""
    return _fit(text, budget, count, keep_end=True)


ANCHOR_LINES = 32      # a prefix window starts at a line number that is a multiple of this


def fit_end_anchored(text: str, budget: int, count: Callable[[str], int], stride: int = ANCHOR_LINES) -> str:
    """The end of `text` within `budget` tokens, starting at a line whose number is a multiple of
    `stride`: while the cursor moves on, the window's start stays put, so successive prompts
    share their beginning and the engine's prefix cache serves all but the newly typed part (a
    window that always starts as early as the budget allows moves with every line and is
    prefilled anew each time)."""
    if count(text) <= budget:
        return text
    starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"][stride - 1::stride]   # lines 0, s, 2s...
    lo, hi = 0, len(starts) - 1              # the first anchor whose tail fits (tails shrink as it grows)
    if count(text[starts[hi]:]) > budget:
        return fit_end(text[starts[hi]:], budget, count)
    while lo < hi:
        mid = (lo + hi) // 2
        if count(text[starts[mid]:]) <= budget:
            hi = mid
        else:
            lo = mid + 1
    return text[starts[lo]:]


def fit_start(text: str, budget: int, count: Callable[[str], int]) -> str:
    """The start of `text` within `budget` tokens, ending at a line boundary when cut."""
    return _fit(text, budget, count, keep_end=False)


def _fit(text: str, budget: int, count: Callable[[str], int], keep_end: bool) -> str:
    """Shrink by the measured chars-per-token ratio (a few tokenizer calls, not one per line)."""
    for _ in range(9):
        if not text:
            return text
        n = count(text)
        if n <= budget:
            return text
        keep = max(1, int(len(text) * budget / n * 0.9))
        if keep_end:
            cut = text[-keep:]
            nl = cut.find("\n")
            text = cut[nl + 1:] if 0 <= nl < len(cut) - 1 else cut
        else:
            cut = text[:keep]
            nl = cut.rfind("\n")
            text = cut[:nl + 1] if nl > 0 else cut
    return text


def snippet_comments(snippets: list[Snippet], rules: LanguageRules, budget: int, count: Callable[[str], int]) -> str:
    """Snippets as path-labelled comments, in order, while they fit the budget."""
    def block(s: Snippet) -> str:
        lines = [f"{rules.comment} Path: {s.filepath}"] + [f"{rules.comment} {line}" for line in s.body.splitlines()]
        return "\n".join(lines) + "\n"
    return _within(snippets, block, budget, count)


def snippet_files(snippets: list[Snippet], template: FimTemplate, budget: int, count: Callable[[str], int]) -> str:
    """Snippets as repository files (the family's file separator, the path, the code), in order,
    while they fit the budget."""
    return _within(snippets, lambda s: template.file_block(s.filepath, s.body), budget, count)


def _within(snippets: list[Snippet], render: Callable[[Snippet], str], budget: int,
            count: Callable[[str], int]) -> str:
    out, used = [], 0
    for s in snippets:
        block = render(s)
        cost = count(block)
        if used + cost > budget:
            continue
        out.append(block)
        used += cost
    return "".join(out)


# ---- the service ---------------------------------------------------------------------------------
@dataclass
class CompletionResult:
    id: str
    texts: list[str]
    cached: bool = False
    cache_kind: str = ""            # "exact" | "forward" when cached
    cancelled: bool = False
    engine_s: float = 0.0
    wasted_tokens: int = 0          # pieces the engine produced after this request was superseded
    prompt_tokens: int = 0
    completion_tokens: int = 0      # generated before any trimming (what the engine computed)
    first_token_s: float = 0.0      # from the engine call to the first piece (prompt processing)


class CompletionService:
    # Token budgets. The suffix follows the prefix in a FIM prompt, so every keystroke prefills it
    # again (the prefix before the cursor is in the prefix cache): 64 suffix tokens halved the
    # typing trace's P50 against 256 (684 -> 336 ms, bench/cpu/typing_trace.py) for 0.549 -> 0.524
    # HumanEval single-line pass@1 (bench/cpu/completion_eval.py).
    def __init__(self, client: InferenceClient, template: FimTemplate, languages: Languages | None = None,
                 prefix_budget: int = 768, suffix_budget: int = 64, snippet_budget: int = 384,
                 cache: CompletionCache | None = None):
        self.client, self.template = client, template
        self.languages = languages or Languages()
        self.prefix_budget, self.suffix_budget, self.snippet_budget = prefix_budget, suffix_budget, snippet_budget
        self.cache = cache or CompletionCache()
        self._current: dict[tuple[str, str], tuple[str, threading.Event]] = {}     # (user, file) -> running
        self.indexes: dict[str, CodeIndex] = {}                                     # repository -> code index
        self._lock = threading.Lock()
        self.num_cancelled = 0

    def build_prompt(self, req: CompletionRequest) -> tuple[str, list[str]]:
        """(the prompt, the stop sequences)."""
        p = self._prompt(req)
        return p.text, p.stops

    def _prompt(self, req: CompletionRequest) -> Prompt:
        rules = self.languages.get(req.language, req.filepath)
        marker = self.template.fim_marker
        if marker and marker in req.prefix:
            # a client that renders the FIM template itself (Continue's autocomplete over an
            # OpenAI provider): its prompt goes to the model as written
            stops = list(dict.fromkeys(["\n\n", "\n\r\n", *rules.stops, *req.stop]))[:16]
            return Prompt(req.prefix, f"\x00{req.prefix}", "", False, False, stops)
        count = self.client.count_tokens
        line_is_blank = not req.prefix.rsplit("\n", 1)[-1].strip()
        # whitespace at the cursor leaves the prompt (completion_text.py), except a FIM model's
        # indentation on a blank line
        body, typed = split_typed(req.prefix) if not (self.template.uses_suffix and line_is_blank) else (
            req.prefix, "")
        prefix = fit_end_anchored(body, self.prefix_budget, count)
        suffix = fit_start(req.suffix, self.suffix_budget, count) if self.template.uses_suffix else ""
        snippets = list(req.snippets)
        index = self.indexes.get(safe_name(req.repository or "")) or (
            next(iter(self.indexes.values())) if len(self.indexes) == 1 else None)
        if index is not None:           # then code from the indexed repository, near what is being typed
            query = "\n".join(prefix.splitlines()[-12:])
            snippets += [Snippet(c.filepath, c.body) for c in index.search(query, 3, exclude_file=req.filepath)]
        head = ""
        if not self.template.uses_files:
            prefix = snippet_comments(snippets, rules, self.snippet_budget, count) + prefix
        elif snippets:                  # repository-level: other files, then the one being edited (the
            # head alone, with no other file, made the 0.5B write a new function instead of the body)
            head = (self.template.repo_head(repo_label(req.repository))
                    + snippet_files(snippets, self.template, self.snippet_budget, count)
                    + self.template.file_block(req.filepath or "untitled", ""))
        markdown = req.language == "markdown" or (req.filepath or "").endswith((".md", ".markdown"))
        fence = [] if markdown else ["\n```"]         # an instruct model closing a code block
        stops = list(dict.fromkeys(["\n\n", "\n\r\n", *fence, *rules.stops, *req.stop]))[:16]
        return Prompt(head + self.template.render(prefix, suffix), f"{head}\x00{prefix}{typed}", typed,
                      line_is_blank, req.prefix[-1:] in (" ", "\t"), stops)

    def complete(self, req: CompletionRequest) -> CompletionResult:
        rid = f"cmpl-{uuid.uuid4().hex}"
        # A newer request supersedes the user's older one for this file first, even if it is
        # then answered from the cache.
        slot = (req.user or "", req.filepath or "") if (req.user or req.filepath) else None
        event = threading.Event()
        if slot is not None:
            with self._lock:
                older = self._current.get(slot)
                self._current[slot] = (rid, event)
            if older is not None:                          # supersede: free its KV blocks now
                older[1].set()
                for i in range(4):
                    self.client.abort(f"{older[0]}-{i}")
                self.num_cancelled += 1
        try:
            return self._complete(rid, req, event)
        finally:
            if slot is not None:
                with self._lock:
                    if self._current.get(slot, (None,))[0] == rid:
                        del self._current[slot]

    def _complete(self, rid: str, req: CompletionRequest, event: threading.Event) -> CompletionResult:
        p = self._prompt(req)
        if not p.text:         # an empty file: nothing to complete from (and not an inference failure)
            return CompletionResult(rid, [""] * req.n)
        # the cache key ends with what precedes the cursor; everything else must match exactly, so
        # that typing the start of a suggestion extends the key ("forward" hit)
        settings = (f"{req.temperature}|{req.top_p}|{req.top_k}|{req.max_tokens}|{req.n}|{req.seed}|{p.stops}|"
                    f"{req.n_indent}|{self.template.family}|{req.suffix}")
        found = self.cache.lookup(p.key, settings) if req.n == 1 and req.max_tokens > 0 else None
        if found is not None:
            return CompletionResult(rid, [found[0]], cached=True, cache_kind=found[1])
        t0 = time.perf_counter()
        texts: list[str] = []
        generated = prompt_tokens = 0
        first_s = None
        for i in range(req.n):
            raw, wasted, first = self._generate(p, req, f"{rid}-{i}", event)
            first_s = first if first_s is None else first_s
            if event.is_set():
                return CompletionResult(rid, [""] * req.n, cancelled=True, engine_s=time.perf_counter() - t0,
                                        wasted_tokens=wasted)
            used = getattr(self.client, "usage", lambda _: None)(f"{rid}-{i}")
            if used is None:                                   # a client that does not report usage
                used = (self.client.count_tokens(p.text), self.client.count_tokens(raw) if raw else 0)
            prompt_tokens, generated = used[0], generated + used[1]
            text = cut_dedent(after_typed(raw, p.typed, p.line_is_blank, p.after_blank), req.n_indent)
            texts.append(trim_completion(text, req.suffix))
        engine_s = time.perf_counter() - t0
        if req.n == 1 and texts[0]:
            self.cache.put(p.key, settings, texts[0])
        return CompletionResult(rid, texts, engine_s=engine_s, prompt_tokens=prompt_tokens,
                                completion_tokens=generated, first_token_s=first_s or engine_s)

    def _generate(self, p: Prompt, req: CompletionRequest, request_id: str,
                  event: threading.Event) -> tuple[str, int, float | None]:
        """(the raw text, pieces that arrived after a cancel, seconds to the first piece). Stops
        early, aborting the engine request, on a runaway repetition, and once t_max_predict_ms
        has passed since the first piece with a line already written (llama.cpp's rule)."""
        t0 = time.perf_counter()
        text, wasted, first = "", 0, None
        stream = self.client.complete_stream(p.text, max_tokens=max(1, req.max_tokens), temperature=req.temperature,
                                             top_p=req.top_p, top_k=req.top_k, stop=p.stops, seed=req.seed,
                                             request_id=request_id)
        for piece in stream:
            if event.is_set():
                wasted += 1            # the abort is on its way: count what still arrives
                continue
            now = time.perf_counter()
            first = now - t0 if first is None else first
            text += piece
            cut = repetition_start(text)
            late = req.t_max_predict_ms and now - t0 - first > req.t_max_predict_ms / 1e3 and "\n" in text
            if cut is not None or late:
                text = text if cut is None else text[:cut]
                self.client.abort(request_id)
                close = getattr(stream, "close", None)
                if close is not None:
                    close()
                break
        return (text if req.max_tokens > 0 else ""), wasted, first


def service_for(client: InferenceClient, index_dir: str | None = None) -> CompletionService:
    """A service with the FIM template of the client's model (in-process: read from its
    tokenizer; over HTTP: FIM_FAMILY, else plain) and the code indexes already built."""
    vocab, model_type = (), None
    engine = getattr(client, "engine", None)
    if engine is None and hasattr(client, "in_process_engine"):          # the web app's fallback chain
        engine = client.in_process_engine()
    if engine is not None:
        hf = getattr(engine.tokenizer, "hf", None)
        vocab = hf.get_vocab() if hf is not None else ()
        model_type = getattr(getattr(engine.engine, "arch", None), "model_type", None)
    budgets = {name: int(os.environ[var]) for name, var in (("prefix_budget", "COMPLETION_PREFIX_TOKENS"),
                                                            ("suffix_budget", "COMPLETION_SUFFIX_TOKENS"),
                                                            ("snippet_budget", "COMPLETION_SNIPPET_TOKENS"))
               if os.environ.get(var)}
    service = CompletionService(client, choose_fim_template(vocab, model_type), **budgets)
    folder = Path(index_dir) if index_dir else DEFAULT_INDEX_DIR
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        index = CodeIndex.load(path.stem, folder)
        if index is not None:
            service.indexes[path.stem] = index
    return service


__all__ = ["MAX_SEED", "CompletionRequest", "CompletionResult", "CompletionService", "InferenceError",
           "InvalidRequest", "parse_infill", "parse_openai", "parse_request", "parse_tabby", "service_for",
           "trim_completion"]
