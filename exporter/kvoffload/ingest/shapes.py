"""Scrapes rebuilt from stored series, turned into the catalog's `Extract` cheaply.

Why: readers holding samples by series know each series' name and labels once. So
`catalog.extract` runs once per *shape*, and each later scrape of it is a few dict writes.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from kvoffload.ingest.catalog import Extract, extract, value_range
from kvoffload.ingest.parse import Exposition, Sample

# A series of one instance: its (canonical) sample name and labels.
Member = tuple[str, dict[str, str]]


# A shape is the series present and the families declared; `catalog.extract` runs on it with each
# sample's value its own index, which maps each series to its Extract place. A scrape with a value
# out of its row's range (`catalog.value_range`) goes through `catalog.extract` itself.
class ScrapeShapes:
    """The scrapes of one instance. `members` may grow between calls (a series that appears
    later gets the next index); indices never change."""

    def __init__(self, instance: str, members: list[Member]) -> None:
        self.instance = instance
        self.members = members
        self._shapes: dict[tuple[tuple[int, ...], frozenset[str] | None], _Shape] = {}
        self._bounds: list[tuple[float, float]] = []  # each member's (low, high), as asked

    def extract(
        self, row: dict[int, float], t: float, declared: frozenset[str] | None = None
    ) -> Extract:
        """The Extract of the scrape at `t` holding member i's value row[i]. `declared`: the
        families the scrape declared (TYPE lines, with or without samples); None: those of
        its samples."""
        key = (tuple(row), declared)
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = _Shape(self, key[0], declared)
        values = row.values()
        if not (
            all(map(operator.le, shape.lows, values)) and all(map(operator.le, values, shape.highs))
        ):
            # A value outside its range (NaN is outside every one) is unknown to extract,
            # which may let another sample take its place, and names it: ask extract itself.
            # (Not a sum: 1e308 twice overflows it, and +Inf beside -Inf makes fsum raise.)
            return extract(self.exposition(row, t, declared), t, self.instance)
        return shape.fill(row, t)

    def bounds(self, i: int) -> tuple[float, float]:
        """The range member i's value must lie in for a scrape to be filled by its shape."""
        while len(self._bounds) <= i:
            name, labels = self.members[len(self._bounds)]
            within = value_range(name, labels)
            self._bounds.append((within.low, within.high))
        return self._bounds[i]

    def exposition(
        self, row: dict[int, float], t: float | None, declared: frozenset[str] | None
    ) -> Exposition:
        """The scrape the stored samples came from: its samples and its families."""
        expo = Exposition(timestamp=t)
        for i, v in row.items():
            name, labels = self.members[i]
            family, mtype = family_of(name)
            expo.families[family] = mtype
            sample: Sample = (name, labels, v, None)
            expo.samples.append(sample)
        for family in declared or ():
            expo.families.setdefault(family, "unknown")
        return expo


class _Shape:
    def __init__(
        self, shapes: ScrapeShapes, present: tuple[int, ...], declared: frozenset[str] | None
    ) -> None:
        learnt = extract(
            shapes.exposition({i: float(i) for i in present}, None, declared),
            0.0,
            shapes.instance,
            judge=False,
        )
        self.learnt = learnt
        bounds = [shapes.bounds(i) for i in present]
        self.lows = tuple(low for low, _high in bounds)
        self.highs = tuple(high for _low, high in bounds)
        self.counters = _Fill(learnt.counters)
        self.created = _Fill(learnt.created)
        self.gauges = _Fill(learnt.gauges)

    def fill(self, row: dict[int, float], t: float) -> Extract:
        learnt = self.learnt
        return Extract(
            t,
            self.counters.of(row),
            self.created.of(row),
            self.gauges.of(row),
            learnt.cache_config,
            learnt.offload_config,
            learnt.offload_families,
            learnt.models,
            learnt.offload_naming,
        )


class _Fill:
    """One of an Extract's dicts from a row: its keys, each with its value's index.

    Built in C: a large body's scrape has hundreds of them.
    """

    def __init__(self, learnt: dict[Any, float]) -> None:
        self.keys = tuple(learnt)
        self.take = taker([int(i) for i in learnt.values()]) if learnt else None

    def of(self, row: dict[int, float]) -> dict[Any, float]:
        return dict(zip(self.keys, self.take(row), strict=True)) if self.take else {}


def taker(positions: list[int]) -> Callable[[Any], tuple[Any, ...]]:
    """The items at `positions` of a sequence or mapping, as a tuple (in C: itemgetter)."""
    if len(positions) == 1:  # itemgetter of one index gives the item, not a tuple
        only = positions[0]
        return lambda values: (values[only],)
    return operator.itemgetter(*positions)


def family_of(name: str) -> tuple[str, str]:
    """The family a stored sample name came from, as a scrape's TYPE line declares it."""
    for suffix, mtype in (("_total", "counter"), ("_sum", "histogram"), ("_count", "histogram")):
        if name.endswith(suffix):
            return name[: -len(suffix)], mtype
    return name, "gauge"
