"""vLLM series read back from Prometheus (or Thanos, Mimir…) as the scrapes they came from.

`analyze --prometheus` must give the figures `analyze FILE` gives for the same data, so it
does not compute them differently: it turns the stored samples back into one `Exposition` per
(instance, scrape time), in time order per instance, and feeds them to the same window and
analysis as a recording. What it asks for:

- only the sample names the catalog reads (`ingest.catalog`), under vLLM's names and under the
  underscore form some pipelines store (`vllm_…`, read as `vllm:…`), without `_created` (a
  restart shows as a counter decrease; the series would double the download);
- by default every stored sample, through range selectors (`{…}[D]` at the chunk's end), so
  the points are the scrapes themselves, with their own times: no step alignment, and an
  engine that stopped is not repeated for the 5-minute lookback as `query_range` would;
  with `step`, `query_range` instead (one point per step: less to read over a long range);
- in batches of whole instances, each at most `point_budget` points (chunked in time when one
  instance alone is more), so memory does not grow with the fleet.

A question that fails is asked again for half the batch, down to one instance; an instance
that still fails is reported with its error and left out, and the run goes on.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from kvoffload.errors import InputError
from kvoffload.ingest.catalog import _INDEX, Extract
from kvoffload.ingest.promapi import PromAPIError, PrometheusAPI, Series
from kvoffload.ingest.shapes import Member, ScrapeShapes

# A question answers at most about this many points (≈ 40 MB of JSON): the reader's memory.
POINT_BUDGET = 400_000
# Prometheus refuses query_range answers over 11,000 points per series.
MAX_STEPS = 10_000
# Assumed when an instance's sample count cannot be learnt (Prometheus' default interval).
DEFAULT_INTERVAL = 15.0

# Every sample name the catalog reads, without the `vllm:` prefix and without `_created`.
_NAMES = sorted(
    {n[len("vllm:") :] for n in _INDEX if n.startswith("vllm:") and not n.endswith("_created")}
)
NAME_MATCHER = '__name__=~"vllm[:_](?:' + "|".join(re.escape(n) for n in _NAMES) + ')"'
# One name every vLLM version exports per engine: its sample count is the instance's.
_PROBE = "vllm[:_]prompt_tokens_total"

_SELECTOR_RE = re.compile(r"^\{(.*)\}$", re.DOTALL)


def selector_matchers(selector: str | None) -> str:
    """The matchers inside a `{…}` selector (`{job="vllm"}` → `job="vllm"`), checked enough to
    fail here with a clear line instead of as a server error on the first question."""
    if not selector or not selector.strip():
        return ""
    m = _SELECTOR_RE.match(selector.strip())
    if not m:
        raise InputError(
            f"--selector {selector!r}: give label matchers in braces, e.g. '{{job=\"vllm\"}}'"
        )
    inner = m.group(1).strip().rstrip(",")
    if "__name__" in inner:
        raise InputError("--selector: leave __name__ out; kvoffload picks the vLLM series itself")
    if inner.count('"') % 2:
        raise InputError(f"--selector {selector!r}: unbalanced quotes")
    return inner


def _join(*parts: str) -> str:
    return "{" + ",".join(p for p in parts if p) + "}"


def _regex_alternatives(values: list[str]) -> str:
    # RE2 syntax, inside a PromQL double-quoted string: escape for the regex, then for PromQL.
    alt = "|".join(re.escape(v) for v in values)
    return alt.replace("\\", "\\\\").replace('"', '\\"')


@dataclass
class ReadStats:
    instances: int = 0
    done: int = 0
    questions: int = 0
    points: int = 0
    warnings: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # instance → its one-line error


@dataclass(frozen=True)
class _Plan:
    instance: str
    series: int
    points_per_series: float


class FleetReader:
    """Reads the vLLM series of every instance matching `selector` between `start` and `end`."""

    def __init__(
        self,
        api: PrometheusAPI,
        start: float,
        end: float,
        selector: str | None = None,
        step: float | None = None,
        point_budget: int = POINT_BUDGET,
        progress: Callable[[ReadStats], None] | None = None,
    ) -> None:
        if not end > start:
            raise InputError("the range is empty: --end must be after --start")
        if step is not None and step <= 0:
            raise InputError("--step must be positive")
        self.api = api
        self.start = start
        self.end = end
        self.matchers = selector_matchers(selector)
        self.step = step
        self.point_budget = point_budget
        self.progress = progress
        self.stats = ReadStats()

    # -- the plan ---------------------------------------------------------------------------
    def plan(self) -> list[_Plan]:
        """Instances, their series count and points per series, from two cheap questions."""
        series = self._series_per_instance()
        counts = self._points_per_instance()
        default = (self.end - self.start) / (self.step or DEFAULT_INTERVAL) + 1
        return [
            _Plan(instance, n, counts.get(instance, default) if self.step is None else default)
            for instance, n in sorted(series.items())
        ]

    def _series_per_instance(self) -> dict[str, int]:
        # The series endpoint reads the index only: no sample is loaded for it.
        counts: dict[str, int] = {}
        for labels in self.api.series(_join(NAME_MATCHER, self.matchers), self.start, self.end):
            instance = labels.get("instance", "")
            counts[instance] = counts.get(instance, 0) + 1
        return counts

    def _points_per_instance(self) -> dict[str, float]:
        if self.step is not None:
            return {}
        result = self.api.query_instant(
            f'max by (instance) (count_over_time({{__name__=~"{_PROBE}"'
            f"{',' + self.matchers if self.matchers else ''}}}"
            f"[{_duration(self.end - self.start)}]))",
            self.end,
        )
        return {s.labels.get("instance", ""): s.points[-1][1] for s in result.series if s.points}

    # -- the data ---------------------------------------------------------------------------
    def extracts(self) -> Iterator[Extract]:
        """Every (instance, scrape) as the catalog's Extract, in time order per instance;
        instances one batch after the other."""
        for batch in self.batches():
            yield from self.read_batch(batch)

    def batches(self) -> list[list[_Plan]]:
        """The plan cut into questions' worth of whole instances (each batch can be read and
        analysed on its own: a worker process per batch, `analysis.fleetrun`)."""
        plans = self.plan()
        self.stats.instances = len(plans)
        if not plans:
            raise InputError(
                "Prometheus holds no vLLM series"
                + (f" matching {{{self.matchers}}}" if self.matchers else "")
                + " in the range"
            )
        self._report()
        return list(self._batches(plans))

    def _batches(self, plans: list[_Plan]) -> Iterator[list[_Plan]]:
        batch: list[_Plan] = []
        points = 0.0
        for plan in plans:
            cost = plan.series * plan.points_per_series
            if batch and points + cost > self.point_budget:
                yield batch
                batch, points = [], 0.0
            batch.append(plan)
            points += cost
        if batch:
            yield batch

    def read_batch(self, batch: list[_Plan]) -> Iterator[Extract]:
        names = [p.instance for p in batch]
        cost = sum(p.series * p.points_per_series for p in batch)
        chunks = max(1, math.ceil(cost / self.point_budget))
        if self.step is not None:
            steps = (self.end - self.start) / self.step + 1
            chunks = max(chunks, math.ceil(steps / MAX_STEPS))
        emitted: dict[str, float] = {}
        failed: set[str] = set()
        for chunk in range(chunks):
            try:
                series = self._fetch([n for n in names if n not in failed], chunk, chunks)
            except PromAPIError as exc:
                if len(names) == 1:
                    self.stats.errors[names[0]] = str(exc)
                    failed.add(names[0])
                    break
                # Ask again for each half: one bad instance (or an answer too large) must not
                # cost the others.
                half = len(batch) // 2
                if chunk == 0:
                    yield from self.read_batch(batch[:half])
                    yield from self.read_batch(batch[half:])
                    return
                for name in names:
                    self.stats.errors.setdefault(name, str(exc))
                    failed.add(name)
                break
            yield from self._scrapes(series, emitted)
        self.stats.done += len(batch)
        self._report()

    def _fetch(self, names: list[str], chunk: int, chunks: int) -> list[Series]:
        span = self.end - self.start
        lo = self.start + span * chunk / chunks
        hi = self.start + span * (chunk + 1) / chunks
        instance = f'instance=~"{_regex_alternatives(names)}"'
        selector = _join(NAME_MATCHER, self.matchers, instance)
        self.stats.questions += 1
        if self.step is None:
            # Raw samples in (lo, hi]; the first chunk also takes the sample at `start`.
            width = hi - lo + (1e-3 if chunk == 0 else 0.0)
            result = self.api.query_instant(f"{selector}[{_duration(width)}]", hi)
        else:
            first = self.start + math.ceil((lo - self.start) / self.step) * self.step
            if chunk:
                first += self.step if first <= lo else 0.0
            result = self.api.query_range(selector, first, hi, self.step)
        self.stats.warnings.extend(w for w in result.warnings if w not in self.stats.warnings)
        return result.series

    def _scrapes(self, series: list[Series], emitted: dict[str, float]) -> Iterator[Extract]:
        """Series → one Extract per (instance, time), in time order per instance. A point at or
        before what was already given for its instance is dropped: the range selectors of
        Prometheus 2 include both ends, so a sample on a chunk boundary comes twice."""
        by_instance: dict[str, tuple[list[Member], list[list[tuple[float, float]]]]] = {}
        for s in series:
            labels = dict(s.labels)
            name = labels.pop("__name__", "")
            if name.startswith("vllm_"):
                name = "vllm:" + name[5:]
            members, points_of = by_instance.setdefault(labels.get("instance", ""), ([], []))
            members.append((name, labels))
            points_of.append(s.points)
        for instance, (members, points_of) in by_instance.items():
            after = emitted.get(instance, -math.inf)
            rows: dict[float, dict[int, float]] = {}
            for i, points in enumerate(points_of):
                for t, v in points:
                    if t > after:
                        row = rows.get(t)
                        if row is None:
                            row = rows[t] = {}
                        row[i] = v
            shapes = ScrapeShapes(instance, members)
            for t in sorted(rows):
                row = rows[t]
                self.stats.points += len(row)
                yield shapes.extract(row, t)
            if rows:
                emitted[instance] = max(after, max(rows))

    def _report(self) -> None:
        if self.progress is not None:
            self.progress(self.stats)


def _duration(seconds: float) -> str:
    """A PromQL duration in whole milliseconds (never zero)."""
    return f"{max(1, round(seconds * 1000))}ms"
