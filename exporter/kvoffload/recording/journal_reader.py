"""A fast reader for scrape-ordered recordings (journals, the layout long recordings have).

`iter_openmetrics` reads any valid layout line by line, checking everything; on a 24-hour
recording of a large vLLM body that is ~9 million kept lines of Python work. This reader does
the same job for the common case in bytes: it memory-maps the file, jumps from one `#` line to
the next with a byte search (memchr), skips the families the catalog does not read without
looking at their lines, reads a wanted family's block in bulk — in place, by the compiled scan
(recording/_scan.c) where it was built, else by `_scan_block`, its pure-Python twin — and turns
each scrape into an `Extract` through `ingest.shapes` (catalog.extract once per scrape shape).

It only takes files it can read exactly as `iter_openmetrics` would: whole (`# EOF` last),
scrape by scrape (time never goes back), no NUL or CR bytes, every line of a wanted block
either a sample line with a timestamp or one of the family's sample names the catalog does
not read. Anything else raises `Declined` — before the first scrape or midway — and the
caller starts again with the general reader, which reads or rejects it with its usual errors.
"""

from __future__ import annotations

import itertools
import math
import mmap
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kvoffload.ingest.catalog import _INDEX, Extract
from kvoffload.ingest.parse import ParseError, _parse_labels, canonical_name, family_name
from kvoffload.ingest.shapes import Member, ScrapeShapes

_SUFFIXES = {
    b"counter": (b"_total", b"_created"),
    b"histogram": (b"_bucket", b"_count", b"_sum", b"_created"),
    b"gaugehistogram": (b"_bucket", b"_gcount", b"_gsum"),
    b"summary": (b"", b"_count", b"_sum", b"_created"),
    b"info": (b"_info",),
}


class Declined(Exception):
    """Not a file this reader takes exactly; read it with the general reader."""


@dataclass(frozen=True)
class _Family:
    wanted: tuple[bytes, ...]  # "name{" and "name " of the sample names the catalog reads
    unwanted: tuple[bytes, ...]  # the same of the family's other names (histogram buckets)
    # Finds the wanted lines (after a newline) in one pass, in file order: the literal part
    # the names share is searched for, and only those lines are tried.
    pattern: re.Pattern[bytes]


def _family(raw: bytes, mtype: bytes) -> _Family:
    """What to read in a family block: sample names under their raw spelling (a file may
    store vLLM's names as `vllm_…`), checked against the catalog under the canonical one."""
    base = raw[:-6] if mtype == b"counter" and raw.endswith(b"_total") else raw
    names = [base + s for s in _SUFFIXES.get(mtype, (b"",))]
    if mtype == b"gauge" or mtype not in _SUFFIXES:
        names = [base]
    wanted = [n for n in names if canonical_name(n.decode()) in _INDEX]
    shared = wanted[0] if wanted else b""
    for n in wanted:
        while not n.startswith(shared):
            shared = shared[:-1]
    rests = b"|".join(re.escape(n[len(shared) :]) for n in wanted)
    return _Family(
        tuple(n + end for n in wanted for end in (b"{", b" ")),
        tuple(n + end for n in names if n not in wanted for end in (b"{", b" ")),
        re.compile(b"\n(" + re.escape(shared) + b"(?:" + rests + b")[{ ][^\n]*)"),
    )


class _Instance:
    def __init__(self, name: str) -> None:
        self.members: list[Member] = []
        self.shapes = ScrapeShapes(name, self.members)


def _wanted_lines(block: bytes, spec: _Family) -> list[bytes]:
    """The lines of a family block the catalog reads, in file order. A block of only wanted
    names is split; one with names not read (a histogram's buckets, most of its lines) is
    searched for the wanted names instead, and its other lines are only counted."""
    if not spec.unwanted:
        lines = block.split(b"\n")[:-1]
        for line in lines:
            if not line.startswith(spec.wanted):
                raise Declined("a line of another family")
        return lines
    probe = b"\n" + block
    hits = spec.pattern.findall(probe)
    line_count = block.count(b"\n")
    # The other lines must all be the family's other names: counted, those with labels
    # first (a histogram's buckets have them; the rest are counted only when short).
    others = len(hits)
    for needles in (spec.unwanted[0::2], spec.unwanted[1::2]):
        others += sum(probe.count(b"\n" + prefix) for prefix in needles)
        if others == line_count:
            return hits
    raise Declined("a line of another family")


