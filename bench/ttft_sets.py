"""The real vLLM 0.26.0 TTFT sets, ready to analyze: every offload server and its no-offload twin.

What: one `Case` per offload server of ../shared/reference's TTFT sets (truth.csv: 29 rows) and of
bench/real's own runs, with the recording and KV-event file of the server and of its twin.
Why: the accuracy benchmark (bench/ttft_accuracy.py) judges the verdict on all of them, and the
raw captures (per-second .prom snapshots, raw ZMQ frames) need building into kvoffload's inputs
once; they are cached in bench/.ttft-data (git-ignored) and rebuilt when missing.
"""

from __future__ import annotations

import csv
import importlib.util
import lzma
import random
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT.parent / "shared" / "reference"
CACHE = ROOT / "bench" / ".ttft-data"
REAL = ROOT / "bench" / "real" / "results"
# Run to run, the same configuration's effect moved with an SD of ~4.2 ms
# (reference/vllm-0.26-h200-ttft-2/README.md): one run's truth carries it.
RUN_TO_RUN_SD_MS = 4.2


@dataclass(frozen=True)
class Case:
    """One offload server, its no-offload twin and the clients' measured effect of the tier."""

    set: str  # the reference set (or "bench/real")
    config: str  # the configuration (servers that got the same requests)
    server: str
    twin: str
    model: str
    cpu_gib: float
    effect_ms: float  # client mean TTFT with the tier − without (negative: the tier helped)
    sigma_ms: float  # one run's noise: sampling and run to run
    recording: Path
    events: Path | None
    twin_recording: Path
    twin_events: Path | None
    aside: bool = False  # kept aside: not among the 29 the done-when counts

    @property
    def name(self) -> str:
        return f"{self.config}/{self.server}"


