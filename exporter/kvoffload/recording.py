"""Recordings: OpenMetrics 1.0 files with a timestamp on every sample (DESIGN.md §7).

Written scrape by scrape (each scrape's families again, with that scrape's timestamp), so a
reader streams them with constant memory and `promtool tsdb create-blocks-from openmetrics`
backfills them. Like Prometheus, the writer adds `instance` and `job` to every series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TextIO

from kvoffload.errors import InputError
from kvoffload.parse import (
    Exposition,
    ParseError,
    family_name,
    iter_openmetrics,
    parse_text,
    read_chunks,
    scrape_ordered,
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _format_value(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


class RecordingWriter:
    """Append scrapes of one or more targets to an OpenMetrics text stream."""

    def __init__(self, out: TextIO, instance: str = "", job: str = "vllm") -> None:
        self.out = out
        self.instance = instance
        self.job = job
        self.scrapes = 0
        self._last_ts: float | None = None

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
        extra = {"instance": instance if instance is not None else self.instance,
                 "job": self.job}
        ts = repr(float(timestamp))
        by_family = _group_by_family(expo)
        lines: list[str] = []
        for fam, (mtype, samples) in by_family.items():
            lines.append(f"# TYPE {fam} {mtype}")
            for name, labels, value, _ in samples:
                merged = {**labels, **{k: v for k, v in extra.items() if v}}
                label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(merged.items()))
                lines.append(f"{name}{{{label_text}}} {_format_value(value)} {ts}")
        self.out.write("\n".join(lines) + "\n")
        # Each scrape reaches the file whole: a recorder killed later loses nothing before it.
        self.out.flush()
        self.scrapes += 1

    def close(self) -> None:
        self.out.write("# EOF\n")
        self.out.flush()


_SUFFIXES = ("_total", "_created", "_bucket", "_count", "_sum", "_gcount", "_gsum", "_info")


def _group_by_family(
    expo: Exposition,
) -> dict[str, tuple[str, list[tuple[str, dict[str, str], float, float | None]]]]:
    """Samples under their OpenMetrics family: counters lose `_total` in the family name,
    and the separate `_created` gauge families of 0.0.4 are folded into their parent."""
    types = expo.families
    out: dict[str, tuple[str, list[tuple[str, dict[str, str], float, float | None]]]] = {}
    for fam, mtype in types.items():
        if fam.endswith("_created") and mtype == "gauge":
            continue
        out[fam] = (mtype if mtype in ("counter", "gauge", "histogram", "summary") else "unknown",
                    [])
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


# How much of a recording is read to tell its layout: a family-contiguous file goes back in time
# at its second family.
_LAYOUT_PROBE = 16 * 2**20


def read_recording(
    path: str,
    wanted: Callable[[str], bool] | None = None,
    wanted_families: frozenset[str] | None = None,
) -> Iterator[Exposition]:
    """Stream a recording's scrapes; a plain 0.0.4 snapshot (one /metrics body) also works."""
    try:
        yield from _read_recording(path, wanted, wanted_families)
    except ParseError as exc:
        raise ParseError(f"{path}: {exc}") from None


def _read_recording(
    path: str,
    wanted: Callable[[str], bool] | None,
    wanted_families: frozenset[str] | None,
) -> Iterator[Exposition]:
    try:
        fh = open(path, encoding="utf-8", errors="strict")  # noqa: SIM115
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory") from None
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror}") from None
    with fh:
        try:
            head = fh.read(65536)
        except UnicodeDecodeError:
            raise InputError(f"{path}: not a text file (invalid UTF-8)") from None
        if not head.strip():
            raise InputError(f"{path}: empty file")
        fh.seek(0)
        if _looks_like_openmetrics(head):
            # Scrape by scrape (what `record` writes) streams; families or series contiguous
            # (OpenMetrics' own layout, other tools') is put together by timestamp.
            try:
                ordered = scrape_ordered(fh.read(_LAYOUT_PROBE))
            except UnicodeDecodeError:
                raise InputError(f"{path}: not a text file (invalid UTF-8)") from None
            fh.seek(0)
            try:
                yield from iter_openmetrics(read_chunks(fh), wanted, wanted_families,
                                            unordered=not ordered)
            except UnicodeDecodeError:
                raise InputError(f"{path}: not a text file (invalid UTF-8)") from None
        else:
            # A single classic /metrics body: one scrape without timestamps.
            try:
                text = fh.read()
            except UnicodeDecodeError:
                raise InputError(f"{path}: not a text file (invalid UTF-8)") from None
            yield parse_text(text, wanted, wanted_families)


def _looks_like_openmetrics(head: str) -> bool:
    for line in head.splitlines():
        if not line or line.startswith("#"):
            if line == "# EOF":
                return True
            continue
        parts = line.rsplit("}", 1)[-1].split()
        return len(parts) == 2
    return False
