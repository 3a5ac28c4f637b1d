"""`kvoffload demo`: the simulator and the sidecar in one process, the advice on one line."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from kvoffload.cli.flags import (
    WebFlags,
    web_options,
)

if TYPE_CHECKING:  # (imported where used: `analyze FILE` starts without aiohttp and requests)
    pass

from kvoffload.cli.options import scenario_named
from kvoffload.flagvalues import duration_callback, size_callback


@click.command()
@click.option("--scenario", default="laptop-eviction", show_default=True)
@click.option(
    "--speed",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="Virtual seconds per real second.",
)
@click.option(
    "--duration",
    callback=duration_callback,
    default=None,
    help="Stop after this long (default: until Ctrl-C).",
)
@web_options("127.0.0.1:0")
@click.option(
    "--every",
    callback=duration_callback,
    default="3s",
    show_default=True,
    help="How often to print the summary.",
)
@click.option(
    "--kv-events/--no-kv-events",
    default=True,
    show_default=True,
    help="Also publish and subscribe to KV events (the exact miss-ratio curve).",
)
@click.option(
    "--memory-limit",
    callback=size_callback,
    default=None,
    help="The simulated vLLM container's memory limit, for the OOM check (e.g. 16Gi).",
)
def demo(
    scenario: str,
    speed: float,
    duration: float | None,
    web: WebFlags,
    every: float,
    kv_events: bool,
    memory_limit: float | None,
) -> None:
    """Run the simulator and the sidecar together, with a live summary (the quick start).

    The sidecar listens at --web.listen-address (port 0: a free one); the simulator on a free
    port."""
    import asyncio

    from kvoffload.cli.demo_runner import run_demo
    from kvoffload.cli.webconfig import WebSecurity

    scenario_named(scenario)
    security = WebSecurity(web.config_file)
    try:
        asyncio.run(
            run_demo(
                scenario,
                speed,
                duration,
                web.host,
                web.port,
                every,
                click.echo,
                kv_events,
                metrics_path=web.telemetry_path,
                security=security,
                memory_limit=memory_limit,
            )
        )
    except KeyboardInterrupt:
        click.echo("stopped", err=True)
