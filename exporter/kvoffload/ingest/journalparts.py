"""A scrape-ordered recording read in parts, one forked process per part, its scrapes given back
in file order.

Reading a journal (`ingest.fastjournal`) costs several times what the window does with what
it reads, so the reading is what runs in parallel: each worker reads its byte range
(`journal_parts`: cuts at scrape boundaries) and writes its scrapes, as the catalog's
`Extract`s, to a spill file in pickled batches; this process follows the files in order, part
0 while part 1 is still being read. The stream is the one a single pass gives — the same
Extracts, in the same order — so the one window built from it in this process gives the
one-pass figures exactly (joining windows built in parts could not: float sums depend on
their order). A worker that meets what the fast reader declines says so and the whole read is
declined (the caller falls back to the general reader, as for one pass).

Memory: a worker holds one batch; the spill files (~13 kB a scrape of an 8-engine, 3-model
vLLM) live in the temporary directory until the read ends.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import struct
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from kvoffload.ingest.catalog import Extract
from kvoffload.ingest.fastjournal import Declined, journal_extracts


class PartsFailed(Exception):
    """A worker failed or vanished (killed, out of memory): read the file in one pass."""


# Scrapes per record of a spill file: few enough that the parent starts at once, enough that
# pickle shares each batch's repeated keys (a scrape's keys are the previous one's).
BATCH = 32
_HEADER = struct.Struct("<Q")
# How long the parent waits before looking again at a spill file it has caught up with.
_POLL_SECONDS = 0.002


def extracts_in_parts(
    path: str, parts: list[tuple[int, int]], report: Callable[[int], None] | None = None
) -> Iterator[Extract]:
    """Every scrape of the recording at `path`, read in `parts` (byte ranges from
    `journal_parts`) by as many forked processes, in file order. Raises Declined when a part
    is not one the fast reader takes; `report` is told the bytes read so far, now and then."""
    # fork: the workers start at once and share nothing to set up (the CLI is one thread
    # doing this; a progress thread, if any, only reads).
    context = multiprocessing.get_context("fork")
    reached: Any = context.Array("q", len(parts), lock=False)
    with tempfile.TemporaryDirectory(prefix="kvoffload-parts-") as spill:
        files = [os.path.join(spill, f"part-{i}") for i in range(len(parts))]
        workers = [
            context.Process(target=_read_part, args=(path, span, out, reached, i), daemon=True)
            for i, (span, out) in enumerate(zip(parts, files, strict=True))
        ]
        for out in files:
            open(out, "wb").close()  # there to follow before its worker writes
        for worker in workers:
            worker.start()
        try:
            last: float | None = None
            for out, worker in zip(files, workers, strict=True):
                seam = last is not None
                for batch in _follow(out, worker, reached, report):
                    if not batch:
                        continue
                    # One pass declines a time going back, and joins two scrapes of one time:
                    # the parts are cut between times, so a later part must start later.
                    if seam and last is not None and not batch[0].timestamp > last:
                        raise Declined("time goes back between parts")
                    seam = False
                    last = batch[-1].timestamp
                    yield from batch
        finally:
            for worker in workers:
                if worker.is_alive():
                    worker.kill()
                worker.join()


def _read_part(path: str, span: tuple[int, int], out: str, reached: Any, slot: int) -> None:
    """A worker: the scrapes of `span`, written to `out` as ("batch", [Extract, …]) records,
    then ("end", None); ("declined", why) or ("failed", what) instead when it cannot."""

    def progress(pos: int) -> None:
        reached[slot] = pos - span[0]

    with open(out, "ab") as fh:

        def write(record: tuple[str, object]) -> None:
            data = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
            fh.write(_HEADER.pack(len(data)) + data)
            fh.flush()  # the parent reads it while this goes on

        try:
            batch: list[Extract] = []
            for ex in journal_extracts(path, span=span, report=progress):
                batch.append(ex)
                if len(batch) == BATCH:
                    write(("batch", batch))
                    batch = []
            write(("batch", batch))
            write(("end", None))
        except Declined as exc:
            write(("declined", str(exc)))
        except Exception as exc:  # the parent says what; a traceback here helps no one
            write(("failed", f"{type(exc).__name__}: {exc}"))


def _follow(
    out: str,
    worker: multiprocessing.process.BaseProcess,
    reached: Any,
    report: Callable[[int], None] | None,
) -> Iterator[list[Extract]]:
    """The batches of one spill file as its worker writes them, until its end record."""
    with open(out, "rb") as fh:
        while True:
            record = _next_record(fh, worker)
            if report is not None:
                report(sum(reached))
            kind, payload = pickle.loads(record)
            if kind == "batch":
                yield payload
            elif kind == "end":
                return
            elif kind == "declined":
                raise Declined(payload)
            else:
                raise PartsFailed(f"a worker reading the recording failed: {payload}")


def _next_record(fh: Any, worker: multiprocessing.process.BaseProcess) -> bytes:
    """The next whole record of a spill file, waiting for its worker to write it."""
    start = fh.tell()
    while True:
        header = fh.read(_HEADER.size)
        if len(header) == _HEADER.size:
            (size,) = _HEADER.unpack(header)
            data = fh.read(size)
            if len(data) == size:
                return data
        # Caught up with the worker: look again shortly, unless it is gone (then what it
        # wrote before it went is read once more first).
        alive = worker.is_alive()
        fh.seek(start)
        if not alive:
            header = fh.read(_HEADER.size)
            if len(header) == _HEADER.size:
                (size,) = _HEADER.unpack(header)
                data = fh.read(size)
                if len(data) == size:
                    return data
            raise PartsFailed(
                f"a worker reading the recording stopped early (exit code {worker.exitcode})"
            )
        time.sleep(_POLL_SECONDS)
