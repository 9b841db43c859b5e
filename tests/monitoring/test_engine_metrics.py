"""EngineMetrics: synthetic EngineStats in, exact sample values out of the exposition text."""
from __future__ import annotations

import subprocess
import sys
import types

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inference.core.scheduler import SchedulerStats
from inference.core.stats import EngineStats, FinishedRequestStats, IterationStats
from monitoring.engine_metrics import EngineMetrics
from tests.helpers.paths import REPO_ROOT

MODEL = "tiny-model"


def make_stats(running=0, waiting=0, usage=0.0, queries=0, hits=0, preemptions=0, prompt=0, gen=0,
               ttft=(), itl=(), finished=()) -> EngineStats:
    return EngineStats(SchedulerStats(running, waiting, usage, queries, hits, preemptions),
                       IterationStats(num_prompt_tokens=prompt, num_generation_tokens=gen,
                                      time_to_first_tokens=list(ttft), inter_token_latencies=list(itl),
                                      finished=list(finished)))


def done(reason="stop", prompt=10, gen=5, e2e=1.0, queue=0.1, ttft=0.2) -> FinishedRequestStats:
    return FinishedRequestStats(f"req-{reason}-{prompt}", reason, prompt, gen, e2e, queue, ttft)


def samples(metrics: EngineMetrics) -> dict:
    """(sample name, sorted label items) -> value, parsed from what a scrape would return."""
    body, content_type = metrics.render()
    assert content_type == prometheus_client.CONTENT_TYPE_LATEST
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


def value(metrics: EngineMetrics, name: str, **labels) -> float:
    key = (name, tuple(sorted({"model_name": MODEL, **labels}.items())))
    found = samples(metrics)
    assert key in found, f"{key} missing"
    return found[key]


def test_gauges_follow_the_latest_stats():
    m = EngineMetrics(MODEL)
    m.observe(make_stats(running=3, waiting=7, usage=0.25))
    m.observe(make_stats(running=5, waiting=1, usage=0.75))
    assert value(m, "inference:num_requests_running") == 5
    assert value(m, "inference:num_requests_waiting") == 1
    assert value(m, "inference:kv_cache_usage_perc") == 0.75
    m.observe(make_stats())
    assert value(m, "inference:num_requests_running") == 0 and value(m, "inference:kv_cache_usage_perc") == 0


def test_cumulative_totals_advance_by_deltas_and_never_go_back():
    m = EngineMetrics(MODEL)
    for q, h, p in [(10, 4, 0), (25, 8, 1), (25, 8, 1), (30, 12, 3)]:
        m.observe(make_stats(queries=q, hits=h, preemptions=p))
    assert value(m, "inference:prefix_cache_queries_total") == 30
    assert value(m, "inference:prefix_cache_hits_total") == 12
    assert value(m, "inference:num_preemptions_total") == 3
    # the source restarted from zero (a new engine): its new total is all new
    m.observe(make_stats(queries=4, hits=0, preemptions=1))
    assert value(m, "inference:prefix_cache_queries_total") == 34
    assert value(m, "inference:prefix_cache_hits_total") == 12
    assert value(m, "inference:num_preemptions_total") == 4
    m.observe(make_stats(queries=6, hits=2, preemptions=1))
    assert value(m, "inference:prefix_cache_queries_total") == 36
    assert value(m, "inference:prefix_cache_hits_total") == 14


def test_per_step_tokens_add_up():
    m = EngineMetrics(MODEL)
    for prompt, gen in [(16, 0), (9, 3), (0, 4), (0, 0)]:
        m.observe(make_stats(prompt=prompt, gen=gen))
    assert value(m, "inference:prompt_tokens_total") == 25
    assert value(m, "inference:generation_tokens_total") == 7


def test_latency_histograms_count_and_sum():
    m = EngineMetrics(MODEL)
    m.observe(make_stats(ttft=[0.03, 0.5], itl=[0.02]))
    m.observe(make_stats(ttft=[3.0], itl=[0.02, 0.2, 0.004]))
    name = "inference:time_to_first_token_seconds"
    assert value(m, name + "_count") == 3
    assert value(m, name + "_sum") == pytest.approx(3.53)
    assert value(m, name + "_bucket", le="0.04") == 1
    assert value(m, name + "_bucket", le="1.0") == 2
    assert value(m, name + "_bucket", le="+Inf") == 3
    name = "inference:inter_token_latency_seconds"
    assert value(m, name + "_count") == 4
    assert value(m, name + "_sum") == pytest.approx(0.244)
    assert value(m, name + "_bucket", le="0.005") == 1
    assert value(m, name + "_bucket", le="0.025") == 3


