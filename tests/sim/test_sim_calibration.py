"""The laptop scenario reproduces the seed article's measurement within 10%."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest

from kvoffload.sim import SimServer, Sizing, scenarios

TOL = 0.10
BATCHES = 5


def _run(name: str) -> SimServer:
    s = scenarios.get(name)
    s = replace(s, workload=replace(s.workload, num_batches=BATCHES))
    sim = SimServer(s, seed=0)
    sim.run()
    return sim


def _median(sim: SimServer, label: str, field: str = "ttft_s") -> float:
    return statistics.median(r[field] for r in sim.records if r["label"] == label)


@pytest.fixture(scope="module")
def on() -> SimServer:
    return _run("laptop-eviction")


@pytest.fixture(scope="module")
def off() -> SimServer:
    return _run("laptop-eviction-nooffload")


def test_shapes() -> None:
    sz = Sizing.of(scenarios.get("laptop-eviction"))
    assert sz.bytes_per_token == 114_688
    assert sz.num_gpu_blocks == 146
    assert sz.kv_cache_size_tokens == 2336
    assert sz.cpu_num_chunks == 292


def test_ttft(on: SimServer, off: SimServer) -> None:
    assert _median(on, "A-cold") == pytest.approx(0.077, rel=TOL)
    assert _median(on, "A-hit") == pytest.approx(0.014, rel=TOL)
    assert _median(on, "A-resent") == pytest.approx(0.035, rel=TOL)
    assert _median(off, "A-resent") == pytest.approx(0.077, rel=TOL)
    assert _median(off, "A-cold") == pytest.approx(0.077, rel=TOL)


def test_reload(on: SimServer) -> None:
    gt = on.ground_truth()
    resent = [r for r in on.records if r["label"] == "A-resent"]
    assert len(resent) == BATCHES
    # 93 full blocks of A come back from the CPU tier, the 9-token tail is recomputed
    assert all(r["cpu_hit_tokens"] == 1488 and r["computed_tokens"] == 9 for r in resent)
    assert gt["loaded_bytes"] == BATCHES * 170_655_744
    per_reload_s = gt["models"][0]["load_time_s"] / BATCHES
    assert per_reload_s == pytest.approx(0.0135, rel=TOL)
    assert 170_655_744 / per_reload_s / 1e9 == pytest.approx(12.6, rel=TOL)
    # the load waits in queue time (copy + one engine step), not in prefill time
    assert _median(on, "A-resent", "queue_s") == pytest.approx(0.0135 + 0.0074, rel=TOL)
    assert _median(on, "A-resent", "prefill_s") == pytest.approx(_median(on, "A-hit", "prefill_s"))


def test_recompute(on: SimServer) -> None:
    recompute_s = _median(on, "A-cold") - _median(on, "A-hit")
    assert recompute_s == pytest.approx(0.063, rel=TOL)
    assert 1488 / recompute_s == pytest.approx(23_500, rel=TOL)


def test_stores(on: SimServer) -> None:
    gt = on.ground_truth()
    # every batch stores A, B and C once: 93 + 99 + 99 blocks of 1,835,008 B
    assert gt["stored_bytes"] == BATCHES * 291 * 1_835_008
    assert gt["true_offload_hit_ratio"] == pytest.approx(7440 / 30_945)
