"""Per-series history with counter-reset handling, and increases over a sliding window.

Each counter keeps an *adjusted total* that only grows, as Prometheus' `increase()` without
extrapolation. So a window's increase is a subtraction, the same across a vLLM restart.
"""

from __future__ import annotations

import math
import operator
import struct
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kvoffload.analysis.intervals import FIT_SIZE, add_interval
from kvoffload.analysis.timeline import TierTimeline
from kvoffload.ingest.catalog import (
    GAUGE_KEYS,
    MAX_TIERS,
    OFFLOAD_COUNTERS,
    SUMMED_GAUGES,
    Extract,
)
from kvoffload.ingest.shapes import taker

OFFLOAD_KEYS = frozenset(OFFLOAD_COUNTERS)
_GAUGE_SET = frozenset(GAUGE_KEYS)
# Why a series first seen unknown is suspect when it turns up with a value.
_FIRST_UNKNOWN = "first seen with no value to believe: its first value is no increase to trust"

# (instance, model_name)
GroupKey = tuple[str, str]
# (counter key, instance, model_name, engine): an Extract's counter
CounterKey = tuple[str, str, str, str]


# Scrapes after an engine's restart in which one of its counters coming back lower is part
# of that restart, not a decrease to flag.
RESTART_SETTLES_SCRAPES = 2


class _SeriesState(NamedTuple):
    """A counter series' state, as its fields are named. `update` keeps it as a plain tuple in this
    order, which the cyclic garbage collector does not walk."""

    raw: float
    created: float | None
    adjusted: float
    seen_at: int  # scrape number that last contained the series


_State = tuple[float, float | None, float, int]


@dataclass(frozen=True)
class _GroupPlan:
    """Where a group's counter series are in a scrape of one layout."""

    take: Callable[[Sequence[Any]], tuple[Any, ...]]  # its values out of the scrape's, in order
    pairs: tuple[tuple[str, str], ...]  # (counter key, engine) of each
    keys: tuple[str, ...]
    engines: tuple[str, ...]
    offload: bool  # one of them is an offload counter


class _Latest:
    """A group's (counter key, engine, raw) of a scrape, made only when asked. Why:
    GroupStatic.latest reads it once per analysis, the window takes every scrape."""

    __slots__ = ("plan", "raws")

    def __init__(self, plan: _GroupPlan, raws: tuple[float, ...]) -> None:
        self.plan, self.raws = plan, raws

    def __iter__(self) -> Iterator[tuple[str, str, float]]:
        return zip(self.plan.keys, self.plan.engines, self.raws, strict=True)


def _learn_plan(layout: tuple[CounterKey, ...]) -> dict[GroupKey, _GroupPlan]:
    """Where each group's series are in a scrape whose counters come in `layout`'s order."""
    at: dict[GroupKey, list[int]] = {}
    for i, (_key, instance, model, _engine) in enumerate(layout):
        at.setdefault((instance, model), []).append(i)
    plan = {}
    for g, positions in at.items():
        pairs = tuple((layout[i][0], layout[i][3]) for i in positions)
        keys = tuple(key for key, _engine in pairs)
        plan[g] = _GroupPlan(
            taker(positions),
            pairs,
            keys,
            tuple(engine for _key, engine in pairs),
            any(key in OFFLOAD_KEYS for key in keys),
        )
    return plan


def _aligned(
    created: dict[CounterKey, float], layout: tuple[CounterKey, ...]
) -> list[float | None]:
    """Each counter's `_created` (None where it has none), in `layout`'s order. Fast path when both
    list the same series in the same order, as vLLM does."""
    if len(created) == len(layout) and tuple(created) == layout:
        return list(created.values())
    return list(map(created.get, layout))


def _states(columns: _Columns) -> Iterator[tuple[tuple[str, str], _State]]:
    """A group's series kept as columns, one (key, engine) and state at a time."""
    created = columns.created or (None,) * len(columns.plan.pairs)
    for pair, raw, c, adjusted in zip(
        columns.plan.pairs, columns.raws, created, columns.adjusted, strict=True
    ):
        yield pair, (raw, c, adjusted, columns.seen_at)


def _none(created: tuple[float | None, ...] | None) -> bool:
    return created is None or all(c is None for c in created)


