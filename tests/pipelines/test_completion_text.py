"""A completion's text as the editor inserts it: whitespace already typed at the cursor, indentation
limits and runaway repetition; and the repository-level prompt of a family trained on it."""
from __future__ import annotations

import pytest

from pipelines.completion import CompletionRequest, CompletionService
from pipelines.completion_prompt import Snippet, choose_fim_template, repo_label
from pipelines.completion_text import after_typed, cut_dedent, repetition_start, split_typed

QWEN_VOCAB = {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"}


@pytest.mark.parametrize("prefix, body, typed", [
    ("def f():\n    ", "def f():\n", "    "),
    ("    return ", "    return", " "),
    ("x = 1\n\t\t", "x = 1\n", "\t\t"),
    ("x = (", "x = (", ""),
    ("", "", ""),
])
def test_split_typed(prefix, body, typed):
    assert split_typed(prefix) == (body, typed)


@pytest.mark.parametrize("text, typed, blank, want", [
    ("    total += v", "    ", True, "total += v"),               # the indentation the user typed
    ("\n    total += v", "    ", True, "total += v"),             # a leading newline on a blank line
    ("  total", "    ", True, "total"),                           # less than typed: none of it again
    ("        deeper()", "    ", True, "    deeper()"),           # more than typed: the rest is meant
    (" a + b", " ", False, "a + b"),                              # after "return "
    ("a + b", " ", False, "a + b"),
    ("\n", "", True, "\n"),                                       # nothing after the newline: untouched
    ("\n    return 1", "", False, "\n    return 1"),              # after "def f():" a newline is right
])
def test_after_typed(text, typed, blank, want):
    assert after_typed(text, typed, blank) == want


@pytest.mark.parametrize("text, blank, want", [
    ("\tfmt.Println(x)", True, "fmt.Println(x)"),        # a FIM prompt kept the two tabs typed
    ("\n\ttotal += v", True, "total += v"),
    ("  a + b", False, "a + b"),                          # after "return "
])
def test_after_whitespace_kept_in_the_prompt(text, blank, want):
    assert after_typed(text, "", blank, after_blank=True) == want


def test_cut_dedent_ends_at_a_shallower_line():
    text = "x = 1\n        y = 2\n    z = 3\n        w"
    assert cut_dedent(text, 8) == "x = 1\n        y = 2"
    assert cut_dedent(text, 0) == text and cut_dedent("a\n\n        b", 8) == "a\n\n        b"


@pytest.mark.parametrize("text, kept", [
    ("\tmaxOf(names)\n\tmaxOf(names)\n\tmaxOf(names)\n\tmax", "\tmaxOf(names)"),
    ("a = 1\nb = 2\nb = 2\nb = 2\n", "a = 1\nb = 2"),
    ("print(foo(foo(foo(foo(foo(foo(foo(foo(", "print(foo("),
])
def test_repetition_is_cut_after_its_first_copy(text, kept):
    cut = repetition_start(text)
    assert cut is not None and text[:cut] == kept


@pytest.mark.parametrize("text", [
    "}\n  }\n}\n",                                          # closing braces at falling depths
    "x.append(1)\nx.append(1)\n",                            # twice is not a loop
    "# ----------------------------------------\n",          # a separator line (period 1)
    "for i in range(10):\n    total += i\n",
])
def test_code_that_is_not_a_loop(text):
    assert repetition_start(text) is None


GROWING = ", ".join(f'"{w}"' for w in ["you", "yours", "yourself", "yourselfs", "yourselfly", "yourselflys",
                                        "yourselflyst", "yourselflystly", "yourselflystlys", "yourselflystlysly",
                                        "yourselflystlyslys", "yourselflystlyslysly"])


def test_a_line_growing_variations_of_itself_is_dropped():
    text = "words = [\n    " + GROWING
    assert len(text.split("\n")[-1]) >= 160
    assert text[:repetition_start(text)] == "words = [\n"


@pytest.mark.parametrize("line", [
    '"be", "by", "can", "do", "does", "for", "from", "how", "i", "if", "in", "is", "it", "me", "my", "of", '
    '"on", "or", "our", "so", "that", "the", "this", "to", "was", "we"',
    "0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10, 0x11, "
    "0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a",
    "return [name for name, (needs, _) in ISA_LEVELS.items() if needs <= flags and name not in excluded] + "
    "sorted(extra_levels_for_this_machine, key=lambda level: (len(level), level))",
])
def test_long_lines_of_real_code_are_kept(line):
    assert len(line) >= 160 and repetition_start(line) is None


class Core:
    def __init__(self, pieces):
        self.pieces, self.prompts, self.aborted = pieces, [], []

    def count_tokens(self, text):
        return len(text.split())

    def complete_stream(self, prompt, **kw):
        self.prompts.append(prompt)
        yield from self.pieces

    def abort(self, request_id):
        self.aborted.append(request_id)


def test_qwen_prompt_puts_other_files_first_and_names_the_current_one():
    core = Core(["x"])
    service = CompletionService(core, choose_fim_template(QWEN_VOCAB))
    req = CompletionRequest(prefix="import util\n\nutil.", suffix="\n", filepath="app/main.py",
                            repository="https://github.com/acme/shop.git",
                            snippets=[Snippet("app/util.py", "def helper():\n    return 1")])
    text, _ = service.build_prompt(req)
    assert text == ("<|repo_name|>shop\n<|file_sep|>app/util.py\ndef helper():\n    return 1\n"
                    "<|file_sep|>app/main.py\n<|fim_prefix|>import util\n\nutil.<|fim_suffix|>\n<|fim_middle|>")
    bare, _ = service.build_prompt(CompletionRequest(prefix="a = ", suffix="", filepath="a.py"))
    assert bare == "<|fim_prefix|>a =<|fim_suffix|><|fim_middle|>"        # no other file: plain FIM, the
    # space typed after text is the model's to write


def test_the_plain_family_keeps_snippets_as_comments_and_heals_the_cursor():
    core = Core([" x + 1"])
    service = CompletionService(core, choose_fim_template(set()))
    req = CompletionRequest(prefix="y = ", language="python", snippets=[Snippet("u.py", "def g(): ...")])
    text, _ = service.build_prompt(req)
    assert text == "# Path: u.py\n# def g(): ...\ny ="          # the typed space is the model's to write
    assert service.complete(req).texts == ["x + 1"]


@pytest.mark.parametrize("url, name", [("https://github.com/acme/shop.git", "shop"), ("git@host:team/api.git", "api"),
                                       ("/srv/repos/tools/", "tools"), (None, "project")])
def test_repo_label(url, name):
    assert repo_label(url) == name


def test_a_runaway_generation_is_aborted_and_cut():
    core = Core(["\tmaxOf(names)\n"] * 40)
    service = CompletionService(core, choose_fim_template(QWEN_VOCAB))
    out = service.complete(CompletionRequest(prefix="func main() {\n\t", suffix="\n}\n", language="go"))
    assert out.texts == ["maxOf(names)"] and len(core.aborted) == 1


def test_whitespace_at_the_cursor_is_not_suggested_again():
    core = Core(["    ", "total += v"])
    service = CompletionService(core, choose_fim_template(QWEN_VOCAB))
    out = service.complete(CompletionRequest(prefix="for v in xs:\n    ", suffix="\nreturn total\n"))
    assert out.texts == ["total += v"]
    assert core.prompts[0].endswith("for v in xs:\n    <|fim_suffix|>\nreturn total\n<|fim_middle|>")


def test_a_prompt_that_already_holds_the_fim_template_goes_as_written():
    core = Core(["a + b"])
    service = CompletionService(core, choose_fim_template(QWEN_VOCAB))
    raw = "<|fim_prefix|>def add(a, b):\n    return <|fim_suffix|>\n<|fim_middle|>"
    assert service.complete(CompletionRequest(prefix=raw, suffix="")).texts == ["a + b"]
    assert core.prompts == [raw]
