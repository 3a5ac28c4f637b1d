"""Raw KV-event streams on disk: exactly the ZMQ messages vLLM published, in order.

The payload is kept as vLLM's bytes, so a newer vLLM's fields survive a round trip.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import msgspec

from kvoffload.errors import InputError

# The file: MAGIC, then records of a 4-byte big-endian length and a msgpack array
# [dp_rank, seq, received_at, topic, payload].
MAGIC = b"KVOFFLOAD-KVEVENTS 1\n"
_LEN = struct.Struct(">I")
_MAX_RECORD = 256 * 2**20


@dataclass(frozen=True)
class RawMessage:
    dp_rank: int
    seq: int
    received_at: float
    topic: bytes
    payload: bytes


class EventFileWriter:
    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self._enc = msgspec.msgpack.Encoder()
        out.write(MAGIC)
        self.messages = 0

    def write(self, msg: RawMessage) -> None:
        record = self._enc.encode([msg.dp_rank, msg.seq, msg.received_at, msg.topic, msg.payload])
        self.out.write(_LEN.pack(len(record)))
        self.out.write(record)
        self.messages += 1

    def flush(self) -> None:
        self.out.flush()


def read_event_file(path: str) -> Iterator[RawMessage]:
    """Stream a recorded event file; a truncated last record is a one-line error."""
    try:
        fh = open(path, "rb")  # noqa: SIM115
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror}") from None
    dec = msgspec.msgpack.Decoder()
    with fh:
        if fh.read(len(MAGIC)) != MAGIC:
            raise InputError(f"{path}: not a kvoffload KV-event file (bad header)")
        n = 0
        while True:
            head = fh.read(_LEN.size)
            if not head:
                return
            if len(head) < _LEN.size:
                raise InputError(f"{path}: truncated after {n} messages")
            (size,) = _LEN.unpack(head)
            if size > _MAX_RECORD:
                raise InputError(f"{path}: record {n + 1} claims {size} bytes: corrupt file")
            record = fh.read(size)
            if len(record) < size:
                raise InputError(f"{path}: truncated after {n} messages")
            try:
                dp_rank, seq, received_at, topic, payload = dec.decode(record)
                if not (
                    isinstance(dp_rank, int)
                    and isinstance(seq, int)
                    and isinstance(received_at, int | float)
                    and isinstance(topic, bytes)
                    and isinstance(payload, bytes)
                ):
                    raise TypeError("field types")
            except (msgspec.DecodeError, ValueError, TypeError, RecursionError):
                raise InputError(f"{path}: record {n + 1} is not a valid event record") from None
            n += 1
            yield RawMessage(dp_rank, seq, float(received_at), topic, payload)


def open_writer(path: str) -> tuple[BinaryIO, EventFileWriter]:
    try:
        fh = open(path, "wb")  # noqa: SIM115
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror}") from None
    return fh, EventFileWriter(fh)
