"""Our inference engine: paged KV cache, continuous batching, prefix caching, chunked prefill."""
from inference.config import EngineConfig
from inference.outputs import CompletionOutput, Logprob, RequestOutput, StreamDelta
from inference.sampling_params import SamplingParams


def __getattr__(name):
    # Heavy modules (torch, transformers) load on first use, not on `import inference`.
    if name == "LLM":
        from inference.llm import LLM
        return LLM
    if name == "OnlineEngine":
        from inference.online_engine import OnlineEngine
        return OnlineEngine
    raise AttributeError(name)


__all__ = ["LLM", "OnlineEngine", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob",
           "StreamDelta", "EngineConfig"]
