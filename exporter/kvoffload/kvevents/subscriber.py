"""Subscribing to a vLLM engine's KV events over ZMQ, with replay of missed messages.

vLLM's publisher binds a PUB socket (`--kv-events-config '{"endpoint": "tcp://*:5557"}'`); DP
rank N publishes on port + N. Each message is (topic, 8-byte big-endian sequence, msgpack
payload). When the sequence jumps, the messages in between were dropped (PUB high-water mark,
a slow subscriber): with a replay endpoint (a ROUTER) we ask for them from the last one seen;
whatever cannot be replayed is counted as lost, never hidden. On our first message, and when
vLLM restarted (the sequence went back), we ask for everything vLLM still buffers (its last
10,000 messages), so a sidecar that starts late or restarts recovers that history; what is
older is reported as unseen (the first sequence held, `history_from_seq`).

A hostile or broken publisher cannot wedge it: sequence numbers out of range are rejected
(counted), a replay takes at most REPLAY_MAX_MESSAGES messages however the ROUTER answers, and
replays that fail (silence past the timeout, cut at the cap, an error) are rate-limited
(REPLAY_BURST, then one per REPLAY_EVERY_SECONDS): a publisher whose every message is a gap or
a restart, with a ROUTER that never answers, gets the rest counted as lost, not a timeout
each. Replays that vLLM answers cost nothing of that rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq
import zmq.asyncio

from kvoffload.errors import InputError
from kvoffload.kvevents.eventfile import RawMessage
from kvoffload.kvevents.state import SEQUENCE_LIMIT

log = logging.getLogger("kvoffload.kvevents")
END_SEQ = -1
MAX_MESSAGE_BYTES = 64 * 2**20
# After a dropped connection, this long before connecting again.
RECONNECT_SECONDS = 0.5
REPLAY_MAX_MESSAGES = 20_000  # vLLM buffers 10,000
# Requests again for the rest of a gap, each after one that brought part of it.
REPLAY_CONTINUATIONS = 16
REPLAY_BURST = 10
REPLAY_EVERY_SECONDS = 1.0


def offset_endpoint(endpoint: str, rank: int) -> str:
    """The endpoint of DP rank `rank`: vLLM adds the rank to the port."""
    if rank == 0:
        return endpoint
    base, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit():
        raise InputError(f"{endpoint}: a tcp endpoint with a port is needed for DP ranks")
    return f"{base}:{int(port) + rank}"


def check_endpoint(endpoint: str) -> str:
    if not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
        raise InputError(f"{endpoint}: not a ZMQ endpoint (use tcp://host:port)")
    return endpoint


@dataclass
class SubscriberState:
    endpoint: str
    rank: int
    connected: bool = False  # a message arrived on this socket (ZMQ connects lazily)
    last_seq: int | None = None
    replayed: int = 0
    # The first sequence number we hold of the current publisher, replayed or live.
    history_from_seq: int | None = None
    last_error: str | None = None
    rejected: int = 0  # messages that could not be placed (sequence numbers out of range)
    replays_skipped: int = 0  # gaps or restarts not replayed: over the replay rate
    drops: int = 0  # connections dropped (a publisher gone, or a message over MAXMSGSIZE)


class Subscriber:
    """One SUB socket for one DP rank; `on_message` gets every message in sequence order."""

    def __init__(
        self,
        endpoint: str,
        rank: int,
        on_message: Callable[[RawMessage], None],
        replay_endpoint: str | None = None,
        topic: str = "",
        replay_timeout_seconds: float = 2.0,
        resume_after_seq: int | None = None,
        resume_history_from_seq: int | None = None,
        on_rejected: Callable[[int, int], None] | None = None,
    ) -> None:
        """resume_after_seq: the last sequence a saved state holds (`--state-dir`): the first
        message asks vLLM to replay everything after it, as after a gap. on_rejected(rank,
        seq): a message whose sequence number is out of range (not delivered) is counted
        there too (TargetEvents.reject_sequence)."""
        self.state = SubscriberState(
            offset_endpoint(check_endpoint(endpoint), rank),
            rank,
            last_seq=resume_after_seq,
            history_from_seq=resume_history_from_seq,
        )
        self.replay_endpoint = (
            offset_endpoint(check_endpoint(replay_endpoint), rank) if replay_endpoint else None
        )
        self.topic = topic.encode()
        self.on_message = on_message
        self.on_rejected = on_rejected
        self.replay_timeout = replay_timeout_seconds
        self._ctx = zmq.asyncio.Context.instance()
        self._replay_tokens = float(REPLAY_BURST)
        self._replay_refilled = time.monotonic()

    async def run(self) -> None:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        # A hostile or broken publisher cannot make us hold a huge message: libzmq drops the
        # connection instead (it reconnects). vLLM's batches are kilobytes to a few megabytes.
        sub.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        watch = asyncio.create_task(self._reconnect_when_dropped(sub))
        try:
            sub.connect(self.state.endpoint)
            while True:
                frames = await sub.recv_multipart()
                self.state.connected = True
                if len(frames) != 3 or len(frames[1]) != 8:
                    self.state.last_error = (
                        f"{self.state.endpoint}: malformed message ({len(frames)} frames)"
                    )
                    continue
                seq = int.from_bytes(frames[1], "big", signed=True)
                if not 0 <= seq < SEQUENCE_LIMIT:
                    # vLLM numbers from 0; a negative number cannot be placed in the stream
                    # (and would make a replay request from it impossible to encode), a huge
                    # one would make the gap and history figures absurd.
                    self.state.rejected += 1
                    what = "negative" if seq < 0 else "out-of-range"
                    self.state.last_error = f"{self.state.endpoint}: {what} sequence {seq}"
                    if self.on_rejected is not None:
                        self.on_rejected(self.state.rank, seq)
                    continue
                last = self.state.last_seq
                if self.replay_endpoint:
                    if last is None or seq <= last:
                        # Our start, or vLLM's (it numbers from 0 again): ask for everything
                        # it still holds, up to 10,000 messages of history.
                        self.state.history_from_seq = None
                        if seq > 0 and self._may_replay():
                            self._replayed(await self._replay(0, seq))
                    elif seq > last + 1 and self._may_replay():
                        self._replayed(await self._replay(last + 1, seq))
                self._deliver(seq, frames[0], frames[2])
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
            sub.close(linger=0)
            self.state.connected = False

    async def _reconnect_when_dropped(self, sub: zmq.asyncio.Socket) -> None:
        """libzmq drops a connection whose message is over MAXMSGSIZE and, that being a
        protocol error, does not connect again: one oversized message from a hostile
        publisher would stop ingestion for good. Connect again when the connection drops (a
        publisher that went away is connected again by libzmq too: harmless)."""
        from zmq.utils.monitor import recv_monitor_message

        monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        try:
            while True:
                await recv_monitor_message(monitor)
                self.state.drops += 1
                self.state.last_error = (
                    f"{self.state.endpoint}: connection dropped (the publisher went away, or "
                    f"sent a message over {MAX_MESSAGE_BYTES // 2**20} MiB): connecting again"
                )
                await asyncio.sleep(RECONNECT_SECONDS)
                with contextlib.suppress(zmq.ZMQError):
                    sub.disconnect(self.state.endpoint)
                sub.connect(self.state.endpoint)
        finally:
            with contextlib.suppress(zmq.ZMQError):
                sub.disable_monitor()
            monitor.close(linger=0)

    def _deliver(self, seq: int, topic: bytes, payload: bytes) -> None:
        if self.state.history_from_seq is None or (
            self.state.last_seq is not None and seq <= self.state.last_seq
        ):
            self.state.history_from_seq = seq
        self.state.last_seq = seq
        self.on_message(RawMessage(self.state.rank, seq, time.time(), topic, payload))

    def _replayed(self, answered: bool) -> None:
        """A replay that was answered gives its token back: only failures use up the rate."""
        if answered:
            self._replay_tokens = min(float(REPLAY_BURST), self._replay_tokens + 1)

    def _may_replay(self) -> bool:
        """A token of the replay rate (REPLAY_BURST, refilled one per REPLAY_EVERY_SECONDS)."""
        now = time.monotonic()
        self._replay_tokens = min(
            float(REPLAY_BURST),
            self._replay_tokens + (now - self._replay_refilled) / REPLAY_EVERY_SECONDS,
        )
        self._replay_refilled = now
        if self._replay_tokens < 1:
            self.state.replays_skipped += 1
            return False
        self._replay_tokens -= 1
        return True

    async def _replay(self, start: int, stop: int) -> bool:
        """Fetch messages [start, stop) from vLLM's replay buffer, in order; at most
        REPLAY_MAX_MESSAGES frames are read, whatever the ROUTER sends. Returns whether it
        was answered (its end marker, or the gap's last message, came)."""
        assert self.replay_endpoint is not None
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        try:
            dealer.connect(self.replay_endpoint)
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            asked_from, continuations = start, 0
            for _ in range(REPLAY_MAX_MESSAGES):
                # The timeout is for silence, not for the whole replay: a long replay that
                # keeps coming (thousands of messages, each ingested as it arrives, on a busy
                # machine) is not vLLM failing to answer.
                if not await dealer.poll(self.replay_timeout * 1000):
                    # vLLM's ROUTER sends a whole replay at once and drops what is over its
                    # send limit (1,000 messages by default): when this request brought some
                    # of the gap, ask again from where it stopped.
                    resume = self._resume_from(asked_from, stop)
                    if resume is None or continuations == REPLAY_CONTINUATIONS:
                        self.state.last_error = f"{self.replay_endpoint}: replay timed out"
                        return False
                    continuations += 1
                    asked_from = resume
                    await dealer.send_multipart([b"", resume.to_bytes(8, "big")])
                    continue
                frames = await dealer.recv_multipart()
                # vLLM 0.26+: [b"", topic, seq, payload]; older (and LMCache): [b"", seq,
                # payload]. The end marker carries seq -1 in either.
                if len(frames) == 4:
                    _, topic, seq_bytes, payload = frames
                elif len(frames) == 3:
                    _, seq_bytes, payload = frames
                    topic = self.topic
                else:
                    continue
                if len(seq_bytes) != 8:
                    continue
                seq = int.from_bytes(seq_bytes, "big", signed=True)
                if seq == END_SEQ:
                    return True
                fresh = self.state.history_from_seq is None
                if start <= seq < stop and (
                    fresh or self.state.last_seq is None or seq > self.state.last_seq
                ):
                    self.state.replayed += 1
                    self._deliver(seq, topic, payload)
                    if seq == stop - 1:
                        return True  # all of the gap: the rest would be live messages again
            else:
                self.state.last_error = (
                    f"{self.replay_endpoint}: replay cut after {REPLAY_MAX_MESSAGES:,} messages"
                )
        except zmq.ZMQError as exc:
            self.state.last_error = f"{self.replay_endpoint}: {exc}"
        finally:
            dealer.close(linger=0)
        return False

    def _resume_from(self, asked_from: int, stop: int) -> int | None:
        """Where to ask a stalled replay again: after the last message it brought, if it
        brought any of [asked_from, stop) and the gap is not whole yet."""
        last = self.state.last_seq
        if last is None or not asked_from <= last < stop - 1:
            return None
        return last + 1


async def cancel_all(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
