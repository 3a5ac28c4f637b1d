"""The simulator's vLLM KV cache events: shape on the wire, consistency with the counters and
the caches, the ZMQ publisher (loopback only), restarts and data parallelism."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
from aiohttp.test_utils import TestClient, TestServer

from kvoffload.sim import SimServer, scenarios
from kvoffload.sim.kv_events import (
    ZmqEventPublisher,
    encode_batch,
    offset_endpoint_port,
    should_bind,
)
from kvoffload.sim.server import make_app

from sim_helpers import parse, total

U64 = 2**64
GPU_STORED_KEYS = [
    "type",
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
]
REMOVED_KEYS = ["type", "block_hashes", "medium"]


def _run(name: str, duration_s: float, **overrides: Any) -> SimServer:
    s = replace(scenarios.get(name), duration_s=duration_s, **overrides)
    sim = SimServer(s, seed=0, kv_events=True)
    sim.run()
    return sim


def _events(batches: list[tuple[int, float, list[dict[str, Any]]]]) -> Iterator[dict[str, Any]]:
    for _, _, events in batches:
        yield from events


def _free_ports(n: int) -> int:
    """A port p such that p .. p+n-1 are free on 127.0.0.1 (for DP rank offsets)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + n > 65535:
            continue
        held: list[socket.socket] = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError("no run of free ports")


@contextlib.contextmanager
def _sockets() -> Iterator[list[Any]]:
    """Collects test sockets and closes every one of them."""
    socks: list[Any] = []
    try:
        yield socks
    finally:
        for s in socks:
            s.close(linger=0)


def _sub(socks: list[Any], endpoint: str, topic: bytes = b"") -> Any:
    sub = zmq.Context.instance().socket(zmq.SUB)
    socks.append(sub)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.connect(endpoint)
    return sub


# -- events and payloads ---------------------------------------------------------------------


def test_off_by_default_and_events_do_not_change_the_simulation() -> None:
    s = replace(scenarios.get("laptop-eviction"), duration_s=30.0)
    plain = SimServer(s, seed=0)
    plain.run()
    assert plain.drain_kv_events() == [] and not plain.kv_events
    assert all(e.kv is None and e.gpu.removed is None for e in plain.engines[0])
    with_events = SimServer(s, seed=0, kv_events=True)
    with_events.run()
    assert with_events.ground_truth() == plain.ground_truth()
    assert with_events.render() == plain.render()


def test_payload_shape() -> None:
    sim = _run("laptop-eviction", 60.0)
    batches = sim.drain_kv_events()
    assert batches and sim.drain_kv_events() == []
    dec = msgspec.msgpack.Decoder()
    bs = sim.scenario.block_size
    seen: set[tuple[str, str | None]] = set()
    last_ts = 0.0
    for rank, ts, events in batches:
        assert ts >= last_ts and ts >= sim.epoch  # virtual epoch seconds, in order
        last_ts = ts
        batch = dec.decode(encode_batch(ts, events, rank))
        assert isinstance(batch, list) and len(batch) == 3  # array-like [ts, events, rank]
        assert batch[0] == ts and batch[2] == rank == 0
        assert len(batch[1]) == len(events)
        for ev in batch[1]:
            assert isinstance(ev, dict) and next(iter(ev)) == "type"
            assert all(0 <= h < U64 for h in ev.get("block_hashes", []))
            seen.add((ev["type"], ev.get("medium")))
            if ev["type"] == "BlockStored":
                assert list(ev) == GPU_STORED_KEYS  # lora_* and medium present even if None
                assert ev["lora_id"] is None and ev["lora_name"] is None
                if ev["medium"] == "GPU":
                    assert ev["block_size"] == bs
                    assert len(ev["token_ids"]) == bs * len(ev["block_hashes"])
                    assert all(isinstance(t, int) and 0 <= t < 200_000 for t in ev["token_ids"])
                else:  # vLLM 0.26's placeholder CPU store: one block, no tokens, no parent
                    assert ev["medium"] == "CPU" and ev["block_size"] == 0
                    assert ev["token_ids"] == [] and ev["parent_block_hash"] is None
                    assert len(ev["block_hashes"]) == 1
            else:
                assert ev["type"] == "BlockRemoved" and list(ev) == REMOVED_KEYS
                if ev["medium"] == "GPU":
                    assert len(ev["block_hashes"]) == 1  # one per evicted block, as vLLM
    assert seen == {
        ("BlockStored", "GPU"),
        ("BlockStored", "CPU"),
        ("BlockRemoved", "GPU"),
        ("BlockRemoved", "CPU"),
    }


