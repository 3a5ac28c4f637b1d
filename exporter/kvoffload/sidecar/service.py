"""The sidecar's engine: one scrape loop per target feeding one bounded window.

The counters need no saving: vLLM's are cumulative, so a restarted sidecar has every rate back
after two scrapes. The KV-event state does (it is built from every message since the start):
with `state_dir` it is saved every `state_interval_seconds` and at shutdown, and a restarted
sidecar resumes from it, asking vLLM to replay what it missed meanwhile. A failing target is
marked down with its one-line error; the others go on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import aiohttp

from kvoffload.analysis.analyze import Settings, analyze_groups
from kvoffload.analysis.result import GroupAnalysis
from kvoffload.analysis.window import GroupKey, Window
from kvoffload.errors import InputError
from kvoffload.ingest.catalog import WANTED_FAMILIES, extract, wanted
from kvoffload.ingest.scrape import scrape
from kvoffload.kvevents import persist
from kvoffload.kvevents.eventfile import RawMessage
from kvoffload.kvevents.state import TargetEvents
from kvoffload.kvevents.subscriber import Subscriber, cancel_all

log = logging.getLogger("kvoffload")


def target_name(url: str) -> str:
    """host:port of a target URL, the way Prometheus names an instance."""
    parts = urlsplit(url)
    if not parts.scheme or not parts.hostname:
        raise InputError(f"{url}: not an http(s) URL")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    return f"{host}:{port}"


@dataclass
class TargetState:
    url: str
    name: str
    up: bool = False
    last_error: str | None = None
    last_duration_seconds: float | None = None
    last_success_timestamp: float | None = None
    scrapes: int = 0
    failures: int = 0
    payload_bytes: int = 0
    # Samples dropped for unbelievable numbers (ingest.scrape.read_numbers), by reason.
    rejected: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "url": self.url,
            "instance": self.name,
            "up": self.up,
            "last_error": self.last_error,
            "last_scrape_duration_seconds": self.last_duration_seconds,
            "last_success_timestamp": self.last_success_timestamp,
            "scrapes": self.scrapes,
            "failures": self.failures,
            "payload_bytes": self.payload_bytes,
            "samples_rejected": dict(self.rejected),
        }


class Service(Protocol):
    """What the HTTP face (`sidecar.http`, `sidecar.metrics`, the page) reads: the `Sidecar`
    scraping its targets, or the fleet read back from Prometheus (`sidecar.fleet`)."""

    targets: list[TargetState]
    events: dict[str, TargetEvents]
    subscribers: list[Subscriber]

    def groups(self) -> list[GroupAnalysis]: ...

    def status(self) -> dict[str, object]: ...

    @property
    def ready(self) -> bool: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True)
class KVEventsSource:
    """KV events of one target: vLLM's endpoint for DP rank 0 (rank N is at port + N)."""

    target: str  # the target URL it belongs to
    endpoint: str
    replay_endpoint: str | None = None
    dp_size: int = 1
    topic: str = ""


@dataclass
class SidecarConfig:
    targets: list[str]
    interval_seconds: float = 5.0
    window_seconds: float = 300.0
    timeout_seconds: float = 10.0
    max_payload_bytes: int = 16 * 2**20
    settings: Settings = field(default_factory=Settings)
    kv_events: list[KVEventsSource] = field(default_factory=list)
    kv_events_sample_rate: float = 1.0
    kv_events_sample_budget: int | None = None
    state_dir: str | None = None  # where the KV-event state survives restarts
    state_interval_seconds: float = 10.0


