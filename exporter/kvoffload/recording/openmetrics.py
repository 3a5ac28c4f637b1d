"""Recordings: OpenMetrics 1.0 files with a timestamp on every sample, and the general reader.

`record` appends scrapes to a journal, then rewrites it as strict OpenMetrics through an on-disk
sort, so memory stays bounded. README ("Recordings") describes both layouts; docs/exporter.md
says what each way of stopping leaves.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import logging
import math
import os
import re
from collections.abc import Callable, Iterator
from typing import TextIO

from kvoffload.errors import InputError
from kvoffload.ingest.parse import (
    _INSTANCE_RE,
    Exposition,
    ParseError,
    Sample,
    family_name,
    iter_openmetrics,
    parse_text,
    read_chunks,
)

log = logging.getLogger("kvoffload")

# The journal of a recording to OUT is OUT + JOURNAL_SUFFIX; its first line is JOURNAL_MARK
# (a comment every OpenMetrics reader of ours skips), so `analyze` knows what it was given.
# The journal (OUT.partial) is scrape-ordered text that `analyze` streams, and all a SIGKILL
# leaves; OUT is what prometheus_client's parser and promtool's backfill accept.
JOURNAL_SUFFIX = ".partial"
JOURNAL_MARK = "# kvoffload recording journal"


def _cut_char(exc: UnicodeError) -> tuple[str, int]:
    """Drop an incomplete UTF-8 sequence at the end of a cut file (a killed writer, a short copy).

    It is only the end of the last line, which has no newline and is dropped as cut anyway. Any
    other invalid byte stays an error.
    """
    if (
        isinstance(exc, UnicodeDecodeError)
        and exc.reason == "unexpected end of data"
        and exc.end == len(exc.object)
    ):
        return "", exc.end
    raise exc


# The `errors` of every text open of a recording: strict UTF-8 but for the cut last character.
CUT_TOLERANT = "kvoffload-cut-end"
codecs.register_error(CUT_TOLERANT, _cut_char)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _format_value(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


class RecordingWriter:
    """Append scrapes of one or more targets to a text stream, scrape by scrape.

    Why this journal layout: each scrape repeats its families with its own timestamp. So a reader
    streams it in constant memory. A writer killed between scrapes leaves every earlier one whole;
    `Recording` rewrites it as strict OpenMetrics at the end.
    """

    def __init__(
        self, out: TextIO, instance: str = "", job: str = "vllm", header: str | None = None
    ) -> None:
        self.out = out
        self.instance = instance
        self.job = job
        self.scrapes = 0
        self._last_ts: float | None = None
        if header is not None:
            out.write(header.rstrip("\n") + "\n")
            out.flush()

    def write_scrape(
        self, body: bytes | str, timestamp: float, instance: str | None = None
    ) -> None:
        """Convert one 0.0.4 body (as vLLM serves it) and append it with `timestamp`."""
        expo = parse_text(body)
        self.write_exposition(expo, timestamp, instance)

    def write_exposition(
        self, expo: Exposition, timestamp: float, instance: str | None = None
    ) -> None:
        if self._last_ts is not None and timestamp < self._last_ts:
            raise ValueError("recording timestamps must not go back in time")
        self._last_ts = timestamp
        # Like Prometheus, the writer adds `instance` and `job` to every series.
        extra = {"instance": instance if instance is not None else self.instance, "job": self.job}
        extra = {k: v for k, v in extra.items() if v}
        ts = repr(float(timestamp))
        lines: list[str] = []
        for fam, (mtype, samples) in _group_by_family(expo).items():
            lines.append(f"# TYPE {fam} {mtype}")
            for name, labels, value, _ in _series_together(fam, mtype, samples):
                merged = {**labels, **extra}
                label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(merged.items()))
                lines.append(f"{name}{{{label_text}}} {_format_value(value)} {ts}")
        self.out.write("\n".join(lines) + "\n")
        # Each scrape reaches the file whole: a recorder killed later loses nothing before it.
        self.out.flush()
        self.scrapes += 1

    def close(self) -> None:
        self.out.write("# EOF\n")
        self.out.flush()


def _series_together(fam: str, mtype: str, samples: list[Sample]) -> list[Sample]:
    """A family's samples with each series' together, in order of first appearance.

    Why: 0.0.4 puts a counter's `_created` (folded in here) after all its `_total` lines.
    And OpenMetrics forbids coming back to a series.
    """
    drop = {"histogram": "le", "gaugehistogram": "le", "summary": "quantile"}.get(mtype)
    series: dict[tuple[tuple[str, str], ...], list[Sample]] = {}
    for sample in samples:
        labels = sample[1]
        if drop is not None and drop in labels:
            key = tuple(sorted((k, v) for k, v in labels.items() if k != drop))
        else:
            key = tuple(sorted(labels.items()))
        series.setdefault(key, []).append(sample)
    if len(series) == len(samples) or len(series) == 1:
        return samples  # nothing to move
    return [sample for group in series.values() for sample in group]


_SUFFIXES = ("_total", "_created", "_bucket", "_count", "_sum", "_gcount", "_gsum", "_info")


def _group_by_family(
    expo: Exposition,
) -> dict[str, tuple[str, list[tuple[str, dict[str, str], float, float | None]]]]:
    """Samples under their OpenMetrics family.

    Counters lose `_total`; 0.0.4's `_created` families fold into their parent.
    """
    types = expo.families
    out: dict[str, tuple[str, list[tuple[str, dict[str, str], float, float | None]]]] = {}
    for fam, mtype in types.items():
        if fam.endswith("_created") and mtype == "gauge":
            continue
        out[fam] = (
            mtype if mtype in ("counter", "gauge", "histogram", "summary") else "unknown",
            [],
        )
    for sample in expo.samples:
        name = sample[0]
        fam = _family_of(name, types)
        if fam not in out:
            out[fam] = ("unknown", [])
        out[fam][1].append(sample)
    return out


def _family_of(name: str, types: dict[str, str]) -> str:
    if name in types and not name.endswith("_created"):
        return name
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            if base in types and types[base] in ("counter", "histogram", "summary", "info"):
                return base
    return family_name(name, types.get(name, "gauge"))


class Recording:
    """What `record` writes to `path`: a journal while recording, strict OpenMetrics once closed.

    `write_exposition` appends to `path + JOURNAL_SUFFIX`, flushed per scrape; `close` rewrites it
    into `path` and removes it. An existing journal is never overwritten: it is a killed (or still
    running) recording, the only copy of its data.
    """

    def __init__(self, path: str, instance: str = "", job: str = "vllm") -> None:
        self.path = path
        self.journal = path + JOURNAL_SUFFIX
        self.failed: OSError | None = None  # the write that stopped the recording
        if os.path.exists(path) and not os.path.isfile(path):
            # A device (/dev/full), a directory, a pipe: the result is renamed over `path`
            # (as root, over a device node), so it is refused before any scrape.
            raise InputError(
                f"{path}: not a regular file (the recording is written beside it and renamed "
                "over it): give a file name"
            )
        try:
            self._fh = open(self.journal, "x", encoding="utf-8")  # noqa: SIM115
        except FileExistsError:
            raise InputError(
                f"{self.journal} exists: a recording to {path} is still running or was killed; "
                f"`kvoffload analyze {self.journal}` reads it, `kvoffload record --finalize "
                f"{self.journal}` turns it into {path}; or remove it"
            ) from None
        except OSError as exc:
            raise InputError(f"{self.journal}: {exc.strerror}") from None
        try:
            self.writer = RecordingWriter(
                self._fh,
                instance,
                job,
                header=f"{JOURNAL_MARK} of {os.path.basename(path)}: scrape by scrape, "
                "rewritten into OpenMetrics when `record` ends",
            )
        except OSError as exc:
            self._stop(exc)
            raise InputError(f"{self.journal}: {exc.strerror}") from None

    @property
    def scrapes(self) -> int:
        return self.writer.scrapes

    def write_exposition(
        self, expo: Exposition, timestamp: float, instance: str | None = None
    ) -> None:
        """Append a scrape to the journal.

        A failed write (disk full, a file size limit) stops the recording (a one-line InputError).
        The whole scrapes stay in the journal, for `record --finalize` to turn into the file.
        """
        if self.failed is not None:
            raise InputError(self._stopped())
        try:
            self.writer.write_exposition(expo, timestamp, instance)
        except OSError as exc:
            self._stop(exc)
            raise InputError(self._stopped()) from None

    def _stop(self, exc: OSError) -> None:
        self.failed = exc
        with contextlib.suppress(OSError):
            self._fh.close()  # what is still buffered fails again; the descriptor is closed

    def _stopped(self) -> str:
        assert self.failed is not None
        return (
            f"{self.journal}: {self.failed.strerror or self.failed}: recording stopped after "
            f"{self.scrapes} scrapes, which stay in {self.journal} (`kvoffload record "
            f"--finalize {self.journal}` writes {self.path} once there is room)"
        )

    def discard(self) -> None:
        """Remove the journal of a recording that wrote no scrape (it failed to start)."""
        with contextlib.suppress(OSError):
            self._fh.close()
        if self.scrapes == 0:
            with contextlib.suppress(OSError):
                os.unlink(self.journal)

    def close(self) -> int:
        """Finish the journal, rewrite it into `path`, remove it; returns the scrapes written.

        If the rewrite fails or is interrupted, the journal stays (complete, with '# EOF'). After a
        failed write the journal is left cut short and nothing is raised here: the write already
        did.
        """
        if self.failed is not None:
            return self.scrapes
        if not self._fh.closed:
            try:
                self.writer.close()
                self._fh.close()
            except OSError as exc:
                self._stop(exc)
                raise InputError(self._stopped()) from None
        try:
            scrapes = finalize_journal(self.journal, self.path)
        except InputError as exc:
            raise InputError(f"{exc}; the recording stays in {self.journal}") from None
        try:
            os.unlink(self.journal)
        except OSError as exc:
            log.warning("%s written; %s not removed: %s", self.path, self.journal, exc.strerror)
        return scrapes


# The sort key of a journal line on its way to OpenMetrics: family, series (order of first
# appearance, 6 and 8 hex digits), timestamp (16), order in the journal (10).
_FAM_KEY, _SERIES_KEY, _TIME_KEY, _SEQ_KEY = 6, 14, 30, 40
# `le`/`quantile` inside a label set: a histogram's buckets (a summary's quantiles) are one
# series with its `_count` and `_sum`.
_LE_RE = re.compile(r'(?:^|,)le="[^"]*"')
_QUANTILE_RE = re.compile(r'(?:^|,)quantile="[^"]*"')
# The label a type's series carry apart from their own (dropped from the series' key).
_SERIES_LABEL = {"histogram": _LE_RE, "gaugehistogram": _LE_RE, "summary": _QUANTILE_RE}


def finalize_journal(
    journal: str,
    out: str,
    tmp_dir: str | None = None,
    verify: Callable[[str, int], None] | None = None,
) -> int:
    """Rewrite a journal into `out` as strict OpenMetrics; returns the timestamps written.

    Memory is bounded by an on-disk sort (in `tmp_dir`, default beside `out`), and `out` appears
    whole or not at all. A journal without '# EOF' loses its last scrape, a strict file cut short
    its last point. `verify(tmp, timestamps)` may refuse the result (raising) before the rename.
    """
    from kvoffload.ingest.extsort import sorted_lines

    try:
        fh = open(journal, encoding="utf-8", errors=CUT_TOLERANT)  # noqa: SIM115
    except FileNotFoundError:
        raise InputError(f"{journal}: no such file") from None
    except OSError as exc:
        raise InputError(f"{journal}: {exc.strerror}") from None
    families: list[tuple[str, str]] = []
    scan = _JournalScan(families)
    directory = os.path.dirname(os.path.abspath(out))
    tmp = ""
    try:
        tmp, dst_fd = _exclusive_tmp(directory, os.path.basename(out))
        with fh, open(dst_fd, "w", encoding="utf-8") as dst:
            fam = -1
            write = dst.write
            for keyed in sorted_lines(scan.keyed(fh, journal), tmp_dir=tmp_dir or directory):
                f = int(keyed[:_FAM_KEY], 16)
                if f != fam:
                    for g in range(fam + 1, f):  # the families passed over have no sample
                        write(scan.empty_family(g))
                    fam = f
                    write("# TYPE {} {}\n".format(*families[f]))
                write(keyed[_SEQ_KEY:])
            for g in range(fam + 1, len(families)):
                write(scan.empty_family(g))
            write("# EOF\n")
            dst.flush()
            os.fsync(dst.fileno())
        if verify is not None:
            verify(tmp, scan.scrapes)
        os.replace(tmp, out)
    except UnicodeDecodeError:
        raise InputError(f"{journal}: not a text file (invalid UTF-8)") from None
    except OSError as exc:
        raise InputError(f"{out}: {exc.strerror}") from None
    finally:
        fh.close()
        if tmp and os.path.lexists(tmp):
            os.unlink(tmp)
    return scan.scrapes


def _exclusive_tmp(directory: str, base: str) -> tuple[str, int]:
    """A new file beside the output, created exclusively and never through a symlink.

    Why: a name planted in the directory is not written through.
    """
    for _ in range(100):
        tmp = os.path.join(directory, f".{base}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            return tmp, os.open(tmp, flags, 0o666)
        except FileExistsError:
            continue
    raise OSError(errno.EEXIST, "no free temporary name beside it")


class _JournalScan:
    """Reads a journal line by line into sort-keyed lines (see finalize_journal)."""

    def __init__(self, families: list[tuple[str, str]]) -> None:
        self.families = families  # (name, type) by index, in order of first appearance
        # Which instances declared each family (a TYPE line goes with the scrape of the next
        # sample, as the readers have it), and every instance with a sample: a family
        # declared without samples is kept in the strict file when all declared it.
        self.declared_by: dict[int, set[str]] = {}
        self.instances: set[str] = set()
        # The timestamps written: a journal's scrapes (one run of lines each), a strict
        # file's points (one run per series and time)
        self.times: set[str] = set()

    @property
    def scrapes(self) -> int:
        return len(self.times)

    def keyed(self, fh: TextIO, path: str) -> Iterator[str]:
        """Every sample line of the journal `fh`, prefixed by its sort key.

        The key is (family, series, time, file order); the last scrape only when the journal ends
        with `# EOF`.
        """
        from kvoffload.ingest.extsort import float_key

        fam_index: dict[str, int] = {}
        prefixes: dict[tuple[int, str], str] = {}  # (family, sample head) → key prefix
        series_index: dict[tuple[int, str], int] = {}  # (family, labels but le/quantile)
        drop: re.Pattern[str] | None = None
        fam = -1
        held: list[str] = []  # the scrape being read: whole only once the next one begins
        pending: list[int] = []  # families declared since the last sample
        last_ts = ""
        ts_key = ""
        seq = 0
        eof = False
        lineno = 0
        for lineno, line in enumerate(fh, 1):
            if not line.endswith("\n"):
                eof = line.rstrip("\r") == "# EOF"
                break  # else cut mid-line: the recorder was killed while writing it
            if line[0] == "#":
                if line.startswith("# TYPE "):
                    fam = self._declared(fam_index, line, path, lineno)
                    pending.append(fam)
                    drop = _SERIES_LABEL.get(self.families[fam][1])
                elif line == "# EOF\n":
                    eof = True
                    break
                continue
            if line == "\n":
                continue
            brace = line.find("{")
            space = line.find(" ")
            labelled = brace != -1 and (space == -1 or brace < space)
            cut = line.rfind("}") + 1 if labelled else space
            if cut <= 0:
                raise ParseError(f"{path}: line {lineno}: not a sample line")
            head = line[:cut]
            rest = line[cut:].split()
            if len(rest) != 2:
                raise ParseError(f"{path}: line {lineno}: expected 'value timestamp'")
            if rest[1] != last_ts:
                try:
                    ts = float(rest[1])
                except ValueError:
                    raise ParseError(f"{path}: line {lineno}: bad timestamp") from None
                if held:
                    self.times.add(ts_key)
                    yield from held
                    held = []
                last_ts, ts_key = rest[1], float_key(ts)
            if fam == -1:  # a sample before any TYPE line: its own untyped family
                fam = self._family(fam_index, head.partition("{")[0], "unknown")
                drop = None
            if pending:
                instance = _instance_of(head)
                for declared in pending:
                    self.declared_by.setdefault(declared, set()).add(instance)
                pending = []
            prefix = prefixes.get((fam, head)) or self._new_series(
                prefixes, series_index, fam, head, labelled, drop
            )
            held.append(f"{prefix}{ts_key}{seq:010x}{line}")
            seq += 1
        if held and eof:
            self.times.add(ts_key)
            yield from held
        elif held:
            log.warning(
                "%s: no '# EOF' after line %d (its recorder was killed?): the "
                "last, possibly partial scrape dropped",
                path,
                lineno,
            )

    def _declared(self, fam_index: dict[str, int], line: str, path: str, lineno: int) -> int:
        """The family a journal's TYPE line declares."""
        parts = line.split()
        if len(parts) != 4:
            raise ParseError(f"{path}: line {lineno}: malformed TYPE line")
        return self._family(fam_index, parts[2], parts[3])

    def _new_series(
        self,
        prefixes: dict[tuple[int, str], str],
        series_index: dict[tuple[int, str], int],
        fam: int,
        head: str,
        labelled: bool,
        drop: re.Pattern[str] | None,
    ) -> str:
        """The key prefix of a new sample head: its family and its series (labels less le/quantile).

        Why: a histogram's buckets then sort together.
        """
        self.instances.add(_instance_of(head))
        labels = head[head.find("{") + 1 : -1] if labelled else ""
        if drop is not None:
            labels = drop.sub("", labels).lstrip(",")
        series = series_index.setdefault((fam, labels), len(series_index))
        prefix = prefixes[(fam, head)] = f"{fam:06x}{series:08x}"
        return prefix

    def empty_family(self, fam: int) -> str:
        """The TYPE line of a family declared without a sample.

        It is "" when only some instances declared it: a strict file's TYPE line is everyone's.
        Why: that a family is there decides how others are read (vLLM's offload families).
        """
        if self.instances and self.declared_by.get(fam, set()) >= self.instances:
            return "# TYPE {} {}\n".format(*self.families[fam])
        return ""

    def _family(self, index: dict[str, int], name: str, mtype: str) -> int:
        fam = index.get(name)
        if fam is None:
            fam = index[name] = len(self.families)
            self.families.append((name, mtype))
        return fam


