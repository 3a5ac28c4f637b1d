"""One formula per figure, two renderings: Python over a window, PromQL over a scope.

A figure is a small expression tree whose nodes evaluate over a `context.Context` and render over
a `Scope`. So the sidecar, recording rules and dashboards share one definition.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kvoffload.analysis.context import Context
from kvoffload.ingest.catalog import (
    CORE_COUNTERS,
    GAUGES,
    OFFLOAD_COUNTERS,
    REGEX_KEYS,
    SUMMED_GAUGES,
)

if TYPE_CHECKING:
    from kvoffload.analysis.scope import Scope

GATE_RECORD = "instance:vllm_kv_offload_configured:group"


# -- PromQL text helpers -----------------------------------------------------------------------
def indent(text: str, by: str = "  ") -> str:
    return "\n".join(by + line if line else line for line in text.splitlines())


def paren(expr: str) -> str:
    if "\n" in expr:
        return "(\n" + indent(expr) + "\n)"
    return f"({expr})"


def binop(left: str, op: str, right: str) -> str:
    """`left op right` laid out one operand per line once it gets long."""
    if "\n" in left or "\n" in right or len(left) + len(right) > 80:
        return f"{left}\n{op}\n{right}"
    return f"{left} {op} {right}"


def div(num: str, den: str) -> str:
    """A ratio that is absent, not NaN, when the denominator is zero."""
    return binop(num, "/", paren(f"{den} > 0" if "\n" not in den else den + "\n> 0"))


def by_labels(cfg: Scope) -> str:
    return ", ".join((*cfg.target_labels, "model_name"))


def target_by(cfg: Scope) -> str:
    return ", ".join(cfg.target_labels)


def vllm(cfg: Scope, name: str, *matchers: str) -> str:
    """A selector for a vLLM sample name under both spellings (`vllm:` and escaped `vllm_`)."""
    parts = [f'__name__=~"vllm[:_]{name}"']
    if cfg.vllm_selector:
        parts.append(cfg.vllm_selector)
    parts.extend(matchers)
    return "{" + ", ".join(parts) + "}"


def sidecar(cfg: Scope, name: str, *matchers: str) -> str:
    inner = ", ".join(m for m in (cfg.sidecar_selector, *matchers) if m)
    return f"{name}{{{inner}}}" if inner else name


def sidecar_as_vllm(cfg: Scope, name: str, *matchers: str) -> str:
    """A sidecar gauge relabelled to join vLLM rules: its `target` names the vLLM instance."""
    return (
        f'label_replace({sidecar(cfg, name, *matchers)}, "instance", "$1", '
        f'"{cfg.sidecar_target_label}", "(.+)")'
    )


def sum_fn(
    cfg: Scope,
    fn: str,
    name: str,
    window: str,
    *matchers: str,
    extra_by: tuple[str, ...] = (),
) -> str:
    by = ", ".join((*cfg.target_labels, "model_name", *extra_by))
    return f"sum by ({by}) ({fn}({vllm(cfg, name, *matchers)}[{window}]))"


def sum_rate(cfg: Scope, name: str, window: str, *matchers: str) -> str:
    return sum_fn(cfg, "rate", name, window, *matchers)


# -- the catalog, in PromQL --------------------------------------------------------------------
def _bare(sample_name: str) -> str:
    return sample_name.removeprefix("vllm:")


def _core_selector(keys: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """(name without `vllm:`, matchers) of one or more core keys of the same sample name."""
    sources = [CORE_COUNTERS[k] for k in keys]
    names = {name for name, _l, _v in sources}
    labels = {label for _n, label, _v in sources}
    if len(names) != 1 or len(labels) != 1:
        raise ValueError(f"keys {keys} do not share one sample name and label")
    (name,), (label,) = names, labels
    if label is None:
        if len(keys) != 1:
            raise ValueError(f"keys {keys}: the same unlabelled series twice")
        return _bare(name), ()
    values = [v for _n, _l, v in sources if v is not None]
    regex = any(k in REGEX_KEYS for k in keys)  # a tier pattern: its series summed
    op = "=~" if regex or len(values) > 1 else "="
    matcher = f'{label}{op}"{"|".join(values)}"'
    return _bare(name), (matcher,)


def counter_series(keys: tuple[str, ...]) -> list[tuple[str, tuple[str, ...]]]:
    """The series of catalog counter keys, most preferred first, as (name without `vllm:`,
    matchers). An offload transfer key gives the flat family, then the deprecated `transfer_type`
    mirror, joined with `or`, never added."""
    if len(keys) == 1 and keys[0] in OFFLOAD_COUNTERS:
        _direction, (flat, _fl, _fv), (legacy, label, value) = OFFLOAD_COUNTERS[keys[0]]
        return [(_bare(flat), ()), (_bare(legacy), (f'{label}="{value}"',))]
    return [_core_selector(keys)]


def counter_sum(
    cfg: Scope,
    fn: str,
    keys: tuple[str, ...],
    window: str | None,
    extra_by: tuple[str, ...] = (),
) -> str:
    """`sum by (...) (fn(series[window]))` of catalog counter keys, alternatives joined with `or`.
    window None: the raw totals since start."""
    by = ", ".join((*cfg.target_labels, "model_name", *extra_by))
    parts = []
    for name, matchers in counter_series(keys):
        if window is None:
            parts.append(f"sum by ({by}) ({vllm(cfg, name, *matchers)})")
        else:
            parts.append(sum_fn(cfg, fn, name, window, *matchers, extra_by=extra_by))
    return "\nor\n".join(parts)


# -- the nodes ---------------------------------------------------------------------------------
# Both renderings: undefined is absent (None in Python, no sample in PromQL), and ratios are of
# sums over engines, by target labels and `model_name`. vLLM's spellings live only in the catalog.
class Expr:
    """A figure's formula. `value` renders it in Python, `promql` in bare PromQL (a parent adds
    parentheses)."""

    # An operator at the top of the rendering: parenthesised inside another operator.
    always_composite: ClassVar[bool] = False

    @property
    def composite(self) -> bool:
        return self.always_composite

    def value(self, c: Context) -> float | None:
        raise NotImplementedError

    def promql(self, cfg: Scope, w: str) -> str:
        raise NotImplementedError

    def python_only(self) -> list[PythonOnly]:
        """The parts PromQL cannot compute (skipped by FirstOf, refused elsewhere)."""
        return []

    def describe(self) -> str:
        """The formula in words, for docs/rules.md (generated, so the docs cannot drift)."""
        raise NotImplementedError


def _words(e: Expr) -> str:
    text = e.describe()
    return f"({text})" if e.composite and not isinstance(e, Rate | Total) else text


def _series_words(keys: tuple[str, ...]) -> str:
    """`name{label="a|b"}` of catalog keys; an offload key gives its flat name (mirror implied)."""
    name, matchers = counter_series(keys)[0]
    shown = name.removesuffix("_total")
    if matchers and not (len(keys) == 1 and keys[0] in OFFLOAD_COUNTERS):
        shown += "{" + matchers[0].replace("=~", "=") + "}"
    return f"`{shown}`"


def _operand(e: Expr, cfg: Scope, w: str) -> str:
    text = e.promql(cfg, w)
    return paren(text) if e.composite else text


@dataclass(frozen=True)
class Rate(Expr):
    """Catalog counters: increase over the window in Python, `rate` in PromQL, equal inside a ratio.
    Wrap in PerSecond for a per-second figure; absent when no key is."""

    keys: tuple[str, ...]

    def __init__(self, *keys: str) -> None:
        object.__setattr__(self, "keys", keys)

    @property
    def composite(self) -> bool:
        return len(self.keys) == 1 and self.keys[0] in OFFLOAD_COUNTERS  # flat `or` legacy

    def value(self, c: Context) -> float | None:
        return c.inc(*self.keys) if any(c.has(k) for k in self.keys) else None

    def promql(self, cfg: Scope, w: str) -> str:
        return counter_sum(cfg, "rate", self.keys, w)

    def describe(self) -> str:
        return _series_words(self.keys)


@dataclass(frozen=True)
class Increase(Rate):
    """The same counters as an amount over the window (`increase` in PromQL)."""

    def __init__(self, *keys: str) -> None:
        object.__setattr__(self, "keys", keys)

    def promql(self, cfg: Scope, w: str) -> str:
        return counter_sum(cfg, "increase", self.keys, w)

    def describe(self) -> str:
        return f"increase of {_series_words(self.keys)}"


@dataclass(frozen=True)
class Total(Expr):
    """Raw counters: their totals since the engines started (a restart starts them over)."""

    keys: tuple[str, ...]

    def __init__(self, *keys: str) -> None:
        object.__setattr__(self, "keys", keys)

    @property
    def composite(self) -> bool:
        return len(self.keys) == 1 and self.keys[0] in OFFLOAD_COUNTERS

    def value(self, c: Context) -> float | None:
        life = c.static.lifetime
        present = [k for k in self.keys if k in life]
        return sum(life[k] for k in present) if present else None

    def promql(self, cfg: Scope, w: str) -> str:
        return counter_sum(cfg, "", self.keys, None)

    def describe(self) -> str:
        return f"{_series_words(self.keys)} since the engines started"


@dataclass(frozen=True)
class GaugeMean(Expr):
    """A vLLM gauge averaged over the window; engines summed or averaged as the catalog says, as the
    sidecar does."""

    key: str

    def value(self, c: Context) -> float | None:
        return c.delta.gauge_avg.get(self.key)

    def promql(self, cfg: Scope, w: str) -> str:
        name, label, value = GAUGES[self.key]
        op = "=~" if self.key in REGEX_KEYS else "="
        matchers = (f'{label}{op}"{value}"',) if label else ()
        agg = "sum" if self.key in SUMMED_GAUGES else "avg"
        selector = vllm(cfg, _bare(name), *matchers)
        return f"{agg} by ({by_labels(cfg)}) (avg_over_time({selector}[{w}]))"

    def describe(self) -> str:
        name, label, value = GAUGES[self.key]
        how = "summed" if self.key in SUMMED_GAUGES else "averaged"
        shown = f'{_bare(name)}{{{label}="{value}"}}' if label else _bare(name)
        return f"`{shown}` over time, {how} over engines"


@dataclass(frozen=True)
class Ratio(Expr):
    """num ÷ den, absent when den is absent or not positive. A Sidecar operand joins on the vLLM
    labels (`target` copied into `instance`)."""

    num: Expr
    den: Expr
    always_composite: ClassVar[bool] = True

    def value(self, c: Context) -> float | None:
        n, d = self.num.value(c), self.den.value(c)
        return n / d if n is not None and d is not None and d > 0 else None

    def promql(self, cfg: Scope, w: str) -> str:
        den = _operand(self.den, cfg, w)
        if isinstance(self.num, Sidecar):
            return (
                f"{self.num.promql(cfg, w)}\n/ on (instance, model_name) group_right ()\n"
                f"{paren(den + chr(10) + '> 0')}"
            )
        if isinstance(self.den, Sidecar):
            return (
                f"{_operand(self.num, cfg, w)}\n/ on (instance, model_name) group_left ()\n"
                f"{paren(den + ' > 0')}"
            )
        return div(_operand(self.num, cfg, w), den)

    def describe(self) -> str:
        return f"{_words(self.num)} ÷ {_words(self.den)}"


@dataclass(frozen=True)
class Minus(Expr):
    left: Expr
    right: Expr
    always_composite: ClassVar[bool] = True

    def value(self, c: Context) -> float | None:
        a, b = self.left.value(c), self.right.value(c)
        return a - b if a is not None and b is not None else None

    def promql(self, cfg: Scope, w: str) -> str:
        return binop(_operand(self.left, cfg, w), "-", _operand(self.right, cfg, w))

    def describe(self) -> str:
        return f"{_words(self.left)} − {_words(self.right)}"


@dataclass(frozen=True)
class Product(Expr):
    """left × right (Little's law: a rate times a mean time is a mean count)."""

    left: Expr
    right: Expr
    always_composite: ClassVar[bool] = True

    def value(self, c: Context) -> float | None:
        a, b = self.left.value(c), self.right.value(c)
        return a * b if a is not None and b is not None else None

    def promql(self, cfg: Scope, w: str) -> str:
        return binop(_operand(self.left, cfg, w), "*", _operand(self.right, cfg, w))

    def describe(self) -> str:
        return f"{_words(self.left)} × {_words(self.right)}"


@dataclass(frozen=True)
class ClampMin(Expr):
    inner: Expr
    floor: float = 0.0

    def value(self, c: Context) -> float | None:
        v = self.inner.value(c)
        return max(v, self.floor) if v is not None else None

    def promql(self, cfg: Scope, w: str) -> str:
        return f"clamp_min(\n{indent(self.inner.promql(cfg, w))},\n  {self.floor:g}\n)"

    def describe(self) -> str:
        return f"max({self.inner.describe()}, {self.floor:g})"


@dataclass(frozen=True)
class Positive(Expr):
    """Only where the value is above zero (a filter, as PromQL's `> 0`)."""

    inner: Expr
    always_composite: ClassVar[bool] = True

    def value(self, c: Context) -> float | None:
        v = self.inner.value(c)
        return v if v is not None and v > 0 else None

    def promql(self, cfg: Scope, w: str) -> str:
        return f"{_operand(self.inner, cfg, w)}\n> 0"

    def describe(self) -> str:
        return f"{_words(self.inner)} where above 0"


@dataclass(frozen=True)
class FirstOf(Expr):
    """The first operand that exists (PromQL `or`: per series, the left wins). PythonOnly operands
    are skipped in PromQL."""

    options: tuple[Expr, ...]
    always_composite: ClassVar[bool] = True

    def __init__(self, *options: Expr) -> None:
        object.__setattr__(self, "options", options)

    def value(self, c: Context) -> float | None:
        for option in self.options:
            v = option.value(c)
            if v is not None:
                return v
        return None

    def promql(self, cfg: Scope, w: str) -> str:
        parts = [_operand(o, cfg, w) for o in self.options if not isinstance(o, PythonOnly)]
        if not parts:
            raise ValueError("no operand PromQL can compute")
        return "\nor\n".join(parts)

    def python_only(self) -> list[PythonOnly]:
        return [o for o in self.options if isinstance(o, PythonOnly)]

    def describe(self) -> str:
        return ", else ".join(o.describe() for o in self.options if not isinstance(o, PythonOnly))


@dataclass(frozen=True)
class OrZero(Expr):
    """`inner`, or 0 where `like` exists. Why: vLLM creates some series on first use, so "none yet"
    is 0 beside a sibling."""

    inner: Expr
    like: Expr
    always_composite: ClassVar[bool] = True

    def value(self, c: Context) -> float | None:
        v = self.inner.value(c)
        if v is not None:
            return v
        return 0.0 if self.like.value(c) is not None else None

    def promql(self, cfg: Scope, w: str) -> str:
        return f"{_operand(self.inner, cfg, w)}\nor\n0 * {_operand(self.like, cfg, w)}"

    def describe(self) -> str:
        return f"{self.inner.describe()} (0 where {self.like.describe()} exists)"


@dataclass(frozen=True)
class PerSecond(Expr):
    """Counters' increase per second of the window: a Rate, or an OrZero of rates."""

    inner: Rate | OrZero

    @property
    def composite(self) -> bool:
        return self.inner.composite

    def value(self, c: Context) -> float | None:
        v = self.inner.value(c)
        return v / c.delta.seconds if v is not None and c.delta.seconds > 0 else None

    def promql(self, cfg: Scope, w: str) -> str:
        return self.inner.promql(cfg, w)

    def describe(self) -> str:
        return f"{self.inner.describe()} per second"


@dataclass(frozen=True)
class TimesWorldSize(Expr):
    """× the TP×PP world size: vLLM adds the copy times of all ranks copying in parallel."""

    inner: Expr

    @property
    def composite(self) -> bool:
        return self.inner.composite

    def value(self, c: Context) -> float | None:
        v = self.inner.value(c)
        return v * max(c.world_size, 1) if v is not None else None

    def promql(self, cfg: Scope, w: str) -> str:
        text = self.inner.promql(cfg, w)
        if cfg.world_size == 1:
            return text
        return binop(paren(text), "*", str(cfg.world_size))

    def describe(self) -> str:
        return f"{_words(self.inner)} × `world_size`"


@dataclass(frozen=True)
class WhenOffloading(Expr):
    """Undefined unless the target has offloading. In PromQL the offload series gate already; `gate`
    asks for an explicit gate for series that exist without offloading."""

    inner: Expr
    gate: bool = False

    @property
    def composite(self) -> bool:
        return self.gate or self.inner.composite

    def value(self, c: Context) -> float | None:
        return self.inner.value(c) if c.static.offload_families else None

    def promql(self, cfg: Scope, w: str) -> str:
        text = self.inner.promql(cfg, w)
        if not self.gate:
            return text
        return binop(paren(text), f"and on ({target_by(cfg)})", GATE_RECORD)

    def python_only(self) -> list[PythonOnly]:
        return self.inner.python_only()

    def describe(self) -> str:
        return f"{self.inner.describe()}, where offloading is on"


@dataclass(frozen=True)
class PythonOnly(Expr):
    """What PromQL cannot compute, with the reason. The figure's PromQL uses the other options or
    the sidecar's gauge."""

    compute: Callable[[Context], float | None]
    why: str

    def value(self, c: Context) -> float | None:
        return self.compute(c)

    def promql(self, cfg: Scope, w: str) -> str:
        raise ValueError(f"not computable in PromQL: {self.why}")

    def python_only(self) -> list[PythonOnly]:
        return [self]

    def describe(self) -> str:
        return f"(the sidecar only: {self.why})"


@dataclass(frozen=True)
class Sidecar(Expr):
    """A figure PromQL cannot compute, read from the sidecar's gauge in PromQL."""

    metric: str
    compute: Callable[[Context], float | None]

    def value(self, c: Context) -> float | None:
        return self.compute(c)

    def promql(self, cfg: Scope, w: str) -> str:
        return sidecar_as_vllm(cfg, self.metric)

    def describe(self) -> str:
        return f"the sidecar's `{self.metric}`"


def share_family(cfg: Scope, w: str, shares: list[Ratio], label: str) -> str:
    """Figures `Rate(key_i) / Rate(den)` whose keys differ in one label's value, as one rule keeping
    that label. Why: one query instead of one per value."""
    keys: list[str] = []
    den = shares[0].den
    for share in shares:
        if not isinstance(share.num, Rate) or share.den != den or len(share.num.keys) != 1:
            raise ValueError("share_family needs Rate(key) / the same denominator")
        keys.extend(share.num.keys)
    num = counter_sum(cfg, "rate", tuple(keys), w, extra_by=(label,))
    return f"{num}\n/ on ({by_labels(cfg)}) group_left ()\n{paren(den.promql(cfg, w) + ' > 0')}"
