"""A `--state-dir` file's bytes and directory, defended against the local file system.

It guards against damage, planted links, devices, FIFOs and a second sidecar
(docs/reliability.md lists each case and its test).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
from pathlib import Path
from typing import IO

MAGIC = b"KVOSTAT2"
_HEADER = len(MAGIC) + 8 + 32
# The largest state a sidecar reads at start: ~70 bytes a block, three structures, so 1 GiB
# holds 8 DP ranks at the default budget of 1,000,000 blocks each, twice over.
MAX_BYTES = 1 << 30
LOCK_NAME = "kvoffload.lock"


class StateFileError(Exception):
    """A state file whose bytes cannot be used (one line: why)."""


def frame(payload: bytes) -> bytes:
    # MAGIC, the length (8 bytes, big-endian), SHA-256: any changed byte is found before decoding.
    return MAGIC + len(payload).to_bytes(8, "big") + hashlib.sha256(payload).digest() + payload


def unframe(data: bytes) -> bytes:
    """The payload of a framed file; StateFileError when any byte of it was changed."""
    if not data.startswith(MAGIC):
        raise StateFileError("not a state file of this release (no header)")
    if len(data) < _HEADER:
        raise StateFileError("not a state file (cut inside its header)")
    length = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 8], "big")
    payload = data[_HEADER:]
    if length != len(payload):
        raise StateFileError(
            f"not a state file ({len(payload):,} bytes where its header says {length:,}: cut "
            "short or damaged)"
        )
    if hashlib.sha256(payload).digest() != data[len(MAGIC) + 8 : _HEADER]:
        raise StateFileError("not a state file (checksum mismatch: damaged)")
    return payload


def read(path: Path, limit: int = MAX_BYTES) -> bytes | None:
    """The file's bytes; None when there is none. StateFileError (nothing read) for a link,
    anything but a regular file, or a file over `limit`."""
    # O_NOFOLLOW refuses a link, O_NONBLOCK keeps a FIFO from blocking the open.
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StateFileError("a symbolic link, not a state file; not followed") from None
        raise
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StateFileError("not a regular file; not read")
        if st.st_size > limit:
            raise StateFileError(f"{st.st_size:,} bytes, over the {limit:,}-byte limit; not read")
        data = fh.read(limit + 1)  # it may grow meanwhile: never more than the limit
    if len(data) > limit:
        raise StateFileError(f"over the {limit:,}-byte limit; not read")
    return data


def _exclusive(directory: Path, base: str) -> tuple[Path, int]:
    # Created exclusively under a random name, so a planted link is never written through.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        tmp = directory / f".{base}.{os.urandom(6).hex()}.tmp"
        try:
            return tmp, os.open(tmp, flags, 0o600)
        except FileExistsError:
            continue
    raise OSError(errno.EEXIST, "no free temporary name", str(directory))


def write_atomic(path: Path, payload: bytes) -> None:
    """Frame and write `payload` to `path`: a kill mid-write keeps the previous file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp, fd = _exclusive(path.parent, path.name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(frame(payload))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)  # replaces a link planted at `path` itself, never its target
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def set_aside(path: Path) -> str:
    """Rename an unusable file (or the link or FIFO at its name) to `*.bad`; says where."""
    bad = path.with_name(path.name + ".bad")
    try:
        os.replace(path, bad)
    except OSError:
        return "left in place"
    return f"moved to {bad}"


class DirectoryInUse(Exception):
    """Another process holds the state directory's lock (one line: who)."""


def lock_directory(directory: Path) -> IO[bytes]:
    """Hold `directory`'s lock while the returned file is open.

    Raises DirectoryInUse when another process holds it.
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_NAME
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise DirectoryInUse(f"{path} is a symbolic link; remove it") from None
        raise
    fh = os.fdopen(fd, "r+b")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DirectoryInUse(f"{path} is not a regular file; remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = fh.read(32).decode("ascii", "replace").strip() or "unknown"
            raise DirectoryInUse(
                f"{directory} is in use by another kvoffload sidecar (pid {holder}): give each "
                "its own --state-dir"
            ) from None
        fh.truncate(0)
        fh.write(f"{os.getpid()}\n".encode())
        fh.flush()
    except BaseException:
        fh.close()
        raise
    return fh
