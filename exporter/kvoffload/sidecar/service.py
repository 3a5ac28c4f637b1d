"""The sidecar's engine: one scrape loop per target feeding one bounded window.

A failing target is marked down with its one-line error; the others go on.
Only KV-event state is saved (`state_dir`, docs/sizing.md), since vLLM's counters are cumulative."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Protocol, TypeVar
from urllib.parse import urlsplit

import aiohttp

from kvoffload.analysis.analyze import (
    Settings,
    add_before_after,
    add_replica_evidence,
    analyze_group,
)
from kvoffload.analysis.result import GroupAnalysis
from kvoffload.analysis.stability import AdviceHolder, StabilityRules
from kvoffload.analysis.timeline import TierTimeline
from kvoffload.analysis.window import GroupKey, Window
from kvoffload.errors import InputError
from kvoffload.ingest.catalog import WANTED_FAMILIES, Extract, extract, wanted
from kvoffload.ingest.hostmemory import HostMemory, read_host_memory
from kvoffload.ingest.parse import Limits
from kvoffload.ingest.scrape import OFF_LOOP_BYTES, Scrape, ScrapeLimitError, off_loop, scrape
from kvoffload.kvevents import persist, statefile
from kvoffload.kvevents.eventfile import RawMessage
from kvoffload.kvevents.state import TargetEvents
from kvoffload.kvevents.subscriber import Subscriber, cancel_all

log = logging.getLogger("kvoffload")
_T = TypeVar("_T")
VLLM_KEEP_ALIVE_SECONDS = 5.0
# vLLM's container memory is read at most this often (it moves with the tier's size, rarely).
HOST_MEMORY_SECONDS = 15.0


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
    # Samples dropped for unbelievable numbers (ingest.scrape.read_numbers), by reason, and
    # those outside their catalog row's range (reason "range": catalog.extract).
    rejected: dict[str, int] = field(default_factory=dict)
    # Scrapes failed for going over a limit (ScrapeLimits), by limit.
    limit_exceeded: dict[str, int] = field(default_factory=dict)
    # Counter series seen to go down (analysis.window.Window.resets), by reason.
    counter_resets: dict[str, int] = field(default_factory=dict)

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
            "limit_exceeded": dict(self.limit_exceeded),
            "counter_resets": dict(self.counter_resets),
        }


class EventCounts(Protocol):
    """What /metrics reads of a target's KV-event state (`kvevents.state.TargetEvents`)."""

    @property
    def decode_errors(self) -> int: ...

    def messages(self) -> int: ...

    def lost_messages(self) -> int: ...

    def unseen_before_start(self) -> int: ...

    def sample_rate_now(self) -> float: ...

    def evicted_blocks(self) -> dict[str, int]: ...

    def sequence_anomalies(self) -> dict[str, int]: ...

    def publisher_restarts(self) -> int: ...

    def refused_events(self) -> dict[str, int]: ...


class Service(Protocol):
    """What the HTTP face (`sidecar.http`, `sidecar.metrics`, the page) reads.

    Either the `Sidecar` scraping its targets, or the fleet read back from Prometheus
    (`fleet.service`)."""

    targets: list[TargetState]
    subscribers: list[Subscriber]
    # The vLLM container's memory as last read (None: not read, e.g. the fleet from Prometheus).
    host_memory: HostMemory | None

    @property
    def events(self) -> Mapping[str, EventCounts]: ...

    def groups(self) -> list[GroupAnalysis]: ...

    def status(self) -> dict[str, object]: ...

    def snapshot(self) -> Service:
        """The service at this moment, safe to read in another thread.

        The HTTP face renders /metrics and the status JSON off the loop while it goes on."""
        ...

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


