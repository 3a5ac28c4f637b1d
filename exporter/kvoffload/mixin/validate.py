"""Every expression `generate` writes, checked by promql-parser and promtool before any is written.

A failure is a generator bug or a setting past MixinConfig's checks: the user gets one line.
Nothing half-valid then reaches a user's Prometheus or Grafana."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kvoffload.errors import InputError

# Grafana's interval variables stand where PromQL wants a duration.
_INTERVALS = re.compile(r"\$\{?__(rate_interval|interval|range)(_ms|_s)?\}?")
_LABEL_VALUES = re.compile(r"^label_values\((?:(.+),\s*)?(\w+)\)$", re.S)


@dataclass(frozen=True)
class Checked:
    """What was checked: expressions parsed, rule files given to promtool (None: no promtool)."""

    expressions: int
    promtool: str | None
    rule_files: int


def _rule_groups(doc: Any) -> list[dict[str, Any]] | None:
    """The rule groups of a rule file or a PrometheusRule; None for any other document."""
    if not isinstance(doc, dict):
        return None
    if isinstance(doc.get("groups"), list):
        return list(doc["groups"])
    spec = doc.get("spec")
    if doc.get("kind") == "PrometheusRule" and isinstance(spec, dict):
        return list(spec.get("groups") or [])
    return None


def _dashboard_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _dashboard_panels(p.get("panels") or [])


def expressions(files: Mapping[str, str]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every expression in the generated files, as the parser should see them.

    Dashboard interval variables are replaced by a duration."""
    for rel, text in files.items():
        if rel.endswith((".yaml", ".yml")):
            for group in _rule_groups(yaml.safe_load(text)) or []:
                for rule in group.get("rules") or []:
                    name = rule.get("record") or rule.get("alert")
                    yield f"{rel}: {name}", str(rule.get("expr", ""))
        elif rel.endswith(".json"):
            d = json.loads(text)
            for p in _dashboard_panels(d.get("panels") or []):
                for t in p.get("targets") or []:
                    expr = _INTERVALS.sub("5m", t.get("expr", ""))
                    yield f"{rel}: panel {p.get('title')!r} {t.get('refId')}", expr
            for v in (d.get("templating") or {}).get("list") or []:
                if v.get("type") != "query":
                    continue
                m = _LABEL_VALUES.match(v.get("definition", ""))
                where = f"{rel}: variable {v.get('name')!r}"
                if not m:
                    yield where, v.get("definition", "")  # not label_values(): parse it whole
                elif m.group(1):
                    yield where, _INTERVALS.sub("5m", m.group(1))


def promql_parser() -> Any:
    """The promql_parser module (the `generate` extra), or InputError saying what to install."""
    try:
        import promql_parser
    except ModuleNotFoundError:
        raise InputError(
            "generate checks PromQL with promql-parser: pip install 'kvoffload[generate]' "
            "(from a clone: pip install '.[generate]')"
        ) from None
    return promql_parser


def parse_problems(files: Mapping[str, str]) -> tuple[int, list[str]]:
    """(expressions parsed, problems) with promql-parser."""
    parser = promql_parser()
    count, problems = 0, []
    for where, expr in expressions(files):
        count += 1
        try:
            parser.parse(expr)
        except ValueError as exc:
            problems.append(f"{where}: {str(exc).splitlines()[0] if str(exc) else exc!r}")
    return count, problems


def promtool_problems(files: Mapping[str, str], promtool: str) -> tuple[int, list[str]]:
    """(rule files checked, problems) with `promtool check rules`, the PrometheusRule's groups too.

    It speaks for the user's Prometheus: 2 refuses 3's quoted label names; the parser takes them."""
    rule_files: dict[str, str] = {}
    for rel, text in files.items():
        if not rel.endswith((".yaml", ".yml")):
            continue
        doc = yaml.safe_load(text)
        groups = _rule_groups(doc)
        if groups is None:
            continue
        # A plain rule file as written (promtool's line numbers are the file's); a
        # PrometheusRule's groups as a rule file of their own.
        plain = isinstance(doc, dict) and "groups" in doc
        rule_files[rel] = text if plain else yaml.safe_dump({"groups": groups}, sort_keys=False)
    if not rule_files:
        return 0, []
    with tempfile.TemporaryDirectory(prefix="kvoffload-generate-") as tmp:
        paths = {}
        for i, (rel, body) in enumerate(rule_files.items()):
            path = Path(tmp) / f"{i}-{Path(rel).name}"
            path.write_text(body)
            paths[str(path)] = rel
        try:
            result = subprocess.run(
                [promtool, "check", "rules", *paths],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return len(paths), [f"{promtool} check rules did not run: {exc}"]
    if result.returncode == 0:
        return len(paths), []
    out = result.stderr + result.stdout
    for tmp_path, rel in paths.items():
        out = out.replace(tmp_path, rel)
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln != "FAILED:" and not ln.startswith(("Checking ", "SUCCESS"))]
    return len(paths), errors or [f"promtool check rules exited {result.returncode}"]


def find_promtool() -> str | None:
    return shutil.which("promtool")


def validate(files: Mapping[str, str], promtool: str | None) -> Checked:
    """Check every expression of `files` (relative path → text).

    When any fails: InputError, one line naming the first problem and how many there are."""
    count, problems = parse_problems(files)
    tool_problems: list[str] = []
    rule_files = 0
    if promtool and not problems:  # promtool would only repeat the parser's complaints
        rule_files, tool_problems = promtool_problems(files, promtool)
    for source, found in (("promql-parser", problems), ("promtool check rules", tool_problems)):
        if found:
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            raise InputError(f"generated PromQL refused by {source}: {found[0]}{more}")
    return Checked(count, promtool, rule_files)
