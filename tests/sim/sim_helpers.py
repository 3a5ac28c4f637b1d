"""Shared helpers of the simulator tests: parse a /metrics body into plain dicts."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Key = tuple[str, frozenset[tuple[str, str]]]


def parse(body: bytes) -> tuple[dict[str, object], dict[Key, float]]:
    """(families by name, samples by (sample name, labels)) of a text-format body."""
    families: dict[str, object] = {}
    samples: dict[Key, float] = {}
    for fam in text_string_to_metric_families(body.decode()):
        families[fam.name] = fam
        for s in fam.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return families, samples


def total(samples: dict[Key, float], name: str, **labels: str) -> float:
    """Sum of every sample called `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= lab)


def names(samples: dict[Key, float]) -> set[str]:
    return {n for n, _ in samples}