@dataclass(frozen=True)
class ScrapeLimits:
    """What one scrape of one target may hold (0: no limit), like Prometheus' `sample_limit`.

    Over one, that scrape fails and other targets are untouched (docs/exporter.md, `--scrape.*`)."""

    # The defaults pass a real vLLM with room to spare and bound one scrape's event-loop time.

    samples: int = 20_000
    groups: int = 64  # model_name × engine
    label_value_bytes: int = 4096

    def parse(self) -> Limits:
        return Limits(self.samples, self.label_value_bytes)


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
    limits: ScrapeLimits = field(default_factory=ScrapeLimits)
    # None: every scrape's judgement is published as it is (analyze, tests of the judgement)
    stability: StabilityRules | None = None
    # vLLM's container memory (ingest.hostmemory): a cgroup directory, "auto" or "off".
    host_memory: str = "auto"


class Sidecar:
    def __init__(self, config: SidecarConfig) -> None:
        if not config.targets:
            raise InputError("no --target given")
        self.config = config
        self.targets = [TargetState(url, target_name(url)) for url in config.targets]
        names = [t.name for t in self.targets]
        if len(set(names)) != len(names):
            raise InputError(f"two targets share an instance name: {', '.join(names)}")
        self.window = Window(config.window_seconds, timeline=TierTimeline())
        self._parse_limits = config.limits.parse()
        self.started = time.time()
        by_url = {t.url: t.name for t in self.targets}
        self._by_name = {t.name: t for t in self.targets}
        self.events: dict[str, TargetEvents] = {}
        self.subscribers: list[Subscriber] = []
        # Counter totals per group when its events started: the curve's denominator runs
        # from there.
        self.event_baselines: dict[GroupKey, dict[str, float]] = {}
        self._state_lock: IO[bytes] | None = None
        if config.state_dir and config.kv_events:
            # Two sidecars on one directory would overwrite each other's files in turn.
            try:
                self._state_lock = statefile.lock_directory(Path(config.state_dir))
            except statefile.DirectoryInUse as exc:
                raise InputError(f"--state-dir: {exc}") from None
            except OSError as exc:
                raise InputError(f"--state-dir {config.state_dir}: {exc.strerror or exc}") from None
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
                        on_rejected=state.reject_sequence,
                    )
                )
        self._saved_generation: dict[str, int] = {}
        self._generation = 0
        # Each group's analysis as of its latest scrape (before the replicas' comparison),
        # made when the scrape lands: the work is spread over the interval as the scrapes
        # are, not done for every group at once when /metrics is asked for.
        self._analyses: dict[GroupKey, GroupAnalysis] = {}
        self._holders: dict[GroupKey, AdviceHolder] = {}  # the stability rules' state
        self._unanalyzed: set[GroupKey] = set()  # its analysis failed at the scrape: retried
        self._events_seen: dict[GroupKey, int] = {}  # the events' generation it was made with
        self._event_generation: dict[str, int] = {}  # per target with KV events
        self._analyses_changed = True
        self._published: list[GroupAnalysis] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self.host_memory: HostMemory | None = None

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        # vLLM's server closes a connection idle for 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE): scraping
        # less often, each scrape opens a new one anyway, and the pool would only hold the dead
        # ones (with 1,000 targets, ~2,000 sockets and ~10,000 objects for the collector).
        keep_alive = self.config.interval_seconds <= VLLM_KEEP_ALIVE_SECONDS
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=64, force_close=not keep_alive)
        )
        for i, target in enumerate(self.targets):
            # Spread first scrapes over the interval so many targets do not scrape in lockstep.
            offset = self.config.interval_seconds * i / max(len(self.targets), 1)
            self._tasks.append(asyncio.create_task(self._loop(target, offset)))
        for sub in self.subscribers:
            self._tasks.append(asyncio.create_task(self._subscribe(sub)))
        if self.config.state_dir and self.events:
            self._tasks.append(asyncio.create_task(self._save_loop()))
        if self.config.host_memory != "off":
            self._tasks.append(asyncio.create_task(self._host_memory_loop()))

    async def _host_memory_loop(self) -> None:
        """Read vLLM's container memory now and then, in a thread.

        Reading smaps_rollup of a process with a large pinned tier walks its pages (tens of ms)."""
        every = max(self.config.interval_seconds, HOST_MEMORY_SECONDS)
        while True:
            reading = await asyncio.to_thread(read_host_memory, self.config.host_memory)
            given = self.config.settings.memory_limit_bytes
            reading = replace(reading, given_limit_bytes=given)
            self.host_memory = reading
            # The OOM check of the next analyses reads it from the settings.
            self.config.settings = replace(self.config.settings, host_memory=reading)
            await asyncio.sleep(every)

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

    def _on_event_message(
        self, name: str, state: TargetEvents
    ) -> Callable[[RawMessage], Iterator[None]]:
        # Steps of bounded work: the subscriber gives the event loop a turn between them.
        def handle(msg: RawMessage) -> Iterator[None]:
            if (yield from state.ingest_message_steps(msg)):
                self._generation += 1
                self._event_generation[name] = self._event_generation.get(name, 0) + 1

        return handle

    async def stop(self) -> None:
        await cancel_all(self._tasks)
        if self._session is not None:
            await self._session.close()
        # SIGTERM (a pod stopping) and Ctrl-C come here: the last messages are kept too.
        if self.config.state_dir:
            for name in self.events:
                self._save(name)
        if self._state_lock is not None:
            self._state_lock.close()  # the next sidecar on this directory may start
            self._state_lock = None

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
                limits=self._parse_limits,
            )
            for reason, count in result.rejected.items():
                target.rejected[reason] = target.rejected.get(reason, 0) + count
            if result.payload_bytes > OFF_LOOP_BYTES:  # parsed in a thread: read there too
                ex = await off_loop(self._extract, target, result)
            else:
                ex = self._extract(target, result)
            if ex.out_of_range:
                target.rejected["range"] = target.rejected.get("range", 0) + ex.out_of_range
            self.window.update(ex)
        except InputError as exc:
            if isinstance(exc, ScrapeLimitError):
                target.limit_exceeded[exc.limit] = target.limit_exceeded.get(exc.limit, 0) + 1
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
        resets = self.window.resets.get(target.name)
        if resets:
            target.counter_resets = dict(resets)
        self._forget(self.window.forget(target.name, ex.timestamp))
        self._note_event_baselines(target.name)
        self._generation += 1
        touched = {(i, m) for _k, i, m, _e in ex.counters} | {(i, m) for _k, i, m, _e in ex.gauges}
        touched |= {(i, m) for _k, i, m, _e in ex.unknown}
        self._unanalyzed |= touched
        try:
            self._analyze(touched)
        except Exception:  # left for groups(), where it fails as it always did
            log.exception("analyzing %s", target.name)

    def _extract(self, target: TargetState, result: Scrape) -> Extract:
        """The scrape in the catalog's terms, checked: vLLM's, within the group limit."""
        ex = extract(result.exposition, result.timestamp, target.name)
        if not ex.counters and not ex.gauges and not ex.unknown:
            raise InputError(
                f"{target.url}: no vLLM metrics in the payload "
                "(is this vLLM's /metrics? is --disable-log-stats set?)"
            )
        self._check_groups(target, ex)
        return ex

    def _check_groups(self, target: TargetState, ex: Extract) -> None:
        """Fail the scrape when it holds more model_name × engine groups than allowed."""
        limit = self.config.limits.groups
        if not limit:
            return
        groups = {(m, e) for _k, _i, m, e in ex.counters}
        if len(groups) <= limit:  # (the common case: the counters name every group)
            groups.update((m, e) for _k, _i, m, e in ex.gauges)
            groups.update((m, e) for _k, _i, m, e in ex.unknown)
        if len(groups) > limit:
            raise ScrapeLimitError(
                "groups",
                f"{target.url}: more than {limit:,} model_name × engine groups "
                "(--scrape.group-limit)",
            )

    def _forget(self, groups: list[GroupKey]) -> None:
        """Groups the window forgot (not seen for a window): out of every view."""
        for group in groups:
            if self._analyses.pop(group, None) is not None:
                self._analyses_changed = True
            self._unanalyzed.discard(group)
            self._events_seen.pop(group, None)
            self.event_baselines.pop(group, None)
            self._holders.pop(group, None)

    def _note_event_baselines(self, name: str) -> None:
        state = self.events.get(name)
        if state is None or not state.messages():
            return
        for group in self.window.groups():
            if group[0] == name and group not in self.event_baselines:
                latest = self.window.latest(group)
                if latest is not None:
                    self.event_baselines[group] = latest

    # -- analysis -----------------------------------------------------------------------------
    def reanalyze(self) -> None:
        """Analyze every group of the window anew.

        For a window built elsewhere and put in place; groups are otherwise analyzed as scrapes
        land."""
        self._analyze(set(self.window.groups()))

    def _analyze(self, groups: set[GroupKey]) -> None:
        """(Re-)analyze these groups as analyze_groups does, without the replicas' comparison.

        Each reads only its own part of the window and its target's events."""
        by_name = self._by_name
        for group in sorted(groups):
            entry = analyze_group(
                self.window,
                group,
                self.config.settings,
                events=self.events,
                event_baselines=self.event_baselines,
            )
            if entry is None:
                self._analyses.pop(group, None)
            else:
                # Published as it is while its target is up (groups() copies it to flag it
                # stale); None for a down target's, as the replicas' comparison sees them.
                target = by_name.get(group[0])
                entry.stale = None if target is not None and not target.up else False
                self._analyses[group] = entry
                self._events_seen[group] = self._event_generation.get(group[0], 0)
            self._unanalyzed.discard(group)
            self._analyses_changed = True

    # -- views ------------------------------------------------------------------------------
    def groups(self) -> list[GroupAnalysis]:
        """Analysis of every group as of its target's latest scrape, the replicas compared.

        What it returns never changes, so the HTTP face reads it in a thread while scrapes go on."""
        # A target going down or back gets a flagged copy, never an edit in place.
        moved = {
            g
            for g, seen in self._events_seen.items()
            if g[0] in self._event_generation and seen != self._event_generation[g[0]]
        }
        if moved or self._unanalyzed:
            self._analyze(moved | self._unanalyzed)
        # Figures of a target we cannot read any more describe the past: /metrics drops
        # them (Prometheus sees them go stale); the JSON keeps them, flagged.
        down = {t.name for t in self.targets if not t.up}
        if self._analyses_changed:
            entries = [self._analyses[g] for g in sorted(self._analyses)]
            add_replica_evidence(entries, self.config.settings, copy_changed=True)
            add_before_after(self.window, entries, self.config.settings, copy_changed=True)
            entries = [self._stable(e) for e in entries]
            self._published = [_flagged(e, e.instance in down) for e in entries]
            self._analyses_changed = False
        elif any(g.stale != (g.instance in down) for g in self._published):
            self._published = [_flagged(g, g.instance in down) for g in self._published]
        return self._published

    def _stable(self, entry: GroupAnalysis) -> GroupAnalysis:
        """The entry with its advice as the stability rules publish it.

        A copy: the fresh judgement stays in the cache, so each scrape is judged against the same
        holder."""
        rules = self.config.stability
        now = self.window.last_time(entry.key)
        if rules is None or now is None:
            return entry
        holder = self._holders.setdefault(entry.key, AdviceHolder(rules))
        rec = holder.update(
            entry.recommendation, now, entry.offloading, entry.figures.get("cpu_capacity_bytes")
        )
        return replace(entry, recommendation=rec)

    @property
    def ready(self) -> bool:
        return any(t.last_success_timestamp is not None for t in self.targets)

    def snapshot(self) -> SidecarView:
        return SidecarView(
            [_target_copy(t) for t in self.targets],
            {name: EventFigures.of(state) for name, state in self.events.items()},
            self.groups(),
            [s.state.to_json() for s in self.subscribers],
            self.config.window_seconds,
            self.config.interval_seconds,
            self.ready,
            self.host_memory,
        )

    def status(self) -> dict[str, object]:
        return self.snapshot().status()


