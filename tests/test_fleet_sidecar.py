"""`serve --prometheus`: the sidecar's /metrics, status and page for a whole fleet, read back
from a real Prometheus (issue #15).

Two simulator scenarios recorded 30 minutes at 15 s are backfilled with promtool into a
Prometheus started here; `kvoffload serve --prometheus` runs as a real process over their fixed
range (the post-mortem case) and must publish what `analyze --prometheus --json` prints for the
same range; when Prometheus stops, it keeps serving the last analysis, stale, with the one-line
error and every target down. The default, a range sliding with the clock, is checked against a
Prometheus scraping a live simulator.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests
from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvoffload.fleet.promapi import PrometheusAPI
from kvoffload.fleet.service import FleetConfig, FleetService
from kvoffload.sidecar.metrics import build_registry
from kvoffload.sim import SimServer, scenarios
from kvoffload.sim.server import make_app as make_sim_app

from fleet_prom import backfill, prometheus_on
from helpers import free_port, running, wait_for
from rules_procs import prometheus

KVO = [sys.executable, "-m", "kvoffload"]
SIM = {"rag:8000": "rag-hot-set-fits", "small:8000": "buffer-too-small"}
EXPECTED_ACTIONS = {"rag:8000": "keep", "small:8000": "grow"}


def kvo(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KVO, *args], capture_output=True, text=True, timeout=timeout)


def _span(path: Path) -> tuple[float, float]:
    """First and last sample time of a recording (OpenMetrics: the time ends each line)."""
    stamps = [
        float(line.rsplit(" ", 1)[1])
        for line in path.read_text().splitlines()
        if line and not line.startswith("#")
    ]
    return min(stamps), max(stamps)


@contextlib.contextmanager
def serving(*args: str) -> Iterator[str]:
    """`kvoffload serve ARGS` on a free loopback port; yields its URL. It must stop cleanly
    on SIGTERM."""
    port = free_port()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [*KVO, "serve", *args, "--listen", f"127.0.0.1:{port}"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            code = proc.wait(timeout=20)
            log.seek(0)
            output = log.read().decode()
        assert code == 0, output[-3000:]
        assert "Traceback" not in output, output[-3000:]


def status(url: str) -> dict[str, Any]:
    r = requests.get(f"{url}/api/v1/status", timeout=10)
    assert r.status_code == 200
    return r.json()


def samples(url: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of `name` on the sidecar's /metrics, by its sorted labels."""
    text = requests.get(f"{url}/metrics", timeout=10).text
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def page(chromium: Any, url: str) -> str:
    """The status page's DOM after its script ran, in a real headless Chromium."""
    dom = chromium.dom(f"{url}/", timeout=60)
    assert 'data-loaded="true"' in dom, dom[-2000:]
    return dom


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, sim_recording: Callable[..., tuple[Path, Path]]
) -> Iterator[dict[str, Any]]:
    """The recordings in a real Prometheus, and `serve --prometheus` over their range;
    `stop_prometheus()` stops Prometheus (the sidecar goes on)."""
    work = tmp_path_factory.mktemp("fleet-sidecar")
    tsdb = work / "tsdb"
    spans = []
    for instance, name in SIM.items():
        _journal, out = sim_recording(name, instance, 1800.0)
        backfill(out, tsdb)
        spans.append(_span(out))
    start, end = min(s for s, _ in spans), max(e for _, e in spans)
    span = ("--start", f"{start}", "--end", f"{end}")
    with contextlib.ExitStack() as prom, contextlib.ExitStack() as stack:
        prom_url = prom.enter_context(prometheus_on(tsdb))
        url = stack.enter_context(serving("--prometheus", prom_url, *span, "--interval", "1s"))
        wait_for("/readyz 200", lambda: requests.get(f"{url}/readyz", timeout=5).ok)
        yield {
            "url": url,
            "prometheus": prom_url,
            "span": span,
            "start": start,
            "end": end,
            "stop_prometheus": prom.close,
        }


