#!/usr/bin/env python3
"""Device-side check against a real vLLM 0.26.0: one sidecar and one recorder stay up while
vLLM on the same port is stopped and started again with another tier, and killed three times.

What: Qwen3-0.6B shape (dummy weights, eager, 1.5 GiB GPU KV), 8 clients sending the RAG
workload (prefill only: max_tokens 1, so the client's latency is the TTFT). Phases:
  A  no tier,        >= 95 s (the "before")
  B  4 GiB CPU tier, >= 95 s (the "after": vLLM stopped with SIGTERM, started with the tier)
  C, D  4 GiB tier, 15 s each, each start after a SIGKILL of vLLM under load
The sidecar (`serve --kv-events ... --kv-events-replay ... --state-dir`) is polled on /healthz
every second for the whole run; its status and /metrics are saved after each phase.
Why: #24 (a before/after A/B detected on a real restart with and without a tier) and #25 (the
subscriber survives its publisher vanishing while live messages and replays are in flight).
Environment: PYTHONPATH has vLLM; KVO_PYTHONPATH has kvoffload; OUT a folder; DEADLINE (unix s).
"""

import csv
import gzip
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import requests
from one_server import HERE, OneServer, log

OUT = os.environ.get("OUT", "/tmp/vllm_restart_check")
WORK = "/tmp/vrc"
PORT, ZPORT, RPORT, SIDECAR = 8151, 5651, 5751, 9451
DEADLINE = float(os.environ.get("DEADLINE", time.time() + 560))
CLIENTS = 8
PHASE_S = float(os.environ.get("PHASE_S", "92"))  # seconds of requests before and after
KILLS = int(os.environ.get("KILLS", "3"))  # SIGKILLs of vLLM under load after them

with gzip.open(os.path.join(HERE, "wl_rag.json.gz"), "rt") as _fh:
    WL = json.load(_fh)


def prompt(idx: int) -> list[int]:
    """Request idx: the workload's document order cycled, its suffixes then fresh seeded ones
    (identical across phases, so before and after get the same requests)."""
    order, sfx = WL["order"], WL["suffixes"]
    doc = WL["docs"][order[idx % len(order)]]
    if idx < len(sfx):
        return doc + sfx[idx]
    rng = random.Random(20261202 * 1000003 + idx)
    return doc + [rng.randrange(1000, 150000) for _ in range(len(sfx[0]))]


