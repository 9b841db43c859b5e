"""Code completion for IDEs: request shapes (Tabby's, OpenAI's legacy completions, llama.cpp's
/infill), the service that prompts the engine, cancellation and a cache.

    request -> CompletionRequest -> prompt (pipelines/completion_prompt.py: the family's FIM
    template, other files, prefix end + suffix start within budgets, stops) -> cache? ->
    engine (temperature 0.2, top_p 0.95, max 128 tokens, stops; cut on runaway repetition) ->
    text as inserted (pipelines/completion_text.py: typed whitespace, indentation, trimming)

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from httpkit.validation import InvalidRequest, validate
from pipelines.code_index import DEFAULT_CACHE as DEFAULT_INDEX_DIR
from pipelines.code_index import CodeIndex, safe_name
from pipelines.completion_cache import CompletionCache
from pipelines.completion_prompt import (
    FimTemplate,
    Languages,
    Prompt,
    Snippet,
    choose_fim_template,
    fit_end_anchored,
    fit_start,
    repo_label,
    snippet_comments,
    snippet_files,
    stop_list,
)
from pipelines.completion_schemas import MAX_SEED, MAX_SEGMENT_CHARS, InfillIn, OpenAICompletionIn, TabbyCompletionIn
from pipelines.completion_text import after_typed, cut_dedent, repetition_start, split_typed, trim_completion
from pipelines.inference_client import InferenceClient, InferenceError

FORWARD_WINDOW = 8                   # recent suggestions per settings a forward hit may extend


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
    cache_prompt: bool = True           # llama.cpp's: false turns shifted KV reuse off (exact prompts)


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
        t_max_predict_ms=req.t_max_predict_ms or None, cache_prompt=req.cache_prompt)


def parse_request(body: Any) -> tuple[CompletionRequest, bool]:
    """Either dialect: (the request, whether it is Tabby's, which has `segments`)."""
    tabby = isinstance(body, dict) and "segments" in body
    return (parse_tabby(body) if tabby else parse_openai(body)), tabby


def _given(value, default):
    return default if value is None else value


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
    cached_tokens: int = 0          # prompt tokens the engine's prefix cache served


class CompletionService:
    # Token budgets. The suffix follows the prefix in a FIM prompt, so every keystroke would prefill
    # it again (the prefix before the cursor is in the prefix cache): 64 suffix tokens halved the
    # typing trace's P50 against 256 (684 -> 336 ms, bench/cpu/typing_trace.py) for 0.549 -> 0.524
    # HumanEval single-line pass@1 (bench/cpu/completion_eval.py).
    # cache_reuse: the engine takes a moved run of at least this many tokens (the suffix, mostly)
    # from the user's last request instead (SamplingParams.cache_reuse; 0: off).
    def __init__(self, client: InferenceClient, template: FimTemplate, languages: Languages | None = None,
                 prefix_budget: int = 768, suffix_budget: int = 64, snippet_budget: int = 384,
                 cache: CompletionCache | None = None, cache_reuse: int = 16):
        self.client, self.template, self.cache_reuse = client, template, cache_reuse
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
            return Prompt(req.prefix, f"\x00{req.prefix}", "", False, False, stop_list(rules, req.stop))
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
        stops = stop_list(rules, req.stop, fence=not markdown)
        return Prompt(head + self.template.render(prefix, suffix), f"{head}\x00{prefix}{typed}", typed,
                      line_is_blank, req.prefix[-1:] in (" ", "\t"), stops)

    def complete(self, req: CompletionRequest) -> CompletionResult:
        rid = f"cmpl-{uuid.uuid4().hex}"
        # A newer request supersedes the user's older one for this file first, even if it is
        # then answered from the cache.
        # A warm-up (max_tokens 0: llama.vscode's context chunks) only prefills: it supersedes nothing.
        slot = (req.user or "", req.filepath or "") if (req.user or req.filepath) and req.max_tokens > 0 else None
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
        generated = prompt_tokens = cached_tokens = 0
        first_s = None
        for i in range(req.n):
            raw, wasted, first = self._generate(p, req, f"{rid}-{i}", event)
            first_s = first if first_s is None else first_s
            if event.is_set():
                return CompletionResult(rid, [""] * req.n, cancelled=True, engine_s=time.perf_counter() - t0,
                                        wasted_tokens=wasted)
            used = getattr(self.client, "usage", lambda _: None)(f"{rid}-{i}")
            if used is None:                                   # a client that does not report usage
                used = (self.client.count_tokens(p.text), self.client.count_tokens(raw) if raw else 0, 0)
            prompt_tokens, generated, cached_tokens = used[0], generated + used[1], used[2]
            text = cut_dedent(after_typed(raw, p.typed, p.line_is_blank, p.after_blank), req.n_indent)
            texts.append(trim_completion(text, req.suffix))
        engine_s = time.perf_counter() - t0
        if req.n == 1 and texts[0]:
            self.cache.put(p.key, settings, texts[0])
        return CompletionResult(rid, texts, engine_s=engine_s, prompt_tokens=prompt_tokens,
                                completion_tokens=generated, first_token_s=first_s or engine_s,
                                cached_tokens=cached_tokens)

    def _generate(self, p: Prompt, req: CompletionRequest, request_id: str,
                  event: threading.Event) -> tuple[str, int, float | None]:
        """(the raw text, pieces that arrived after a cancel, seconds to the first piece). Stops
        early, aborting the engine request, on a runaway repetition, and once t_max_predict_ms
        has passed since the first piece with a line already written (llama.cpp's rule)."""
        t0 = time.perf_counter()
        text, wasted, first = "", 0, None
        stream = self.client.complete_stream(p.text, max_tokens=max(1, req.max_tokens), temperature=req.temperature,
                                             top_p=req.top_p, top_k=req.top_k, stop=p.stops, seed=req.seed,
                                             request_id=request_id,
                                             cache_reuse=self.cache_reuse if req.cache_prompt else 0)
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
                                                            ("snippet_budget", "COMPLETION_SNIPPET_TOKENS"),
                                                            ("cache_reuse", "COMPLETION_CACHE_REUSE"))
               if os.environ.get(var)}
    service = CompletionService(client, choose_fim_template(vocab, model_type), **budgets)
    folder = Path(index_dir) if index_dir else DEFAULT_INDEX_DIR
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        index = CodeIndex.load(path.stem, folder)
        if index is not None:
            service.indexes[path.stem] = index
    return service


__all__ = ["MAX_SEED", "CompletionRequest", "CompletionResult", "CompletionService", "InferenceError",
           "InvalidRequest", "parse_infill", "parse_openai", "parse_request", "parse_tabby", "service_for"]
