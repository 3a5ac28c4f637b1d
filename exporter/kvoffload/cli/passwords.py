"""Basic-auth password checks that unauthenticated clients cannot turn against the server.

A bcrypt check is slow on purpose: in a shared pool, wrong passwords once held a scrape past its
timeout (#25). The bounds are in docs/exporter.md ("TLS and basic auth") and docs/reliability.md."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from enum import Enum

import bcrypt

OK_TTL_SECONDS = 600.0  # from the last use: longer than any scrape interval
BAD_TTL_SECONDS = 60.0
OK_ENTRIES = 256
BAD_ENTRIES = 4096  # ~0.5 MB
QUEUE = 8  # checks waiting or running: at cost 10, a new credential waits at most ~0.5 s


class Verdict(Enum):
    OK = "ok"
    BAD = "bad"
    BUSY = "busy"  # not checked: too many checks waiting


def _checkpw(password: bytes, hashed: bytes) -> bool:
    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:  # over bcrypt's 72 bytes, or a hash bcrypt cannot read
        return False


class _Cache:
    """Digests of credentials → when they expire; least recently used first out."""

    def __init__(self, ttl: float, size: int, sliding: bool) -> None:
        self.ttl, self.size, self.sliding = ttl, size, sliding
        self._until: OrderedDict[bytes, float] = OrderedDict()

    def __contains__(self, key: bytes) -> bool:
        until = self._until.get(key)
        now = time.monotonic()
        if until is None:
            return False
        if until < now:
            del self._until[key]
            return False
        if self.sliding:
            self._until[key] = now + self.ttl
        self._until.move_to_end(key)
        return True

    def add(self, key: bytes) -> None:
        self._until[key] = time.monotonic() + self.ttl
        self._until.move_to_end(key)
        while len(self._until) > self.size:
            self._until.popitem(last=False)

    def clear(self) -> None:
        self._until.clear()

    def __len__(self) -> int:
        return len(self._until)


class PasswordChecks:
    """bcrypt checks on their own bounded worker, with their results remembered."""

    def __init__(self, queue: int = QUEUE) -> None:
        self.queue = queue
        # One worker of its own (exporter-toolkit serialises bcrypt too); past `queue` waiting a
        # check is refused at once (the caller answers 503). Successes and failures are cached
        # apart, so new wrong passwords cannot evict the good credential.
        self._ok = _Cache(OK_TTL_SECONDS, OK_ENTRIES, sliding=True)
        self._bad = _Cache(BAD_TTL_SECONDS, BAD_ENTRIES, sliding=False)
        self._executor: ThreadPoolExecutor | None = None
        # The same credential asked again while its check runs waits for that one check.
        self._running: dict[bytes, asyncio.Future[bool]] = {}
        self.refused = 0  # checks refused for a full queue

    @staticmethod
    def key(user: str, password: bytes, hashed: bytes) -> bytes:
        name = user.encode()
        return hashlib.sha256(len(name).to_bytes(4, "big") + name + hashed + password).digest()

    def forget(self) -> None:
        """Drop every remembered result (the users or their hashes changed)."""
        self._ok.clear()
        self._bad.clear()

    async def check(self, user: str, password: bytes, hashed: bytes, known: bool) -> Verdict:
        """Whether `password` matches `hashed`; always BAD for a user that is not `known`.

        Such a user's `hashed` is a dummy of the same cost, so timing does not tell names apart."""
        key = self.key(user, password, hashed)
        if key in self._ok:
            return Verdict.OK if known else Verdict.BAD
        if key in self._bad:
            return Verdict.BAD
        running = self._running.get(key)
        if running is None:
            if len(self._running) >= self.queue:
                self.refused += 1
                return Verdict.BUSY
            running = self._submit(key, password, hashed)
        # Shielded: a client that hangs up does not cancel a check others may wait for, and
        # its result is remembered all the same.
        ok = await asyncio.shield(running)
        return Verdict.OK if ok and known else Verdict.BAD

    def _submit(self, key: bytes, password: bytes, hashed: bytes) -> asyncio.Future[bool]:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="kvoffload-bcrypt")
        future = asyncio.wrap_future(self._executor.submit(_checkpw, password, hashed))
        self._running[key] = future

        def done(f: asyncio.Future[bool]) -> None:
            del self._running[key]
            if not f.cancelled() and f.exception() is None:
                (self._ok if f.result() else self._bad).add(key)

        future.add_done_callback(done)
        return future
