"""The KV-event state of one target on disk, so a restarted sidecar loses nothing.

The state is built from every message since the start, which vLLM's counters cannot rebuild.
It is versioned msgpack in statefile's checksummed frame, checked field by field on load.
What is kept and refused: docs/sizing.md ("Restarts").
"""

from __future__ import annotations

import logging
import math
import os
import re
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from kvoffload.kvevents import statefile
from kvoffload.kvevents.stackdist import _SPACE, DistanceHistogram, StackDistanceTracker
from kvoffload.kvevents.state import (
    MAX_BLOCK_SIZE,
    MAX_CHAIN_TAILS,
    SEQUENCE_LIMIT,
    EngineEvents,
    TargetEvents,
)

log = logging.getLogger("kvoffload.kvevents")

FORMAT = "kvoffload.kv-events-state"
VERSION = 2  # 2: framed with a checksum (statefile); 1: bare msgpack, still read
_HASH_BYTES = 17  # signed: int hashes may be negative, folded bytes hashes use 128 bits

_ENGINE_SCALARS = (
    "block_size",
    "gpu_missed_blocks",
    "cpu_stored_blocks",
    "cpu_loaded_blocks",
    "cpu_evicted_never_loaded_blocks",
    "cpu_evicted_blocks",
    "clears",
    "last_seq",
    "history_from_seq",
    "messages",
    "lost_messages",
    "unknown_events",
    "first_ts",
    "last_ts",
)
# Added since the first files of version 1: read with 0 when absent.
_ENGINE_COUNTERS = (
    "sequence_jumps",
    "sequence_rejected",
    "prefix_walks_cut",
    "decode_blocks",
    "tier_stored_blocks",
)


class StateError(Exception):
    """A state file that cannot be used (one line: why)."""


