"""A fleet read from Prometheus, analyzed on every core.

Why: reading a thousand engines is Python work per sample. Each worker process reads and analyzes a
batch of whole instances. The parent merges, so the result matches one process.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

from kvoffload.analysis.analyze import (
    Settings,
    add_replica_evidence,
    analyze_groups,
    window_from_extracts,
)
from kvoffload.analysis.result import GroupAnalysis
from kvoffload.errors import InputError
from kvoffload.fleet.promapi import PromStopped
from kvoffload.fleet.source import FleetReader, Plan, ReadStats
from kvoffload.fleet.summary import FleetSummary, need_order, summarize


@dataclass
class FleetResult:
    groups: list[GroupAnalysis]  # need order; instances whose read failed left out
    summary: FleetSummary
    scrapes: int
    stats: ReadStats


@dataclass
class _BatchResult:
    groups: list[GroupAnalysis]
    scrapes: int
    stats: ReadStats


def _analyze_batches(
    reader: FleetReader, batches: list[list[Plan]], settings: Settings
) -> _BatchResult:
    """Read `batches` and analyze their groups (without the fleet comparison)."""
    reader.stats = ReadStats()
    try:
        window, scrapes, lifetime = window_from_extracts(
            ex for batch in batches for ex in reader.read_batch(batch)
        )
    except PromStopped:
        raise
    except InputError:
        if not reader.stats.errors:
            raise
        return _BatchResult([], 0, reader.stats)  # every instance of the batch failed
    groups = [
        g
        for g in analyze_groups(window, settings, lifetime, replicas=False)
        if g.instance not in reader.stats.errors  # a partial read is no analysis
    ]
    return _BatchResult(groups, scrapes, reader.stats)


_WORKER: tuple[FleetReader, Settings] | None = None


def _init_worker(reader: FleetReader, settings: Settings) -> None:
    global _WORKER
    reader.api.reopen()
    reader.progress = None
    _WORKER = (reader, settings)


def _work(batch: list[Plan]) -> _BatchResult:
    assert _WORKER is not None
    reader, settings = _WORKER
    return _analyze_batches(reader, [batch], settings)


def analyze_from_prometheus(
    reader: FleetReader,
    settings: Settings,
    jobs: int | None = None,
    progress: Callable[[ReadStats], None] | None = None,
) -> FleetResult:
    """Read everything `reader` covers and analyze it, with `jobs` worker processes (default:
    one per core; 1: in this process)."""
    batches = reader.batches()
    # What the plan's questions found: their warnings, the instances refused from the start.
    total = ReadStats(instances=reader.stats.instances)
    total.merge(reader.stats)
    jobs = min(jobs or usable_cores(), len(batches))
    results: list[_BatchResult] = []

    def merge(result: _BatchResult, instances: int) -> None:
        results.append(result)
        total.done += instances
        total.merge(result.stats)
        if progress is not None:
            progress(total)

    if progress is not None:
        progress(total)
    if jobs <= 1:
        for batch in batches:
            merge(_analyze_batches(reader, [batch], settings), len(batch))
    else:
        # fork: the workers start at once with the reader and the settings as they are (the
        # CLI is one thread; a worker opens its own HTTP session).
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(
            jobs, mp_context=context, initializer=_init_worker, initargs=(reader, settings)
        ) as pool:
            futures = {pool.submit(_work, batch): len(batch) for batch in batches}
            for future in as_completed(futures):
                merge(future.result(), futures[future])
    groups = [g for r in results for g in r.groups]
    if not groups and total.errors and len(total.errors) == total.instances:
        raise InputError(
            "no instance could be read: " + "; ".join(sorted(set(total.errors.values()))[:3])
        )
    # The fleet-wide replica comparison needs every group, so it runs once, here in the parent.
    add_replica_evidence(groups, settings)
    groups = need_order(groups)
    return FleetResult(groups, summarize(groups), sum(r.scrapes for r in results), total)


def usable_cores() -> int:
    """The cores this process may run on (a container's or taskset's CPU set).

    The default worker count then fits what the process is given, not the machine."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1
