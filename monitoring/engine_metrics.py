"""Prometheus exporter for the engine's stats dataclasses (inference/core/stats.py).

The engine emits plain `EngineStats` each step; `EngineMetrics.observe` turns them into metrics
named like vLLM's (`vllm:num_requests_running` -> `inference:num_requests_running`). Process and
GPU memory are read at scrape time by a custom collector, not on every step.

Imports only prometheus_client and psutil: the web tier loads this without torch, Flask stays out
of it, and torch is only looked up in `sys.modules` (used if the process already loaded it).
"""
from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import psutil
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from inference.core.stats import EngineStats

# Buckets follow vLLM's, with a few sub-10 ms steps added for a fast decode loop.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0,
                           20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
# 1-2-5 series up to 200k tokens (vLLM builds the same series up to max_model_len).
TOKEN_BUCKETS = tuple(float(m * 10 ** e) for e in range(6) for m in (1, 2, 5))[:-1]
FINISH_REASONS = ("stop", "length", "abort")   # pre-created so dashboards see zeros, not gaps


class _MemoryCollector:
    """Process RSS / virtual memory always; per-device CUDA allocator memory when this process
    already imported torch and initialised CUDA (never initialises it: a context costs memory)."""

    def __init__(self, prefix: str, model_name: str):
        self.prefix, self.model_name = prefix, model_name

    def _family(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
        return GaugeMetricFamily(f"{self.prefix}:{name}", doc, labels=("model_name", *labels))

    def _families(self) -> dict[str, GaugeMetricFamily]:
        dev = ("device",)
        return {
            "rss": self._family("process_resident_memory_bytes", "Resident memory of this process."),
            "vms": self._family("process_virtual_memory_bytes", "Virtual memory of this process."),
            "used": self._family("gpu_memory_used_bytes",
                                 "GPU bytes held by live tensors (torch.cuda.memory_allocated).", dev),
            "reserved": self._family("gpu_memory_reserved_bytes",
                                     "GPU bytes reserved by the caching allocator.", dev),
            "total": self._family("gpu_memory_total_bytes", "Total memory of the GPU.", dev),
            "frag": self._family("gpu_memory_fragmentation_bytes",
                                 "Reserved but unallocated GPU bytes (reserved - allocated).", dev),
        }

    def describe(self) -> Iterable[Metric]:
        return list(self._families().values())

    def collect(self) -> Iterable[Metric]:
        fams = self._families()
        mem = psutil.Process().memory_info()
        fams["rss"].add_metric([self.model_name], mem.rss)
        fams["vms"].add_metric([self.model_name], mem.vms)
        out = [fams["rss"], fams["vms"]]
        if self._collect_gpu(fams):
            out += [fams["used"], fams["reserved"], fams["total"], fams["frag"]]
        return out

    def _collect_gpu(self, fams: dict[str, GaugeMetricFamily]) -> bool:
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        try:
            if cuda is None or not cuda.is_available() or not cuda.is_initialized():
                return False
            for i in range(cuda.device_count()):
                labels = [self.model_name, str(i)]
                allocated, reserved = cuda.memory_allocated(i), cuda.memory_reserved(i)
                fams["used"].add_metric(labels, allocated)
                fams["reserved"].add_metric(labels, reserved)
                fams["total"].add_metric(labels, cuda.get_device_properties(i).total_memory)
                fams["frag"].add_metric(labels, reserved - allocated)
        except RuntimeError:    # a broken CUDA context must not fail the whole scrape
            return False
        return True


class _ExpertLoadCollector:
    """Tokens routed to each expert of each mixture-of-experts layer, read at scrape time from the
    model's cumulative counters (a step never waits on the device for them)."""

    def __init__(self, source: Callable[[], dict[int, list[int]]], prefix: str, model_name: str):
        self.source, self.name, self.model_name = source, f"{prefix}:moe_expert_tokens", model_name

    def describe(self) -> Iterable[Metric]:
        return [CounterMetricFamily(self.name, "Tokens routed to each expert (imbalance: compare experts "
                                               "of one layer).", labels=("model_name", "layer", "expert"))]

    def collect(self) -> Iterable[Metric]:
        fam = CounterMetricFamily(self.name, "Tokens routed to each expert (imbalance: compare experts "
                                             "of one layer).", labels=("model_name", "layer", "expert"))
        for layer, counts in self.source().items():
            for expert, n in enumerate(counts):
                fam.add_metric([self.model_name, str(layer), str(expert)], n)
        return [fam]


class _TierMetrics:
    """The host / disk KV tiers (inference/core/kv_tiers.py): per tier usage, prefix-hit tokens found
    there, bytes copied in (from the tier above) and out (back up), of the bytes in those written
    behind (ahead of the eviction), entries evicted."""

    def __init__(self, registry: CollectorRegistry, prefix: str, model_name: str):
        self.model_name, labels = model_name, ["model_name", "tier"]
        self.usage = Gauge(f"{prefix}:kv_tier_usage", "Fraction of a KV tier's slots holding a block.",
                           labels, registry=registry)
        self.hits = Counter(f"{prefix}:kv_tier_hits", "Prefix-hit tokens found in a KV tier (copied up, "
                                                      "not recomputed).", labels, registry=registry)
        self.bytes = Counter(f"{prefix}:kv_tier_bytes", "Bytes copied into (in) or out of (out) a KV tier.",
                             [*labels, "direction"], registry=registry)
        self.evictions = Counter(f"{prefix}:kv_tier_evictions", "Blocks a full KV tier dropped or moved down.",
                                 labels, registry=registry)
        self.written_behind = Counter(f"{prefix}:kv_tier_write_behind_bytes",
                                      "Of the bytes copied into a KV tier, those copied ahead of the device "
                                      "block's eviction (write-behind).", labels, registry=registry)

    def observe(self, stats, advance) -> None:
        m = self.model_name
        for t in stats.tiers:
            self.usage.labels(m, t.tier).set(t.usage)
            advance(f"kv_tier_hits:{t.tier}", t.hit_tokens, self.hits.labels(m, t.tier))
            advance(f"kv_tier_bytes_in:{t.tier}", t.bytes_in, self.bytes.labels(m, t.tier, "in"))
            advance(f"kv_tier_bytes_out:{t.tier}", t.bytes_out, self.bytes.labels(m, t.tier, "out"))
            advance(f"kv_tier_evictions:{t.tier}", t.num_evictions, self.evictions.labels(m, t.tier))
            advance(f"kv_tier_write_behind:{t.tier}", t.bytes_written_behind, self.written_behind.labels(m, t.tier))


class EngineMetrics:
    """Engine stats -> Prometheus metrics, in a registry of its own (several engines or tests may
    live in one process). Call `observe` once per engine step, `render` on each scrape."""

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None,
                 prefix: str = "inference"):
        self.model_name = model_name
        self.registry = registry if registry is not None else CollectorRegistry()
        self._lock = threading.Lock()
        self._last: dict[str, int] = {}     # cumulative stat name -> value at the last observe
        r, m, p = self.registry, model_name, prefix

        def gauge(name, doc):
            return Gauge(f"{p}:{name}", doc, ["model_name"], registry=r).labels(m)

        def counter(name, doc):
            return Counter(f"{p}:{name}", doc, ["model_name"], registry=r).labels(m)

        def histogram(name, doc, buckets):
            return Histogram(f"{p}:{name}", doc, ["model_name"], registry=r, buckets=buckets).labels(m)

        self.ready = gauge("ready", "1 when the engine is loaded and serving, else 0.")
        self.num_requests_running = gauge("num_requests_running", "Requests in the running batch.")
        self.num_requests_waiting = gauge("num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_cache_usage = gauge("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).")
        self.prefix_cache_queries = counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_cache_hits = counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.num_preemptions = counter("num_preemptions", "Requests preempted (recomputed later).")
        self.prompt_tokens = counter("prompt_tokens", "Prefill tokens computed.")
        self.generation_tokens = counter("generation_tokens", "Tokens generated.")
        self._request_success = Counter(f"{p}:request_success", "Finished requests, by finish reason.",
                                        ["model_name", "finished_reason"], registry=r)
        for reason in FINISH_REASONS:
            self._request_success.labels(m, reason)
        self.time_to_first_token = histogram("time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.inter_token_latency = histogram("inter_token_latency_seconds", "Time between tokens.", ITL_BUCKETS)
        self.e2e_request_latency = histogram("e2e_request_latency_seconds", "Arrival to finish.",
                                             REQUEST_LATENCY_BUCKETS)
        self.request_queue_time = histogram("request_queue_time_seconds", "Time waiting before first schedule.",
                                            REQUEST_LATENCY_BUCKETS)
        self.request_prompt_tokens = histogram("request_prompt_tokens", "Prompt length of finished requests.",
                                               TOKEN_BUCKETS)
        self.request_generation_tokens = histogram("request_generation_tokens",
                                                   "Generated tokens of finished requests.", TOKEN_BUCKETS)
        self._tiers = _TierMetrics(r, p, m)
        self._cpu_kernels = Gauge(f"{p}:cpu_kernels_info", "1 for the ISA level the engine's CPU kernels run at "
                                  "(avx512_vnni, avx2, none), set once the model is loaded.",
                                  ["model_name", "isa"], registry=r)
        # speculative decoding (vLLM's spec_decode set); stay at zero without it
        self.spec_decode_num_drafts = counter("spec_decode_num_drafts", "Steps in which a request carried drafts.")
        self.spec_decode_num_draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens proposed.")
        self.spec_decode_num_accepted_tokens = counter("spec_decode_num_accepted_tokens",
                                                       "Draft tokens the target accepted.")
        self._spec_per_pos = Counter(f"{p}:spec_decode_num_accepted_tokens_per_pos",
                                     "Draft tokens accepted, by their position in the draft.",
                                     ["model_name", "position"], registry=r)
        r.register(_MemoryCollector(p, m))

    def set_cpu_isa(self, isa: str) -> None:
        """The CPU kernels' ISA level (inference/kernels/cpu_ops.py), as an info-style gauge."""
        self._cpu_kernels.labels(self.model_name, isa).set(1)

    def observe(self, stats: EngineStats) -> None:
        """Apply one engine step's stats: gauges take the latest values, cumulative scheduler totals
        advance their counters by the delta since the last call, per-step values are added."""
        sched, it = stats.scheduler, stats.iteration
        with self._lock:
            self.num_requests_running.set(sched.num_running)
            self.num_requests_waiting.set(sched.num_waiting)
            self.kv_cache_usage.set(sched.kv_cache_usage)
            self._advance("prefix_cache_queries", sched.prefix_cache_queries, self.prefix_cache_queries)
            self._advance("prefix_cache_hits", sched.prefix_cache_hits, self.prefix_cache_hits)
            self._advance("num_preemptions", sched.num_preemptions, self.num_preemptions)
            if getattr(sched, "kv_tiers", None) is not None:
                self._tiers.observe(sched.kv_tiers, self._advance)
            if stats.spec_decode is not None:
                self._observe_spec(stats.spec_decode)
            self.prompt_tokens.inc(max(0, it.num_prompt_tokens))
            self.generation_tokens.inc(max(0, it.num_generation_tokens))
            for t in it.time_to_first_tokens:
                self.time_to_first_token.observe(t)
            for t in it.inter_token_latencies:
                self.inter_token_latency.observe(t)
            for f in it.finished:
                self._request_success.labels(self.model_name, f.finish_reason).inc()
                self.e2e_request_latency.observe(f.e2e_latency)
                self.request_queue_time.observe(f.queue_time)
                self.request_prompt_tokens.observe(f.num_prompt_tokens)
                self.request_generation_tokens.observe(f.num_generation_tokens)

    def _observe_spec(self, spec) -> None:
        self._advance("spec_decode_num_drafts", spec.num_drafts, self.spec_decode_num_drafts)
        self._advance("spec_decode_num_draft_tokens", spec.num_draft_tokens, self.spec_decode_num_draft_tokens)
        self._advance("spec_decode_num_accepted_tokens", spec.num_accepted_tokens,
                      self.spec_decode_num_accepted_tokens)
        for pos, n in enumerate(spec.accepted_per_position):
            self._advance(f"spec_decode_per_pos_{pos}", n, self._spec_per_pos.labels(self.model_name, str(pos)))

    def _advance(self, key: str, total: int, counter) -> None:
        # A total below the last one means its source restarted from zero (a new engine behind
        # the same exporter): everything it counted since then is new.
        last = self._last.get(key, 0)
        counter.inc(total - last if total >= last else total)
        self._last[key] = total

    def watch_expert_load(self, source: Callable[[], dict[int, list[int]]], prefix: str = "inference") -> None:
        """Export `source()` (layer -> cumulative tokens per expert) as inference:moe_expert_tokens_total."""
        self.registry.register(_ExpertLoadCollector(source, prefix, self.model_name))

    def render(self, ready: bool | None = None) -> tuple[bytes, str]:
        """The exposition text of this registry and its HTTP Content-Type; ready: the engine's
        readiness (left as it was when None)."""
        if ready is not None:
            self.ready.set(1 if ready else 0)
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
