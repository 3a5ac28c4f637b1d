"""Decoding vLLM's KV-event batches into plain, version-independent records.

Unknown fields are ignored and unknown event types counted, so a newer vLLM still decodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec

from kvoffload.errors import InputError

# Field order of the array-like encodings (msgspec array_like=True), tag first.
_ARRAY_FIELDS = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
    ),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}

STORED, REMOVED, CLEARED = "BlockStored", "BlockRemoved", "AllBlocksCleared"


class DecodeError(InputError):
    """A payload that is not a vLLM KV-event batch."""


class Event(NamedTuple):
    # A NamedTuple, not a frozen dataclass: vLLM sends one BlockRemoved per evicted GPU block,
    # so this is built hundreds of thousands of times a minute under load.
    kind: str  # BlockStored | BlockRemoved | AllBlocksCleared
    block_hashes: tuple[int, ...] = ()
    medium: str | None = None  # "GPU", "CPU", ...; None on releases without media
    block_size: int = 0
    group_idx: int | None = None
    parent_block_hash: int | None = None


@dataclass
class Batch:
    ts: float
    dp_rank: int
    events: list[Event] = field(default_factory=list)
    unknown: int = 0  # events of a type this version does not know


_decoder = msgspec.msgpack.Decoder()
_INT_ONLY = {int}


def _hash(value: Any) -> int:
    # Hashes are ints by default; bytes hashes (some hash algorithms) fold to an int.
    if isinstance(value, int):
        return value
    if isinstance(value, bytes | bytearray):
        return int.from_bytes(value[:16], "big", signed=False)
    raise DecodeError(f"block hash of unexpected type {type(value).__name__}")


def _event(raw: Any) -> Event | None:
    if isinstance(raw, dict):
        kind = raw.get("type")
        fields = raw
    elif isinstance(raw, list | tuple) and raw and isinstance(raw[0], str):
        kind = raw[0]
        names = _ARRAY_FIELDS.get(kind)
        if names is None:
            return None
        fields = dict(zip(names, raw[1:], strict=False))
    else:
        raise DecodeError("event is neither a map nor a tagged array")
    if not isinstance(kind, str) or kind not in _ARRAY_FIELDS:
        return None
    if kind == CLEARED:
        return Event(CLEARED)
    hashes = fields.get("block_hashes") or []
    if not isinstance(hashes, list):
        raise DecodeError("block_hashes is not a list")
    medium = fields.get("medium")
    group = fields.get("group_idx")
    # block_size and the parent belong to BlockStored: ignored elsewhere, like unknown fields
    stored = kind == STORED
    block_size = (fields.get("block_size") or 0) if stored else 0
    parent = fields.get("parent_block_hash") if stored else None
    if set(map(type, hashes)) <= _INT_ONLY:  # the usual case, checked at C speed
        block_hashes = tuple(hashes)
    else:
        block_hashes = tuple(_hash(h) for h in hashes)
    return Event(
        kind,
        block_hashes,
        medium if isinstance(medium, str) else None,
        int(block_size) if isinstance(block_size, int) else 0,
        group if isinstance(group, int) else None,
        _hash(parent) if parent is not None else None,
    )


# vLLM's msgspec KVEventBatch has moved between releases: an array [ts, events,
# data_parallel_rank] (vLLM 0.33) or a map; events tagged maps or arrays with the tag first.
def decode_batch(payload: bytes, default_rank: int = 0) -> Batch:
    """One message's payload; anything that is not a KV-event batch is a DecodeError."""
    try:
        return _decode_batch(payload, default_rank)
    except DecodeError:
        raise
    except (msgspec.DecodeError, RecursionError, TypeError, ValueError, OverflowError) as exc:
        # Garbage can nest deeply or carry values of any type: never let it escape.
        raise DecodeError(f"not a KV-event batch: {type(exc).__name__}") from None


# The fast path: vLLM 0.33's exact shape (array-like batch, "type"-tagged event maps with int
# hashes) decoded by msgspec into typed structs in C, unknown fields skipped. Anything else (a
# map batch, array-like events, bytes hashes, an event type this version does not know) fails
# validation and takes the general path below, which handles every shape.
class _Stored(msgspec.Struct, tag="BlockStored", gc=False):
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None = None
    block_size: int = 0
    medium: str | None = None
    group_idx: int | None = None


class _Removed(msgspec.Struct, tag="BlockRemoved", gc=False):
    block_hashes: tuple[int, ...]
    medium: str | None = None
    group_idx: int | None = None


class _Cleared(msgspec.Struct, tag="AllBlocksCleared", gc=False):
    pass


class _FastBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_Stored | _Removed | _Cleared]
    data_parallel_rank: int | None = None


_fast_decoder = msgspec.msgpack.Decoder(_FastBatch)


def _fast_decode(payload: bytes, default_rank: int) -> Batch | None:
    try:
        raw = _fast_decoder.decode(payload)
    except msgspec.DecodeError:  # ValidationError included: another shape
        return None
    rank = raw.data_parallel_rank
    batch = Batch(raw.ts, rank if rank is not None else default_rank)
    append = batch.events.append
    for ev in raw.events:
        if type(ev) is _Removed:
            append(Event(REMOVED, ev.block_hashes, ev.medium, 0, ev.group_idx))
        elif type(ev) is _Stored:
            append(
                Event(
                    STORED,
                    ev.block_hashes,
                    ev.medium,
                    ev.block_size,
                    ev.group_idx,
                    ev.parent_block_hash,
                )
            )
        else:
            append(Event(CLEARED))
    return batch


def _decode_batch(payload: bytes, default_rank: int) -> Batch:
    fast = _fast_decode(payload, default_rank)
    if fast is not None:
        return fast
    try:
        raw = _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise DecodeError(f"not msgpack: {exc}") from None
    if isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    elif isinstance(raw, list | tuple) and len(raw) >= 2:
        ts, events = raw[0], raw[1]
        rank = raw[2] if len(raw) > 2 else None
    else:
        raise DecodeError("payload is not a KV-event batch")
    if not isinstance(ts, int | float) or not isinstance(events, list):
        raise DecodeError("payload is not a KV-event batch (ts/events)")
    batch = Batch(float(ts), int(rank) if isinstance(rank, int) else default_rank)
    for item in events:
        ev = _event(item)
        if ev is None:
            batch.unknown += 1
        else:
            batch.events.append(ev)
    return batch
