"""Figures on simulator runs against the simulator's ground truth.

The offload hit ratio must match the true one within 0.02. `wasted_bytes` is a proxy:
stored − loaded. Every byte of a block that was reloaded was loaded at least once, so over a
whole run   stored − loaded ≤ never-reloaded bytes ≤ stored,   with equality on the left when
each reloaded block is read exactly once (the laptop scenario). These bounds are what the test
asserts; KV events (issue 7) are the exact figure.
"""

import asyncio
import time

import aiohttp
import pytest

from kvoffload.analysis.analyze import analyze_window
from kvoffload.analysis.window import Window
from kvoffload.ingest.catalog import WANTED_FAMILIES, extract, wanted
from kvoffload.ingest.parse import parse_text
from kvoffload.sidecar.http import make_app as make_sidecar_app
from kvoffload.sidecar.service import Sidecar, SidecarConfig
from kvoffload.sim import SimServer, scenarios
from kvoffload.sim.server import make_app as make_sim_app

from helpers import running

SCENARIOS = [
    "laptop-eviction",
    "rag-hot-set-fits",
    "buffer-too-small",
    "no-reuse",
    "dp2",
    "restart",
    "legacy-0.23",
    "recompute-wins",
]


def whole_run(name: str, interval: float | None = None):
    sc = scenarios.get(name)
    interval = interval or sc.scrape_interval_s
    sim = SimServer(sc)
    window = Window(None)
    t = 0.0
    while True:
        sim.advance_to(t)
        window.update(
            extract(
                parse_text(sim.render(), wanted, WANTED_FAMILIES), sc.start_epoch + t, "sim:8000"
            )
        )
        if t >= sc.duration_s:
            break
        t = min(t + interval, sc.duration_s)
    sim.advance_to(sc.duration_s + 60)  # let the last stores land, as a late scrape would
    window.update(
        extract(
            parse_text(sim.render(), wanted, WANTED_FAMILIES),
            sc.start_epoch + sc.duration_s + 60,
            "sim:8000",
        )
    )
    (group,) = analyze_window(window)
    return group, sim.ground_truth(include_requests=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", SCENARIOS)
def test_figures_match_ground_truth(name):
    group, truth = whole_run(name)
    f = group["figures"]
    assert f["offload_hit_ratio"] == pytest.approx(truth["true_offload_hit_ratio"], abs=0.02)
    if name == "restart":
        # What moved between the last scrape before the restart and the restart itself died
        # with the process's counters (as for Prometheus' increase()): at most one interval.
        assert f["loaded_bytes"] == pytest.approx(truth["loaded_bytes"], rel=0.02)
        return
    assert f["loaded_bytes"] == pytest.approx(truth["loaded_bytes"], rel=1e-9)
    never = truth["never_reloaded_bytes"]
    assert f["wasted_bytes"] <= never * (1 + 1e-9) + 1
    assert never <= f["stored_bytes"] * (1 + 1e-9)


def test_wasted_proxy_is_exact_when_each_reload_reads_once():
    group, truth = whole_run("laptop-eviction")
    assert group["figures"]["wasted_bytes"] == pytest.approx(
        truth["never_reloaded_bytes"], rel=0.01
    )


async def _live(speed: float, seconds: float):
    sim = SimServer(scenarios.get("laptop-eviction"))
    async with running(make_sim_app(sim, speed=speed)) as sim_port:
        sidecar = Sidecar(
            SidecarConfig(
                [f"http://127.0.0.1:{sim_port}/metrics"], interval_seconds=0.25, window_seconds=3600
            )
        )
        async with running(make_sidecar_app(sidecar)) as side_port, aiohttp.ClientSession() as s:
            await asyncio.sleep(seconds)
            async with s.get(f"http://127.0.0.1:{side_port}/api/v1/status") as r:
                status = await r.json()
            async with s.get(f"http://127.0.0.1:{sim_port}/ground-truth?requests=0") as r:
                truth = await r.json()
    return status, truth


@pytest.mark.timing
def test_live_sidecar_on_a_fast_virtual_clock():
    started = time.monotonic()
    status, truth = asyncio.run(_live(speed=100.0, seconds=4.0))
    (group,) = status["groups"]
    f = group["figures"]
    # Sample timestamps are virtual: the window spans virtual seconds, not the 4 s of wall.
    assert group["window_seconds"] > 100
    assert time.monotonic() - started < 30
    assert f["offload_hit_ratio"] == pytest.approx(truth["true_offload_hit_ratio"], abs=0.02)
    assert f["load_gbps"] == pytest.approx(12.6, rel=0.02)
    assert f["kv_bytes_per_token"] == 114_688
    assert group["recommendation"]["action"] == "keep"
