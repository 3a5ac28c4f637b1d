"""Decoding hand-built KV-event messages in the shapes vLLM has used."""

from typing import Any

import msgspec
import pytest

from kvoffload.kvevents.decode import CLEARED, REMOVED, STORED, DecodeError, decode_batch
from kvoffload.kvevents.state import TargetEvents


# vLLM's structs (vllm/distributed/kv_events.py), with a field from a future release added.
class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    future_field: str | None = None  # unknown to us: must be ignored


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class FutureEvent(KVCacheEvent):
    something: int = 0


class ArrayBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class MapBatch(msgspec.Struct, omit_defaults=True):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


# The older example subscriber's structs: everything array-like, tag first.
class OldEvent(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    pass


class OldBlockStored(OldEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


ENC = msgspec.msgpack.Encoder()
EVENTS = [
    BlockStored(
        [1, 2, 3],
        None,
        list(range(48)),
        16,
        None,
        "GPU",
        None,
        kv_cache_spec_kind="full_attention",
        future_field="x",
    ),
    BlockStored([2, 3], None, [], 0, None, "CPU", None),
    BlockRemoved([1], "GPU"),
    FutureEvent(5),
    AllBlocksCleared(),
]


@pytest.mark.parametrize("batch_cls", [ArrayBatch, MapBatch])
def test_decodes_both_batch_shapes_and_ignores_the_unknown(batch_cls):
    payload = ENC.encode(batch_cls(1795000000.5, EVENTS, 2))
    batch = decode_batch(payload)
    assert batch.ts == 1795000000.5 and batch.dp_rank == 2
    assert [e.kind for e in batch.events] == [STORED, STORED, REMOVED, CLEARED]
    assert batch.unknown == 1  # FutureEvent
    first = batch.events[0]
    assert first.block_hashes == (1, 2, 3) and first.medium == "GPU" and first.block_size == 16
    assert batch.events[1].medium == "CPU"


def test_missing_rank_means_the_publishers_rank():
    payload = ENC.encode(ArrayBatch(1.0, [AllBlocksCleared()]))
    raw = msgspec.msgpack.decode(payload)
    assert raw[1] == [{"type": "AllBlocksCleared"}]  # an event's defaults are omitted
    assert decode_batch(payload, default_rank=3).dp_rank == 3
    assert decode_batch(ENC.encode([1.0, []]), default_rank=2).dp_rank == 2


def test_old_array_like_events_decode():
    payload = ENC.encode(ArrayBatch(2.0, [OldBlockStored([7, 8], 6, [1] * 32, 16, None, None)]))
    (ev,) = decode_batch(payload).events
    assert ev.kind == STORED and ev.block_hashes == (7, 8) and ev.medium is None


@pytest.mark.parametrize(
    "payload",
    [b"\xc1garbage", ENC.encode({"hello": 1}), ENC.encode([1.0, "not a list"]), ENC.encode(42)],
)
def test_garbage_is_a_decode_error(payload):
    with pytest.raises(DecodeError):
        decode_batch(payload)


def test_sequence_gaps_are_counted_and_restarts_are_not_losses():
    state = TargetEvents()
    stored = ENC.encode(ArrayBatch(1.0, [BlockStored([1], None, [], 16, None, "GPU", None)]))
    for seq in (0, 1, 2, 5, 6):  # 3 and 4 lost
        state.ingest(decode_batch(stored), seq, 0)
    assert state.lost_messages() == 2
    state.ingest(decode_batch(stored), 0, 0)  # the publisher restarted
    assert state.lost_messages() == 2 and state.messages() == 6


def test_cpu_events_give_exact_waste_and_occupancy():
    state = TargetEvents()

    def batch(*events):
        return decode_batch(ENC.encode(ArrayBatch(1.0, list(events))))

    state.ingest(
        batch(
            BlockStored([1, 2, 3], None, [], 16, None, "GPU", None),
            BlockStored([1, 2, 3], None, [], 0, None, "CPU", None),
        ),
        0,
        0,
    )
    state.ingest(batch(BlockRemoved([1, 2, 3], "GPU")), 1, 0)
    state.ingest(batch(BlockStored([1, 2], None, [], 16, None, "GPU", None)), 2, 0)  # reload
    state.ingest(batch(BlockRemoved([2, 3], "CPU")), 3, 0)
    assert state.never_loaded_blocks() == (1, 0)  # 3 evicted unread; 1 resident, was loaded
    assert state.cpu_resident_blocks() == 1
    # 1,2,3 cold, touched so that 1 is the most recent; then 1 at distance 0 and 2 at
    # distance 1 (block 1 is more recent than it).
    hist = state.engines[0].tracker.histogram
    assert hist.cold == 3 and hist.hits_below(1) == 1 and hist.hits_below(2) == 2


@pytest.mark.parametrize(
    "payload",
    [
        ENC.encode([1.0, [{"type": ["BlockStored"], "block_hashes": [1]}]]),
        ENC.encode([1.0, [[["x"], 1]]]),
        b"\x91" * 5000 + b"\xc0",  # arrays nested 5,000 deep
    ],
)
def test_hostile_payloads_are_counted_not_raised(payload):
    state = TargetEvents()
    msg = __import__("kvoffload.kvevents.eventfile", fromlist=["RawMessage"]).RawMessage(
        0, 0, 0.0, b"", payload
    )
    state.ingest_message(msg)  # must not raise
    assert state.decode_errors + state.messages() >= 1


def test_a_new_publisher_means_a_restart_and_empties_the_state():
    state = TargetEvents()

    def stored(*hashes, medium="GPU"):
        return decode_batch(
            ENC.encode(
                ArrayBatch(1.0, [BlockStored(list(hashes), None, [], 16, None, medium, None)])
            )
        )

    state.ingest(stored(1, 2), 10, 0)
    state.ingest(stored(1, 2, medium="CPU"), 11, 0)
    state.ingest(stored(3), 0, 0)  # sequence numbers start over: vLLM restarted
    assert state.cpu_resident_blocks() == 0 and state.lost_messages() == 0
    assert state.engines[0].tracker.histogram.cold == 3  # 1 and 2 would be cold again too


@pytest.mark.timing
def test_a_parent_loop_does_not_hang():
    import time

    state = TargetEvents()
    event = BlockStored([5, 5, 6], 6, [], 16, None, "GPU", None)  # repeats and self-parents
    start = time.monotonic()
    for seq in range(200):
        state.ingest(decode_batch(ENC.encode(ArrayBatch(1.0, [event]))), seq, 0)
    assert time.monotonic() - start < 2.0


def test_histogram_stays_cumulative_when_sampled():
    from kvoffload.kvevents.decode import Batch, Event

    state = TargetEvents(sample_rate=0.05)
    for i in range(3000):
        state.ingest(Batch(float(i), 0, [Event(STORED, (i % 40 + 1,), "GPU", 16)]), i, 0)
    total, _finite = state.histogram_totals()
    assert all(state.hit_tokens(le, 1.0) <= total for le in (16.0, 64.0, 1e6))


def test_the_fast_path_and_the_general_path_agree(monkeypatch):
    import kvoffload.kvevents.decode as decode

    known = [e for e in EVENTS if not isinstance(e, FutureEvent)]
    known.append(BlockStored([2**64 - 1], 5, [], 16, None, "GPU", None, group_idx=2))
    payloads = [
        ENC.encode(ArrayBatch(3.0, known, 1)),  # vLLM 0.33's shape: the fast path
        ENC.encode([3, known]),  # an integer ts, no rank: still the fast path
        ENC.encode(ArrayBatch(3.0, EVENTS, 1)),  # an unknown event type: general
        ENC.encode(
            [3.0, [{"type": "BlockRemoved", "block_hashes": [b"\x01\x02"], "medium": "GPU"}], 1]
        ),
    ]  # bytes hashes: general
    assert all(decode._fast_decode(p, 0) is not None for p in payloads[:2])
    assert all(decode._fast_decode(p, 0) is None for p in payloads[2:])
    fast = [decode_batch(p, default_rank=4) for p in payloads]
    monkeypatch.setattr(decode, "_fast_decode", lambda payload, rank: None)
    general = [decode_batch(p, default_rank=4) for p in payloads]

    def typed(batch):  # == alone would let 3 == 3.0 and True == 1 through
        return (
            type(batch.ts),
            batch.ts,
            batch.dp_rank,
            batch.unknown,
            [tuple((type(v), v) for v in ev) for ev in batch.events],
        )

    assert [typed(b) for b in fast] == [typed(b) for b in general]
    assert fast[1].ts == 3.0 and fast[1].dp_rank == 4
    assert fast[0].events[-1].parent_block_hash == 5 and fast[0].events[-1].group_idx == 2
    assert fast[3].events[0].block_hashes == (0x0102,)
