"""Shared fixtures. The real SmolLM2 model is converted once per machine (cached safetensors)."""
from __future__ import annotations

import os
import tempfile

# Must precede `import torch` (libgomp reads it when it loads): idle OpenMP threads sleep instead
# of spinning, so the engine thread's ops do not wait behind spinners for the 2 cores (Makefile).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

# Triton kernels run under its CPU interpreter when there is no GPU. This must be set before any
# module decorates a kernel with @triton.jit (the decorator reads it), hence first in conftest.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    from tests.helpers.triton_interpreter import skip_repatching
    skip_repatching()                   # helpers called from kernels: no second patch of tl (~40%)

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The product's default model is Qwen2.5-Coder-0.5B; tests where the model does not matter run the
# 135M SmolLM2 (seconds to load). Tests of the real model name it.
os.environ.setdefault("MODEL", "smollm2")
os.environ.setdefault("INFERENCE_MODEL_MODEL", "smollm2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# approved FAQ drafts are written here, never to the checkout's instance folder (app/store/faq_drafts.py)
os.environ.setdefault("FAQ_PATH", tempfile.mkdtemp(prefix="faq-"))
# Tests drive the APIs from one address far faster than a person: the shipped per-IP and per-key
# limits would turn later requests into 429s. tests/app/test_rate_limits.py sets its own limits.
# Apps built in a test have no serve-time warm-up thread: their first chat turn waits for the full
# pipeline's first build (as a started server's warm-up does) instead of answering degraded.
os.environ.setdefault("CHAT_BUILD_WAIT_S", "300")
# Apps built by tests keep their conversations in one SQLite file of this run, not in the
# checkout's instance folder (tests of the store itself give each test its own database).
# Each xdist worker gets its own (a worker inherits the controller's environment, file included).
_worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
if "DATABASE_URL" not in os.environ or os.environ.get("TESTS_DATABASE_OF", _worker) != _worker:
    import tempfile
    os.environ["DATABASE_URL"] = f"sqlite:///{tempfile.mkdtemp(prefix='conversations-')}/conversations.db"
    os.environ["TESTS_DATABASE_OF"] = _worker
os.environ.setdefault("SECRET_KEY", "tests-only-secret-key")     # else each app writes instance/secret_key
for _var in ("RATE_LIMIT_PER_IP", "RATE_LIMIT_PER_SITE_KEY", "RATE_LIMIT_PER_API_KEY"):
    os.environ.setdefault(_var, "100000 per second")


@pytest.fixture(scope="session")
def smollm2_dir():
    from inference.loader.model_loader import resolve_model_dir
    return resolve_model_dir("smollm2")


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    return model, tok


@pytest.fixture(scope="session")
def llm_fp32():
    """One fp32 SmolLM2 engine shared by tests that use default engine arguments."""
    from inference import LLM
    return LLM("smollm2", dtype="float32", max_model_len=1024, kv_cache_memory_bytes=256 << 20)


def assert_all_blocks_free(llm) -> None:
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks, f"{bm.num_blocks - bm.num_free_blocks} blocks leaked"
    assert not bm.req_to_blocks
    assert not llm.engine.scheduler.has_unfinished()
    assert not llm.engine.states


@pytest.fixture(scope="session")
def embedder():
    """The real all-MiniLM-L6-v2 from the offline wheel (loads in ~7 s, once per run)."""
    from inference.embeddings import SentenceEmbedder
    return SentenceEmbedder()


@pytest.fixture(scope="session")
def tiny_client(embedder):
    """An in-process inference client: the real engine on the tiny random model (fast, its text is
    noise) and the real sentence embedder."""
    from pipelines.inference_client import InProcessClient
    client = InProcessClient("random:tiny", dtype="float32", max_model_len=1024, kv_cache_memory_bytes=32 << 20)
    client._embedder = embedder
    _ = client.engine                   # loaded, as the web app's start-up warms it (health answers 200)
    yield client
    client.close()


@pytest.fixture(scope="session")
def qwen_client(embedder):
    """The default model, Qwen2.5-Coder-0.5B (Q4_K_M GGUF, ~6 s to load), in process: for tests
    whose assertion is about the text a real model writes."""
    from pipelines.inference_client import InProcessClient
    client = InProcessClient("qwen2.5-coder-0.5b", max_model_len=2048, kv_cache_memory_bytes=64 << 20)
    client._embedder = embedder
    _ = client.engine
    yield client
    client.close()


@pytest.fixture(scope="session")
def redis_server():
    """Redis on 127.0.0.1:6379: the machine's own, else one started here (redis-server)."""
    import shutil
    import subprocess
    import time

    import redis
    client = redis.Redis(host="127.0.0.1", port=6379)
    try:
        client.ping()
        yield "redis://127.0.0.1:6379"
        return
    except redis.ConnectionError:
        pass
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("Redis is not running on 127.0.0.1:6379 and redis-server is not installed")
    proc = subprocess.Popen([binary, "--port", "6379", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    yield "redis://127.0.0.1:6379"
    proc.terminate()


# Parallel runs (`pytest -n 2 --dist loadscope -m "not alone"`, what `make test` runs before the
# `alone` tests by themselves: the fault scenarios' recovery bounds stretch beside another worker)
# use the scopes below. Each file
# is a scope, so its module fixtures are built once and tests that count on earlier ones in the file
# (test_openapi's case counts) see them. Tests that share the machine's services by fixed name (Redis
# databases 11-15, the Celery broker, the PostgreSQL server a test stops), start real deployments, or
# time a server's shutdown form one scope: one worker runs them in turn, the other takes other files.
# (xdist's own `xdist_group` marks do not reach its scheduler under pytest 9: it renames node ids
# through an attribute pytest 9 no longer reads.)
SHARED_SERVICES = ("e2e/", "app/test_agent_auth.py", "app/test_chat_api.py", "app/test_completion_api.py",
                   "app/test_jobs.py", "app/test_kb_reindex.py", "app/test_live_events.py",
                   "app/test_rate_limits.py", "app/test_redis_restart.py", "app/test_worker.py",
                   "app/test_database_outage.py", "pipelines/test_completion.py", "pipelines/test_resilience.py",
                   "httpkit/test_graceful_shutdown.py")


def test_scope(nodeid: str) -> str:
    """The xdist work unit of a test: its file, or "shared-services"."""
    path = nodeid.split("::", 1)[0]
    rel = path.removeprefix("tests/")
    return "shared-services" if rel.startswith(SHARED_SERVICES) else path


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileOrSharedServices(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return test_scope(nodeid)
    return FileOrSharedServices(config, log)