@dataclass
class _Columns:
    """A group's counter series as `_count_fast` keeps them: columns in the plan's order, all last
    seen at `seen_at`."""

    plan: _GroupPlan
    raws: tuple[float, ...]
    created: tuple[float | None, ...] | None  # None: no series has a `_created`
    adjusted: list[float]
    seen_at: int


@dataclass
class Point:
    """Group totals at one scrape: adjusted counter sums and gauge running sums."""

    t: float
    counters: dict[str, float]
    gauge_sums: dict[str, float]
    gauge_n: dict[str, float]
    # Running sums over scrape intervals (kvoffload.analysis.intervals): a window's share is a
    # subtraction, like the counters'.
    fit: tuple[float, ...] = (0.0,) * FIT_SIZE


# A point behind the latest, packed: its numbers as bytes of doubles (t, the counters, the gauge
# sums, the gauge counts, the fit) and the key orders they follow, shared between points. A
# live window keeps every scrape of its span (21 per group at 15 s over 300 s): as Points with
# dicts they took ~2.7 kB each (58 MB for 1,000 targets) and were objects the cyclic collector
# walks; packed, ~0.5 kB in a tuple of bytes and strings, which it stops looking at.
_Layout = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], int]
_Packed = tuple[bytes, _Layout]
_LAYOUTS: dict[_Layout, _Layout] = {}
_DOUBLES: dict[int, struct.Struct] = {}


def _doubles(n: int) -> struct.Struct:
    packer = _DOUBLES.get(n)
    if packer is None:
        packer = _DOUBLES[n] = struct.Struct(f"{n}d")
    return packer


def _pack(point: Point) -> Point | _Packed:
    numbers = [
        point.t,
        *point.counters.values(),
        *point.gauge_sums.values(),
        *point.gauge_n.values(),
        *point.fit,
    ]
    if not all(type(x) is float for x in numbers):
        return point  # kept as it is: unpacked, an int would come back a float
    layout = (tuple(point.counters), tuple(point.gauge_sums), tuple(point.gauge_n), len(point.fit))
    return (_doubles(len(numbers)).pack(*numbers), _LAYOUTS.setdefault(layout, layout))


