"""`kvoffload demo`: the simulator and the sidecar on free local ports, a live summary."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp import web

from kvoffload.analysis.advisor import Recommendation
from kvoffload.analysis.analyze import Settings
from kvoffload.analysis.result import TTFT_EFFECT_FIGURE, GroupAnalysis
from kvoffload.analysis.stability import StabilityRules
from kvoffload.cli import server as serving
from kvoffload.cli.flags import listen_socket, url
from kvoffload.cli.report import format_value
from kvoffload.cli.webconfig import WebSecurity
from kvoffload.sidecar.http import make_app as make_sidecar_app
from kvoffload.sidecar.service import KVEventsSource, Sidecar, SidecarConfig

if TYPE_CHECKING:  # (the simulator imported where the demo starts)
    from kvoffload.sim.config import Scenario


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# The sidecar's window in the demo, virtual seconds: 15 simulated minutes (15 s at 60x). With
# serve's 5 minutes a scenario's 15-s scrapes give 20 intervals, too few for the TTFT range
# to clear its noise (pressure-without-offloading: -19 ms [-48, +10] → leave_off; at 15 min:
# enable 12 GiB from the first judgement on).
DEMO_WINDOW_SECONDS = 900.0


def summary_line(group: GroupAnalysis, now: float | None = None) -> str:
    """One line of the group's figures and advice; `now` (data time) says for how long the
    advice has stood."""
    f = group.figures
    rec = group.recommendation
    size = rec.kv_offloading_size_gib
    action = rec.action + (f" {size:g} GiB" if size is not None else "")
    tier = (
        f"hit {format_value(f.get('offload_hit_ratio'), 'ratio')}"
        f" | load {format_value(f.get('load_gbps'), 'GB/s')}"
        f" | stored, not reloaded ≥ {format_value(f.get('wasted_bytes'), 'bytes')}"
        f" | speedup {format_value(f.get('speedup'), 'x')}"
        if group.offloading
        else f"no CPU tier | GPU prefix hit {format_value(f.get('gpu_prefix_hit_ratio'), 'ratio')}"
    )
    return (
        f"{group.model_name}: {tier}"
        + (
            f" | TTFT {effect * 1000:+.1f} ms with the tier"
            if (effect := f.get(TTFT_EFFECT_FIGURE)) is not None
            else ""
        )
        + f" | advice: {action}"
        + (
            f" ({'within the noise, ' if rec.within_noise else ''}stands {now - rec.since:.0f} s)"
            if now is not None and rec.since is not None
            else " (not judged yet)"
            if rec.decided_by == "warmup"
            else ""
        )
        + (f", {rec.pending['action']} pending" if rec.pending else "")
        + (
            f" (curve: {group.predicted_offload_hit_ratio:.2f} predicted)"
            if group.predicted_offload_hit_ratio is not None
            else ""
        )
        + (f" — {_gist(why)}" if (why := _why(rec)) else "")
    )


def _why(rec: Recommendation) -> str | None:
    """What decided the advice: its trace's last stage (the rule with the last word), else its first
    reason."""
    if rec.trace and rec.trace[-1].get("why"):
        return str(rec.trace[-1]["why"])
    return rec.reasons[0] if rec.reasons else None


def _gist(reason: str, most: int = 110) -> str:
    """The advice's first reason cut to its first clause: the why, on the demo's one line."""
    clause = reason.split("; ", 1)[0]
    return clause if len(clause) <= most else clause[: most - 1].rstrip() + "…"


async def run_demo(
    scenario_name: str,
    speed: float,
    duration: float | None,
    listen_host: str,
    sidecar_port: int | None,
    every: float,
    echo: Callable[[str], None],
    kv_events: bool = True,
    metrics_path: str = "/metrics",
    security: WebSecurity | None = None,
    memory_limit: float | None = None,
) -> None:
    from kvoffload.sim import scenarios

    scenario = scenarios.get(scenario_name)
    security = security or WebSecurity(None)
    # Bound first: an address in use ends the demo (one line) before anything starts.
    side_sock = listen_socket(listen_host, sidecar_port or 0)
    sim_port = free_port(listen_host)
    events_endpoint = f"tcp://{listen_host}:{free_port(listen_host)}" if kv_events else None
    sim_runner = await _start_simulator(scenario, speed, listen_host, sim_port, events_endpoint)
    target = f"http://{listen_host}:{sim_port}/metrics"
    sidecar = _demo_sidecar(scenario, speed, target, events_endpoint, memory_limit)
    side_app = security.install(make_sidecar_app(sidecar, metrics_path=metrics_path))
    # Behind the same accept loop as serve's (kvoffload.cli.server): stalled TLS handshakes and
    # connection floods bounded alike.
    side_runner = serving.runner(side_app)
    await side_runner.setup()
    await serving.ListenerSite(side_runner, side_sock, security.ssl_context()).start()
    echo(
        f"simulated vLLM ({scenario.name}, {speed:g}x real time): {target}"
        + (f", KV events {events_endpoint}" if events_endpoint else "")
    )
    base = url(security.scheme, side_sock, "")
    echo(f"sidecar:   {base}/  (status page)")
    echo(f"           {base}{metrics_path}  {base}/api/v1/status")
    echo("Ctrl-C to stop.")
    try:
        await _show_summaries(sidecar, duration, every, echo)
    finally:
        with contextlib.suppress(Exception):
            await side_runner.cleanup()
        with contextlib.suppress(Exception):
            await sim_runner.cleanup()


async def _start_simulator(
    scenario: Scenario, speed: float, host: str, port: int, events_endpoint: str | None
) -> web.AppRunner:
    """The simulated vLLM serving `scenario` on `host:port`; its runner, for the cleanup."""
    from kvoffload.sim import SimServer
    from kvoffload.sim.server import make_app as make_sim_app

    # The workload goes on past the scenario's length for as long as the demo runs, so the
    # figures keep moving instead of going flat (memory stays bounded: SimServer endless).
    sim_app = make_sim_app(
        SimServer(scenario, kv_events=events_endpoint is not None, endless=True),
        speed=speed,
        kv_events_endpoint=events_endpoint,
    )
    sim_runner = web.AppRunner(sim_app, access_log=None)
    await sim_runner.setup()
    await web.TCPSite(sim_runner, host, port).start()
    return sim_runner


def _demo_sidecar(
    scenario: Scenario,
    speed: float,
    target: str,
    events_endpoint: str | None,
    memory_limit: float | None,
) -> Sidecar:
    """The sidecar scraping the simulator at `target`, in the simulator's virtual time."""
    sources = [KVEventsSource(target, events_endpoint)] if events_endpoint else []
    # The simulator stamps samples with virtual time, so a 5-minute window is 5 virtual
    # minutes whatever the speed; scrape as often (in virtual time) as the scenario asks: the
    # TTFT verdict fits costs over scrape intervals, and intervals that are whole periods of a
    # repeating workload all look alike.
    every_virtual = scenario.scrape_interval_s
    return Sidecar(
        SidecarConfig(
            [target],
            interval_seconds=max(0.1, min(5.0, every_virtual / speed)),
            window_seconds=DEMO_WINDOW_SECONDS,
            settings=Settings(memory_limit_bytes=memory_limit),
            kv_events=sources,
            # in the simulator's virtual time, like serve's defaults in real time
            stability=StabilityRules(),
        )
    )


async def _show_summaries(
    sidecar: Sidecar, duration: float | None, every: float, echo: Callable[[str], None]
) -> None:
    """Every `every` seconds (for `duration`, or until cancelled), one line per engine."""
    started = time.monotonic()
    while duration is None or time.monotonic() - started < duration:
        await asyncio.sleep(
            every
            if duration is None
            else min(every, max(0.0, duration - (time.monotonic() - started)))
        )
        groups = sidecar.groups()
        if not groups:
            states = "; ".join(t.last_error or "waiting" for t in sidecar.targets)
            echo(f"[{time.monotonic() - started:5.0f}s] no figures yet ({states})")
        for g in groups:
            now = sidecar.window.last_time(g.key)
            echo(f"[{time.monotonic() - started:5.0f}s] {summary_line(g, now)}")
