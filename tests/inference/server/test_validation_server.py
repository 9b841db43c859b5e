"""The inference service's request models (inference/server/schemas.py) parse every body: inputs
the old hand parser never looked at (wrong types deep inside, unknown fields in nested objects,
the exact boundaries) get a 4xx in OpenAI's shape that names the field, and what passes becomes
the same SamplingParams as before. No engine is needed: it stays "loading", so a valid body gets
the 503, an invalid one never gets that far."""
from __future__ import annotations

import json
import threading

import pytest

from inference.sampling_params import SamplingParams
from inference.server.app import ServerConfig, create_app
from inference.server.protocol import parse_chat, parse_completion

COMP, CHAT, EMB = "/v1/completions", "/v1/chat/completions", "/v1/embeddings"


@pytest.fixture(scope="module")
def http():
    forever = threading.Event()                # the loader thread is a daemon: it goes with the process
    app = create_app(lambda: forever.wait(), ServerConfig(served_model_name="tiny"))
    return app.test_client()


def C(**kw):
    return {"model": "tiny", "prompt": "hi", "max_tokens": 2, **kw}


def H(**kw):
    return {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **kw}


def post(http, path, body):
    r = http.post(path, data=json.dumps(body), content_type="application/json")
    return r.status_code, r.get_json()["error"]


@pytest.mark.parametrize("path, body, param, message", [
    # wrong types inside nested objects
    (COMP, C(stream=True, stream_options={"include_usage": "yes"}), "stream_options",
     "'stream_options.include_usage' must be of type bool, got str"),
    (CHAT, H(stream=True, stream_options={"continuous_usage_stats": 1}), "stream_options",
     "'stream_options.continuous_usage_stats' must be of type bool, got int"),
    (CHAT, H(messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}]), "messages",
     "'messages[0].content' parts must be text parts"),
    (CHAT, H(messages=[{"role": "user", "content": "a"}, {"role": "assistant", "content": None}]), "messages",
     "'messages[1].content' must be a string"),
    (CHAT, H(messages=[{"role": "user", "content": "a"}, "b"]), "messages", "'messages[1]' must be an object"),
    (COMP, C(prompt=[[1, 2], [3, "4"]]), "prompt",
     "'prompt' must be a non-empty string, list of strings, list of token ids or list of token-id lists"),
    (COMP, C(prompt=[[1, 2], [-3]]), "prompt", "'prompt' token ids must be in [0, vocab_size), got -3"),
    (COMP, C(stop_token_ids=[1, "2"]), "stop_token_ids", "stop_token_ids: must be a list of non-negative integers, "
                                                         "got [1, '2']"),
    (COMP, C(stop_token_ids=[True]), "stop_token_ids", "stop_token_ids: must be a list of non-negative integers, "
                                                       "got [True]"),
    # unknown fields: refused at the top level and in stream_options, all of them named
    (COMP, C(zeta=1, alpha=2), "alpha", "Unrecognized request argument supplied: alpha, zeta"),
    (CHAT, H(stream=True, stream_options={"include_usage": True, "extra": 1}), "stream_options",
     "unknown stream_options: ['extra', 'include_usage']"),
    # boundaries, one past each edge
    (COMP, C(n=17), "n", "'n' must be <= 16"),
    (COMP, C(n=0), "n", "n: must be an integer >= 1, got 0"),
    (COMP, C(top_k=2**31), "top_k", "top_k: must be -1 (off), 0 (off) or a positive integer up to 2147483647, "
                                    "got 2147483648"),
    (COMP, C(top_k=-2), "top_k", "top_k: must be -1 (off), 0 (off) or a positive integer up to 2147483647, got -2"),
    (COMP, C(min_p=1.0000001), "min_p", "min_p: must be in [0, 1], got 1.0000001"),
    (CHAT, H(presence_penalty=-2.01), "presence_penalty", "presence_penalty: must be in [-2, 2], got -2.01"),
    (COMP, C(logprobs=6), "logprobs", "'logprobs' must be between 0 and 5"),
    (CHAT, H(logprobs=True, top_logprobs=21), "top_logprobs",
     "'top_logprobs' needs logprobs=true and must be between 0 and 20"),
    (COMP, C(stop=["s"] * 17), "stop", "'stop' accepts at most 16 strings"),
    (COMP, C(seed=2**63 - 1), "seed", "seed: must be an integer in [0, 2**63 - n), got 9223372036854775807"),
    (COMP, C(seed=2**63 - 2, n=2), "seed", "seed: must be an integer in [0, 2**63 - n), got 9223372036854775806"),
    (COMP, C(max_tokens=0), "max_tokens", "'max_tokens' must be at least 1, got 0"),
    (COMP, C(temperature=-1e-9), "temperature", "temperature: must be >= 0, got -1e-09"),
    (EMB, {"input": ["ok", " "]}, "input", "input[1]: must be a non-empty string"),
    (EMB, {"input": ["a"] * 513}, "input", "input: at most 512 texts per call, got 513"),
])
def test_bad_input_is_a_400_naming_the_field(http, path, body, param, message):
    status, err = post(http, path, body)
    assert status == 400 and err == {"message": message, "type": "invalid_request_error", "param": param, "code": None}