def _instance_of(head: str) -> str:
    found = _INSTANCE_RE.search(head)
    return found.group(1) if found else ""


# How much the general reader reads at a time (characters).
CHUNK = 4 * 2**20
# A sample line's last number (its timestamp, when it has two after the labels).
_LAST_NUMBER = re.compile(r"\s(\S+)\s*$")


# Either layout, or any other valid one: scrape-ordered files stream, others sort on disk.
def read_recording(
    path: str,
    wanted: Callable[[str], bool] | None = None,
    wanted_families: frozenset[str] | None = None,
    chunk_size: int = CHUNK,
) -> Iterator[Exposition]:
    """Stream a recording's scrapes; a plain 0.0.4 snapshot (one /metrics body) also works.

    `chunk_size`: characters read at a time (what is accepted does not depend on it).
    """
    try:
        yield from _read_recording(path, wanted, wanted_families, chunk_size)
    except ParseError as exc:
        hint = "" if "truncated" in str(exc) or not _cut_short(path) else " (cut short: no '# EOF')"
        raise ParseError(f"{path}: {exc}{hint}") from None


def _cut_short(path: str) -> bool:
    """Whether the file does not end in '# EOF' (its writer was killed, or it was cut)."""
    try:
        with open(path, "rb") as raw:
            size = raw.seek(0, os.SEEK_END)
            raw.seek(max(0, size - 8))
            return raw.read().rstrip(b"\r\n").rsplit(b"\n", 1)[-1] != b"# EOF"
    except OSError:
        return False


