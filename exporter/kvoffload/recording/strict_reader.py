"""A fast reader for recordings in the strict OpenMetrics layout that `record` leaves.

Why: the general reader sorts the kept lines on disk and parses them again. This one reads the
file as it lies, into compact columns (8 bytes per kept point). It declines (`blocks.Declined`)
what it cannot read exactly as the general reader would; docs/reliability.md lists those cases.
"""

from __future__ import annotations

import itertools
import math
import mmap
import re
from array import array
from collections.abc import Callable, Iterator, Sequence

from kvoffload.ingest.catalog import FLAT_FAMILY, OFFLOAD_FAMILY_PREFIXES, Extract
from kvoffload.ingest.parse import canonical_name, family_name
from kvoffload.recording import blocks
from kvoffload.recording.blocks import (
    Declined,
    Family,
    Instance,
    Pages,
    family_spec,
    mapped,
    member,
    next_comment,
    next_type_line,
    wanted_text,
)

_INSTANCE = re.compile(rb'[{,]instance="((?:[^"\\]|\\.)*)"')


# Declared families follow the general reader (parse._with_families), for these families only.
def _relevant(family: str) -> bool:
    """A family whose being declared can change what catalog.extract makes of a scrape."""
    return family.startswith(OFFLOAD_FAMILY_PREFIXES) or family in FLAT_FAMILY.values()


class _Column:
    """One series: its times and values; a value that never changes is held once.

    Such series (a counter's `_created`, an info metric) are half of what is kept.
    """

    __slots__ = ("first", "shared", "times", "varying")

    def __init__(self) -> None:
        self.times = array("d")
        self.shared = False  # `times` may be another series' too (_share_times): not to grow
        self.first: float | None = None
        self.varying: array[float] | None = None

    def append(self, t: float, v: float) -> None:
        self.times.append(t)
        if self.varying is not None:
            self.varying.append(v)
        elif self.first is None:
            self.first = v
        elif v != self.first or v != v:  # (NaN equals nothing)
            self.varying = array("d", [self.first]) * (len(self.times) - 1)
            self.varying.append(v)

    def extend(self, times: Sequence[float], values: Sequence[float]) -> None:
        """append() of each point in turn, in bulk."""
        before = len(self.times)
        self.times.extend(times)
        if self.varying is not None:
            self.varying.extend(values)
            return
        if self.first is None:
            self.first = values[0]
        # count() finds `first` by identity too: a NaN `first` counts only where it is itself
        # (values[0]), as append() sees NaN differ from everything.
        if values.count(self.first) != len(values):
            self.varying = array("d", [self.first]) * before
            self.varying.extend(values)

    def values(self) -> array[float] | _Repeated:
        if self.varying is not None:
            return self.varying
        return _Repeated(self.first if self.first is not None else 0.0)


class _Repeated:
    __slots__ = ("value",)

    def __init__(self, value: float) -> None:
        self.value = value

    def __getitem__(self, _index: int) -> float:
        return self.value


def strict_extracts(path: str, report: Callable[[int], None] | None = None) -> Iterator[Extract]:
    """Every scrape of a strict-layout recording as an Extract, instance by instance.

    Each instance's in time order; `report` is told the byte offset reached now and then.
    """
    # Series by series (_scan.c's `scan_series` where built, else Python), then each instance's
    # scrapes rebuilt in time order via `ingest.shapes`. Lines of unread families are not looked
    # at (its speed), so a malformed one there is passed over (tests/test_recording_read.py).
    with mapped(path) as mm:
        columns, instances, users = _read_columns(mm, report)
    yield from _scrapes(columns, instances, users)


