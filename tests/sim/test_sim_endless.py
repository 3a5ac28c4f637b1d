"""A simulator that serves until stopped: the workload goes on past the scenario's length, on
a clock real scrapers accept (tests/sim/test_sim_prometheus.py has the real Prometheus)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kvoffload.ingest.parse import parse_text
from kvoffload.sim import SimServer, scenarios
from kvoffload.sim import simulator as simulator_mod
from kvoffload.sim.server import make_app
from kvoffload.sim.workload import Workload, generate

from helpers import until


def _totals(sim: SimServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (n, tuple(sorted(lb.items()))): v
        for n, lb, v, _ in parse_text(sim.render().decode()).samples
        if n.endswith("_total")
    }


@pytest.mark.slow
def test_the_first_period_is_the_library_run_and_traffic_goes_on() -> None:
    sc = scenarios.get("laptop-eviction")
    lib = SimServer(sc)
    lib.run()
    sim = SimServer(sc, endless=True)
    sim.advance_to(sc.duration_s)
    # period 0 is exactly the scenario (same requests, same answers)
    assert list(sim.records)[: len(lib.records) - 1] == list(lib.records)[: len(lib.records) - 1]
    before = _totals(sim)
    per_period = []
    for k in range(2, 5):
        sim.advance_to(k * sc.duration_s)
        after = _totals(sim)
        assert all(after[key] >= v for key, v in before.items())  # counters never go back
        per_period.append(
            sum(v for (n, _), v in after.items() if n == "vllm:prompt_tokens_total")
            - sum(v for (n, _), v in before.items() if n == "vllm:prompt_tokens_total")
        )
        before = after
    # the same traffic shape every period: the laptop batches, 2,000 requests per 600 s
    assert all(p == pytest.approx(per_period[0], rel=0.02) for p in per_period), per_period
    gt = sim.ground_truth(include_requests=False)
    assert gt["endless"] and not gt["finished"] and gt["restarts_s"] == []
    assert gt["requests_total"] == pytest.approx(4 * 2000, abs=2)
    # each batch still brings fresh prompts: A resent is the only CPU hit, as in period 0
    assert gt["true_offload_hit_ratio"] == pytest.approx(
        lib.ground_truth()["true_offload_hit_ratio"], abs=0.01
    )
    with pytest.raises(RuntimeError):
        sim.run()


def test_later_periods_keep_the_library_and_renew_everything_else() -> None:
    w = Workload(kind="documents", rate_rps=2.0, num_docs=10, unique_fraction=0.2)
    p0 = generate(w, 300.0, seed=3, max_prompt_tokens=4000)
    p1 = generate(w, 300.0, seed=3, max_prompt_tokens=4000, period=1)
    assert all(0 <= r.t < 300 for r in p0) and all(300 <= r.t < 600 for r in p1)
    assert p0 == generate(w, 300.0, seed=3, max_prompt_tokens=4000)  # period 0 unchanged

    def ids(specs: list, pick: int) -> set[int]:
        return {r.segments[pick][0] for r in specs}

    library0 = {r.route_key for r in p0 if r.route_key < 500_000_000}
    library1 = {r.route_key for r in p1 if r.route_key < 500_000_000}
    assert library1 <= set(range(1_000, 1_010)) and library0 & library1  # same documents
    unique0 = {r.route_key for r in p0} - library0
    unique1 = {r.route_key for r in p1} - library1
    assert unique0 and unique1 and not unique0 & unique1  # new unique documents
    assert not ids(p0, -1) & ids(p1, -1)  # new questions
    sessions = Workload(kind="sessions", rate_rps=2.0, reuses=3, reuse_gap_s=30.0)
    s0 = generate(sessions, 300.0, seed=1, max_prompt_tokens=4000, spill=True)
    s1 = generate(sessions, 300.0, seed=1, max_prompt_tokens=4000, period=1, spill=True)
    assert max(r.t for r in s0) > 300  # re-sends run on across the boundary
    assert not {r.route_key for r in s0} & {r.route_key for r in s1}  # new sessions


def test_a_restart_scenario_restarts_once_per_period_and_only_then() -> None:
    sc = scenarios.get("restart")
    sim = SimServer(replace(sc, duration_s=600.0, restart_at_s=300.0), endless=True)
    sim.advance_to(1799.0)
    assert sim.restarts == [300.0, 900.0, 1500.0]


def test_closed_loop_clients_keep_sending() -> None:
    sc = scenarios.get("h200-0.6b-eager-prefill")
    sim = SimServer(sc, endless=True)
    sim.advance_to(3 * sc.duration_s)
    assert sim.ground_truth(include_requests=False)["requests_total"] > 3 * sc.workload.requests


def test_an_endless_run_keeps_memory_flat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simulator_mod, "ENDLESS_RECORDS", 50)
    sc = scenarios.get("laptop-eviction")
    sim = SimServer(sc, endless=True)
    sim.advance_to(60.0)
    sizes = []
    for k in range(1, 4):
        sim.advance_to(k * sc.duration_s)
        sizes.append(len(sim._arrivals) - sim._next)
    assert len(sim.records) == 50
    gt = sim.ground_truth()
    assert gt["requests_listed"] == len(gt["requests"]) == 50 < gt["requests_total"]
    # the mean covers every request, not only the listed ones
    assert gt["mean_ttft_s"] != pytest.approx(sum(gt["ttft_s"]) / 50, rel=1e-12)
    assert max(sizes) <= 2 * 2000  # about a period of arrivals ahead, never the whole run


def test_wall_clock_times_are_real_times() -> None:
    sc = scenarios.get("laptop-eviction")
    start = time.time()
    sim = SimServer(sc, kv_events=True, endless=True, **SimServer.wall_clock(60.0, now=start))
    sim.advance_to(120.0)  # two minutes simulated = two seconds of wall time at 60x
    batches = sim.drain_kv_events()
    assert batches and all(start <= ts <= start + 2.0 for _, ts, _ in batches)
    created = [
        v for n, _, v, _ in parse_text(sim.render().decode()).samples if n.endswith("_created")
    ]
    assert created and all(start <= v <= start + 2.0 for v in created)
    assert all(ts is None for *_, ts in parse_text(sim.render().decode()).samples)
    stamped = parse_text(sim.render(timestamped=True).decode()).samples
    (stamp,) = {ts for *_, ts in stamped}
    assert stamp == pytest.approx(start + 2.0, abs=0.01)  # milliseconds on the wire


async def _with_tokens(client: TestClient) -> list[Any] | None:
    """The samples of /metrics once prompt tokens were served (polled: none at first)."""
    body = await (await client.get("/metrics")).read()
    samples = parse_text(body.decode()).samples
    return (
        samples
        if any(n == "vllm:prompt_tokens_total" and v > 0 for n, _, v, _ in samples)
        else None
    )


def test_the_app_does_not_stamp_a_wall_clock_simulator() -> None:
    sc = scenarios.get("laptop-eviction")
    sim = SimServer(sc, endless=True, **SimServer.wall_clock(100.0))
    with pytest.raises(ValueError, match="100x"):
        make_app(sim, speed=60.0)

    async def go() -> None:
        async with TestClient(TestServer(make_app(sim, speed=100.0))) as client:
            samples = await until("the first prompt tokens", lambda: _with_tokens(client))
            assert all(ts is None for *_, ts in samples)  # Prometheus stamps them
            assert sum(v for n, _, v, _ in samples if n == "vllm:prompt_tokens_total") > 0
            now = time.time()
            created = [v for n, _, v, _ in samples if n.endswith("_created")]
            assert all(now - 60 < v <= now + 1 for v in created)  # real times, not 2026-11-18
            gt = await (await client.get("/ground-truth?requests=0")).json()
            assert gt["endless"] and gt["start_epoch"] == pytest.approx(now, abs=60)
        # at real speed too: the wall clock, anchored when serving starts
        real = SimServer(sc, endless=True, **SimServer.wall_clock(1.0, now=0.0))
        async with TestClient(TestServer(make_app(real, speed=1.0))) as client:
            body = await (await client.get("/metrics")).read()
            assert all(ts is None for *_, ts in parse_text(body.decode()).samples)
            assert real.epoch == pytest.approx(time.time(), abs=60)

    asyncio.run(go())
