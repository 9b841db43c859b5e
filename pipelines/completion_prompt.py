"""The prompt of a code completion: the model family's FIM template, the language's rules, and
what fits the token budgets around the cursor (pipelines/completion.py builds it per request).

    configs/fim_templates.yaml -> FimTemplate (FIM tokens, repository-level context or not)
    configs/languages.yaml     -> LanguageRules (comment marker, stop sequences)
    text around the cursor     -> fit_end_anchored / fit_start within budgets
    other files                -> snippet_files (repository format) or snippet_comments
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import yaml

from configs import resolve


@dataclass(frozen=True)
class Snippet:
    filepath: str
    body: str


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


def stop_list(rules: LanguageRules, extra: list[str], fence: bool = False) -> list[str]:
    """The stop sequences: a blank line, a closing markdown fence (an instruct model ending a code
    block; not in markdown files), the language's, then the request's; at most 16."""
    return list(dict.fromkeys(["\n\n", "\n\r\n", *(["\n```"] if fence else []), *rules.stops, *extra]))[:16]


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
