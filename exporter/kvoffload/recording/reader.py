"""The one way to read a recording: the fastest reader that takes the file, else the general one.

`read(path, consume)` hands the file's scrapes, in the catalog's terms, to `consume` and returns
what it returns. A fast reader may decline part-way (a layout it does not know, a name that is
not UTF-8); then `consume` is called again, from the start, on the general reader's scrapes —
which is why the face takes a consumer instead of returning an iterator.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from typing import TypeVar

from kvoffload.ingest.catalog import WANTED_FAMILIES, Extract, extract, wanted
from kvoffload.recording.journal_reader import (
    Declined,
    journal_extracts,
    journal_parts,
    scrape_ordered,
)
from kvoffload.recording.openmetrics import read_recording
from kvoffload.recording.parts import PartsFailed, extracts_in_parts
from kvoffload.recording.strict_reader import strict_extracts

log = logging.getLogger("kvoffload")
T = TypeVar("T")

# Below this a recording is read in one process (forking costs more than it saves).
PARALLEL_BYTES = 64 * 2**20
# Reading processes by default: one per core, up to this (the window, in the consuming
# process, takes the scrapes of at most ~4 readers at once).
MAX_DEFAULT_JOBS = 4


def read(
    path: str,
    consume: Callable[[Iterable[Extract]], T],
    window_seconds: float | None = None,
    jobs: int | None = None,
    report: Callable[[int], None] | None = None,
) -> T:
    """`consume(scrapes of the recording at path)`, in file order.

    Scrape-ordered files go through the journal reader (with `window_seconds`, only the
    scrapes a window that long keeps; without, a large file in `jobs` worker processes, given
    back in order), strict ones through the column reader, the rest through the general
    reader. `report` is told now and then how many bytes the fast readers got through."""
    try:
        return consume(_fast_extracts(path, window_seconds, jobs, report))
    except Declined as exc:
        log.debug("%s: the general reader reads it (%s)", path, exc)
    except PartsFailed as exc:
        log.warning("%s: %s; reading it in one pass", path, exc)
        try:
            return consume(journal_extracts(path, window_seconds, report=report))
        except Declined as declined:
            log.debug("%s: the general reader reads it (%s)", path, declined)
    except UnicodeDecodeError:
        pass  # a name the fast readers decode is not UTF-8: the general reader says so
    except OSError:
        pass  # the general reader says what is wrong with the file
    return consume(
        extract(expo, expo.timestamp or 0.0, "")
        for expo in read_recording(path, wanted, WANTED_FAMILIES)
    )


def _fast_extracts(
    path: str,
    window_seconds: float | None,
    jobs: int | None,
    report: Callable[[int], None] | None,
) -> Iterable[Extract]:
    """The fast reader's scrapes for this file (raising Declined where none takes it)."""
    if not scrape_ordered(path):
        return strict_extracts(path, report)
    if window_seconds is None:
        jobs = jobs or min(usable_cores(), MAX_DEFAULT_JOBS)
        big = os.path.getsize(path) >= PARALLEL_BYTES
        parts = journal_parts(path, jobs) if big and jobs > 1 else []
        if len(parts) > 1:
            return extracts_in_parts(path, parts, report)
    return journal_extracts(path, window_seconds, report=report)


def usable_cores() -> int:
    """The cores this process may run on (a container's or taskset's CPU set, not the
    machine's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1
