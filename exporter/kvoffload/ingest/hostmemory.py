"""Host memory of the container vLLM runs in: what its pinned CPU tier really takes, and the limit.

Why: the pinned tier counts against the container's limit. And vLLM 0.26.0 takes more than
`--kv-offloading-size` for it (vLLM #53042: ~1.92× as shared memory).
"""

from __future__ import annotations

import itertools
import os
import re
import stat
from dataclasses import dataclass, field

CGROUP_ROOT = "/sys/fs/cgroup"
# memory.stat keys kept: what the tier can show up as (pinned pages: anon or shmem, unevictable).
STAT_KEYS = ("anon", "file", "shmem", "unevictable", "kernel")
# A cgroup file is a few lines; anything longer is not one (a planted FIFO or a huge file).
_MAX_FILE = 1 << 16
# Processes scanned for vLLM's at most (a PID namespace holding more is not a vLLM pod's).
_MAX_PROCESSES = 4096
# vLLM 0.26.0 pins one CPU tensor per KV layer (torch.zeros(pin_memory=True)); torch's pinned
# allocator rounds each up to a power of two, so a tier takes between 1x and 2x its size, as
# shared memory (on the H200: 8 GiB -> 14.0 GiB and 24 GiB -> 28.0 GiB for Qwen3-0.6B's 28
# layers, bench/real/results/host-memory). Until a reading shows it, the bound is assumed.
FOOTPRINT_BOUND = 2.0
_POD_CGROUP = re.compile(r"pod[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_]")


# The cgroup files say what is taken; vLLM's processes, where visible, say how much is theirs.
class HostMemoryError(Exception):
    """A cgroup that cannot be read as one (the message is one line, for the page)."""


@dataclass(frozen=True)
class CgroupMemory:
    """One cgroup's memory (v2 files), in bytes; the limit is None when unlimited."""

    path: str
    usage_bytes: float
    limit_bytes: float | None
    stat: dict[str, float] = field(default_factory=dict)
    oom_kills: float | None = None

    def less(self, other: CgroupMemory) -> CgroupMemory:
        """This cgroup without a child's share (the pod less the sidecar's own container)."""
        limit = self.limit_bytes
        if limit is not None and other.limit_bytes is not None and other.limit_bytes < limit:
            limit -= other.limit_bytes
        kept = {k: max(v - other.stat.get(k, 0.0), 0.0) for k, v in self.stat.items()}
        return CgroupMemory(
            self.path,
            max(self.usage_bytes - other.usage_bytes, 0.0),
            limit,
            kept,
            self.oom_kills,
        )


@dataclass(frozen=True)
class ProcessMemory:
    """vLLM's processes as this process sees them (smaps_rollup PSS: shared pages split)."""

    processes: int
    pss_bytes: float
    pss_anon_bytes: float
    pss_shmem_bytes: float
    pss_file_bytes: float


@dataclass(frozen=True)
class HostMemory:
    """One reading: the cgroup (None when none is visible, with why) and vLLM's processes."""

    source: str  # how the cgroup was found: explicit, pod, vllm-processes, or none
    cgroup: CgroupMemory | None
    processes: ProcessMemory | None
    problem: str | None = None
    given_limit_bytes: float | None = None  # --memory-limit: wins over the cgroup's

    @property
    def limit_bytes(self) -> float | None:
        if self.given_limit_bytes is not None:
            return self.given_limit_bytes
        return self.cgroup.limit_bytes if self.cgroup is not None else None

    @property
    def shmem_bytes(self) -> float | None:
        """Shared memory vLLM's pinned tier lives in: its processes' own where visible."""
        if self.processes is not None and self.processes.pss_shmem_bytes > 0:
            return self.processes.pss_shmem_bytes
        if self.cgroup is not None:
            return self.cgroup.stat.get("shmem")
        return None

    def footprint_ratio(self, tier_bytes: float | None) -> tuple[float, str]:
        """Host bytes the tier takes per configured byte, and how that is known.

        It is "measured" when the shared memory shows at least the tier, else "bound".
        """
        return footprint_ratio(self, tier_bytes)

    def to_json(self) -> dict[str, object]:
        cg = self.cgroup
        return {
            "source": self.source,
            "cgroup": None
            if cg is None
            else {
                "path": cg.path,
                "usage_bytes": cg.usage_bytes,
                "limit_bytes": cg.limit_bytes,
                "stat": cg.stat,
                "oom_kills": cg.oom_kills,
            },
            "processes": None if self.processes is None else vars(self.processes),
            "limit_bytes": self.limit_bytes,
            "problem": self.problem,
        }


