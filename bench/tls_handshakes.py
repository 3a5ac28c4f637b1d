"""The issue's TLS attack at its full size against a real `kvoffload serve` (#25 item 2).

What: `serve` with TLS (a self-signed certificate made with openssl), then waves of connections
that never finish their handshake (half of them send nothing, half send half a ClientHello),
each wave held until the server has closed them; the server's RSS at each wave's peak and after,
against its RSS before. Default: one wave of 1,000, then four of 800 (the issue's figures: 52 → 352
MB, and 600 MB after four waves of 800). An honest TLS client asks /metrics during each wave.
Why: the test (tests/test_webconfig.py::test_stalled_tls_handshakes_are_bounded) runs two waves
of 300 to stay short; this re-runs the attack as the issue measured it.

usage: .venv/bin/python bench/tls_handshakes.py [--waves 1000,800,800,800,800]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HALF_HELLO = bytes.fromhex("16030100c8010000c40303") + b"\x00" * 16  # a ClientHello cut short


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def certificate(work: Path) -> tuple[Path, Path]:
    cert, key = work / "srv.pem", work / "srv.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def honest_get(port: int, cafile: Path) -> bool:
    ctx = ssl.create_default_context(cafile=str(cafile))
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", timeout=10, context=ctx):
            return True
    except OSError:
        return False


def wave(port: int, n: int, pid: int, cafile: Path) -> dict[str, object]:
    socks = []
    for i in range(n):
        s = socket.socket()
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", port))
            if i % 2:
                s.sendall(HALF_HELLO)
        except OSError:
            s.close()
            continue
        socks.append(s)
    peak = rss_mb(pid)
    served = honest_get(port, cafile)
    # Held until the server closes each (its handshake timeout), at most 30 s.
    deadline = time.monotonic() + 30
    open_ = list(socks)
    while open_ and time.monotonic() < deadline:
        still = []
        for s in open_:
            s.settimeout(0.01)
            try:
                if s.recv(1) == b"":
                    s.close()
                    continue
            except (TimeoutError, BlockingIOError):
                pass
            except OSError:
                s.close()
                continue
            still.append(s)
        open_ = still
        peak = max(peak, rss_mb(pid))
        time.sleep(0.2)
    for s in open_:
        s.close()
    time.sleep(1)
    return {
        "connections": len(socks),
        "peak_rss_mb": round(peak, 1),
        "closed_by_server": len(socks) - len(open_),
        "honest_client_served": served,
        "after_rss_mb": round(rss_mb(pid), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--waves", default="1000,800,800,800,800")
    args = ap.parse_args()
    sizes = [int(x) for x in args.waves.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cert, key = certificate(work)
        web = work / "web.yml"
        web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
        port = free_port()
        env = dict(os.environ)
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvoffload", "serve", "--target",
             f"http://127.0.0.1:{free_port()}/metrics", "--web.config.file", str(web),
             "--web.listen-address", f"127.0.0.1:{port}"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while not honest_get(port, cert):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("serve did not come up")
                time.sleep(0.3)
            before = rss_mb(proc.pid)
            waves = [wave(port, n, proc.pid, cert) for n in sizes]
            alive = proc.poll() is None and honest_get(port, cert)
        finally:
            proc.terminate()
            proc.wait(20)
    out = {"rss_before_mb": round(before, 1), "waves": waves, "serving_after": alive}
    print(json.dumps(out, indent=1))
    peak = max(w["peak_rss_mb"] for w in waves)
    print(
        f"RSS {before:.0f} MB before; peak {peak:.0f} MB (+{peak - before:.0f}) over "
        f"{len(sizes)} waves ({args.waves}); after the last {waves[-1]['after_rss_mb']:.0f} MB; "
        f"every wave's honest client served: {all(w['honest_client_served'] for w in waves)}"
    )


if __name__ == "__main__":
    main()
