"""A Subscriber with replay for SECONDS, then its state as one JSON line (exit 0): a libzmq
abort shows as exit -6 (SIGABRT) with no line.

Usage: subscribe_for.py PUB_ENDPOINT ROUTER_ENDPOINT SECONDS"""

import asyncio
import json
import sys

from kvoffload.kvevents.subscriber import Subscriber, cancel_all


async def main() -> None:
    count = [0]

    def on_message(_msg: object) -> None:
        count[0] += 1

    sub = Subscriber(sys.argv[1], 0, on_message, sys.argv[2], replay_timeout_seconds=1.0)
    task = asyncio.create_task(sub.run())
    await asyncio.sleep(float(sys.argv[3]))
    await cancel_all([task])
    print(json.dumps({"messages": count[0], **sub.state.to_json()}), flush=True)


asyncio.run(main())