def _read_columns(
    mm: mmap.mmap, report: Callable[[int], None] | None
) -> tuple[dict[tuple[Instance, int], _Column], dict[str, Instance], dict[str, set[str] | None]]:
    size = len(mm)
    if size < 6 or mm[size - 6 :] != b"# EOF\n":
        raise Declined("no '# EOF' at the end")
    end_of_data = size - 6
    families: dict[tuple[bytes, bytes], Family] = {}
    series: dict[bytes, tuple[Instance, int]] = {}
    instances: dict[str, Instance] = {}
    columns: dict[tuple[Instance, int], _Column] = {}
    # family → the instances with series of it (None: not followed), for the relevant ones.
    users: dict[str, set[str] | None] = {}
    unread: dict[str, list[tuple[int, int]]] = {}  # relevant families not read: their blocks
    pages = Pages(mm, report)
    # The compiled scan of a piece (recording/_scan.c), unless it was not built or is turned off.
    scan = blocks.compiled_scan if blocks.COMPILED else None
    # (number of points, first and last time) → the times arrays read, to hold each once
    shared_times: dict[tuple[int, float, float], list[array[float]]] = {}
    pos = 0
    while True:
        found = next_type_line(mm, pos, end_of_data, pages)
        if found is None:
            break
        pos, raw, mtype = found
        name = family_name(canonical_name(raw.decode()), mtype.decode())
        if name in users and users[name] is not None:
            raise Declined("a family declared twice")  # not the strict layout
        followed = _relevant(name)
        users[name] = set() if followed else None
        spec = families.get((raw, mtype))
        if spec is None:
            spec = families[(raw, mtype)] = family_spec(raw, mtype)
        if not spec.wanted and not followed:
            continue
        if not spec.wanted:
            block_end = next_comment(mm, pos, end_of_data, pages)
            unread.setdefault(name, []).append((pos, block_end))
            pos = block_end
            continue
        block_start = pos
        block_end_at: list[int] = []
        family_users = users[name]
        reader = _SeriesReader(spec, series, instances, columns, family_users)
        for start, stop in _spans(mm, block_start, end_of_data, pages, block_end_at):
            runs = None if scan is None else scan(mm, start, stop, spec.wanted, spec.unwanted)
            if runs is None:  # (or no compiled scan) the Python reading: the same columns
                reader.read(wanted_text(mm[start:stop], spec))
            else:
                reader.read_series(runs)
        _share_times(reader.started, shared_times)
        pos = block_end_at[0]
    if len(instances) > 1:
        # Which instances an unread relevant family has series of (a histogram not read).
        for name, spans in unread.items():
            who = users[name]
            assert who is not None
            for start, stop in spans:
                for piece in _pieces(mm, start, stop, pages):
                    who.update(m.decode() for m in _INSTANCE.findall(piece))
    return columns, instances, users


# A family block is read in pieces of about this size: a day's histogram is hundreds of MB.
_PIECE = 2 * 2**20


def _pieces(mm: mmap.mmap, start: int, end: int, pages: Pages) -> Iterator[bytes]:
    """mm[start:end] (`start` a line start) in pieces that end at line ends."""
    for a, b in _spans(mm, start, end, pages):
        yield mm[a:b]


def _spans(
    mm: mmap.mmap, start: int, end: int, pages: Pages, stopped: list[int] | None = None
) -> Iterator[tuple[int, int]]:
    """[start, end) (`start` a line start) as (start, end) pieces that end at line ends.

    With `stopped`, only up to the next line beginning with '#' (the family block's end), whose
    offset is appended to it.
    """
    pos = start
    while pos < end:
        limit = min(pos + _PIECE, end)
        if stopped is not None:
            if mm[pos] == 35:  # '#': the block ends here
                stopped.append(pos)
                return
            # A '#' starting a line: searched for as '#' (rare; a search for "\n#" stops
            # at every newline first), then its line start checked.
            at = mm.find(b"#", pos, limit)
            while at != -1 and mm[at - 1] != 10:
                at = mm.find(b"#", at + 1, limit)
            if at != -1:
                pages.advance(pos)
                yield pos, at
                stopped.append(at)
                return
        cut = limit
        if limit < end:
            cut = mm.rfind(b"\n", pos, limit) + 1
            if cut <= pos:  # one line longer than a piece: take it whole
                newline = mm.find(b"\n", limit, end)
                cut = end if newline == -1 else newline + 1
        pages.advance(pos)
        yield pos, cut
        pos = cut
    if stopped is not None:
        stopped.append(end)