def _build_module():  # the fixture builder's functions, one copy of them
    path = ROOT / "tests" / "fixtures" / "vllm-0.26-h200-ttft" / "build.py"
    spec = importlib.util.spec_from_file_location("ttft_fixture_build", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _unpacked(archive: str) -> Path:
    """The folder an archive of reference/ unpacks to, under the cache."""
    if not archive.endswith(".tar.xz"):
        return REFERENCE / archive
    raw = CACHE / "raw" / archive.removesuffix(".tar.xz")
    if not raw.exists():
        raw.mkdir(parents=True)
        subprocess.run(["tar", "-xJf", str(REFERENCE / archive), "-C", str(raw)], check=True)
    return raw


def _snapshots_dir(source: str) -> Path:
    """truth.csv's `source` (archive:path/snapshots/server, or set folder) → the set's folder."""
    if ":" in source:
        archive, inner = source.split(":", 1)
        return _unpacked(archive) / inner.split("/snapshots/")[0]
    return REFERENCE / source


def _events_of(set_dir: Path, server: str) -> Path | None:
    for name in (f"{server}.bin.xz", f"{server}.bin"):
        if (set_dir / "events" / name).exists():
            return set_dir / "events" / name
    return None


def _built(set_dir: Path, server: str, out: Path) -> tuple[Path, Path | None]:
    """The server's recording and event file in kvoffload's formats (built once)."""
    build = None
    recording = out / f"{server}.om"
    if not recording.exists():
        build = build or _build_module()
        out.mkdir(parents=True, exist_ok=True)
        data = build.build_recording(set_dir / "snapshots" / server, f"127.0.0.1:{server}")
        recording.write_bytes(lzma.decompress(data))
    raw = _events_of(set_dir, server)
    if raw is None:
        return recording, None
    events = out / f"{server}.kvev"
    if not events.exists():
        build = build or _build_module()
        if raw.suffix != ".xz":  # the builder reads xz
            compressed = out / f"{server}.bin.xz"
            compressed.write_bytes(lzma.compress(raw.read_bytes(), preset=0))
            raw = compressed
        events.write_bytes(lzma.decompress(build.build_events(raw)))
    return recording, events


def reference_cases() -> list[Case]:
    """The 29 offload servers of truth.csv, their files built."""
    cases = []
    with (REFERENCE / "vllm-0.26-h200-ttft-2" / "truth.csv").open() as fh:
        for row in csv.DictReader(fh):
            set_dir = _snapshots_dir(row["source"])
            out = CACHE / row["set"] / row["config"]
            recording, events = _built(set_dir, row["server"], out)
            twin_recording, twin_events = _built(set_dir, row["twin"], out)
            cases.append(
                Case(
                    row["set"],
                    row["config"],
                    row["server"],
                    row["twin"],
                    row["model"],
                    float(row["cpu_gib"]),
                    float(row["effect_ms"]),
                    float(row["sigma_ms"]),
                    recording,
                    events,
                    twin_recording,
                    twin_events,
                )
            )
    return cases


def client_effect(requests_csv: Path, server: str, twin: str, seed: int = 0) -> tuple[float, float]:
    """(effect, σ) in ms the way truth.csv has them: the difference of client means, its
    sampling SD from 2,000 draws of 2 s blocks of send time per server, and the run-to-run SD."""
    rows: dict[str, list[tuple[float, float]]] = {server: [], twin: []}
    with requests_csv.open() as fh:
        for row in csv.DictReader(fh):
            if (
                row["server"] in rows
                and row.get("phase", "measure") != "warmup"
                and not row["error"]
            ):
                rows[row["server"]].append((float(row["t_send"]), float(row["ttft_ms"])))
    rng = random.Random(seed)

    def blocks(points: list[tuple[float, float]]) -> list[list[float]]:
        start = min(t for t, _ in points)
        grouped: dict[int, list[float]] = {}
        for t, v in points:
            grouped.setdefault(int((t - start) // 2.0), []).append(v)
        return list(grouped.values())

    def draw(groups: list[list[float]]) -> float:
        picked = [v for _ in groups for v in rng.choice(groups)]
        return sum(picked) / len(picked)

    on, off = blocks(rows[server]), blocks(rows[twin])
    mean = statistics.fmean(v for _, v in rows[server]) - statistics.fmean(v for _, v in rows[twin])
    within = statistics.stdev(draw(on) - draw(off) for _ in range(2000))
    return mean, (within**2 + RUN_TO_RUN_SD_MS**2) ** 0.5


# bench/real's runs (made by this project's driver): folder, twin, the offload servers.
_REAL_RUNS = {
    "qwen3-8b-long-cudagraph-kv5g": ("Qwen3-8B", "nooffload", {"cpu16": 16.0, "cpu8": 8.0}),
    "qwen3-0.6b-rag-cudagraph-kv1.5g": ("Qwen3-0.6B", "nooffload", {"cpu4": 4.0, "cpu2": 2.0}),
    # round 3's longer runs (>= 90 s, >= 400 requests a server; new shapes)
    "qwen3-4b-rag-c16-kv3g": ("Qwen3-4B", "nooffload", {"cpu8": 8.0}),
    "qwen3-14b-long-c4-kv6g": ("Qwen3-14B", "nooffload", {"cpu16": 16.0}),
}


def _xz_cached(path: Path, out: Path) -> Path:
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(lzma.decompress(path.read_bytes()))
    return out


def _real_files(base: Path, out: Path, server: str) -> tuple[Path, Path | None]:
    """A bench/real server's recording and KV events, unpacked once into the cache."""
    rec = _xz_cached(base / "rec" / f"{server}.om.xz", out / f"{server}.om")
    kvev = base / "rec" / f"{server}.om.kvev.xz"
    return rec, _xz_cached(kvev, out / f"{server}.kvev") if kvev.exists() else None


def real_cases(runs: dict[str, tuple[str, str, dict[str, float]]] | None = None) -> list[Case]:
    """bench/real's runs, kept aside (the model was not judged on them when it was built)."""
    cases = []
    for folder, (model, twin, servers) in (runs or _REAL_RUNS).items():
        base = REAL / folder
        if not (base / "requests.csv").exists():
            continue
        out = CACHE / "bench-real" / folder
        twin_rec, twin_ev = _real_files(base, out, twin)
        for server, gib in servers.items():
            effect, sigma = client_effect(base / "requests.csv", server, twin)
            rec, ev = _real_files(base, out, server)
            cases.append(
                Case(
                    "bench/real",
                    folder,
                    server,
                    twin,
                    model,
                    gib,
                    effect,
                    sigma,
                    rec,
                    ev,
                    twin_rec,
                    twin_ev,
                    aside=True,
                )
            )
    return cases


def all_cases() -> list[Case]:
    return reference_cases() + real_cases()


if __name__ == "__main__":
    for case in all_cases():
        print(f"{case.name:32s} {case.effect_ms:+8.1f} ± {case.sigma_ms:5.1f} ms  {case.recording}")