def _read_recording(
    path: str,
    wanted: Callable[[str], bool] | None,
    wanted_families: frozenset[str] | None,
    chunk_size: int,
) -> Iterator[Exposition]:
    try:
        fh = open(path, encoding="utf-8", errors=CUT_TOLERANT)  # noqa: SIM115
    except FileNotFoundError:
        if os.path.exists(path + JOURNAL_SUFFIX):
            raise InputError(
                f"{path}: no such file, but {path + JOURNAL_SUFFIX} is there: the journal of a "
                "recording that is still running or was killed; analyze that, or "
                f"`kvoffload record --finalize {path + JOURNAL_SUFFIX}`"
            ) from None
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory") from None
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror}") from None
    with fh:
        if not fh.seekable():
            # A pipe or a FIFO (`<(xz -dc …)`): the reader reads a recording twice.
            raise InputError(f"{path}: not a regular file (a pipe?): decompress it to a file first")
        try:
            head = fh.read(_HEAD)
        except UnicodeDecodeError:
            raise InputError(f"{path}: not a text file (invalid UTF-8)") from None
        if not head.strip():
            raise InputError(f"{path}: empty file")
        fh.seek(0)
        if _looks_like_openmetrics(head, whole=len(head) < _HEAD):
            try:
                journal = head.startswith(JOURNAL_MARK)
                ordered = _scrape_ordered(fh, chunk_size)
                fh.seek(0)
                if journal and ordered:
                    _note_journal(path)
                yield from iter_openmetrics(
                    whole_runs(fh, chunk_size),
                    wanted,
                    wanted_families,
                    unordered=not ordered,
                    journal=path if journal else None,
                )
            except UnicodeDecodeError:
                raise InputError(f"{path}: not a text file (invalid UTF-8)") from None
        else:
            # A single classic /metrics body: one scrape without timestamps.
            try:
                text = fh.read()
            except UnicodeDecodeError:
                raise InputError(f"{path}: not a text file (invalid UTF-8)") from None
            if not any(line.strip() and line[0] != "#" for line in text.splitlines()):
                raise InputError(
                    f"{path}: comment lines only, no sample (a recording cut before its "
                    "first sample, or an empty /metrics body)"
                )
            yield parse_text(text, wanted, wanted_families)


