"""The KV-event state of one target on disk, so a restarted sidecar loses nothing.

vLLM's counters are cumulative and come back after two scrapes; the event state does not: the
reuse-distance structure, the CPU tier's residency and the never-loaded counts are built from
every message since the start. `--state-dir` keeps them in one file per target, written
atomically (temporary file, fsync, rename) every few seconds and at shutdown. A restarted
sidecar loads it and asks vLLM to replay from the last sequence it holds, so a SIGKILL costs
nothing that vLLM's replay buffer (10,000 messages) still has.

The format is msgpack (msgspec) with a format name and a version. Block hashes can be 128-bit
(folded bytes hashes), beyond msgpack's integers, so hash lists travel as packed 17-byte
signed big-endian blobs; float arrays as packed doubles. A file that does not decode, is of
another format or version, belongs to another target or was built with other sampling
settings is set aside (renamed `*.bad`) with one line, and the sidecar starts fresh.
"""

from __future__ import annotations

import logging
import os
import re
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from kvoffload.kvevents.stackdist import _SPACE, DistanceHistogram, StackDistanceTracker
from kvoffload.kvevents.state import EngineEvents, TargetEvents

log = logging.getLogger("kvoffload.kvevents")

FORMAT = "kvoffload.kv-events-state"
VERSION = 1
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
_ENGINE_COUNTERS = ("sequence_jumps", "sequence_rejected", "prefix_walks_cut")


class StateError(Exception):
    """A state file that cannot be used (one line: why)."""


def state_path(state_dir: str | os.PathLike[str], instance: str) -> Path:
    """One file per target, named after its instance (host:port) in a file-system-safe way."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", instance)
    return Path(state_dir) / f"kv-events-{safe}.state"


# -- snapshot (in the event loop: copies only) and encoding (anywhere) ------------------------
@dataclass(frozen=True)
class Snapshot:
    """A consistent copy of a target's event state, cheap to take (C-level copies of the
    arrays), so the slow part (ordering, packing, writing) can run in a thread while messages
    keep arriving."""

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
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


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
def _floats(blob: Any, n: int, what: str) -> list[float]:
    if not isinstance(blob, bytes) or len(blob) != 8 * n:
        raise StateError(f"{what} has the wrong size")
    return array("d", blob).tolist()


def _tracker(
    raw: dict[str, Any], sample_rate: float, sample_budget: int | None
) -> StackDistanceTracker:
    t = StackDistanceTracker(sample_rate, sample_budget)
    meta = raw["tracker"]
    if (
        bool(meta["sampled"]) != t.sampled
        or meta["budget"] != t.budget
        or int(meta["threshold"]) > t.threshold
    ):
        raise StateError("it was built with other --kv-events-sample-rate/-budget settings")
    t.threshold = int(meta["threshold"])
    t.accesses = int(meta["accesses"])
    try:
        t.load_blocks(_unpack_hashes(raw["tracker_blocks"]))
    except ValueError:
        raise StateError("a block appears twice in the reuse-distance structure") from None
    h = t.histogram
    h._fw.tree = _floats(raw["histogram_exact"], DistanceHistogram.EXACT + 1, "the histogram")
    h._coarse = _floats(raw["histogram_coarse"], len(h._coarse), "the histogram")
    h.cold = float(raw["histogram"]["cold"])
    h.total = float(raw["histogram"]["total"])
    h.finite_sum = float(raw["histogram"]["finite_sum"])
    if not 0 < t.threshold <= _SPACE:
        raise StateError("its sampling threshold is out of range")
    return t


def _engine(raw: dict[str, Any], sample_rate: float, sample_budget: int | None) -> EngineEvents:
    e = EngineEvents(sample_rate, sample_budget)
    scalars = raw["scalars"]
    for key in _ENGINE_SCALARS:
        setattr(e, key, scalars[key])
    for key in _ENGINE_COUNTERS:
        setattr(e, key, int(scalars.get(key, 0)))
    e.checkpoints = [(float(t), float(c)) for t, c in raw["checkpoints"]]
    resident = _unpack_hashes(raw["cpu_resident"])
    loaded = raw["cpu_loaded"]
    if len(loaded) != len(resident):
        raise StateError("the CPU tier's residency is inconsistent")
    for block, flag in zip(resident, loaded, strict=True):
        if block in e.cpu_resident:
            raise StateError("a block appears twice in the CPU tier's residency")
        e.cpu_resident.store(block)
        if flag:
            e.cpu_resident.load(block)
    blocks = _unpack_hashes(raw["gpu_blocks"])
    parents = _unpack_hashes(raw["gpu_parents"])
    has_parent = raw["gpu_has_parent"]
    if not len(blocks) == len(parents) == len(has_parent):
        raise StateError("the GPU prefix chains are inconsistent")
    for b, p, flag in zip(blocks, parents, has_parent, strict=True):
        e.gpu_parent[b] = p if flag else None
    e.gpu_parent.trim()
    e.gpu_parent.evicted = int(scalars.get("gpu_parents_evicted", 0))
    e.cpu_resident.evicted = int(scalars.get("cpu_resident_evicted", 0))
    e.tracker = _tracker(raw, sample_rate, sample_budget)
    return e


@dataclass
class Loaded:
    events: TargetEvents
    baselines: dict[str, dict[str, float]]
    saved_messages: int


def decode(data: bytes, instance: str, sample_rate: float, sample_budget: int | None) -> Loaded:
    try:
        raw = msgspec.msgpack.decode(data)
    except msgspec.DecodeError as exc:
        raise StateError(f"not a state file ({exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise StateError("not a kvoffload KV-event state file")
    if raw.get("version") != VERSION:
        raise StateError(
            f"state format version {raw.get('version')!r}, this release reads {VERSION}"
        )
    if raw.get("instance") != instance:
        raise StateError(f"it belongs to target {raw.get('instance')!r}, not {instance!r}")
    try:
        events = TargetEvents(sample_rate, sample_budget)
        events.decode_errors = int(raw["decode_errors"])
        events.last_error = raw["last_error"]
        bpb = raw["bytes_per_block"]
        events.bytes_per_block = float(bpb) if bpb is not None else None
        for eng in raw["engines"]:
            events.engines[int(eng["rank"])] = _engine(eng, sample_rate, sample_budget)
        baselines = {
            str(k): {str(n): float(v) for n, v in d.items()} for k, d in raw["baselines"].items()
        }
    except StateError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StateError(f"malformed state ({type(exc).__name__}: {exc})") from None
    return Loaded(events, baselines, events.messages())


def load(path: Path, instance: str, sample_rate: float, sample_budget: int | None) -> Loaded | None:
    """The saved state, or None when there is none; an unusable file is renamed `*.bad`
    (replacing an older one) with a one-line warning, never raised."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning(
            "kv events: cannot read %s (%s); starting without saved state",
            path,
            exc.strerror or exc,
        )
        return None
    try:
        return decode(data, instance, sample_rate, sample_budget)
    except StateError as exc:
        bad = path.with_name(path.name + ".bad")
        try:
            os.replace(path, bad)
            where = f"moved to {bad}"
        except OSError:
            where = "left in place"
        log.warning("kv events: %s: %s; %s, starting fresh", path, exc, where)
        return None
