"""`kvoffload record`: scrape targets on a schedule into a recording, in one event loop.

Optionally it also writes one target's KV-event stream next to it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp

from kvoffload.errors import InputError
from kvoffload.ingest.scrape import scrape
from kvoffload.kvevents.eventfile import EventFileWriter
from kvoffload.kvevents.subscriber import Subscriber, cancel_all
from kvoffload.recording.openmetrics import Recording, RecordingWriter


async def record_targets(
    targets: list[tuple[str, str]],  # (url, instance name)
    interval: float,
    duration: float,
    writer: Recording | RecordingWriter,
    scrape_timeout: float,
    warn: Callable[[str], None],
    events: tuple[str, str | None, int] | None = None,  # (endpoint, replay, dp size)
    events_writer: EventFileWriter | None = None,
) -> int:
    """Returns the number of failed scrapes; the writer holds the successful ones."""
    tasks: list[asyncio.Task[None]] = []
    if events is not None and events_writer is not None:
        endpoint, replay, dp_size = events
        for rank in range(dp_size):
            sub = Subscriber(endpoint, rank, events_writer.write, replay)
            tasks.append(asyncio.create_task(sub.run()))
    failures = 0
    deadline = time.monotonic() + duration
    try:
        async with aiohttp.ClientSession() as session:
            while True:
                started = time.monotonic()
                for url, name in targets:
                    try:
                        result = await scrape(session, url, scrape_timeout, check=False)
                    except InputError as exc:
                        failures += 1
                        warn(str(exc))
                        continue
                    try:
                        # A write that fails (disk full) raises InputError: it ends the
                        # recording, unlike a failed scrape.
                        writer.write_exposition(result.exposition, result.timestamp, name)
                    except ValueError:
                        # The wall clock stepped back (NTP): a recording's timestamps must not.
                        failures += 1
                        warn(f"{url}: the clock went back; scrape skipped")
                if started + interval > deadline:
                    break
                await asyncio.sleep(max(0.0, started + interval - time.monotonic()))
    finally:
        # Let messages already published land before closing the subscribers.
        if tasks:
            await asyncio.sleep(0.2)
        await cancel_all(tasks)
    return failures
