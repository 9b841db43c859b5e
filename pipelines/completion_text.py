"""The text of a completion as the editor inserts it: the whitespace already typed at the cursor,
trimming against the suffix, indentation limits and runaway repetition.

Whitespace at the cursor. A prompt that ends in spaces or tabs ("    " on a blank indented line,
"return ") ends mid-token for a BPE tokenizer, whose words carry their leading space (" width"):
the model answers with an extra space, tab or newline, or loses its way (Qwen2.5-Coder-0.5B
after "return ": a print call instead of "width * height"). So the prompt stops before that
whitespace (`split_typed`), the model writes it itself, and `after_typed` removes what the
user had already typed. One exception, measured: a FIM model's indentation on a blank line stays
in the prompt (left out, the 0.5B started a new function instead of the body at the cursor in
Go and JavaScript); only extra whitespace and newlines it may begin with are removed.
"""
from __future__ import annotations

import re
import zlib

_TRAILING_BLANKS = re.compile(r"[ \t]+$")


def split_typed(prefix: str) -> tuple[str, str]:
    """(the prefix without the spaces and tabs that end its last line, those spaces and tabs)."""
    m = _TRAILING_BLANKS.search(prefix)
    return (prefix, "") if m is None else (prefix[:m.start()], m.group())


def after_typed(text: str, typed: str, line_is_blank: bool, after_blank: bool = False) -> str:
    """The completion for a cursor after `typed` (whitespace the prompt left out): that
    whitespace off its start; on a blank line also any newlines the model began with, so the
    suggestion starts on the cursor's line at the indentation already there. `after_blank`: the
    prompt kept the whitespace that ends the prefix (an indentation typed, "return "), so any
    the model adds at the start is one too many."""
    if line_is_blank:
        stripped = text.lstrip("\r\n")
        if stripped != text and stripped.strip():
            text = stripped
    if not typed:
        return text.lstrip(" \t") if after_blank else text
    if text.startswith(typed):
        return text[len(typed):]
    lead = len(text) - len(text.lstrip(" \t"))
    if lead and typed.startswith(text[:lead]):        # the model wrote part of it
        return text[lead:]
    return text


def trim_completion(text: str, suffix: str, min_chars: int = 1) -> str:
    """Trailing whitespace off; stop where the completion starts repeating the suffix; '' when
    nothing useful is left."""
    first_suffix_line = suffix.split("\n", 1)[0]
    lines = text.split("\n")
    if first_suffix_line.strip() and lines[0].endswith(first_suffix_line):       # e.g. the closing ")"
        lines[0] = lines[0][: len(lines[0]) - len(first_suffix_line)]
    # the suffix's next line, indentation included: a "}" deeper than the suffix's closes a block
    # the completion opened, and is kept
    next_line = next((line.rstrip() for line in suffix.split("\n")[1:] if line.strip()), "") if not \
        first_suffix_line.strip() else first_suffix_line.rstrip()
    if next_line:
        for i, line in enumerate(lines[1:], start=1):
            if line.rstrip() == next_line:               # the suffix's next line is already there
                lines = lines[:i]
                break
    out = "\n".join(lines).rstrip()
    if len(out.strip()) < min_chars:
        return ""
    if suffix.strip() and suffix.lstrip().startswith(out.strip()):                # only echoes the suffix
        return ""
    return out


def cut_dedent(text: str, n_indent: int) -> str:
    """The completion up to the first later line indented less than `n_indent` columns (a tab
    counts as one, as llama.cpp's n_indent does): the block being written has ended."""
    if n_indent <= 0:
        return text
    lines = text.split("\n")
    for i, line in enumerate(lines[1:], start=1):
        if line.strip() and len(line) - len(line.lstrip(" \t")) < n_indent:
            return "\n".join(lines[:i])
    return text


REPEATS = 3                 # the same line this many times in a row is a loop, not code
MIN_PERIOD_CHARS = 24       # a repeating tail this long (and 4 periods) inside a line is one too
# a line whose last LOW_INFO_CHARS compress (zlib) under LOW_INFO_RATIO of their size has stopped
# carrying information: "yourselfly", "yourselflys", "yourselflyst", ... (a list of stop words or
# hex bytes compresses to ~0.55, code and prose to 0.8-1.0)
LOW_INFO_CHARS, LOW_INFO_RATIO = 160, 0.33


def repetition_start(text: str) -> int | None:
    """Where a runaway repetition begins (the offset just after its first copy), or None.

    A loop is the same non-blank line REPEATS times in a row (indentation included, so closing
    braces at falling depths are not one), or a line that ends in 4+ copies of one 3..32
    character unit over at least MIN_PERIOD_CHARS ("foo(foo(foo(foo("). A line that keeps
    growing variations of itself without a period (LOW_INFO_*) is dropped whole: the offset is
    its start."""
    lines = text.split("\n")
    offset, run, prev = 0, 0, None
    starts = []
    for line in lines:
        starts.append(offset)
        offset += len(line) + 1
    for i, line in enumerate(lines[:-1]):          # whole lines only (the last may still grow)
        if line.strip() and line == prev:
            run += 1
            if run + 1 >= REPEATS:
                first = i - run
                return starts[first] + len(lines[first])
        else:
            run = 0
        prev = line
    tail = lines[-1]
    for period in range(3, 33):
        span = max(4 * period, MIN_PERIOD_CHARS)
        if len(tail) < span:
            break
        end = tail[-span:]
        if all(end[j] == end[j - period] for j in range(period, span)):
            start = len(tail) - span                 # back to where the copies begin
            while start >= period and tail[start - period:start] == tail[start:start + period]:
                start -= period
            return len(text) - len(tail) + start + period
    window = tail[-LOW_INFO_CHARS:].encode()
    if len(tail) >= LOW_INFO_CHARS and len(zlib.compress(window, 9)) < LOW_INFO_RATIO * len(window):
        return len(text) - len(tail)
    return None
