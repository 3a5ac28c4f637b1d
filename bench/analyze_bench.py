"""`kvoffload analyze` of a long recording (issue #16 item 1): median of 5 runs after one
warm-up read (the file in the page cache), both layouts a recording has (the journal `record`
writes while it runs, scrape by scrape; the strict file it leaves when it ends), a `--window 5m`
analysis, the compiled reader and its pure-Python twin, and the general reader as the reference.

The recording: the benchmark's "large" payload (8 engines × 3 models, 40 distinct bodies in a
loop — each wrap is a counter reset the readers must handle), one scrape every 15 s, full
bodies as `record` writes them. Files are built once per length under $KVO_BENCH_TMP (default:
the system temp dir) and kept for the next run; they are large (2.0 GB for 6 h, 8.2 GB for 24 h).
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
from pathlib import Path

from fleet import tree_rss_mb
from payloads import bodies

from kvoffload.analysis.analyze import analyze_window, window_from_expositions
from kvoffload.ingest.catalog import WANTED_FAMILIES, wanted
from kvoffload.ingest.parse import parse_text
from kvoffload.recording.openmetrics import RecordingWriter, finalize_journal, read_recording

INTERVAL = 15.0


def recording(hours: float, strict: bool) -> Path:
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
    """The largest sum of VmRSS over the process and its workers, sampled every 20 ms."""
    peak = 0.0
    while proc.poll() is None:
        peak = max(peak, tree_rss_mb(proc.pid))
        time.sleep(0.02)
    return peak


# The reader's hot loop compiled (recording/_scan.c, the default where it was built) or its
# pure-Python twin (what a machine without a C compiler gets): the same JSON, both timed.
READERS = {"compiled": {}, "pure Python": {"KVOFFLOAD_PURE_PYTHON": "1"}}


def _run(
    path: Path, *extra: str, env: dict[str, str] | None = None
) -> tuple[float, float, dict[str, object]]:
    start = time.monotonic()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvoffload", "analyze", str(path), "--json", *extra],
            stdout=out,
            env={**os.environ, **(env or {})},
        )
        peak = _tree_peak_rss_mb(proc)
        wall = time.monotonic() - start
        if proc.returncode != 0:
            raise SystemExit(f"analyze {path} failed")
        out.seek(0)
        report = json.loads(out.read())
    return wall, peak, report


def _general(path: Path) -> tuple[float, list[dict[str, object]]]:
    """The general reader (line by line, on-disk sort for the strict layout), in process."""
    start = time.monotonic()
    win, _n, lifetime = window_from_expositions(read_recording(str(path), wanted, WANTED_FAMILIES))
    groups = analyze_window(win, lifetime=lifetime)
    return time.monotonic() - start, groups


def bench_analyze(hours_list: list[float], repeats: int = 5) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for hours in hours_list:
        goal = 10.0 if hours >= 24 else 3.0 if hours >= 6 else None
        reports = {}
        for strict in (False, True):
            path = recording(hours, strict)
            # The default reads a large journal in parts, one process per core; `--jobs 1` is
            # one process (its JSON must be the same bytes).
            cases = [("", (), "compiled")]
            if not strict:
                cases += [
                    ("--jobs 1", ("--jobs", "1"), "compiled"),
                    ("--window 5m", ("--window", "5m"), "compiled"),
                ]
            cases.append(("", (), "pure Python"))
            _run(path)  # a warm-up: the file in the page cache, as for every run after it
            for label, extra, reader in cases:
                runs = [_run(path, *extra, env=READERS[reader]) for _ in range(repeats)]
                walls = sorted(r[0] for r in runs)
                median = statistics.median(walls)
                row: dict[str, object] = {
                    "hours": hours,
                    "layout": "strict" if strict else "journal",
                    "args": label,
                    "reader": reader,
                    "file_mb": path.stat().st_size / 1e6,
                    "median_s": median,
                    "min_s": walls[0],
                    "max_s": walls[-1],
                    "peak_rss_mb": max(r[1] for r in runs),
                    "goal_s": goal if not label and reader == "compiled" else None,
                    "goal_met": (median < goal) if goal and not label else None,
                    "rss_goal_met": max(r[1] for r in runs) < 150,
                }
                if not label and reader == "compiled":
                    reports[row["layout"]] = runs[0][2]["groups"]
                elif label != "--window 5m":
                    row["same_json_as_default"] = json.dumps(
                        runs[0][2]["groups"], sort_keys=True
                    ) == json.dumps(reports[str(row["layout"])], sort_keys=True)
                rows.append(row)
        same_layouts = json.dumps(reports["journal"], sort_keys=True) == json.dumps(
            reports["strict"], sort_keys=True
        )
        general_s, general = _general(recording(hours, False)) if hours <= 6 else (None, None)
        for row in rows:
            if row["hours"] == hours and not row["args"] and row["reader"] == "compiled":
                row["same_json_both_layouts"] = same_layouts
                if general is not None and row["layout"] == "journal":
                    row["general_reader_s"] = general_s
                    row["same_json_as_general"] = json.dumps(general, sort_keys=True) == json.dumps(
                        reports["journal"], sort_keys=True
                    )
    return rows


def print_rows(rows: list[dict[str, object]]) -> None:
    for r in rows:
        goal = r["goal_s"]
        verdict = (
            "" if goal is None else f" (goal < {goal:g} s: {'met' if r['goal_met'] else 'MISSED'})"
        )
        extra = ""
        if "general_reader_s" in r:
            extra += f"; general reader {r['general_reader_s']:.1f} s"
        if "same_json_as_general" in r:
            extra += f", same JSON as it: {r['same_json_as_general']}"
        if "same_json_as_default" in r:
            extra += f"; same JSON as the default: {r['same_json_as_default']}"
        if "same_json_both_layouts" in r:
            extra += f"; same JSON both layouts: {r['same_json_both_layouts']}"
        print(
            f"{r['hours']:>5g} h {r['layout']:7} {r['args'] or '':12} {r['reader']:11} "
            f"{r['file_mb']:>6.0f} MB: "
            f"median {r['median_s']:.2f} s ({r['min_s']:.2f}–{r['max_s']:.2f}), peak RSS "
            f"{r['peak_rss_mb']:.0f} MB (process tree){verdict}{extra}"
        )
