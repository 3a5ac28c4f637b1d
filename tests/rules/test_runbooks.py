"""Every alert's runbook hands the on-call the fix and the check that it worked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvoffload.mixin.alerts import ALERT_NAMES

RUNBOOKS = Path(__file__).resolve().parents[2] / "docs" / "runbooks.md"
# How long to watch, as the Verify-it step says it: "15 minutes", "an hour", "a day", ...
DURATION = re.compile(
    r"\b(\d+ (second|minute|hour|day)s?|an hour|a day|a window|scrape intervals?|"
    r"a few minutes)\b"
)


def _sections() -> dict[str, str]:
    text = RUNBOOKS.read_text()
    parts = re.split(r"^## ", text, flags=re.M)[1:]
    return {p.split("\n", 1)[0].strip(): p for p in parts}


@pytest.mark.parametrize("alert", ALERT_NAMES)
def test_each_runbook_says_how_to_change_it_and_verify_it(alert: str) -> None:
    """A "Change it" step naming a flag, a command or a setting, with its place in
    Kubernetes; a "Verify it" step naming what to look at and for how long."""
    section = _sections()[alert]
    change = section.split("**Change it.**", 1)[1].split("**Verify it.**", 1)[0]
    assert re.search(r"`--?[a-z]|`kubectl|`kvoffload|store_threshold", change), alert
    assert "Kubernetes" in change or "kubectl" in change or "monitor" in change, alert
    verify = section.split("**Verify it.**", 1)[1].split("\n\n", 1)[0]
    assert re.search(r"\*[A-Z][^*]+\*|`[a-z_]+", verify), f"{alert}: no panel or series"
    assert DURATION.search(verify), f"{alert}: no time to watch"


def test_the_kubernetes_patch_is_a_valid_json_patch() -> None:
    """The shared Kubernetes step's `kubectl patch` carries a JSON patch that parses."""
    import json

    text = RUNBOOKS.read_text()
    (patch,) = re.findall(r"--type json -p \\\n  '(\[.*?\])'", text)
    ops = json.loads(patch)
    assert ops[0]["op"] == "replace" and ops[0]["path"].startswith("/spec/template/spec/")
