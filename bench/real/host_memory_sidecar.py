"""kvoffload serve next to real vLLM 0.26.0 with an 8 GiB CPU tier: does it read what the tier
takes (#27 item 3)? Two sidecars, `--host-memory.cgroup auto`: one without a limit, one with
`--memory-limit 16Gi` (the tier takes 14 GiB: an OOM risk it must see). 400 RAG requests over
~100 s; their /metrics and /api/v1/status at the end go to $OUT. Environment: PYTHONPATH has
vLLM; KVO_PYTHONPATH has kvoffload (and bcrypt); DEADLINE bounds it.
"""

import json
import os
import subprocess
import sys
import time

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from one_server import OneServer, log

OUT = os.environ.get("OUT", "/tmp/hms-out")
DEADLINE = float(os.environ.get("DEADLINE", time.time() + 540))


def sidecar(port: int, target: str, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.environ["KVO_PYTHONPATH"])
    cmd = [sys.executable, "-m", "kvoffload", "serve", "--target", target, "--interval", "2s",
           "--web.listen-address", f"127.0.0.1:{port}", *extra]  # fmt: skip
    log(" ".join(cmd))
    return subprocess.Popen(
        cmd, env=env, stdout=open(f"{OUT}/sidecar-{port}.log", "w"), stderr=subprocess.STDOUT
    )


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    srv = OneServer("/tmp/hms", f"{OUT}/vllm", 8400, 8401, 8402)
    i = srv.cmd.index("--kv-offloading-size")
    srv.cmd[i + 1] = "8"
    healthy = srv.start(timeout=max(60.0, DEADLINE - time.time() - 200))
    log("vllm healthy after", healthy)
    result: dict = {"healthy_after_s": healthy}
    cars = {
        "no-limit": (9410, sidecar(9410, srv.metrics_url)),
        "limit-16Gi": (9411, sidecar(9411, srv.metrics_url, "--memory-limit", "16Gi")),
    }
    try:
        if healthy is not None:
            t0 = time.time()
            sent = 0
            while sent < 400 and time.time() < DEADLINE - 40:
                srv.send(sent, sent + 4)
                sent += 4
                time.sleep(max(0.0, t0 + sent * 0.25 - time.time()))  # ~100 s for 400
            result["requests"] = sent
            result["seconds"] = round(time.time() - t0, 1)
            time.sleep(5)
        for name, (port, _proc) in cars.items():
            base = f"http://127.0.0.1:{port}"
            try:
                metrics = requests.get(f"{base}/metrics", timeout=10).text
                status = requests.get(f"{base}/api/v1/status", timeout=10).json()
            except requests.RequestException as exc:
                result[name] = f"<{exc}>"
                continue
            with open(f"{OUT}/{name}.metrics.txt", "w") as fh:
                fh.write(metrics)
            host = [line for line in metrics.splitlines() if line.startswith("kvoffload_host")]
            groups = status.get("groups", [])
            result[name] = {
                "host_memory_series": host,
                "host_memory": status.get("host_memory"),
                "advice": [
                    {
                        "action": g["recommendation"]["action"],
                        "size": g["recommendation"]["kv_offloading_size_gib"],
                        "warnings": g["recommendation"]["warnings"],
                        "cpu_capacity_bytes": g["figures"].get("cpu_capacity_bytes"),
                    }
                    for g in groups
                ],
            }
            log(name, json.dumps(result[name])[:1500])
    finally:
        for _port, proc in cars.values():
            proc.terminate()
        for _port, proc in cars.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        srv.stop()
        with open(f"{OUT}/host-memory-sidecar.json", "w") as fh:
            json.dump(result, fh, indent=1)
    log("done")


if __name__ == "__main__":
    main()
