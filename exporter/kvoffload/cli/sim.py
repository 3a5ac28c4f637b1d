"""`kvoffload sim`: the vLLM simulator, served or written as a recording."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import click

from kvoffload.cli.flags import (
    WebFlags,
    run_app,
    web_options,
)
from kvoffload.errors import InputError
from kvoffload.links import docs_epilog

if TYPE_CHECKING:  # (imported where used: `analyze FILE` starts without aiohttp and requests)
    pass

from kvoffload.cli.options import scenario_named
from kvoffload.flagvalues import duration_callback


@click.command(epilog=docs_epilog("scenarios.md"))
@click.option(
    "--scenario",
    default="laptop-eviction",
    show_default=True,
    help="A scenario of the library (docs: scenarios.md, below).",
)
@web_options("127.0.0.1:8000", "--listen")
@click.option(
    "--speed",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="Simulated seconds per real second: the traffic is that much denser "
    "(per-second rates read that many times higher); TTFT, copy times and "
    "GB/s stay the simulated ones.",
)
@click.option(
    "--clock",
    type=click.Choice(["wall", "virtual"]),
    default="wall",
    show_default=True,
    help="wall: samples without timestamps (Prometheus stamps them, at any speed), "
    "_created and KV event times on the real clock. virtual: the scenario's "
    "calendar, every sample stamped with it (a sidecar alone then sees "
    "simulated seconds; Prometheus drops such samples).",
)
@click.option(
    "--record",
    "record_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write a recording instead of serving (no waiting: virtual clock).",
)
@click.option(
    "--duration",
    callback=duration_callback,
    default=None,
    help="With --record: virtual time to record (default: the scenario's length).",
)
@click.option(
    "--interval",
    callback=duration_callback,
    default="15s",
    show_default=True,
    help="With --record: scrape interval in virtual time.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--kv-events",
    "kv_events",
    metavar="ENDPOINT",
    default=None,
    help="Publish vLLM's KV cache events over ZMQ, e.g. tcp://127.0.0.1:5557 "
    "(bound; DP rank N on port + N).",
)
@click.option(
    "--kv-events-replay",
    metavar="ENDPOINT",
    default=None,
    help="With --kv-events: the replay (ROUTER) endpoint, e.g. tcp://127.0.0.1:5558.",
)
@click.option(
    "--record-kv-events",
    "record_kv_events",
    type=click.Path(dir_okay=False),
    default=None,
    help="With --record: also write the KV event stream to this file.",
)
@click.option("--list", "list_scenarios", is_flag=True, help="List the scenarios and exit.")
def sim(
    scenario: str,
    web: WebFlags,
    speed: float,
    clock: str,
    record_path: str | None,
    duration: float | None,
    interval: float,
    seed: int,
    kv_events: str | None,
    kv_events_replay: str | None,
    record_kv_events: str | None,
    list_scenarios: bool,
) -> None:
    """Run the built-in vLLM simulator: serve /metrics until stopped, or write a recording.

    The scenario's traffic goes on past its length."""
    from kvoffload.sim import SimServer, scenarios

    if list_scenarios:
        for name in scenarios.names():
            sc = scenarios.get(name)
            click.echo(f"{name:28} {sc.description.splitlines()[0] if sc.description else ''}")
        return
    chosen = scenario_named(scenario)
    if kv_events_replay is not None and kv_events is None:
        raise InputError("--kv-events-replay needs --kv-events")
    if record_kv_events is not None and record_path is None:
        raise InputError("--record-kv-events needs --record")
    if record_path is not None:
        from kvoffload.sim.write_recording import record_scenario

        if kv_events is not None:
            raise InputError("--kv-events serves; with --record use --record-kv-events")
        n = record_scenario(
            chosen,
            record_path,
            duration or chosen.duration_s,
            interval,
            seed=seed,
            events_path=record_kv_events,
        )
        click.echo(
            f"wrote {n} scrapes of {chosen.name} to {record_path}"
            + (f" and its KV events to {record_kv_events}" if record_kv_events else ""),
            err=True,
        )
        return
    from kvoffload.sim.server import make_app as make_sim_app

    log = logging.getLogger("kvoffload.sim")
    if kv_events is not None:
        replay = f" (replay {kv_events_replay})" if kv_events_replay else ""
        log.info("KV events: %s%s", kv_events, replay)
    # A server runs until stopped: the workload continues period after period (no counter
    # reset, memory capped) so a sidecar or Prometheus next to it never sees it go idle.
    wall = SimServer.wall_clock(speed) if clock == "wall" else {}
    app = make_sim_app(
        SimServer(chosen, seed=seed, kv_events=kv_events is not None, endless=True, **wall),
        speed=speed,
        kv_events_endpoint=kv_events,
        kv_events_replay=kv_events_replay,
        metrics_path=web.telemetry_path,
    )
    # The sidecar's interval is wall time, the simulator's data virtual: at 60x a 5 s scrape
    # would span 5 virtual minutes, too few intervals for the TTFT fit. Say what matches.
    every = f"{max(chosen.scrape_interval_s / speed, 0.1):g}s"
    run_app(
        app,
        web,
        lambda url: log.info(
            "simulated vLLM (%s, %gx): %s; watch it with: kvoffload serve --target %s "
            "--interval %s (the scenario's %gs scrapes in its virtual time)",
            chosen.name, speed, url, url, every, chosen.scrape_interval_s,
        ),
    )  # fmt: skip