def test_finished_requests_are_labelled_and_measured():
    m = EngineMetrics(MODEL)
    m.observe(make_stats(finished=[done("stop", 10, 5, e2e=1.2, queue=0.05),
                                   done("length", 100, 64, e2e=4.0, queue=0.5)]))
    m.observe(make_stats(finished=[done("stop", 3, 1, e2e=0.2, queue=0.0, ttft=None),
                                   done("abort", 7, 0, e2e=9.0, queue=9.0, ttft=None)]))
    success = "inference:request_success_total"
    assert value(m, success, finished_reason="stop") == 2
    assert value(m, success, finished_reason="length") == 1
    assert value(m, success, finished_reason="abort") == 1
    assert value(m, "inference:e2e_request_latency_seconds_count") == 4
    assert value(m, "inference:e2e_request_latency_seconds_sum") == pytest.approx(14.4)
    assert value(m, "inference:request_queue_time_seconds_sum") == pytest.approx(9.55)
    assert value(m, "inference:request_queue_time_seconds_bucket", le="0.1") == 2
    assert value(m, "inference:request_prompt_tokens_sum") == 120
    assert value(m, "inference:request_prompt_tokens_bucket", le="10.0") == 3
    assert value(m, "inference:request_generation_tokens_sum") == 70
    assert value(m, "inference:request_generation_tokens_bucket", le="1.0") == 2
    # TTFT comes from the per-step list only, so finished requests do not count twice
    assert value(m, "inference:time_to_first_token_seconds_count") == 0


def test_instances_do_not_share_state_or_touch_the_default_registry():
    a, b = EngineMetrics(MODEL), EngineMetrics(MODEL)
    a.observe(make_stats(running=2, queries=10, prompt=8, finished=[done("stop")]))
    assert value(a, "inference:num_requests_running") == 2
    assert value(b, "inference:num_requests_running") == 0
    assert value(b, "inference:prefix_cache_queries_total") == 0
    assert value(b, "inference:request_success_total", finished_reason="stop") == 0
    b.observe(make_stats(queries=10))   # b's delta starts from its own zero, not a's last total
    assert value(b, "inference:prefix_cache_queries_total") == 10
    assert value(a, "inference:prefix_cache_queries_total") == 10
    labels = {"model_name": MODEL}
    assert prometheus_client.REGISTRY.get_sample_value("inference:num_requests_running", labels) is None


def test_given_registry_and_prefix_are_used():
    registry = prometheus_client.CollectorRegistry()
    m = EngineMetrics("other", registry=registry, prefix="engine2")
    m.observe(make_stats(waiting=4))
    assert m.registry is registry
    assert registry.get_sample_value("engine2:num_requests_waiting", {"model_name": "other"}) == 4
    with pytest.raises(ValueError, match="Duplicated"):
        EngineMetrics("other", registry=registry, prefix="engine2")


def test_process_memory_and_model_label_on_every_sample():
    m = EngineMetrics(MODEL)
    m.observe(make_stats(running=1, finished=[done("length")]))
    found = samples(m)
    assert value(m, "inference:process_resident_memory_bytes") > 0
    assert value(m, "inference:process_virtual_memory_bytes") >= value(m, "inference:process_resident_memory_bytes")
    assert all(dict(labels).get("model_name") == MODEL for _, labels in found), "a sample lacks model_name"


def _fake_torch(initialized: bool) -> types.ModuleType:
    cuda = types.SimpleNamespace(
        is_available=lambda: True, is_initialized=lambda: initialized, device_count=lambda: 2,
        memory_allocated=lambda i: [100, 1000][i], memory_reserved=lambda i: [150, 4000][i],
        get_device_properties=lambda i: types.SimpleNamespace(total_memory=[10_000, 20_000][i]))
    torch = types.ModuleType("torch")
    torch.cuda = cuda
    return torch


def test_gpu_memory_per_device_read_at_scrape_time(monkeypatch):
    m = EngineMetrics(MODEL)
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(initialized=True))
    expected = {"used": (100, 1000), "reserved": (150, 4000), "total": (10_000, 20_000),
                "fragmentation": (50, 3000)}
    for kind, per_device in expected.items():
        for device, want in enumerate(per_device):
            assert value(m, f"inference:gpu_memory_{kind}_bytes", device=str(device)) == want, kind
    # CUDA never initialised in this process (a web worker that merely imported torch): no GPU series
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(initialized=False))
    assert not [k for k in samples(m) if k[0].startswith("inference:gpu_")]
    monkeypatch.delitem(sys.modules, "torch")
    assert not [k for k in samples(m) if k[0].startswith("inference:gpu_")]


def test_import_pulls_in_no_torch_flask_redis_or_celery():
    code = ("import sys, monitoring.engine_metrics as em; em.EngineMetrics('x').render(); "
            "print(sorted(m for m in ('torch', 'flask', 'redis', 'celery') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
