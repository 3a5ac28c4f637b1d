"""The ZMQ subscriber against vLLM's publisher protocol (the simulator's copy of it): sequence
gaps are replayed from the ROUTER when it is there, counted as lost when it is not."""

import asyncio
import contextlib

from kvoffload.kvevents.decode import decode_batch
from kvoffload.kvevents.eventfile import RawMessage
from kvoffload.kvevents.state import TargetEvents
from kvoffload.kvevents.subscriber import Subscriber
from kvoffload.sim.kv_events import ZmqEventPublisher, encode_batch

from helpers import free_port


def _payload(i: int) -> bytes:
    return encode_batch(1.0 + i, [{"type": "BlockStored", "block_hashes": [i],
                                   "parent_block_hash": None, "token_ids": [], "block_size": 16,
                                   "lora_id": None, "medium": "GPU", "lora_name": None}], 0)


def _drop(pub: ZmqEventPublisher, payload: bytes) -> None:
    """What a PUB socket does past a slow subscriber's high-water mark: the message is gone
    for the subscriber but kept in the publisher's replay buffer."""
    pub._buffer.append((pub._seq, payload))
    pub._seq += 1


async def _run(with_replay: bool) -> tuple[list[int], Subscriber, TargetEvents]:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    replay = f"tcp://127.0.0.1:{free_port()}" if with_replay else None
    pub = ZmqEventPublisher(endpoint, replay)
    got: list[int] = []
    state = TargetEvents()

    def on_message(msg: RawMessage) -> None:
        got.append(msg.seq)
        state.ingest(decode_batch(msg.payload), msg.seq, msg.dp_rank)

    sub = Subscriber(endpoint, 0, on_message, replay, replay_timeout_seconds=3.0)
    task = asyncio.create_task(sub.run())

    async def serve_replays() -> None:
        while True:
            pub.service_replay()
            await asyncio.sleep(0.01)

    server = asyncio.create_task(serve_replays())
    try:
        # ZMQ's slow joiner: publish the first message until the subscriber has it.
        for _ in range(100):
            if got:
                break
            if pub.next_seq == 0:
                pub.publish(_payload(0))
            else:
                pub.reset()
                pub.publish(_payload(0))
            await asyncio.sleep(0.05)
        assert got == [0], "the subscriber never received the first message"
        _drop(pub, _payload(1))
        pub.publish(_payload(2))
        pub.publish(_payload(3))
        for _ in range(100):
            if got and got[-1] == 3:
                break
            await asyncio.sleep(0.02)
    finally:
        for t in (task, server):
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
        pub.close()
    return got, sub, state


def test_a_gap_is_replayed_in_order():
    got, sub, state = asyncio.run(_run(with_replay=True))
    assert got == [0, 1, 2, 3]
    assert sub.state.replayed == 1 and sub.state.last_error is None
    assert state.lost_messages() == 0 and state.messages() == 4


def test_without_replay_the_gap_is_counted_as_lost():
    got, _sub, state = asyncio.run(_run(with_replay=False))
    assert got == [0, 2, 3]
    assert state.lost_messages() == 1
