"""`kvoffload generate`: write the rule files and dashboards for the user's labels.

Everything users import comes from the signal catalog through one config (`MixinConfig`).
The committed alerts/ and dashboards/ are its output for the defaults; a test fails on drift."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path
from typing import Any

from kvoffload.mixin import dashboards, kustomize, rules
from kvoffload.mixin.config import MixinConfig
from kvoffload.mixin.settings import RENAMED_SETTINGS
from kvoffload.mixin.validate import Checked, find_promtool, validate
from kvoffload.overrides import parse_number, refuse, split_pair

ALERTS_DIR = "alerts"
DASHBOARDS_DIR = "dashboards"
FIND_PROMTOOL = "PATH"  # `promtool` default: the promtool on the PATH, if there is one


def render_all(config: MixinConfig | None = None) -> dict[str, str]:
    """Relative path → file text of everything generated."""
    cfg = config or MixinConfig()
    out = {f"{ALERTS_DIR}/{name}": text for name, text in rules.render(cfg).items()}
    out |= {f"{DASHBOARDS_DIR}/{name}": text for name, text in dashboards.render(cfg).items()}
    out |= kustomize.render(cfg, out, ALERTS_DIR, DASHBOARDS_DIR)  # both folders as bases
    return out


def parse_overrides(pairs: Iterable[str], base: MixinConfig | None = None) -> dict[str, Any]:
    """`KEY=VALUE` strings (the CLI's --set) → typed MixinConfig overrides.

    Numbers stay numbers, tuples are comma-separated (`target_labels=job,instance,pod`), and
    mapping fields take one entry per pair: `alert_for.KVOffloadTransferSlow=1h`.
    """
    base = base or MixinConfig()
    defaults = {f.name: getattr(base, f.name) for f in fields(base)}
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if key.strip() in RENAMED_SETTINGS:  # the old name of a threshold: still accepted
            pair = f"{RENAMED_SETTINGS[key.strip()]}{sep}{value}"
        name, entry, raw = split_pair(
            "--set", pair, defaults, usage="expected", strip=True, entries=True
        )
        default = defaults[name]
        if isinstance(default, dict):
            if not entry:
                raise refuse("--set", pair, f"use {name}.<key>=<value>")
            out[name] = {**out.get(name, default), entry: raw}
        elif entry:
            raise refuse("--set", pair, f"{name} is not a mapping")
        elif isinstance(default, tuple):
            out[name] = tuple(v.strip() for v in raw.split(",") if v.strip())
        elif isinstance(default, bool):
            out[name] = raw.lower() in ("1", "true", "yes", "on")
        elif isinstance(default, int | float):
            kind = float if isinstance(default, float) else int
            out[name] = parse_number("--set", pair, raw, kind, f"{name} takes a number")
        else:
            out[name] = raw or None if default is None else raw
    return out


def make_config(
    config: MixinConfig | None = None, *, selector: str | None = None, **overrides: Any
) -> MixinConfig:
    """The default config (or `config`), with MixinConfig fields overridden by name.

    `selector` is the vLLM matchers, e.g. 'job="vllm"', as `--selector` gives them."""
    cfg = config or MixinConfig()
    if selector is not None:
        overrides["vllm_selector"] = selector
    return cfg.with_overrides(**overrides) if overrides else cfg


def generate(
    out_dir: str | Path,
    config: MixinConfig | None = None,
    *,
    selector: str | None = None,
    promtool: str | None = FIND_PROMTOOL,
    **overrides: Any,
) -> list[Path]:
    """Write every generated file under `out_dir` (alerts/…, dashboards/…); return the paths.

    Files are written only when changed, and only after `validate` passed them all.
    `overrides` are MixinConfig fields, e.g. `low_reuse_ratio=0.1`, `rate_window="2m"`."""
    # `promtool`: by default the one on the PATH, if any; None skips it.
    return generate_checked(out_dir, config, selector=selector, promtool=promtool, **overrides)[0]


def generate_checked(
    out_dir: str | Path,
    config: MixinConfig | None = None,
    *,
    selector: str | None = None,
    promtool: str | None = FIND_PROMTOOL,
    **overrides: Any,
) -> tuple[list[Path], Checked]:
    """`generate`, also saying what the expressions were checked with."""
    cfg = make_config(config, selector=selector, **overrides)
    files = render_all(cfg)
    checked = validate(files, find_promtool() if promtool == FIND_PROMTOOL else promtool)
    root = Path(out_dir)
    written = []
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        written.append(path)
    return written, checked


def check(
    out_dir: str | Path,
    config: MixinConfig | None = None,
    *,
    selector: str | None = None,
    **overrides: Any,
) -> list[str]:
    """Relative paths whose content under `out_dir` differs from what would be generated."""
    cfg = make_config(config, selector=selector, **overrides)
    root = Path(out_dir)
    stale = []
    for rel, text in render_all(cfg).items():
        path = root / rel
        if not path.exists() or path.read_text() != text:
            stale.append(rel)
    return stale
