"""Sorting more lines than fit in memory: sorted runs spooled to temporary files, then merged.

Why: recordings are regrouped both ways, and a day's recording is hundreds of MB. Lines carry
their sort key as a fixed-width prefix, so plain string comparison in C orders them.
"""

from __future__ import annotations

import heapq
import struct
import tempfile
from collections.abc import Iterable, Iterator
from typing import TextIO

# About this many characters of lines are held at once (the rest waits in temporary files).
BUDGET_CHARS = 32 * 2**20
# Runs merged at once: beyond this, runs are first merged into longer ones (file descriptors).
MAX_FAN_IN = 128

_DOUBLE = struct.Struct(">d")
_SIGN = 1 << 63
_ALL = (1 << 64) - 1


def float_key(value: float) -> str:
    """16 hex digits that sort like the float (IEEE 754 bits, the sign flipped for order)."""
    bits = int.from_bytes(_DOUBLE.pack(value), "big")
    return f"{(bits ^ _ALL) if bits & _SIGN else (bits | _SIGN):016x}"


def sorted_lines(
    lines: Iterable[str], budget_chars: int | None = None, tmp_dir: str | None = None
) -> Iterator[str]:
    """`lines` (each ending in a newline) in ascending order, memory bounded by `budget_chars`.

    A batch that fills the budget is sorted and spooled to an unnamed file in `tmp_dir`. The runs
    are merged at the end. Unnamed, so they vanish even if the process is killed.
    """
    budget = BUDGET_CHARS if budget_chars is None else budget_chars
    runs: list[TextIO] = []
    try:
        batch: list[str] = []
        size = 0
        for line in lines:
            batch.append(line)
            size += len(line)
            if size >= budget:
                batch.sort()
                runs.append(_spool(batch, tmp_dir))
                batch = []
                size = 0
                if len(runs) >= MAX_FAN_IN:
                    merged = _spool(heapq.merge(*runs), tmp_dir)
                    for fh in runs:
                        fh.close()
                    runs = [merged]
        batch.sort()
        if not runs:
            yield from batch
            return
        # The last batch is merged from memory: it is already there.
        yield from heapq.merge(*runs, batch)
    finally:
        for fh in runs:
            fh.close()


def _spool(lines: Iterable[str], tmp_dir: str | None) -> TextIO:
    fh = tempfile.TemporaryFile(  # noqa: SIM115 (returned open: the caller reads it back)
        "w+", encoding="utf-8", newline="", dir=tmp_dir, prefix="kvoffload-sort-"
    )
    try:
        fh.writelines(lines)
        fh.seek(0)
    except BaseException:
        fh.close()
        raise
    return fh
