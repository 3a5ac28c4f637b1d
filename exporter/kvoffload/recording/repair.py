"""`record --finalize/--repair`: turn a journal or a cut recording into a whole one, nothing else.

Why the checks: the rewrite drops what looks like a cut end. A non-recording would lose everything
(a one-line JSON became `# EOF`). So the input must begin like a recording. The result must read as
one before it is renamed into place.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable

from kvoffload.errors import InputError
from kvoffload.ingest.parse import ParseError
from kvoffload.recording.openmetrics import JOURNAL_MARK, finalize_journal, read_recording

# A recording larger than this is not one `record` wrote (a day of 1,000 targets every 15 s
# is ~600 GB less than this; a mistaken path to a disk image is refused before it is read).
REPAIR_MAX_BYTES = 1 << 40
# What is read to judge the first line: a recording's lines are short (vLLM's longest are
# a few KB), so a first line longer than this is a blob, not a recording.
_HEAD = 1 << 20
_METRIC = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_COMMENT = re.compile(rf"# (?:TYPE {_METRIC} [a-z]+|HELP {_METRIC}( .*)?|UNIT {_METRIC}( .*)?)$")
# name, optional label set, value, timestamp (a recording's samples all have one)
_SAMPLE = re.compile(rf"{_METRIC}(?:\{{.*\}})? +(\S+) +(\S+)(?: +#.*)?$")


def _float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _first_line_ok(line: str) -> bool:
    line = line.rstrip("\r")
    if line == "# EOF" or _COMMENT.match(line):
        return True
    m = _SAMPLE.match(line)
    return m is not None and _float(m.group(1)) and _float(m.group(2))


def check_repairable(path: str) -> None:
    """InputError (one line) unless `path` is a regular file that begins like a recording."""
    try:
        # O_NONBLOCK: a FIFO opens without a writer instead of blocking; it is refused below.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{path}: not a regular file, so not a recording; left as it is")
        if st.st_size > REPAIR_MAX_BYTES:
            raise InputError(
                f"{path}: {st.st_size:,} bytes, over the {REPAIR_MAX_BYTES:,} a recording can "
                "have; left as it is"
            )
        head = os.read(fd, _HEAD)
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    mark = JOURNAL_MARK.encode()
    if head.startswith(mark) or (head and mark.startswith(head)):
        return  # a journal (cut inside its mark: nothing recorded yet)
    why = _not_a_recording(head)
    if why:
        raise InputError(f"{path}: not a recording ({why}); left as it is")


def _not_a_recording(head: bytes) -> str | None:
    if not head:
        return "empty file"
    end = head.find(b"\n")
    if end == -1:
        return f"no line ends in its first {len(head):,} bytes"
    try:
        first = head[:end].decode("utf-8")
    except UnicodeDecodeError:
        return "not UTF-8 text"
    if not _first_line_ok(first):
        return "its first line is no OpenMetrics comment or timestamped sample"
    return None


def _verify(journal: str, out: str) -> Callable[[str, int], None]:
    """The check finalize_journal runs on the rewritten file before renaming it to `out`."""
    in_place = os.path.abspath(journal) == os.path.abspath(out)

    def check(tmp: str, points: int) -> None:
        if in_place and points == 0:
            raise InputError(f"{journal}: no whole point to keep; left as it is")
        try:
            for _ in read_recording(tmp):
                pass
        except (ParseError, InputError) as exc:
            detail = str(exc).replace(tmp, "the result")
            raise InputError(
                f"{journal}: the repaired file would not be a recording ({detail}); left as it is"
            ) from None

    return check


def repair(journal: str, out: str) -> int:
    """Rewrite `journal` (or a cut recording) into `out` once both are checked.

    Returns the timestamps written.
    """
    # The input: a regular file within REPAIR_MAX_BYTES, beginning with the journal's mark or a
    # whole OpenMetrics line. The result replaces its own input only if it holds a point.
    check_repairable(journal)
    if os.path.lexists(out) and not os.path.isfile(out):
        raise InputError(f"{out}: not a regular file (the result is renamed over it)")
    return finalize_journal(journal, out, verify=_verify(journal, out))
