"""#25 item 3: the publisher's PUB socket going away while a replay is pending and live
messages are queued (a vLLM restart) aborted the whole sidecar in libzmq (`Assertion failed:
!_more (src/fq.cpp:80)`, exit 134, 5 of 5 tries): polling the SUB socket pre-reads the first
frame of the next message, and the subscriber's `disconnect()` on that socket cut its pipe
under the rest. Now the socket is drained and closed, a new one opened."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import free_port

PROCS = Path(__file__).parent / "procs"
TRIES = 5


@pytest.mark.slow
def test_the_subscriber_survives_its_publisher_killed_during_a_replay_five_times():
    pub_ep = f"tcp://127.0.0.1:{free_port()}"
    router_ep = f"tcp://127.0.0.1:{free_port()}"
    sub = subprocess.Popen(
        [sys.executable, str(PROCS / "subscribe_for.py"), pub_ep, router_ep, "14"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(TRIES):
            pub = subprocess.Popen(
                [sys.executable, str(PROCS / "mute_publisher.py"), pub_ep, router_ep, "5"],
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                # The subscriber's first message (sequence > 0) asks for a replay that never
                # comes; 0.3 s of live messages later the publisher says so and is killed.
                assert pub.stdout is not None and pub.stdout.readline() == "asked\n"
            finally:
                pub.kill()  # SIGKILL: no close, no linger
                pub.wait(10)
            assert sub.poll() is None, sub.stderr.read() if sub.stderr else ""
        out, err = sub.communicate(timeout=30)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait(10)
    assert sub.returncode == 0, err
    state = json.loads(out.splitlines()[-1])
    # Each publisher's stream came in; each restart is counted with its status line, and
    # what the mute ROUTER never replayed is counted and said.
    assert state["messages"] > TRIES * 100
    assert state["drops"] >= TRIES - 1
    assert state["publisher_restarts"] >= TRIES - 2  # a new stream may begin above the last
    assert "publisher restarted" in state["last_restart"]
    assert "not replayed" in state["last_restart"]
    assert state["replay_failures"].get("timeout", 0) >= TRIES - 1
    assert state["unreplayed"] > 0
