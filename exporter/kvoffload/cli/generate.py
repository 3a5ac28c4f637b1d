"""`kvoffload generate`: the rules, dashboards and docs tables, from one config."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from kvoffload.links import docs_epilog

if TYPE_CHECKING:  # (imported where used: `analyze FILE` starts without aiohttp and requests)
    pass


@click.command(epilog=docs_epilog("rules.md", "runbooks.md"))
@click.option(
    "--out",
    "out_dir",
    default=".",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Directory receiving alerts/ and dashboards/.",
)
@click.option(
    "--selector",
    default=None,
    metavar="MATCHERS",
    help='PromQL matchers of the vLLM targets (default: job="vllm").',
)
@click.option(
    "--sidecar-selector",
    default=None,
    metavar="MATCHERS",
    help='PromQL matchers of the kvoffload sidecar (default: job="kvoffload").',
)
@click.option("--rate-window", default=None, help="Window of the fast figures (default: 5m).")
@click.option(
    "--slow-window",
    default=None,
    help="Window of reuse, waste, fill time and the transfer alerts (default: 1h).",
)
@click.option(
    "--set",
    "settings",
    multiple=True,
    metavar="KEY=VALUE",
    help="Any other setting of the docs' rules.md (below), e.g. low_reuse_ratio=0.1 or "
    "alert_for.KVOffloadTransferSlow=1h; repeatable.",
)
@click.option(
    "--check",
    is_flag=True,
    help="Write nothing; exit 1 when a generated file is missing or differs.",
)
def generate(
    out_dir: str,
    selector: str | None,
    sidecar_selector: str | None,
    rate_window: str | None,
    slow_window: str | None,
    settings: tuple[str, ...],
    check: bool,
) -> None:
    """Write the Prometheus rules and Grafana dashboards for your labels and thresholds."""
    from kvoffload.mixin import generate as gen

    overrides = gen.parse_overrides(settings)
    for key, value in (
        ("sidecar_selector", sidecar_selector),
        ("rate_window", rate_window),
        ("slow_window", slow_window),
    ):
        if value is not None:
            overrides[key] = value
    if check:
        stale = gen.check(out_dir, selector=selector, **overrides)
        for rel in stale:
            click.echo(f"stale: {rel}", err=True)
        if stale:
            sys.exit(1)
        return
    paths, checked = gen.generate_checked(out_dir, selector=selector, **overrides)
    for path in paths:
        click.echo(str(path))
    tool = (
        f"; {checked.rule_files} rule files by {checked.promtool} check rules"
        if checked.promtool
        else "; promtool not on PATH: rule files not checked by promtool"
    )
    click.echo(f"validated {checked.expressions} expressions with promql-parser{tool}", err=True)
