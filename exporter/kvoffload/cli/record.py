"""`kvoffload record`: scrape targets on a schedule into a recording."""

from __future__ import annotations

import os
import signal
import sys
from typing import TYPE_CHECKING, BinaryIO

import click

from kvoffload.errors import InputError
from kvoffload.progress import Progress, format_seconds

if TYPE_CHECKING:  # (imported where used: `analyze FILE` starts without aiohttp and requests)
    from kvoffload.kvevents.eventfile import EventFileWriter
    from kvoffload.recording.openmetrics import Recording

from kvoffload.cli.options import scrape_timeout_option
from kvoffload.flagvalues import duration_callback


@click.command()
@click.option(
    "--target",
    "targets",
    multiple=True,
    metavar="URL",
    help="vLLM /metrics URL; repeat for several engines/pods.",
)
@click.option("--interval", callback=duration_callback, default="15s", show_default=True)
@click.option("--duration", callback=duration_callback, default="10m", show_default=True)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    help="Recording to write (OpenMetrics, .om). While recording, scrapes go to "
    "OUTPUT.partial (what a killed recorder leaves; `analyze` reads it).",
)
@click.option("--job", default="vllm", show_default=True, help="job label added to every series.")
@scrape_timeout_option
@click.option(
    "--kv-events",
    "kv_events",
    default=None,
    metavar="ENDPOINT",
    help="Also record the first target's KV events (vLLM's ZMQ endpoint of DP rank 0).",
)
@click.option("--kv-events-replay", default=None, metavar="ENDPOINT")
@click.option(
    "--kv-events-dp",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="DP ranks to subscribe to (rank N at port + N).",
)
@click.option(
    "--events-output",
    type=click.Path(dir_okay=False),
    default=None,
    help="Where to write the event stream (default: OUTPUT.kvev).",
)
@click.option(
    "--finalize",
    "--repair",
    "finalize",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE",
    help="Scrape nothing: turn the journal of a killed recording (OUT.partial, cut at any "
    "byte) into the OpenMetrics file OUT (or --output), then remove it; a recording cut "
    "short (a copy, a full disk) is rewritten in place (or into --output). The last, "
    "possibly partial scrape is dropped; promtool reads the result. Anything that is not "
    "a recording (not a regular file, or not beginning like one) is refused and left as it "
    "is, and the result replaces its input only once it reads as a recording.",
)
def record(
    targets: tuple[str, ...],
    interval: float,
    duration: float,
    output: str | None,
    job: str,
    scrape_timeout: float,
    kv_events: str | None,
    kv_events_replay: str | None,
    kv_events_dp: int,
    events_output: str | None,
    finalize: str | None,
) -> None:
    """Record targets' /metrics into an OpenMetrics file for `analyze` or promtool backfill."""
    from kvoffload.kvevents.eventfile import open_writer
    from kvoffload.recording.openmetrics import Recording
    from kvoffload.sidecar.service import target_name

    if finalize is not None:
        _finalize(finalize, targets, output)
        return
    if not targets or output is None:
        raise InputError("record needs --target URL and -o/--output FILE")
    pairs = [(url, target_name(url)) for url in targets]
    recording = Recording(output, job=job)
    events_path = events_output or output + ".kvev"
    events_fh = events_writer = None
    if kv_events:
        try:
            events_fh, events_writer = open_writer(events_path)
        except InputError:
            recording.discard()  # nothing recorded: no journal left to block the next run
            raise
    events = (kv_events, kv_events_replay, kv_events_dp) if kv_events else None
    # SIGTERM (a pod or a driver stopping it) closes the recording like Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    failures = 0
    events_failed: OSError | None = None
    try:
        failures = _record_with_progress(
            pairs, interval, duration, recording, scrape_timeout, events, events_writer
        )
    finally:
        events_failed = _close(recording, events_fh, output)
    click.echo(f"wrote {recording.scrapes} scrapes to {output} ({failures} failed)", err=True)
    if events_failed is not None:
        raise InputError(
            f"{events_path}: {events_failed.strerror}: the KV events written before it stay"
        )
    if events_writer is not None:
        click.echo(f"wrote {events_writer.messages} KV-event messages to {events_path}", err=True)
    if recording.scrapes == 0:
        raise InputError("no scrape succeeded: the recording is empty")


def _finalize(finalize: str, targets: tuple[str, ...], output: str | None) -> None:
    """`--finalize`: turn a journal (or a cut recording) into a whole one, scraping nothing."""
    from kvoffload.recording.openmetrics import JOURNAL_SUFFIX
    from kvoffload.recording.repair import repair

    if targets:
        raise InputError("--finalize/--repair scrapes nothing: give no --target")
    journal = finalize.endswith(JOURNAL_SUFFIX)
    if output is None:
        output = finalize[: -len(JOURNAL_SUFFIX)] if journal else finalize
    scrapes = repair(finalize, output)
    if not journal or os.path.abspath(output) == os.path.abspath(finalize):
        click.echo(f"wrote {scrapes} timestamps to {output}", err=True)
        return
    try:
        os.unlink(finalize)
    except OSError as exc:
        raise InputError(f"wrote {output}; cannot remove {finalize}: {exc.strerror}") from None
    click.echo(f"wrote {scrapes} scrapes to {output}; removed {finalize}", err=True)


def _record_with_progress(
    pairs: list[tuple[str, str]],
    interval: float,
    duration: float,
    recording: Recording,
    scrape_timeout: float,
    events: tuple[str, str | None, int] | None,
    events_writer: EventFileWriter | None,
) -> int:
    """Run the record loop, showing its progress on a terminal; the failed scrapes' count."""
    import asyncio

    from kvoffload.recording.loop import record_targets

    # On a terminal: scrapes written and failed as it goes (the final line is the caller's).
    progress = Progress(every=0.5)
    failed = [0]

    def warn(msg: str) -> None:
        failed[0] += 1  # record_targets warns once per failed scrape
        show()
        progress.note(f"kvoffload: warning: {msg}")

    def show() -> None:
        progress.update(
            f"recording {len(pairs)} target(s) every {interval:g} s: {recording.scrapes:,} "
            f"scrapes written, {failed[0]:,} failed, {format_seconds(progress.elapsed)} of "
            f"{format_seconds(duration)}"
        )

    async def run() -> int:
        task = asyncio.ensure_future(
            record_targets(
                pairs, interval, duration, recording, scrape_timeout, warn, events, events_writer
            )
        )
        while not task.done():
            show()
            await asyncio.wait({task}, timeout=progress.every)
        return task.result()

    try:
        return asyncio.run(run())
    except KeyboardInterrupt:
        progress.clear()
        click.echo("kvoffload: interrupted; closing the recording", err=True)
        return failed[0]
    finally:
        progress.clear()


def _close(recording: Recording, events_fh: BinaryIO | None, output: str) -> OSError | None:
    """Close the event file and the recording; the event file's error on closing, if any."""
    events_failed = None
    if events_fh is not None:
        try:
            events_fh.close()
        except OSError as exc:  # disk full: the events written whole stay readable
            events_failed = exc
    try:
        recording.close()
    except KeyboardInterrupt:
        # A second signal while the journal is rewritten: the journal is whole; keep it.
        click.echo(
            f"kvoffload: interrupted while writing {output}; the recording is in "
            f"{recording.journal} (`kvoffload record --finalize "
            f"{recording.journal}` finishes it)",
            err=True,
        )
        sys.exit(130)
    return events_failed
