"""A fast reader for recordings in the strict OpenMetrics layout (what `record` leaves when it
ends: each family once, each series' points together and in time order).

The general reader sorts such a file's kept lines by timestamp on disk and parses them again.
This one reads it as it lies — series by series — into compact columns (a series' values in
an `array('d')`; the times of series scraped together held once), then rebuilds the scrapes of
each instance in time order and turns them into Extracts through `ingest.shapes`. Memory is
the columns: 8 bytes per kept point.

What a scrape declares follows the general reader (parse._with_families): a family is declared
for the instances that have series of it, or for all when nobody has. Only the families
`catalog.extract` looks at (the offload ones) can change an Extract, so only theirs are
followed. Like the journal reader it declines (`fastjournal.Declined`) what it cannot read
exactly as the general reader would: no `# EOF`, NUL or CR bytes, a line it does not know, a
series whose points go back in time, two instances scraped at the same instant.
"""

from __future__ import annotations

import mmap
import re
from array import array
from collections.abc import Callable, Iterator

from kvoffload.ingest.catalog import FLAT_FAMILY, OFFLOAD_FAMILY_PREFIXES, Extract
from kvoffload.ingest.fastjournal import (
    Declined,
    _Family,
    _family,
    _Instance,
    _mapped,
    _member,
    _next_comment,
    _next_type_line,
    _Pages,
    _wanted_lines,
)
from kvoffload.ingest.parse import canonical_name, family_name

_INSTANCE = re.compile(rb'[{,]instance="((?:[^"\\]|\\.)*)"')


def _relevant(family: str) -> bool:
    """A family whose being declared can change what catalog.extract makes of a scrape."""
    return family.startswith(OFFLOAD_FAMILY_PREFIXES) or family in FLAT_FAMILY.values()


class _Column:
    """One series: its times and values. A series whose value never changes (a counter's
    `_created`, an info metric: half of what is kept) holds its value once."""

    __slots__ = ("first", "times", "varying")

    def __init__(self) -> None:
        self.times = array("d")
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
    """Every scrape of a strict-layout recording as an Extract: instance by instance, each
    in time order. `report`: told the byte offset reached now and then."""
    with _mapped(path) as mm:
        columns, instances, users = _read_columns(mm, report)
    yield from _scrapes(columns, instances, users)


def _read_columns(
    mm: mmap.mmap, report: Callable[[int], None] | None
) -> tuple[dict[tuple[_Instance, int], _Column], dict[str, _Instance], dict[str, set[str] | None]]:
    size = len(mm)
    if size < 6 or mm[size - 6 :] != b"# EOF\n":
        raise Declined("no '# EOF' at the end")
    end_of_data = size - 6
    families: dict[tuple[bytes, bytes], _Family] = {}
    series: dict[bytes, tuple[_Instance, int]] = {}
    instances: dict[str, _Instance] = {}
    columns: dict[tuple[_Instance, int], _Column] = {}
    # family → the instances with series of it (None: not followed), for the relevant ones.
    users: dict[str, set[str] | None] = {}
    unread: dict[str, list[tuple[int, int]]] = {}  # relevant families not read: their blocks
    pages = _Pages(mm, report)
    pos = 0
    while True:
        found = _next_type_line(mm, pos, end_of_data, pages)
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
            spec = families[(raw, mtype)] = _family(raw, mtype)
        if not spec.wanted and not followed:
            continue
        if not spec.wanted:
            block_end = _next_comment(mm, pos, end_of_data, pages)
            unread.setdefault(name, []).append((pos, block_end))
            pos = block_end
            continue
        block_start = pos
        block_end_at: list[int] = []
        family_users = users[name]
        last_head = b""
        column = _Column()
        last_t = 0.0
        for sample in _lines_of(mm, block_start, end_of_data, spec, pages, block_end_at):
            try:
                head, value, stamp = sample.rsplit(b" ", 2)
                t, v = float(stamp), float(value)
            except ValueError:
                raise Declined("a sample without value and timestamp") from None
            if head != last_head:
                known = series.get(head)
                if known is None:
                    known = series[head] = _member(head, instances)
                    column = columns[known] = _Column()
                else:
                    column = columns[known]  # the same series again, later in the block
                    if column.times and t <= column.times[-1]:
                        raise Declined("a series' points out of time order")
                if family_users is not None:
                    family_users.add(known[0].shapes.instance)
                last_head, last_t = head, -1.0 if not column.times else column.times[-1]
            if t <= last_t:
                raise Declined("a series' points out of time order")
            column.append(t, v)
            last_t = t
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


def _pieces(
    mm: mmap.mmap, start: int, end: int, pages: _Pages, stopped: list[int] | None = None
) -> Iterator[bytes]:
    """mm[start:end] (`start` a line start) in pieces that end at line ends; with `stopped`,
    only up to the next line beginning with '#' (the end of a family block), whose offset is
    appended to it."""
    pos = start
    while pos < end:
        limit = min(pos + _PIECE, end)
        if stopped is not None:
            if mm[pos] == 35:  # '#': the block ends here
                stopped.append(pos)
                return
            at = mm.find(b"\n#", pos, limit)
            if at != -1:
                pages.advance(pos)
                yield mm[pos : at + 1]
                stopped.append(at + 1)
                return
        cut = limit
        if limit < end:
            cut = mm.rfind(b"\n", pos, limit) + 1
            if cut <= pos:  # one line longer than a piece: take it whole
                newline = mm.find(b"\n", limit, end)
                cut = end if newline == -1 else newline + 1
        pages.advance(pos)
        yield mm[pos:cut]
        pos = cut
    if stopped is not None:
        stopped.append(end)


def _lines_of(
    mm: mmap.mmap,
    start: int,
    end: int,
    spec: _Family,
    pages: _Pages,
    stopped: list[int],
) -> Iterator[bytes]:
    """The wanted lines of the family block at `start` (it ends at the next '#' line, whose
    offset goes to `stopped`), read a piece at a time."""
    for piece in _pieces(mm, start, end, pages, stopped):
        yield from _wanted_lines(piece, spec)


def _scrapes(
    columns: dict[tuple[_Instance, int], _Column],
    instances: dict[str, _Instance],
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
        walks = [(shared, members, [0]) for shared, members in groups.values()]
        for t in sorted(times):
            row: dict[int, float] = {}
            parts = 0
            for shared, members, cursor in walks:
                at = cursor[0]
                if at < len(shared) and shared[at] == t:
                    for index, values in members:
                        row[index] = values[at]
                    cursor[0] = at + 1
                    parts += 1
            if parts > 1:
                row = dict(sorted(row.items()))  # file order, as the general reader has it
            yield inst.shapes.extract(row, t, declared)
