"""KV-event ingestion under a flood of new block hashes at the default budget: throughput and the
longest hold of the event loop, upkeep at once (the way before #25) against upkeep in pieces.

What: MESSAGES messages of 1,000 new hashes each, stored on the GPU and in the CPU tier, never
removed (past the 1M-block budget: the tracker drops, the residency evicts, the parent map
trims, the tables double and compact), taken in the sidecar's steps
(TargetEvents.ingest_message_steps) from payloads encoded beforehand. Each step is timed: the
longest is the longest the event loop would have waited (/healthz, /metrics). The two modes
run in alternation in this one process (`--pairs` pairs, the order swapped each pair), each on
a fresh state; the ratios compare the medians. One JSON line (and --out).
Why: #25 item 10 (the event loop held 0.7-1.8 s by the upkeep at the budget).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import time
from pathlib import Path

from kvoffload.kvevents.eventfile import RawMessage
from kvoffload.kvevents.state import TargetEvents
from kvoffload.sim.kv_events import encode_batch

BUDGET = 1_000_000  # the default --kv-events-sample-budget
PER = 1000


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


def payloads(messages: int) -> list[bytes]:
    rng = random.Random(10)
    out = []
    for seq in range(messages):
        hashes = [rng.getrandbits(63) for _ in range(PER)]
        out.append(encode_batch(float(seq), [_stored(hashes, "GPU"), _stored(hashes, "CPU")], 0))
    return out


def run(batches: list[bytes], ahead: bool) -> dict[str, float]:
    """One ingestion of the whole flood on a fresh state."""
    state = TargetEvents(1.0, BUDGET, upkeep_ahead=ahead)
    longest, steps = 0.0, 0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for seq, payload in enumerate(batches):
        gen = state.ingest_message_steps(RawMessage(0, seq, time.time(), b"", payload))
        while True:
            t0 = time.perf_counter()
            try:
                next(gen)
            except StopIteration:
                break
            finally:
                longest = max(longest, time.perf_counter() - t0)
                steps += 1
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    tracked = state.tracked_blocks()
    del state
    gc.collect()
    return {
        "messages_per_s_cpu": len(batches) / cpu,
        "messages_per_s_wall": len(batches) / wall,
        "longest_step_s": longest,
        "steps": steps,
        "tracked": tracked,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1300)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    batches = payloads(args.messages)
    runs: dict[str, list[dict[str, float]]] = {"at_once": [], "pieces": []}
    for pair in range(args.pairs):
        order = ("at_once", "pieces") if pair % 2 == 0 else ("pieces", "at_once")
        for mode in order:
            runs[mode].append(run(batches, mode == "pieces"))

    def median(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[mode])

    result = {
        "messages": args.messages,
        "blocks_per_message": PER,
        "budget": BUDGET,
        "pairs": args.pairs,
        "runs": runs,
        "throughput_ratio_cpu": median("pieces", "messages_per_s_cpu")
        / median("at_once", "messages_per_s_cpu"),
        "longest_step_ratio": median("pieces", "longest_step_s")
        / median("at_once", "longest_step_s"),
        "load_avg": os.getloadavg(),
    }
    line = json.dumps(result)
    print(line)
    if args.out:
        args.out.write_text(line + "\n")


if __name__ == "__main__":
    main()
