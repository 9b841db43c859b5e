"""Code completion logic: FIM templates per family, language rules, budgets that keep the cursor
context, trimming, the cache's exact and forward hits, and request validation."""
from __future__ import annotations

import pytest

from pipelines.completion import parse_openai, parse_tabby
from pipelines.completion_cache import CompletionCache
from pipelines.completion_prompt import (
    Languages,
    Snippet,
    choose_fim_template,
    fit_end,
    fit_end_anchored,
    fit_start,
    snippet_comments,
)
from pipelines.completion_text import trim_completion


def words(text: str) -> int:
    return len(text.split())


@pytest.mark.parametrize("vocab, model_type, family, rendered", [
    ({"<fim_prefix>", "<fim_suffix>", "<fim_middle>"}, None, "starcoder", "<fim_prefix>P<fim_suffix>S<fim_middle>"),
    (set(), "starcoder2", "starcoder", "<fim_prefix>P<fim_suffix>S<fim_middle>"),
    ({"▁<PRE>", "▁<SUF>", "▁<MID>"}, None, "codellama", "<PRE> P <SUF>S <MID>"),
    ({"<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"}, None, "deepseek-coder",
     "<｜fim▁begin｜>P<｜fim▁hole｜>S<｜fim▁end｜>"),
    ({"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"}, "qwen2", "qwen2.5-coder",
     "<|fim_prefix|>P<|fim_suffix|>S<|fim_middle|>"),
    ({"[SUFFIX]", "[PREFIX]"}, None, "codestral", "[SUFFIX]S[PREFIX]P"),
    ({"<|im_start|>"}, "llama", "plain", "P"),                  # SmolLM2: no FIM tokens
])
def test_fim_template_per_family(vocab, model_type, family, rendered):
    t = choose_fim_template(vocab, model_type)
    assert t.family == family and t.render("P", "S") == rendered
    assert t.uses_suffix == (family != "plain")


def test_forced_family_and_unknown_family(monkeypatch):
    assert choose_fim_template(set(), family="codellama").family == "codellama"
    with pytest.raises(ValueError, match="FIM family"):
        choose_fim_template(set(), family="nope")


def test_language_rules_by_name_extension_or_generic():
    langs = Languages()
    assert langs.get("python").comment == "#" and "\ndef " in langs.get("python").stops
    assert langs.get("unknown-lang", "src/main.rs").name == "rust"
    assert langs.get("cobol", "x.cbl").name == "generic"


def test_budgets_keep_the_text_nearest_the_cursor():
    prefix = "".join(f"line{i} = {i}\n" for i in range(400)) + "result = compute("
    suffix = ")\n" + "".join(f"after{i} = {i}\n" for i in range(400))
    kept_prefix, kept_suffix = fit_end(prefix, 60, words), fit_start(suffix, 60, words)
    assert kept_prefix.endswith("result = compute(") and words(kept_prefix) <= 60
    assert kept_prefix.startswith("line") and prefix.endswith(kept_prefix)        # cut at a line boundary
    assert kept_suffix.startswith(")\nafter0") and words(kept_suffix) <= 60 and suffix.startswith(kept_suffix)


def test_an_anchored_window_keeps_its_start_while_the_cursor_moves_on():
    source = "".join(f"value_{i} = compute({i}, {i * 7})\n" for i in range(600))
    lines = source.splitlines(keepends=True)
    windows = [fit_end_anchored("".join(lines[:n]) + "result = ", 300, words, stride=32) for n in range(200, 260)]
    for n, w in zip(range(200, 260), windows):
        assert w.endswith("result = ") and words(w) <= 300
        first = int(w.split("=")[0].removeprefix("value_"))
        assert first % 32 == 0 and first <= n                         # starts at an anchor line
    starts = [w.split("=")[0] for w in windows]
    changes = sum(a != b for a, b in zip(starts, starts[1:]))
    assert changes <= 3                                              # 60 lines typed: a jump per 32 lines
    assert fit_end_anchored("short = 1\n", 300, words) == "short = 1\n"
    one_long_line = "x " * 1000
    assert words(fit_end_anchored(one_long_line, 50, words)) <= 50      # no anchor fits: cut inside


def test_snippets_become_path_labelled_comments_within_budget():
    langs = Languages()
    out = snippet_comments([Snippet("a/util.py", "def f():\n    return 1"), Snippet("b/big.py", "x " * 500)],
                           langs.get("python"), 20, words)
    assert out == "# Path: a/util.py\n# def f():\n#     return 1\n"


@pytest.mark.parametrize("text, suffix, want", [
    ("return a + b  \n", "\n", "return a + b"),
    ("fib(n - 1))", ")\n", "fib(n - 1)"),                               # the suffix's closing paren
    ("x = 1\n    y = 2\nprint(x)", "\nprint(x)\n", "x = 1\n    y = 2"),   # stops where the suffix repeats
    ("   \n  ", "", ""),                                                 # nothing useful
    ("print(x)", "print(x)\n", ""),                                      # only echoes the suffix
    ("if (x > b) {\n      b = x;\n    }\n  }", "\n  }\n  return b;\n", "if (x > b) {\n      b = x;\n    }"),
])
def test_trimming(text, suffix, want):
    assert trim_completion(text, suffix) == want


