"""`kvoffload healthcheck` (the image's HEALTHCHECK) against a real `serve`: it finds the address
and the scheme serve uses from the same variables, plain and under TLS, and fails in one line
when nothing answers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from helpers import certificates, free_port

KVO = [sys.executable, "-m", "kvoffload"]


def check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KVO, "healthcheck"], capture_output=True, text=True, timeout=60, env=env
    )


def serving(env: dict[str, str]) -> subprocess.Popen[str]:
    """serve, configured only from the environment (as the container is)."""
    return subprocess.Popen(
        [*KVO, "serve", "--target", f"http://127.0.0.1:{free_port()}/metrics"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def until_healthy(
    env: dict[str, str], proc: subprocess.Popen[str]
) -> subprocess.CompletedProcess[str]:
    deadline = time.monotonic() + 60
    while True:
        r = check(env)
        if r.returncode == 0 or time.monotonic() > deadline or proc.poll() is not None:
            return r
        time.sleep(0.3)


def test_plain_http_on_the_address_serve_was_given(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "KVOFFLOAD_SERVE_WEB_LISTEN_ADDRESS": f"127.0.0.1:{port}"}
    proc = serving(env)
    try:
        r = until_healthy(env, proc)
        assert r.returncode == 0, r.stderr
    finally:
        proc.terminate()
        proc.wait(20)
    r = check(env)  # nothing listens any more
    assert r.returncode == 1
    assert len(r.stderr.strip().splitlines()) == 1 and f":{port}/healthz" in r.stderr


def test_https_when_serves_web_config_has_tls(tmp_path: Path) -> None:
    _ca, cert, key = certificates(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    port = free_port()
    env = {
        **os.environ,
        "KVOFFLOAD_WEB_LISTEN_ADDRESS": f"127.0.0.1:{port}",  # the shared spelling
        "KVOFFLOAD_SERVE_WEB_CONFIG_FILE": str(web),
    }
    proc = serving(env)
    try:
        r = until_healthy(env, proc)
        assert r.returncode == 0, r.stderr
        # Plain http against the TLS listener fails: the check did choose https.
        plain = {k: v for k, v in env.items() if k != "KVOFFLOAD_SERVE_WEB_CONFIG_FILE"}
        assert check(plain).returncode == 1
    finally:
        proc.terminate()
        proc.wait(20)
