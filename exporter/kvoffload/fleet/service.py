"""`serve --prometheus`: the sidecar's HTTP face for a whole fleet, read back from Prometheus.

Every `interval_seconds` it runs what `analyze --prometheus` runs and publishes the same output.
How it slides and fails: docs/architecture.md ("A whole fleet from Prometheus").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from kvoffload.analysis.analyze import Settings
from kvoffload.analysis.result import GroupAnalysis
from kvoffload.errors import InputError
from kvoffload.fleet.promapi import PrometheusAPI, PromStopped, printable
from kvoffload.fleet.runs import analyze_from_prometheus
from kvoffload.fleet.source import FleetReader, ReadStats
from kvoffload.fleet.summary import FleetSummary
from kvoffload.ingest.hostmemory import HostMemory
from kvoffload.kvevents.state import TargetEvents
from kvoffload.kvevents.subscriber import Subscriber, cancel_all
from kvoffload.sidecar.service import TargetState

log = logging.getLogger("kvoffload")

T = TypeVar("T")


async def in_daemon_thread(fn: Callable[..., T], *args: object) -> T:
    """`asyncio.to_thread`, but in a daemon thread of its own.

    Why: the default executor's threads are joined at exit.
    One stuck in a read would keep a stopped process alive."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return  # cancelled: nobody waits for it any more
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # handed to the awaiting task
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(settle, None, exc)
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, result, None)

    threading.Thread(target=run, name="kvoffload-fleet-read", daemon=True).start()
    return await future


@dataclass
class FleetConfig:
    range_seconds: float = 3600.0  # the sliding range: the last this many seconds
    fixed: tuple[float, float] | None = None  # (start, end): a fixed range instead
    selector: str | None = None
    step: float | None = None
    interval_seconds: float = 60.0
    settings: Settings = field(default_factory=Settings)

    def time_range(self, now: float) -> tuple[float, float]:
        return self.fixed or (now - self.range_seconds, now)


@dataclass
class FleetRead:
    """One read of the fleet, analyzed."""

    groups: list[GroupAnalysis]  # need order; instances that failed left out
    summary: FleetSummary
    instances: list[str]
    errors: dict[str, str]  # instance → its one-line error
    warnings: list[str]
    start: float
    end: float
    scrapes: int
    duration_seconds: float


class _Stopped(Exception):
    """Raised in the reading thread (through its progress hook) once the service stops."""


def read_fleet(
    reader: FleetReader, settings: Settings, progress: Callable[[ReadStats], None]
) -> FleetRead:
    """Read and analyze what `reader` covers, as `analyze --prometheus` does, in this thread.

    The server's other threads make forking worker processes unsafe."""
    started = time.monotonic()
    result = analyze_from_prometheus(reader, settings, jobs=1, progress=progress)
    errors = dict(result.stats.errors)
    return FleetRead(
        result.groups,
        result.summary,
        sorted({g.instance for g in result.groups} | set(errors)),
        errors,
        result.stats.warning_lines(),
        reader.start,
        reader.end,
        result.scrapes,
        time.monotonic() - started,
    )