class _SeriesReader:
    """A family block's wanted lines into the series' columns.

    The layout keeps a series' points together. So a piece is split in bulk and read one series'
    run at a time, with one name check.
    """

    def __init__(
        self,
        spec: Family,
        series: dict[bytes, tuple[Instance, int]],
        instances: dict[str, Instance],
        columns: dict[tuple[Instance, int], _Column],
        family_users: set[str] | None,
    ) -> None:
        self.spec = spec
        self.series = series
        self.instances = instances
        self.columns = columns
        self.family_users = family_users
        self.last_head = b""
        self.column = _Column()
        self.last_t = 0.0
        self.last_stamps: list[bytes] = []
        self.last_times: list[float] = []
        self.last_ordered = False
        self.started: list[_Column] = []  # the series this block holds

    def read(self, text: bytes) -> None:
        split = _split_lines(text)
        if split is None:  # a label value with a blank: line by line
            for line in text.split(b"\n")[:-1]:
                self._line(line)
            return
        heads, values, stamps = split
        at, n = 0, len(heads)
        while at < n:
            # A metric point's samples are together (a counter's _total and _created, a
            # histogram's _count and _sum): the heads repeat with that period while one
            # label set lasts.
            cycle, repeats = _run_at(heads, at)
            stop = at + len(cycle) * repeats
            for phase, head in enumerate(cycle):
                run = slice(at + phase, stop, len(cycle))
                try:
                    times, ordered = self._times(stamps[run])
                    points = _floats(values[run])
                except ValueError:
                    raise Declined("a sample without value and timestamp") from None
                if ordered:
                    self._run(head, times, points)
                else:  # compared one by one, as ever (a NaN time, a time going back)
                    for t, v in zip(times, points, strict=True):
                        self._point(head, t, v)
            at = stop

    def read_series(self, runs: list[tuple[bytes, bytes, bytes, bool]]) -> None:
        """A piece as the compiled scan gives it: each series' points in file order, as doubles.

        Also whether the times are finite and increasing.
        """
        for head, stamps, numbers, ordered in runs:
            times, points = array("d"), array("d")
            times.frombytes(stamps)
            points.frombytes(numbers)
            if ordered:
                self._run(head, times, points)
            else:  # compared one by one, as `read` does
                for t, v in zip(times, points, strict=True):
                    self._point(head, t, v)

    def _times(self, stamps: list[bytes]) -> tuple[list[float], bool]:
        """A run's times, and whether they are finite and strictly increasing.

        Series scraped together share timestamps, so the last run's are reused when equal.
        """
        if stamps == self.last_stamps:
            return self.last_times, self.last_ordered
        times = list(map(float, stamps))
        ordered = (
            all(map(math.isfinite, times))
            and times == sorted(times)
            and len(set(times)) == len(times)
        )
        self.last_stamps, self.last_times, self.last_ordered = stamps, times, ordered
        return times, ordered

    def _line(self, line: bytes) -> None:
        try:
            head, value, stamp = line.rsplit(b" ", 2)
            t, v = float(stamp), float(value)
        except ValueError:
            raise Declined("a sample without value and timestamp") from None
        self._point(head, t, v)

    def _point(self, head: bytes, t: float, v: float) -> None:
        if head != self.last_head:
            self._start(head, t)
        if t <= self.last_t:
            raise Declined("a series' points out of time order")
        self.column.append(t, v)
        self.last_t = t

    def _run(self, head: bytes, times: Sequence[float], points: Sequence[float]) -> None:
        if head != self.last_head:
            self._start(head, times[0])
        if times[0] <= self.last_t:  # (strictly increasing after it: see _times)
            raise Declined("a series' points out of time order")
        self.column.extend(times, points)
        self.last_t = times[-1]

    def _start(self, head: bytes, t: float) -> None:
        """A series' run begins: the first time it is seen, or again later in the block."""
        if not (head + b" ").startswith(self.spec.wanted):
            raise Declined("a line of another family")
        known = self.series.get(head)
        if known is None:
            known = self.series[head] = member(head, self.instances)
            column = self.columns[known] = _Column()
            self.started.append(column)
        else:
            column = self.columns[known]  # the same series again, later in the block
            if column.times and t <= column.times[-1]:
                raise Declined("a series' points out of time order")
            if column.shared:  # (a family whose block comes again): its own times to grow
                column.times, column.shared = array("d", column.times), False
        if self.family_users is not None:
            self.family_users.add(known[0].shapes.instance)
        self.column = column
        self.last_head, self.last_t = head, -1.0 if not column.times else column.times[-1]


def _share_times(
    columns: list[_Column], shared: dict[tuple[int, float, float], list[array[float]]]
) -> None:
    """Give series scraped together one shared array of times once their block is read.

    Why: times would otherwise be most of the reader's memory (~60 MB a day of the large body).
    """
    for column in columns:
        times = column.times
        if not times:
            continue
        candidates = shared.setdefault((len(times), times[0], times[-1]), [])
        column.shared = True
        for known in candidates:
            if known == times:
                column.times = known
                break
        else:
            candidates.append(times)