def _unpack(point: Point | _Packed) -> Point:
    if isinstance(point, Point):
        return point
    data, (counters, sums, n, fit) = point
    numbers = _doubles(len(data) // 8).unpack(data)
    i = 1 + len(counters)
    j = i + len(sums)
    k = j + len(n)
    return Point(
        numbers[0],
        dict(zip(counters, numbers[1:i], strict=True)),
        dict(zip(sums, numbers[i:j], strict=True)),
        dict(zip(n, numbers[j:k], strict=True)),
        tuple(numbers[k : k + fit]),
    )


def _latest(points: deque[Point | _Packed]) -> Point:
    """The latest point of a group: never packed."""
    last = points[-1]
    assert isinstance(last, Point)
    return last


def _time(point: Point | _Packed) -> float:
    return point.t if isinstance(point, Point) else struct.unpack_from("d", point[0])[0]


@dataclass
class GroupStatic:
    """The latest static facts of a group (config info labels)."""

    cache_config: list[dict[str, str]] = field(default_factory=list)
    offload_config: list[dict[str, str]] = field(default_factory=list)
    offload_families: bool = False
    naming: str = "none"
    # (counter key, engine, raw value) of the latest scrape: kept as the scrape gave them and
    # summed only when asked (the analysis asks once; a long recording has many scrapes).
    latest: Iterable[tuple[str, str, float]] = field(default_factory=list)
    # (the `latest` it was summed from, the sums): the analysis asks for them once per formula
    _lifetime: tuple[Iterable[tuple[str, str, float]], dict[str, float]] | None = field(
        default=None, repr=False, compare=False
    )

    @property
    def lifetime(self) -> dict[str, float]:
        """Raw counter sums of the latest scrape: totals since the engines (re)started. Do not
        mutate: callers share the dict until the next scrape."""
        if self._lifetime is not None and self._lifetime[0] is self.latest:
            return self._lifetime[1]
        sums: dict[str, float] = {}
        for key, _engine, raw in self.latest:
            sums[key] = sums.get(key, 0.0) + raw
        self._lifetime = (self.latest, sums)
        return sums

    @property
    def engines(self) -> set[str]:
        """The engines of the latest scrape: after a DP shrink, sizes divide by the new count."""
        return {engine for _key, engine, _raw in self.latest}


@dataclass
class Delta:
    """What happened in a group over a window."""

    seconds: float
    inc: dict[str, float]
    gauge_avg: dict[str, float]
    points: int
    # Sums over the window's scrape intervals (kvoffload.analysis.intervals), for marginal costs.
    fit: tuple[float, ...] = (0.0,) * FIT_SIZE
    # Counter and gauge keys left out of `inc` and `gauge_avg` as not believed in the window
    # (not merely absent: a reader that takes an absent gauge for 0 must not take these).
    unknown: frozenset[str] = frozenset()


def _by_group(
    ex: Extract,
) -> tuple[
    dict[GroupKey, dict[str, list[float]]],
    dict[str, list[dict[str, str]]],
    dict[GroupKey, list[dict[str, str]]],
]:
    """The scrape's gauges by group and key, cache configs by instance, offload configs by group
    (each in engine order)."""
    gauge_now: dict[GroupKey, dict[str, list[float]]] = {}
    for (key, instance, model, _engine), value in ex.gauges.items():
        gauge_now.setdefault((instance, model), {}).setdefault(key, []).append(value)
    cache_config: dict[str, list[dict[str, str]]] = {}
    for (inst, _e), labels in sorted(ex.cache_config.items()):
        cache_config.setdefault(inst, []).append(labels)
    offload_config: dict[GroupKey, list[dict[str, str]]] = {}
    for (inst, mdl, _e), labels in sorted(ex.offload_config.items()):
        offload_config.setdefault((inst, mdl), []).append(labels)
    return gauge_now, cache_config, offload_config


class Window:
    """Bounded history for one or more targets.

    `window_seconds=None` keeps only the first and the latest point (a whole-recording
    analysis that streams). `origin_zero=True` starts every group from zero at the process
    start (lifetime figures from a single snapshot).
    """

    def __init__(
        self,
        window_seconds: float | None = 300.0,
        origin_zero: bool = False,
        max_points: int = 10_000,
        timeline: TierTimeline | None = None,
    ) -> None:
        self.window_seconds = window_seconds
        # Tier segments for the before/after A/B (analysis.timeline), where asked for.
        self.timeline = timeline
        self.origin_zero = origin_zero
        self.max_points = max_points
        # group → (counter key, engine) → state: a scrape touches only its own groups.
        self._series: dict[GroupKey, dict[tuple[str, str], _State]] = {}
        # Each group's scrapes in the window, the latest a Point, those behind it packed.
        self._points: dict[GroupKey, deque[Point | _Packed]] = {}
        self._first: dict[GroupKey, Point] = {}
        self._static: dict[GroupKey, GroupStatic] = {}
        self._gauge_running: dict[GroupKey, tuple[dict[str, float], dict[str, float]]] = {}
        # group → counter key → Σ adjusted totals of its series (the latest point's counters)
        self._totals: dict[GroupKey, dict[str, float]] = {}
        self._scrapes: dict[str, int] = {}
        # instance → reason ("restart", "decrease") → counter series seen to reset
        self.resets: dict[str, dict[str, int]] = {}
        # group → counter or gauge key → (time of the latest scrape it could not be believed
        # at, why: "decrease" or the reason the value was unknown)
        self._suspect: dict[GroupKey, dict[str, tuple[float, str]]] = {}
        # group → series first seen unknown in its latest scrape: their first value in the
        # next is not an increase to trust (kept for one scrape: a target sending new NaN
        # series every scrape does not grow it)
        self._unknown_new: dict[GroupKey, set[tuple[str, str]]] = {}
        # group → engine → the scrape number of its last restart: a series of a restarted
        # engine may come back lower a scrape or two late (or, from Prometheus with a step,
        # its old value repeated by the lookback until then), part of the same restart.
        self._restarted_at: dict[GroupKey, dict[str, int]] = {}
        self._groups_of: dict[str, set[GroupKey]] = {}  # instance → its groups
        # The instance of a scrape's first counter → that scrape's counter series (in order) and
        # how they group (`_plan`: the last layout of each target only, so a target renaming
        # its models every scrape holds one); and the groups whose series are kept as columns
        # under their plan instead of in `_series` (`_count_fast`).
        self._plans: dict[str, tuple[tuple[CounterKey, ...], dict[GroupKey, _GroupPlan]]] = {}
        self._columns: dict[GroupKey, _Columns] = {}
        # instance → the secondary tiers whose counters it keeps apart: the first MAX_TIERS
        # seen, so a target renaming its tiers every scrape does not grow the window.
        self._tiers: dict[str, set[str]] = {}

    # -- ingest ---------------------------------------------------------------------------
    def update(self, ex: Extract) -> None:
        """One scrape in, linear in its samples. Why: everything is grouped in one pass, and a
        scrape laid out like the last one reuses its plan and `_count_fast`."""
        if self.timeline is not None:
            self.timeline.observe(ex)
        if ex.tiers:
            self._admit_tiers(ex)
        values = list(ex.counters.values())
        planned = self._plan(ex, values)
        plan = planned[1] if planned is not None else None
        unknown: dict[GroupKey, list[tuple[str, str, str]]] = {}
        by_group: dict[GroupKey, list[tuple[str, str, float]]] | dict[GroupKey, _GroupPlan]
        if planned is not None:
            by_group = planned[1]
            created_values = _aligned(ex.created, planned[0]) if ex.created else None
        else:
            by_group = self._grouped(ex, unknown)
            created_values = None
        instances = set(ex.offload_families) | {g[0] for g in by_group}
        for instance in instances:
            self._scrapes[instance] = self._scrapes.get(instance, 0) + 1
        gauge_now, cache_config, offload_config = _by_group(ex)
        unknown_gauges = self._unknown_gauges(ex, gauge_now) if ex.unknown else set()

        for g in by_group.keys() | gauge_now.keys() | unknown_gauges:
            instance = g[0]
            scrape_no = self._scrapes.get(instance, 0)
            # Adjusted totals of every series ever seen in the group, kept as running sums: a
            # series missing from this scrape keeps its last contribution instead of making
            # the sum drop.
            running = self._totals.get(g)
            if running is None:
                running = self._totals[g] = {}
                self._groups_of.setdefault(instance, set()).add(g)
            earliest_created: float | None = None
            group_plan = plan.get(g) if plan is not None else None
            latest: Iterable[tuple[str, str, float]]
            if group_plan is not None:
                raws = group_plan.take(values)
                created = group_plan.take(created_values) if created_values else None
                latest = _Latest(group_plan, raws)
                if not self._count_fast(g, group_plan, raws, created, scrape_no, running):
                    entries = list(latest)
                    earliest_created = self._count(g, entries, scrape_no, running, None, ex)
                    self._to_columns(g, group_plan, scrape_no)
                elif g not in self._points and created:
                    earliest_created = min((c for c in created if c is not None), default=None)
                counted, offload_series = True, group_plan.offload
            else:
                entries = by_group.get(g, [])  # type: ignore[assignment]
                earliest_created = self._count(g, entries, scrape_no, running, unknown, ex)
                latest, counted = entries, bool(entries)
                offload_series = any(e[0] in OFFLOAD_KEYS for e in entries)
            totals: dict[str, float] = dict(running) if counted else {}

            self._note_static(g, ex, latest, offload_series, cache_config, offload_config)
            self._add_point(g, ex, totals, gauge_now.get(g, {}), earliest_created)

    def _note_static(
        self,
        g: GroupKey,
        ex: Extract,
        latest: Iterable[tuple[str, str, float]],
        offload_series: bool,
        cache_config: dict[str, list[dict[str, str]]],
        offload_config: dict[GroupKey, list[dict[str, str]]],
    ) -> None:
        """What the group's latest scrape says of its settings (the tier, its configs)."""
        instance = g[0]
        static = self._static.get(g)
        if static is None:
            static = self._static[g] = GroupStatic()
        static.latest = latest
        # Offloading is a process setting, but one process may serve several models:
        # a model with no offload series of its own is judged as "off".
        own_series = offload_series or g in offload_config
        static.offload_families = ex.offload_families.get(instance, False) and (
            own_series or len(ex.models.get(instance, ())) <= 1
        )
        static.naming = ex.offload_naming.get(instance, "none")
        static.cache_config = cache_config.get(instance) or static.cache_config
        static.offload_config = offload_config.get(g) or static.offload_config

    def _add_point(
        self,
        g: GroupKey,
        ex: Extract,
        totals: dict[str, float],
        gauge_values: dict[str, list[float]],
        earliest_created: float | None,
    ) -> None:
        """The group's point of this scrape: its totals, running gauge means and fit sums."""
        gauges = {
            k: sum(v) if k in SUMMED_GAUGES else sum(v) / len(v) for k, v in gauge_values.items()
        }
        sums, counts = self._gauge_running.get(g, ({}, {}))
        sums, counts = dict(sums), dict(counts)
        for k in GAUGE_KEYS:
            if k in gauges:  # a gauge absent from a scrape does not pull the mean down
                sums[k] = sums.get(k, 0.0) + gauges[k]
                counts[k] = counts.get(k, 0.0) + 1
        self._gauge_running[g] = (sums, counts)
        points = self._points.get(g)
        previous = _latest(points) if points else None
        fit = (
            add_interval(previous.fit, previous.counters, totals) if previous else (0.0,) * FIT_SIZE
        )
        point = Point(ex.timestamp, totals, sums, counts, fit)
        if points is None:
            points = deque()
            self._points[g] = points
            if self.origin_zero:
                # Without a clock (timestamp 0) the span is unknown: zero, not a guess.
                start = (
                    (earliest_created if earliest_created is not None else ex.timestamp)
                    if ex.timestamp
                    else 0.0
                )
                self._first[g] = Point(min(start, ex.timestamp), {}, {}, {})
            else:
                self._first[g] = point
        points.append(point)
        self._trim(points, ex.timestamp)
        if len(points) > 1:
            points[-2] = _pack(_unpack(points[-2]))

    def _unknown_gauges(
        self, ex: Extract, gauge_now: dict[GroupKey, dict[str, list[float]]]
    ) -> set[GroupKey]:
        """Marks the Extract's unknown gauges suspect and drops them from this scrape's gauges (a
        partial sum would be wrong). Returns their groups."""
        groups: set[GroupKey] = set()
        for (key, instance, model, _engine), why in ex.unknown.items():
            if key not in _GAUGE_SET:
                continue
            g = (instance, model)
            groups.add(g)
            self._suspect.setdefault(g, {})[key] = (ex.timestamp, why)
            gauge_now.get(g, {}).pop(key, None)
        return groups

    def _grouped(
        self, ex: Extract, unknown: dict[GroupKey, list[tuple[str, str, str]]]
    ) -> dict[GroupKey, list[tuple[str, str, float]]]:
        """group → [(counter key, engine, raw)] in one pass. NaN, infinite and unknown counter
        series go to `unknown` with why."""
        by_group: dict[GroupKey, list[tuple[str, str, float]]] = {}
        for (key, instance, model, engine), raw in ex.counters.items():
            if raw - raw != 0.0:  # NaN or infinite (a reader that let it through)
                why = f"{key} of engine {engine} = {raw:g}"
                unknown.setdefault((instance, model), []).append((key, engine, why))
                by_group.setdefault((instance, model), [])
                continue
            entries = by_group.get((instance, model))
            if entries is None:
                entries = by_group[(instance, model)] = []
            entries.append((key, engine, raw))
        for (key, instance, model, engine), why in ex.unknown.items():
            if key in _GAUGE_SET:
                continue
            unknown.setdefault((instance, model), []).append((key, engine, why))
            by_group.setdefault((instance, model), [])
        return by_group

    def _admit_tiers(self, ex: Extract) -> None:
        """Drops the per-tier counters (`<key>@<tier>`) of tiers past an instance's MAX_TIERS."""
        dropped = []
        for skey in ex.counters:
            _base, sep, tier = skey[0].partition("@")
            if not sep:
                continue
            admitted = self._tiers.setdefault(skey[1], set())
            if tier not in admitted:
                if len(admitted) >= MAX_TIERS:
                    dropped.append(skey)
                    continue
                admitted.add(tier)
        for skey in dropped:
            del ex.counters[skey]

    def _plan(
        self, ex: Extract, values: list[float]
    ) -> tuple[tuple[CounterKey, ...], dict[GroupKey, _GroupPlan]] | None:
        """The scrape's counter series in order and their grouping, reusing the target's last plan
        when the series match. None when a value is NaN, infinite or unknown: those scrapes are
        grouped one sample at a time."""
        if ex.unknown or not all(map(math.isfinite, values)):
            return None
        layout = tuple(ex.counters)
        target = layout[0][1] if layout else ""
        known = self._plans.get(target)
        if known is not None and known[0] == layout:
            return known
        known = self._plans[target] = (layout, _learn_plan(layout))
        return known

    def series(self, g: GroupKey) -> dict[tuple[str, str], _SeriesState]:
        """A group's counter series as they stand (a copy, wherever they are kept)."""
        columns = self._columns.get(g)
        if columns is None:
            return {k: _SeriesState(*st) for k, st in self._series.get(g, {}).items()}
        return {pair: _SeriesState(*state) for pair, state in _states(columns)}

    def _series_of(self, g: GroupKey) -> dict[tuple[str, str], _State]:
        """A group's series as a dict by (key, engine), taken out of its columns if any.

        Why: the slow path edits them one by one.
        """
        columns = self._columns.pop(g, None)
        if columns is not None:
            self._series[g] = dict(_states(columns))
        series = self._series.get(g)
        if series is None:
            series = self._series[g] = {}
        return series

    def _to_columns(self, g: GroupKey, group_plan: _GroupPlan, scrape_no: int) -> None:
        """Keeps a group's series as columns when they are exactly the plan's, all seen in this
        scrape. Why: the next such scrape goes through `_count_fast`."""
        series = self._series.get(g)
        if series is None or len(series) != len(group_plan.pairs):
            return
        states = [series.get(pair) for pair in group_plan.pairs]
        if any(st is None or st[3] != scrape_no for st in states):
            return
        full = [st for st in states if st is not None]
        created = tuple(st[1] for st in full)
        self._columns[g] = _Columns(
            group_plan,
            tuple(st[0] for st in full),
            None if _none(created) else created,
            [st[2] for st in full],
            scrape_no,
        )
        del self._series[g]

    def _count_fast(
        self,
        g: GroupKey,
        group_plan: _GroupPlan,
        raws: tuple[float, ...],
        created: tuple[float | None, ...] | None,
        scrape_no: int,
        running: dict[str, float],
    ) -> bool:
        """`_count` for a group whose series match its previous scrape: no gap, none down, no
        `_created` changed. Returns False, changing nothing, otherwise."""
        columns = self._columns.get(g)
        if columns is None or columns.plan is not group_plan or columns.seen_at != scrape_no - 1:
            return False
        before = columns.created
        if created is None or before is None:
            if not (_none(created) and _none(before)):
                return False
        elif not all(map(operator.eq, created, before)):  # NaN ≠ NaN: a restart to judge
            return False
        increases = list(map(operator.sub, raws, columns.raws))
        if increases and min(increases) < 0.0:
            return False
        self._unknown_new.pop(g, None)
        for key, increase in zip(group_plan.keys, increases, strict=True):
            running[key] += increase
        columns.raws = raws
        columns.created = created
        columns.adjusted = list(map(operator.add, columns.adjusted, increases))
        columns.seen_at = scrape_no
        return True

    # After a restart (a decrease, a changed `_created`, a series back from gone) the new raw
    # value is the increase. A decrease without a restart is still a reset (reason "decrease"),
    # and like a value outside its catalog range its increase is not believed while that scrape
    # is in the window: left out of Delta.inc, with `anomalies` saying why. A gauge out of range
    # leaves Delta.gauge_avg the same way.
    def _count(
        self,
        g: GroupKey,
        entries: list[tuple[str, str, float]],
        scrape_no: int,
        running: dict[str, float],
        unknown: dict[GroupKey, list[tuple[str, str, str]]] | None,
        ex: Extract,
    ) -> float | None:
        """A group's counters of one scrape, one series at a time: resets, gaps and unknowns judged,
        increases added to `running`. Returns the earliest `_created`."""
        instance, model = g
        created_of = ex.created
        series = self._series_of(g)
        earliest_created: float | None = None
        decreased: list[tuple[str, str, bool | None]] | None = None
        grew: dict[str, int] | None = None  # engine → its counters that went up
        unknown_new = self._unknown_new.pop(g, None)
        for key, engine, raw in entries:
            created = created_of.get((key, instance, model, engine)) if created_of else None
            state = series.get((key, engine))
            if state is None:
                series[(key, engine)] = (raw, created, raw, scrape_no)
                increase = raw
                if unknown_new and (key, engine) in unknown_new:
                    self._suspect.setdefault(g, {})[key] = (ex.timestamp, _FIRST_UNKNOWN)
            else:
                # state: (raw, created, adjusted, seen_at), as _SeriesState names them
                moved = created is not None and state[1] is not None and created != state[1]
                gap = state[3] != scrape_no - 1
                restarted = raw < state[0] or moved or gap
                # A series back after missing scrapes starts over whatever its value (a
                # restarted engine's series may come back a scrape late): judged by its
                # `_created` if it has one, else not a decrease to flag.
                if (raw < state[0] and not gap) or moved:
                    if decreased is None:
                        decreased = []
                    # restarted for sure (moved), surely not (the same `_created`), or
                    # unknown: judged by the engine's other counters
                    known = created is not None and state[1] is not None
                    decreased.append((key, engine, moved if known else None))
                elif raw > state[0]:
                    if grew is None:
                        grew = {}
                    grew[engine] = grew.get(engine, 0) + 1
                increase = raw if restarted else raw - state[0]
                series[(key, engine)] = (raw, created, state[2] + increase, scrape_no)
            running[key] = running.get(key, 0.0) + increase
            if created is not None and (earliest_created is None or created < earliest_created):
                earliest_created = created
        if decreased is not None:
            self._note_decreases(g, decreased, grew or {}, ex.timestamp, scrape_no)
        if unknown and g in unknown:
            self._note_unknown(g, unknown[g], series, scrape_no, ex.timestamp)
        if self.window_seconds is not None and len(series) > len(entries):
            # A series missing from the scrape counts from zero when it comes back (a
            # restart), state or none: a sliding window need not keep it.
            for gone in [sk for sk, st in series.items() if st[3] != scrape_no]:
                del series[gone]
        return earliest_created

    def _note_decreases(
        self,
        g: GroupKey,
        decreased: list[tuple[str, str, bool | None]],
        grew: dict[str, int],
        t: float,
        scrape_no: int,
    ) -> None:
        """Counts the scrape's counters that reset (went down, or `_created` moved).

        A restart: `_created` moved or, without `_created`, more of the engine's counters went
        down than up. Otherwise a decrease, whose figures are not believed while the scrape is in
        the window.
        """
        counts = self.resets.setdefault(g[0], {})
        down: dict[str, int] = {}
        for _key, engine, moved in decreased:
            if moved is None:
                down[engine] = down.get(engine, 0) + 1
        for key, engine, moved in decreased:
            if moved is not None:
                restart = moved
            else:
                recent = self._restarted_at.get(g, {}).get(engine)
                late = recent is not None and scrape_no - recent <= RESTART_SETTLES_SCRAPES
                restart = late or down[engine] > grew.get(engine, 0)
            if restart:
                self._restarted_at.setdefault(g, {})[engine] = scrape_no
            reason = "restart" if restart else "decrease"
            counts[reason] = counts.get(reason, 0) + 1
            if reason == "decrease":
                self._suspect.setdefault(g, {})[key] = (t, "decrease")

    def _note_unknown(
        self,
        g: GroupKey,
        keys: list[tuple[str, str, str]],
        series: dict[tuple[str, str], _State],
        scrape_no: int,
        t: float,
    ) -> None:
        """Counter series present but unknown (NaN, infinite, negative): kept as they were, figures
        absent meanwhile, `why` kept for `anomalies`. Why: the next value continues from the last
        one believed."""
        suspect = self._suspect.setdefault(g, {})
        for key, engine, why in keys:
            suspect[key] = (t, why)
            state = series.get((key, engine))
            if state is None:
                self._unknown_new.setdefault(g, set()).add((key, engine))
            else:
                raw, created, adjusted, _seen = state
                series[(key, engine)] = (raw, created, adjusted, scrape_no)

    def forget(self, instance: str, now: float) -> list[GroupKey]:
        """Drops the groups of `instance` last scraped over a window before `now` (models gone from
        the target). A whole-history window forgets nothing."""
        if self.window_seconds is None:
            return []
        groups = self._groups_of.get(instance)
        if not groups:
            return []
        boundary = now - self.window_seconds
        gone = [g for g in groups if g not in self._points or _latest(self._points[g]).t < boundary]
        for g in gone:
            groups.discard(g)
            for table in (
                self._series,
                self._columns,
                self._points,
                self._first,
                self._static,
                self._gauge_running,
                self._totals,
                self._suspect,
                self._unknown_new,
                self._restarted_at,
            ):
                table.pop(g, None)
        return gone

    def anomalies(self, group: GroupKey) -> list[str]:
        """Why the group's counters or gauges are left out of its figures, one line each naming the
        series and value."""
        suspect = self._suspect.get(group)
        points = self._points.get(group)
        if not suspect or not points:
            return []
        since = self._first[group].t if self.window_seconds is None else _time(points[0])
        out = []
        for key, (t, why) in sorted(suspect.items()):
            if t > since:
                kind = "gauge" if key in _GAUGE_SET else "counter"
                what = (
                    "went down without a restart (taken as a reset)"
                    if why == "decrease"
                    else f"unknown ({why})"
                )
                out.append(
                    f"{kind} {key} {what} within the window: the figures that read it are "
                    "absent until that scrape leaves the window"
                )
        return out

    def _trim(self, points: deque[Point | _Packed], now: float) -> None:
        if self.window_seconds is None:
            # Whole-history mode: the first point is kept apart; only the latest matters.
            while len(points) > 1:
                points.popleft()
            return
        boundary = now - self.window_seconds
        # Keep one point at or before the boundary so the window is fully covered.
        while len(points) > 2 and _time(points[1]) <= boundary:
            points.popleft()
        while len(points) > self.max_points:
            points.popleft()

    # -- query ----------------------------------------------------------------------------
    def groups(self) -> list[GroupKey]:
        return sorted(self._points)

    def static(self, group: GroupKey) -> GroupStatic:
        return self._static[group]

    def last_time(self, group: GroupKey) -> float | None:
        """The timestamp of the group's latest scrape (the data's own time)."""
        points = self._points.get(group)
        return _latest(points).t if points else None

    def latest(self, group: GroupKey) -> dict[str, float] | None:
        """Adjusted counter totals at the latest scrape (restart-proof, for baselines)."""
        points = self._points.get(group)
        return dict(_latest(points).counters) if points else None

    def delta(self, group: GroupKey) -> Delta | None:
        """Increases over the window (or the whole history); None with fewer than two points."""
        points = self._points.get(group)
        if not points:
            return None
        last = _latest(points)
        first = self._first[group] if self.window_seconds is None else _unpack(points[0])
        if first is last:
            return None
        inc = {
            key: max(last.counters.get(key, 0.0) - first.counters.get(key, 0.0), 0.0)
            for key in last.counters
        }
        gauge_avg = {}
        for k, v in last.gauge_sums.items():
            n = last.gauge_n.get(k, 0.0) - first.gauge_n.get(k, 0.0)
            if n > 0:
                gauge_avg[k] = (v - first.gauge_sums.get(k, 0.0)) / n
        unknown: frozenset[str] = frozenset()
        suspect = self._suspect.get(group)
        if suspect:
            # the keys whose scrape they could not be believed at is in the window
            unknown = frozenset(key for key, (t, _why) in suspect.items() if t > first.t)
            for key in unknown:
                inc.pop(key, None)
                gauge_avg.pop(key, None)
        fit = tuple(a - b for a, b in zip(last.fit, first.fit, strict=True))
        return Delta(max(last.t - first.t, 0.0), inc, gauge_avg, len(points), fit, unknown)
