#!/usr/bin/env python3
"""kvoffload's advice vs the TTFT the clients measured, for one results folder of orch.py.

Runs on any machine (no GPU). For each server of the folder:
  * client TTFT over the measured requests (requests.csv, phase == measure, no error):
    mean / p50 / p90, and the difference of the mean to the server without offloading;
  * vLLM's own histograms over the recording (first and last scrape of rec/<srv>.om[.xz]):
    mean TTFT, queue time, prefill time (Δsum / Δcount);
  * the live sidecar's view (sidecar/<srv>.sidecar.json, saved 3 s after the last response):
    action, size, and the TTFT fields of the contract when it has them;
  * the same from `kvoffload analyze rec/<srv>.om --events rec/<srv>.om.kvev --json`, run now
    with the checkout's code (so newer advisor code can be judged on old captures).
Fields that an older or newer kvoffload lacks print as '–'; every other field whose name holds
`ttft` is listed under the tables. Writes compare.md and compare.json into the folder.

usage: .venv/bin/python bench/real/compare.py bench/real/results/<config> [--no-analyze]
       [--kvoffload 'CMD'] [--threshold KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import csv
import json
import lzma
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DASH = "–"
# The TTFT fields of the JSON contract worth a column (present or not, depending on the version).
TTFT_COLUMNS = [
    ("figures", "offload_ttft_effect_seconds"),
    ("recommendation", "ttft_change_seconds"),
    ("recommendation", "ttft_change_basis"),
    ("recommendation", "ttft_change_range_seconds"),
]
HISTS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
}
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+(\S+))?\s*$")


# ------------------------------------------------------------------ inputs
def find(path: str) -> str | None:
    """`path`, or `path.xz` when only the compressed copy is there."""
    for p in (path, path + ".xz"):
        if os.path.exists(p):
            return p
    return None


def opened(path: str):
    return (
        lzma.open(path, "rt", encoding="utf-8")
        if path.endswith(".xz")
        else open(path, encoding="utf-8")
    )


def plain_copy(path: str, tmp: str) -> str:
    """A decompressed copy of `path` in `tmp` when it is .xz (analyze reads plain files)."""
    if not path.endswith(".xz"):
        return path
    dst = os.path.join(tmp, os.path.basename(path)[:-3])
    with lzma.open(path, "rb") as src, open(dst, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
    return dst


def servers_of(folder: str) -> list[tuple[str, dict]]:
    info_path = os.path.join(folder, "servers.json")
    if os.path.exists(info_path):
        with open(info_path) as f:
            data = json.load(f)
        servers = data.get("servers", data)
        order = (data.get("meta") or {}).get("order") or list(servers)
        return [(n, servers[n]) for n in order if n in servers]
    names = sorted({f.split(".")[0] for f in os.listdir(os.path.join(folder, "rec"))})
    return [(n, {}) for n in names]


def client_ttft(folder: str, server: str) -> dict:
    rows = []
    with open(os.path.join(folder, "requests.csv"), newline="") as f:
        for r in csv.DictReader(f):
            if r["server"] == server and r["phase"] == "measure":
                rows.append(r)
    by_req = {
        int(r["req"]): float(r["ttft_ms"]) / 1e3 for r in rows if not r["error"] and r["ttft_ms"]
    }
    ok = sorted(by_req.values())
    prompt = sum(int(r["prompt_tokens"] or 0) for r in rows)
    cached = sum(int(r["cached_tokens"] or 0) for r in rows)
    if not ok:
        return dict(n=0, errors=len(rows))

    def pct(q):  # nearest rank, as orch.py logs it
        return ok[min(len(ok) - 1, int(q * len(ok)))]

    return dict(
        n=len(ok),
        errors=len(rows) - len(ok),
        mean=sum(ok) / len(ok),
        p50=pct(0.5),
        p90=pct(0.9),
        cached_share=cached / prompt if prompt else None,
        by_req=by_req,
    )


def histogram_means(om_path: str) -> dict:
    """Δsum/Δcount of vLLM's histograms between the first and last scrape of the recording."""
    wanted = {
        f"{base}_{suffix}": (key, suffix)
        for key, base in HISTS.items()
        for suffix in ("sum", "count")
    }
    series: dict[tuple[str, str], dict[float, float]] = {}
    with opened(om_path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            m = SAMPLE.match(line)
            if not m or m.group(1) not in wanted or m.group(4) is None:
                continue
            series.setdefault((m.group(1), m.group(2) or ""), {})[float(m.group(4))] = float(
                m.group(3)
            )
    stamps = sorted({t for v in series.values() for t in v})
    out: dict = {"scrapes": len(stamps)}
    if len(stamps) < 2:
        return out
    t0, t1 = stamps[0], stamps[-1]
    out["window_s"] = t1 - t0
    delta: dict[tuple[str, str], float] = {}
    for (name, _labels), points in series.items():
        key, suffix = wanted[name]
        if t0 in points and t1 in points:
            delta[(key, suffix)] = delta.get((key, suffix), 0.0) + points[t1] - points[t0]
    for key in HISTS:
        n = delta.get((key, "count"))
        if n:
            out[key] = delta[(key, "sum")] / n
            out[f"{key}_n"] = n
    return out


def run_analyze(cmd: list[str], om: str, kvev: str | None, thresholds: list[str]) -> dict:
    args = [*cmd, "analyze", om, "--json"]
    if kvev:
        args += ["--events", kvev]
    for t in thresholds:
        args += ["--threshold", t]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "exporter") + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        return {"error": f"rc={r.returncode}: {r.stderr.strip()[-400:]}", "command": args}
    data = json.loads(r.stdout)
    data["command"] = args
    return data


