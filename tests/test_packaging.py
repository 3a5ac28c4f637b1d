"""The package as pip installs it: the wheel (LICENSE, py.typed, project URLs, the status page),
a fresh virtual environment without the extras (the sidecar image's), and the links users see
(`--help`, runbook_url) absolute, to pages that exist."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Callable
from email.parser import Parser
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from kvoffload import __version__, links
from kvoffload.cli import cli

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# What the wheel is built from: the files the Dockerfile copies too.
SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "exporter")
# The compiled journal scan's module in a wheel: kvoffload/recording/_scan.<abi tag>.so.
COMPILED_SCAN = re.compile(r"kvoffload/recording/_scan\.[\w.-]+\.so")
# A module importing grafanalib fails as if it were not installed.
NO_GRAFANALIB = (
    "import sys, importlib.abc\n"
    "class Block(importlib.abc.MetaPathFinder):\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] == 'grafanalib':\n"
    "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
    "sys.meta_path.insert(0, Block())\n"
)
ABSOLUTE_DOC = re.compile(re.escape(links.doc("")) + r"([\w.-]+\.md)")


def test_project_urls_and_license_are_declared() -> None:
    urls = PYPROJECT["project"]["urls"]
    assert urls == {
        "Homepage": links.PROJECT_URL,
        "Documentation": links.DOCS_URL,
        "Issues": links.ISSUES_URL,
    }
    assert links.doc("x.md").startswith(links.PROJECT_URL + "/blob/" + links.BRANCH + "/docs/")
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert PYPROJECT["project"]["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert (ROOT / "exporter" / "kvoffload" / "py.typed").is_file()


def test_the_sidecar_needs_no_extra(tmp_path: Path) -> None:
    """grafanalib is the `generate` extra: nothing the sidecar, the simulator or the demo
    import needs it, and `kvoffload generate` without it says what to install, in one line."""
    assert not any("grafanalib" in d for d in PYPROJECT["project"]["dependencies"])
    assert any("grafanalib" in d for d in PYPROJECT["project"]["optional-dependencies"]["generate"])
    code = NO_GRAFANALIB + (
        "import kvoffload.cli, kvoffload.sidecar.service, kvoffload.sidecar.http\n"
        "import kvoffload.fleet.service, kvoffload.sim, kvoffload.sim.server\n"
        "import kvoffload.cli.demo_runner\n"
        "import kvoffload.mixin.rules  # the rules need no grafanalib either\n"
        "assert not [m for m in sys.modules if m.startswith('grafanalib')]\n"
        "from kvoffload.cli import main\n"
        "main(['generate', '--out', sys.argv[1]])\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.splitlines() == [
        "kvoffload: error: the dashboards need grafanalib: pip install 'kvoffload[generate]' "
        "(from a clone: pip install '.[generate]')"
    ]


def _help_texts() -> dict[str, str]:
    texts = {"": CliRunner().invoke(cli, ["--help"], terminal_width=80).output}
    for name in cli.commands:  # type: ignore[attr-defined]
        result = CliRunner().invoke(cli, [name, "--help"], terminal_width=80)
        assert result.exit_code == 0, result.output
        texts[name] = result.output
    return texts


def test_help_links_to_the_docs_are_absolute_and_whole() -> None:
    """`--help` names docs/ pages by URL (the wheel has no docs/), each on a line of its own so
    no terminal cuts it, and every page exists."""
    pages = set()
    for name, text in _help_texts().items():
        for line in text.splitlines():
            for m in ABSOLUTE_DOC.finditer(line):
                assert line.strip() == m.group(0), f"{name}: URL not alone on its line: {line!r}"
                pages.add(m.group(1))
        bare = [m for m in re.findall(r"\S*docs/\S*", text) if not ABSOLUTE_DOC.search(m)]
        assert not bare, f"kvoffload {name} --help: relative docs link(s) {bare}"
    assert {"advisor.md", "rules.md", "runbooks.md", "scenarios.md"} <= pages
    for page in pages:
        assert (ROOT / "docs" / page).is_file(), page


def test_generated_runbook_urls_are_absolute() -> None:
    anchors = {
        re.sub(r"[^\w -]", "", h.strip("# ").lower()).replace(" ", "-")
        for h in (ROOT / "docs" / "runbooks.md").read_text().splitlines()
        if h.startswith("## ")
    }
    for name in ("rules/kvoffload-alerts.yaml", "kubernetes/kvoffload-prometheusrule.yaml"):
        doc = yaml.safe_load((ROOT / "alerts" / name).read_text())
        groups = doc["groups"] if "groups" in doc else doc["spec"]["groups"]
        urls = [r["annotations"]["runbook_url"] for g in groups for r in g["rules"] if "alert" in r]
        assert urls
        for url in urls:
            page, _, anchor = url.partition("#")
            assert page == links.doc("runbooks.md"), url
            assert anchor in anchors, url


def _build_wheel(out: Path, env: dict[str, str] | None = None) -> Path:
    """The wheel pip builds from the sources the Dockerfile copies (a copy: the build writes
    build/ and *.egg-info next to them; the scan built in place by `make deps` is left out)."""
    src = out / "src"
    src.mkdir(parents=True)
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info")
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(out / "dist"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = (out / "dist").glob("kvoffload-*.whl")
    return whl


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.mark.slow
def test_the_wheel_carries_license_types_page_and_urls(wheel: Path) -> None:
    # The compiled scan makes it a wheel for this Python and platform.
    abi = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert wheel.name.startswith(f"kvoffload-{__version__}-{abi}-{abi}-"), wheel.name
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    assert any(COMPILED_SCAN.fullmatch(n) for n in names), sorted(names)
    with zipfile.ZipFile(wheel) as z:
        dist = f"kvoffload-{__version__}.dist-info"
        meta = Parser().parsestr(z.read(f"{dist}/METADATA").decode())
        license_text = z.read(f"{dist}/licenses/LICENSE").decode()
    assert "kvoffload/py.typed" in names
    assert "kvoffload/sidecar/web/index.html" in names
    assert "Apache License" in license_text
    assert meta["License-Expression"] == "Apache-2.0"
    assert sorted(meta.get_all("Project-URL")) == sorted(
        f"{k}, {v}" for k, v in PYPROJECT["project"]["urls"].items()
    )
    requires = meta.get_all("Requires-Dist")
    grafanalib = [r for r in requires if r.startswith("grafanalib")]
    assert grafanalib and all('extra == "generate"' in r for r in grafanalib), grafanalib
    assert not any(n.startswith(("tests/", "docs/", "bench/")) for n in names)


@pytest.mark.slow
def test_the_wheel_runs_in_a_fresh_venv_without_extras(wheel: Path, tmp_path: Path) -> None:
    """What the sidecar image does: `pip install` of the wheel alone, then the CLI, the sidecar's
    modules and the simulator run; `generate` asks for its extra."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py, exe = venv / "bin" / "python", venv / "bin" / "kvoffload"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args, capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path
        )

    r = run(
        str(py),
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        str(wheel),
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    r = run(str(exe), "--help")
    assert r.returncode == 0 and "serve" in r.stdout, r.stdout + r.stderr
    r = run(str(exe), "--version")
    assert r.stdout.strip() == f"kvoffload {__version__} (recording scan: compiled)", r.stderr
    r = run(str(exe), "serve", "--help")
    assert r.returncode == 0 and links.doc("advisor.md") in r.stdout, r.stdout + r.stderr
    r = run(
        str(py),
        "-c",
        "import importlib.util, pathlib, kvoffload, kvoffload.sidecar.service\n"
        "import kvoffload.sidecar.http, kvoffload.sim.server\n"
        "assert importlib.util.find_spec('grafanalib') is None, 'grafanalib installed'\n"
        "root = pathlib.Path(kvoffload.__file__).parent\n"
        "assert (root / 'py.typed').is_file()\n"
        "assert str(root).startswith(" + repr(str(venv)) + "), root\n",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    r = run(str(exe), "sim", "--list")
    assert r.returncode == 0 and "laptop-eviction" in r.stdout, r.stdout + r.stderr
    r = run(str(exe), "generate", "--out", str(tmp_path / "gen"))
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "kvoffload: error: the dashboards need grafanalib: pip install 'kvoffload[generate]' "
        "(from a clone: pip install '.[generate]')"
    )


@pytest.mark.slow
def test_without_a_c_compiler_the_wheel_is_pure_and_reads_the_same(
    wheel: Path, tmp_path: Path, sim_recording: Callable[..., tuple[Path, Path]]
) -> None:
    """The compiled scan is optional: with no C compiler the build goes on without it, and the
    package it gives reads a recording to the same JSON, bit for bit, with its pure-Python
    twin (`--version` says which scan is in use)."""
    pure = _build_wheel(tmp_path / "pure", env={**os.environ, "CC": "/bin/false"})
    with zipfile.ZipFile(pure) as z:
        assert not any(COMPILED_SCAN.fullmatch(n) for n in z.namelist())
    # What `record` leaves: the file the scan reads (the run's shared one: only read here).
    _journal, strict = sim_recording("restart", "restart:8000")
    reports = {}
    for name, whl in (("compiled", wheel), ("pure", pure)):
        site = tmp_path / f"site-{name}"
        with zipfile.ZipFile(whl) as z:
            z.extractall(site)
        env = {k: v for k, v in os.environ.items() if k != "KVOFFLOAD_PURE_PYTHON"}
        env["PYTHONPATH"] = str(site)  # ahead of the checkout the test environment imports
        run = functools.partial(
            subprocess.run, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
        )
        r = run([sys.executable, "-m", "kvoffload", "--version"])
        reader = "compiled" if name == "compiled" else "pure Python"
        assert r.stdout.strip() == f"kvoffload {__version__} (recording scan: {reader})"
        r = run([sys.executable, "-m", "kvoffload", "analyze", str(strict), "--json"])
        assert r.returncode == 0, r.stderr
        reports[name] = r.stdout
    assert reports["compiled"] == reports["pure"]
    assert json.loads(reports["pure"])["scrapes"] == 121
