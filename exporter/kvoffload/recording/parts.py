"""A scrape-ordered recording read in parts, one worker process per part, its scrapes given
back in file order.

Reading a journal (`recording.journal_reader`) costs several times what the window does with what
it reads, so the reading is what runs in parallel: each worker reads its byte range
(`journal_parts`: cuts at scrape boundaries) and writes its scrapes to a spill file; this
process follows the files in order — part 0 while part 1 is still being read — and turns the
scrapes into the catalog's `Extract`s (`ingest.shapes`, as one pass does). The stream is the
one a single pass gives — the same Extracts, in the same order — so the one window built from
it here gives the one-pass figures exactly (joining windows built in parts could not: float
sums depend on their order). A worker that meets what the fast reader declines says so and
the whole read is declined (the caller falls back to the general reader, as for one pass).

What travels is small: a scrape is its time, the families it declared and each instance's
values as an `array('d')` under the series indices it holds (sent once per shape), the series'
names and labels once. Workers are fresh interpreters that import only the reader (~20 MB
each), not forks of this process (each would count its ~55 MB again in the RSS of the tree).
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from kvoffload.ingest.catalog import Extract
from kvoffload.ingest.shapes import Member, ScrapeShapes
from kvoffload.recording.journal_reader import Declined, journal_scrapes


class PartsFailed(Exception):
    """A worker failed or vanished (killed, out of memory): read the file in one pass."""


# Scrapes per record of a spill file: few enough that this process starts at once, enough
# that a record is not mostly framing.
BATCH = 32
_HEADER = struct.Struct("<Q")
# How long to wait before looking again at a spill file this process has caught up with.
_POLL_SECONDS = 0.002


def extracts_in_parts(
    path: str, parts: list[tuple[int, int]], report: Callable[[int], None] | None = None
) -> Iterator[Extract]:
    """Every scrape of the recording at `path`, read in `parts` (byte ranges from
    `journal_parts`) by as many worker processes, in file order. Raises Declined when a part
    is not one the fast reader takes, PartsFailed when a worker fails; `report` is told the
    bytes of the file behind the scrapes given so far."""
    with tempfile.TemporaryDirectory(prefix="kvoffload-parts-") as spill:
        files = [os.path.join(spill, f"part-{i}") for i in range(len(parts))]
        for out in files:
            open(out, "wb").close()  # there to follow before its worker writes
        workers = [
            subprocess.Popen(
                worker_command(path, span, out), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            for span, out in zip(parts, files, strict=True)
        ]
        try:
            last: float | None = None
            for out, worker in zip(files, workers, strict=True):
                seam = last is not None
                for ex in _follow(out, worker, report):
                    # One pass declines a time going back, and joins two scrapes of one time:
                    # the parts are cut between times, so a later part must start later.
                    if seam and last is not None and not ex.timestamp > last:
                        raise Declined("time goes back between parts")
                    seam = False
                    last = ex.timestamp
                    yield ex
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                worker.wait()
                if worker.stderr is not None:
                    worker.stderr.close()


def worker_command(path: str, span: tuple[int, int], out: str) -> list[str]:
    """How a worker is started: this module run by the same interpreter."""
    return [sys.executable, "-m", __name__, path, str(span[0]), str(span[1]), out]


def _follow(
    out: str, worker: subprocess.Popen[bytes], report: Callable[[int], None] | None
) -> Iterator[Extract]:
    """The Extracts of one spill file as its worker writes them, until its end record. The
    worker tells the offset of the file it reached with each batch, for `report`."""
    instances: dict[str, ScrapeShapes] = {}
    shapes: dict[int, tuple[ScrapeShapes, tuple[int, ...]]] = {}
    declared: dict[int, frozenset[str]] = {}
    with open(out, "rb") as fh:
        while True:
            kind, payload = pickle.loads(_next_record(fh, worker))
            if kind == "end":
                return
            if kind == "declined":
                raise Declined(payload)
            if kind == "failed":
                raise PartsFailed(f"a worker reading the recording failed: {payload}")
            reached, members, new_shapes, new_declared, scrapes = payload
            for name, more in members:
                known = instances.get(name)
                if known is None:
                    known = instances[name] = ScrapeShapes(name, [])
                known.members.extend(more)
            for shape_id, name, keys in new_shapes:
                shapes[shape_id] = instances[name], keys
            declared.update(new_declared)
            for t, declared_id, rows in scrapes:
                families = declared[declared_id]
                for shape_id, values in rows:
                    inst, keys = shapes[shape_id]
                    yield inst.extract(dict(zip(keys, values, strict=True)), t, families)
            if report is not None:
                report(reached)


def _next_record(fh: BinaryIO, worker: subprocess.Popen[bytes]) -> bytes:
    """The next whole record of a spill file, waiting for its worker to write it."""
    start = fh.tell()
    while True:
        ended = worker.poll() is not None  # before reading: what it wrote before it ended
        header = fh.read(_HEADER.size)
        if len(header) == _HEADER.size:
            (size,) = _HEADER.unpack(header)
            data = fh.read(size)
            if len(data) == size:
                return data
        fh.seek(start)
        if ended:
            why = worker.stderr.read().decode(errors="replace").strip() if worker.stderr else ""
            raise PartsFailed(
                f"a worker reading the recording stopped early (exit code {worker.returncode})"
                + (f": {why.splitlines()[-1]}" if why else "")
            )
        time.sleep(_POLL_SECONDS)


def _work(path: str, span: tuple[int, int], out: str) -> None:
    """A worker: the scrapes of `span`, written to `out` as ("batch", …) records, then
    ("end", None); ("declined", why) or ("failed", what) instead when it cannot."""
    reached = [span[0]]

    def progress(pos: int) -> None:
        reached[0] = pos

    with open(out, "ab") as fh:

        def write(record: tuple[str, Any]) -> None:
            data = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
            fh.write(_HEADER.pack(len(data)) + data)
            fh.flush()  # read while this goes on

        sent_members: dict[str, int] = {}  # instance → members already sent
        shape_ids: dict[tuple[str, tuple[int, ...]], int] = {}
        declared_ids: dict[frozenset[str], int] = {}
        batch: list[tuple[float, int, list[tuple[int, array[float]]]]] = []
        new_shapes: list[tuple[int, str, tuple[int, ...]]] = []
        new_declared: dict[int, frozenset[str]] = {}
        touched: dict[str, list[Member]] = {}

        def flush() -> None:
            members = []
            for name, member_list in touched.items():
                members.append((name, member_list[sent_members.get(name, 0) :]))
                sent_members[name] = len(member_list)
            write(("batch", (reached[0], members, new_shapes, new_declared, batch)))
            touched.clear()

        try:
            for t, families, rows in journal_scrapes(path, span=span, report=progress):
                declared_id = declared_ids.get(families)
                if declared_id is None:
                    declared_id = declared_ids[families] = len(declared_ids)
                    new_declared[declared_id] = families
                parts = []
                for inst, row in rows.items():
                    name = inst.shapes.instance
                    if len(inst.members) != sent_members.get(name, 0):
                        touched[name] = inst.members
                    keys = tuple(row)
                    shape_id = shape_ids.get((name, keys))
                    if shape_id is None:
                        shape_id = shape_ids[(name, keys)] = len(shape_ids)
                        new_shapes.append((shape_id, name, keys))
                    parts.append((shape_id, array("d", row.values())))
                batch.append((t, declared_id, parts))
                if len(batch) == BATCH:
                    flush()
                    batch, new_shapes, new_declared = [], [], {}
            flush()
            write(("end", None))
        except Declined as exc:
            write(("declined", str(exc)))
        except Exception as exc:  # this process's caller says what; a traceback helps no one
            write(("failed", f"{type(exc).__name__}: {exc}"))


if __name__ == "__main__":
    _work(sys.argv[1], (int(sys.argv[2]), int(sys.argv[3])), sys.argv[4])
