"""Engine statistics: per-step counts, TTFT / inter-token latencies, finished requests (aborts too)."""
from __future__ import annotations

from inference import LLM, SamplingParams


def test_stats_over_a_workload():
    llm = LLM("random:tiny", dtype="float32", max_model_len=256, kv_cache_memory_bytes=8 << 20, block_size=4,
              max_num_batched_tokens=16)
    eng = llm.engine
    shared = list(range(3, 23))
    reqs = [eng.validate({"prompt_token_ids": shared + [30 + i]}, SamplingParams(max_tokens=5, ignore_eos=True))
            for i in range(3)]
    doomed = eng.validate({"prompt_token_ids": list(range(40, 50))}, SamplingParams(max_tokens=50, ignore_eos=True))
    for r in reqs + [doomed]:
        eng.add_request(r)
    steps = []
    while eng.has_unfinished():
        eng.step()
        steps.append(eng.last_stats)
        if len(steps) == 3:
            eng.abort_request(doomed.request_id)
            num_doomed = len(eng.retire_aborted(doomed.request_id).samples[0].token_ids)
    its = [s.iteration for s in steps]
    assert all(i.num_scheduled_tokens <= 16 for i in its)
    assert sum(i.num_prompt_tokens for i in its) == 3 * 21 + 10 - steps[-1].scheduler.prefix_cache_hits
    assert sum(i.num_generation_tokens for i in its) == 3 * 5 + num_doomed
    assert len([t for i in its for t in i.time_to_first_tokens]) == 3 + (num_doomed > 0)
    assert len([t for i in its for t in i.inter_token_latencies]) == 3 * 4 + max(0, num_doomed - 1)
    finished = {f.request_id: f for i in its for f in i.finished}
    assert set(finished) == {r.request_id for r in reqs + [doomed]}
    assert finished[doomed.request_id].finish_reason == "abort"
    assert all(finished[r.request_id].finish_reason == "length" and finished[r.request_id].num_generation_tokens == 5
               for r in reqs)
    assert all(f.e2e_latency >= f.queue_time >= 0 for f in finished.values())
    last = steps[-1].scheduler
    assert last.num_running == 0 and last.num_waiting == 0 and last.kv_cache_usage == 0.0
    assert last.prefix_cache_queries == 3 * 21 + 10 and last.prefix_cache_hits % 4 == 0

