#!/usr/bin/env python3
"""Device-side check of `serve --state-dir` against a real vLLM 0.26.0: a sidecar SIGKILLed
mid-run and restarted resumes from its saved state, asks vLLM to replay what it missed, and ends
with the KV-event figures and curve of a sidecar that never stopped.

One Qwen3-0.6B server (dummy weights, eager, 1.5 GiB GPU KV, 2 GiB CPU tier, KV events with a
replay endpoint). Two sidecars: `whole` (never stopped) and `victim` (`--state-dir`,
`--state-interval 2s`). 60 requests; SIGKILL the victim; 60 more requests while it is down;
restart it; 60 more; then both sidecars' /api/v1/status side by side, and `record` (SIGTERM)
output (strict OpenMetrics since this release) read back by `analyze`.
Environment: PYTHONPATH has vLLM (the bundle); KVO_PYTHONPATH has kvoffload; OUT a folder.
usage: python3 bench/real/restart_check.py
"""

import json
import os
import signal
import subprocess
import sys
import time

import requests
from one_server import OneServer, log

OUT = os.environ.get("OUT", "/tmp/restart_check")
WORK = "/tmp/rsc"
PORT, ZPORT, RPORT, WHOLE, VICTIM = 8141, 5641, 5741, 9441, 9442


def main() -> int:
    server = OneServer(WORK, OUT, PORT, ZPORT, RPORT)
    kvo_env = dict(os.environ, PYTHONPATH=os.environ["KVO_PYTHONPATH"])
    target = server.metrics_url
    kv = [
        "--kv-events",
        f"tcp://127.0.0.1:{ZPORT}",
        "--kv-events-replay",
        f"tcp://127.0.0.1:{RPORT}",
        "--kv-events-topic",
        "kv",
    ]
    procs: list[subprocess.Popen] = []
    summary: dict[str, object] = {"cmd": " ".join(server.cmd)}

    def serve(port: int, name: str, *extra: str) -> subprocess.Popen:
        errlog = open(f"{OUT}/sidecar-{name}.log", "a")  # noqa: SIM115
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kvoffload",
                "serve",
                "--target",
                target,
                *kv,
                "--listen",
                f"127.0.0.1:{port}",
                "--interval",
                "1s",
                "--window",
                "1h",
                *extra,
            ],
            env=kvo_env,
            stdout=errlog,
            stderr=subprocess.STDOUT,
            cwd="/tmp",
        )
        procs.append(p)
        return p

    def status(port: int) -> dict:
        return requests.get(f"http://127.0.0.1:{port}/api/v1/status", timeout=10).json()

    try:
        ready = server.start()
        if ready is None:
            log("vLLM never became healthy")
            return 3
        summary["ready_s"] = ready
        log("ready in", ready, "s")

        state_dir = f"{WORK}/state"
        serve(WHOLE, "whole")
        victim = serve(VICTIM, "victim", "--state-dir", state_dir, "--state-interval", "2s")
        om = f"{WORK}/rec.om"
        rec = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kvoffload",
                "record",
                "--target",
                target,
                "--interval",
                "1s",
                "--duration",
                "10m",
                "-o",
                om,
            ],
            env=kvo_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd="/tmp",
        )
        time.sleep(4)
        server.send(0, 60)
        time.sleep(4)  # at least one save after the last message
        before = status(VICTIM)
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        summary["victim_before_kill"] = before["groups"][0].get("kv_events")
        summary["state_files"] = sorted(os.listdir(state_dir))
        log("victim killed at", before["kv_events"][0]["last_seq"])
        server.send(60, 120)
        log("60 requests while the victim was down")
        serve(VICTIM, "victim", "--state-dir", state_dir, "--state-interval", "2s")
        time.sleep(4)
        server.send(120, 180)
        time.sleep(5)
        whole, resumed = status(WHOLE), status(VICTIM)
        summary["whole_subscriber"] = whole["kv_events"]
        summary["resumed_subscriber"] = resumed["kv_events"]
        gw, gr = whole["groups"][0], resumed["groups"][0]
        summary["whole_kv_events"] = gw.get("kv_events")
        summary["resumed_kv_events"] = gr.get("kv_events")
        cw = [p["predicted_offload_hit_ratio"] for p in gw.get("curve", [])]
        cr = [p["predicted_offload_hit_ratio"] for p in gr.get("curve", [])]
        summary["curve_points"] = len(cw)
        summary["curve_max_abs_diff"] = (
            max(abs(a - b) for a, b in zip(cw, cr, strict=True))
            if cw and len(cw) == len(cr)
            else None
        )
        summary["whole_warnings"] = gw["recommendation"]["warnings"]
        summary["resumed_warnings"] = gr["recommendation"]["warnings"]
        rec.send_signal(signal.SIGTERM)
        out, _ = rec.communicate(timeout=60)
        summary["record_output"] = out.decode()[-400:]
        an = subprocess.run(
            [sys.executable, "-m", "kvoffload", "analyze", om, "--json"],
            env=kvo_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        summary["analyze_rc"] = an.returncode
        summary["analyze_stderr"] = an.stderr[-300:]
        subprocess.run(["xz", "-kf9", om], check=False)
        subprocess.run(["cp", om + ".xz", OUT], check=False)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        server.stop()
        with open(f"{OUT}/restart_check.json", "w") as fh:
            json.dump(summary, fh, indent=1)
        print(json.dumps(summary, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
