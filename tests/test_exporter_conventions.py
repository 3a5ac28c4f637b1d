"""The command line behaves like a Prometheus exporter's: its own default port (the same in
every doc and example), KVOFFLOAD_* environment variables for every flag, --log.level and
--log.format anywhere, process and Python self-metrics, --web.telemetry-path, and one line
(exit 2) for an address in use."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
import requests

from kvoffload.cli import cli
from kvoffload.cli.flags import DEFAULT_PORT, SHARED_FLAGS, JSONFormatter, LogfmtFormatter

from helpers import SAMPLE, free_port

KVO = [sys.executable, "-m", "kvoffload"]
ROOT = Path(__file__).parents[1]
DEAD_TARGET = "http://127.0.0.1:9/metrics"


def kvo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KVO, *args], capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})}
    )


@contextlib.contextmanager
def serving(*args: str, env: dict[str, str] | None = None) -> Iterator[int]:
    """`kvoffload ARGS` on a free port until the block ends."""
    port = free_port()
    proc = subprocess.Popen(
        [*KVO, *args, "--web.listen-address", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        _wait_for(port, proc)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _wait_for(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


def _stderr_of_serve(
    *args: str, env: dict[str, str] | None = None, until: str | None = "metrics at"
) -> str:
    """What `kvoffload ARGS` (a serve) logs by the time it listens: read until a line with
    `until` came (polled); with `until` None, for half a second (a check that nothing is
    logged has no event to wait for)."""
    port = free_port()
    proc = subprocess.Popen(
        [*KVO, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={
            **os.environ,
            "KVOFFLOAD_SERVE_WEB_LISTEN_ADDRESS": f"127.0.0.1:{port}",
            **(env or {}),
        },
    )
    assert proc.stderr is not None
    said = b""
    try:
        _wait_for(port, proc)
        deadline = time.monotonic() + (30 if until else 0.5)
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stderr, selectors.EVENT_READ)
            while (until is None or until.encode() not in said) and time.monotonic() < deadline:
                if sel.select(max(deadline - time.monotonic(), 0)):
                    said += os.read(proc.stderr.fileno(), 65536)
    finally:
        proc.terminate()
        _, rest = proc.communicate(timeout=20)
    return (said + rest).decode()


def _subcommands() -> dict[str, click.Command]:
    ctx = click.Context(cli)
    commands = {name: cli.get_command(ctx, name) for name in cli.list_commands(ctx)}
    return {name: c for name, c in commands.items() if c is not None}


def test_every_flag_of_every_command_has_an_environment_variable() -> None:
    for name, command in _subcommands().items():
        seen: set[str] = set()
        for param in command.params:
            if not isinstance(param, click.Option):
                continue
            envvars = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or [])
            assert envvars, (name, param.opts)
            flag = next(o for o in param.opts if o.startswith("--"))
            want = flag[2:].replace(".", "_").replace("-", "_").upper()
            if param.name in ("log_level", "log_format"):
                assert envvars == [f"KVOFFLOAD_{want}"]
            elif name == "healthcheck" and flag in SHARED_FLAGS:
                # It probes `serve`: it reads serve's variables after its own, by design.
                assert envvars == [
                    f"KVOFFLOAD_HEALTHCHECK_{want}",
                    f"KVOFFLOAD_SERVE_{want}",
                    f"KVOFFLOAD_{want}",
                ]
            elif flag in SHARED_FLAGS:
                assert envvars == [f"KVOFFLOAD_{name.upper()}_{want}", f"KVOFFLOAD_{want}"]
            else:  # scoped to its command: another command's variable never reaches it
                assert envvars == [f"KVOFFLOAD_{name.upper()}_{want}"]
            assert not seen & set(envvars), (name, envvars)
            seen |= set(envvars)
    serve = {p.name: p for p in _subcommands()["serve"].params}
    assert serve["web_listen_address"].envvar[0] == "KVOFFLOAD_SERVE_WEB_LISTEN_ADDRESS"
    assert serve["memory_limit"].envvar[1] == "KVOFFLOAD_MEMORY_LIMIT"


def test_environment_sets_flags_and_the_command_line_wins() -> None:
    r = kvo("analyze", str(SAMPLE), env={"KVOFFLOAD_ANALYZE_JSON": "1"})
    assert r.returncode == 0 and json.loads(r.stdout)["groups"], r.stderr
    # The Downward API's value of vLLM's limits.memory (bytes) reaches the memory check.
    low = {"KVOFFLOAD_MEMORY_LIMIT": str(2**20), "KVOFFLOAD_ANALYZE_JSON": "1"}
    (group,) = json.loads(kvo("analyze", str(SAMPLE), env=low).stdout)["groups"]
    assert any(
        "exceeds the memory limit 0.00 GiB" in w for w in group["recommendation"]["warnings"]
    )
    (group,) = json.loads(kvo("analyze", str(SAMPLE), "--memory-limit", "64GiB", env=low).stdout)[
        "groups"
    ]
    assert not group["recommendation"]["warnings"]
    # A bad value in the environment is the flag's one-line error.
    r = kvo("analyze", str(SAMPLE), env={"KVOFFLOAD_MEMORY_LIMIT": "lots"})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "'--memory-limit' (from KVOFFLOAD_MEMORY_LIMIT)" in r.stderr, r.stderr


def test_a_variable_meant_for_one_command_does_not_change_another() -> None:
    """Issue #25: KVOFFLOAD_DURATION or KVOFFLOAD_RECORD_DURATION set for `record` changed
    `analyze --duration` too (and KVOFFLOAD_JSON its output); now only the command's own
    variable is read, and an error about it names it."""
    others = {
        "KVOFFLOAD_DURATION": "bogus",
        "KVOFFLOAD_RECORD_DURATION": "bogus",
        "KVOFFLOAD_SIM_DURATION": "bogus",
        "KVOFFLOAD_JSON": "true",
        "KVOFFLOAD_KV_EVENTS": "tcp://127.0.0.1:1",
    }
    r = kvo("analyze", str(SAMPLE), env=others)
    assert r.returncode == 0 and not r.stdout.lstrip().startswith("{"), r.stderr
    r = kvo("analyze", str(SAMPLE), env={**others, "KVOFFLOAD_ANALYZE_DURATION": "soon"})
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert any("'--duration' (from KVOFFLOAD_ANALYZE_DURATION)" in line for line in lines), lines
    # An error raised after parsing names the variable too.
    r = kvo(
        "serve",
        "--prometheus",
        "http://127.0.0.1:1",
        env={"KVOFFLOAD_SERVE_WINDOW": "5m", "KVOFFLOAD_WINDOW": "7m"},
    )
    assert r.returncode == 2 and "--window (from KVOFFLOAD_SERVE_WINDOW)" in r.stderr, r.stderr


def test_repeatable_flags_from_the_environment() -> None:
    targets = f"{DEAD_TARGET} http://127.0.0.1:10/metrics"
    with serving("serve", env={"KVOFFLOAD_SERVE_TARGET": targets}) as port:
        status = requests.get(f"http://127.0.0.1:{port}/api/v1/status", timeout=10).json()
    assert len(status["targets"]) == 2
    header = _subcommands()["analyze"].params
    (option,) = [p for p in header if p.name == "headers"]
    assert option.type.split_envvar_value("X-Scope-OrgID: ml\nX-A: b c\n") == [
        "X-Scope-OrgID: ml",
        "X-A: b c",
    ]


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (("--log.format", "json", "serve", "--target", DEAD_TARGET), {}),
        (("serve", "--target", DEAD_TARGET, "--log.format", "json"), {}),
        (("serve", "--target", DEAD_TARGET), {"KVOFFLOAD_LOG_FORMAT": "json"}),
    ],
)
def test_log_format_json_before_or_after_the_subcommand(args: tuple[str, ...], env: dict) -> None:
    err = _stderr_of_serve(*args, env=env)
    lines = [json.loads(line) for line in err.splitlines()]
    assert lines and all(set(x) >= {"ts", "level", "logger", "msg"} for x in lines), err
    assert lines[0]["level"] == "info" and "metrics at http://127.0.0.1:" in lines[0]["msg"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", lines[0]["ts"])


@pytest.mark.slow
def test_log_level_anywhere_and_the_old_spelling() -> None:
    err = _stderr_of_serve("serve", "--target", DEAD_TARGET)
    first = err.splitlines()[0]
    assert re.match(r'ts=\S+ level=info logger=kvoffload msg="kvoffload \S+: scraping ', first)
    for args in (
        ("serve", "--target", DEAD_TARGET, "--log.level", "warn"),
        ("--log-level", "warning", "serve", "--target", DEAD_TARGET),
        ("--log.level", "debug", "serve", "--target", DEAD_TARGET, "--log-level", "error"),
    ):
        assert "level=info" not in _stderr_of_serve(*args, until=None), args


def test_log_lines_escape_what_would_break_them() -> None:
    record = logging.LogRecord("kvoffload.x", logging.WARNING, "f", 1, 'a "b"\nc=d', (), None)
    line = LogfmtFormatter().format(record)
    assert line.endswith(r'level=warn logger=kvoffload.x msg="a \"b\"\nc=d"'), line
    assert "\n" not in line
    assert json.loads(JSONFormatter().format(record))["msg"] == 'a "b"\nc=d'


def test_self_metrics_and_telemetry_path() -> None:
    with serving("serve", "--target", DEAD_TARGET, "--web.telemetry-path", "/prom") as port:
        base = f"http://127.0.0.1:{port}"
        body = requests.get(f"{base}/prom", timeout=10).text
        assert requests.get(f"{base}/metrics", timeout=10).status_code == 404
        assert 'href="prom"' in requests.get(f"{base}/", timeout=10).text
    for name in (
        "kvoffload_up{",
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_open_fds ",
        "python_info{",
        "python_gc_objects_collected_total{",
    ):
        assert name in body, name


@pytest.mark.slow
def test_an_address_in_use_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        for args in (("serve", "--target", DEAD_TARGET), ("sim",), ("demo",)):
            r = kvo(*args, "--web.listen-address", address)
            assert r.returncode == 2, (args, r.stderr)
            assert r.stderr == (
                f"kvoffload: error: cannot listen on {address}: address already in use (another "
                "process has it); choose another --web.listen-address\n"
            ), r.stderr
        r = kvo("serve", "--target", DEAD_TARGET, env={"KVOFFLOAD_WEB_LISTEN_ADDRESS": address})
        assert r.returncode == 2 and address in r.stderr


def test_one_default_port_everywhere() -> None:
    """The default is not dcgm-exporter's 9400, and every doc, example and manifest says the
    one default (docs/exporter.md explains the choice and alone names 9400)."""
    assert f"[default: 0.0.0.0:{DEFAULT_PORT}]" in kvo("serve", "--help").stdout.replace("\n", " ")
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    for folder in ("examples", "deploy", "alerts"):
        files += [p for p in (ROOT / folder).rglob("*") if p.is_file()]
    stale = [
        str(p.relative_to(ROOT))
        for p in files
        if p.name != "exporter.md" and re.search(r"(?<![\d.])9400(?!\d)", p.read_text())
    ]
    assert not stale, f"still 9400: {stale}"
    mentions = [p for p in files if str(DEFAULT_PORT) in p.read_text()]
    assert ROOT / "README.md" in mentions and ROOT / "docs" / "exporter.md" in mentions