@pytest.mark.slow
def test_status_is_what_analyze_prints(fleet: dict[str, Any]) -> None:
    r = kvo("analyze", "--prometheus", fleet["prometheus"], *fleet["span"], "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    got = status(fleet["url"])
    assert [g["labels"]["instance"] for g in got["groups"]] == ["small:8000", "rag:8000"]
    assert all(g.pop("stale") is False for g in got["groups"])
    # The same groups in the same (need) order, every figure and every word equal.
    assert got["groups"] == report["groups"]
    assert {
        g["labels"]["instance"]: g["recommendation"]["action"] for g in got["groups"]
    } == EXPECTED_ACTIONS
    assert got["fleet"] == report["fleet"]
    assert got["fleet"]["engines"] == 2 and got["fleet"]["actions"] == {"grow": 1, "keep": 1}
    assert got["errors"] == report["errors"] == []
    prom = got["prometheus"]
    assert (prom["start"], prom["end"]) == (fleet["start"], fleet["end"])
    assert prom["sliding"] is False and prom["last_error"] is None and prom["reads"] >= 1
    assert prom["scrapes"] == report["scrapes"] == 2 * 121  # 30 min at 15 s, both ends
    assert got["window_seconds"] == fleet["end"] - fleet["start"]
    assert [(t["instance"], t["up"], t["last_error"]) for t in got["targets"]] == [
        ("rag:8000", True, None),
        ("small:8000", True, None),
    ]


def test_metrics_publish_every_engine(fleet: dict[str, Any]) -> None:
    url = fleet["url"]
    assert requests.get(f"{url}/readyz", timeout=5).status_code == 200
    assert requests.get(f"{url}/healthz", timeout=5).status_code == 200
    rec = samples(url, "kvoffload_recommendation")
    for instance, action in EXPECTED_ACTIONS.items():
        key = (("action", action), ("model_name", "Qwen/Qwen3-8B"), ("target", instance))
        assert rec[key] == 1.0, instance
    assert sum(rec.values()) == 2  # one action per engine
    assert samples(url, "kvoffload_up") == {
        (("target", "rag:8000"),): 1.0,
        (("target", "small:8000"),): 1.0,
    }
    assert samples(url, "kvoffload_fleet_reads_total")[()] >= 1
    assert samples(url, "kvoffload_fleet_read_failures_total")[()] == 0
    assert samples(url, "kvoffload_fleet_read_duration_seconds")[()] > 0  # (timed: no bound)
    size = samples(url, "kvoffload_recommended_size_bytes")
    assert size[(("model_name", "Qwen/Qwen3-8B"), ("target", "small:8000"))] > 0  # grow to


def test_status_page_shows_the_fleet(chromium: Any, fleet: dict[str, Any]) -> None:
    dom = page(chromium, fleet["url"])
    assert 'id="fleet-summary"' in dom and "2 engine(s): 1 keep, 1 grow" in dom
    assert 'class="action grow"' in dom and 'class="action keep"' in dom
    assert 'data-instance="rag:8000"' in dom and 'data-instance="small:8000"' in dom
    assert f"fleet from {fleet['prometheus']}" in dom
    assert 'id="read-error"' not in dom


async def _instances_failing(prom_url: str, start: float, end: float) -> None:
    """FleetService reads through a proxy that fails the questions about the instances in
    `failing`, as a Thanos or Mimir does when one store cannot answer."""
    failing: set[str] = set()

    async def handle(request: web.Request) -> web.Response:
        form = dict(await request.post())
        if any(name in str(form.get("query", "")) for name in failing):
            return web.json_response(
                {"status": "error", "errorType": "execution", "error": "boom"}, status=422
            )
        async with session.post(prom_url + request.path, data=form) as r:
            return web.Response(body=await r.read(), status=r.status, content_type=r.content_type)

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    async with aiohttp.ClientSession() as session, running(app) as port:
        api = PrometheusAPI(f"http://127.0.0.1:{port}")
        service = FleetService(FleetConfig(fixed=(start, end)), api)

        def state() -> tuple[list[tuple[str, bool, str | None]], list[tuple[str, bool | None]]]:
            return (
                [(t.name, t.up, t.last_error and t.last_error[-15:]) for t in service.targets],
                [(g.instance, g.stale) for g in service.groups()],
            )

        def published() -> dict[tuple[tuple[str, str], ...], float]:
            text = generate_latest(build_registry(service)).decode()
            return {
                tuple(sorted(s.labels.items())): s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
                if s.name in ("kvoffload_recommendation", "kvoffload_up") and s.value
            }

        await service.refresh()
        assert state() == (
            [("rag:8000", True, None), ("small:8000", True, None)],
            [("small:8000", False), ("rag:8000", False)],
        )
        failing.add("small")
        await service.refresh()
        # small is down with its error, its last figures kept, stale; rag is read afresh.
        assert state() == (
            [("rag:8000", True, None), ("small:8000", False, "execution: boom")],
            [("rag:8000", False), ("small:8000", True)],
        )
        got = service.status()
        assert got["fleet"]["engines"] == 1 and got["fleet"]["actions"] == {"keep": 1}
        assert [e["instance"] for e in got["errors"]] == ["small:8000"]
        assert service.failures == 0 and service.last_error is None  # not a failed read
        assert published() == {  # /metrics: only what was read now
            (("action", "keep"), ("model_name", "Qwen/Qwen3-8B"), ("target", "rag:8000")): 1.0,
            (("target", "rag:8000"),): 1.0,
        }
        failing.add("rag")
        await service.refresh()
        # No instance readable: a failed read; the last analysis stays, stale, nothing published.
        assert service.last_error is not None and service.failures == 1
        assert service.last_error.startswith("no instance could be read: ")
        assert service.last_error.endswith("execution: boom")
        assert state() == (
            [("rag:8000", False, "execution: boom"), ("small:8000", False, "execution: boom")],
            [("rag:8000", True), ("small:8000", True)],
        )
        assert service.status()["fleet"]["engines"] == 1 and published() == {}
        failing.clear()
        await service.refresh()  # and back
        assert state() == (
            [("rag:8000", True, None), ("small:8000", True, None)],
            [("small:8000", False), ("rag:8000", False)],
        )
        assert service.reads == 4 and service.failures == 1 and service.last_error is None
        await service.stop()


def test_instances_that_fail_are_down_and_the_others_go_on(fleet: dict[str, Any]) -> None:
    asyncio.run(_instances_failing(fleet["prometheus"], fleet["start"], fleet["end"]))


def test_prometheus_down_keeps_the_last_analysis(chromium: Any, fleet: dict[str, Any]) -> None:
    url = fleet["url"]
    before = status(url)
    fleet["stop_prometheus"]()
    got = wait_for("a failed read", lambda: (s := status(url))["prometheus"]["last_error"] and s)
    error = got["prometheus"]["last_error"]
    assert "\n" not in error and "Connection refused" in error, error
    assert fleet["prometheus"] in error
    # Every target down with that error; the last analysis kept, flagged stale.
    assert [(t["instance"], t["up"], t["last_error"]) for t in got["targets"]] == [
        ("rag:8000", False, error),
        ("small:8000", False, error),
    ]
    assert got["errors"] == [
        {"instance": "rag:8000", "error": error},
        {"instance": "small:8000", "error": error},
    ]
    assert all(g["stale"] is True for g in got["groups"])
    for g in got["groups"]:
        g.pop("stale")
    for g in before["groups"]:
        g.pop("stale")
    assert got["groups"] == before["groups"] and got["fleet"] == before["fleet"]
    assert got["prometheus"]["failures"] >= 1
    # /metrics: targets down, the stale figures and advice gone (Prometheus sees them end).
    assert set(samples(url, "kvoffload_up").values()) == {0.0}
    assert samples(url, "kvoffload_recommendation") == {}
    assert samples(url, "kvoffload_fleet_read_failures_total")[()] >= 1
    assert requests.get(f"{url}/readyz", timeout=5).status_code == 200  # it has an analysis
    dom = page(chromium, url)
    assert 'id="read-error"' in dom and "last read failed" in dom and "Connection refused" in dom
    assert "STALE: target down" in dom


@pytest.mark.slow
def test_serve_options_are_checked(tmp_path: Path) -> None:
    prom = f"http://127.0.0.1:{free_port()}"
    cases = {
        "give --target URL (repeatable) or --prometheus URL": [],
        "one of them": ["--target", "http://127.0.0.1:8000/metrics", "--prometheus", prom],
        "--kv-events, --state-dir: with --prometheus": [
            "--prometheus",
            prom,
            "--kv-events",
            "tcp://127.0.0.1:5557",
            "--state-dir",
            str(tmp_path),
        ],
        "--window: with --prometheus": ["--prometheus", prom, "--window", "10m"],
        "--selector, --range: only with --prometheus": [
            "--target",
            "http://127.0.0.1:8000/metrics",
            "--selector",
            '{job="vllm"}',
            "--range",
            "2h",
        ],
        "--end must be after --start": ["--prometheus", prom, "--start", "2000", "--end", "1000"],
        "label matchers in braces": ["--prometheus", prom, "--selector", 'job="vllm"'],
        "not an http(s) URL": ["--prometheus", "prometheus:9090"],
    }
    for expected, args in cases.items():
        r = kvo("serve", *args, "--listen", f"127.0.0.1:{free_port()}", timeout=30)
        assert r.returncode == 2, (expected, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], (expected, r.stderr)


# -- the default: the last --range, sliding with the clock ---------------------------------------


async def _sliding(tmp_path: Path) -> None:
    sim = SimServer(scenarios.get("rag-hot-set-fits"), endless=True, **SimServer.wall_clock(60.0))
    async with running(make_sim_app(sim, speed=60.0)) as sim_port:
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": "vllm",
                    "static_configs": [{"targets": [f"127.0.0.1:{sim_port}"]}],
                }
            ],
        }
        instance = f"127.0.0.1:{sim_port}"
        async with prometheus(tmp_path / "prom", config, {}) as prom_url:
            args = ("--prometheus", prom_url, "--selector", '{job="vllm"}', "--range", "5m")
            with serving(*args, "--interval", "1s") as url:

                def judged(min_window: float) -> dict[str, Any] | None:
                    s = status(url)
                    groups = [g for g in s["groups"] if g["labels"]["instance"] == instance]
                    if groups and groups[0]["window_seconds"] >= min_window:
                        return s
                    return None

                first = await asyncio.to_thread(wait_for, "a first analysis", lambda: judged(2))
                prom = first["prometheus"]
                assert prom["sliding"] is True and first["window_seconds"] == 300
                assert prom["end"] - prom["start"] == 300
                assert abs(prom["end"] - time.time()) < 10  # the range ends now
                window = first["groups"][0]["window_seconds"]
                # A later read: the range moved with the clock, the window holds more data.
                later = await asyncio.to_thread(
                    wait_for, "a later read", lambda: judged(window + 2)
                )
                assert later["prometheus"]["end"] > prom["end"]
                assert later["prometheus"]["reads"] > prom["reads"]
                assert [t["instance"] for t in later["targets"]] == [instance]
                up = await asyncio.to_thread(samples, url, "kvoffload_up")
                assert up == {(("target", instance),): 1.0}


@pytest.mark.slow
@pytest.mark.timing
def test_the_default_range_slides_with_the_clock(tmp_path: Path) -> None:
    asyncio.run(_sliding(tmp_path))
