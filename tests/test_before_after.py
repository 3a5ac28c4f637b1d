"""The before/after A/B: one engine across a restart with and without a CPU tier."""

from __future__ import annotations

import lzma
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kvoffload.analysis.analyze import Settings, analyze_groups, window_from_recording
from kvoffload.analysis.beforeafter import before_after
from kvoffload.analysis.timeline import MAX_GROUPS, TierTimeline
from kvoffload.ingest.catalog import Extract
from kvoffload.sim import scenarios
from kvoffload.sim.write_recording import record_restarts

REAL = Path(__file__).parent / "fixtures" / "vllm-0.26-h200-before-after" / "rec.om.xz"


def _analyzed(path: Path):
    window = window_from_recording(str(path))[0]
    (group,) = analyze_groups(window, Settings())
    return group


def test_real_vllm_restarted_with_a_tier_is_measured_before_and_after(tmp_path: Path) -> None:
    # Real vLLM 0.26.0 on an H200 (bench/real/vllm_restart_check.py): Qwen3-0.6B eager, 8
    # clients, prefill only; 90 s without a tier, then restarted with 4 GiB. The clients
    # measured 70.4 ms then 106.8 ms mean TTFT: the tier cost +36 ms.
    rec = tmp_path / "rec.om"
    rec.write_bytes(lzma.decompress(REAL.read_bytes()))
    group = _analyzed(rec)
    ab = group.ttft.before_after
    assert ab is not None and (ab.before, ab.after, ab.matched) == ("off", "4.0 GiB", True)
    low, high = ab.effect.low, ab.effect.high
    assert low <= 0.0364 <= high and low > 0  # the clients' truth inside, and a clear cost
    rec_ = group.recommendation
    assert rec_.action == "disable" and rec_.decided_by == "before_after"
    assert rec_.ttft_change_basis == "before_after"
    assert "before and after its tier changed" in rec_.reasons[0]


@pytest.mark.slow
def test_a_simulated_restart_into_a_tier_is_detected_and_judged(tmp_path: Path) -> None:
    off = scenarios.get("pressure-without-offloading")
    on = replace(off, name="pressure-with-offloading", cpu_gib=12.0)
    path = tmp_path / "restart.om"
    record_restarts([off, on], str(path), duration_s=1800, interval_s=15)
    group = _analyzed(path)
    ab = group.ttft.before_after
    assert ab is not None and (ab.before, ab.after) == ("off", "12.0 GiB")
    assert ab.requests[0] >= 200 and ab.requests[1] >= 200
    # the simulated tier serves most missed prefixes: a saving, measured
    assert ab.effect.seconds < 0
    assert group.to_json()["ttft"]["before_after"]["seconds"] == ab.effect.seconds  # the JSON
    assert group.recommendation.decided_by in ("before_after", "estimate")
    assert any("before and after its tier changed" in r for r in group.recommendation.reasons)


@pytest.mark.slow
def test_a_restart_at_another_load_is_not_compared(tmp_path: Path) -> None:
    off = scenarios.get("pressure-without-offloading")
    # after the restart the prompts are twice as long: not the same load
    on = replace(off, cpu_gib=12.0, workload=replace(off.workload, doc_tokens=(3000, 5000)))
    path = tmp_path / "restart.om"
    record_restarts([off, on], str(path), duration_s=1800, interval_s=15)
    group = _analyzed(path)
    ab = group.ttft.before_after
    assert ab is not None and not ab.matched and ab.mismatch
    assert group.recommendation.decided_by != "before_after"
    assert any("the load differed" in r for r in group.recommendation.reasons)


def test_analyze_prints_the_before_after(tmp_path: Path) -> None:
    rec = tmp_path / "rec.om"
    rec.write_bytes(lzma.decompress(REAL.read_bytes()))
    r = subprocess.run(
        [sys.executable, "-m", "kvoffload", "analyze", str(rec)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "before and after its tier changed" in r.stdout


def _scrape(t: float, tier: str, ttft_sum: float, count: float) -> Extract:
    key = ("127.0.0.1:8000", "m", "0")
    ex = Extract(t)
    ex.counters[("ttft_sum", *key)] = ttft_sum
    ex.counters[("ttft_count", *key)] = count
    ex.cache_config[("127.0.0.1:8000", "0")] = {"kv_offloading_size": tier}
    return ex


def test_a_hostile_target_cannot_crash_or_grow_it() -> None:
    # a tier label of "inf" and counters that overflow their sums: no figure, no crash
    timeline = TierTimeline()
    for k in range(200):
        timeline.observe(_scrape(k, "None", k * 1e306, k * 10.0))
    for k in range(200, 400):
        timeline.observe(_scrape(k, "inf", (k - 200) * 1e306, (k - 200) * 10.0))
    ab = before_after(timeline.segments(("127.0.0.1:8000", "m")))
    assert ab is None or ab.tier_gib is None
    # a target naming a new model every scrape: the groups kept stay bounded
    timeline = TierTimeline()
    for k in range(3 * MAX_GROUPS):
        ex = Extract(float(k))
        ex.counters[("ttft_count", "i", f"model-{k}", "0")] = 1.0
        timeline.observe(ex)
    assert len(timeline._segments) == MAX_GROUPS
