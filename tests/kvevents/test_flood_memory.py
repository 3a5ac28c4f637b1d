"""#25 items 9-10: a flood of new block hashes at the default budget (1M blocks) reached 735 MB
with /healthz timing out (docs: ~220 MB a rank), and messages of 63 MiB queued by the 100,000
(3.3 GB). Here 1.2M distinct hashes (1,200 messages of 1,000, stored on the GPU and in the CPU
tier, never removed) and then 40 messages just under the 4 MiB cap (not msgpack) go over ZMQ
to a subscriber in a fresh process: its state stays within the stated bound, libzmq holds at
most RCVHWM messages, and its event loop keeps turning."""

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from kvoffload.sim.kv_events import encode_batch

from helpers import free_port

PROCS = Path(__file__).parent / "procs"
MESSAGES, PER, JUNK = 1200, 1000, 40


def _stored(hashes: list[int], medium: str) -> dict[str, object]:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": None,
        "token_ids": [],
        "block_size": 16,
        "lora_id": None,
        "medium": medium,
        "lora_name": None,
    }


@pytest.mark.slow
def test_a_flood_of_new_hashes_and_big_messages_stays_within_the_stated_memory():
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)  # like vLLM's 100,000: the backlog waits on this side
    pub.bind(endpoint)
    child = subprocess.Popen(
        [sys.executable, str(PROCS / "flood_subscriber.py"), endpoint, str(MESSAGES + JUNK), "100"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        empty = encode_batch(0.0, [], 0)
        for _ in range(20):  # the slow joiner: message 0 until surely connected
            pub.send_multipart([b"", (0).to_bytes(8, "big"), empty])
            time.sleep(0.05)
        rng = random.Random(7)
        for seq in range(1, MESSAGES):
            hashes = [rng.getrandbits(63) for _ in range(PER)]
            batch = encode_batch(float(seq), [_stored(hashes, "GPU"), _stored(hashes, "CPU")], 0)
            pub.send_multipart([b"", seq.to_bytes(8, "big"), batch])
        junk = b"\xc1" * (4 * 2**20 - 4096)
        for j in range(JUNK):
            pub.send_multipart([b"", (MESSAGES + j).to_bytes(8, "big"), junk])
        out, _ = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        pub.close(linger=0)
        ctx.term()
    got = json.loads(out.splitlines()[-1])
    # A PUB drops what a full subscriber queue (RCVHWM) cannot take: on a loaded machine some
    # junk never arrives (27 of 40 in one CI run); what arrives is refused, none decoded.
    assert 0 < got["decode_errors"] <= JUNK and got["missed"] == (MESSAGES - 1) * PER
    assert got["tracked"] <= 1_000_000 and got["resident"] <= 1_000_000
    # The bound docs/performance.md and --help state: ~220 MB a rank for the state when full,
    # and ZMQ's queue at most 64 MiB a socket (RCVHWM 16 × the 4 MiB message cap) when
    # ingestion lags, as it does on a loaded machine (measured +203 MB here; +272 MB once with
    # the whole suite and two other jobs on the 2 cores).
    assert got["rss_after_mb"] - got["rss_before_mb"] < 220 + 64 + 10
    assert got["rss_peak_mb"] < 340
    # The loop turns between steps, and the state's O(n) upkeep is done in pieces between
    # them (EngineEvents.upkeep): longest gap 0.23 s on a loaded 2-core machine (0.7-1.8 s
    # when the tables' doublings and the tracker's resampling were each done at once).
    assert got["longest_gap_s"] < 2
