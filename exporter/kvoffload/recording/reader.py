"""The one way to read a recording: the strict reader where it takes the file, else the general one.

Why a consumer, not an iterator: the strict reader may decline part-way (a journal, an unknown
layout, a non-UTF-8 name). Then `consume` is called again from the start on the general reader's
scrapes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TypeVar

from kvoffload.ingest.catalog import WANTED_FAMILIES, Extract, extract, wanted
from kvoffload.recording.blocks import Declined
from kvoffload.recording.openmetrics import read_recording
from kvoffload.recording.strict_reader import strict_extracts

log = logging.getLogger("kvoffload")
T = TypeVar("T")


def read(
    path: str,
    consume: Callable[[Iterable[Extract]], T],
    report: Callable[[int | None], None] | None = None,
) -> T:
    """`consume(the scrapes of the recording at path)`, each instance's in time order.

    Why both readers: strict OpenMetrics reads fast. The general reader reads the rest (a
    journal, a snapshot) or says what is wrong. `report` gets the strict reader's bytes done, and
    None when the general reader takes over.
    """
    try:
        return consume(strict_extracts(path, report))
    except Declined as exc:
        log.debug("%s: the general reader reads it (%s)", path, exc)
    except UnicodeDecodeError:
        pass  # a name the strict reader decodes is not UTF-8: the general reader says so
    if report is not None:
        report(None)  # the general reader reads a descriptor: followed from outside
    return consume(
        extract(expo, expo.timestamp or 0.0, "")
        for expo in read_recording(path, wanted, WANTED_FAMILIES)
    )
