"""A Subscriber into TargetEvents at the default budget (1M blocks), taking messages in the
sidecar's steps, with a 20 ms ticker on the same event loop; after MESSAGES messages (or
SECONDS) prints one JSON line: RSS before and after, its peak, the ticker's longest gap.

Usage: flood_subscriber.py PUB_ENDPOINT MESSAGES SECONDS"""

import asyncio
import json
import sys
import time

from kvoffload.kvevents.state import TargetEvents
from kvoffload.kvevents.subscriber import Subscriber, cancel_all


def status_mb(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    return 0.0


async def main() -> None:
    want, seconds = int(sys.argv[2]), float(sys.argv[3])
    state = TargetEvents(1.0, 1_000_000)
    before = status_mb("VmRSS")
    sub = Subscriber(sys.argv[1], 0, state.ingest_message_steps, None)
    gap = [0.0]

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.02)
            now = time.monotonic()
            gap[0] = max(gap[0], now - last - 0.02)
            last = now

    tasks = [asyncio.create_task(sub.run()), asyncio.create_task(tick())]
    print("ready", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end and state.messages() + state.decode_errors < want:
        await asyncio.sleep(0.2)
    await cancel_all(tasks)
    eng = state.engines.get(0)
    print(
        json.dumps(
            {
                "rss_before_mb": before,
                "rss_after_mb": status_mb("VmRSS"),
                "rss_peak_mb": status_mb("VmHWM"),
                "longest_gap_s": gap[0],
                "messages": state.messages(),
                "decode_errors": state.decode_errors,
                "tracked": eng.tracker.tracked if eng else 0,
                "parents": len(eng.gpu_parent) if eng else 0,
                "resident": len(eng.cpu_resident) if eng else 0,
                "missed": eng.gpu_missed_blocks if eng else 0,
            }
        ),
        flush=True,
    )


asyncio.run(main())
