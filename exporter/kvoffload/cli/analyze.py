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
    from kvoffload.fleet.source import ReadStats

from kvoffload.cli.options import duration_callback, make_settings, settings_options


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
    help="Worker processes: with --prometheus, and for reading a large recording written "
    "scrape by scrape in parts (default: one per core, up to 4; the figures are those of one "
    "process).",
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
        from kvoffload.fleet.runs import analyze_from_prometheus
        from kvoffload.fleet.source import FleetReader

        first, last = time_range(range_seconds, start, end)
        progress = ReadProgress()
        reader = FleetReader(
            make_api(prometheus_url, prometheus_timeout, **auth), first, last, selector, step
        )
        try:
            result = analyze_from_prometheus(reader, settings, jobs, progress)
        finally:
            progress.finish()
        groups, summary, scrapes, stats = (
            result.groups,
            result.summary,
            result.scrapes,
            result.stats,
        )
        lifetime = False
    else:
        if file is not None:
            # Bytes of the file read so far: told by the fast readers, else seen from the
            # general reader's descriptor; on a terminal after a second, elsewhere one line
            # for a long read.
            with FileReadProgress(file, Progress(show_after=1.0, final_after=5.0)) as reading:
                win, scrapes, lifetime = window_from_recording(
                    file, window, jobs, report=reading.reached
                )
                reading.items = scrapes
        else:
            expositions = _sample_live(source, duration, interval)
            win, scrapes, lifetime = window_from_expositions(expositions, window)
        events = None
        if events_file is not None:
            from kvoffload.kvevents.replay import load_event_file

            instances = sorted({instance for instance, _model in win.groups()})
            if len(instances) != 1:
                raise InputError("--events needs a recording of exactly one target")
            events = {instances[0]: load_event_file(events_file)}
        groups, summary = analyze_fleet(win, settings, lifetime, (), events)
    errors = stats.errors if stats is not None else {}
    if as_json:
        out: dict[str, object] = {
            "source": source,
            "scrapes": scrapes,
            "lifetime": lifetime,
            "fleet": summary.to_json(),
            "groups": [g.to_json() for g in groups],
        }
        if stats is not None:
            out["errors"] = [{"instance": i, "error": e} for i, e in sorted(errors.items())]
            out["warnings"] = list(stats.warnings)
            out["warning_counts"] = [{"warning": w, "count": n} for w, n in stats.warnings.items()]
            if stats.other_warnings:
                out["other_warnings"] = stats.other_warnings
        click.echo(json.dumps(out, indent=2, allow_nan=False))
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
    click.echo(render_report(shown, source, note, summary, errors), nl=False)


def _sample_live(url: str, duration: float, interval: float) -> Iterator[Exposition]:
    """Scrape `url` every `interval` for `duration`, the sidecar's way (kvoffload.ingest.scrape).

    A first scrape without vLLM metrics ends it at once (the whole --duration would only say
    the same); each scrape after it is one progress line on stderr, so a long run is not
    silent."""
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
