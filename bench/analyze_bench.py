"""`kvoffload analyze` of a long recording (issue #16 item 1, #26 step 4): a day of what `record`
leaves (strict OpenMetrics) through the strict reader, with the compiled scan and without it,
and the journal a killed `record` leaves, which the general reader reads (or `record --repair`
turns into the strict file first).

The recording: the benchmark's "large" payload (8 engines × 3 models, 40 distinct bodies in a
loop — each wrap is a counter reset the readers must handle), one scrape every 15 s (`record`'s
default), full bodies as `record` writes them. Files are built once per length under
$KVO_BENCH_TMP (default: the system temp dir) and kept for the next run; they are large (2.0 GB
for 6 h, 8.2 GB for 24 h). Two kinds of figures, printed, never asserted: the wall time and
peak RSS of the `analyze` command (median of runs, after one warm-up read: the file in the page
cache), and, in this process, each way of reading against the reference — the strict reader in
pure Python, the same Python work every run — pair by pair, so machine noise cancels.
"""

from __future__ import annotations

import functools
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fleet import tree_rss_mb
from payloads import bodies

from kvoffload.analysis.analyze import analyze_window, window_from_recording
from kvoffload.ingest.parse import parse_text
from kvoffload.recording import blocks
from kvoffload.recording.openmetrics import RecordingWriter, finalize_journal

INTERVAL = 15.0


def recording(hours: float, strict: bool) -> Path:
    """The journal of `hours` of scrapes, or the strict file it finalizes to (built once)."""
    base = Path(os.environ.get("KVO_BENCH_TMP") or tempfile.gettempdir()) / "kvoffload-bench"
    base.mkdir(exist_ok=True)
    journal = base / f"large-{hours:g}h.journal.om"
    if not journal.exists():
        # The bodies rendered once, their times replaced: a day's file in seconds.
        stand_in, templates = _templates()
        tmp = journal.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            for i in range(int(hours * 3600 / INTERVAL)):
                ts = repr(1.8e9 + i * INTERVAL)
                template = templates[i % len(templates)]
                fh.write(template.replace(f" {stand_in}\n".encode(), f" {ts}\n".encode()))
            fh.write(b"# EOF\n")
        tmp.rename(journal)
    if not strict:
        return journal
    out = base / f"large-{hours:g}h.strict.om"
    if not out.exists():
        finalize_journal(str(journal), str(out))
    return out


@functools.cache
def _templates() -> tuple[str, list[bytes]]:
    """Each body as `record` writes it, at a stand-in time (its repr is replaced by each
    scrape's: what RecordingWriter writes depends only on the body and the time)."""
    stand_in = repr(1.0e9 + 0.5)
    templates = []
    for body in bodies("large", 40):
        text = io.StringIO()
        RecordingWriter(text, instance="vllm:8000").write_exposition(
            parse_text(body), float(stand_in)
        )
        templates.append(text.getvalue().encode())
    return stand_in, templates


def _tree_peak_rss_mb(proc: subprocess.Popen[bytes]) -> float:
    """The largest sum of VmRSS over the process and its children, sampled every 20 ms."""
    peak = 0.0
    while proc.poll() is None:
        peak = max(peak, tree_rss_mb(proc.pid))
        time.sleep(0.02)
    return peak


# The scan compiled (recording/_scan.c, the default where it was built) or its pure-Python
# twin (what a machine without a C compiler gets).
PURE = {"KVOFFLOAD_PURE_PYTHON": "1"}


def _run(path: Path, env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """One `analyze FILE --json`: (wall seconds, peak RSS in MB, its groups as JSON)."""
    start = time.monotonic()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvoffload", "analyze", str(path), "--json"],
            stdout=out,
            env={**os.environ, **(env or {})},
        )
        peak = _tree_peak_rss_mb(proc)
        wall = time.monotonic() - start
        if proc.returncode != 0:
            raise SystemExit(f"analyze {path} failed")
        out.seek(0)
        groups = json.loads(out.read())["groups"]
    return wall, peak, json.dumps(groups, sort_keys=True)


def _in_process(path: Path, compiled: bool) -> Callable[[], str]:
    """`analyze`'s read and analysis of `path` in this process, with or without the scan."""

    def read() -> str:
        saved, blocks.COMPILED = blocks.COMPILED, compiled
        try:
            win, _n, lifetime = window_from_recording(str(path))
        finally:
            blocks.COMPILED = saved
        return json.dumps(analyze_window(win, lifetime=lifetime), sort_keys=True)

    return read


