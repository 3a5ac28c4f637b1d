"""#25 item 9 at the shipped default: a lying replay ROUTER (one duplicate frame every 0.3 s,
never its end marker) is cut at REPLAY_DEADLINE_SECONDS as shipped (10 s), not only at the
1.5 s test_subscriber.py lowers it to; ingestion of the live stream goes on after it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from test_subscriber import _payload, _publisher_with_replays

from kvoffload.kvevents import subscriber


def test_a_dripping_replay_ends_at_the_default_deadline() -> None:
    assert subscriber.REPLAY_DEADLINE_SECONDS == 10.0  # what ships

    async def dripping(router: Any, ident: bytes, start: int) -> None:
        for _ in range(1000):  # cancelled with the test's tasks
            await router.send_multipart([ident, b"", b"kv", (0).to_bytes(8, "big"), _payload(0)])
            await asyncio.sleep(0.3)

    async def run() -> tuple[list[int], Any, float]:
        async with _publisher_with_replays(dripping, 1.0) as (pub, got, sub):
            for _ in range(200):  # the slow joiner
                if got:
                    break
                await pub.send_multipart([b"kv", (0).to_bytes(8, "big"), _payload(0)])
                await asyncio.sleep(0.03)
            started = time.monotonic()
            await pub.send_multipart([b"kv", (50).to_bytes(8, "big"), _payload(50)])
            for _ in range(600):
                if got and got[-1] == 50:
                    break
                await asyncio.sleep(0.05)
            took = time.monotonic() - started
        return got, sub, took

    got, sub, took = asyncio.run(run())
    assert got[-1] == 50 and took < 25  # 10 s of dripping, not 20,000 frames (8.3 h)
    assert sub.state.replay_failures == {"deadline": 1}
    assert sub.state.unreplayed == 49
    assert "replay stopped after 10 s" in (sub.state.last_error or "")