def _scrape_ordered(fh: TextIO, chunk_size: int = CHUNK) -> bool:
    """Whether the file reads scrape by scrape (it streams) or must be sorted by timestamp.

    Scrape-ordered files repeat each family's TYPE line; the strict layout goes back in time at a
    family's second series. Whichever comes first decides, so the answer depends on the bytes only,
    never on read sizes.
    """
    declared: set[str] = set()
    last = -math.inf
    for chunk in read_chunks(fh, chunk_size):
        lines = chunk.split("\n")
        # "" after the last newline, or a line cut short: its timestamp may be cut
        lines.pop()
        for line in lines:
            if not line:
                continue
            if line[0] == "#":
                if line.startswith("# TYPE "):
                    name = line[7:].split(" ", 1)[0]
                    if name in declared:
                        return True
                    declared.add(name)
                continue
            m = _LAST_NUMBER.search(line)
            if m is None or line.rsplit("}", 1)[-1].count(" ") < 2:
                continue
            try:
                ts = float(m.group(1))
            except ValueError:
                continue
            if ts < last:
                return False
            last = ts
    # Neither seen: scrape-ordered. A streamed file that later goes back in time is refused there.
    return True


def whole_runs(fh: TextIO, size: int = CHUNK, most: int = 4 * CHUNK) -> Iterator[str]:
    """`read_chunks` for the recording parser: blocks of about `size` characters.

    Each ends before a comment line, so what is accepted never depends on where blocks fall.
    Only `most` characters without one are cut at their last whole line.
    """
    # The parser jumps over a run of unread sample lines within a block: a block starting mid-run
    # would parse its first line, a malformed one an error or not. A TYPE line ends every run.
    carry = ""
    while True:
        block = fh.read(size)
        if not block:
            if carry:
                yield carry
            return
        text = carry + block
        # Places judged before were no boundary, but for the start of carry's last line,
        # whose line (needed to judge it) may only now be whole.
        cut = _run_boundary(text, carry.rfind("\n") + 1)
        if cut is None and len(text) >= most:
            cut = text.rfind("\n") + 1 or None
        if cut is None:
            carry = text
            continue
        carry = text[cut:]
        yield text[:cut]