def _floats(values: list[bytes]) -> list[float]:
    """float() of each; a run of one repeated value (a counter's `_created`) is converted once."""
    first = values[0]
    if values.count(first) == len(values):
        value = float(first)
        if value == value:  # (NaN: each its own, as one by one; see _Column.extend)
            return [value] * len(values)
    return list(map(float, values))


# The longest metric point followed in bulk: a histogram's _count, _sum and _created (its
# buckets are not read), with room to spare.
_MAX_CYCLE = 8


def _run_at(heads: list[bytes], at: int) -> tuple[list[bytes], int]:
    """The heads of the metric point at `at` and how many times the point repeats from there.

    Heads are distinct, repeating with their period; ([head], 1) when no period is found.
    """
    try:
        period = heads.index(heads[at], at + 1, at + 1 + _MAX_CYCLE) - at
    except ValueError:
        return heads[at : at + 1], 1
    cycle = heads[at : at + period]
    if len(set(cycle)) != period:
        return heads[at : at + 1], 1
    # The most whole repeats from `at`: doubling, then halving the step.
    room = (len(heads) - at) // period
    good, step = 1, 1
    while good + step <= room and heads[at : at + period * (good + step)] == cycle * (good + step):
        good += step
        step *= 2
    while step > 1:
        step //= 2
        if good + step <= room and heads[at : at + period * (good + step)] == cycle * (good + step):
            good += step
    return cycle, good


def _split_lines(text: bytes) -> tuple[list[bytes], list[bytes], list[bytes]] | None:
    """Lines of `name{labels} value timestamp` taken apart in bulk: (heads, values, timestamps).

    None when a line has other than two blanks.
    """
    parts = text.replace(b"\n", b" ").split(b" ")
    if len(parts) % 3 != 1 or len(parts) == 1:
        return None
    stop = len(parts) - 1
    heads, values, stamps = parts[0:stop:3], parts[1:stop:3], parts[2:stop:3]
    # As many blanks as two a line is not yet two on every line: put the lines back together.
    if b"\n".join(map(b" ".join, zip(heads, values, stamps, strict=True))) != text[:-1]:
        return None
    return heads, values, stamps


def _scrapes(
    columns: dict[tuple[Instance, int], _Column],
    instances: dict[str, Instance],
    users: dict[str, set[str] | None],
) -> Iterator[Extract]:
    seen_times: set[float] = set()
    for inst in instances.values():
        name = inst.shapes.instance
        declared = frozenset(
            family for family, who in users.items() if who is not None and (not who or name in who)
        )
        mine = [(index, columns[(inst, index)]) for index in range(len(inst.members))]
        # Series scraped together have equal times: hold them once, walk them together.
        groups: dict[bytes, tuple[array[float], list[tuple[int, array[float] | _Repeated]]]] = {}
        for index, column in mine:
            key = column.times.tobytes()
            group = groups.get(key)
            if group is None:
                group = groups[key] = (column.times, [])
            group[1].append((index, column.values()))
            column.times = group[0]
        times: set[float] = set()
        for shared, _members in groups.values():
            times.update(shared)
        if not seen_times.isdisjoint(times):
            raise Declined("two instances scraped at the same instant")
        seen_times |= times
        # Each group's rows, one per time: its columns read across (in C, by zip).
        walks = [
            (shared, [index for index, _values in members], _across(members, len(shared)), [0])
            for shared, members in groups.values()
        ]
        for t in sorted(times):
            row: dict[int, float] = {}
            parts = 0
            for shared, indices, rows, cursor in walks:
                at = cursor[0]
                if at < len(shared) and shared[at] == t:
                    row.update(zip(indices, next(rows), strict=True))
                    cursor[0] = at + 1
                    parts += 1
            if parts > 1:
                row = dict(sorted(row.items()))  # file order, as the general reader has it
            yield inst.shapes.extract(row, t, declared)


def _across(
    members: list[tuple[int, array[float] | _Repeated]], points: int
) -> Iterator[tuple[float, ...]]:
    """The members' values at each of their `points` times, a tuple per time."""
    columns = [
        itertools.repeat(values.value) if isinstance(values, _Repeated) else values
        for _index, values in members
    ]
    return itertools.islice(zip(*columns, strict=False), points)  # (repeats are endless)