class Sidecar:
    def __init__(self, config: SidecarConfig) -> None:
        if not config.targets:
            raise InputError("no --target given")
        self.config = config
        self.targets = [TargetState(url, target_name(url)) for url in config.targets]
        names = [t.name for t in self.targets]
        if len(set(names)) != len(names):
            raise InputError(f"two targets share an instance name: {', '.join(names)}")
        self.window = Window(config.window_seconds)
        self.started = time.time()
        by_url = {t.url: t.name for t in self.targets}
        self.events: dict[str, TargetEvents] = {}
        self.subscribers: list[Subscriber] = []
        # Counter totals per group when its events started: the curve's denominator runs
        # from there.
        self.event_baselines: dict[GroupKey, dict[str, float]] = {}
        for source in config.kv_events:
            name = by_url.get(source.target)
            if name is None:
                raise InputError(f"--kv-events for {source.target}: no such --target")
            if name not in self.events:
                self.events[name] = self._restore(name)
            state = self.events[name]
            for rank in range(source.dp_size):
                engine = state.engines.get(rank)
                self.subscribers.append(
                    Subscriber(
                        source.endpoint,
                        rank,
                        self._on_event_message(name, state),
                        source.replay_endpoint,
                        source.topic,
                        resume_after_seq=engine.last_seq if engine else None,
                        resume_history_from_seq=engine.history_from_seq if engine else None,
                    )
                )
        self._saved_generation: dict[str, int] = {}
        self._generation = 0
        self._cache: tuple[int, list[GroupAnalysis]] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=64, force_close=False)
        )
        for i, target in enumerate(self.targets):
            # Spread first scrapes over the interval so many targets do not scrape in lockstep.
            offset = self.config.interval_seconds * i / max(len(self.targets), 1)
            self._tasks.append(asyncio.create_task(self._loop(target, offset)))
        for sub in self.subscribers:
            self._tasks.append(asyncio.create_task(self._subscribe(sub)))
        if self.config.state_dir and self.events:
            self._tasks.append(asyncio.create_task(self._save_loop()))

    async def _subscribe(self, sub: Subscriber) -> None:
        while True:  # a broken socket is reopened; the error stays visible meanwhile
            try:
                await sub.run()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never let one endpoint kill the sidecar
                sub.state.last_error = f"{sub.state.endpoint}: {type(exc).__name__}: {exc}"
                log.warning("kv events: %s", sub.state.last_error)
            await asyncio.sleep(1.0)

    def _on_event_message(self, name: str, state: TargetEvents) -> Callable[[RawMessage], None]:
        def handle(msg: RawMessage) -> None:
            if state.ingest_message(msg):
                self._generation += 1

        return handle

    async def stop(self) -> None:
        await cancel_all(self._tasks)
        if self._session is not None:
            await self._session.close()
        # SIGTERM (a pod stopping) and Ctrl-C come here: the last messages are kept too.
        if self.config.state_dir:
            for name in self.events:
                self._save(name)

    # -- the event state on disk ------------------------------------------------------------
    def _state_path(self, name: str) -> Path:
        assert self.config.state_dir is not None
        return persist.state_path(self.config.state_dir, name)

    def _restore(self, name: str) -> TargetEvents:
        fresh = TargetEvents(self.config.kv_events_sample_rate, self.config.kv_events_sample_budget)
        if not self.config.state_dir:
            return fresh
        loaded = persist.load(self._state_path(name), name, fresh.sample_rate, fresh.sample_budget)
        if loaded is None:
            return fresh
        for key, totals in loaded.baselines.items():
            instance, model = json.loads(key)
            self.event_baselines[(instance, model)] = totals
        log.info(
            "kv events: %s: resumed from %s (%d messages)",
            name,
            self._state_path(name),
            loaded.saved_messages,
        )
        return loaded.events

    def _snapshot(self, name: str) -> persist.Snapshot:
        baselines = {
            json.dumps(list(group)): totals
            for group, totals in self.event_baselines.items()
            if group[0] == name
        }
        return persist.snapshot(self.events[name], name, baselines)

    def _save(self, name: str) -> None:
        try:
            persist.write_snapshot(self._state_path(name), self._snapshot(name))
        except OSError as exc:
            log.warning(
                "kv events: cannot save state to %s: %s",
                self._state_path(name),
                exc.strerror or exc,
            )

    async def _save_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.state_interval_seconds)
            for name in self.events:
                if self._saved_generation.get(name) == self._generation:
                    continue
                # The copy is taken here, between messages; packing and the disk write run
                # in a thread so a big state does not hold up scrapes or the subscribers.
                snap = self._snapshot(name)
                try:
                    await asyncio.to_thread(persist.write_snapshot, self._state_path(name), snap)
                except OSError as exc:
                    log.warning(
                        "kv events: cannot save state to %s: %s",
                        self._state_path(name),
                        exc.strerror or exc,
                    )
                    continue
                self._saved_generation[name] = self._generation

    async def _loop(self, target: TargetState, offset: float) -> None:
        await asyncio.sleep(offset)
        interval = self.config.interval_seconds
        next_at = time.monotonic()
        while True:
            await self.scrape_once(target)
            next_at += interval
            delay = next_at - time.monotonic()
            if delay < 0:  # we fell behind: skip missed slots instead of bursting
                next_at = time.monotonic()
                delay = 0
            await asyncio.sleep(delay)

    # -- one scrape -------------------------------------------------------------------------
    async def scrape_once(self, target: TargetState) -> None:
        assert self._session is not None
        target.scrapes += 1
        started = time.monotonic()
        try:
            result = await scrape(
                self._session,
                target.url,
                self.config.timeout_seconds,
                self.config.max_payload_bytes,
                wanted,
                WANTED_FAMILIES,
            )
            expo = result.exposition
            for reason, count in result.rejected.items():
                target.rejected[reason] = target.rejected.get(reason, 0) + count
            ex = extract(expo, result.timestamp, target.name)
            if not ex.counters and not ex.gauges:
                raise InputError(
                    f"{target.url}: no vLLM metrics in the payload "
                    "(is this vLLM's /metrics? is --disable-log-stats set?)"
                )
            self.window.update(ex)
        except InputError as exc:
            target.up = False
            target.failures += 1
            target.last_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.warning("scrape failed: %s", target.last_error)
            return
        except Exception as exc:
            target.up = False
            target.failures += 1
            target.last_error = f"{target.url}: internal error: {type(exc).__name__}: {exc}"
            log.exception("unexpected error scraping %s", target.url)
            return
        target.up = True
        target.last_error = None
        # Fetch, parse and ingest: what a scrape costs from request to updated figures.
        target.last_duration_seconds = time.monotonic() - started
        target.last_success_timestamp = result.fetched_at
        target.payload_bytes = result.payload_bytes
        self._note_event_baselines(target.name)
        self._generation += 1

    def _note_event_baselines(self, name: str) -> None:
        state = self.events.get(name)
        if state is None or not state.messages():
            return
        for group in self.window.groups():
            if group[0] == name and group not in self.event_baselines:
                latest = self.window.latest(group)
                if latest is not None:
                    self.event_baselines[group] = latest

    # -- views ------------------------------------------------------------------------------
    def groups(self) -> list[GroupAnalysis]:
        """Analysis of every group, recomputed only when a scrape landed since the last call."""
        if self._cache is None or self._cache[0] != self._generation:
            self._cache = (
                self._generation,
                analyze_groups(
                    self.window,
                    self.config.settings,
                    events=self.events,
                    event_baselines=self.event_baselines,
                ),
            )
        down = {t.name for t in self.targets if not t.up}
        for group in self._cache[1]:
            # Figures of a target we cannot read any more describe the past: /metrics drops
            # them (Prometheus sees them go stale); the JSON keeps them, flagged.
            group.stale = group.instance in down
        return self._cache[1]

    @property
    def ready(self) -> bool:
        return any(t.last_success_timestamp is not None for t in self.targets)

    def status(self) -> dict[str, object]:
        return {
            "groups": [g.to_json() for g in self.groups()],
            "targets": [t.to_json() for t in self.targets],
            "kv_events": [
                {
                    "endpoint": s.state.endpoint,
                    "rank": s.state.rank,
                    "connected": s.state.connected,
                    "last_seq": s.state.last_seq,
                    "replayed": s.state.replayed,
                    "rejected": s.state.rejected,
                    "last_error": s.state.last_error,
                }
                for s in self.subscribers
            ],
            "window_seconds": self.config.window_seconds,
            "interval_seconds": self.config.interval_seconds,
            "generated_at": time.time(),
        }