def _flagged(group: GroupAnalysis, stale: bool) -> GroupAnalysis:
    """`group` with its stale flag, as a copy when the flag changes (it may be being read)."""
    if group.stale is stale:
        return group
    out = _shallow_copy(group)
    out.stale = stale
    return out


def _shallow_copy(obj: _T) -> _T:
    """copy.copy of a plain dataclass instance, without copy's generic (and slow) path."""
    out = object.__new__(type(obj))
    out.__dict__.update(obj.__dict__)
    return out


def _target_copy(target: TargetState) -> TargetState:
    out = _shallow_copy(target)
    out.rejected = dict(target.rejected)
    out.limit_exceeded = dict(target.limit_exceeded)
    out.counter_resets = dict(target.counter_resets)
    return out


@dataclass(frozen=True)
class EventFigures:
    """A target's KV-event counts at one moment (the `EventCounts` that /metrics reads)."""

    decode_errors: int
    _messages: int
    _lost_messages: int
    _unseen_before_start: int
    _sample_rate_now: float
    _evicted_blocks: dict[str, int] = field(default_factory=dict)
    _sequence_anomalies: dict[str, int] = field(default_factory=dict)
    _publisher_restarts: int = 0
    _refused_events: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, state: EventCounts) -> EventFigures:
        """The counts of a target's KV-event state as they are now."""
        return cls(
            state.decode_errors,
            state.messages(),
            state.lost_messages(),
            state.unseen_before_start(),
            state.sample_rate_now(),
            state.evicted_blocks(),
            state.sequence_anomalies(),
            state.publisher_restarts(),
            state.refused_events(),
        )

    def messages(self) -> int:
        return self._messages

    def lost_messages(self) -> int:
        return self._lost_messages

    def unseen_before_start(self) -> int:
        return self._unseen_before_start

    def sample_rate_now(self) -> float:
        return self._sample_rate_now

    def evicted_blocks(self) -> dict[str, int]:
        return self._evicted_blocks

    def sequence_anomalies(self) -> dict[str, int]:
        return self._sequence_anomalies

    def publisher_restarts(self) -> int:
        return self._publisher_restarts

    def refused_events(self) -> dict[str, int]:
        return self._refused_events


