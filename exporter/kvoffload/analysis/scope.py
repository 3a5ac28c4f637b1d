"""What PromQL rendering needs to know about where the series live: selectors, labels, names.

Why: the formulas and conditions take this protocol, not `mixin.config.MixinConfig`, so
`analysis/` never imports `mixin/`.
"""

from __future__ import annotations

from typing import Protocol


class Scope(Protocol):
    """The fields and the one lookup that rendering a figure or a condition as PromQL reads."""

    # Read-only: MixinConfig is a frozen dataclass.
    @property
    def vllm_selector(self) -> str:
        """Matchers added to every vLLM selector."""
        ...

    @property
    def sidecar_selector(self) -> str:
        """Matchers selecting the sidecar's own series."""
        ...

    @property
    def target_labels(self) -> tuple[str, ...]:
        """Labels that tell scrape targets apart."""
        ...

    @property
    def sidecar_target_label(self) -> str:
        """The sidecar's label naming its vLLM target."""
        ...

    @property
    def world_size(self) -> int:
        """TP×PP ranks whose copy times vLLM adds up."""
        ...

    def record_name(self, key: str) -> str:
        """The recording rule that renders figure `key` (at its first window)."""
        ...
