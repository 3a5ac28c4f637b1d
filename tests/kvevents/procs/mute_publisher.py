"""A vLLM-like publisher (PUB + replay ROUTER) that never answers a replay: it keeps publishing
live messages and prints `asked` 0.3 s after a request, so that the test can kill -9 it while
the subscriber's replay is pending and live messages are queued.

Usage: mute_publisher.py PUB_ENDPOINT ROUTER_ENDPOINT FIRST_SEQ"""

import sys
import time

import zmq

pub_ep, router_ep, seq = sys.argv[1], sys.argv[2], int(sys.argv[3])
ctx = zmq.Context()
pub = ctx.socket(zmq.PUB)
pub.setsockopt(zmq.SNDHWM, 0)
pub.bind(pub_ep)
router = ctx.socket(zmq.ROUTER)
router.bind(router_ep)
payload = b"\x93\xcb?\xf0\x00\x00\x00\x00\x00\x00\x90\x00"  # msgpack [1.0, [], 0]
asked: float | None = None
while True:
    pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])
    seq += 1
    if router.poll(0):
        router.recv_multipart()
        asked = time.monotonic()
    if asked is not None and time.monotonic() - asked > 0.3:
        print("asked", flush=True)
        asked = None
    time.sleep(0.0005)