def test_encode_batch_omits_only_defaults() -> None:
    dec = msgspec.msgpack.Decoder()
    ev = {
        "type": "BlockStored",
        "block_hashes": [U64 - 1],
        "parent_block_hash": 5,
        "token_ids": [1, 2],
        "block_size": 2,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "group_idx": 0,
        "extra_keys": None,
    }
    out = dec.decode(encode_batch(1.5, [ev, {"type": "AllBlocksCleared"}], 3))
    assert out[0] == 1.5 and out[2] == 3
    stored, cleared = out[1]
    assert list(stored) == [*GPU_STORED_KEYS, "group_idx"]  # 0 is not the default (None)
    assert stored["block_hashes"] == [U64 - 1] and cleared == {"type": "AllBlocksCleared"}
    with pytest.raises(ValueError):
        encode_batch(0.0, [{"type": "Nope"}], 0)


def test_gpu_chains_and_tokens_follow_the_prompts() -> None:
    """A GPU BlockStored's parent is the block before its first one; shared prefixes share
    hashes and token ids (first blocks of the same document)."""
    sim = _run("laptop-eviction", 30.0)
    bs = sim.scenario.block_size
    tokens_of: dict[int, list[int]] = {}
    parent_of: dict[int, int | None] = {}
    for ev in _events(sim.drain_kv_events()):
        if ev["type"] != "BlockStored" or ev["medium"] != "GPU":
            continue
        parent = ev["parent_block_hash"]
        for i, h in enumerate(ev["block_hashes"]):
            toks = ev["token_ids"][i * bs : (i + 1) * bs]
            assert tokens_of.setdefault(h, toks) == toks  # a hash always means the same tokens
            assert parent_of.setdefault(h, parent) == parent  # and the same parent
            parent = h
    assert sum(p is None for p in parent_of.values()) >= 1


@pytest.mark.parametrize("bpc", [1, 2])
def test_cpu_stored_blocks_times_bytes_equal_store_bytes(bpc: int) -> None:
    sim = _run("laptop-eviction", 60.0, blocks_per_chunk=bpc)
    cpu_blocks = sum(
        len(ev["block_hashes"])
        for ev in _events(sim.drain_kv_events())
        if ev["type"] == "BlockStored" and ev["medium"] == "CPU"
    )
    _, samples = parse(sim.render())
    store_bytes = total(samples, "vllm:kv_offload_store_bytes_total")
    # a CPU "block" is one chunk of blocks_per_chunk GPU blocks (vLLM's offloaded block size)
    assert cpu_blocks > 0
    assert cpu_blocks * sim.sizings[0].chunk_bytes == store_bytes


@pytest.mark.parametrize("name", ["rag-hot-set-fits", "dp2"])
def test_stores_and_removals_track_the_caches(name: str) -> None:
    """No block is stored twice without a removal in between, none removed unless stored, and
    after the run the stored-minus-removed sets are exactly what each cache holds."""
    sim = _run(name, 240.0)
    gpu: dict[int, set[int]] = defaultdict(set)
    cpu: dict[int, set[int]] = defaultdict(set)
    for rank, _, events in sim.drain_kv_events():
        for ev in events:
            resident = (gpu if ev["medium"] == "GPU" else cpu)[rank]
            for h in ev["block_hashes"]:
                if ev["type"] == "BlockStored":
                    assert h not in resident
                    resident.add(h)
                else:
                    assert h in resident
                    resident.remove(h)
    assert set(gpu) == set(cpu) == set(range(sim.scenario.dp))
    for eng in sim.engines[0]:
        assert gpu[eng.index] == {h % U64 for h in eng.gpu._block_of}
        assert eng.cpu is not None
        assert cpu[eng.index] == {h % U64 for h in eng.cpu._chunks}


@pytest.mark.parametrize("name", ["rag-hot-set-fits", "pressure-without-offloading"])
def test_gpu_missed_tokens_from_events(name: str) -> None:
    """bs × GPU-stored blocks + partial tails + bs × (missed blocks already resident)
    = Σ (prompt − GPU hit) = external_prefix_cache_queries = prefix_cache_queries − hits."""
    sim = _run(name, 300.0)
    bs = sim.scenario.block_size
    stored = sum(
        len(ev["block_hashes"])
        for ev in _events(sim.drain_kv_events())
        if ev["type"] == "BlockStored" and ev["medium"] == "GPU"
    )
    tails = sum(r["prompt_tokens"] % bs for r in sim.records)
    log = sim.kv_event_log
    assert log is not None
    _, samples = parse(sim.render())
    missed = total(samples, "vllm:prefix_cache_queries_total") - total(
        samples, "vllm:prefix_cache_hits_total"
    )
    assert bs * stored + tails + bs * log.missed_resident_blocks == missed
    if sim.scenario.offloading:
        assert total(samples, "vllm:external_prefix_cache_queries_total") == missed
    # the correction (recomputed last block of a fully cached prompt, concurrent duplicates)
    # is small: events alone are within 1% of the counter
    assert log.missed_resident_blocks * bs <= 0.01 * missed