class SidecarView:
    """The sidecar at one moment (`Sidecar.snapshot`).

    It holds copies and never-changed analyses: a reader thread never sees a scrape half-landed."""

    def __init__(
        self,
        targets: list[TargetState],
        events: dict[str, EventFigures],
        groups: list[GroupAnalysis],
        kv_events: list[dict[str, object]],
        window_seconds: float,
        interval_seconds: float,
        ready: bool,
        host_memory: HostMemory | None = None,
    ) -> None:
        self.targets = targets
        self.host_memory = host_memory
        self.events = events
        self.subscribers: list[Subscriber] = []
        self._groups = groups
        self._kv_events = kv_events
        self._window_seconds = window_seconds
        self._interval_seconds = interval_seconds
        self._ready = ready

    def groups(self) -> list[GroupAnalysis]:
        return self._groups

    @property
    def ready(self) -> bool:
        return self._ready

    def snapshot(self) -> SidecarView:
        return self

    def status(self) -> dict[str, object]:
        return {
            "groups": [g.to_json() for g in self._groups],
            "targets": [t.to_json() for t in self.targets],
            "kv_events": self._kv_events,
            "window_seconds": self._window_seconds,
            "interval_seconds": self._interval_seconds,
            "host_memory": None if self.host_memory is None else self.host_memory.to_json(),
            "generated_at": time.time(),
        }

    async def start(self) -> None:
        raise RuntimeError("a snapshot of the sidecar does not run")

    async def stop(self) -> None:
        pass
