"""`kvoffload analyze`: a recording, a live target or a fleet, judged once."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import click

from kvoffload.analysis.analyze import window_from_expositions, window_from_recording
from kvoffload.cli.report import render_report
from kvoffload.errors import InputError
from kvoffload.fleet.options import ReadProgress, make_api, prometheus_options, time_range
from kvoffload.fleet.summary import analyze_fleet
from kvoffload.ingest.catalog import WANTED_FAMILIES, wanted
from kvoffload.ingest.parse import Exposition
from kvoffload.links import docs_epilog
from kvoffload.progress import FileReadProgress, Progress, format_seconds

if TYPE_CHECKING:  # (imported where used: `analyze FILE` starts without aiohttp and requests)
    from kvoffload.analysis.analyze import Settings
    from kvoffload.analysis.result import GroupAnalysis
    from kvoffload.analysis.window import Window
    from kvoffload.fleet.promapi import PrometheusAPI
    from kvoffload.fleet.runs import FleetResult
    from kvoffload.fleet.source import ReadStats
    from kvoffload.fleet.summary import FleetSummary
    from kvoffload.kvevents.state import TargetEvents

from kvoffload.cli.options import make_settings, settings_options
from kvoffload.flagvalues import duration_callback


@click.command(epilog=docs_epilog("advisor.md", "metrics.md"))
@click.argument("file", required=False, type=click.Path(dir_okay=False))
@click.option("--target", default=None, metavar="URL", help="Sample a live server instead.")
@click.option(
    "--duration",
    callback=duration_callback,
    default="60s",
    show_default=True,
    help="With --target: how long to sample.",
)
@click.option(
    "--interval",
    callback=duration_callback,
    default="5s",
    show_default=True,
    help="With --target: scrape interval.",
)
@click.option(
    "--window",
    callback=duration_callback,
    default=None,
    help="Only the last WINDOW of the input (default: all of it).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the JSON contract instead.")
@click.option(
    "--jobs",
    type=click.IntRange(1),
    default=None,
    help="With --prometheus: worker processes reading and analyzing the fleet in batches "
    "(default: one per usable core).",
)
@click.option(
    "--top",
    type=click.IntRange(1),
    default=None,
    help="In the report, only the TOP engines that most need a change (JSON: all).",
)
@click.option(
    "--events",
    "events_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="A KV-event stream recorded with `record --kv-events`: adds the exact "
    "miss-ratio curve and sizes from it.",
)
@settings_options
@prometheus_options
def analyze(
    file: str | None,
    target: str | None,
    duration: float,
    interval: float,
    window: float | None,
    as_json: bool,
    jobs: int | None,
    top: int | None,
    events_file: str | None,
    world_size: int,
    memory_limit: float | None,
    kv_bytes_per_token: float | None,
    thresholds_file: str | None,
    threshold_overrides: tuple[str, ...],
    prometheus_url: str | None,
    selector: str | None,
    range_seconds: float | None,
    start: str | None,
    end: str | None,
    step: float | None,
    prometheus_timeout: float,
    **auth: Any,
) -> None:
    """Figures and advice from a recording, a /metrics snapshot, a live server, or a whole
    fleet through Prometheus (--prometheus)."""
    given = [x for x in (file, target, prometheus_url) if x is not None]
    if len(given) != 1:
        raise InputError("give one of FILE, --target URL or --prometheus URL")
    source = given[0]
    settings = make_settings(
        world_size, memory_limit, thresholds_file, threshold_overrides, kv_bytes_per_token
    )
    stats: ReadStats | None = None
    if prometheus_url is not None:
        if events_file is not None:
            raise InputError("--events goes with a recording of one target, not --prometheus")
        first, last = time_range(range_seconds, start, end)
        api = make_api(prometheus_url, prometheus_timeout, **auth)
        result = _read_fleet(api, first, last, selector, step, settings, jobs)
        groups, summary, scrapes, stats = (
            result.groups,
            result.summary,
            result.scrapes,
            result.stats,
        )
        lifetime = False
    else:
        if jobs is not None:
            raise InputError("--jobs goes with --prometheus (a recording is read in one process)")
        if file is not None:
            win, scrapes, lifetime = _read_file(file, window)
        else:
            expositions = _sample_live(source, duration, interval)
            win, scrapes, lifetime = window_from_expositions(expositions, window)
        events = _events(win, events_file) if events_file is not None else None
        groups, summary = analyze_fleet(win, settings, lifetime, (), events)
    if as_json:
        click.echo(_json_report(source, scrapes, lifetime, summary, groups, stats))
        return
    note = f"{scrapes} scrape(s)" + (
        "; one snapshot: lifetime totals since the engine started" if lifetime else ""
    )
    if stats is not None:
        note += f" from {stats.instances:,} instance(s)" + "".join(
            f"\n! {w}" for w in stats.warning_lines()
        )
    shown = groups[:top] if top is not None else groups
    if len(shown) < len(groups):
        note += f"\nthe {len(shown)} of {len(groups)} engines that most need a change:"
    errors = stats.errors if stats is not None else {}
    click.echo(render_report(shown, source, note, summary, errors), nl=False)


def _read_fleet(
    api: PrometheusAPI,
    first: float,
    last: float,
    selector: str | None,
    step: float | None,
    settings: Settings,
    jobs: int | None,
) -> FleetResult:
    """Read and analyze the fleet from Prometheus, showing the read's progress."""
    from kvoffload.fleet.runs import analyze_from_prometheus
    from kvoffload.fleet.source import FleetReader

    progress = ReadProgress()
    reader = FleetReader(api, first, last, selector, step)
    try:
        return analyze_from_prometheus(reader, settings, jobs, progress)
    finally:
        progress.finish()


