"""Incremental detokenisation: multi-byte characters and stop strings, token by token."""
from __future__ import annotations

import pytest

from inference.core.detokenizer import IncrementalDetokenizer
from inference.core.tokenizer import ByteTokenizer
from inference.sampling_params import SamplingParams

TOK = ByteTokenizer(512)


def _stream(text: str, **params):
    detok = IncrementalDetokenizer(TOK, SamplingParams(**params), TOK.encode("prompt"))
    deltas = []
    for token in TOK.encode(text)[1:]:               # one byte per token: characters split across tokens
        stop = detok.add_tokens([token])
        deltas.append(detok.take_delta(finished=stop is not None))
        if stop is not None:
            return deltas, stop, detok
    deltas.append(detok.take_delta(finished=True))
    return deltas, None, detok


def test_multibyte_characters_never_split():
    text = "价格是 ¥99 — 谢谢 🙂"
    deltas, _, _ = _stream(text)
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_held_back_then_cut(include):
    deltas, stop, detok = _stream("abc END def", stop=["END", "XYZ"], include_stop_str_in_output=include)
    assert stop == "END"
    assert "".join(deltas) == ("abc END" if include else "abc ")
    running = ""
    for d in deltas[:-1]:
        running += d
        assert not running.endswith(("E", "EN")), running     # partial stop never shown early


def test_false_start_of_stop_is_released():
    deltas, stop, _ = _stream("a EN b", stop="END")
    assert stop is None and "".join(deltas) == "a EN b"


@pytest.mark.parametrize("model", ["smollm2", "qwen2.5-coder-0.5b"])
def test_the_decode_stream_gives_the_window_decoders_text(model):
    """A Hugging Face tokenizer decodes through its Rust DecodeStream; token by token, on code,
    Chinese, emoji and special tokens, the text must be what the sliding window decodes."""
    import random

    from inference.core.tokenizer import HFTokenizer
    from inference.loader.model_loader import resolve_model_dir
    tok = HFTokenizer(resolve_model_dir(model))
    window = HFTokenizer.__new__(HFTokenizer)             # the same tokenizer without decode_stream
    window.__dict__.update(tok.__dict__)
    window.decode_stream = lambda *_a, **_k: None
    rng = random.Random(7)
    texts = ["def f(x):\n    return x  # 价格是 ¥99 🙂\n", " leading space, tabs\t\tand   runs",
             "<|im_start|>assistant\nHi<|im_end|> after"]
    for text in texts + ["".join(rng.choice("ab 价🙂\n{}") for _ in range(60))]:
        ids = tok.hf.encode(text, add_special_tokens=False)
        for skip in (True, False):
            params = SamplingParams(skip_special_tokens=skip)
            prompt = tok.encode("Write it:")
            fast, slow = IncrementalDetokenizer(tok, params, prompt), IncrementalDetokenizer(window, params, prompt)
            assert fast._stream is not None and slow._stream is None
            for t in ids:
                fast.add_tokens([t])
                slow.add_tokens([t])
                assert fast.text == slow.text, (model, text, skip)