def _wanted_text(block: bytes, spec: _Family) -> bytes:
    """The lines of a family block the catalog reads, each ending in a newline: the block
    itself when it has no other names (its lines are checked where they are read)."""
    if not spec.unwanted:
        return block
    lines = _wanted_lines(block, spec)
    return b"\n".join(lines) + b"\n" if lines else b""


def _columns(text: bytes) -> tuple[list[bytes], list[bytes], bytes] | None:
    """Lines of `name{labels} value timestamp` with one timestamp, taken apart in bulk:
    (heads, values, the timestamp); None when a line has other than two blanks (a label
    value with a blank: read line by line) or the timestamps differ."""
    # Two blanks and a newline a line: three parts a line, and one after the last newline
    # (the check below makes sure of the lines; counting newlines first costs a pass).
    parts = text.replace(b"\n", b" ").split(b" ")
    lines, extra = divmod(len(parts) - 1, 3)
    if not lines or extra or not text.endswith(b"\n"):
        return None
    stop = 3 * lines
    heads, values, stamps = parts[0:stop:3], parts[1:stop:3], parts[2:stop:3]
    # As many blanks as two a line is not yet two on every line: put the lines back together.
    if b"\n".join(map(b" ".join, zip(heads, values, stamps, strict=True))) != text[:-1]:
        return None
    if stamps.count(stamps[0]) != lines:
        return None
    return heads, values, stamps[0]


@dataclass(frozen=True)
class _Layout:
    """Where a family block's lines go, learnt from its heads: the next scrape's block has the
    same heads in the same order (vLLM renders its series in a fixed order), so its values go
    straight to their places — one comparison of the heads instead of work per line."""

    heads: list[bytes]
    runs: list[tuple[_Instance, list[int], int]]  # (instance, member indices, first line)

    @staticmethod
    def learn(
        heads: list[bytes],
        spec: _Family,
        series: dict[bytes, tuple[_Instance, int]],
        instances: dict[str, _Instance],
    ) -> _Layout:
        runs: list[tuple[_Instance, list[int], int]] = []
        for at, head in enumerate(heads):
            if not (head + b" ").startswith(spec.wanted):
                raise Declined("a line of another family")
            known = series.get(head)
            if known is None:
                known = series[head] = _member(head, instances)
            inst, index = known
            if runs and runs[-1][0] is inst:
                runs[-1][1].append(index)
            else:
                runs.append((inst, [index], at))
        return _Layout(heads, runs)


def _member(head: bytes, instances: dict[str, _Instance]) -> tuple[_Instance, int]:
    """A series seen for the first time: its name and labels, under its instance."""
    brace = head.find(b"{")
    if brace == -1:
        name, labels_text = head, b""
    elif head.endswith(b"}"):
        name, labels_text = head[:brace], head[brace + 1 : -1]
    else:
        raise Declined("a malformed label set")
    try:
        labels = _parse_labels(labels_text.decode(), 0) if labels_text else {}
        sample_name = canonical_name(name.decode())
    except (ParseError, UnicodeDecodeError):
        raise Declined("labels") from None
    if not name or b" " in name:
        raise Declined("a malformed name")
    instance_name = labels.get("instance", "")
    inst = instances.get(instance_name)
    if inst is None:
        inst = instances[instance_name] = _Instance(instance_name)
    inst.members.append((sample_name, labels))
    return inst, len(inst.members) - 1


