"""examples/docker-compose.yml without a container engine: pinned images, files that exist
where the containers expect them (Prometheus' rule files, Grafana's provisioning and the
generated dashboards), and the sidecar run with the CLI's own flags and port, its target named
as Prometheus names vLLM (the rules join the two)."""

from __future__ import annotations

import json
import posixpath
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import pytest
import yaml
from click.testing import CliRunner

from kvoffload import __version__
from kvoffload.cli import cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
COMPOSE = yaml.safe_load((EXAMPLES / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
PROMETHEUS = yaml.safe_load((EXAMPLES / "prometheus.yml").read_text())
GRAFANA = EXAMPLES / "grafana" / "provisioning"


def default_port() -> int:
    ctx = click.Context(cli)
    serve = cli.get_command(ctx, "serve")  # type: ignore[attr-defined]
    (option,) = [p for p in serve.params if "--web.listen-address" in p.opts]
    return int(str(option.default).rsplit(":", 1)[1])


def mounts(service: str) -> dict[str, Path]:
    """Container path → host path of a service's bind mounts (relative to the compose file)."""
    out = {}
    for volume in SERVICES[service].get("volumes", []):
        source, target = volume.split(":")[:2]
        out[target] = (EXAMPLES / source).resolve()
    return out


def host_path(service: str, container_path: str) -> Path:
    """Where a path inside a service's container comes from on the host."""
    for target, source in sorted(mounts(service).items(), key=lambda m: -len(m[0])):
        if container_path == target or container_path.startswith(target.rstrip("/") + "/"):
            return source / posixpath.relpath(container_path, target)
    raise AssertionError(f"{service}: nothing mounted at {container_path}")


def targets(job: str) -> list[str]:
    (config,) = [c for c in PROMETHEUS["scrape_configs"] if c["job_name"] == job]
    return [t for s in config["static_configs"] for t in s["targets"]]


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_every_image_is_pinned(service: str) -> None:
    image = SERVICES[service]["image"]
    name, _, tag = image.rpartition(":")
    assert name and re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{service}: {image} is not pinned"


def test_every_bind_mount_exists() -> None:
    for service in SERVICES:
        for target, source in mounts(service).items():
            assert source.exists(), f"{service}: {source} (for {target}) does not exist"


def test_the_sidecar_is_the_image_and_cli_of_this_repository() -> None:
    sidecar = SERVICES["kvoffload"]
    assert sidecar["image"] == f"kvoffload:{__version__}"
    build = sidecar["build"]
    assert (EXAMPLES / build["context"] / build["dockerfile"]).resolve() == ROOT / "Dockerfile"
    args = sidecar["command"]
    assert args[0] == "serve"
    result = CliRunner().invoke(cli, [*args, "--help"])  # every flag exists
    assert result.exit_code == 0, result.output
    port = default_port()
    assert sidecar["ports"] == [f"{port}:{port}"]
    assert not any(a.startswith("--web.listen-address") for a in args)
    assert targets("kvoffload") == [f"kvoffload:{port}"]
    # Its target is vLLM as Prometheus scrapes it: `target` equals vLLM's `instance`.
    (target,) = [a.split("=", 1)[1] for a in args if a.startswith("--target=")]
    assert [urlsplit(target).netloc] == targets("vllm")
    kv = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in args[1:]}
    vllm_config = json.loads(
        next(a for a in SERVICES["vllm"]["command"] if a.startswith("--kv-events-config=")).split(
            "=", 1
        )[1]
    )
    assert kv["--kv-events"].rsplit(":", 1)[1] == vllm_config["endpoint"].rsplit(":", 1)[1]
    assert (
        kv["--kv-events-replay"].rsplit(":", 1)[1]
        == vllm_config["replay_endpoint"].rsplit(":", 1)[1]
    )


def test_prometheus_finds_its_rule_files_and_alertmanager() -> None:
    (flag,) = [a for a in SERVICES["prometheus"]["command"] if a.startswith("--config.file=")]
    config = flag.split("=", 1)[1]
    assert host_path("prometheus", config) == EXAMPLES / "prometheus.yml"
    for rule_file in PROMETHEUS["rule_files"]:
        inside = posixpath.normpath(posixpath.join(posixpath.dirname(config), rule_file))
        on_host = host_path("prometheus", inside)
        assert on_host.is_file() and on_host == (EXAMPLES / rule_file).resolve(), rule_file
    (am,) = [
        t
        for a in PROMETHEUS["alerting"]["alertmanagers"]
        for s in a["static_configs"]
        for t in s["targets"]
    ]
    assert am.split(":")[0] in SERVICES


def test_grafana_provisions_the_data_source_and_the_generated_dashboards() -> None:
    assert host_path("grafana", "/etc/grafana/provisioning") == GRAFANA
    (source,) = yaml.safe_load((GRAFANA / "datasources" / "prometheus.yaml").read_text())[
        "datasources"
    ]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    url = urlsplit(source["url"])
    assert url.hostname in SERVICES and f"{url.port}:{url.port}" in SERVICES[url.hostname]["ports"]
    assert source["jsonData"]["timeInterval"] == PROMETHEUS["global"]["scrape_interval"]
    (provider,) = yaml.safe_load((GRAFANA / "dashboards" / "kvoffload.yaml").read_text())[
        "providers"
    ]
    assert provider["type"] == "file"
    folder = host_path("grafana", provider["options"]["path"])
    assert folder == ROOT / "dashboards" / "provisioning"
    dashboards = sorted(folder.glob("*.json"))
    assert dashboards
    for path in dashboards:
        d = json.loads(path.read_text())
        assert "__inputs" not in d, f"{path.name}: an import variant cannot be provisioned"
        (ds,) = [v for v in d["templating"]["list"] if v["type"] == "datasource"]
        assert ds["query"] == "prometheus" and not ds.get("current")  # the default source