def test_cache_exact_and_forward_hits():
    cache = CompletionCache(capacity=2, ttl=60)
    cache.put("def f(", "s", "a, b):\n    return a")
    assert cache.get("def f(", "s") == "a, b):\n    return a"
    assert cache.get("def f(a, ", "s") == "b):\n    return a"          # the user typed what was suggested
    assert cache.get("def f(x", "s") is None and cache.get("def f(", "other") is None
    assert (cache.hits, cache.forward_hits) == (1, 1)
    cache.put("1", "s", "x")
    cache.put("2", "s", "y")                                             # capacity 2: the first entry goes
    assert cache.get("def f(", "s") is None


def test_request_shapes_and_errors():
    t = parse_tabby({"language": "Python", "segments": {"prefix": "a", "suffix": "b", "filepath": "x.py",
                                                        "declarations": [{"filepath": "d.py", "body": "def d(): ..."}],
                                                        "clipboard": "cb"}, "user": "u1", "temperature": 0.1})
    assert (t.prefix, t.suffix, t.language, t.filepath, t.user, t.temperature) == (
        "a", "b", "python", "x.py", "u1", 0.1)
    assert [s.filepath for s in t.snippets] == ["d.py", "clipboard"]
    o = parse_openai({"prompt": ["p"], "suffix": "s", "max_tokens": 32, "stop": "\n", "stream": True})
    assert (o.prefix, o.suffix, o.max_tokens, o.stop, o.stream) == ("p", "s", 32, ["\n"], True)
    for bad, msg in [({"segments": {"suffix": "x"}}, "prefix"), ({"segments": "x"}, "segments"),
                     ({"segments": {"prefix": 3}}, "prefix"),
                     ({"segments": {"prefix": "a"}, "temperature": "hot"}, "temperature"),
                     ({"segments": {"prefix": "a", "declarations": [{"body": 1}]}}, "declarations"),
                     # falsy values of the wrong type are not a missing list / path (found by the fuzzer)
                     ({"segments": {"prefix": "a", "relevant_snippets_from_recently_opened_files": ""}},
                      "recently_opened"),
                     ({"segments": {"prefix": "a", "declarations": [{"body": "b", "filepath": 0}]}}, "filepath")]:
        with pytest.raises(ValueError, match=msg):
            parse_tabby(bad)
    for bad, msg in [({}, "prompt"), ({"prompt": "a", "max_tokens": 0}, "max_tokens"),
                     ({"prompt": "a", "stop": ["a"] * 5}, "stop"), ({"prompt": "a", "n": 9}, "n"),
                     ({"prompt": "a", "stream": "no"}, "stream")]:
        with pytest.raises(ValueError, match=msg):
            parse_openai(bad)


def test_exact_hits_are_shared_through_redis(redis_server):
    import redis
    redis.Redis.from_url("redis://127.0.0.1:6379/12").flushdb()
    one = CompletionCache(redis_url="redis://127.0.0.1:6379/12")
    two = CompletionCache(redis_url="redis://127.0.0.1:6379/12")           # another web worker
    one.put("def g(", "s", "x):")
    assert two.lookup("def g(", "s") == ("x):", "exact")
    assert two.lookup("def g(x", "s") is None                               # forward hits are per process
    assert one.lookup("def g(x", "s") == ("):", "forward")


class ScriptedCore:
    """Records what the service asks the engine for; answers with a fixed text."""

    def __init__(self, text: str):
        self.text, self.calls = text, []

    def count_tokens(self, text):
        return len(text.split())

    def complete_stream(self, prompt, **kw):
        self.calls.append((prompt, kw))
        yield self.text

    def abort(self, request_id):
        pass


@pytest.mark.parametrize("language, filepath, expected", [
    ("python", "a.py", ["\ndef ", "\nclass "]), ("go", "m.go", ["\nfunc "]), ("rust", "x.rs", ["\nfn "]),
    ("unknown", "notes.txt", [])])
def test_per_language_stops_reach_the_engine(language, filepath, expected):
    from pipelines.completion import CompletionRequest, CompletionService
    core = ScriptedCore("x + 1")
    service = CompletionService(core, choose_fim_template(set()))
    result = service.complete(CompletionRequest(prefix="y = ", language=language, filepath=filepath, stop=["END"]))
    stops = core.calls[0][1]["stop"]
    assert stops[:2] == ["\n\n", "\n\r\n"] and "END" in stops and all(s in stops for s in expected)
    assert result.texts == ["x + 1"] and result.completion_tokens == 3
