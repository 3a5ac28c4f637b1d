"""vLLM series read back from Prometheus (or Thanos, Mimir…) as the scrapes they came from.

Why: `analyze --prometheus` must match `analyze FILE` on the same data. So stored samples become
one `Exposition` per (instance, scrape time), fed to the same window and analysis.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from kvoffload.errors import InputError
from kvoffload.fleet.promapi import PromAPIError, PrometheusAPI, PromStopped, Series, printable
from kvoffload.ingest.catalog import _INDEX, Extract
from kvoffload.ingest.shapes import Member, ScrapeShapes

# A question answers at most about this many points (≈ 40 MB of JSON): the reader's memory.
POINT_BUDGET = 400_000
# Prometheus refuses query_range answers over 11,000 points per series.
MAX_STEPS = 10_000
# Assumed when an instance's sample count cannot be learnt (Prometheus' default interval).
DEFAULT_INTERVAL = 15.0
# The most questions one read may take (a month of 1,000 engines at 15 s is some 13,000).
MAX_QUESTIONS = 100_000
# The largest magnitude a vLLM figure can have (counters of tokens or bytes stay far below):
# past it, or not finite, a value is the server's error, and sums of it would overflow.
MAX_VALUE = 1e18
# Distinct warnings kept per read; the rest are only counted.
MAX_WARNINGS = 100

# Every sample name the catalog reads, without the `vllm:` prefix and without `_created`.
_NAMES = sorted(
    {n[len("vllm:") :] for n in _INDEX if n.startswith("vllm:") and not n.endswith("_created")}
)
NAME_MATCHER = '__name__=~"vllm[:_](?:' + "|".join(re.escape(n) for n in _NAMES) + ')"'
# One name every vLLM version exports per engine: its sample count is the instance's.
_PROBE = "vllm[:_]prompt_tokens_total"

_SELECTOR_RE = re.compile(r"^\{(.*)\}$", re.DOTALL)


def selector_matchers(selector: str | None) -> str:
    """The matchers inside a `{…}` selector (`{job="vllm"}` → `job="vllm"`).

    Checked enough to fail here with a clear line, not as a server error later."""
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
    # Each distinct warning and how many answers carried it (a warning per answer is usual:
    # Thanos' partial responses), in the order first seen; past MAX_WARNINGS only counted.
    warnings: dict[str, int] = field(default_factory=dict)
    other_warnings: int = 0
    errors: dict[str, str] = field(default_factory=dict)  # instance → its one-line error

    def warn(self, warnings: list[str] | dict[str, int]) -> None:
        """Count `warnings` in (a list from an answer, or another read's counts): linear."""
        counts = warnings if isinstance(warnings, dict) else dict.fromkeys(warnings, 0)
        if not isinstance(warnings, dict):
            for w in warnings:
                counts[w] += 1
        for w, n in counts.items():
            if w in self.warnings:
                self.warnings[w] += n
            elif len(self.warnings) < MAX_WARNINGS:
                self.warnings[w] = n
            else:
                self.other_warnings += n

    def merge(self, other: ReadStats) -> None:
        self.questions += other.questions
        self.points += other.points
        self.errors.update(other.errors)
        self.warn(other.warnings)
        self.other_warnings += other.other_warnings

    def warning_lines(self) -> list[str]:
        """Each distinct warning once, with how often it came."""
        lines = [w + (f" ({n:,} times)" if n > 1 else "") for w, n in self.warnings.items()]
        if self.other_warnings:
            lines.append(f"and {self.other_warnings:,} more warning(s) not shown")
        return lines


@dataclass(frozen=True)
class Plan:
    instance: str
    series: int
    points_per_series: float


# It asks only for the catalog's sample names (also as `vllm_…`, without `_created`), by default
# every stored sample through range selectors (no alignment, no lookback repeats), in batches of
# whole instances within POINT_BUDGET, so memory does not grow with the fleet. A failed question
# is asked again for each half; an instance that still fails or is not vLLM's is left out.
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
        max_questions: int = MAX_QUESTIONS,
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
        self.max_questions = max_questions
        self.progress = progress
        self.stats = ReadStats()

    # -- the plan ---------------------------------------------------------------------------
    def plan(self) -> list[Plan]:
        """Instances, their series count and points per series, from two cheap questions.
        An instance the answers make no sense for is left out with its reason
        (`stats.errors`)."""
        series = self._series_per_instance()
        counts = self._points_per_instance()
        default = (self.end - self.start) / (self.step or DEFAULT_INTERVAL) + 1
        plans = []
        for instance, n in sorted(series.items()):
            count = counts.get(instance, default) if self.step is None else default
            refused = self._refused(instance, count)
            if refused:
                self.stats.errors[printable(instance)] = refused
            else:
                plans.append(Plan(instance, n, count))
        return plans

    def _refused(self, instance: str, count: float) -> str | None:
        """Why an instance cannot be read as the server describes it, or None."""
        if not instance.isprintable():
            return "its instance label holds control characters; left out"
        # Prometheus keeps one sample per millisecond at most.
        possible = (self.end - self.start) * 1000 + 1
        if not 0 <= count <= possible:
            return (
                f"count_over_time answered {printable(count, 40)} samples in a "
                f"{self.end - self.start:g} s range (at most {possible:.0f} are possible): "
                "not a sample count; left out"
            )
        return None

    def _series_per_instance(self) -> dict[str, int]:
        # The series endpoint reads the index only: no sample is loaded for it.
        counts: dict[str, int] = {}
        self.stats.questions += 1
        for labels in self.api.series(_join(NAME_MATCHER, self.matchers), self.start, self.end):
            instance = labels.get("instance", "")
            counts[instance] = counts.get(instance, 0) + 1
        return counts

    def _points_per_instance(self) -> dict[str, float]:
        if self.step is not None:
            return {}
        self.stats.questions += 1
        result = self.api.query_instant(
            f'max by (instance) (count_over_time({{__name__=~"{_PROBE}"'
            f"{',' + self.matchers if self.matchers else ''}}}"
            f"[{_duration(self.end - self.start)}]))",
            self.end,
        )
        self.stats.warn(result.warnings)
        return {s.labels.get("instance", ""): s.points[-1][1] for s in result.series if s.points}

    # -- the data ---------------------------------------------------------------------------
    def extracts(self) -> Iterator[Extract]:
        """Every (instance, scrape) as the catalog's Extract, in time order per instance;
        instances one batch after the other."""
        for batch in self.batches():
            yield from self.read_batch(batch)

    def batches(self) -> list[list[Plan]]:
        """The plan cut into questions' worth of whole instances.

        Each batch can be read and analyzed on its own, by one worker process (`fleet.runs`)."""
        plans = self.plan()
        self.stats.instances = len(plans) + len(self.stats.errors)
        if not plans and self.stats.errors:
            raise InputError(
                "no instance could be read: "
                + "; ".join(f"{i}: {e}" for i, e in sorted(self.stats.errors.items())[:3])
            )
        if not plans:
            raise InputError(
                "Prometheus holds no vLLM series"
                + (f" matching {{{self.matchers}}}" if self.matchers else "")
                + " in the range"
            )
        batches = list(self._batches(plans))
        questions = sum(self._chunks(batch) for batch in batches)
        if questions > self.max_questions:
            raise InputError(
                f"reading {len(plans):,} instance(s) over {self.end - self.start:g} s would "
                f"take {questions:,} questions (at most {self.max_questions:,}): "
                "shorten --range, narrow --selector or give a larger --step"
            )
        self._report()
        return batches

    def _batches(self, plans: list[Plan]) -> Iterator[list[Plan]]:
        batch: list[Plan] = []
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

    def _chunks(self, batch: list[Plan]) -> int:
        """How many questions the batch is asked in (slices of the range)."""
        cost = sum(p.series * p.points_per_series for p in batch)
        chunks = max(1, math.ceil(cost / self.point_budget))
        if self.step is not None:
            steps = (self.end - self.start) / self.step + 1
            chunks = max(chunks, math.ceil(steps / MAX_STEPS))
        return chunks

    def read_batch(self, batch: list[Plan]) -> Iterator[Extract]:
        names = [p.instance for p in batch]
        chunks = self._chunks(batch)
        emitted: dict[str, float] = {}
        failed: set[str] = set()
        for chunk in range(chunks):
            asked = [n for n in names if n not in failed]
            if not asked:
                break
            try:
                series = self._fetch(asked, chunk, chunks)
            except PromStopped:
                raise
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
            yield from self._scrapes(series, emitted, set(asked), failed)
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
        self.stats.warn(result.warnings)
        return result.series

    def _scrapes(
        self,
        series: list[Series],
        emitted: dict[str, float],
        asked: set[str],
        failed: set[str],
    ) -> Iterator[Extract]:
        """Series → one Extract per (instance, time), in time order per instance.

        A point at or before its instance's last one is dropped (Prometheus 2's range selectors
        include both ends). So is one after the range, or of an instance not asked about. An
        instance with a non-finite value or one past MAX_VALUE is added to `failed` with its
        reason."""
        by_instance: dict[str, tuple[list[Member], list[list[tuple[float, float]]]]] = {}
        for s in series:
            labels = {k: v if v.isprintable() else printable(v, 1000) for k, v in s.labels.items()}
            name = labels.pop("__name__", "")
            if name.startswith("vllm_"):
                name = "vllm:" + name[5:]
            instance = s.labels.get("instance", "")
            if instance not in asked:
                continue
            members, points_of = by_instance.setdefault(instance, ([], []))
            members.append((name, labels))
            points_of.append(s.points)
        last = self.end + 1.0
        for instance, (members, points_of) in by_instance.items():
            after = emitted.get(instance, -math.inf)
            rows: dict[float, dict[int, float]] = {}
            bad: tuple[str, float, float] | None = None
            for i, points in enumerate(points_of):
                for t, v in points:
                    if after < t <= last:
                        if not -MAX_VALUE <= v <= MAX_VALUE:  # NaN too
                            bad = (members[i][0], v, t)
                            break
                        row = rows.get(t)
                        if row is None:
                            row = rows[t] = {}
                        row[i] = v
                if bad:
                    break
            if bad:
                self.stats.errors[instance] = (
                    f"{printable(bad[0], 100)} is {bad[1]!r} at {bad[2]:.3f}: not a vLLM figure "
                    f"(finite, at most {MAX_VALUE:g} in size); instance left out"
                )
                failed.add(instance)
                continue
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
