"""The scenario library, the sizing oracle, the HTTP app and recordings."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kvoffload.sim import SimServer, scenarios
from kvoffload.sim.config import ACTIONS
from kvoffload.sim.oracle import sweep
from kvoffload.sim.server import make_app

from helpers import until
from sim_helpers import parse, total

EXPECTED = {
    "laptop-eviction",
    "laptop-eviction-nooffload",
    "rag-hot-set-fits",
    "buffer-too-small",
    "buffer-oversized",
    "no-reuse",
    "gpu-plenty",
    "recompute-wins",
    "pressure-without-offloading",
    "dp2",
    "restart",
    "legacy-0.23",
}


def test_names_and_get() -> None:
    assert set(scenarios.names()) >= EXPECTED
    with pytest.raises(KeyError, match="laptop-eviction"):
        scenarios.get("nope")


@pytest.mark.parametrize("name", scenarios.names())
def test_every_scenario_runs_and_is_documented(name: str) -> None:
    s = scenarios.get(name)
    assert s.advice in ACTIONS and s.description and s.advice_why
    doc = Path(__file__).parents[2] / "docs" / "scenarios.md"
    assert f"`{name}`" in doc.read_text()
    if s.workload.requests is not None:
        # a fixed batch of requests from closed-loop clients (the real H200 sets): it runs to
        # the end within its duration
        sim = SimServer(s, seed=0)
        sim.advance_to(s.duration_s)
        assert len(sim.records) == s.workload.requests
        return
    assert 600 <= s.duration_s <= 3600
    sim = SimServer(s, seed=0)
    sim.advance_to(300.0)
    _, samples = parse(sim.render())
    # enough traffic for rates over a 5-minute window
    assert total(samples, "vllm:prompt_tokens_total") > 0 or s.restart_at_s is not None
    assert len(sim.records) >= 50
    assert not sim.finished


def test_whole_run_is_finished_and_json() -> None:
    sim = SimServer(scenarios.get("buffer-oversized"), seed=3)
    sim.run()
    assert sim.finished
    gt = json.loads(json.dumps(sim.ground_truth()))
    assert gt["requests_total"] == len(gt["ttft_s"]) == len(gt["requests"])
    assert gt["never_reloaded_bytes"] == (
        gt["never_reloaded_evicted_bytes"] + gt["never_reloaded_resident_bytes"]
    )


def test_oracle_grow_and_shrink() -> None:
    small = scenarios.get("buffer-too-small")
    r = sweep(small, [2.0, 8.0, 16.0, 32.0])
    assert r["right_size_gib"] > small.cpu_gib
    assert [p["cpu_gib"] for p in r["points"]] == [2.0, 8.0, 16.0, 32.0]
    big = scenarios.get("buffer-oversized")
    r = sweep(big, [1.0, 4.0, 16.0, 256.0])
    assert r["right_size_gib"] < big.cpu_gib
    assert r["achievable_hit_ratio"] > 0.5
    none = sweep(replace(scenarios.get("no-reuse"), duration_s=300.0), [4.0, 16.0])
    assert none["right_size_gib"] is None and none["achievable_hit_ratio"] == 0
    slow = sweep(replace(scenarios.get("recompute-wins"), duration_s=300.0), [0.0, 8.0])
    assert slow["best_ttft_gib"] == 0.0  # offloading off is fastest when recompute wins


async def _virtual_seconds_past(client: TestClient, seconds: float) -> bool:
    gt = await (await client.get("/ground-truth?requests=0")).json()
    return bool(gt["now_s"] > seconds)


def test_http_app() -> None:
    sim = SimServer(scenarios.get("laptop-eviction"), seed=0)

    async def go() -> None:
        async with TestClient(TestServer(make_app(sim, speed=100.0))) as client:
            r1 = await client.get("/metrics")
            assert r1.status == 200
            assert r1.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            # Polled: 30 virtual seconds pass (0.3 s of wall time at 100x on a quiet machine).
            await until("30 virtual seconds", lambda: _virtual_seconds_past(client, 30.0))
            r2 = await client.get("/metrics")
            body = await r2.read()
            _, samples = parse(body)
            assert total(samples, "vllm:prompt_tokens_total") > 0  # ≥ 30 virtual seconds
            assert b"} 0.0 17950000" in body or b" 17950000" in body  # virtual timestamps (ms)
            gt = await (await client.get("/ground-truth?requests=0")).json()
            assert gt["scenario"] == "laptop-eviction" and gt["now_s"] > 20
            assert "requests" not in gt

    asyncio.run(go())


def test_http_app_at_real_speed_is_vllm_exact() -> None:
    sim = SimServer(scenarios.get("gpu-plenty"), seed=0)

    async def go() -> None:
        async with TestClient(TestServer(make_app(sim, speed=1.0))) as client:
            body = await (await client.get("/metrics")).read()
            assert body == sim.render()

    asyncio.run(go())


def test_record(tmp_path: Path) -> None:
    pytest.importorskip("kvoffload.recording.openmetrics")
    from kvoffload.sim.write_recording import record_scenario

    out = tmp_path / "rec.om"
    n = record_scenario(
        scenarios.get("laptop-eviction"),
        str(out),
        duration_s=60.0,
        interval_s=15.0,
        instance="sim:9",
        job="vllm",
    )
    assert n == 5
    text = out.read_text()
    assert text.rstrip().endswith("# EOF")
    assert 'instance="sim:9"' in text and 'job="vllm"' in text
    assert " 1795000060.0" in text or " 1795000060" in text
