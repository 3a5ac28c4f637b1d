"""The alert group (mixin/alerts.py): one declaration per alert, reaching the file whole."""

from __future__ import annotations

import pytest
import yaml

from kvoffload.mixin import alerts, rules
from kvoffload.mixin.config import MixinConfig


def test_an_alert_declared_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="KVOffloadSidecarDown is declared twice"):
        alerts.alert("KVOffloadSidecarDown", "5m", "warning", "again")


def test_each_declaration_reaches_the_alerts_file() -> None:
    cfg = MixinConfig(
        severity_warning="page",
        alert_for={**MixinConfig().alert_for, "KVOffloadBufferOversized": "2h"},
    )
    text = rules.render(cfg)[rules.ALERTS_FILE]
    written = {r["alert"]: r for r in yaml.safe_load(text)["groups"][0]["rules"]}
    assert list(written) == [a.name for a in alerts.ALERTS]
    for a in alerts.ALERTS:
        rule = written[a.name]
        assert rule["labels"]["severity"] == ("page" if a.severity == "warning" else "info")
        assert rule["annotations"]["summary"] == a.summary
        assert rule["annotations"]["runbook_url"].endswith(f"#{a.name.lower()}")
        expected = "2h" if a.name == "KVOffloadBufferOversized" else a.default_for
        assert rule["for"] == expected
