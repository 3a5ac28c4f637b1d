"""Subscribing to a vLLM engine's KV events over ZMQ, with replay of missed messages.

The engine binds a PUB socket (`--kv-events-config`) and a replay ROUTER, DP rank N at port + N. A
hostile or vanished publisher can neither wedge nor grow the sidecar: docs/reliability.md lists
each bound and its test.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import cast

import zmq
import zmq.asyncio

from kvoffload.errors import InputError
from kvoffload.kvevents.eventfile import RawMessage
from kvoffload.kvevents.state import SEQUENCE_LIMIT

log = logging.getLogger("kvoffload.kvevents")
END_SEQ = -1
# The largest message of the real H200 captures is 75 KB (5,853 messages, mean 3.4 KB); 4 MiB
# is a step of ~800k new tokens. Decoding costs up to ~15x the bytes in Python objects.
MAX_MESSAGE_BYTES = 4 * 2**20
RCVHWM = 16  # messages libzmq queues per socket: with the size cap, QUEUE_BUDGET_BYTES
QUEUE_BUDGET_BYTES = RCVHWM * MAX_MESSAGE_BYTES
# A replay, however its ROUTER answers, ends after this long (besides the frame cap).
REPLAY_DEADLINE_SECONDS = 10.0
# Message work gives the event loop a turn at least this often (/healthz, scrapes).
YIELD_EVERY_SECONDS = 0.01
RESTART_LOG_SECONDS = 10.0
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
    # The sequence went back (vLLM restarted), and a line saying what of it was recovered.
    publisher_restarts: int = 0
    last_restart: str | None = None
    # Replays that did not bring all they asked for, by reason (timeout: silence; deadline:
    # REPLAY_DEADLINE_SECONDS; cap: REPLAY_MAX_MESSAGES; error: a socket error), and the
    # messages they asked for and did not bring (counted lost, or unseen after a restart).
    replay_failures: dict[str, int] = field(default_factory=dict)
    unreplayed: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "endpoint": self.endpoint,
            "rank": self.rank,
            "connected": self.connected,
            "last_seq": self.last_seq,
            "replayed": self.replayed,
            "rejected": self.rejected,
            "drops": self.drops,
            "publisher_restarts": self.publisher_restarts,
            "last_restart": self.last_restart,
            "replays_skipped": self.replays_skipped,
            "replay_failures": dict(self.replay_failures),
            "unreplayed": self.unreplayed,
            "last_error": self.last_error,
        }


class Subscriber:
    """One SUB socket for one DP rank; `on_message` gets every message in sequence order.

    `on_message` may return an iterator; its work is then done in steps, the event loop getting a
    turn between them.
    """

    def __init__(
        self,
        endpoint: str,
        rank: int,
        on_message: Callable[[RawMessage], object],
        replay_endpoint: str | None = None,
        topic: str = "",
        replay_timeout_seconds: float = 2.0,
        resume_after_seq: int | None = None,
        resume_history_from_seq: int | None = None,
        on_rejected: Callable[[int, int], None] | None = None,
    ) -> None:
        """`resume_after_seq`: a saved state's last sequence, replayed after on the first message.

        `on_rejected(rank, seq)`: called for a message whose sequence number is out of range (not
        delivered).
        """
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
        self._turn_at = time.monotonic()  # when the event loop last had a turn
        self._restart_logged: float | None = None

    async def run(self) -> None:
        try:
            while True:
                await self._connection()
                # A publisher sending oversized messages gets one connection a RECONNECT_SECONDS.
                await asyncio.sleep(RECONNECT_SECONDS)
        finally:
            self.state.connected = False

    def _open(self) -> zmq.asyncio.Socket:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, RCVHWM)
        # A hostile or broken publisher cannot make us hold a huge message: libzmq drops the
        # connection instead (and, that being a protocol error, never connects again: a new
        # socket does).
        sub.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        return sub

    async def _connection(self) -> None:
        """One SUB socket until its connection drops, then its whole messages taken and it closed.

        Why never `disconnect()` in place: polling pre-reads a frame, and libzmq's `!_more`
        assertion would abort the sidecar. So the socket is drained, closed and replaced.
        """
        from zmq.utils.monitor import recv_monitor_message

        sub = self._open()
        monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        dropped = asyncio.ensure_future(recv_monitor_message(monitor))
        try:
            sub.connect(self.state.endpoint)
            while not dropped.done():
                try:  # a burst is taken without a wait per message
                    frames = await sub.recv_multipart(flags=zmq.NOBLOCK)
                except zmq.Again:
                    received = cast("asyncio.Future[list[bytes]]", sub.recv_multipart())
                    await asyncio.wait((received, dropped), return_when=asyncio.FIRST_COMPLETED)
                    if not received.done():
                        received.cancel()  # not started: nothing of a message is read
                        break
                    frames = received.result()
                await self._take(frames)
            # libzmq's own reconnect never cuts a pipe under a message: what the socket holds
            # (at most RCVHWM messages) is whole, and taken before the socket goes.
            for _ in range(RCVHWM + 1):
                try:
                    frames = await sub.recv_multipart(flags=zmq.NOBLOCK)
                except zmq.Again:
                    break
                await self._take(frames)
            self.state.drops += 1
            self.state.last_error = (
                f"{self.state.endpoint}: connection dropped (the publisher went away, or "
                f"sent a message over {MAX_MESSAGE_BYTES // 2**20} MiB): connecting again"
            )
        finally:
            dropped.cancel()
            with contextlib.suppress(asyncio.CancelledError, zmq.ZMQError):
                await dropped
            with contextlib.suppress(zmq.ZMQError):
                sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    async def _take(self, frames: list[bytes]) -> None:
        """One live message: checked, any gap or restart before it replayed, delivered."""
        self.state.connected = True
        # vLLM's frames: topic, 8-byte big-endian sequence, msgpack payload
        if len(frames) != 3 or len(frames[1]) != 8:
            self.state.last_error = (
                f"{self.state.endpoint}: malformed message ({len(frames)} frames)"
            )
            return
        seq = int.from_bytes(frames[1], "big", signed=True)
        if not 0 <= seq < SEQUENCE_LIMIT:
            # vLLM numbers from 0; a negative number cannot be placed in the stream (and
            # would make a replay request from it impossible to encode), a huge one would
            # make the gap and history figures absurd.
            self.state.rejected += 1
            what = "negative" if seq < 0 else "out-of-range"
            self.state.last_error = f"{self.state.endpoint}: {what} sequence {seq}"
            if self.on_rejected is not None:
                self.on_rejected(self.state.rank, seq)
            return
        last = self.state.last_seq
        restarted = last is not None and seq <= last
        if restarted:
            self.state.publisher_restarts += 1
        if self.replay_endpoint:
            if last is None or restarted:
                # Our start, or vLLM's (it numbers from 0 again): ask for everything it
                # still holds, up to 10,000 messages of history.
                self.state.history_from_seq = None
                if seq > 0 and self._may_replay():
                    self._replayed(await self._replay(0, seq))
            elif seq > last + 1 and self._may_replay():
                self._replayed(await self._replay(last + 1, seq))
        if restarted:
            self._note_restart(last, seq)
        await self._deliver(seq, frames[0], frames[2])

    def _note_restart(self, last: int | None, seq: int) -> None:
        """The status line of a restart: what of the new publisher's history we hold."""
        held_from = self.state.history_from_seq if self.state.history_from_seq is not None else seq
        missing = held_from
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.state.last_restart = f"{when}: publisher restarted (sequence {seq} after {last}); " + (
            "its whole history replayed"
            if missing == 0
            else f"{missing:,} of its earlier messages not replayed"
            + ("" if self.replay_endpoint else " (no replay endpoint)")
        )
        # One line a RESTART_LOG_SECONDS at most: a publisher flapping between restarts (each
        # message numbered 0) must not flood the log; the counter and the status have them all.
        now = time.monotonic()
        if self._restart_logged is None or now - self._restart_logged >= RESTART_LOG_SECONDS:
            self._restart_logged = now
            log.warning("kv events: %s: %s", self.state.endpoint, self.state.last_restart)

    async def _deliver(self, seq: int, topic: bytes, payload: bytes) -> None:
        if self.state.history_from_seq is None or (
            self.state.last_seq is not None and seq <= self.state.last_seq
        ):
            self.state.history_from_seq = seq
        self.state.last_seq = seq
        steps = self.on_message(RawMessage(self.state.rank, seq, time.time(), topic, payload))
        if isinstance(steps, Iterator):  # other callables' results (a count) are not steps
            for _ in steps:
                await self._turn()
        await self._turn()

    async def _turn(self) -> None:
        """Give the event loop a turn when message work has held it YIELD_EVERY_SECONDS."""
        now = time.monotonic()
        if now - self._turn_at >= YIELD_EVERY_SECONDS:
            await asyncio.sleep(0)
            self._turn_at = time.monotonic()

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

    def _replay_failed(self, reason: str, message: str) -> None:
        failures = self.state.replay_failures
        failures[reason] = failures.get(reason, 0) + 1
        self.state.last_error = f"{self.replay_endpoint}: {message}"

    async def _replay(self, start: int, stop: int) -> bool:
        """Fetch messages [start, stop) from vLLM's replay buffer; returns whether it was answered.

        Answered: its end marker or the gap's last message came. Whatever the ROUTER sends, it
        stops at REPLAY_MAX_MESSAGES frames or REPLAY_DEADLINE_SECONDS; the rest is `unreplayed`.
        """
        replayed_before = self.state.replayed
        try:
            return await self._fetch(start, stop)
        finally:
            self.state.unreplayed += (stop - start) - (self.state.replayed - replayed_before)

    async def _fetch(self, start: int, stop: int) -> bool:
        assert self.replay_endpoint is not None
        # A socket per replay: nothing of one replay (a late frame) is read by the next.
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        # vLLM's ROUTER holds what we have not read yet on its side (its send high-water
        # mark): a small queue here bounds our memory, not the replay.
        dealer.setsockopt(zmq.RCVHWM, RCVHWM)
        deadline = time.monotonic() + REPLAY_DEADLINE_SECONDS
        try:
            dealer.connect(self.replay_endpoint)
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            asked_from, continuations = start, 0
            for _ in range(REPLAY_MAX_MESSAGES):
                left = deadline - time.monotonic()
                if left <= 0:
                    self._replay_failed(
                        "deadline", f"replay stopped after {REPLAY_DEADLINE_SECONDS:g} s"
                    )
                    return False
                # The timeout is for silence; the deadline bounds the whole replay (a long
                # one that keeps coming is ingested as it arrives).
                if not await dealer.poll(min(self.replay_timeout, left) * 1000):
                    if time.monotonic() >= deadline:
                        continue  # the deadline's failure, above
                    # vLLM's ROUTER sends a whole replay at once and drops what is over its
                    # send limit (1,000 messages by default): when this request brought some
                    # of the gap, ask again from where it stopped.
                    resume = self._resume_from(asked_from, stop)
                    if resume is None or continuations == REPLAY_CONTINUATIONS:
                        self._replay_failed("timeout", "replay timed out")
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
                    await self._deliver(seq, topic, payload)
                    if seq == stop - 1:
                        return True  # all of the gap: the rest would be live messages again
                else:
                    await self._turn()  # a ROUTER repeating itself still lets the loop run
            self._replay_failed("cap", f"replay cut after {REPLAY_MAX_MESSAGES:,} messages")
        except zmq.ZMQError as exc:
            self._replay_failed("error", str(exc))
        finally:
            dealer.close(linger=0)
        return False

    def _resume_from(self, asked_from: int, stop: int) -> int | None:
        """Where to ask a stalled replay again: after its last message, while the gap is open."""
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
