"""End to end over loopback: the simulator publishes KV events on ZMQ, the sidecar subscribes,
and its JSON, /metrics and advice carry the curve; record → analyze --events offline."""

import asyncio
import json
import subprocess
import sys

import aiohttp
import pytest

from kvoffload.ingest.parse import parse_text
from kvoffload.sidecar.http import make_app as make_sidecar_app
from kvoffload.sidecar.service import KVEventsSource, Sidecar, SidecarConfig
from kvoffload.sim import SimServer, scenarios
from kvoffload.sim.server import make_app as make_sim_app

from helpers import free_port, running


async def _live(name: str, speed: float, seconds: float, min_messages: int = 0):
    events = f"tcp://127.0.0.1:{free_port()}"
    replay = f"tcp://127.0.0.1:{free_port()}"
    sim = SimServer(scenarios.get(name), kv_events=True)
    sim_app = make_sim_app(sim, speed=speed, kv_events_endpoint=events, kv_events_replay=replay)
    async with running(sim_app) as sim_port:
        target = f"http://127.0.0.1:{sim_port}/metrics"
        sidecar = Sidecar(
            SidecarConfig(
                [target],
                interval_seconds=0.25,
                window_seconds=3600,
                kv_events=[KVEventsSource(target, events, replay)],
            )
        )
        async with running(make_sidecar_app(sidecar)) as side_port, aiohttp.ClientSession() as s:
            # `seconds` at least, then until `min_messages` are in (a loaded machine runs the
            # simulator in this one event loop slower: the content, not the speed, is tested)
            await asyncio.sleep(seconds)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while True:
                async with s.get(f"http://127.0.0.1:{side_port}/api/v1/status") as r:
                    status = await r.json()
                seen = sum(g["kv_events"]["messages"] for g in status["groups"] if g["kv_events"])
                if seen >= min_messages or loop.time() > deadline:
                    break
                await asyncio.sleep(0.5)
            async with s.get(f"http://127.0.0.1:{side_port}/metrics") as r:
                metrics = await r.text()
    return status, metrics


@pytest.mark.slow
def test_sidecar_subscribes_and_publishes_the_curve():
    status, metrics = asyncio.run(
        _live("buffer-too-small", speed=300.0, seconds=6.0, min_messages=3000)
    )
    (sub,) = status["kv_events"]
    assert sub["connected"] and sub["last_error"] is None and sub["last_seq"] > 10
    (group,) = status["groups"]
    ev = group["kv_events"]
    assert ev["messages"] > 10 and ev["lost_messages"] == 0
    assert group["curve"] and ev["achievable_hit_ratio"] > 0.5
    assert group["predicted_offload_hit_ratio"] is not None
    samples = parse_text(metrics).samples
    buckets = [
        (lb["le"], v) for n, lb, v, _ in samples if n == "kvoffload_reuse_distance_bytes_bucket"
    ]
    assert buckets and buckets[-1][0] == "+Inf"
    values = [v for _, v in buckets]
    assert values == sorted(values)  # cumulative
    names = {n for n, *_ in samples}
    assert {
        "kvoffload_cpu_resident_bytes",
        "kvoffload_kv_events_messages_total",
        "kvoffload_achievable_offload_hit_ratio",
        "kvoffload_predicted_offload_ttft_effect_seconds",
        "kvoffload_curve_provisional",
    } <= names
    (flag,) = [v for n, _, v, _ in samples if n == "kvoffload_curve_provisional"]
    assert flag == float(ev["provisional"]) == float(bool(ev["provisional_reasons"]))


@pytest.mark.slow
def test_a_tiered_server_live_counts_the_fs_tiers_stores_and_predicts_with_it():
    """Scenario `tiered` (an fs tier under the CPU tier): the tier's own stores (KV events,
    medium FS) are exported, and the current size's prediction counts the tier below."""
    status, metrics = asyncio.run(_live("tiered", speed=300.0, seconds=6.0, min_messages=3000))
    (group,) = status["groups"]
    ev = group["kv_events"]
    assert ev["tier_stored_bytes"] > 0
    samples = parse_text(metrics).samples
    (stored,) = [v for n, _, v, _ in samples if n == "kvoffload_secondary_tier_stored_bytes_total"]
    assert stored >= ev["tier_stored_bytes"]  # /metrics was read after the status
    (tier,) = [r for r in ev["whatif"]["secondary_tier"] if r["size"] == "current"]
    assert ev["predicted_offload_hit_ratio_current_with_tier"] == tier["cpu_hit_ratio"]
    assert tier["cpu_hit_ratio"] >= ev["predicted_offload_hit_ratio_current"]


@pytest.fixture
def sim_with_events():
    http_port, events_port = free_port(), free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvoffload",
            "sim",
            "--scenario",
            "laptop-eviction",
            "--listen",
            f"127.0.0.1:{http_port}",
            "--speed",
            "60",
            "--kv-events",
            f"tcp://127.0.0.1:{events_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    import socket
    import time

    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", http_port), 0.5).close()
            break
        except OSError:
            time.sleep(0.1)
    yield f"http://127.0.0.1:{http_port}/metrics", f"tcp://127.0.0.1:{events_port}"
    proc.terminate()
    proc.wait(10)


@pytest.mark.slow
def test_record_with_events_then_analyze_offline(sim_with_events, tmp_path):
    url, events = sim_with_events
    out = tmp_path / "run.om"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvoffload",
            "record",
            "--target",
            url,
            "--interval",
            "0.5s",
            "--duration",
            "5s",
            "-o",
            str(out),
            "--kv-events",
            events,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "KV-event messages" in r.stderr
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvoffload",
            "analyze",
            str(out),
            "--events",
            str(out) + ".kvev",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    (group,) = json.loads(r.stdout)["groups"]
    assert group["kv_events"]["messages"] > 0
    # The laptop run: A's 93 blocks come back after B and C (198 blocks): a tier of
    # 0.5 GiB (292 chunks) serves them, as the measurement did.
    points = {round(p["cpu_gib"], 4): p["predicted_offload_hit_ratio"] for p in group["curve"]}
    assert max(points.values()) == pytest.approx(0.24, abs=0.03)


def test_analyze_with_a_bad_event_file_is_a_one_line_error(tmp_path):
    from helpers import SAMPLE

    bad = tmp_path / "x.kvev"
    bad.write_bytes(b"not an event file")
    r = subprocess.run(
        [sys.executable, "-m", "kvoffload", "analyze", str(SAMPLE), "--events", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "bad header" in r.stderr and "Traceback" not in r.stderr