def journal_extracts(
    path: str,
    tail_seconds: float | None = None,
    span: tuple[int, int] | None = None,
    report: Callable[[int], None] | None = None,
) -> Iterator[Extract]:
    """Every scrape of a scrape-ordered recording as an Extract, in file order; with
    `tail_seconds`, only from the last scrape at or before the last one's time minus that
    (found by bisecting the file: a window over the last minutes of a day-long recording
    reads only those minutes, which is all a window of that length keeps; the part before is
    not looked at, so a fault there goes unseen). `span`: only the scrapes in that byte
    range (one of `journal_parts`). `report`: told the byte offset reached now and then."""
    with _mapped(path) as mm:
        yield from _read(mm, tail_seconds, span, report)


def journal_scrapes(
    path: str,
    span: tuple[int, int] | None = None,
    report: Callable[[int], None] | None = None,
) -> Iterator[Scrape]:
    """journal_extracts' scrapes as read, before they become Extracts — (time, families
    declared, each instance's values by series index; the instances' `members` name the
    series): for a reader that makes the Extracts in another process (recording.parts)."""
    with _mapped(path) as mm:
        yield from _read_rows(mm, None, span, report)


def _sample_at(mm: mmap.mmap, pos: int, end: int) -> tuple[int, float] | None:
    """The first sample line starting at or after `pos`: (its start, its timestamp)."""
    if pos:
        pos = mm.find(b"\n", pos - 1, end) + 1
        if pos == 0:
            return None
    while pos < end:
        eol = mm.find(b"\n", pos, end)
        if eol == -1:
            return None
        if mm[pos] != 35:  # not a '#' line
            try:
                return pos, float(mm[pos:eol].rsplit(b" ", 2)[2])
            except (ValueError, IndexError):
                raise Declined("a sample line without timestamp") from None
        pos = eol + 1
    return None


def _back_over_comments(mm: mmap.mmap, line: int) -> int:
    """The start of the run of '#' lines right before the line starting at `line`."""
    while line > 0:
        previous = mm.rfind(b"\n", 0, line - 1) + 1
        if mm[previous] != 35:
            break
        line = previous
    return line


def _first_at_or_after(mm: mmap.mmap, t: float, end: int) -> int:
    """The line start of the first sample at `t` or later (times never go back in a
    scrape-ordered file), bisecting the bytes."""
    lo, hi = 0, end
    while lo < hi:
        mid = (lo + hi) // 2
        found = _sample_at(mm, mid, end)
        if found is None or found[1] >= t:
            hi = mid
        else:
            lo = mid + 1
    found = _sample_at(mm, lo, end)
    return found[0] if found is not None else end


def _scrape_start(mm: mmap.mmap, since: float, end: int) -> int:
    """Where the last scrape at or before `since` begins — with the TYPE lines before its
    first sample, which the general reader gives to it (0 when no scrape is that early)."""
    later = _back_over_comments(mm, _first_at_or_after(mm, math.nextafter(since, math.inf), end))
    if later == 0:
        return 0
    last = _sample_at(mm, mm.rfind(b"\n", 0, later - 1) + 1, end)
    if last is None:
        return 0
    return _back_over_comments(mm, _first_at_or_after(mm, last[1], end))


def _mapped(path: str) -> mmap.mmap:
    try:
        with open(path, "rb") as fh:
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        raise Declined("cannot map the file") from None  # the general reader says why


def _next_type_line(
    mm: mmap.mmap, pos: int, end: int, pages: _Pages
) -> tuple[int, bytes, bytes] | None:
    """The next `# TYPE name type` line at or after `pos` (other comments passed over):
    (where the line after it starts, name, type); None at the end."""
    while pos < end:
        pages.at(pos)
        hash_at = _next_comment(mm, pos, end, pages)
        if hash_at >= end:
            return None
        eol = mm.find(b"\n", hash_at)
        line = mm[hash_at:eol]
        pos = eol + 1
        if line.startswith(b"# TYPE "):
            parts = line.split()
            if len(parts) != 4:
                raise Declined("odd TYPE line")
            return pos, parts[2], parts[3]
    return None