# -- ZMQ ---------------------------------------------------------------------------------------


def test_endpoint_rules() -> None:
    assert offset_endpoint_port("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_endpoint_port("tcp://127.0.0.1:5557", 2) == "tcp://127.0.0.1:5559"
    assert offset_endpoint_port(None, 1) is None
    assert should_bind("tcp://*:5557") and should_bind("tcp://127.0.0.1:5557")
    assert should_bind("tcp://[::]:5557") and should_bind("ipc:///tmp/kv")
    assert not should_bind("tcp://10.1.2.3:5557")


def _recv(sock: Any, timeout_s: float = 2.0) -> list[bytes]:
    if not sock.poll(int(timeout_s * 1000)):
        raise AssertionError("nothing received")
    return sock.recv_multipart()


def test_zmq_round_trip_and_replay() -> None:
    port = _free_ports(2)
    rport = port + 1
    with (
        _sockets() as socks,
        ZmqEventPublisher(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{rport}", topic="kv") as pub,
    ):
        sub = _sub(socks, f"tcp://127.0.0.1:{port}", b"kv")
        # PUB drops messages until the subscription has arrived: publish until one gets through
        published: dict[int, bytes] = {}
        received: list[list[bytes]] = []
        deadline = time.monotonic() + 5.0
        while not received and time.monotonic() < deadline:
            payload = encode_batch(float(len(published)), [{"type": "AllBlocksCleared"}], 0)
            published[pub.publish(payload)] = payload
            if sub.poll(20):
                received.append(sub.recv_multipart())
        assert received, "the subscription never arrived"
        for i in range(3):
            payload = encode_batch(100.0 + i, [], 0)
            published[pub.publish(payload)] = payload
        assert list(published) == list(range(len(published)))  # the sequence starts at 0, +1
        while sub.poll(200):
            received.append(sub.recv_multipart())
        seqs = [int.from_bytes(f[1], "big") for f in received]
        assert seqs == list(range(seqs[0], len(published)))  # no gap once subscribed
        for topic, seq_b, payload in received:
            assert topic == b"kv" and len(seq_b) == 8
            assert payload == published[int.from_bytes(seq_b, "big")]
        assert msgspec.msgpack.decode(received[-1][2]) == [102.0, [], 0]
        seq0 = len(published) - 4  # the last AllBlocksCleared: replay the three after it

        dealer = zmq.Context.instance().socket(zmq.DEALER)
        socks.append(dealer)
        dealer.connect(f"tcp://127.0.0.1:{rport}")
        dealer.send_multipart([b"", (seq0 + 1).to_bytes(8, "big")])
        replies: list[list[bytes]] = []
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and (not replies or replies[-1][2] != pub.END_SEQ):
            pub.service_replay()
            if dealer.poll(20):
                replies.append(dealer.recv_multipart())
        # vLLM 0.26's frames: [b"", topic, seq, payload], then [b"", b"", -1, b""]
        assert [int.from_bytes(r[2], "big") for r in replies[:-1]] == [
            seq0 + 1 + i for i in range(3)
        ]
        assert all(r[0] == b"" and len(r) == 4 for r in replies)
        assert all(r[1] == b"kv" for r in replies[:-1])
        assert [r[3] for r in replies[:-1]] == [published[seq0 + 1 + i] for i in range(3)]
        assert replies[-1] == [b"", b"", (-1).to_bytes(8, "big", signed=True), b""]


def test_restart_and_dp2_over_the_app() -> None:
    """make_app publishes each DP rank on port + rank; a restart sends AllBlocksCleared with
    sequence 0, and replay then holds only the new process's messages."""
    s = replace(scenarios.get("laptop-eviction"), dp=2, restart_at_s=40.0, duration_s=120.0)
    sim = SimServer(s, seed=0)
    port = _free_ports(4)  # PUB on port, port + 1; replay ROUTERs on port + 2, port + 3
    rport = port + 2
    # The app's wall clock is ours: simulated time moves only when the test steps it, so a
    # loaded machine makes the test slower, never different (the restart cannot pass before
    # the subscribers are connected).
    wall = [0.0]
    app = make_app(
        sim,
        speed=100.0,
        kv_events_endpoint=f"tcp://127.0.0.1:{port}",
        kv_events_replay=f"tcp://127.0.0.1:{rport}",
        clock=lambda: wall[0],
    )
    dec = msgspec.msgpack.Decoder()
    got: dict[int, list[tuple[int, list[Any]]]] = {0: [], 1: []}
    replayed: dict[int, list[int]] = {0: [], 1: []}

    async def go() -> None:
        with _sockets() as socks:
            async with TestClient(TestServer(app)):
                subs = [_sub(socks, f"tcp://127.0.0.1:{port + r}") for r in (0, 1)]

                def receive() -> None:
                    for r, sub in enumerate(subs):
                        while sub.poll(0):
                            _, seq_b, payload = sub.recv_multipart()
                            got[r].append((int.from_bytes(seq_b, "big"), dec.decode(payload)))

                async def run_to(virtual_s: float) -> None:
                    """Steps the clock, then waits for the ticker to simulate and publish up
                    to there (it does both in one step, so sim.now there means published)."""
                    wall[0] = virtual_s / 100.0
                    deadline = time.monotonic() + 30.0  # only a hang ends here
                    while sim.now < virtual_s - 1e-9:
                        assert time.monotonic() < deadline, f"stuck at t={sim.now}"
                        receive()
                        await asyncio.sleep(0.01)

                # ZMQ's slow joiner: a subscriber misses what is published before it connects,
                # so step a virtual second at a time, well before the restart, until both ranks
                # have messages; then run to 30 s, still in the first process.
                t = 0.0
                while not (got[0] and got[1]):
                    assert t < 30.0, "the subscribers got nothing in 30 virtual seconds"
                    t += 1.0
                    await run_to(t)
                    await asyncio.sleep(0.05)  # loopback delivery
                    receive()
                await run_to(30.0)
                await run_to(120.0)  # past the restart, to the end
                # What the last tick published is on its way: read until the sockets are quiet.
                quiet = time.monotonic() + 0.5
                while time.monotonic() < quiet:
                    before = len(got[0]) + len(got[1])
                    receive()
                    if len(got[0]) + len(got[1]) != before:
                        quiet = time.monotonic() + 0.5
                    await asyncio.sleep(0.01)
                for r in (0, 1):
                    dealer = zmq.Context.instance().socket(zmq.DEALER)
                    socks.append(dealer)
                    dealer.connect(f"tcp://127.0.0.1:{rport + r}")
                    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
                    deadline = time.monotonic() + 30.0  # only a hang ends here
                    while time.monotonic() < deadline:
                        if dealer.poll(0):
                            _, _topic, seq_b, _ = dealer.recv_multipart()
                            seq = int.from_bytes(seq_b, "big", signed=True)
                            if seq == -1:
                                break
                            replayed[r].append(seq)
                        else:
                            await asyncio.sleep(0.01)  # the app's ticker answers replays

    asyncio.run(go())
    for r in (0, 1):
        msgs = got[r]
        assert msgs, f"rank {r} published nothing"
        assert all(batch[2] == r for _, batch in msgs)
        restarts = [i for i, (_, b) in enumerate(msgs) if b[1] == [{"type": "AllBlocksCleared"}]]
        assert len(restarts) == 1
        i = restarts[0]
        assert msgs[i][0] == 0 and msgs[i][1][0] == sim.epoch + 40.0
        assert i > 0 and msgs[i - 1][0] > 0 and msgs[i - 1][1][0] <= sim.epoch + 40.0
        for (a, _), (b, _) in zip(msgs[i:], msgs[i + 1 :], strict=False):
            assert b == a + 1  # consecutive within the new process
        assert replayed[r] and replayed[r] == list(range(len(replayed[r])))
        assert len(replayed[r]) >= len(msgs) - i  # the buffer restarted with the process


def test_record_writes_the_event_stream(tmp_path: Path) -> None:
    pytest.importorskip("kvoffload.recording.openmetrics")
    from kvoffload.kvevents.eventfile import read_event_file
    from kvoffload.sim.write_recording import record_scenario

    s = replace(scenarios.get("laptop-eviction"), restart_at_s=30.0)
    rec, ev_path = tmp_path / "rec.om", tmp_path / "rec.kvevents"
    n = record_scenario(s, str(rec), duration_s=60.0, interval_s=15.0, events_path=str(ev_path))
    assert n == 5
    msgs = list(read_event_file(str(ev_path)))
    assert msgs and all(m.topic == b"" and m.dp_rank == 0 for m in msgs)
    dec = msgspec.msgpack.Decoder()
    expected = 0
    restarts = 0
    for m in msgs:
        batch = dec.decode(m.payload)
        assert batch[0] == m.received_at and batch[2] == 0
        if batch[1] == [{"type": "AllBlocksCleared"}]:
            restarts += 1
            assert m.received_at == s.start_epoch + 30.0
            expected = 0
        assert m.seq == expected
        expected += 1
    assert restarts == 1 and msgs[-1].received_at <= s.start_epoch + 60.0
