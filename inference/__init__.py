"""Our inference engine: paged KV cache, continuous batching, prefix caching, chunked prefill."""
import os

# torch's OpenMP threads (its ops beside our kernels' spin pool, and the embedder's) must sleep when
# idle, not spin against the pool: on 2 cores spinning OpenMP workers doubled the first-token time
# of an IDE completion in the web app. libgomp reads this once, when torch loads it, so it is set
# on `import inference`, before torch, unless the environment already says otherwise.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from inference.config import EngineConfig  # noqa: E402
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