def footprint_ratio(reading: HostMemory | None, tier_bytes: float | None) -> tuple[float, str]:
    """See HostMemory.footprint_ratio; None readings and no tier give the bound."""
    shmem = reading.shmem_bytes if reading is not None else None
    if not tier_bytes or tier_bytes <= 0 or shmem is None or shmem < tier_bytes:
        return FOOTPRINT_BOUND, "bound"
    # Other shared memory (NCCL, a multimodal cache) can come on top: never above the bound.
    return min(shmem / tier_bytes, FOOTPRINT_BOUND), "measured"


def _read_small(path: str) -> str:
    """A kernel file's text; refuses what is not a regular file (a FIFO would hang the read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as exc:
        raise HostMemoryError(f"{path}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise HostMemoryError(f"{path}: not a regular file")
        data = os.read(fd, _MAX_FILE + 1)
    except OSError as exc:
        raise HostMemoryError(f"{path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > _MAX_FILE:
        raise HostMemoryError(f"{path}: over {_MAX_FILE} bytes, not a cgroup file")
    return data.decode("ascii", "replace")


def _number(text: str, path: str) -> float:
    try:
        value = int(text.strip())
    except ValueError:
        raise HostMemoryError(f"{path}: {text.strip()[:40]!r} is not a byte count") from None
    if value < 0:
        raise HostMemoryError(f"{path}: negative byte count {value}")
    return float(value)


def _keyed(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = float(parts[1])
    return out


def read_cgroup(directory: str) -> CgroupMemory:
    """One cgroup directory's memory: v2 (memory.current, .max, .stat, .events) or v1
    (memory.usage_in_bytes, .limit_in_bytes, .stat's hierarchical totals, .oom_control)."""
    if os.path.exists(os.path.join(directory, "memory.usage_in_bytes")):
        return _read_v1(directory)
    current = os.path.join(directory, "memory.current")
    usage = _number(_read_small(current), current)
    limit_path = os.path.join(directory, "memory.max")
    try:
        raw = _read_small(limit_path).strip()
        limit = None if raw == "max" else _number(raw, limit_path)
    except HostMemoryError:
        limit = None  # the root cgroup has no memory.max: unlimited
    counts = _optional_keyed(os.path.join(directory, "memory.stat"))
    events = _optional_keyed(os.path.join(directory, "memory.events"))
    return CgroupMemory(
        directory,
        usage,
        limit,
        {k: counts[k] for k in STAT_KEYS if k in counts},
        events.get("oom_kill"),
    )


# v1 names of the v2 memory.stat keys kept (the hierarchical totals: children included).
_V1_STAT = {
    "anon": "total_rss",
    "file": "total_cache",
    "shmem": "total_shmem",
    "unevictable": "total_unevictable",
}
# v1 writes "no limit" as the largest page-aligned signed 64-bit number.
_V1_UNLIMITED = 2.0**62


def _read_v1(directory: str) -> CgroupMemory:
    usage_path = os.path.join(directory, "memory.usage_in_bytes")
    usage = _number(_read_small(usage_path), usage_path)
    limit_path = os.path.join(directory, "memory.limit_in_bytes")
    try:
        limit: float | None = _number(_read_small(limit_path), limit_path)
    except HostMemoryError:
        limit = None
    if limit is not None and limit >= _V1_UNLIMITED:
        limit = None
    counts = _optional_keyed(os.path.join(directory, "memory.stat"))
    oom = _optional_keyed(os.path.join(directory, "memory.oom_control"))
    stat = {k: counts[v1] for k, v1 in _V1_STAT.items() if v1 in counts}
    return CgroupMemory(directory, usage, limit, stat, oom.get("oom_kill"))


def _optional_keyed(path: str) -> dict[str, float]:
    try:
        return _keyed(_read_small(path))
    except HostMemoryError:
        return {}


def _own_cgroup(root: str, self_cgroup: str) -> str | None:
    """The memory cgroup directory a /proc/<pid>/cgroup names: v2's "0::" line, or v1's
    "memory" controller line under root/memory."""
    try:
        text = _read_small(self_cgroup)
    except HostMemoryError:
        return None
    v1 = None
    v2 = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = os.path.normpath(os.path.join(root, parts[2].lstrip("/")))
        elif "memory" in parts[1].split(","):
            v1 = os.path.normpath(os.path.join(root, "memory", parts[2].lstrip("/")))
    if v1 is not None and os.path.isdir(v1):
        return v1  # a hybrid host's "0::" line is the unified tree, which has no memory files
    return v2


def vllm_pids(proc: str = "/proc", pattern: str = "vllm") -> list[int]:
    """Processes that run vLLM, in any case (the API server's `vllm serve`, its engine's
    `VLLM::EngineCore`, the workers): `_runs_vllm`."""
    me = os.getpid()
    found: list[int] = []
    try:
        names = [n for n in os.listdir(proc) if n.isdigit()][:_MAX_PROCESSES]
    except OSError:
        return []
    for name in names:
        pid = int(name)
        if pid == me:
            continue
        try:
            with open(os.path.join(proc, name, "cmdline"), "rb") as fh:
                cmd = fh.read(4096)
        except OSError:
            continue
        if _runs_vllm(cmd, pattern.encode()) and b"kvoffload" not in cmd.lower():
            found.append(pid)
    return found


def _runs_vllm(cmdline: bytes, name: bytes = b"vllm") -> bool:
    """Whether a command line is vLLM's own: a program or script named vllm*, or `python -m vllm…`.

    It covers `python …/bin/vllm serve` and the renamed `VLLM::EngineCore`.
    Not a line that merely mentions vllm (a path, a log file).
    """
    argv = [a.lower() for a in cmdline.split(b"\0") if a]
    if any(os.path.basename(a).startswith(name) for a in argv[:2]):
        return True
    return any(a == b"-m" and b.startswith(name) for a, b in itertools.pairwise(argv[:4]))


def read_processes(pids: list[int], proc: str = "/proc") -> ProcessMemory | None:
    """The PSS of these processes (None when none can be read: another user's, or gone)."""
    read = 0
    totals = {"Pss": 0.0, "Pss_Anon": 0.0, "Pss_Shmem": 0.0, "Pss_File": 0.0}
    for pid in pids:
        try:
            text = _read_small(os.path.join(proc, str(pid), "smaps_rollup"))
        except HostMemoryError:
            continue
        read += 1
        for line in text.splitlines():
            parts = line.split()
            key = parts[0].rstrip(":") if parts else ""
            if key in totals and len(parts) >= 2 and parts[1].isdigit():
                totals[key] += float(parts[1]) * 1024
    if read == 0:
        return None
    return ProcessMemory(
        read, totals["Pss"], totals["Pss_Anon"], totals["Pss_Shmem"], totals["Pss_File"]
    )


def _cgroup_of(pid: int, root: str, proc: str) -> str | None:
    path = _own_cgroup(root, os.path.join(proc, str(pid), "cgroup"))
    if path is None or not os.path.normpath(path).startswith(os.path.normpath(root)):
        return None  # outside this namespace's view ("/.." paths): not readable from here
    readable = ("memory.current", "memory.usage_in_bytes")
    return path if any(os.path.isfile(os.path.join(path, f)) for f in readable) else None


def read_host_memory(
    setting: str = "auto",
    root: str = CGROUP_ROOT,
    proc: str = "/proc",
    self_cgroup: str = "/proc/self/cgroup",
) -> HostMemory:
    """vLLM's container memory: `setting` is a cgroup directory, "auto" or "off".

    With "auto" it tries the pod's cgroup less this container's own, then the cgroup of vLLM's
    processes where visible. Never this process's own cgroup alone: the sidecar's is not vLLM's.
    """
    if setting == "off":
        return HostMemory("off", None, None)
    pids = vllm_pids(proc)
    processes = read_processes(pids, proc) if pids else None
    try:
        if setting != "auto":
            return HostMemory("explicit", read_cgroup(setting), processes)
        own = _own_cgroup(root, self_cgroup)
        roots = (os.path.normpath(root), os.path.join(os.path.normpath(root), "memory"))
        if own is not None and own not in roots:
            parent = os.path.dirname(own)
            if _POD_CGROUP.search(os.path.basename(parent)):
                return HostMemory("pod", read_cgroup(parent).less(read_cgroup(own)), processes)
        for pid in pids:
            directory = _cgroup_of(pid, root, proc)
            if directory is not None:
                return HostMemory("vllm-processes", read_cgroup(directory), processes)
    except HostMemoryError as exc:
        return HostMemory(setting, None, processes, str(exc))
    return HostMemory(
        "none",
        None,
        processes,
        "vLLM's cgroup is not visible from here: give --host-memory.cgroup (a mount of it) or "
        "run the sidecar in vLLM's pod with shareProcessNamespace",
    )


def snapshot_for_check() -> dict[str, object]:
    """One auto reading as JSON (bench/real/host_memory_check.py prints it beside the raw files)."""
    return read_host_memory().to_json()