# ------------------------------------------------------------------ the contract, generically
def first_group(doc: dict | None) -> dict | None:
    if not doc or not isinstance(doc.get("groups"), list) or not doc["groups"]:
        return None
    return doc["groups"][0]


def ttft_fields(obj, path="") -> dict:
    """Every field whose name holds 'ttft', anywhere in the group, by dotted path."""
    found = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = f"{path}.{k}" if path else str(k)
            if "ttft" in str(k).lower():
                found[p] = v  # a whole `ttft` object: its inner fields are in it
            elif isinstance(v, dict | list):
                found.update(ttft_fields(v, p))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            if isinstance(v, dict | list):
                found.update(ttft_fields(v, f"{path}[{i}]"))
    return found


def advice(group: dict | None) -> dict:
    if group is None:
        return {}
    rec = group.get("recommendation") or {}
    out = dict(
        action=rec.get("action"),
        size_gib=rec.get("kv_offloading_size_gib"),
        reasons=rec.get("reasons") or [],
        warnings=rec.get("warnings") or [],
        offloading=group.get("offloading"),
        window_seconds=group.get("window_seconds"),
    )
    for section, key in TTFT_COLUMNS:
        sec = group.get(section) or {}
        out[key] = sec[key] if isinstance(sec, dict) and key in sec else None
        out[f"has_{key}"] = isinstance(sec, dict) and key in sec
    out["ttft_fields"] = ttft_fields(group)
    return out