def state_path(state_dir: str | os.PathLike[str], instance: str) -> Path:
    """One file per target, named after its instance (host:port) in a file-system-safe way."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", instance)
    return Path(state_dir) / f"kv-events-{safe}.state"


# -- snapshot (in the event loop: copies only) and encoding (anywhere) ------------------------
@dataclass(frozen=True)
class Snapshot:
    """A consistent copy of a target's event state, cheap to take (C-level array copies).

    Why: the slow part (ordering, packing, writing) can then run in a thread while messages keep
    arriving.
    """

    instance: str
    header: dict[str, Any]
    engines: list[dict[str, Any]]


def snapshot(
    events: TargetEvents, instance: str, baselines: dict[str, dict[str, float]] | None = None
) -> Snapshot:
    engines = []
    for rank, e in sorted(events.engines.items()):
        t = e.tracker
        engines.append(
            {
                "rank": rank,
                "scalars": {
                    **{k: getattr(e, k) for k in _ENGINE_SCALARS + _ENGINE_COUNTERS},
                    "gpu_parents_evicted": e.gpu_parent.evicted,
                    "cpu_resident_evicted": e.cpu_resident.evicted,
                },
                "checkpoints": [list(c) for c in e.checkpoints],
                "cpu_resident": e.cpu_resident.copy(),
                "gpu_parent": dict(e.gpu_parent),
                "chain_tails": list(e.chain_tails),
                "tracker_state": t.copy_state(),
                "tracker": {
                    "threshold": t.threshold,
                    "sampled": t.sampled,
                    "budget": t.budget,
                    "accesses": t.accesses,
                },
                "histogram_exact": list(t.histogram._fw.tree),
                "histogram_coarse": list(t.histogram._coarse),
                "histogram": {
                    "cold": t.histogram.cold,
                    "total": t.histogram.total,
                    "finite_sum": t.histogram.finite_sum,
                },
            }
        )
    header = {
        "format": FORMAT,
        "version": VERSION,
        "instance": instance,
        "sample_rate": events.sample_rate,
        "sample_budget": events.sample_budget,
        "decode_errors": events.decode_errors,
        "last_error": events.last_error,
        "bytes_per_block": events.bytes_per_block,
        "baselines": baselines or {},
    }
    return Snapshot(instance, header, engines)


def _pack_hashes(hashes: Any) -> bytes:
    # One blob per list, not a msgpack int each: smaller, and its length is checkable unread.
    return b"".join(h.to_bytes(_HASH_BYTES, "big", signed=True) for h in hashes)


def _unpack_hashes(blob: bytes) -> list[int]:
    if len(blob) % _HASH_BYTES:
        raise StateError("a hash list is cut short")
    return [
        int.from_bytes(blob[i : i + _HASH_BYTES], "big", signed=True)
        for i in range(0, len(blob), _HASH_BYTES)
    ]


def encode(snap: Snapshot) -> bytes:
    engines = []
    for eng in snap.engines:
        parents = eng["gpu_parent"]
        resident = eng["cpu_resident"].items()
        engines.append(
            {
                "rank": eng["rank"],
                "scalars": eng["scalars"],
                "checkpoints": eng["checkpoints"],
                "cpu_resident": _pack_hashes(h for h, _loaded in resident),
                "cpu_loaded": bytes(bytearray(loaded for _h, loaded in resident)),
                "gpu_blocks": _pack_hashes(parents),
                "gpu_has_parent": bytes(bytearray(p is not None for p in parents.values())),
                "gpu_parents": _pack_hashes(0 if p is None else p for p in parents.values()),
                "chain_tails": _pack_hashes(eng["chain_tails"]),
                "tracker": eng["tracker"],
                # Access order is all the tracker needs: positions are renumbered on load.
                "tracker_blocks": _pack_hashes(
                    StackDistanceTracker.blocks_in_order(*eng["tracker_state"])
                ),
                "histogram_exact": array("d", eng["histogram_exact"]).tobytes(),
                "histogram_coarse": array("d", eng["histogram_coarse"]).tobytes(),
                "histogram": eng["histogram"],
            }
        )
    return msgspec.msgpack.encode({**snap.header, "engines": engines})


def write_atomic(path: Path, data: bytes) -> None:
    """Never leaves a half-written file: a kill mid-write keeps the previous state."""
    statefile.write_atomic(path, data)


def write_snapshot(path: Path, snap: Snapshot) -> None:
    write_atomic(path, encode(snap))


def save(
    events: TargetEvents,
    instance: str,
    path: Path,
    baselines: dict[str, dict[str, float]] | None = None,
) -> None:
    write_snapshot(path, snapshot(events, instance, baselines))


# -- loading ----------------------------------------------------------------------------------
# What a file may hold. The bounds are the live ones (state.SEQUENCE_LIMIT, the KV-event
# block_size bound) or far above any real stream, so a file the sidecar wrote always loads
# and one that was edited or damaged cannot make a figure absurd or wedge ingestion.
MAX_ENGINES = 1024  # DP ranks of one target
MAX_CHECKPOINTS = 128  # one each time the accesses double: 64 reach 2^63
MAX_BASELINE_GROUPS = 4096
MAX_BASELINE_NAMES = 256
BYTES_PER_BLOCK_LIMIT = float(1 << 48)
_LAST_ERROR_CHARS = 1000

_Count = Annotated[int, Meta(ge=0, le=(1 << 63) - 1)]
_Seq = Annotated[int, Meta(ge=0, lt=SEQUENCE_LIMIT)]
_Figure = Annotated[float, Meta(ge=0.0, le=1e300)]


class _Scalars(msgspec.Struct):
    block_size: Annotated[int, Meta(ge=0, le=MAX_BLOCK_SIZE)]
    gpu_missed_blocks: _Count
    cpu_stored_blocks: _Count
    cpu_loaded_blocks: _Count
    cpu_evicted_never_loaded_blocks: _Count
    cpu_evicted_blocks: _Count
    clears: _Count
    last_seq: _Seq | None
    history_from_seq: _Seq | None
    messages: _Count
    lost_messages: _Count
    unknown_events: _Count
    first_ts: float | None
    last_ts: float | None
    # added since the first files of version 1
    sequence_jumps: _Count = 0
    sequence_rejected: _Count = 0
    prefix_walks_cut: _Count = 0
    decode_blocks: _Count = 0
    tier_stored_blocks: _Count = 0
    gpu_parents_evicted: _Count = 0
    cpu_resident_evicted: _Count = 0


class _TrackerMeta(msgspec.Struct):
    threshold: Annotated[int, Meta(gt=0, le=_SPACE)]
    sampled: bool
    budget: Annotated[int, Meta(gt=0)] | None
    accesses: _Count


class _HistogramTotals(msgspec.Struct):
    cold: _Figure
    total: _Figure
    finite_sum: _Figure


class _Engine(msgspec.Struct):
    rank: Annotated[int, Meta(ge=0, lt=MAX_ENGINES)]
    scalars: _Scalars
    checkpoints: Annotated[list[tuple[_Figure, _Figure]], Meta(max_length=MAX_CHECKPOINTS)]
    cpu_resident: bytes
    cpu_loaded: bytes
    gpu_blocks: bytes
    gpu_has_parent: bytes
    gpu_parents: bytes
    tracker: _TrackerMeta
    tracker_blocks: bytes
    histogram_exact: bytes
    histogram_coarse: bytes
    histogram: _HistogramTotals
    # added since: the runs' last blocks that tell decode blocks (absent: none known yet)
    chain_tails: bytes = b""


class _Head(msgspec.Struct):
    """What is read first, to say why a file is someone else's (the rest is skipped)."""

    format: Any = None
    version: Any = None
    instance: Any = None


