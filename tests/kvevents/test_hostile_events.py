"""A hostile publisher on the KV-event port (issue #12, attack 4): a flood of new blocks never
removed, a 200k-block parent chain, sequence numbers that jump or go out of range with a
ROUTER that answers replays without end. Each is sent over ZMQ by a publisher the test starts,
into the subscriber and the state the sidecar uses."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import pytest
import zmq
import zmq.asyncio
from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload.kvevents import subscriber as subscriber_mod
from kvoffload.kvevents.blockindex import ResidentBlocks
from kvoffload.kvevents.decode import STORED, Batch, Event
from kvoffload.kvevents.eventfile import RawMessage
from kvoffload.kvevents.state import (
    PREFIX_ALLOWANCE_MAX,
    PREFIX_ALLOWANCE_PER_BLOCK,
    PREFIX_ALLOWANCE_PER_EVENT,
    SEQUENCE_LIMIT,
    ParentMap,
    TargetEvents,
)
from kvoffload.kvevents.subscriber import Subscriber, cancel_all
from kvoffload.sim.kv_events import encode_batch

from helpers import free_port

BASE = 1 << 40  # hashes of the hostile blocks


def _stored(hashes: list[int], parent: int | None, medium: str = "GPU") -> dict:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": [],
        "block_size": 16,
        "lora_id": None,
        "medium": medium,
        "lora_name": None,
    }


class _Hostile:
    """A PUB socket (and a ROUTER for replays) driven by the test, with the subscriber and the
    state it feeds; `received` holds the sequence numbers the state took, in order."""

    def __init__(self, state: TargetEvents, replay: bool = False, timeout: float = 3.0) -> None:
        self.ctx = zmq.asyncio.Context.instance()
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.replay = f"tcp://127.0.0.1:{free_port()}" if replay else None
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.SNDHWM, 0)  # the test's own side never drops
        self.pub.bind(self.endpoint)
        self.router = None
        if self.replay:
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.bind(self.replay)
        self.state = state
        self.received: list[int] = []
        self.cpu_per_message: list[float] = []

        def on_message(msg: RawMessage) -> None:
            start = time.process_time()
            if state.ingest_message(msg):
                self.received.append(msg.seq)
            self.cpu_per_message.append(time.process_time() - start)

        self.sub = Subscriber(
            self.endpoint,
            0,
            on_message,
            self.replay,
            replay_timeout_seconds=timeout,
            on_rejected=state.reject_sequence,  # as the sidecar wires it
        )
        self.tasks: list[asyncio.Task[None]] = []

    async def send(self, seq: int, events: list[dict]) -> None:
        payload = encode_batch(1.0, events, 0)
        await self.pub.send_multipart([b"", seq.to_bytes(8, "big", signed=True), payload])

    async def start(self) -> None:
        """Subscribe, and send message 0 until it arrives (ZMQ's slow joiner)."""
        self.tasks.append(asyncio.create_task(self.sub.run()))
        for _ in range(200):
            await self.send(0, [])
            await asyncio.sleep(0.03)
            if self.received:
                return
        raise AssertionError("the subscriber never received a message")

    async def until(self, done: Callable[[], bool], seconds: float) -> float:
        start = time.monotonic()
        while not done():
            if time.monotonic() - start > seconds:
                raise AssertionError(f"not done after {seconds} s: {self.received[-5:]}")
            await asyncio.sleep(0.01)
        return time.monotonic() - start

    async def close(self) -> None:
        await cancel_all(self.tasks)
        self.pub.close(linger=0)
        if self.router is not None:
            self.router.close(linger=0)


async def _with(
    state: TargetEvents, body: Callable[[_Hostile], Awaitable[None]], replay: bool = False
) -> _Hostile:
    hostile = _Hostile(state, replay)
    try:
        await hostile.start()
        await body(hostile)
    finally:
        await hostile.close()
    return hostile


# -- 1. new blocks, never removed: one budget bounds the whole state --------------------------
@pytest.mark.slow
def test_a_flood_of_new_blocks_stays_within_the_one_budget():
    """200k new GPU blocks (each message's chain continuing the last) also stored in the CPU
    tier, never a BlockRemoved, budget 10,000: every structure holds at most the budget, the
    forgotten blocks are counted, the figures stay sane."""
    budget, per_message, messages = 10_000, 1_000, 200
    state = TargetEvents(1.0, budget)

    async def flood(h: _Hostile) -> None:
        parent = None
        for i in range(messages):
            hashes = list(range(BASE + i * per_message, BASE + (i + 1) * per_message))
            await h.send(i + 1, [_stored(hashes, parent), _stored(hashes, None, "CPU")])
            parent = hashes[-1]
        await h.until(lambda: h.received[-1:] == [messages], 60)

    asyncio.run(_with(state, flood))
    eng = state.engines[0]
    total = per_message * messages
    assert len(eng.gpu_parent) <= budget and len(eng.cpu_resident) <= budget
    assert eng.tracker.tracked <= budget
    assert eng.gpu_parent.evicted == total - len(eng.gpu_parent)  # every one forgotten counted
    assert eng.cpu_resident.evicted == total - len(eng.cpu_resident)
    assert state.evicted_blocks() == {
        "gpu_parents": eng.gpu_parent.evicted,
        "cpu_resident": eng.cpu_resident.evicted,
    }
    # The arrays behind the three, per block held: bounded by the budget, not the flood.
    assert eng.tracker.nbytes() + eng.cpu_resident.nbytes() < 100 * budget
    # Sane figures: every block missed once (cold), none served, none loaded.
    assert eng.gpu_missed_blocks == total and state.lost_messages() == 0
    assert state.hit_tokens(1e15, 1.0) == 0 and state.cpu_loaded_blocks() == 0
    assert state.sample_rate_now() <= budget / total * 1.5
    # The newest blocks are the ones kept: the chain can still be walked from its tip.
    tip = BASE + total - 1
    assert eng.gpu_parent.get(tip) == tip - 1 and tip in eng.cpu_resident


# -- 2. a 200k-block chain: O(1) amortised per event ------------------------------------------
@pytest.mark.timing
def test_a_200k_block_chain_costs_o1_amortised_per_event():
    """One message stores a 200k-block chain, then 2,000 two-block messages each continue it
    (the walk to the root was 200k ancestors an event, 0.65-3 s each: ~20-100 minutes for
    these). Now the ancestors walked an event are bounded by the allowance. Two blocks, as one
    block extending a run's tail is a decode block, never looked up (so never walked)."""
    chain, followers = 200_000, 2_000
    state = TargetEvents()  # exact: the tracker holds every block of the chain

    async def attack(h: _Hostile) -> None:
        await h.send(1, [_stored(list(range(BASE, BASE + chain)), None)])
        for i in range(followers):
            block = BASE + chain + 2 * i
            await h.send(i + 2, [_stored([block, block + 1], block - 1)])
            if i % 100 == 0:
                await asyncio.sleep(0)  # let the subscriber take them as they come
        await h.until(lambda: h.received[-1:] == [followers + 1], 120)

    hostile = asyncio.run(_with(state, attack))
    eng = state.engines[0]
    assert eng.gpu_missed_blocks == chain + 2 * followers
    assert len(eng.gpu_parent) == chain + 2 * followers
    assert eng.prefix_walks_cut >= followers - 1
    follower_cpu = hostile.cpu_per_message[-followers:]
    # At most the saved allowance (65,536 ancestors) once, then ~80 an event: the followers
    # together cost about one walk of the 200k chain.
    saved = PREFIX_ALLOWANCE_MAX + followers * (
        PREFIX_ALLOWANCE_PER_EVENT + PREFIX_ALLOWANCE_PER_BLOCK
    )
    assert saved < 2 * chain
    assert sum(follower_cpu) < 10.0, sum(follower_cpu)
    assert sorted(follower_cpu)[followers // 2] < 0.005  # the median event: well under 5 ms


def test_the_allowance_never_binds_on_long_real_prefixes():
    """One request with a 60k-block prefix (a 1M-token context) is walked whole, and so is a
    long agent session: 200 requests of 30 new blocks each on a growing prefix up to 6,000
    blocks (a 100k-token context), two a second (receive time), walked whole every time."""
    state = TargetEvents()
    eng = state.engine(0)
    depth = 60_000
    eng._gpu_stored(tuple(range(BASE, BASE + depth)), None)
    eng._gpu_stored((BASE + depth,), BASE + depth - 1)
    assert eng.prefix_walks_cut == 0
    turns, new = 200, 30
    tip, t = None, 1000.0
    for i in range(turns):
        hashes = list(range(BASE * 2 + i * new, BASE * 2 + (i + 1) * new))
        batch = Batch(t, 0, [Event(STORED, tuple(hashes), "GPU", 16, None, tip)])
        assert state.ingest(batch, i + 1, 0, t)
        tip, t = hashes[-1], t + 0.5
    assert eng.prefix_walks_cut == 0
    # Each request touched its whole prefix: the session's first block is the most recent.
    before = eng.tracker.histogram.hits_below(1)
    eng._gpu_stored((BASE * 2,), None)
    assert eng.tracker.histogram.hits_below(1) == before + 1


# -- 3. sequence numbers ----------------------------------------------------------------------
def test_sequence_jumps_are_flagged_not_lost_and_out_of_range_numbers_rejected():
    state = TargetEvents()
    eng = state.engine(0)
    batch = Batch(1.0, 0, [])
    for seq, t in ((0, 100.0), (1, 100.1), (5, 100.2)):
        assert state.ingest(batch, seq, 0, t)
    assert state.lost_messages() == 3  # a real gap
    assert state.ingest(batch, 1 << 39, 0, 100.3)  # 5e11 messages in 0.1 s: not losses
    assert state.lost_messages() == 3 and eng.sequence_jumps == 1
    assert state.ingest(batch, (1 << 39) + 1, 0, 100.4) and state.lost_messages() == 3
    for bad in (-2, SEQUENCE_LIMIT, (1 << 63) - 1):
        assert not state.ingest(batch, bad, 0, 100.5)
    assert state.sequence_anomalies() == {"rejected": 3, "jump": 1}
    assert eng.last_seq == (1 << 39) + 1 and state.messages() == 5
    # A long silence makes a long gap plausible: losses, not a jump.
    assert state.ingest(batch, (1 << 39) + 1 + 200_000_000, 0, 100.4 + 3600)
    assert state.lost_messages() == 3 + 199_999_999 and eng.sequence_jumps == 1
    assert state.unseen_before_start() == 0


async def _router_answering(router: zmq.asyncio.Socket, frames: int, state: dict) -> None:
    """Each replay request is answered with `frames` copies of an in-range message and no end
    marker (a hostile or broken ROUTER); requests are counted."""
    payload = encode_batch(1.0, [], 0)
    while True:
        ident, _, start = await router.recv_multipart()
        state["requests"] += 1
        seq = int.from_bytes(start, "big")
        for i in range(frames):
            await router.send_multipart([ident, b"", b"", seq.to_bytes(8, "big"), payload])
            if i % 500 == 0:
                await asyncio.sleep(0)


def test_jumps_and_out_of_range_numbers_with_replay_never_wedge_ingestion():
    """With --kv-events-replay: a number past 2^63 and one past the limit are rejected, a jump
    to 2^39 asks for a replay that the ROUTER answers without end (cut, not looped on), and
    live messages after it are all taken; the figures stay sane."""
    state = TargetEvents()
    answered = {"requests": 0}
    endless = subscriber_mod.REPLAY_MAX_MESSAGES + 5_000

    async def attack(h: _Hostile) -> None:
        assert h.router is not None
        server = asyncio.create_task(_router_answering(h.router, endless, answered))
        h.tasks.append(server)
        jump = 1 << 39
        for seq in (1, 2, (1 << 63) - 1, SEQUENCE_LIMIT, jump, jump + 1, jump + 2):
            await h.send(seq, [])
            await asyncio.sleep(0.02)
        await h.until(lambda: h.received[-1:] == [jump + 2], 60)
        for seq in range(jump + 3, jump + 20):  # live again
            await h.send(seq, [])
        await h.until(lambda: h.received[-1:] == [jump + 19], 30)

    hostile = asyncio.run(_with(state, attack, replay=True))
    sub = hostile.sub.state
    assert sub.rejected == 2  # 2^63 - 1 and SEQUENCE_LIMIT, never placed in the stream
    assert state.sequence_anomalies()["rejected"] == 2  # what /metrics exports
    assert answered["requests"] >= 1  # the jump asked for a replay: cut at the cap
    assert sub.replayed <= 1  # only the one in-range message, once
    eng = state.engines[0]
    assert eng.sequence_jumps == 1 and state.lost_messages() <= 2
    assert state.unseen_before_start() == 0 and eng.last_seq == (1 << 39) + 19


@pytest.mark.timing
def test_a_publisher_flapping_between_restarts_gets_replays_rate_limited():
    """Every message goes back (a 'restart' each): without a limit, each asked for a replay
    from 0 that a silent ROUTER let time out — one message per timeout. Now the first few
    are replayed and the rest counted as skipped; every message is still taken."""
    state = TargetEvents()

    async def flap(h: _Hostile) -> None:
        seqs = [5 if i % 2 == 0 else 4 for i in range(60)]
        for seq in seqs:
            await h.send(seq, [])
        await h.until(lambda: len(h.received) >= 1 + len(seqs), 20)

    hostile = _Hostile(state, replay=True, timeout=0.2)

    async def run() -> float:
        try:
            await hostile.start()
            start = time.monotonic()
            await flap(hostile)
            return time.monotonic() - start
        finally:
            await hostile.close()

    took = asyncio.run(run())
    assert hostile.sub.state.replays_skipped > 0
    assert took < 15  # 60 timeouts of 0.2 s would be 12 s on their own; ~10 are left
    assert state.engines[0].clears >= 29  # each 5 -> 4
    assert state.lost_messages() == 4  # 1-4, between the first message (0) and 5


def test_state_within_budget_survives_save_and_load(tmp_path):
    from kvoffload.kvevents import persist

    state = TargetEvents(1.0, 1_000)
    eng = state.engine(0)
    parent = None
    for i in range(30):
        hashes = tuple(range(BASE + 100 * i, BASE + 100 * (i + 1)))
        eng._gpu_stored(hashes, parent)
        for h in hashes:
            eng.cpu_resident.store(h)
        parent = hashes[-1]
    path = tmp_path / "s.state"
    persist.save(state, "x:1", path)
    loaded = persist.load(path, "x:1", 1.0, 1_000)
    assert loaded is not None
    again = loaded.events.engines[0]
    assert list(again.gpu_parent.items()) == list(eng.gpu_parent.items())  # oldest first
    assert again.cpu_resident.items() == eng.cpu_resident.items()
    assert again.evicted_blocks == eng.evicted_blocks
    # every block stored is held or was evicted, within the budget
    assert eng.evicted_blocks["gpu_parents"] == 3_000 - len(eng.gpu_parent)
    assert eng.evicted_blocks["cpu_resident"] == 3_000 - len(eng.cpu_resident) == 2_000
    assert len(eng.gpu_parent) <= 1_000
    assert again.tracker.tracked == eng.tracker.tracked <= 1_000


def test_evictions_and_sequence_anomalies_are_exported():
    from kvoffload.sidecar.metrics import SidecarCollector
    from kvoffload.sidecar.service import EventFigures, SidecarView, TargetState

    state = TargetEvents(1.0, 1_000)
    parent = None
    for i in range(5):
        hashes = list(range(BASE + 1_000 * i, BASE + 1_000 * (i + 1)))
        batch = Batch(1.0, 0, [Event(STORED, tuple(hashes), "GPU", 16, None, parent)])
        assert state.ingest(batch, i, 0, 10.0 + i)
        parent = hashes[-1]
    assert state.ingest(Batch(1.0, 0, []), 1 << 38, 0, 20.0)  # a jump
    assert not state.ingest(Batch(1.0, 0, []), 1 << 62, 0, 21.0)  # out of range
    figures = EventFigures.of(state)  # as Sidecar.snapshot takes them
    target = TargetState("http://t:1/metrics", "t:1")
    view = SidecarView([target], {"t:1": figures}, [], [], 300.0, 5.0, True)
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for m in SidecarCollector(view).collect()
        for s in m.samples
    }
    assert got[
        ("kvoffload_kv_events_evicted_blocks_total", (("state", "gpu_parents"), ("target", "t:1")))
    ] == 5_000 - len(state.engines[0].gpu_parent)
    assert (
        got[
            (
                "kvoffload_kv_events_sequence_anomalies_total",
                (("reason", "jump"), ("target", "t:1")),
            )
        ]
        == 1
    )
    assert (
        got[
            (
                "kvoffload_kv_events_sequence_anomalies_total",
                (("reason", "rejected"), ("target", "t:1")),
            )
        ]
        == 1
    )
    assert got[("kvoffload_kv_events_lost_messages_total", (("target", "t:1"),))] == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["store", "load", "pop"]), st.integers(0, 40)), max_size=300
    ),
    st.integers(1, 12),
)
def test_bounded_residency_forgets_the_oldest_stored_first(ops, limit):
    """The CPU tier's residency with a limit equals an insertion-ordered dict that drops its
    first entry past the limit (a store of a resident block keeps its place)."""
    resident, ref = ResidentBlocks(limit), OrderedDict()
    evicted = 0
    for op, h in ops:
        if op == "store":
            resident.store(h)
            if h not in ref and len(ref) == limit:
                ref.popitem(last=False)
                evicted += 1
            ref[h] = False
        elif op == "load":
            assert resident.load(h) == (h in ref)
            if h in ref:
                ref[h] = True
        else:
            assert resident.pop(h) == ref.pop(h, None)
        assert len(resident) == len(ref) <= limit
    assert resident.items() == list(ref.items()) and resident.evicted == evicted
    assert resident.copy().items() == list(ref.items())
    assert resident.never_loaded() == sum(1 for v in ref.values() if not v)


def test_the_parent_map_keeps_the_newest_within_its_limit():
    parents = ParentMap(80)
    for h in range(1, 1_001):
        parents[h] = h - 1
        parents.trim()
        assert len(parents) <= 80
    assert list(parents) == list(range(1_001 - len(parents), 1_001))  # the newest, in order
    assert parents.evicted == 1_000 - len(parents)
