"""The options and settings the commands share: durations, sizes, thresholds, scenarios."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click
import yaml

from kvoffload.analysis.advisor import read_cgroup_memory_limit
from kvoffload.analysis.analyze import Settings
from kvoffload.errors import InputError
from kvoffload.flagvalues import duration_callback, size_callback
from kvoffload.overrides import parse_number, split_pair
from kvoffload.thresholds import Thresholds

if TYPE_CHECKING:  # (imported where used: `analyze FILE` starts without aiohttp and requests)
    pass


EXIT_BAD_INPUT = 2


def _threshold_number(path: str, key: str, value: object) -> float:
    # YAML 1.1 reads `10e9` (no dot) as a string: accept what float() accepts, nothing else.
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise InputError(f"{path}: threshold {key!r} must be a number")


def load_thresholds(path: str | None, overrides: dict[str, float]) -> Thresholds:
    values: dict[str, float] = {}
    if path:
        try:
            with open(path) as fh:
                data = yaml.safe_load(fh) or {}
        except OSError as exc:
            raise InputError(f"{path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise InputError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
        if not isinstance(data, dict):
            raise InputError(f"{path}: expected a mapping of threshold names to numbers")
        known = set(Thresholds.__dataclass_fields__)
        for key, value in data.items():
            if key not in known:
                raise InputError(
                    f"{path}: unknown threshold {key!r} (known: {', '.join(sorted(known))})"
                )
            values[key] = _threshold_number(path, key, value)
    values.update({k: v for k, v in overrides.items() if v is not None})
    return Thresholds(**values)


# One spelling for both commands that scrape (the old one kept as an alias).
scrape_timeout_option = click.option(
    "--scrape.timeout",
    "--scrape-timeout",
    "scrape_timeout",
    callback=duration_callback,
    default="10s",
    show_default=True,
    help="Longest one scrape of the target may take (--scrape-timeout: the old spelling).",
)


def settings_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by serve and analyze: how to read the figures and judge them."""
    for option in reversed(
        [
            click.option(
                "--world-size",
                type=click.IntRange(1),
                default=1,
                show_default=True,
                help="GPUs per engine (TP×PP): vLLM sums copy times over ranks.",
            ),
            click.option(
                "--memory-limit",
                callback=size_callback,
                default=None,
                help="The vLLM container's memory limit, for the OOM check (default: its "
                "pod's cgroup memory.max less the sidecar's own, where visible; in Kubernetes "
                "set KVOFFLOAD_MEMORY_LIMIT from vLLM's limits.memory, Downward API).",
            ),
            click.option(
                "--thresholds",
                "thresholds_file",
                type=click.Path(dir_okay=False),
                default=None,
                help="YAML file of advisor thresholds (docs: advisor.md, below).",
            ),
            click.option(
                "--kv-bytes-per-token",
                callback=size_callback,
                default=None,
                help="KV bytes per token (all ranks) when vLLM exposes none (offloading "
                "off, no --kv-cache-memory-bytes): sizes the start of `enable`.",
            ),
            click.option(
                "--threshold",
                "threshold_overrides",
                multiple=True,
                metavar="KEY=VALUE",
                help="One advisor threshold, e.g. min_ttft_saving_seconds=0.01 "
                "(over the YAML file); repeatable.",
            ),
        ]
    ):
        fn = option(fn)
    return fn


def make_settings(
    world_size: int,
    memory_limit: float | None,
    thresholds_file: str | None,
    threshold_overrides: tuple[str, ...] = (),
    kv_bytes_per_token: float | None = None,
) -> Settings:
    limit = memory_limit
    if limit is None and (limit := read_cgroup_memory_limit()) is not None:
        logging.getLogger("kvoffload").info(
            "memory check against %.2f GiB: the pod's cgroup limit less the sidecar's "
            "(--memory-limit to give vLLM's)",
            limit / 2**30,
        )
    overrides: dict[str, float] = {}
    known = set(Thresholds.__dataclass_fields__)
    for item in threshold_overrides:
        key, _, raw = split_pair("--threshold", item, known)
        overrides[key] = parse_number("--threshold", item, raw, float, f"{raw!r} is not a number")
    return Settings(
        world_size, limit, kv_bytes_per_token, load_thresholds(thresholds_file, overrides)
    )


def scenario_named(name: str):
    from kvoffload.sim import scenarios

    try:
        return scenarios.get(name)
    except KeyError as exc:
        raise InputError(str(exc.args[0])) from None
