"""vLLM's container memory (ingest.hostmemory, #27 item 3): cgroup v2 and v1 directories as the
kernel lays them out, this machine's own cgroup, a real process holding shared memory as vLLM's
pinned tier does, hostile files, and a live sidecar exporting kvoffload_host_memory_* and warning
of an OOM."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from kvoffload.analysis.advisor import GIB, Recommendation, _memory_check, memory_budget
from kvoffload.ingest import hostmemory
from kvoffload.ingest.hostmemory import (
    FOOTPRINT_BOUND,
    HostMemory,
    HostMemoryError,
    footprint_ratio,
    read_cgroup,
    read_host_memory,
)
from kvoffload.thresholds import Thresholds as AdvisorThresholds

from helpers import free_port

KVO = [sys.executable, "-m", "kvoffload"]
UID = "1d7f3c1e_2b4a_4c5d_8e9f_0a1b2c3d4e5f"


def write_v2(d: Path, current: int, limit: str, anon: int, shmem: int, file: int, kills=0) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "memory.current").write_text(f"{current}\n")
    (d / "memory.max").write_text(f"{limit}\n")
    # memory.stat as a 6.x kernel writes it (shmem is part of file there).
    (d / "memory.stat").write_text(
        f"anon {anon}\nfile {file}\nkernel 36700160\nkernel_stack 1000\nshmem {shmem}\n"
        "file_mapped 8306688\nunevictable 0\nactive_anon 1531904\n"
    )
    (d / "memory.events").write_text(f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {kills}\n")
    return d


def test_a_cgroup_v2_directory(tmp_path: Path) -> None:
    d = write_v2(tmp_path / "cg", 19_824_775_168, str(64 * GIB), 1_799_491_584, 15_078_789_120,
                 17_842_679_808, kills=2)  # fmt: skip
    cg = read_cgroup(str(d))
    assert cg.usage_bytes == 19_824_775_168
    assert cg.limit_bytes == 64 * GIB
    assert cg.stat == {
        "anon": 1_799_491_584,
        "file": 17_842_679_808,
        "shmem": 15_078_789_120,
        "unevictable": 0,
        "kernel": 36_700_160,
    }
    assert cg.oom_kills == 2
    (d / "memory.max").write_text("max\n")
    assert read_cgroup(str(d)).limit_bytes is None


def test_a_cgroup_v1_directory(tmp_path: Path) -> None:
    """v1 (this machine's layout): usage_in_bytes, the unlimited sentinel, hierarchical totals."""
    d = tmp_path / "memory" / "process_api" / "abc"
    d.mkdir(parents=True)
    (d / "memory.usage_in_bytes").write_text("751955968\n")
    (d / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (d / "memory.stat").write_text(
        "cache 10469376\nrss 5419008\nshmem 9797632\nunevictable 13680640\n"
        "total_cache 1772900352\ntotal_rss 624738304\ntotal_shmem 9797632\n"
        "total_unevictable 13680640\n"
    )
    (d / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 4\n")
    cg = read_cgroup(str(d))
    assert cg.usage_bytes == 751955968 and cg.limit_bytes is None
    assert cg.stat == {
        "anon": 624738304,
        "file": 1772900352,
        "shmem": 9797632,
        "unevictable": 13680640,
    }
    assert cg.oom_kills == 4
    (d / "memory.limit_in_bytes").write_text(f"{32 * GIB}\n")
    assert read_cgroup(str(d)).limit_bytes == 32 * GIB
    self_cgroup = tmp_path / "self"
    self_cgroup.write_text("9:name=systemd:/\n4:memory:/process_api/abc\n0::/\n")
    assert hostmemory._own_cgroup(str(tmp_path), str(self_cgroup)) == str(d)


def test_the_pod_less_the_sidecars_own(tmp_path: Path) -> None:
    """Without a cgroup namespace the pod's cgroup is the parent of the sidecar's: vLLM's
    container is the pod less the sidecar (its usage, its shared memory, its limit)."""
    pod = tmp_path / "kubepods.slice" / f"kubepods-burstable-pod{UID}.slice"
    write_v2(pod, 31 * GIB, str(48 * GIB + 256 * 2**20), 3 * GIB, 28 * GIB, 29 * GIB)
    own = write_v2(pod / "cri-containerd-0a1b2c.scope", 60 * 2**20, str(256 * 2**20),
                   50 * 2**20, 0, 10 * 2**20)  # fmt: skip
    self_cgroup = tmp_path / "self"
    self_cgroup.write_text(f"0::/{own.relative_to(tmp_path)}\n")
    reading = read_host_memory("auto", str(tmp_path), str(tmp_path / "noproc"), str(self_cgroup))
    assert reading.source == "pod" and reading.problem is None
    cg = reading.cgroup
    assert cg is not None
    assert cg.usage_bytes == 31 * GIB - 60 * 2**20
    assert cg.limit_bytes == 48 * GIB
    assert cg.stat["shmem"] == 28 * GIB and cg.stat["anon"] == 3 * GIB - 50 * 2**20


def test_not_visible_says_what_would_make_it(tmp_path: Path) -> None:
    """In a cgroup namespace with no vLLM process in sight: no numbers, and the reason."""
    self_cgroup = tmp_path / "self"
    self_cgroup.write_text("0::/\n")
    reading = read_host_memory("auto", str(tmp_path), str(tmp_path / "noproc"), str(self_cgroup))
    assert reading.source == "none" and reading.cgroup is None
    assert reading.problem is not None and "--host-memory.cgroup" in reading.problem
    assert read_host_memory("off").source == "off"


def test_this_machines_own_cgroup() -> None:
    own = hostmemory._own_cgroup(hostmemory.CGROUP_ROOT, "/proc/self/cgroup")
    if own is None or not any(
        os.path.isfile(os.path.join(own, f)) for f in ("memory.current", "memory.usage_in_bytes")
    ):
        pytest.skip(f"this machine's cgroup ({own}) has no memory files to read")
    cg = read_cgroup(own)
    # This process alone holds more than 10 MB, and its cgroup counts it.
    assert cg.usage_bytes > 10e6
    assert "anon" in cg.stat and cg.stat["anon"] > 0
    assert read_host_memory(own).source == "explicit"


# A FIFO opened plainly would block forever: the timeout fails that hang, no clock is asserted.
@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "huge", "garbage", "negative", "symlink", "missing"])
def test_a_hostile_cgroup_file_is_a_one_line_problem(tmp_path: Path, kind: str) -> None:
    """A FIFO must not hang the reader, /dev/zero must not fill memory, garbage must not crash."""
    d = write_v2(tmp_path / "cg", 1, "max", 1, 1, 1)
    current = d / "memory.current"
    current.unlink()
    if kind == "fifo":
        os.mkfifo(current)
    elif kind == "huge":
        current.write_text("1" * (1 << 20))
    elif kind == "garbage":
        current.write_text("\x1b[2Jnot a number\n")
    elif kind == "negative":
        current.write_text("-5\n")
    elif kind == "symlink":
        current.symlink_to("/dev/zero")
    with pytest.raises(HostMemoryError) as err:
        read_cgroup(str(d))
    assert "\n" not in str(err.value) and str(current) in str(err.value)
    reading = read_host_memory(str(d))
    assert reading.cgroup is None and reading.problem == str(err.value)


HOLDER = """
import mmap, os, sys, time
fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR, 0o600)
os.ftruncate(fd, int(sys.argv[2]))
m = mmap.mmap(fd, int(sys.argv[2]), flags=mmap.MAP_SHARED)
for i in range(0, len(m), mmap.PAGESIZE):
    m[i] = 1
print("ready", flush=True)
time.sleep(60)
"""


def test_a_real_process_named_vllm_holding_shared_memory(tmp_path: Path) -> None:
    """As vLLM 0.26.0's engine does with its pinned tier: a process whose command line names
    vllm maps 64 MiB of shared memory; its PSS shows it and the footprint is measured."""
    shm_dir = "/dev/shm" if os.access("/dev/shm", os.W_OK) else str(tmp_path)
    # (no "kvoffload" in its command line: that is a sidecar's, never counted as vLLM)
    path = os.path.join(shm_dir, f"shm-holder-{os.getpid()}")
    size = 64 * 2**20
    proc = subprocess.Popen(  # named as vLLM's engine names itself (setproctitle)
        ["VLLM::EngineCore", "-c", HOLDER, path, str(size)],
        executable=sys.executable,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert proc.pid in hostmemory.vllm_pids()
        reading = read_host_memory("auto")
        assert reading.processes is not None
        if shm_dir == "/dev/shm":
            assert reading.processes.pss_shmem_bytes >= size
            ratio, basis = reading.footprint_ratio(size / 1.5)
            assert basis == "measured" and 1.0 <= ratio <= FOOTPRINT_BOUND
        if reading.cgroup is not None:  # its cgroup is visible from here (no namespace)
            assert reading.source in ("vllm-processes", "pod")
            assert reading.cgroup.usage_bytes >= size
    finally:
        proc.kill()
        proc.wait(10)
        os.unlink(path)


def test_footprint_is_measured_or_the_bound() -> None:
    none = HostMemory("none", None, None)
    assert footprint_ratio(none, 8 * GIB) == (FOOTPRINT_BOUND, "bound")
    assert footprint_ratio(None, 8 * GIB) == (FOOTPRINT_BOUND, "bound")
    cg = hostmemory.CgroupMemory("x", 20 * GIB, 64 * GIB, {"anon": 2 * GIB, "shmem": 14 * GIB})
    seen = HostMemory("explicit", cg, None)
    # The H200 measurement: an 8 GiB tier of Qwen3-0.6B took 14.0 GiB of shared memory.
    assert footprint_ratio(seen, 8 * GIB) == (1.75, "measured")
    # Less shared memory than the tier: the tier is not in it, nothing measured.
    assert footprint_ratio(seen, 16 * GIB) == (FOOTPRINT_BOUND, "bound")
    # More than twice (other shared memory on top): never above the bound.
    assert footprint_ratio(seen, 4 * GIB) == (FOOTPRINT_BOUND, "measured")


def test_the_oom_check_uses_the_measured_footprint() -> None:
    """A 16 GiB tier in a 36 GiB container: fine at the measured 1.75x ((28 + 2) GiB × 1.2
    headroom = 36), an OOM risk at the 2x bound when nothing is read (32 GiB × 1.2 > 36)."""
    t = AdvisorThresholds()
    figures: dict[str, float | None] = {"cpu_capacity_bytes": 16 * GIB}
    cg = hostmemory.CgroupMemory("x", 33 * GIB, 36 * GIB, {"anon": 2 * GIB, "shmem": 28 * GIB})
    measured = HostMemory("explicit", cg, None)
    rec = Recommendation("keep")
    _memory_check(rec, figures, True, None, t, 1, measured)
    assert not rec.warnings
    budget = memory_budget(None, measured, 16 * GIB)
    assert budget is not None and budget.basis == "measured" and budget.ratio == 1.75
    assert budget.other_bytes == 2 * GIB
    rec = Recommendation("keep")
    _memory_check(rec, figures, True, 36 * GIB, t, 1, None)
    assert len(rec.warnings) == 1 and "risk of OOM" in rec.warnings[0]
    assert "2.00x its size in host memory (at most" in rec.warnings[0]
    # Growing to 24 GiB does not fit even measured: (24 × 1.75 + 2) × 1.2 > 36.
    grow = Recommendation("grow", 24.0)
    _memory_check(grow, figures, True, None, t, 1, measured)
    assert any("risk of OOM" in w for w in grow.warnings)


def _wait(url: str, ok, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            r = requests.get(url, timeout=5)
            if r.ok and ok(r):
                return r
            last = r.text[:300]
        except requests.RequestException as exc:
            last = str(exc)
        time.sleep(0.3)
    raise AssertionError(f"{url}: never ready ({last})")


@pytest.mark.slow
def test_a_live_sidecar_exports_host_memory_and_warns(laptop_sim: str, tmp_path: Path) -> None:
    """`serve --host-memory.cgroup DIR` next to the simulator (a 0.5 GiB tier): the cgroup's
    numbers on /metrics and /api/v1/status, the footprint at the bound, and the OOM warning
    when the limit cannot hold it."""
    d = write_v2(tmp_path / "vllm", 900 * 2**20, str(1 * GIB), 700 * 2**20, 0, 200 * 2**20,
                 kills=1)  # fmt: skip
    port = free_port()
    serve = subprocess.Popen(
        [*KVO, "serve", "--target", laptop_sim, "--interval",
         "0.5s", "--advice-warmup", "0s", "--advice-dwell", "0s", "--host-memory.cgroup", str(d),
         "--web.listen-address", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"

        def judged(r: requests.Response) -> bool:
            groups = r.json()["groups"]
            return any(g["figures"].get("cpu_capacity_bytes") for g in groups) and any(
                "risk of OOM" in w for g in groups for w in g["recommendation"]["warnings"]
            )

        status = _wait(f"{base}/api/v1/status", judged, timeout=90).json()
        host = status["host_memory"]
        assert host["source"] == "explicit" and host["problem"] is None
        assert host["cgroup"]["usage_bytes"] == 900 * 2**20
        assert host["limit_bytes"] == GIB
        (group,) = [g for g in status["groups"] if g["figures"].get("cpu_capacity_bytes")]
        tier = group["figures"]["cpu_capacity_bytes"]
        text = requests.get(f"{base}/metrics", timeout=5).text
        ours = [line for line in text.splitlines() if line.startswith("kvoffload_host_memory")]
        lines = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in ours}
        assert lines["kvoffload_host_memory_usage_bytes"] == 900 * 2**20
        assert lines["kvoffload_host_memory_unreclaimable_bytes"] == 700 * 2**20
        assert lines["kvoffload_host_memory_limit_bytes"] == GIB
        assert lines["kvoffload_host_memory_oom_kills_total"] == 1
        assert lines['kvoffload_host_memory_tier_footprint_bytes{basis="bound"}'] == 2 * tier
        assert lines['kvoffload_host_memory_read_info{problem="",source="explicit"}'] == 1
        assert "# HELP kvoffload_host_memory_unreclaimable_bytes" in text
        # The cgroup going unreadable is a problem on the page, not a crash.
        (d / "memory.current").write_text("garbage\n")
        status = _wait(
            f"{base}/api/v1/status", lambda r: r.json()["host_memory"]["problem"], timeout=40
        ).json()
        assert "is not a byte count" in status["host_memory"]["problem"]
        assert requests.get(f"{base}/metrics", timeout=5).ok
    finally:
        serve.terminate()
        serve.wait(20)
    assert "Traceback" not in (serve.stderr.read() if serve.stderr else "")


def test_serve_prometheus_refuses_the_flag() -> None:
    r = subprocess.run(
        [*KVO, "serve", "--prometheus", "http://127.0.0.1:1", "--host-memory.cgroup", "/x"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "--host-memory.cgroup" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("cmdline", "runs"),
    [
        (b"/usr/bin/python3\0/usr/local/bin/vllm\0serve\0Qwen/Qwen3-8B\0", True),
        (b"VLLM::EngineCore\0", True),
        (b"python3\0-m\0vllm.entrypoints.openai.api_server\0--model\0x\0", True),
        (b"vllm\0serve\0m\0", True),
        (b"tail\0-f\0/var/log/vllm.log\0", False),
        (b"bash\0-c\0cd /tmp/vllm-work && make\0", False),
        (b"python3\0orch.py\0--vllm-args\0x\0", False),
    ],
)
def test_only_vllms_own_processes_are_counted(cmdline: bytes, runs: bool) -> None:
    assert hostmemory._runs_vllm(cmdline) is runs
