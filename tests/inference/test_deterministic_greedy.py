"""Identical greedy requests give identical tokens on the default model (Qwen2.5-Coder-0.5B, run on
its GGUF codes) in bf16 on the CPU: alone, inside a batch of 8 different requests, after a
prefix-cache hit, and streamed or not over HTTP."""
from __future__ import annotations

import pytest

from inference import LLM, SamplingParams
from inference.models.gguf_cpu_linear import gguf_matmul_available
from tests.helpers.inference_server import running_server

MODEL = "qwen2.5-coder-0.5b"

QUESTION = [{"role": "user", "content": "What are the two colours of a traffic light besides green? Say why."}]
OTHERS = [[{"role": "user", "content": f"Give me fact number {i} about {topic}, in one paragraph."}]
          for i, topic in enumerate(["cats", "the moon", "Paris", "Python", "rain", "bread", "trains"])]
GREEDY = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    engine = LLM(MODEL, dtype="bfloat16", max_model_len=2048, kv_cache_memory_bytes=128 << 20)
    yield engine
    engine.shutdown()


def _tokens(outputs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


def test_same_tokens_alone_after_a_prefix_hit_and_in_batches(llm):
    alone = _tokens(llm.chat(QUESTION, GREEDY, use_tqdm=False))[0]
    assert len(alone) == 64
    after_hit = _tokens(llm.chat(QUESTION, GREEDY, use_tqdm=False))[0]       # its prompt blocks are cached now
    first_of_8 = _tokens(llm.chat([QUESTION] + OTHERS, GREEDY, use_tqdm=False))[0]
    last_of_8 = _tokens(llm.chat(OTHERS + [QUESTION], GREEDY, use_tqdm=False))[-1]
    assert after_hit == alone
    assert first_of_8 == alone
    assert last_of_8 == alone


def test_streamed_and_whole_greedy_replies_are_the_same_text():
    with running_server("--model", MODEL, "--dtype", "bfloat16", "--max-model-len", "1024") as server:
        client = server.client()
        whole = [client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=48, temperature=0)
                 .choices[0].message.content for _ in range(2)]
        stream = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=48, temperature=0,
                                                stream=True)
        streamed = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    assert whole[0] == whole[1] == streamed


def test_the_one_call_decode_stack_gives_the_layer_by_layer_tokens(llm):
    model = llm.engine.runner.model
    if not gguf_matmul_available():
        pytest.skip("no AVX-512 VNNI build of the GGUF kernels here")
    assert model.decode_stack is not None, "Qwen2 on its codes (biases, mixed types) must take the decode stack"
    batch = [QUESTION] + OTHERS[:3]
    stacked = _tokens(llm.chat(batch, GREEDY, use_tqdm=False))
    saved, model.decode_stack = model.decode_stack, None
    try:
        layer_by_layer = _tokens(llm.chat(batch, GREEDY, use_tqdm=False))
    finally:
        model.decode_stack = saved
    assert stacked == layer_by_layer


def test_every_isa_level_gives_the_same_greedy_tokens():
    """The same greedy request at each ISA level this CPU runs (INFERENCE_CPU_ISA forces the lower
    ones), each in its own process: the same tokens."""
    import json
    import os
    import subprocess
    import sys

    from inference.kernels.cpu_ops import supported_isa_levels
    script = ("import json; from inference import LLM, SamplingParams; from inference.kernels.cpu_ops import cpu_isa; "
              f"llm = LLM({MODEL!r}, max_model_len=1024, kv_cache_memory_bytes=64 << 20); "
              f"out = llm.chat([{QUESTION!r}, {OTHERS[0]!r}], SamplingParams(max_tokens=32, temperature=0), "
              "use_tqdm=False); print(json.dumps([cpu_isa(), [list(o.outputs[0].token_ids) for o in out]]))")
    results = {}
    for isa in supported_isa_levels():
        proc = subprocess.run([sys.executable, "-c", script], env={**os.environ, "INFERENCE_CPU_ISA": isa},
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        ran, tokens = json.loads(proc.stdout.strip().splitlines()[-1])
        assert ran == isa
        results[isa] = tokens
    assert results, "this CPU runs no ISA level of the kernels"
    first = next(iter(results.values()))
    assert all(t == first for t in results.values()), {k: v[0][:8] for k, v in results.items()}