@pytest.mark.parametrize("path, body", [
    (COMP, C(n=16, best_of=16)), (COMP, C(top_k=2**31 - 1)), (COMP, C(top_k=-1)), (COMP, C(min_p=1)),
    (COMP, C(seed=2**63 - 2)), (COMP, C(seed=2**63 - 3, n=2)), (COMP, C(logprobs=5)), (COMP, C(stop=["s"] * 16)),
    (CHAT, H(logprobs=True, top_logprobs=20)), (CHAT, H(presence_penalty=-2, frequency_penalty=2)),
    (COMP, C(temperature=0, top_p=1, repetition_penalty=1e-9)),
    (CHAT, H(messages=[{"role": "user", "content": [{"type": "text", "text": "a", "extra": 1}], "name": "x"}])),
    (COMP, C(user=None, seed=None, stop=None, stream_options=None)),                 # null: the default
])
def test_edge_values_pass_validation(http, path, body):
    status, err = post(http, path, body)
    assert status == 503 and err["code"] == "model_loading", err                   # past parsing: no engine yet


def test_embeddings_model_other_than_ours_is_404(http):
    status, err = post(http, EMB, {"model": 5, "input": "x"})
    assert status == 404 and err["param"] == "model" and err["code"] == "model_not_found"
    assert err["message"] == "model 5 does not exist; embeddings come from 'all-MiniLM-L6-v2'"


def test_sampling_params_come_out_as_before():
    parsed = parse_completion(C(n=2, temperature=0.5, top_p=0.9, top_k=5, min_p=0.1, presence_penalty=0.5,
                                frequency_penalty=-0.5, repetition_penalty=1.1, seed=7, min_tokens=1, stop="x",
                                stop_token_ids=[3], ignore_eos=True, logprobs=2, skip_special_tokens=False,
                                include_stop_str_in_output=True, prompt=[[1, 2], [3]], echo=True, priority=-1))
    assert parsed.params == SamplingParams(n=2, temperature=0.5, top_p=0.9, top_k=5, min_p=0.1, presence_penalty=0.5,
                                           frequency_penalty=-0.5, repetition_penalty=1.1, seed=7, max_tokens=2,
                                           min_tokens=1, stop="x", stop_token_ids=[3], ignore_eos=True, logprobs=2,
                                           skip_special_tokens=False, include_stop_str_in_output=True)
    assert parsed.prompts == [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [3]}]
    assert (parsed.echo, parsed.priority, parsed.stream, parsed.include_usage) == (True, -1, False, False)
    assert parse_completion({"model": "m", "prompt": "p"}).params == SamplingParams(max_tokens=16)
    chat = parse_chat(H(max_tokens=None, max_completion_tokens=9, logprobs=True, stream=True,
                        stream_options={"include_usage": True},
                        messages=[{"role": "system", "content": [{"type": "text", "text": "a"},
                                                                 {"type": "text", "text": "b"}]}]))
    assert chat.params == SamplingParams(max_tokens=9, logprobs=0) and chat.top_logprobs == 0
    assert chat.prompts == [{"messages": [{"role": "system", "content": "ab"}]}] and chat.include_usage
    assert parse_chat(H(max_tokens=None)).params.max_tokens is None        # chat: the rest of the context
