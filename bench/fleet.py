"""Fleet analysis from Prometheus at scale (issue #15): N simulated engines over H hours,
backfilled into a real Prometheus, analyzed by `kvoffload analyze --prometheus`.

The fleet: a few simulator scenarios recorded H hours at 15 s (the endless mode keeps their
traffic coming), cloned under N instance names (clones of one scenario carry the same numbers,
which costs Prometheus and kvoffload the same as distinct ones). Only the series kvoffload
reads are backfilled (a real Prometheus holds more, which the name matchers of the questions
never touch). The data is built once per (N, H) under bench/.fleet-data/ (git-ignored).

Run: `python bench/fleet.py [--engines 1000] [--hours 6]`, or `bench/run.py --only fleet`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "rules"))

from kvoffload.ingest.catalog import wanted  # noqa: E402
from kvoffload.recording.openmetrics import finalize_journal  # noqa: E402
from kvoffload.sim import scenarios  # noqa: E402
from kvoffload.sim.write_recording import record_scenario  # noqa: E402

from fleet_prom import backfill, prometheus_on  # noqa: E402

# A mix of advice: keep, grow (too small), shrink (oversized), enable (pressure), disable-ish.
SCENARIOS = (
    "rag-hot-set-fits",
    "buffer-too-small",
    "buffer-oversized",
    "pressure-without-offloading",
    "no-reuse",
)
TEMPLATE_INSTANCE = "template:8000"
_SAMPLE = re.compile(r"^([^{ ]+)")


def _template(name: str, hours: float, work: Path) -> Path:
    """One scenario recorded `hours` at 15 s, strict OpenMetrics, only what kvoffload reads."""
    out = work / f"{name}-{hours:g}h.om"
    if out.exists():
        return out
    journal = work / f"{name}.journal"
    full = work / f"{name}.full.om"
    record_scenario(
        scenarios.get(name), str(journal), hours * 3600, 15.0, instance=TEMPLATE_INSTANCE
    )
    finalize_journal(str(journal), str(full))
    journal.unlink()
    with open(full) as src, open(out.with_suffix(".tmp"), "w") as dst:
        keep = False
        for line in src:
            if line.startswith("# TYPE "):
                family = line.split()[2]
                keep = any(
                    wanted(family + s) for s in ("", "_total", "_sum", "_count")
                ) and not family.endswith("_created")
                if keep:
                    dst.write(line)
            elif line.startswith("#"):
                continue
            elif keep:
                m = _SAMPLE.match(line)
                if m and wanted(m.group(1)) and not m.group(1).endswith("_created"):
                    dst.write(line)
    full.unlink()
    out.with_suffix(".tmp").rename(out)
    return out


def _families(path: Path) -> dict[str, list[str]]:
    """family TYPE line → its sample lines, in file order."""
    out: dict[str, list[str]] = {}
    current: list[str] = []
    for line in path.read_text().splitlines(keepends=True):
        if line.startswith("# TYPE "):
            current = out.setdefault(line, [])
        elif not line.startswith("#"):
            current.append(line)
    return out


def build_fleet(engines: int, hours: float, work: Path) -> Path:
    """The TSDB of `engines` instances (round-robin over SCENARIOS), built once."""
    tsdb = work / f"tsdb-{engines}x{hours:g}h"
    if (tsdb / "done").exists():
        return tsdb
    shutil.rmtree(tsdb, ignore_errors=True)
    templates = {name: _families(_template(name, hours, work)) for name in SCENARIOS}
    types: list[str] = []
    for fams in templates.values():
        types.extend(t for t in fams if t not in types)
    # Backfill in parts of ~100 instances: promtool holds a part's series in memory.
    part_size = 100
    for first in range(0, engines, part_size):
        path = work / "part.om"
        with open(path, "w") as out:
            for type_line in types:
                out.write(type_line)
                for i in range(first, min(first + part_size, engines)):
                    lines = templates[SCENARIOS[i % len(SCENARIOS)]].get(type_line)
                    if lines:
                        block = "".join(lines)
                        out.write(block.replace(TEMPLATE_INSTANCE, f"engine-{i:04d}:8000"))
            out.write("# EOF\n")
        backfill(path, tsdb)
        path.unlink()
    _compact(tsdb, hours)
    (tsdb / "done").write_text("")
    return tsdb


def _compact(tsdb: Path, hours: float, timeout: float = 900.0) -> None:
    """The parts' blocks overlap in time; Prometheus merges them (vertical compaction) soon
    after it starts. Let it do that now, so the measured run does not pay for it."""
    wanted_blocks = math.ceil(hours / 2) + 1
    with prometheus_on(tsdb):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            blocks = [d for d in tsdb.iterdir() if d.is_dir() and len(d.name) == 26]
            if len(blocks) <= wanted_blocks:
                return
            time.sleep(5)
    raise SystemExit(f"{tsdb}: blocks still overlap after {timeout:.0f} s")


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants (the worker processes of `--jobs`)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    todo.extend(int(c) for c in fh.read().split())
    return out


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def tree_rss_mb(pid: int) -> float:
    """The RSS of `pid` and its descendants, summed."""
    total = 0.0
    for p in _tree(pid):
        with contextlib.suppress(OSError, ValueError):
            total += _rss_mb(p)
    return total


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_fleet(engines: int, hours: float, step: str | None = None) -> dict[str, object]:
    work = HERE / ".fleet-data"
    work.mkdir(exist_ok=True)
    started = time.monotonic()
    tsdb = build_fleet(engines, hours, work)
    prep = time.monotonic() - started
    with open(work / f"{SCENARIOS[0]}-{hours:g}h.om") as fh:
        first_line = next(line for line in fh if not line.startswith("#"))
    start = float(first_line.rsplit(" ", 1)[1])
    end = start + hours * 3600
    with prometheus_on(tsdb) as url:
        prom_pid = int(
            subprocess.check_output(["pgrep", "-f", f"storage.tsdb.path={tsdb}"]).split()[0]
        )
        prom_cpu = _cpu_seconds(prom_pid)
        args = [
            sys.executable,
            "-m",
            "kvoffload",
            "analyze",
            "--prometheus",
            url,
            "--start",
            f"{start}",
            "--end",
            f"{end}",
            "--json",
        ] + (["--step", step] if step else [])
        t0 = time.monotonic()
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        peak = 0.0
        chunks: list[bytes] = []
        assert proc.stdout is not None
        # Read the JSON while polling the child's peak RSS (VmHWM).
        os.set_blocking(proc.stdout.fileno(), False)
        while proc.poll() is None:
            peak = max(peak, tree_rss_mb(proc.pid))
            with contextlib.suppress(BlockingIOError, TypeError):
                data = proc.stdout.read()
                if data:
                    chunks.append(data)
            time.sleep(0.05)
        wall = time.monotonic() - t0
        rest = proc.stdout.read()
        if rest:
            chunks.append(rest)
        stderr = proc.stderr.read().decode() if proc.stderr else ""
        prom_cpu = _cpu_seconds(prom_pid) - prom_cpu
    if proc.returncode != 0:
        raise SystemExit(f"analyze failed: {stderr[-2000:]}")
    report = json.loads(b"".join(chunks))
    return {
        "engines": engines,
        "hours": hours,
        "step": step or "every sample",
        "groups": len(report["groups"]),
        "errors": len(report["errors"]),
        "actions": report["fleet"]["actions"],
        "wall_s": wall,
        "peak_rss_mb": peak,  # the analyze process and its workers together (sampled)
        "prometheus_cpu_s": prom_cpu,
        "progress": stderr.strip().splitlines()[-1] if stderr.strip() else "",
        "prep_s": prep,
        "under_60s": wall < 60,
        "under_500mb": peak < 500,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--engines", type=int, default=1000)
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--step", default=None)
    args = ap.parse_args()
    row = bench_fleet(args.engines, args.hours, args.step)
    print(json.dumps(row, indent=2))


if __name__ == "__main__":
    main()
