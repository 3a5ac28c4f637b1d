"""The one config every rule, alert and dashboard reads (the mixin `_config`).

Why here: it completes `settings.Settings` with what the renderings and alerts declare (rule
names, alert names and `for`s), so a bad setting fails at once, by name."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvoffload.errors import InputError
from kvoffload.mixin.alerts import ALERT_NAMES, DEFAULT_FOR
from kvoffload.mixin.renderings import record_name
from kvoffload.mixin.settings import Settings


@dataclass(frozen=True)
class MixinConfig(Settings):
    """The settings, with every alert's `for` (its default unless set) and the rule names."""

    alert_for: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_FOR))

    def check_alert_for(self) -> None:
        """Each alert named is declared, has a `for`, and that is a Prometheus duration."""
        for name in self.alert_for:
            if name not in ALERT_NAMES:
                raise InputError(f"alert_for: unknown alert {name!r}")
        super().check_alert_for()
        missing = set(ALERT_NAMES) - set(self.alert_for)
        if missing:
            raise InputError(f"alert_for: no duration for {', '.join(sorted(missing))}")

    def record_name(self, key: str) -> str:
        """The recording rule that renders figure `key` (analysis.scope.Scope asks for it)."""
        return record_name(key, self)
