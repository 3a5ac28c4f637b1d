"""`kvoffload analyze` of the benchmark's long recordings, timed on a quiet machine (issue #16
item 1): each case run N times as its own process (pinned to the CPUs given), with its wall
time, the CPU time of it and its workers, and the peak RSS of the process tree (VmRSS summed
over the tree, sampled every 20 ms). Runs alternate between the cases so a slow spell of the
machine touches all of them.

usage: python3 analyze_runs.py OUT.json DEADLINE_EPOCH CASE... where CASE is
  name=PYTHONPATH|file|extra args (space-separated)|runs[|NAME=VALUE,... more environment]
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time


def tree_rss_mb(pid: int) -> float:
    """VmRSS of `pid` and its descendants, in MB."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            with open(f"/proc/{p}/task/{p}/children") as fh:
                todo.extend(int(c) for c in fh.read().split())
        except (OSError, ValueError):
            continue
    return total / 1024


def run_once(
    pythonpath: str, path: str, extra: list[str], more: dict[str, str] | None = None
) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=pythonpath, **(more or {}))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvoffload", "analyze", path, "--json", *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    peak = 0.0
    while proc.poll() is None:
        peak = max(peak, tree_rss_mb(proc.pid))
        time.sleep(0.02)
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "rc": proc.returncode,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "peak_tree_rss_mb": round(peak, 1),
        "json_bytes": len(out),
        "json_hash": hash(out),
        "stderr_tail": err.decode(errors="replace")[-300:],
        "out": out,
    }


def main() -> None:
    out_path, deadline = sys.argv[1], float(sys.argv[2])
    cases = []
    for spec in sys.argv[3:]:
        name, rest = spec.split("=", 1)
        pythonpath, path, extra, runs, *more = rest.split("|")
        env = dict(kv.split("=", 1) for kv in more[0].split(",")) if more and more[0] else {}
        cases.append((name, pythonpath, path, extra.split(), int(runs), env))
    results: dict[str, list[dict[str, object]]] = {name: [] for name, *_ in cases}
    outputs: dict[str, bytes] = {}
    for round_no in range(max(c[4] for c in cases)):
        for name, pythonpath, path, extra, runs, env in cases:
            if round_no >= runs or time.time() > deadline:
                continue
            r = run_once(pythonpath, path, extra, env)
            outputs.setdefault(name, r.pop("out"))  # type: ignore[arg-type]
            r.pop("out", None)
            results[name].append(r)
            print(name, r["wall_s"], r["cpu_s"], r["peak_tree_rss_mb"], r["rc"], flush=True)
    summary = {}
    for name, rows in results.items():
        if not rows:
            continue
        walls = [float(r["wall_s"]) for r in rows]  # type: ignore[arg-type]
        summary[name] = {
            "runs": len(rows),
            "median_wall_s": round(statistics.median(walls), 3),
            "spread_wall_s": [min(walls), max(walls)],
            "median_cpu_s": round(statistics.median(float(r["cpu_s"]) for r in rows), 3),  # type: ignore[arg-type]
            "peak_tree_rss_mb": max(float(r["peak_tree_rss_mb"]) for r in rows),  # type: ignore[arg-type]
            "rc": sorted({int(r["rc"]) for r in rows}),  # type: ignore[call-overload]
        }
    # Which cases printed the same JSON (the source path differs between files: replaced).
    same: dict[str, list[str]] = {}
    for name, body in outputs.items():
        case_path = next(c[2] for c in cases if c[0] == name)
        key = str(hash(body.replace(case_path.encode(), b"FILE")))
        same.setdefault(key, []).append(name)
    report = {"summary": summary, "same_json_groups": list(same.values()), "runs": results}
    with open(out_path, "w") as fh:
        json.dump(report, fh, indent=1)
    print(json.dumps({"summary": summary, "same_json_groups": list(same.values())}, indent=1))


if __name__ == "__main__":
    main()