def drive(phase: str, seconds: float, rows: list[dict], stop_early=None) -> None:
    """CLIENTS closed-loop clients for `seconds` (from request 0, as every phase)."""
    lock, nxt, t_end = threading.Lock(), [0], time.time() + seconds

    def worker() -> None:
        s = requests.Session()
        while time.time() < t_end and not (stop_early and stop_early.is_set()):
            with lock:
                idx = nxt[0]
                nxt[0] += 1
            t0 = time.time()
            err = ""
            try:
                r = s.post(
                    f"http://127.0.0.1:{PORT}/v1/completions",
                    timeout=60,
                    json={"model": "m", "prompt": prompt(idx), "max_tokens": 1},
                )
                r.raise_for_status()
            except requests.RequestException as e:
                err = type(e).__name__
                time.sleep(0.2)  # vLLM killed: no tight loop of refused connections
            ms = (time.time() - t0) * 1e3
            with lock:
                rows.append(dict(phase=phase, req=idx, t_send=t0, ttft_ms=ms, error=err))

    ths = [threading.Thread(target=worker, daemon=True) for _ in range(CLIENTS)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(seconds + 90)


def main() -> int:
    os.makedirs(OUT, exist_ok=True)
    kvo_env = dict(os.environ, PYTHONPATH=os.environ["KVO_PYTHONPATH"])
    servers = {
        gib: OneServer(f"{WORK}/{gib}", f"{OUT}/vllm-{gib}", PORT, ZPORT, RPORT) for gib in (0, 4)
    }
    for gib, srv in servers.items():
        i = srv.cmd.index("--kv-offloading-size")
        del srv.cmd[i : i + 4]
        if gib:
            srv.cmd += ["--kv-offloading-size", str(gib), "--kv-offloading-backend", "native"]
    target = servers[0].metrics_url
    summary: dict = {"cmds": {g: " ".join(s.cmd) for g, s in servers.items()}, "phases": []}
    rows: list[dict] = []
    health: list[tuple[float, int]] = []
    stop = threading.Event()

    sidecar = subprocess.Popen(
        [sys.executable, "-m", "kvoffload", "serve", "--target", target,
         "--kv-events", f"tcp://127.0.0.1:{ZPORT}", "--kv-events-replay", f"tcp://127.0.0.1:{RPORT}",
         "--kv-events-topic", "kv", "--listen", f"127.0.0.1:{SIDECAR}", "--interval", "1s",
         "--window", "10m", "--state-dir", f"{WORK}/state", "--state-interval", "5s"],
        env=kvo_env, stdout=open(f"{OUT}/sidecar.log", "w"), stderr=subprocess.STDOUT,  # noqa: SIM115
        cwd="/tmp",
    )  # fmt: skip
    om = f"{WORK}/rec.om"
    rec = subprocess.Popen(
        [sys.executable, "-m", "kvoffload", "record", "--target", target, "--interval", "1s",
         "--duration", "15m", "-o", om, "--kv-events", f"tcp://127.0.0.1:{ZPORT}",
         "--kv-events-replay", f"tcp://127.0.0.1:{RPORT}"],
        env=kvo_env, stdout=open(f"{OUT}/record.log", "w"), stderr=subprocess.STDOUT,  # noqa: SIM115
        cwd="/tmp",
    )  # fmt: skip

    def poll() -> None:
        s = requests.Session()
        while not stop.is_set():
            t = time.time()
            try:
                code = s.get(f"http://127.0.0.1:{SIDECAR}/healthz", timeout=2).status_code
            except requests.RequestException:
                code = -1
            health.append((t, code))
            stop.wait(1.0)

    threading.Thread(target=poll, daemon=True).start()

    def snapshot(tag: str) -> None:
        for path, fn in (("/api/v1/status", "status.json"), ("/metrics", "metrics.prom")):
            try:
                r = requests.get(f"http://127.0.0.1:{SIDECAR}{path}", timeout=15)
                with open(f"{OUT}/sidecar-{tag}-{fn}", "w") as fh:
                    fh.write(r.text)
            except requests.RequestException as e:
                log(tag, path, "failed", repr(e))

    def phase(name: str, gib: int, seconds: float, kill_after: float | None) -> None:
        srv = servers[gib]
        srv.out = f"{OUT}/vllm-{name}"  # one log per start
        os.makedirs(srv.out, exist_ok=True)
        t0 = time.time()
        ready = srv.start()
        p = dict(name=name, cpu_gib=gib, ready_s=ready, t_ready=time.time(), t_launch=t0)
        log(name, "vLLM ready in", ready, "s")
        if ready is None:
            summary["phases"].append(p)
            return
        for _ in range(2):  # warm-up, not measured
            requests.post(srv.metrics_url.replace("/metrics", "/v1/completions"), timeout=60,
                          json={"model": "m", "prompt": [7] * 1000, "max_tokens": 1})  # fmt: skip
        if kill_after is not None:
            killer = threading.Timer(kill_after, lambda: os.killpg(srv.proc.pid, signal.SIGKILL))
            killer.start()
        p["t_wl0"] = time.time()
        drive(name, seconds, rows)
        p["t_wl1"] = time.time()
        p["requests"] = sum(1 for r in rows if r["phase"] == name and not r["error"])
        p["errors"] = sum(1 for r in rows if r["phase"] == name and r["error"])
        time.sleep(3)
        snapshot(name)
        if kill_after is None:
            srv.stop()
        else:
            srv.proc.wait(30)
        p["t_stopped"] = time.time()
        p["sidecar_alive"] = sidecar.poll() is None
        log(name, p)
        summary["phases"].append(p)

    try:
        phase("A-nooffload", 0, PHASE_S, None)
        phase("B-cpu4", 4, PHASE_S, None)
        for name in ("C-cpu4-killed", "D-cpu4-killed", "E-cpu4-killed")[:KILLS]:
            if time.time() + 80 > DEADLINE - 40:
                log("skip", name, "(time)")
                break
            phase(name, 4, 15, 12.0)
        srv = servers[4]
        # the last start: its stream must be ingested too
        if KILLS and time.time() + 60 < DEADLINE - 30:
            srv.out = f"{OUT}/vllm-F-cpu4-after"
            os.makedirs(srv.out, exist_ok=True)
            srv.start()
            drive("F-cpu4-after", 10, rows)
            time.sleep(3)
            snapshot("final")
            srv.stop()
    finally:
        stop.set()
        summary["sidecar_exit"] = sidecar.poll()
        summary["health_failures"] = [t for t, c in health if c != 200]
        summary["health_polls"] = len(health)
        rec.send_signal(signal.SIGINT)
        try:
            rec.wait(60)
        except subprocess.TimeoutExpired:
            rec.kill()
        sidecar.send_signal(signal.SIGINT)
        try:
            sidecar.wait(30)
        except subprocess.TimeoutExpired:
            sidecar.kill()
        summary["sidecar_rc"] = sidecar.returncode
        summary["record_rc"] = rec.returncode
        for s in servers.values():
            if s.proc is not None and s.proc.poll() is None:
                os.killpg(s.proc.pid, signal.SIGKILL)
        with open(f"{OUT}/requests.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=["phase", "req", "t_send", "ttft_ms", "error"])
            w.writeheader()
            w.writerows(rows)
        for f in (om, om + ".kvev"):
            if os.path.exists(f):
                subprocess.run(["xz", "-T4", "-6", f], check=False)
                subprocess.run(["cp", f + ".xz", OUT], check=False)
        with open(f"{OUT}/vllm_restart_check.json", "w") as fh:
            json.dump(summary, fh, indent=1)
        print(json.dumps(summary, indent=1)[-3000:], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
