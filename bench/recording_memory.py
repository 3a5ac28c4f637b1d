"""Memory of long recordings: `record`'s rewrite on close and `analyze` of either layout.

A recording of H hours (real vLLM 0.26 bodies captured on an H200, cycled, one scrape every
--interval) is written as the journal `record` keeps while it runs; then, each in its own
process, timed and measured (peak RSS):

  finalize   `kvoffload record --finalize` (journal → strict OpenMetrics, an on-disk sort)
  analyze    `kvoffload analyze` of the journal (streams) and of the strict file (sorted by
             timestamp on disk)

Memory must not grow with the length: the ratios printed (long / short) should stay near 1
while the file grows H times. Not a unit test (minutes, GBs of disk at 24 h); run by hand:

    .venv/bin/python bench/recording_memory.py                 # 1 h and 6 h at 15 s
    .venv/bin/python bench/recording_memory.py --hours 1 24    # the 24-hour check
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "exporter"))
sys.path.insert(0, str(ROOT / "tests"))

from kvoffload.ingest.parse import parse_text  # noqa: E402
from kvoffload.recording.openmetrics import JOURNAL_MARK, RecordingWriter  # noqa: E402

from helpers import h200_scrapes  # noqa: E402


def write_journal(path: Path, hours: float, interval: float) -> int:
    bodies = [parse_text(body) for _ts, body in h200_scrapes()]
    n = int(hours * 3600 / interval)
    with open(path, "w", encoding="utf-8") as fh:
        writer = RecordingWriter(fh, instance="vllm:8000", header=f"{JOURNAL_MARK} (bench)")
        for i in range(n):
            # The bodies loop: each wrap is a counter reset, which a reader handles anyway.
            writer.write_exposition(bodies[i % len(bodies)], 1.8e9 + i * interval)
        writer.close()
    return n


def measure(args: list[str]) -> tuple[float, float]:
    """(seconds, peak RSS in MB) of one kvoffload command."""
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvoffload", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT / "exporter")},
    )
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"kvoffload {' '.join(args)} failed: {proc.stderr.read().decode()}")
    proc.stderr.close()
    return wall, usage.ru_maxrss / 1024


def run(hours: float, interval: float, tmp: str) -> dict[str, float]:
    journal = Path(tmp) / f"rec-{hours:g}h.om.partial"
    out = Path(tmp) / f"rec-{hours:g}h.om"
    scrapes = write_journal(journal, hours, interval)
    row: dict[str, float] = {
        "hours": hours,
        "scrapes": scrapes,
        "journal_mb": journal.stat().st_size / 1e6,
    }
    row["analyze_journal_s"], row["analyze_journal_mb"] = measure(
        ["analyze", str(journal), "--json"]
    )
    row["finalize_s"], row["finalize_mb"] = measure(
        ["record", "--finalize", str(journal), "-o", str(out)]
    )
    row["file_mb"] = out.stat().st_size / 1e6
    row["analyze_file_s"], row["analyze_file_mb"] = measure(["analyze", str(out), "--json"])
    out.unlink()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, nargs="+", default=[1.0, 6.0])
    ap.add_argument("--interval", type=float, default=15.0)
    ap.add_argument(
        "--tmp",
        default=os.environ.get("KVO_BENCH_TMP"),
        help="Directory for the recordings (default: $TMPDIR).",
    )
    opts = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(dir=opts.tmp) as tmp:
        for hours in opts.hours:
            rows.append(run(hours, opts.interval, tmp))
            r = rows[-1]
            print(
                f"{r['hours']:g} h, {r['scrapes']:.0f} scrapes, journal {r['journal_mb']:.0f} "
                f"MB, file {r['file_mb']:.0f} MB: finalize {r['finalize_s']:.1f} s "
                f"{r['finalize_mb']:.0f} MB peak; analyze journal {r['analyze_journal_s']:.1f}"
                f" s {r['analyze_journal_mb']:.0f} MB, file {r['analyze_file_s']:.1f} s "
                f"{r['analyze_file_mb']:.0f} MB",
                flush=True,
            )
    short, long = rows[0], rows[-1]
    if long is not short:
        print(
            f"ratios {long['hours']:g} h / {short['hours']:g} h: file "
            f"{long['file_mb'] / short['file_mb']:.1f}x; peak RSS finalize "
            f"{long['finalize_mb'] / short['finalize_mb']:.2f}x, analyze journal "
            f"{long['analyze_journal_mb'] / short['analyze_journal_mb']:.2f}x, analyze file "
            f"{long['analyze_file_mb'] / short['analyze_file_mb']:.2f}x"
        )


if __name__ == "__main__":
    main()