def scrape_ordered(path: str, probe: int = 64 * 2**20) -> bool:
    """Whether a recording is scrape by scrape (its first TYPE line comes again: each scrape
    declares its families) or another layout (declared once: the strict one). The search
    stops `probe` bytes in; a journal with scrapes larger than that reads as strict, which
    the strict reader declines (a family declared twice)."""
    with _mapped(path) as mm:
        start = mm.find(b"# TYPE ", 0, probe)
        if start == -1:
            raise Declined("no TYPE line")
        eol = mm.find(b"\n", start, probe)
        if eol == -1:
            return False
        needle = b"\n" + mm[start : eol + 1]
        step = 4 * 2**20
        for at in range(eol, min(len(mm), probe), step):
            if mm.find(needle, at, at + step + len(needle)) != -1:
                return True
            if hasattr(mmap, "MADV_DONTNEED"):  # what was searched is not kept
                done = at + step - (at + step) % mmap.PAGESIZE
                mm.madvise(mmap.MADV_DONTNEED, 0, min(done, len(mm)))
        return False


def journal_parts(path: str, parts: int) -> list[tuple[int, int]]:
    """`parts` byte ranges of about equal size that start and end at scrape boundaries (the
    TYPE lines before a scrape's first sample go with it), for reading in parallel; fewer
    when the file has fewer scrapes. Declined when the file is not one this reader takes."""
    with _mapped(path) as mm:
        size = len(mm)
        if size < 6 or mm[size - 6 :] != b"# EOF\n":
            raise Declined("no '# EOF' at the end")
        end = size - 6
        cuts = [0]
        for k in range(1, parts):
            found = _sample_at(mm, end * k // parts, end)
            if found is None:
                break
            # The scrape after the one at this offset begins here.
            cut = _back_over_comments(
                mm, _first_at_or_after(mm, math.nextafter(found[1], math.inf), end)
            )
            if cuts[-1] < cut < end:
                cuts.append(cut)
        cuts.append(end)
        return list(itertools.pairwise(cuts))


def _next_comment(mm: mmap.mmap, pos: int, end: int, pages: _Pages) -> int:
    """Where the next line beginning with '#' starts (`end` if none): searched a region at a
    time, the pages behind given back, so skipping a family of hundreds of MB holds none of
    it. A '#' inside a line (a label value) is passed over."""
    step = pages.REGION
    while pos < end:
        stop = min(pos + step, end)
        at = mm.find(b"#", pos, stop)
        while at > 0 and mm[at - 1] != 10:
            at = mm.find(b"#", at + 1, stop)
        if at != -1:
            return at
        pos = stop
        pages.advance(pos)
    return end


class _Pages:
    """Keeps what the reader holds of the mapped file to a few regions: the region ahead is
    checked for NUL and CR bytes before it is read (iter_openmetrics refuses the first and
    strips the second; both are left to it), and the pages behind are given back, so the
    process does not grow with the file (mapped pages it touched count in its RSS)."""

    REGION = 2 * 2**20

    def __init__(
        self, mm: mmap.mmap, report: Callable[[int], None] | None = None, start: int = 0
    ) -> None:
        self.mm = mm
        self.report = report  # told the offset reached, for a progress line
        self.size = len(mm)
        # A reader that starts further in (a window's tail, a part) holds nothing before it.
        self.checked = start
        self.released = start - start % mmap.PAGESIZE
        self.next_step = 0

    def at(self, pos: int) -> None:
        """The reader is at `pos`: check ahead and give back behind when due."""
        if pos >= self.next_step:
            self.next_step = self.advance(pos)

    def advance(self, pos: int) -> int:
        """Called at `pos`; returns where to call again."""
        mm, region = self.mm, self.REGION
        if pos < self.released:  # a second look at an earlier part (it was checked)
            self.released = pos - pos % mmap.PAGESIZE
        while self.checked < min(pos + 2 * region, self.size):
            stop = min(self.checked + region, self.size)
            if (
                mm.find(b"\x00", self.checked, stop) != -1
                or mm.find(b"\r", self.checked, stop) != -1
            ):
                raise Declined("NUL or CR bytes")
            self.checked = stop
        behind = pos - region
        behind -= behind % mmap.PAGESIZE
        if behind > self.released and hasattr(mmap, "MADV_DONTNEED"):
            mm.madvise(mmap.MADV_DONTNEED, self.released, behind - self.released)
            self.released = behind
        if self.report is not None:
            self.report(pos)
        return pos + region // 4


def _read(
    mm: mmap.mmap,
    tail_seconds: float | None = None,
    span: tuple[int, int] | None = None,
    report: Callable[[int], None] | None = None,
) -> Iterator[Extract]:
    for t, declared, rows in _read_rows(mm, tail_seconds, span, report):
        for inst, row in rows.items():
            yield inst.shapes.extract(row, t, declared)


# A scrape as read: its time, the families it declared, each instance's values by series.
Scrape = tuple[float, frozenset[str], dict["_Instance", dict[int, float]]]


class _Scrapes:
    """The scrape being put together: its time, the families it declared, its rows."""

    def __init__(self) -> None:
        self.t: float | None = None
        self.stamp = b""  # the last timestamp read, as written
        self.families: set[str] = set()
        self.rows: dict[_Instance, dict[int, float]] = {}
        self.declared: set[str] = set()  # TYPE lines since the last sample, as iter_openmetrics

    def at(self, stamp: bytes) -> Scrape | None:
        """A sample stamped `stamp` is read: the scrape before it when this one starts a new
        one (the TYPE lines read since the last sample go to the scrape it is in)."""
        finished = None
        if stamp != self.stamp:
            try:
                t = float(stamp)
            except ValueError:
                raise Declined("timestamp") from None
            self.stamp = stamp
            if t != self.t:
                if self.t is not None:
                    if t < self.t:
                        raise Declined("time goes back")
                    finished = self.last()
                self.t = t
                self.rows = {}
                self.families = set()
        if self.declared:
            self.families |= self.declared
            self.declared = set()
        return finished

    def last(self) -> Scrape:
        assert self.t is not None
        return self.t, frozenset(self.families), self.rows


def _scan_block(
    spec: _Family, buffer: mmap.mmap | bytes, start: int, end: int, expected: list[bytes] | None
) -> tuple[list[float], bytes, list[bytes] | None] | None:
    """A family block's wanted lines in bulk: (their values, their one timestamp, their heads
    — None when they are `expected`, heads this returned for the family's last block); None
    when the block is not that simple (the caller reads it line by line). recording/_scan.c is
    this function compiled; the two are tested against each other."""
    block = buffer[start:end]
    if not block.endswith(b"\n"):
        return None
    try:
        text = _wanted_text(block, spec)
    except Declined:
        return None
    columns = _columns(text)
    if columns is None:
        return None
    heads, values, stamp = columns
    same = heads == expected  # (then checked when they were learnt)
    foreign = not same and not spec.unwanted
    if foreign and not all((h + b" ").startswith(spec.wanted) for h in heads):
        return None
    floats = _floats(values)
    return None if floats is None else (floats, stamp, None if same else heads)


def _floats(values: list[bytes]) -> list[float] | None:
    try:
        return list(map(float, values))
    except ValueError:
        return None


_compiled_scan_block: Callable[..., tuple[list[float], bytes, list[bytes] | None] | None] | None
_compiled_scan_series: Callable[..., list[tuple[bytes, bytes, bytes, bool]] | None] | None
try:  # the compiled scan, when it was built (pip builds it where there is a C compiler)
    from kvoffload.recording._scan import scan_block as _compiled_scan_block
    from kvoffload.recording._scan import scan_series as _compiled_scan_series
except ImportError:  # pragma: no cover - depends on the build
    _compiled_scan_block = _compiled_scan_series = None

# Which scan the reader uses: the compiled one unless KVOFFLOAD_PURE_PYTHON is set (tests and
# `make bench` run both; they give the same scrapes).
COMPILED = _compiled_scan_block is not None and not os.environ.get("KVOFFLOAD_PURE_PYTHON")


def _scanner(
    compiled: bool,
) -> Callable[
    [_Family, mmap.mmap, int, int, list[bytes] | None],
    tuple[list[float], bytes, list[bytes] | None] | None,
]:
    if compiled and _compiled_scan_block is not None:
        scan = _compiled_scan_block
        return lambda spec, mm, start, end, expected: scan(
            mm, start, end, spec.wanted, spec.unwanted, expected
        )
    return _scan_block


def _read_rows(
    mm: mmap.mmap,
    tail_seconds: float | None = None,
    span: tuple[int, int] | None = None,
    report: Callable[[int], None] | None = None,
) -> Iterator[Scrape]:
    size = len(mm)
    if size < 6 or mm[size - 6 :] != b"# EOF\n":
        raise Declined("no '# EOF' at the end")
    # (raw name, type) → how to read its block, and the family name it declares
    families: dict[tuple[bytes, bytes], tuple[_Family, str]] = {}
    series: dict[bytes, tuple[_Instance, int]] = {}
    layouts: dict[bytes, _Layout] = {}  # family (raw name) → its last block's layout
    instances: dict[str, _Instance] = {}
    scrape = _Scrapes()
    scan = _scanner(COMPILED)
    end_of_data = size - 6 if span is None else span[1]
    pos = 0 if span is None else span[0]
    if tail_seconds is not None:
        last_line = _back_over_comments(mm, end_of_data)
        last = _sample_at(mm, mm.rfind(b"\n", 0, max(last_line - 1, 0)) + 1, end_of_data)
        if last is not None:
            pos = _scrape_start(mm, last[1] - tail_seconds, end_of_data)

    window = _Pages(mm, report, pos)
    while True:
        type_line = _next_type_line(mm, pos, end_of_data, window)
        if type_line is None:
            break
        pos, raw, mtype = type_line
        known = families.get((raw, mtype))
        if known is None:
            known = families[(raw, mtype)] = (
                _family(raw, mtype),
                family_name(canonical_name(raw.decode()), mtype.decode()),
            )
        spec = known[0]
        scrape.declared.add(known[1])
        if not spec.wanted:
            continue  # the block is skipped by the next search for '#'
        block_end = _next_comment(mm, pos, end_of_data, window)
        layout = layouts.get(raw)
        scanned = scan(spec, mm, pos, block_end, None if layout is None else layout.heads)
        if scanned is None:
            text = _wanted_text(mm[pos:block_end], spec)
            yield from _read_lines(text.split(b"\n")[:-1], spec, scrape, series, instances)
        else:
            floats, stamp, heads = scanned
            if heads is not None:
                layout = layouts[raw] = _Layout.learn(heads, spec, series, instances)
            assert layout is not None
            finished = scrape.at(stamp)
            if finished is not None:
                yield finished
            rows = scrape.rows
            for inst, indices, at in layout.runs:
                found = rows.get(inst)
                if found is None:
                    found = rows[inst] = {}
                found.update(zip(indices, floats[at : at + len(indices)], strict=True))
        pos = block_end
    if scrape.t is None:
        raise Declined("no samples")
    scrape.families |= scrape.declared
    yield scrape.last()


def _read_lines(
    lines: list[bytes],
    spec: _Family,
    scrape: _Scrapes,
    series: dict[bytes, tuple[_Instance, int]],
    instances: dict[str, _Instance],
) -> Iterator[Scrape]:
    """A block's wanted lines one at a time (label values with blanks, several timestamps)."""
    row: dict[int, float] = {}
    row_of: _Instance | None = None
    rows_of = None
    for line in lines:
        if not spec.unwanted and not line.startswith(spec.wanted):
            raise Declined("a line of another family")
        try:
            head, value, stamp = line.rsplit(b" ", 2)
        except ValueError:
            raise Declined("a sample without value and timestamp") from None
        known = series.get(head)
        if known is None:
            known = series[head] = _member(head, instances)
        finished = scrape.at(stamp)
        if finished is not None:
            yield finished
        inst, index = known
        if inst is not row_of or scrape.rows is not rows_of:  # most lines: one instance's
            rows_of = scrape.rows
            found = rows_of.get(inst)
            if found is None:
                found = rows_of[inst] = {}
            row, row_of = found, inst
        try:
            row[index] = float(value)
        except ValueError:
            raise Declined("value") from None