# The read runs in a daemon thread and its result is swapped in whole, so the loop keeps
# answering and a stuck server cannot hold a stop (SIGTERM aborts the question in flight).
class FleetService:
    """The interface of `sidecar.service.Service`, fed by reads from Prometheus."""

    def __init__(self, config: FleetConfig, api: PrometheusAPI) -> None:
        self.config = config
        self.api = api
        self._reader(time.time())  # a bad selector, step or range fails here, not every read
        self.targets: list[TargetState] = []
        self.events: dict[str, TargetEvents] = {}  # no KV events: Prometheus does not hold them
        self.subscribers: list[Subscriber] = []
        # A fleet's containers are not this process's to read.
        self.host_memory: HostMemory | None = None
        self.last: FleetRead | None = None  # the last good read
        self._groups: list[GroupAnalysis] = []
        self.reads = 0
        self.failures = 0  # reads that failed as a whole
        self.last_error: str | None = None  # of the last read, when it failed as a whole
        self._stopping = threading.Event()
        self._task: asyncio.Task[None] | None = None

    def _reader(self, now: float) -> FleetReader:
        start, end = self.config.time_range(now)
        return FleetReader(self.api, start, end, self.config.selector, self.config.step)

    def _progress(self, _stats: ReadStats) -> None:
        if self._stopping.is_set():
            raise _Stopped  # between questions: the thread ends soon after a stop

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        self._stopping.clear()
        self.api.reopen()  # (asking again after a stop)
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        self._stopping.set()
        self.api.abort()  # the question being asked ends now, whatever the server does
        if self._task is not None:
            await cancel_all([self._task])
        self.api.close()

    async def _loop(self) -> None:
        while True:
            started = time.monotonic()
            await self.refresh()
            await asyncio.sleep(
                max(0.0, self.config.interval_seconds - (time.monotonic() - started))
            )

    async def refresh(self) -> None:
        """One read; what it found replaces what is published, or its error is shown."""
        self.reads += 1
        try:
            read = await in_daemon_thread(
                read_fleet, self._reader(time.time()), self.config.settings, self._progress
            )
        except (_Stopped, PromStopped):
            return
        except InputError as exc:
            self._failed(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            return
        except Exception as exc:  # never let one read kill the service
            log.exception("unexpected error reading the fleet from %s", self.api.base)
            self._failed(f"{self.api.base}: internal error: {type(exc).__name__}: {printable(exc)}")
            return
        self._publish(read)

    # A read failed as a whole: the last good analysis stays, every target down, its groups stale.
    def _failed(self, error: str) -> None:
        self.failures += 1
        self.last_error = error
        log.warning("reading the fleet failed: %s", error)
        for target in self.targets:
            target.scrapes += 1
            target.failures += 1
            target.up = False
            target.last_error = error
        for group in self._groups:
            group.stale = True

    def _publish(self, read: FleetRead) -> None:
        finished = time.time()
        known = {t.name: t for t in self.targets}
        targets: list[TargetState] = []
        for name in read.instances:
            target = known.get(name) or TargetState(self.api.base, name)
            target.scrapes += 1
            error = read.errors.get(name)
            target.up = error is None
            target.last_error = error
            if error is None:
                target.last_success_timestamp = finished
            else:
                target.failures += 1
            targets.append(target)
        for group in read.groups:
            group.stale = False
        # An instance that failed this time keeps its last figures, flagged stale (as the
        # scraping sidecar keeps a down target's): the JSON shows them, /metrics drops them.
        kept = [g for g in self._groups if g.instance in read.errors]
        for group in kept:
            group.stale = True
        # Said once, and again when reads recover or the instances change; else at debug.
        changed = self.last is None or self.last_error is not None
        changed = changed or [t.name for t in self.targets] != read.instances
        self.targets = targets
        self._groups = read.groups + kept
        self.last = read
        self.last_error = None
        log.log(
            logging.INFO if changed else logging.DEBUG,
            "read %d instance(s), %d scrape(s) from %s in %.1f s%s",
            len(read.instances),
            read.scrapes,
            self.api.base,
            read.duration_seconds,
            f"; {len(read.errors)} failed" if read.errors else "",
        )

    # -- views ------------------------------------------------------------------------------
    def groups(self) -> list[GroupAnalysis]:
        return self._groups

    @property
    def ready(self) -> bool:
        return self.last is not None

    @property
    def last_read_seconds(self) -> float | None:
        """How long the last good read took (None before one)."""
        return self.last.duration_seconds if self.last is not None else None

    def snapshot(self) -> FleetService:
        """Itself, since a read replaces the published targets and groups whole.

        The lists are never edited in place, so the HTTP face reads them from a thread as they
        are."""
        return self

    def status(self) -> dict[str, object]:
        read = self.last
        first, last = self.config.time_range(0.0)
        return {
            "groups": [g.to_json() for g in self._groups],
            "targets": [t.to_json() for t in self.targets],
            "kv_events": [],
            "fleet": read.summary.to_json() if read else None,
            "errors": [
                {"instance": t.name, "error": t.last_error} for t in self.targets if t.last_error
            ],
            "prometheus": {
                "url": self.api.base,
                "selector": self.config.selector,
                "step_seconds": self.config.step,
                "sliding": self.config.fixed is None,
                # the range of the last good read
                "start": read.start if read else None,
                "end": read.end if read else None,
                "reads": self.reads,
                "failures": self.failures,
                "last_error": self.last_error,
                "last_read_seconds": read.duration_seconds if read else None,
                "scrapes": read.scrapes if read else 0,
                "warnings": read.warnings if read else [],
            },
            "window_seconds": last - first,
            "interval_seconds": self.config.interval_seconds,
            "generated_at": time.time(),
        }
