"""One real vLLM 0.26.0 server for the device checks (replay_check.py, restart_check.py):
Qwen3-0.6B shape (dummy weights, eager), 1.5 GiB GPU KV, 2 GiB native CPU tier, KV events with a
replay endpoint (topic `kv`), and the RAG workload's requests (wl_rag.json.gz, 1 output token).
Environment: PYTHONPATH has vLLM (the bundle)."""

import gzip
import json
import os
import signal
import subprocess
import sys
import time

import requests

HERE = os.path.dirname(os.path.abspath(__file__))


def log(*a: object) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


class OneServer:
    def __init__(self, work: str, out: str, port: int, zport: int, rport: int) -> None:
        self.work, self.out, self.port = work, out, port
        self.zport, self.rport = zport, rport
        os.makedirs(work, exist_ok=True)
        os.makedirs(out, exist_ok=True)
        events = json.dumps(
            {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": f"tcp://*:{zport}",
                "replay_endpoint": f"tcp://*:{rport}",
                "topic": "kv",
            }
        )
        self.cmd = [
            sys.executable, "-m", "vllm.entrypoints.cli.main", "serve",
            os.path.join(HERE, "models", "qwen3-0.6b"), "--served-model-name", "m",
            "--host", "127.0.0.1", "--port", str(port), "--load-format", "dummy",
            "--skip-tokenizer-init", "--max-model-len", "2048",
            "--kv-cache-memory-bytes", str(3 * 2**29), "--gpu-memory-utilization", "0.1",
            "--enforce-eager", "--seed", "0", "--kv-events-config", events,
            "--kv-offloading-size", "2", "--kv-offloading-backend", "native",
        ]  # fmt: skip
        self.proc: subprocess.Popen | None = None
        self._workload: dict | None = None

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def start(self, timeout: float = 300.0) -> float | None:
        """Start vLLM (detached from our process group) and wait for /health: the seconds it
        took, or None when it never became healthy."""
        env = dict(
            os.environ,
            PYTHONHASHSEED="0",
            VLLM_USE_FLASHINFER_SAMPLER="0",
            HF_HUB_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            PYTHONUNBUFFERED="1",
            VLLM_CACHE_ROOT=f"{self.work}/vcache",
        )
        vllm_log = open(f"{self.out}/vllm.log", "w")  # noqa: SIM115 (the server outlives it)
        self.proc = subprocess.Popen(
            self.cmd, env=env, stdout=vllm_log, stderr=subprocess.STDOUT,
            start_new_session=True, cwd="/tmp",
        )  # fmt: skip
        t0 = time.time()
        while time.time() - t0 < timeout:
            try:
                if requests.get(f"http://127.0.0.1:{self.port}/health", timeout=2).ok:
                    return round(time.time() - t0, 1)
            except requests.RequestException:
                pass
            time.sleep(1)
        return None

    def send(self, lo: int, hi: int) -> None:
        """Requests lo..hi-1 of the RAG workload, one after the other."""
        if self._workload is None:
            with gzip.open(os.path.join(HERE, "wl_rag.json.gz"), "rt") as fh:
                self._workload = json.load(fh)
        wl = self._workload
        for i in range(lo, hi):
            prompt = wl["docs"][wl["order"][i]] + wl["suffixes"][i]
            requests.post(
                f"http://127.0.0.1:{self.port}/v1/completions",
                timeout=60,
                json={"model": "m", "prompt": prompt, "max_tokens": 1},
            )

    def stop(self) -> None:
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=60)