def _read_file(file: str, window: float | None) -> tuple[Window, int, bool]:
    """The recording or snapshot `file` as a window, showing the read's progress."""
    # Bytes of the file read so far: told by the strict reader, else seen from the general
    # reader's descriptor; on a terminal after a second, elsewhere one line for a long read.
    with FileReadProgress(file, Progress(show_after=1.0, final_after=5.0)) as reading:
        win, scrapes, lifetime = window_from_recording(file, window, report=reading.reached)
        reading.items = scrapes
    return win, scrapes, lifetime


def _events(win: Window, events_file: str) -> dict[str, TargetEvents]:
    """The KV-event stream of `events_file`, keyed by the window's one target."""
    from kvoffload.kvevents.replay import load_event_file

    instances = sorted({instance for instance, _model in win.groups()})
    if len(instances) != 1:
        raise InputError("--events needs a recording of exactly one target")
    return {instances[0]: load_event_file(events_file)}


def _json_report(
    source: str,
    scrapes: int,
    lifetime: bool,
    summary: FleetSummary,
    groups: list[GroupAnalysis],
    stats: ReadStats | None,
) -> str:
    """`analyze --json`: the figures, the advice and (from Prometheus) the read's errors."""
    out: dict[str, object] = {
        "source": source,
        "scrapes": scrapes,
        "lifetime": lifetime,
        "fleet": summary.to_json(),
        "groups": [g.to_json() for g in groups],
    }
    if stats is not None:
        out["errors"] = [{"instance": i, "error": e} for i, e in sorted(stats.errors.items())]
        out["warnings"] = list(stats.warnings)
        out["warning_counts"] = [{"warning": w, "count": n} for w, n in stats.warnings.items()]
        if stats.other_warnings:
            out["other_warnings"] = stats.other_warnings
    return json.dumps(out, indent=2, allow_nan=False)


def _sample_live(url: str, duration: float, interval: float) -> Iterator[Exposition]:
    """Scrape `url` every `interval` for `duration`, as the sidecar does (kvoffload.ingest.scrape).

    A first scrape without vLLM metrics ends it at once. Each later scrape prints one progress line
    on stderr, so a long run is not silent."""
    from kvoffload.ingest.catalog import extract
    from kvoffload.ingest.scrape import SyncScraper
    from kvoffload.sidecar.service import target_name

    name = target_name(url)
    started_at = time.monotonic()
    deadline = started_at + duration
    scraper = SyncScraper()
    progress = Progress(show_after=1.0, final_after=5.0)
    progress.note(
        f"analyze --target: scraping {url} every {format_seconds(interval)} for "
        f"{format_seconds(duration)}"
    )
    count = 0
    try:
        while True:
            started = time.monotonic()
            result = scraper.scrape(url, wanted=wanted, wanted_families=WANTED_FAMILIES)
            expo = result.exposition
            expo.timestamp = result.timestamp
            if count == 0:
                ex = extract(expo, result.timestamp, name)
                if not ex.counters and not ex.gauges and not ex.unknown:
                    progress.clear()
                    raise InputError(
                        f"{url}: no vLLM metrics in its {result.payload_bytes:,}-byte body "
                        "(is this vLLM's /metrics? is --disable-log-stats set?)"
                    )
            for i, (sample_name, labels, value, ts) in enumerate(expo.samples):
                expo.samples[i] = (sample_name, {**labels, "instance": name}, value, ts)
            count += 1
            left = max(deadline - time.monotonic(), 0.0)
            progress.update(
                f"analyze --target: {count} scrape(s) of {name}, {format_seconds(left)} left"
            )
            yield expo
            if started + interval > deadline:
                return
            time.sleep(max(0.0, started + interval - time.monotonic()))
        progress.finish(f"analyze --target: {count} scrape(s) of {name}")
    finally:
        scraper.close()