class _File(msgspec.Struct):
    format: str
    version: int
    instance: str
    decode_errors: _Count
    last_error: str | None
    bytes_per_block: Annotated[float, Meta(gt=0.0, le=BYTES_PER_BLOCK_LIMIT)] | None
    baselines: Annotated[
        dict[str, Annotated[dict[str, float], Meta(max_length=MAX_BASELINE_NAMES)]],
        Meta(max_length=MAX_BASELINE_GROUPS),
    ]
    engines: Annotated[list[_Engine], Meta(max_length=MAX_ENGINES)]


_HEAD_DECODER = msgspec.msgpack.Decoder(_Head)
_FILE_DECODER = msgspec.msgpack.Decoder(_File)


def _floats(blob: bytes, n: int, what: str) -> list[float]:
    # Float arrays travel as packed doubles (array "d"), their size known before unpacking.
    if len(blob) != 8 * n:
        raise StateError(f"{what} has the wrong size")
    values = array("d", blob).tolist()
    if not all(0.0 <= v <= 1e300 for v in values):  # NaN fails too
        raise StateError(f"{what} holds a negative, infinite or NaN count")
    return values


def _hashes(blob: bytes, budget: int | None, what: str) -> list[int]:
    """A packed hash list, held to the budget before it is unpacked (docs/reliability.md)."""
    if budget is not None and len(blob) > budget * _HASH_BYTES:
        raise StateError(f"{what} holds {len(blob) // _HASH_BYTES:,} blocks, over the budget")
    return _unpack_hashes(blob)


def _tracker(raw: _Engine, sample_rate: float, sample_budget: int | None) -> StackDistanceTracker:
    t = StackDistanceTracker(sample_rate, sample_budget)
    meta = raw.tracker
    if meta.sampled != t.sampled or meta.budget != t.budget or meta.threshold > t.threshold:
        raise StateError("it was built with other --kv-events-sample-rate/-budget settings")
    t.threshold = meta.threshold
    t.accesses = meta.accesses
    blocks = _hashes(raw.tracker_blocks, sample_budget, "the reuse-distance structure")
    try:
        t.load_blocks(blocks)
    except ValueError:
        raise StateError("a block appears twice in the reuse-distance structure") from None
    h = t.histogram
    h._fw.tree = _floats(raw.histogram_exact, DistanceHistogram.EXACT + 1, "the histogram")
    h._coarse = _floats(raw.histogram_coarse, len(h._coarse), "the histogram")
    totals = raw.histogram
    h.cold, h.total, h.finite_sum = totals.cold, totals.total, totals.finite_sum
    # Every access is counted once (cold, or at one distance): more than the total would
    # publish hit ratios above 1 (a cold of -1e12 gave an achievable ratio of 396,209).
    # (each node of the exact part's tree is a partial sum: none is above the whole)
    counted = h.cold + h._fw.prefix(DistanceHistogram.EXACT) + math.fsum(h._coarse)
    most = h.total * (1 + 1e-9) + 1e-6
    if counted > most or max(h._fw.tree) > most:
        raise StateError("its histogram counts more accesses than its total")
    return t