def _ratios(cases: dict[str, Callable[[], str]], rounds: int) -> dict[str, float]:
    """Each case's time over the reference's ("reference"), measured pair by pair: median."""
    ratios: dict[str, list[float]] = {name: [] for name in cases if name != "reference"}
    for _ in range(rounds):
        start = time.perf_counter()
        cases["reference"]()
        reference = time.perf_counter() - start
        for name in ratios:
            start = time.perf_counter()
            cases[name]()
            ratios[name].append((time.perf_counter() - start) / reference)
    return {name: statistics.median(values) for name, values in ratios.items()}


def bench_analyze(
    hours_list: list[float], repeats: int = 5, rounds: int = 3, repair: bool = True
) -> list[dict[str, object]]:
    """One row per (length, case): the command's median wall time, its peak RSS, the JSON
    against the strict reader's, and its time over the reference's in this process; with
    `repair`, what rewriting the journal into the strict file costs (minutes for a day)."""
    rows: list[dict[str, object]] = []
    for hours in hours_list:
        goal = 10.0 if hours >= 24 else 3.0 if hours >= 6 else None
        journal, strict = recording(hours, False), recording(hours, True)
        # (label, file, env, runs): the journal's general read is slow, run fewer times.
        cases = [
            ("strict, compiled scan", strict, None, repeats),
            ("strict, pure Python", strict, PURE, max(1, repeats // 2)),
            ("journal, general reader", journal, None, max(1, repeats // 5)),
        ]
        for path in (strict, journal):
            _run(path)  # a warm-up: the file in the page cache, as for every run after it
        expected = ""
        for label, path, env, runs in cases:
            done = [_run(path, env) for _ in range(runs)]
            walls = sorted(r[0] for r in done)
            expected = expected or done[0][2]
            rows.append(
                {
                    "hours": hours,
                    "case": label,
                    "file_mb": path.stat().st_size / 1e6,
                    "runs": runs,
                    "median_s": statistics.median(walls),
                    "min_s": walls[0],
                    "max_s": walls[-1],
                    "peak_rss_mb": max(r[1] for r in done),
                    "goal_s": goal if label.endswith("compiled scan") else None,
                    "same_json": done[0][2] == expected,
                }
            )
        if repair:
            rows[-1]["repair_first_s"] = _repair_seconds(journal)
        ratios = _ratios(
            {
                "reference": _in_process(strict, compiled=False),
                "strict, compiled scan": _in_process(strict, compiled=True),
                "journal, general reader": _in_process(journal, compiled=True),
            },
            rounds,
        )
        for row in rows:
            if row["hours"] == hours:
                row["over_reference"] = ratios.get(str(row["case"]), 1.0)
    return rows


def _repair_seconds(journal: Path) -> float:
    """What `record --repair` of the journal costs (its rewrite into the strict file)."""
    with tempfile.TemporaryDirectory(dir=journal.parent) as tmp:
        start = time.monotonic()
        finalize_journal(str(journal), str(Path(tmp) / "repaired.om"))
        return time.monotonic() - start


def print_rows(rows: list[dict[str, object]]) -> None:
    for r in rows:
        goal = r["goal_s"]
        median = float(r["median_s"])  # type: ignore[arg-type]
        verdict = (
            ""
            if not isinstance(goal, float)
            else f" (goal < {goal:g} s: {'met' if median < goal else 'MISSED'})"
        )
        extra = ""
        if "repair_first_s" in r:
            extra = f"; rewrite first (record --repair): {r['repair_first_s']:.1f} s"
        print(
            f"{r['hours']:>5g} h {r['case']:24} {r['file_mb']:>6.0f} MB: median {median:.2f} s "
            f"({r['min_s']:.2f}–{r['max_s']:.2f}, {r['runs']} run(s)), peak RSS "
            f"{r['peak_rss_mb']:.0f} MB; {r['over_reference']:.2f}x the pure-Python strict "
            f"read in process; same JSON: {r['same_json']}{verdict}{extra}"
        )


if __name__ == "__main__":
    # `python bench/analyze_bench.py 6 24`: the lengths in hours (default: 6 and 24).
    print_rows(bench_analyze([float(h) for h in sys.argv[1:]] or [6.0, 24.0]))
