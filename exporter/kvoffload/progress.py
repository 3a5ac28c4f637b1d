"""Progress of long work on stderr, never stdout, so reports and JSON stay clean.

On a terminal one line is rewritten in place.
Elsewhere one final line is written, and none for a short run.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TextIO, TypeVar

T = TypeVar("T")
_CLEAR_TO_END = "\x1b[K"


class Progress:
    """One status line on stderr.

    `every`: seconds between rewrites on a terminal. `show_after`: on a terminal, seconds before
    anything shows. `final_after`: off a terminal, the least run time that writes the final line.
    """

    def __init__(
        self,
        *,
        stream: TextIO | None = None,
        tty: bool | None = None,
        every: float = 0.2,
        show_after: float = 0.0,
        final_after: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = _isatty(self.stream) if tty is None else tty
        self.every = every
        self.show_after = show_after
        self.final_after = final_after
        self.clock = clock
        self.started = clock()
        self.shown = False  # a line is on the terminal now
        self._last = -float("inf")
        self._line = ""
        self._lock = threading.Lock()

    @property
    def elapsed(self) -> float:
        return self.clock() - self.started

    @property
    def line(self) -> str:
        return self._line

    def update(self, line: str, force: bool = False) -> None:
        """The line now; on a terminal it is drawn when due (`force`: now, if shown at all)."""
        with self._lock:
            self._line = line
            if not self.tty:
                return
            now = self.clock()
            if now - self.started < self.show_after:
                return
            if force or now - self._last >= self.every:
                self._last = now
                self._write("\r" + line + _CLEAR_TO_END)
                self.shown = True

    def note(self, message: str) -> None:
        """A line of its own (a warning) without tearing the progress line, which follows it."""
        with self._lock:
            if self.tty and self.shown:
                self._write("\r" + _CLEAR_TO_END + message + "\n" + self._line + _CLEAR_TO_END)
            else:
                self._write(message + "\n")

    def clear(self) -> None:
        """Takes the line off the terminal, before an error or the caller's own final line."""
        with self._lock:
            if self.tty and self.shown:
                self._write("\r" + _CLEAR_TO_END)
            self.shown = False

    def finish(self, line: str | None = None) -> None:
        """The final line: kept on a terminal if progress showed, else written past `final_after`.

        A short run off a terminal stays silent, so logs of quick commands stay clean."""
        with self._lock:
            final = line if line is not None else self._line
            if final and self.tty:
                if self.shown or self.elapsed >= self.show_after:
                    self._write("\r" + final + _CLEAR_TO_END + "\n")
            elif final and self.elapsed >= self.final_after:
                self._write(final + "\n")
            self.shown = False

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stderr must not end the work
            pass


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def format_bytes(n: float) -> str:
    """1.50 GiB, 512.0 MiB, 3.2 KiB, 17 B."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            value = n / size
            return f"{value:.2f} {unit}" if unit == "GiB" else f"{value:.1f} {unit}"
    return f"{int(n)} B"


def format_seconds(seconds: float) -> str:
    """0.25 s, 3.2 s, 4m05s, 1h02m: three digits below a minute, so 0.25 s is not 0.2."""
    if seconds < 60:
        return f"{seconds:.3g} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class FileReadProgress:
    """How far a reader has got through a file it opened itself, watched from outside.

    A thread reads the descriptor's offset every `every` seconds, so the reader needs no hook."""

    # Where no descriptor shows it (no /proc or /dev/fd, a mapped file) only `count`'s items are
    # shown; a second pass over the file shows as one.

    def __init__(self, path: str, progress: Progress, what: str = "scrapes") -> None:
        self.path = path
        self.name = os.path.basename(path) or path
        self.progress = progress
        self.what = what
        try:
            st = os.stat(path)
            self._ident: tuple[int, int] | None = (st.st_dev, st.st_ino)
            self.size = st.st_size
        except OSError:
            self._ident, self.size = None, 0
        self.items = 0
        self.offset = 0
        self.told = False  # the reader reports its offset itself (`reached`)
        self.passes = 1
        self._fd: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the reader's side ------------------------------------------------------------------
    def reached(self, offset: int | None) -> None:
        """Reports how far a reader that maps the file got, which its descriptor cannot show. None:
        it gave up, and the descriptor is followed again."""
        self.told = offset is not None
        self.offset = offset or 0

    def count(self, items: Iterable[T]) -> Iterator[T]:
        """`items` unchanged, counted."""
        for item in items:
            self.items += 1
            yield item

    def __enter__(self) -> FileReadProgress:
        if self._ident is not None:
            self._thread = threading.Thread(
                target=self._watch, name="kvoffload-progress", daemon=True
            )
            self._thread.start()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if exc_type is None:
            self.progress.finish(self.final_line())
        else:
            self.progress.clear()

    # -- what is shown ----------------------------------------------------------------------
    def line(self) -> str:
        parts = [f"reading {self.name}:"]
        if (self._fd is not None or self.told) and self.size and self.offset:
            done = min(self.offset, self.size)
            again = f", pass {self.passes}" if self.passes > 1 else ""
            parts.append(
                f"{format_bytes(done)} of {format_bytes(self.size)} "
                f"({100 * done / self.size:.0f} %{again}),"
            )
        counted = f"{self.items:,} {self.what}, " if self.items or not self.told else ""
        parts.append(f"{counted}{format_seconds(self.progress.elapsed)}")
        return " ".join(parts)

    def final_line(self) -> str:
        return (
            f"read {self.name}: {format_bytes(self.size)}, {self.items:,} {self.what} in "
            f"{format_seconds(self.progress.elapsed)}"
        )

    # -- the watching thread ----------------------------------------------------------------
    def poll(self) -> None:
        """Looks at the descriptor once and updates the line."""
        offset = self.offset if self.told else self._offset()
        if offset is not None:
            if offset < self.offset and self.offset >= self.size / 2:
                self.passes += 1  # it went through and started again from the top
            self.offset = offset
        self.progress.update(self.line())

    def _watch(self) -> None:
        while not self._stop.wait(self.progress.every):
            self.poll()

    def _offset(self) -> int | None:
        fd = self._fd
        if fd is not None and self._is_ours(fd):
            try:
                return os.lseek(fd, 0, os.SEEK_CUR)
            except OSError:
                pass
        self._fd = self._find()
        if self._fd is None:
            return None
        try:
            return os.lseek(self._fd, 0, os.SEEK_CUR)
        except OSError:
            self._fd = None
            return None

    def _is_ours(self, fd: int) -> bool:
        try:
            st = os.fstat(fd)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._ident

    def _find(self) -> int | None:
        """The lowest-numbered descriptor open on the file: the reader's, since a brief second
        opening gets a higher number."""
        for fd in sorted(_open_fds()):
            if fd > 2 and self._is_ours(fd):
                return fd
        return None


def _open_fds() -> list[int]:
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return [int(name) for name in os.listdir(folder) if name.isdigit()]
        except OSError:
            continue
    return list(range(3, 256))