def _engine(raw: _Engine, sample_rate: float, sample_budget: int | None) -> EngineEvents:
    e = EngineEvents(sample_rate, sample_budget)
    sc = raw.scalars
    for key in _ENGINE_SCALARS + _ENGINE_COUNTERS:
        setattr(e, key, getattr(sc, key))
    # Timestamps are the publisher's and only shown: one that is not a number is dropped.
    e.first_ts = sc.first_ts if sc.first_ts is not None and math.isfinite(sc.first_ts) else None
    e.last_ts = sc.last_ts if sc.last_ts is not None and math.isfinite(sc.last_ts) else None
    first, last = e.history_from_seq, e.last_seq
    if (first is None) != (last is None) or (first or 0) > (last or 0):
        raise StateError("its sequence numbers are inconsistent")
    if any(cold > total for total, cold in raw.checkpoints):
        raise StateError("a checkpoint counts more first touches than accesses")
    e.checkpoints = [(total, cold) for total, cold in raw.checkpoints]
    resident = _hashes(raw.cpu_resident, sample_budget, "the CPU tier's residency")
    loaded = raw.cpu_loaded
    if len(loaded) != len(resident):
        raise StateError("the CPU tier's residency is inconsistent")
    for block, flag in zip(resident, loaded, strict=True):
        if block in e.cpu_resident:
            raise StateError("a block appears twice in the CPU tier's residency")
        e.cpu_resident.store(block)
        if flag:
            e.cpu_resident.load(block)
    blocks = _hashes(raw.gpu_blocks, sample_budget, "the GPU prefix chains")
    parents = _unpack_hashes(raw.gpu_parents)
    has_parent = raw.gpu_has_parent
    if not len(blocks) == len(parents) == len(has_parent):
        raise StateError("the GPU prefix chains are inconsistent")
    for b, p, flag in zip(blocks, parents, has_parent, strict=True):
        e.gpu_parent[b] = p if flag else None
    e.gpu_parent.trim()
    e.gpu_parent.evicted = sc.gpu_parents_evicted
    e.chain_tails = dict.fromkeys(_hashes(raw.chain_tails, MAX_CHAIN_TAILS, "the chain tails"))
    e.cpu_resident.evicted = sc.cpu_resident_evicted
    e.tracker = _tracker(raw, sample_rate, sample_budget)
    return e


def _baselines(raw: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Counter totals per group.

    A group whose total is not a finite non-negative number loses its baseline (its missed tokens
    unknown until one is taken again).
    """
    return {
        group: totals
        for group, totals in raw.items()
        if all(0.0 <= v <= 1e300 for v in totals.values())
    }


@dataclass
class Loaded:
    events: TargetEvents
    baselines: dict[str, dict[str, float]]
    saved_messages: int


def decode(data: bytes, instance: str, sample_rate: float, sample_budget: int | None) -> Loaded:
    """A state file's bytes (framed, or version 1) into a target's events, every field checked.

    Raises StateError (one line) for anything else.
    """
    try:
        payload = statefile.unframe(data) if data.startswith(statefile.MAGIC) else data
        legacy = payload is data
    except statefile.StateFileError as exc:
        raise StateError(str(exc)) from None
    try:
        head = _HEAD_DECODER.decode(payload)
    except msgspec.DecodeError as exc:
        raise StateError(f"not a state file ({exc})") from None
    if head.format != FORMAT:
        raise StateError("not a kvoffload KV-event state file")
    if head.version != (1 if legacy else VERSION):
        raise StateError(
            f"state format version {head.version!r}, this release reads {VERSION} (and 1)"
        )
    if head.instance != instance:
        raise StateError(f"it belongs to target {head.instance!r}, not {instance!r}")
    try:
        raw = _FILE_DECODER.decode(payload)
    except msgspec.DecodeError as exc:  # ValidationError too: a field out of range
        raise StateError(f"malformed state ({exc})") from None
    events = TargetEvents(sample_rate, sample_budget)
    events.decode_errors = raw.decode_errors
    events.last_error = raw.last_error[:_LAST_ERROR_CHARS] if raw.last_error else raw.last_error
    events.bytes_per_block = raw.bytes_per_block
    for eng in raw.engines:
        if eng.rank in events.engines:
            raise StateError(f"rank {eng.rank} appears twice")
        events.engines[eng.rank] = _engine(eng, sample_rate, sample_budget)
    return Loaded(events, _baselines(raw.baselines), events.messages())


def load(path: Path, instance: str, sample_rate: float, sample_budget: int | None) -> Loaded | None:
    """The saved state, or None when there is none.

    An unusable file (a link, a device, a FIFO, oversized, damaged, out of range) goes to `*.bad`.
    It gets a one-line warning, never an exception.
    """
    try:
        data = statefile.read(path)
        if data is None:
            return None
        return decode(data, instance, sample_rate, sample_budget)
    except OSError as exc:
        log.warning(
            "kv events: cannot read %s (%s); starting without saved state",
            path,
            exc.strerror or exc,
        )
        return None
    except (StateError, statefile.StateFileError) as exc:
        where = statefile.set_aside(path)
        log.warning("kv events: %s: %s; %s, starting fresh", path, exc, where)
        return None
