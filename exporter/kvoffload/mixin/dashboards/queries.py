"""The PromQL of one dashboard's panels, and the raw PromQL that stands in for a missing rule.

Without kvoffload's rules (import only, the usual first step) a panel reads `rule or <its PromQL>`.
So it shows the same figure either way."""

from __future__ import annotations

import re

from kvoffload.analysis.formula import (
    GATE_RECORD,
    Expr,
    Ratio,
    TimesWorldSize,
    WhenOffloading,
    counter_series,
    div,
    paren,
    target_by,
)
from kvoffload.analysis.signals import FIGURES_BY_KEY
from kvoffload.mixin.config import MixinConfig
from kvoffload.mixin.renderings import (
    RENDERINGS,
    Rendering,
    helper_record,
    offload_configured,
    rendering_for,
)

# A recording rule's name (level:metric:operation); `vllm[:_]name` selectors do not match.
RULE_NAME = re.compile(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+")
# What the description of a panel that reads a rule with no raw fallback says.
# Like vLLM's own generator, one scope selector per source goes into every query: a variable per
# `target_labels` entry, `model_name`, and `engine` on per-engine views.
NEEDS_RULES = "Needs kvoffload's recording rules"
NEEDS_RULES_TITLE = "Panels that need kvoffload's recording rules"


def raw_expr(r: Rendering, cfg: MixinConfig, which: str | None, scope: str = "") -> str | None:
    """The rule's own PromQL with `scope` added to its vLLM selectors, and its static labels.

    None where it reads another recording rule, which it cannot stand in for."""
    # The offload gate is inlined unscoped: vLLM's config info has no model_name.
    if not cfg.dashboard_raw_fallback:
        return None
    expr = _scoped(r.build(cfg, r.window(cfg, which) if which else ""), cfg, scope)
    if RULE_NAME.search(expr):
        return None
    for label, value in r.labels:
        expr = f'label_replace({expr}, "{label}", "{value}", "", "")'
    return expr


def _scoped(expr: str, cfg: MixinConfig, scope: str) -> str:
    """`expr` with `scope` added to its vLLM selectors and the offload gate inlined."""
    if scope:
        expr = re.sub(r'\{__name__=~"vllm\[:_\][^"]*"', lambda m: f"{m.group(0)}, {scope}", expr)
    return expr.replace(GATE_RECORD, f"(\n{offload_configured(cfg)}\n)")


def pooled_expr(e: Expr, cfg: MixinConfig, w: str, scope: str, gate: bool = False) -> str:
    """Figure `e` over every selected target and model at once.

    Each ratio is a sum over sum, not an average of ratios; rates are summed over targets."""
    if isinstance(e, WhenOffloading):
        return pooled_expr(e.inner, cfg, w, scope, gate or e.gate)
    if isinstance(e, Ratio):
        return div(pooled_expr(e.num, cfg, w, scope, gate), pooled_expr(e.den, cfg, w, scope, gate))
    if isinstance(e, TimesWorldSize) and cfg.world_size != 1:
        return f"{paren(pooled_expr(e.inner, cfg, w, scope, gate))}\n* {cfg.world_size}"
    if isinstance(e, TimesWorldSize):
        return pooled_expr(e.inner, cfg, w, scope, gate)
    leaf = e.promql(cfg, w)
    if gate:
        leaf = f"{paren(leaf)}\nand on ({target_by(cfg)})\n{GATE_RECORD}"
    return f"sum {paren(_scoped(leaf, cfg, scope))}"


def fallback_rules(cfg: MixinConfig) -> set[str]:
    """Recording rules a panel reads as `rule or raw`: it shows data without the rules."""
    return {
        r.record(cfg, w)
        for r in RENDERINGS
        for w in r.windows or (None,)
        if raw_expr(r, cfg, w) is not None
    }


def needs_rules(expr: str, cfg: MixinConfig) -> list[str]:
    """The recording rules `expr` reads that have no raw fallback."""
    fallback = fallback_rules(cfg)
    return sorted({n for n in RULE_NAME.findall(expr) if n not in fallback})


def _scope(cfg: MixinConfig) -> str:
    """Matchers of the dashboard variables on the target labels and model_name."""
    return ", ".join(
        [*(f'{label}=~"${label}"' for label in cfg.target_labels), 'model_name=~"$model_name"']
    )


class PanelQueries:
    """The queries of one dashboard's panels: recording rules, raw vLLM series, sidecar series."""

    def __init__(self, cfg: MixinConfig, per_engine: bool) -> None:
        self.cfg = cfg
        self.per_engine = per_engine
        self.scope = _scope(cfg)

    def rule(self, key: str, which: str | None = None) -> str:
        r = rendering_for(key)
        return self._or_raw(r, which or (r.windows[0] if r.windows else None))

    def helper(self, metric: str, op: str, *matchers: str, which: str = "fast") -> str:
        # Renderings of one name differ in their static labels (the quantile): the matchers pick.
        for r in RENDERINGS:
            labels = {f'{k}="{v}"' for k, v in r.labels}
            if r.metric == metric and r.op == op and which in r.windows and labels <= set(matchers):
                return self._or_raw(r, which, *matchers)
        raise KeyError((metric, op, which))

    def _or_raw(
        self, r: Rendering, which: str | None, *matchers: str, scope: str | None = None
    ) -> str:
        """The rule, else its own expression over the raw series, scoped by the variables.

        Without kvoffload's rules the panel still shows it. With them, `or` adds nothing."""
        # Both sides hold the same label sets, so the raw side never adds a series.
        scope = self.scope if scope is None else scope
        rule = f"{r.record(self.cfg, which)}{{{', '.join([scope, *matchers])}}}"
        raw = raw_expr(r, self.cfg, which, scope)
        return rule if raw is None else f"(\n{rule}\nor\n{raw}\n)"

    def pooled(self, key: str) -> str:
        """Catalog figure `key` across every selected engine and model, as sums of rates over sums.

        A stat showing one number for many models must not average ratios."""
        r = rendering_for(key)
        which = r.windows[0] if r.windows else "fast"
        return pooled_expr(
            FIGURES_BY_KEY[key].formula, self.cfg, r.window(self.cfg, which), self.scope
        )

    def replica_mean(self, metric: str, op: str, which: str) -> str:
        """A per-model replicas rule scoped by the model alone, else all its renderings raw.

        Such a rule has no target labels, and one rendering per static label set (tier or none)."""
        scope = 'model_name=~"$model_name"'
        family = [r for r in RENDERINGS if r.metric == metric and r.op == op]
        rule = f"{family[0].record(self.cfg, which)}{{{scope}}}"
        raws = [raw_expr(r, self.cfg, which, scope) for r in family]
        if any(raw is None for raw in raws):
            return rule
        return "(\n" + "\nor\n".join([rule, *(str(raw) for raw in raws)]) + "\n)"

    def replica_effect(self) -> str:
        """The replicas' A/B difference (with a tier minus without), else from the raw means.

        Its rule reads the mean rules, so its own expression cannot stand in for it."""
        scope = 'model_name=~"$model_name"'
        rule = helper_record(
            "vllm_time_to_first_token_seconds", "replica_ab_rate", self.cfg, "slow"
        )
        on, off = (
            raw_expr(r, self.cfg, "slow", scope)
            for r in RENDERINGS
            if r.metric == "vllm_time_to_first_token_seconds" and r.op == "replica_mean_rate"
        )
        if on is None or off is None:
            return f"{rule}{{{scope}}}"
        assert 'offloading", "on"' in on
        return f"(\n{rule}{{{scope}}}\nor\n(\n{on}\n- ignoring (offloading)\n{off}\n)\n)"

    def raw(self, name: str, *matchers: str) -> str:
        """Raw vLLM series: the rules' selector too (the variables' "All" is `.+`)."""
        parts = [f'__name__=~"vllm[:_]{name}"']
        if self.cfg.vllm_selector:
            parts.append(self.cfg.vllm_selector)
        parts.append(self.scope)
        if self.per_engine:
            parts.append('engine=~"$engine"')
        return "{" + ", ".join([*parts, *matchers]) + "}"

    def raw_info(self, name: str) -> str:
        """vLLM's info gauges: no model_name label, so only the target labels and engine."""
        parts = [f'__name__=~"vllm[:_]{name}"']
        if self.cfg.vllm_selector:
            parts.append(self.cfg.vllm_selector)
        parts += [f'{label}=~"${label}"' for label in self.cfg.target_labels]
        if self.per_engine:
            parts.append('engine=~"$engine"')
        return "{" + ", ".join(parts) + "}"

    def labelled(self, label: str, parts: dict[str, str]) -> str:
        """Several queries as one, each tagged by `label`.

        One series set and one legend, with data as soon as any part has some."""
        return "\nor\n".join(
            f'label_replace({expr}, "{label}", "{value}", "", "")' for value, expr in parts.items()
        )

    def sidecar(self, name: str, *matchers: str) -> str:
        parts = [self.cfg.sidecar_selector] if self.cfg.sidecar_selector else []
        parts += [f'{self.cfg.sidecar_target_label}=~"$instance"', 'model_name=~"$model_name"']
        return f"{name}{{{', '.join([*parts, *matchers])}}}"

    def sidecar_by_instance(self, name: str, *matchers: str) -> str:
        """A sidecar series with its vLLM target copied into `instance`.

        So it sits in one table row with that instance's rules; the sidecar's own `instance` is its
        address."""
        return (
            f'label_replace({self.sidecar(name, *matchers)}, "instance", "$1", '
            f'"{self.cfg.sidecar_target_label}", "(.+)")'
        )

    def coded(self, name: str, label: str, codes: dict[str, int], by: str, flag: bool) -> str:
        """Which value of `label` a sidecar series holds per `by`, as its code.

        PromQL cannot turn a label into a number, so there is one branch per value."""
        # A branch holds where the series is 1 (`flag`: a 0/1 series per value, like
        # kvoffload_recommendation), or else where it exists.
        branches = []
        for value, code in codes.items():
            sel = self.sidecar_by_instance(name, f'{label}="{value}"')
            one = f"max by ({by}) ({sel}) == 1" if flag else f"group by ({by}) ({sel})"
            branches.append(f"{code} * ({one})")
        return "\nor\n".join(branches)

    def offload_rate(self, direction: str, by: str) -> str:
        """Per-engine transfer traffic from the raw counters, in the catalog's order of
        preference (flat names, else the deprecated mirror)."""
        return "\nor\n".join(
            f"sum by ({by}) (rate({self.raw(name, *matchers)}[$__rate_interval]))"
            for name, matchers in counter_series((f"{direction}_bytes",))
        )
