"""A real Prometheus scraping `kvoffload sim` (the CLI, as a subprocess) every second.

The simulator used to stamp its samples with the scenario's virtual calendar: Prometheus
dropped every one ("out of bounds"), and at --speed 60 the scenario ended after its length
(30 s of wall time for rag-hot-set-fits) and the server went idle. Here the scrape runs for
several scenario lengths of simulated time and every scrape must be ingested whole: `up` is 1
each time, Prometheus rejects nothing (its own counters), every scraped sample is in the TSDB,
and the counters still rise, without a reset, at the end.

By default at --speed 240 until the simulator has run three lengths of the scenario (about
25 s: the run ends on that condition, polled, not on a fixed sleep). The long check of the
issue (10 minutes at --speed 60) is the same test stretched (`-s` shows the figures):
    KVO_SIM_PROM_SECONDS=600 KVO_SIM_PROM_SPEED=60 \
        .venv/bin/pytest -s tests/sim/test_sim_prometheus.py
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kvoffload.ingest.parse import parse_text
from kvoffload.sim import scenarios

from helpers import free_port

# The real-Prometheus helpers live with the rule tests; one copy of them.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rules"))
from rules_procs import prometheus

SCENARIO = "rag-hot-set-fits"  # the README's recipe
# The run lasts until the simulator has covered LENGTHS scenario lengths and SECONDS of wall
# time have passed (0 by default: the lengths alone).
SECONDS = float(os.environ.get("KVO_SIM_PROM_SECONDS", "0"))
LENGTHS = 3
SPEED = float(os.environ.get("KVO_SIM_PROM_SPEED", "240"))
JOB = "sim"
# Prometheus's own counters of samples it refused (names as of 2.42; a sum over any label).
REJECTED = (
    "prometheus_target_scrapes_sample_out_of_bounds_total",
    "prometheus_target_scrapes_sample_out_of_order_total",
    "prometheus_target_scrapes_sample_duplicate_timestamp_total",
    "prometheus_target_scrapes_exceeded_sample_limit_total",
    "prometheus_target_scrapes_exceeded_body_size_limit_total",
    "prometheus_tsdb_out_of_bound_samples_total",
    "prometheus_tsdb_out_of_order_samples_total",
    "prometheus_tsdb_too_old_samples_total",
)
MUST_EXIST = REJECTED[:3]
# The suite's 300 s limit would cut a stretched run short.
pytestmark = pytest.mark.timeout(SECONDS + 180)


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"kvoffload sim exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"kvoffload sim not listening on {port} after {timeout:.0f} s")


async def _get(session: aiohttp.ClientSession, url: str, path: str, params: dict[str, str]) -> Any:
    async with session.get(f"{url}{path}", params=params) as r:
        data = await r.json()
    assert data.get("status") == "success", (path, params, data)
    return data["data"]


async def _range(
    session: aiohttp.ClientSession, url: str, expr: str, at: float
) -> list[dict[str, Any]]:
    """A range-vector selector evaluated at `at`: every raw sample, per series."""
    data = await _get(session, url, "/api/v1/query", {"query": expr, "time": f"{at:.3f}"})
    assert data["resultType"] == "matrix", (expr, data["resultType"])
    return data["result"]


async def _scalar(session: aiohttp.ClientSession, url: str, expr: str, at: float) -> float:
    data = await _get(session, url, "/api/v1/query", {"query": expr, "time": f"{at:.3f}"})
    result = data["result"]
    assert len(result) == 1, (expr, result)
    return float(result[0]["value"][1])


async def _until_covered(session: aiohttp.ClientSession, sim: str, started: float) -> None:
    """Wait until the simulator has run LENGTHS lengths of its scenario (and SECONDS passed):
    the scrapes by then reach well past the point where the scenario would have ended."""
    length = scenarios.get(SCENARIO).duration_s
    while True:
        async with session.get(f"{sim}/ground-truth?requests=0") as r:
            now_s = (await r.json())["now_s"]
        if now_s >= LENGTHS * length and time.time() - started >= SECONDS:
            return
        await asyncio.sleep(0.5)


async def _run(workdir: Path) -> dict[str, Any]:
    port = free_port()
    sim_log = open(workdir / "sim.log", "wb")  # noqa: SIM115 (closed in finally)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvoffload",
            "sim",
            "--scenario",
            SCENARIO,
            "--speed",
            f"{SPEED:g}",
            "--listen",
            f"127.0.0.1:{port}",
        ],
        stdout=sim_log,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_port(port, proc)
        target = f"127.0.0.1:{port}"
        config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": [target]}]}],
        }
        async with (
            prometheus(workdir / "prometheus", config, {}) as url,
            aiohttp.ClientSession() as session,
        ):
            # Prometheus sends its first targets to the scrapers a few seconds after start:
            # the run begins with the first scrape.
            deadline = time.monotonic() + 30
            while not (await _get(session, url, "/api/v1/query", {"query": f'up{{job="{JOB}"}}'}))[
                "result"
            ]:
                assert time.monotonic() < deadline, "Prometheus never scraped the simulator"
                await asyncio.sleep(0.2)
            started = time.time()
            await _until_covered(session, f"http://{target}", started)
            # The scrape in flight lands before anything is read back.
            sel = f'{{job="{JOB}"}}'
            stopped = time.time()
            while await _scalar(session, url, f"max(timestamp(up{sel}))", time.time()) < stopped:
                await asyncio.sleep(0.2)
            at = time.time()
            span = f"{at - started + 1:.0f}s"
            out: dict[str, Any] = {"at": at, "span": span, "seconds": stopped - started}
            (up,) = await _range(session, url, f"up{sel}[{span}]", at)
            out["up"] = [(float(t), float(v)) for t, v in up["values"]]
            (scraped,) = await _range(session, url, f"scrape_samples_scraped{sel}[{span}]", at)
            out["scraped"] = [(float(t), float(v)) for t, v in scraped["values"]]
            (post,) = await _range(
                session, url, f"scrape_samples_post_metric_relabeling{sel}[{span}]", at
            )
            out["post_relabel"] = [float(v) for _, v in post["values"]]
            # Samples of the simulator's own series stored at each scrape's timestamp (no
            # sample carries a timestamp of its own, so one scrape = one timestamp); the name
            # is copied to a label because timestamp() drops it.
            series = (
                f'label_replace({{job="{JOB}",__name__!~"up|scrape_.+"}}, '
                f'"name", "$1", "__name__", "(.+)")'
            )
            out["stored"] = [
                await _scalar(
                    session, url, f"count(timestamp({series}) >= {t - 0.0005:.4f}) or vector(0)", t
                )
                for t, _ in out["scraped"]
            ]
            (prompt,) = await _range(
                session, url, f"sum(vllm:prompt_tokens_total{sel})[{span}:1s]", at
            )
            out["prompt_tokens"] = [(float(t), float(v)) for t, v in prompt["values"]]
            out["resets"] = await _scalar(
                session, url, f"sum(resets(vllm:prompt_tokens_total{sel}[{span}]))", at
            )
            async with session.get(f"{url}/metrics") as r:
                own = parse_text(await r.text()).samples
            out["rejected"] = {name: sum(v for n, _, v, _ in own if n == name) for name in REJECTED}
            out["present"] = {n for n, *_ in own}
            out["prometheus_log"] = (workdir / "prometheus" / "prometheus.log").read_text()
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://{target}/ground-truth?requests=0") as r,
        ):
            out["truth"] = await r.json()
        return out
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        sim_log.close()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = asyncio.run(_run(tmp_path_factory.mktemp("sim-prometheus")))
    up, scraped, stored = out["up"], out["scraped"], out["stored"]
    prompt = out["prompt_tokens"]
    truth = out["truth"]
    length = scenarios.get(SCENARIO).duration_s
    # The figures of the run (shown with -s; the 10-minute check reports these).
    print(
        f"\n{SCENARIO} at {SPEED:g}x for {out['seconds']:.0f} s: {len(up)} scrapes, up min "
        f"{min(v for _, v in up)}; samples per scrape {min(v for _, v in scraped):.0f}–"
        f"{max(v for _, v in scraped):.0f}, stored {sum(stored):.0f} of "
        f"{sum(v for _, v in scraped):.0f}; rejected {out['rejected']}; prompt tokens "
        f"{prompt[0][1]:.0f} → {prompt[-1][1]:.0f}, resets {out['resets']:.0f}; simulated "
        f"{truth['now_s']:.0f} s = {truth['now_s'] / length:.1f} scenario lengths, "
        f"{truth['requests_total']} requests"
    )
    return out


@pytest.mark.slow
def test_every_scrape_is_up_and_covers_several_scenario_lengths(run: dict[str, Any]) -> None:
    up = run["up"]
    # one scrape a second (a scrape may slip by its jitter: at most one missing slot)
    assert len(up) >= run["seconds"] - 1, (len(up), run["seconds"])
    assert all(v == 1.0 for _, v in up), [p for p in up if p[1] != 1.0]
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(up)]
    assert max(gaps) < 2.5, max(gaps)
    truth = run["truth"]
    assert truth["endless"] and not truth["finished"]
    assert truth["now_s"] >= LENGTHS * scenarios.get(SCENARIO).duration_s


def test_prometheus_rejects_nothing(run: dict[str, Any]) -> None:
    missing = [n for n in MUST_EXIST if n not in run["present"]]
    assert not missing, f"Prometheus no longer exposes {missing}: the check would be vacuous"
    assert not any(run["rejected"].values()), run["rejected"]
    log = run["prometheus_log"].lower()
    assert "out of bounds" not in log and "too old" not in log and "out of order" not in log


def test_every_scraped_sample_is_stored(run: dict[str, Any]) -> None:
    scraped = [v for _, v in run["scraped"]]
    assert min(scraped) > 300  # vLLM's whole exposition, not an error page
    assert run["post_relabel"] == scraped
    # scrape_samples_scraped counts every sample of the body; each one is in the TSDB at the
    # scrape's timestamp.
    assert run["stored"] == scraped


def test_counters_keep_rising_without_a_reset(run: dict[str, Any]) -> None:
    prompt = run["prompt_tokens"]
    values = [v for _, v in prompt]
    assert values == sorted(values)
    assert run["resets"] == 0
    # still rising over the last fifth of the run (the scenario's length passed long ago)
    tail = [v for t, v in prompt if t >= prompt[-1][0] - run["seconds"] / 5]
    assert len(tail) >= 3 and tail[-1] > tail[0]
