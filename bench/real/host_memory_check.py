"""What a CPU tier really costs in host memory on real vLLM 0.26.0 (#27 item 3: "will it OOM?").

For tiers of 0, 8 and 24 GiB (Qwen3-0.6B shape, eager, 1.5 GiB GPU KV): the machine's cgroup
(memory.current, memory.stat, memory.events), /proc/meminfo, /dev/shm and every vLLM process's
status and smaps_rollup, before the start, once healthy, after 400 requests that fill the tier,
and after the stop; kvoffload's own reader (sidecar.hostmemory) beside them where the snapshot
has it. Writes $OUT/host-memory.json. Environment: PYTHONPATH has vLLM; KVO_PYTHONPATH adds
kvoffload; DEADLINE (unix seconds) bounds the whole run.
"""

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from one_server import OneServer, log

CG = "/sys/fs/cgroup"
OUT = os.environ.get("OUT", "/tmp/hm-out")
DEADLINE = float(os.environ.get("DEADLINE", time.time() + 540))
SIZES = [int(s) for s in os.environ.get("SIZES", "0,8,24").split(",")]


def read(path: str, limit: int = 1 << 16) -> str | None:
    try:
        with open(path) as fh:
            return fh.read(limit)
    except OSError as exc:
        return f"<{type(exc).__name__}: {exc}>"


def keyed(text: str | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) >= 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1]) * (1024 if parts[-1] == "kB" else 1)
    return out


def vllm_processes() -> dict[str, dict]:
    procs = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        cmd = (read(f"/proc/{pid}/cmdline") or "").replace("\0", " ")
        comm = (read(f"/proc/{pid}/comm") or "").strip()
        if "vllm" not in cmd and "VLLM" not in comm and "EngineCore" not in comm:
            continue
        status = keyed(read(f"/proc/{pid}/status"))
        rollup = keyed(read(f"/proc/{pid}/smaps_rollup"))
        keep = ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmLck", "VmPin", "VmSwap")
        procs[pid] = {
            "comm": comm,
            "cmd": cmd[:120],
            "status": {k: status.get(k) for k in keep},
            "rollup": {k: v for k, v in rollup.items() if k.startswith(("Pss", "Rss", "Locked"))},
        }
    return procs


def reader_view() -> object:
    try:
        from kvoffload.ingest import hostmemory
    except ImportError as exc:
        return f"<no reader in this snapshot: {exc}>"
    try:
        own = hostmemory._own_cgroup(hostmemory.CGROUP_ROOT, "/proc/self/cgroup")
        mine = hostmemory.read_host_memory(own).to_json() if own else None
        return {"auto": hostmemory.snapshot_for_check(), "own_cgroup": mine}
    except Exception as exc:
        return f"<{type(exc).__name__}: {exc}>"


def sample(tag: str) -> dict:
    shm = subprocess.run(["df", "-B1", "/dev/shm"], capture_output=True, text=True).stdout
    s = {
        "tag": tag,
        "time": time.time(),
        "cgroup_self": read("/proc/self/cgroup"),
        "memory.current": read(f"{CG}/memory.current"),
        "memory.max": read(f"{CG}/memory.max"),
        "memory.stat": keyed(read(f"{CG}/memory.stat")),
        "memory.events": keyed(read(f"{CG}/memory.events")),
        "meminfo": {
            k: v
            for k, v in keyed(read("/proc/meminfo")).items()
            if k
            in (
                "MemTotal",
                "MemAvailable",
                "Shmem",
                "Mlocked",
                "Unevictable",
                "AnonPages",
                "Cached",
                "MemFree",
            )
        },
        "dev_shm": shm,
        "processes": vllm_processes(),
        "kvoffload_reader": reader_view(),
    }
    stat, info = s["memory.stat"], s["meminfo"]
    log(tag, "cgroup current", s["memory.current"], "shmem", stat.get("shmem"),
        "unevictable", stat.get("unevictable"), "meminfo Shmem", info.get("Shmem"),
        "Mlocked", info.get("Mlocked"), "procs", len(s["processes"]))  # fmt: skip
    reader = s["kvoffload_reader"]
    log(tag, "kvoffload reader:", json.dumps(reader)[:600])
    return s


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    runs = []
    port = 8300
    for size in SIZES:
        if time.time() > DEADLINE - 150:
            log("deadline: skipping size", size)
            break
        run: dict = {"cpu_gib": size, "samples": [sample(f"{size}g before")]}
        srv = OneServer(f"/tmp/hm/{size}", f"{OUT}/{size}g", port, port + 1, port + 2)
        port += 10
        i = srv.cmd.index("--kv-offloading-size")
        if size == 0:
            del srv.cmd[i : i + 4]
        else:
            srv.cmd[i + 1] = str(size)
        run["healthy_after_s"] = srv.start(timeout=max(60.0, DEADLINE - time.time() - 90))
        run["samples"].append(sample(f"{size}g healthy"))
        if run["healthy_after_s"] is not None:
            t0 = time.time()
            sent = 0
            while sent < 400 and time.time() < min(DEADLINE - 60, t0 + 90):
                srv.send(sent, sent + 25)
                sent += 25
            run["requests"] = sent
            run["samples"].append(sample(f"{size}g after {sent} requests"))
        srv.stop()
        time.sleep(3)
        run["samples"].append(sample(f"{size}g stopped"))
        runs.append(run)
        with open(f"{OUT}/host-memory.json", "w") as fh:
            json.dump(runs, fh, indent=1)
    log("done")


if __name__ == "__main__":
    main()