def _run_boundary(text: str, lowest: int) -> int | None:
    """Where a block may end: the last whole comment line's start in `text`, at `lowest` or after.

    None: read on (see whole_runs).
    """
    last = text.rfind("\n")  # the newline of the last whole line
    if last == -1:
        return None
    at = text.rfind("\n#", max(lowest, 1) - 1, last)
    return at + 1 if at != -1 else None


def _note_journal(path: str) -> None:
    """Say how to finish a journal whose rewrite was interrupted (complete, ending in '# EOF').

    One cut short is announced when its end is reached (parse.py).
    """
    with open(path, "rb") as raw:
        size = raw.seek(0, os.SEEK_END)
        raw.seek(max(0, size - 6))
        if raw.read() == b"# EOF\n":
            log.warning(
                "%s is the journal of a recording whose OpenMetrics file was not "
                "written (`record` was stopped while closing); it is complete. "
                "`kvoffload record --finalize %s` writes the file",
                path,
                path,
            )


# What is read of a file to tell a recording from a single /metrics body.
_HEAD = 65536


def _looks_like_openmetrics(head: str, whole: bool = False) -> bool:
    """Whether the file is a recording (samples with timestamps) rather than one 0.0.4 body.

    `whole`: `head` is all of the file. Cut in its last line before any whole sample line, it is
    a recording cut short, not an empty body.
    """
    if head.startswith(JOURNAL_MARK):
        return True
    lines = head.splitlines()
    if whole and not head.endswith("\n"):
        lines.pop()  # cut: a sample line there may have lost its timestamp
    for line in lines:
        if not line or line.startswith("#"):
            if line == "# EOF":
                return True
            continue
        parts = line.rsplit("}", 1)[-1].split()
        return len(parts) == 2
    return whole and not head.endswith("\n")