# ------------------------------------------------------------------ formatting
def ms(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return DASH
    return f"{x * 1e3:.1f}"


def val(x) -> str:
    if x is None:
        return DASH
    if isinstance(x, float):
        return f"{x:.4g}"
    if isinstance(x, list | tuple):
        return "[" + ", ".join(val(v) for v in x) + "]"
    if isinstance(x, dict):
        return json.dumps(x, separators=(",", ":"))
    return str(x)


def counterpart(r: dict, ad: dict, results: list[dict]) -> str:
    """What the runs measured for the advised change: mean TTFT at the advised CPU size minus
    mean TTFT at this server's size (in s), when both sizes were run; '–' otherwise."""
    by_size = {(x["cpu_gib"] or 0): x["client"]["mean"] for x in results if x["client"].get("n")}
    cur = r["cpu_gib"] or 0
    action, size = ad.get("action"), ad.get("size_gib")
    target = {"disable": 0, "keep": cur}.get(action, size)
    if target is None or cur not in by_size:
        return DASH
    if target in by_size:
        return f"{by_size[target] - by_size[cur]:+.4f}"
    return f"{DASH} ({target:g} GiB not run)"


def table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--no-analyze", action="store_true", help="skip `kvoffload analyze`")
    ap.add_argument(
        "--kvoffload",
        default=None,
        help="command that runs kvoffload (default: this python -m kvoffload, "
        "with the checkout's exporter/ on PYTHONPATH)",
    )
    ap.add_argument(
        "--threshold",
        action="append",
        default=None,
        help="passed to analyze (default: min_window_seconds=10, as the sidecar ran)",
    )
    ap.add_argument("--no-write", action="store_true", help="print only")
    a = ap.parse_args()
    folder = a.folder.rstrip("/")
    cmd = shlex.split(a.kvoffload) if a.kvoffload else [sys.executable, "-m", "kvoffload"]
    thresholds = a.threshold if a.threshold is not None else ["min_window_seconds=10"]

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, info in servers_of(folder):
            r = dict(server=name, cpu_gib=info.get("cpu_gib"), skipped=info.get("skipped"))
            r["client"] = client_ttft(folder, name)
            om = find(os.path.join(folder, "rec", f"{name}.om"))
            kvev = find(os.path.join(folder, "rec", f"{name}.om.kvev"))
            r["recording"] = os.path.relpath(om, folder) if om else None
            r["events"] = os.path.relpath(kvev, folder) if kvev else None
            r["vllm"] = histogram_means(om) if om else {}
            side_path = os.path.join(folder, "sidecar", f"{name}.sidecar.json")
            side = None
            if os.path.exists(side_path):
                with open(side_path) as f:
                    side = json.load(f)
            r["sidecar"] = advice(first_group(side))
            if om and not a.no_analyze:
                print(f"analyze {name} ...", file=sys.stderr, flush=True)
                doc = run_analyze(
                    cmd, plain_copy(om, tmp), plain_copy(kvev, tmp) if kvev else None, thresholds
                )
                r["analyze_error"] = doc.get("error")
                r["analyze_command"] = " ".join(shlex.quote(c) for c in doc.get("command", []))
                r["analyze"] = advice(first_group(doc))
            else:
                r["analyze"] = {}
            results.append(r)

    base = next((r for r in results if not r["cpu_gib"] and r["client"].get("n")), None)
    for r in results:
        c = r["client"]
        r["measured_delta_mean_s"] = (
            c["mean"] - base["client"]["mean"] if base and c.get("n") and r is not base else None
        )
        r["measured_delta_p50_s"] = (
            c["p50"] - base["client"]["p50"] if base and c.get("n") and r is not base else None
        )
        # the same requests on both servers (a workload cut short by the deadline has fewer)
        common = (
            sorted(set(c.get("by_req", {})) & set(base["client"].get("by_req", {})))
            if base and r is not base
            else []
        )
        r["common_requests"] = len(common)
        r["measured_delta_mean_common_s"] = (
            sum(c["by_req"][q] - base["client"]["by_req"][q] for q in common) / len(common)
            if common
            else None
        )

    rows1 = []
    for r in results:
        c, v = r["client"], r["vllm"]
        rows1.append(
            [
                r["server"],
                f"{r['cpu_gib']} GiB" if r["cpu_gib"] else "none",
                str(c.get("n", 0)) + (f" ({c['errors']} err)" if c.get("errors") else ""),
                ms(c.get("mean")),
                ms(c.get("p50")),
                ms(c.get("p90")),
                ms(r["measured_delta_mean_s"]) if r["measured_delta_mean_s"] is not None else DASH,
                (
                    f"{ms(r['measured_delta_mean_common_s'])} ({r['common_requests']})"
                    if r["measured_delta_mean_common_s"] is not None
                    else DASH
                ),
                val(c.get("cached_share")),
                ms(v.get("ttft")),
                ms(v.get("queue")),
                ms(v.get("prefill")),
                f"{v['window_s']:.0f} s / {v['scrapes']}" if "window_s" in v else DASH,
            ]
        )
    t1 = table(
        [
            "server",
            "CPU tier",
            "measured req",
            "client TTFT mean (ms)",
            "p50",
            "p90",
            "Δ mean vs no-offload (ms)",
            "Δ mean, same requests (ms, n)",
            "cached share (client)",
            "vLLM TTFT mean (ms)",
            "vLLM queue mean",
            "vLLM prefill mean",
            "recording window / scrapes",
        ],
        rows1,
    )

    rows2 = []
    for r in results:
        for src in ("sidecar", "analyze"):
            ad = r[src]
            label = "sidecar (live)" if src == "sidecar" else "analyze (now)"
            if not ad:
                err = r.get("analyze_error") if src == "analyze" else None
                rows2.append(
                    [r["server"], label, err[:80] if err else "(none)"]
                    + [DASH] * (3 + len(TTFT_COLUMNS))
                )
                continue
            cells = [r["server"], label, val(ad.get("action")), val(ad.get("size_gib"))]
            for _sec, key in TTFT_COLUMNS:
                cells.append(val(ad[key]) if ad.get(f"has_{key}") else DASH)
            d = r["measured_delta_mean_s"]
            cells.append(f"{d:+.4f}" if d is not None else DASH)
            cells.append(counterpart(r, ad, results))
            rows2.append(cells)
    t2 = table(
        ["server", "source", "action", "size GiB"]
        + [k for _s, k in TTFT_COLUMNS]
        + ["measured effect of this tier (s)", "measured change for the action (s)"],
        rows2,
    )

    detail = []
    for r in results:
        for src in ("sidecar", "analyze"):
            ad = r[src]
            if not ad:
                continue
            extra = {
                k: v
                for k, v in ad["ttft_fields"].items()
                if k not in {f"{s}.{k2}" for s, k2 in TTFT_COLUMNS}
            }
            detail.append(
                f"- **{r['server']} / {src}**: reasons: "
                + ("; ".join(ad["reasons"]) or DASH)
                + (f" — warnings: {'; '.join(ad['warnings'])}" if ad["warnings"] else "")
                + (
                    " — other ttft fields: "
                    + ", ".join(f"`{k}` = {val(v)}" for k, v in extra.items())
                    if extra
                    else ""
                )
            )

    md = [
        f"# {os.path.basename(folder)}: kvoffload's advice vs measured TTFT",
        "",
        "Client TTFT: measured requests only (no warm-up). vLLM means: Δsum/Δcount of its "
        "histograms between the first and last scrape of the recording. Δ: this server's mean "
        "minus the no-offload server's (negative = offloading faster).",
        "",
        t1,
        "",
        "Advice: the live sidecar (its /api/v1/status 3 s after the last response) and "
        "`kvoffload analyze <rec>.om --events <rec>.om.kvev --json "
        + " ".join(f"--threshold {t}" for t in thresholds)
        + "` run with this checkout's code. '–': the field is not in that JSON. "
        "Measured effect of this tier: client mean TTFT of this server minus the no-offload "
        "server's (compare with `offload_ttft_effect_seconds`). Measured change for the "
        "action: client mean TTFT of the server that ran the advised CPU size (0 for disable) "
        "minus this server's (compare with `ttft_change_seconds`), when that size was run.",
        "",
        t2,
        "",
        *detail,
        "",
    ]
    for r in results:
        if r.get("skipped"):
            md.append(f"- {r['server']}: skipped ({r['skipped']})")
    text = "\n".join(md)
    print(text)
    if not a.no_write:
        with open(os.path.join(folder, "compare.md"), "w") as f:
            f.write(text)
        with open(os.path.join(folder, "compare.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
