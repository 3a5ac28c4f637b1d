"""vLLM's KV cache events from the simulator: the event log, its wire encoding, a ZMQ publisher.

Tests and `kvoffload sim` need vLLM's stream with the ground truth behind it.
Each event, the wire format and what adds up: docs/scenarios.md ("KV events")."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any

import msgspec

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
# Hashes are masked to unsigned 64-bit, like vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES ints;
# GPU and CPU events carry the same value for a block.
_U64 = 0xFFFF_FFFF_FFFF_FFFF

# Synthetic token ids: a pure function of (segment id, position in the segment), so prompts
# that share a prefix share its token ids exactly as they share its block hashes.
_VOCAB = 151_643  # Qwen3's regular (non-special) tokens; any id below it is plausible
_SEG_STRIDE = 1_000_003
_MIX = 2_654_435_761  # Knuth's multiplicative hash constant
_MASK32 = 0xFFFF_FFFF

Event = dict[str, Any]  # vLLM's field names, plus "type": the event class's name
Batch = tuple[int, float, list[Event]]  # (dp_rank, ts in epoch seconds, events)


def synth_tokens(segments: Sequence[tuple[int, int]], start: int, end: int) -> list[int]:
    """Token ids of prompt positions [start, end) for a prompt of `(segment_id, tokens)`."""
    out: list[int] = []
    pos = 0
    for seg_id, n in segments:
        lo = max(start - pos, 0)
        hi = min(end - pos, n)
        if lo < hi:
            base = seg_id * _SEG_STRIDE
            out.extend([(((base + p) * _MIX) & _MASK32) % _VOCAB for p in range(lo, hi)])
        pos += n
        if pos >= end:
            break
    return out


def is_restart_batch(events: Sequence[Event]) -> bool:
    """True for the batch a restarted process opens with (only then is AllBlocksCleared emitted).

    Its publisher starts again at sequence 0 with an empty replay buffer."""
    return bool(events) and events[0].get("type") == "AllBlocksCleared"


class KvEventLog:
    """The events of one simulated process, batched per engine and virtual instant.

    Only engines given this log (the primary model's ranks) report; batches stay in time order."""

    def __init__(self, epoch: float) -> None:
        self.epoch = epoch
        self._batches: list[Batch] = []
        self._open: dict[int, tuple[float, list[Event]]] = {}
        # GPU-missed full blocks that were not reported because their hash was already resident
        # (see GpuPrefixCache.cache): the term that makes event-derived GPU-missed tokens add up
        # to the `*prefix_cache_queries - hits` counters exactly (docs/scenarios.md).
        self.missed_resident_blocks = 0

    def _events(self, rank: int, t: float) -> list[Event]:
        cur = self._open.get(rank)
        if cur is not None and cur[0] == t:
            return cur[1]
        events: list[Event] = []
        self._batches.append((rank, self.epoch + t, events))
        self._open[rank] = (t, events)
        return events

    def drain(self) -> list[Batch]:
        """The batches since the last drain; later events at the same instant open new ones."""
        out = self._batches
        self._batches = []
        self._open.clear()
        return out

    # -- what the engines report ---------------------------------------------------------------

    def gpu_stored(
        self,
        rank: int,
        t: float,
        hashes: Sequence[int],
        segments: Sequence[tuple[int, int]],
        start: int,
        end: int,
        block_size: int,
    ) -> None:
        """Blocks [start, end) of a prompt became cached on the GPU (one vLLM cache_full_blocks)."""
        self._events(rank, t).append(
            {
                "type": "BlockStored",
                "block_hashes": [h & _U64 for h in hashes[start:end]],
                "parent_block_hash": hashes[start - 1] & _U64 if start > 0 else None,
                "token_ids": synth_tokens(segments, start * block_size, end * block_size),
                "block_size": block_size,
                "lora_id": None,
                "medium": MEDIUM_GPU,
                "lora_name": None,
            }
        )

    def gpu_removed(self, rank: int, t: float, hashes: Iterable[int]) -> None:
        """GPU prefix-cache evictions: one event per block, as vLLM's block pool emits them."""
        events = self._events(rank, t)
        for h in hashes:
            events.append(
                {"type": "BlockRemoved", "block_hashes": [h & _U64], "medium": MEDIUM_GPU}
            )

    def cpu_stored(self, rank: int, t: float, keys: Iterable[int]) -> None:
        """Completed CPU stores: one placeholder event per chunk (vLLM 0.26's default)."""
        self.tier_stored(rank, t, keys, MEDIUM_CPU)

    def tier_stored(self, rank: int, t: float, keys: Iterable[int], medium: str) -> None:
        """Completed stores into a tier (`medium`: CPU, FS, ...), one placeholder per chunk.

        Why: vLLM 0.26.0's fs tier with enable_kv_events reports its stores as the CPU tier
        does (OffloadingEventsTracker), and never its removals.
        """
        events = self._events(rank, t)
        for k in keys:
            events.append(
                {
                    "type": "BlockStored",
                    "block_hashes": [k & _U64],
                    "parent_block_hash": None,
                    "token_ids": [],
                    "block_size": 0,
                    "lora_id": None,
                    "medium": medium,
                    "lora_name": None,
                }
            )

    def cpu_removed(self, rank: int, t: float, keys: Sequence[int]) -> None:
        """Chunks one store evicted from the CPU tier: one event for the batch."""
        if keys:
            self._events(rank, t).append(
                {
                    "type": "BlockRemoved",
                    "block_hashes": [k & _U64 for k in keys],
                    "medium": MEDIUM_CPU,
                }
            )

    def new_process(self, t: float, ranks: Iterable[int]) -> None:
        """A restart: each rank's first batch is a lone AllBlocksCleared (is_restart_batch)."""
        for rank in ranks:
            self._open.pop(rank, None)
            self._events(rank, t).append({"type": "AllBlocksCleared"})
            self._open.pop(rank, None)  # nothing else joins the restart batch


# -- wire encoding: vLLM's structs (vllm/distributed/kv_events.py, 0.33) -----------------------


class _EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class _KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Encoded as a map whose first key is "type" (the class name)."""


class BlockStored(_KVCacheEvent):
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
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(_KVCacheEvent):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(_KVCacheEvent):
    pass


_EVENT_TYPES: dict[str, type[_KVCacheEvent]] = {
    "BlockStored": BlockStored,
    "BlockRemoved": BlockRemoved,
    "AllBlocksCleared": AllBlocksCleared,
}
_ENCODER = msgspec.msgpack.Encoder()


def _to_struct(event: Event) -> _KVCacheEvent:
    fields = dict(event)
    kind = fields.pop("type", None)
    cls = _EVENT_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"unknown KV event type {kind!r}")
    return cls(**fields)


def encode_batch(ts: float, events: list[Event], dp_rank: int) -> bytes:
    """One KVEventBatch payload, `[ts, [events...], dp_rank]`, as vLLM 0.33 sends it.

    Fields at their default are left out, as msgspec does; docs/scenarios.md lists which stay."""
    return _ENCODER.encode(_EventBatch(ts, [_to_struct(e) for e in events], dp_rank))


# -- ZMQ publishing ----------------------------------------------------------------------------

_LOCAL_HOSTS = frozenset({"*", "0.0.0.0", "127.0.0.1", "localhost", "::", "::1"})


def offset_endpoint_port(endpoint: str | None, dp_rank: int) -> str | None:
    """vLLM's rule: DP rank N publishes on port + N (inproc endpoints get a `_dpN` suffix)."""
    if endpoint is None or dp_rank == 0:
        return endpoint
    if endpoint.startswith("inproc://"):
        return f"{endpoint}_dp{dp_rank}"
    base, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{endpoint}: expected tcp://HOST:PORT to offset by the DP rank")
    return f"{base}:{int(port) + dp_rank}"


def should_bind(endpoint: str) -> bool:
    """Whether to bind the PUB socket rather than connect it.

    The simulator plays the server, so it binds on local addresses too, where vLLM would connect."""
    # vLLM binds only on `*`, `::`, ipc and inproc; any other non-local host is a subscriber
    # that bound first, so the publisher connects there (ZmqEventPublisher's `bind=` overrides).
    if endpoint.startswith(("ipc://", "inproc://")) or "*" in endpoint or "::" in endpoint:
        return True
    rest = endpoint.split("://", 1)[-1]
    host = rest.rpartition(":")[0].strip("[]")
    return host in _LOCAL_HOSTS


class ZmqEventPublisher:
    """vLLM's ZmqEventPublisher, synchronous: a PUB socket and an optional replay ROUTER.

    Subscribers written for vLLM must read it unchanged, so frames and ports follow vLLM 0.26's."""

    # Messages are (topic, 8-byte big-endian sequence from 0, payload); the last `buffer_steps`
    # are kept. A ROUTER request [identity, b"", start_seq] gets [identity, b"", topic, seq,
    # payload] for each buffered seq >= start_seq, then this end marker as the seq frame.
    END_SEQ = (-1).to_bytes(8, "big", signed=True)

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        dp_rank: int = 0,
        buffer_steps: int = 10_000,
        *,
        bind: bool | None = None,
        hwm: int = 100_000,
    ) -> None:
        import zmq  # only the publisher needs pyzmq

        self._zmq = zmq
        endpoint_r = offset_endpoint_port(endpoint, dp_rank)
        assert endpoint_r is not None
        self.endpoint: str = endpoint_r
        self.replay_endpoint = offset_endpoint_port(replay_endpoint, dp_rank)
        self.dp_rank = dp_rank
        self.topic = topic.encode("utf-8")
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._pub: Any = ctx.socket(zmq.PUB)
        self._replay: Any = None
        try:
            self._pub.setsockopt(zmq.LINGER, 0)
            self._pub.setsockopt(zmq.SNDHWM, hwm)
            if should_bind(self.endpoint) if bind is None else bind:
                self._pub.bind(self.endpoint)
            else:
                self._pub.connect(self.endpoint)
            if self.replay_endpoint is not None:
                self._replay = ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(self.replay_endpoint)
        except BaseException:
            self.close()
            raise

    @property
    def next_seq(self) -> int:
        return self._seq

    def publish(self, payload: bytes) -> int:
        """Send one message; returns its sequence number.

        Never blocks: like any PUB socket, it drops messages past a slow subscriber's high-water
        mark (a sequence gap)."""
        seq = self._seq
        self._pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))
        self._seq = seq + 1
        return seq

    def publish_dropped(self, payload: bytes) -> int:
        """A message the PUB socket dropped (a subscriber over its high-water mark).

        It is numbered and kept for replay, never sent: the gap a real slow subscriber sees."""
        seq = self._seq
        self._buffer.append((seq, payload))
        self._seq = seq + 1
        return seq

    def reset(self) -> None:
        """The process restarted: sequences start at 0 again and the replay buffer is empty."""
        self._seq = 0
        self._buffer.clear()

    def service_replay(self) -> None:
        """Answer every replay request waiting on the ROUTER socket (non-blocking)."""
        if self._replay is None:
            return
        zmq = self._zmq
        while True:
            try:
                frames = self._replay.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 3:
                continue  # vLLM logs and ignores malformed requests
            ident, _, start_bytes = frames
            start = int.from_bytes(start_bytes, "big")
            # vLLM 0.26's _service_replay: [identity, b"", topic, seq, payload] per message,
            # then [identity, b"", b"", -1, b""].
            for seq, payload in self._buffer:
                if seq >= start:
                    self._replay.send_multipart(
                        (ident, b"", self.topic, seq.to_bytes(8, "big"), payload)
                    )
            self._replay.send_multipart((ident, b"", b"", self.END_SEQ, b""))

    def close(self) -> None:
        for sock in (self._pub, self._replay):
            if sock is not None and not sock.closed:
                sock.close(linger=0)

    def __enter__(self) -> ZmqEventPublisher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
