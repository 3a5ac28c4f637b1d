"""A strict recording's family blocks in the mapped file: where they are, what to read of them.

The strict reader jumps between `#` lines with memchr and passes over unread families unseen.
This module holds those steps and `Declined`, raised for a file it cannot read exactly as the
general reader would.
"""

from __future__ import annotations

import mmap
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from kvoffload.ingest.catalog import _INDEX
from kvoffload.ingest.parse import ParseError, _parse_labels, canonical_name
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
class Family:
    wanted: tuple[bytes, ...]  # "name{" and "name " of the sample names the catalog reads
    unwanted: tuple[bytes, ...]  # the same of the family's other names (histogram buckets)
    # Finds the wanted lines (after a newline) in one pass, in file order: the literal part
    # the names share is searched for, and only those lines are tried.
    pattern: re.Pattern[bytes]


def family_spec(raw: bytes, mtype: bytes) -> Family:
    """What to read in a family block: sample names as spelled, checked under the canonical one.

    A file may store vLLM's names as `vllm_…`.
    """
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
    return Family(
        tuple(n + end for n in wanted for end in (b"{", b" ")),
        tuple(n + end for n in names if n not in wanted for end in (b"{", b" ")),
        re.compile(b"\n(" + re.escape(shared) + b"(?:" + rests + b")[{ ][^\n]*)"),
    )


class Instance:
    def __init__(self, name: str) -> None:
        self.members: list[Member] = []
        self.shapes = ScrapeShapes(name, self.members)


def wanted_lines(block: bytes, spec: Family) -> list[bytes]:
    """The lines of a family block the catalog reads, in file order.

    A block of only wanted names is split. One with other names (a histogram's buckets) is searched
    for the wanted ones, its other lines only counted.
    """
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


def wanted_text(block: bytes, spec: Family) -> bytes:
    """The lines of a family block the catalog reads, each ending in a newline.

    The block itself when it has no other names (its lines are checked where they are read).
    """
    if not spec.unwanted:
        return block
    lines = wanted_lines(block, spec)
    return b"\n".join(lines) + b"\n" if lines else b""


def member(head: bytes, instances: dict[str, Instance]) -> tuple[Instance, int]:
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
        inst = instances[instance_name] = Instance(instance_name)
    inst.members.append((sample_name, labels))
    return inst, len(inst.members) - 1


def mapped(path: str) -> mmap.mmap:
    try:
        with open(path, "rb") as fh:
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        raise Declined("cannot map the file") from None  # the general reader says why


def next_type_line(
    mm: mmap.mmap, pos: int, end: int, pages: Pages
) -> tuple[int, bytes, bytes] | None:
    """The next `# TYPE name type` line at or after `pos`, other comments passed over.

    Returns (where the next line starts, name, type); None at the end.
    """
    while pos < end:
        pages.at(pos)
        hash_at = next_comment(mm, pos, end, pages)
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


def next_comment(mm: mmap.mmap, pos: int, end: int, pages: Pages) -> int:
    """Where the next line beginning with '#' starts (`end` if none).

    A '#' inside a line is passed over. It is searched a region at a time, the pages behind given
    back. So skipping a huge family holds none of it.
    """
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


class Pages:
    """Keeps what the reader holds of the mapped file to a few regions.

    Why: the pages behind are given back, so RSS does not grow with the file. The region ahead is
    checked for NUL and CR bytes before it is read (those files are left to iter_openmetrics).
    """

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


ScanSeries = Callable[..., list[tuple[bytes, bytes, bytes, bool]] | None]
compiled_scan: ScanSeries | None
try:  # the compiled scan, when it was built (pip builds it where there is a C compiler)
    from kvoffload.recording._scan import scan_series as compiled_scan
except ImportError:  # pragma: no cover - depends on the build
    compiled_scan = None

# Which scan the strict reader uses: the compiled one unless KVOFFLOAD_PURE_PYTHON is set (tests
# and the bench run both; they give the same scrapes).
COMPILED = compiled_scan is not None and not os.environ.get("KVOFFLOAD_PURE_PYTHON")
