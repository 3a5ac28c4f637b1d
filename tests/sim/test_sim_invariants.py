"""Invariants of the rendered counters under random workloads and configurations."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvoffload.sim import Scenario, SimServer, Sizing, Workload
from kvoffload.sim.model import H200, QWEN3_0_6B

from sim_helpers import parse, total

MAX_LEN = 1024


@st.composite
def scenario(draw: st.DrawFn, reuse_heavy: bool = False) -> Scenario:
    """Any configuration; `reuse_heavy` draws a small GPU, a big CPU tier and few documents,
    so that most examples really load from the CPU tier."""
    block_size = 16
    tp = draw(st.sampled_from([1, 2, 4]))
    bpc = draw(st.sampled_from([1, 2, 4]))
    min_blocks = MAX_LEN // block_size + 1
    gpu_blocks = draw(st.integers(min_blocks, 120 if reuse_heavy else 400))
    chunk_bytes = QWEN3_0_6B.kv_bytes_per_token * block_size * bpc
    if reuse_heavy:
        chunks = draw(st.integers(300, 800))
        offloading = True
    else:
        chunks = draw(st.one_of(st.just(0), st.integers(1, 20), st.integers(50, 600)))
        offloading = draw(st.sampled_from([True, True, True, False]))
    workload = Workload(
        kind=draw(st.sampled_from(["documents", "sessions"])),
        rate_rps=draw(st.floats(1.0, 30.0)),
        arrival=draw(st.sampled_from(["poisson", "uniform"])),
        num_docs=draw(st.integers(1, 6 if reuse_heavy else 12)),
        doc_tokens=(draw(st.integers(1, 400)), draw(st.integers(400, 1200))),
        popularity=draw(st.sampled_from(["uniform", "zipf"])),
        zipf_alpha=draw(st.floats(0.3, 1.5)),
        question_tokens=(draw(st.integers(1, 20)), draw(st.integers(20, 100))),
        system_tokens=draw(st.sampled_from([0, 7, 16, 100])),
        unique_fraction=draw(st.sampled_from([0.0, 0.2] if reuse_heavy else [0.0, 0.2, 1.0])),
        reuses=draw(st.integers(0, 4)),
        reuse_gap_s=draw(st.floats(0.5, 20.0)),
    )
    return Scenario(
        name="random",
        duration_s=draw(st.floats(5.0, 40.0)),
        vllm_version="0.33",
        restart_at_s=draw(st.sampled_from([None] if reuse_heavy else [None, None, 3.0])),
        kv_cache_metrics=draw(st.booleans()),
        kv_cache_metrics_sample=0.2,
        model=QWEN3_0_6B,
        hardware=H200,
        tp=tp,
        dp=draw(st.integers(1, 2)),
        routing=draw(st.sampled_from(["round_robin", "hash"])),
        max_model_len=MAX_LEN,
        num_gpu_blocks=gpu_blocks,
        max_num_seqs=draw(st.sampled_from([1, 4, 256])),
        max_num_batched_tokens=draw(st.sampled_from([1024, 8192])),
        cpu_gib=(chunks * chunk_bytes / 2**30 + 1e-9) if offloading else None,
        eviction_policy=draw(st.sampled_from(["lru", "arc"])),
        store_threshold=draw(st.sampled_from([0, 0, 0, 2] if reuse_heavy else [0, 0, 2, 3])),
        blocks_per_chunk=bpc,
        workload=workload,
    )


def _check_body(sim: SimServer, s: Scenario, settled: bool) -> dict:
    _, smp = parse(sim.render())
    for (name, _), v in smp.items():
        assert v >= 0, name
    prompt = total(smp, "vllm:prompt_tokens_total")
    src = {
        k: total(smp, "vllm:prompt_tokens_by_source_total", source=k)
        for k in ("local_compute", "local_cache_hit", "external_kv_transfer")
    }
    assert sum(src.values()) == prompt
    assert total(smp, "vllm:prompt_tokens_cached_total") == (
        src["local_cache_hit"] + src["external_kv_transfer"]
    )
    hits = total(smp, "vllm:prefix_cache_hits_total")
    ext_hits = total(smp, "vllm:external_prefix_cache_hits_total")
    assert total(smp, "vllm:prompt_tokens_cached_by_source_total") == hits + ext_hits
    assert total(smp, "vllm:prompt_tokens_cached_by_source_total", source="host") == ext_hits
    queries = total(smp, "vllm:prefix_cache_queries_total")
    ext_q = total(smp, "vllm:external_prefix_cache_queries_total")
    assert ext_q == (queries - hits if s.offloading else 0)
    for gauge in ("vllm:kv_cache_usage_perc", "vllm:kv_offload_cpu_cache_usage_perc"):
        for (n, _), v in smp.items():
            if n == gauge:
                assert 0 <= v <= 1
    sz = Sizing.of(s)
    stored_chunks = sum(e.cpu.stored_chunks for e in sim.engines[0] if e.cpu is not None)
    if not sim.restarts:
        assert total(smp, "vllm:kv_offload_store_bytes_total") == stored_chunks * sz.chunk_bytes
        assert total(smp, "vllm:kv_offload_total_bytes_total", transfer_type="GPU_to_CPU") == (
            stored_chunks * sz.chunk_bytes
        )
    if settled:
        load_bytes = total(smp, "vllm:kv_offload_load_bytes_total")
        assert load_bytes == ext_hits * sz.bytes_per_token
        assert load_bytes == total(
            smp, "vllm:kv_offload_total_bytes_total", transfer_type="CPU_to_GPU"
        )
        # per-rank observations: tp per job, each bytes/tp
        assert total(smp, "vllm:kv_offload_load_size_sum") == load_bytes
    for eng in sim.engines[0]:
        if eng.cpu is not None:
            assert len(eng.cpu) <= eng.cpu.num_chunks
            assert 0 <= eng.cpu.num_pinned <= len(eng.cpu)
    return smp


def _run_and_check(s: Scenario, seed: int) -> None:
    sim = SimServer(s, seed=seed)
    prev: dict = {}
    t = 0.0
    while t < s.duration_s:
        t += s.duration_s / 4
        sim.advance_to(t)
        smp = _check_body(sim, s, settled=False)
        if not sim.restarts:  # counters only grow between scrapes of one process
            for key, v in prev.items():
                if key[0].endswith("_total") and key in smp:
                    assert smp[key] >= v, key
        prev = smp
    sim.run()
    _check_body(sim, s, settled=True)
    assert sim.finished
    gt = sim.ground_truth()
    assert gt["requests_total"] + gt["aborted_requests"] == len(sim._arrivals)
    assert gt["never_reloaded_bytes"] <= gt["stored_bytes"] + 0
    assert gt["loaded_tokens"] <= gt["gpu_missed_tokens"]


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario(), st.integers(0, 3))
def test_counter_invariants(s: Scenario, seed: int) -> None:
    _run_and_check(s, seed)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario(reuse_heavy=True), st.integers(0, 3))
def test_counter_invariants_with_reloads(s: Scenario, seed: int) -> None:
    _run_and_check(s, seed)


@settings(max_examples=15, deadline=None)
@given(scenario())
def test_deterministic(s: Scenario) -> None:
    a = SimServer(s, seed=1)
    b = SimServer(s, seed=1)
    a.advance_to(s.duration_s / 2)
    b.advance_to(s.duration_s / 2)
    assert a.render() == b.render()
