"""The frame around the panels: variables, links, the note on what needs the rules.

Variables list vLLM's own series under both spellings, so the dropdowns fill even without
kvoffload's rules loaded."""

from __future__ import annotations

from typing import Any

from kvoffload.links import doc
from kvoffload.mixin import grafana as g
from kvoffload.mixin.config import MixinConfig
from kvoffload.mixin.dashboards.panels import ONLY_WHERE
from kvoffload.mixin.dashboards.queries import NEEDS_RULES, NEEDS_RULES_TITLE, needs_rules

# The variables list the targets from a gauge every vLLM engine serves from its start (0.6 to
# 0.26 and the simulator), labelled model_name and engine; not from a recording rule, so they
# also fill on a Prometheus without kvoffload's rules.
_TARGETS_SERIES = "num_requests_running"


def variables(cfg: MixinConfig, per_engine: bool) -> list[Any]:
    """One variable per target label, then model_name (and engine), each narrowed by those before
    it.

    Listed from vLLM's own gauge under both spellings (vllm: and vllm_)."""
    out = [g.datasource_variable()]
    before = [f'__name__=~"vllm[:_]{_TARGETS_SERIES}"']
    if cfg.vllm_selector:
        before.append(cfg.vllm_selector)
    labels = (*cfg.target_labels, "model_name", *(("engine",) if per_engine else ()))
    for label in labels:
        out.append(
            g.query_variable(
                label,
                f"label_values({{{', '.join(before)}}}, {label})",
                label="Model" if label == "model_name" else None,
            )
        )
        before.append(f'{label}=~"${label}"')
    return out


def with_rules_note(cfg: MixinConfig, sections: list[g.Section]) -> list[g.Section]:
    """Mark each panel that reads a rule with no raw fallback, and list them in a text panel on top.

    On a Prometheus without the rules they are blank, and the dashboard says why."""
    listed: list[str] = []
    only_where: list[str] = []
    for section in sections:
        for panel in section.panels:
            if ONLY_WHERE in panel.body.description:
                only_where.append(f"- **{panel.body.title}** ({section.title})")
            names = sorted(
                {n for t in getattr(panel.body, "targets", []) for n in needs_rules(t.expr, cfg)}
            )
            if names:
                panel.body.description += f" {NEEDS_RULES} ({', '.join(names)})."
                listed.append(f"- **{panel.body.title}** ({section.title}): {', '.join(names)}")
    intro = (
        "Panels read kvoffload's recording rules (`alerts/rules/kvoffload-rules.yaml`, "
        f"[the rules]({doc('rules.md')})) and, where a rule is missing, the same PromQL over "
        "vLLM's own series, so a Prometheus without the rules still fills them; the variables "
        "list vLLM's own series. Panels reading the sidecar (`kvoffload_*`) need "
        "`kvoffload serve` scraped."
    )
    if listed:
        body = f"{intro}\n\n{NEEDS_RULES} (blank without them):\n\n" + "\n".join(listed)
    else:
        body = f"{intro}\n\nNo panel here needs the rules."
    if only_where:
        body += f"\n\n{ONLY_WHERE} (blank on other versions or settings):\n\n" + "\n".join(
            only_where
        )
    # Grid units of 30 px: the paragraph takes about four, each listed line about 0.8.
    height = 5 + (len(listed) + len(only_where)) * 4 // 5
    return [
        g.Section(
            "About this dashboard",
            [
                g.text(
                    NEEDS_RULES_TITLE,
                    "What this dashboard reads, and which panels stay blank on a Prometheus "
                    "without kvoffload's recording rules.",
                    body,
                    height=height,
                )
            ],
        ),
        *sections,
    ]


def links(cfg: MixinConfig) -> list[dict[str, Any]]:
    return [
        {
            "title": "kvoffload",
            "type": "dashboards",
            "tags": [cfg.dashboard_tags[0]],
            "asDropdown": True,
            "includeVars": True,
            "keepTime": True,
        }
    ]


# Step of the advice-change annotation, and how far back it compares: equal, so each change
# of advice is marked once, at the first step that sees it.
ADVICE_STEP = "1m"


def advice_changes(cfg: MixinConfig) -> dict[str, Any]:
    """An annotation where a sidecar's published advice changed, so every panel shows when it moved.

    It marks an action of kvoffload_recommendation that is 1 now and was not one step before."""
    # A sidecar's first advice after warm-up counts as a change too.
    parts = [cfg.sidecar_selector] if cfg.sidecar_selector else []
    parts += [f'{cfg.sidecar_target_label}=~"$instance"', 'model_name=~"$model_name"']
    rec = f"kvoffload_recommendation{{{', '.join(parts)}}}"
    expr = f"{rec} == 1\nunless\n{rec} offset {ADVICE_STEP} == 1"
    return g.annotation(
        "Advice changes",
        expr,
        "Advice: {{action}}",
        f"{{{{{cfg.sidecar_target_label}}}}} {{{{model_name}}}}: the sidecar now advises "
        "{{action}}",
        "action",
        ADVICE_STEP,
    )


def dashboard(
    cfg: MixinConfig,
    name: str,
    title: str,
    description: str,
    sections: list[g.Section],
    per_engine: bool,
) -> dict[str, Any]:
    """One dashboard with the frame all kvoffload dashboards share: uid, tags, variables, links,
    note.

    Each dashboard module then only says its panels."""
    return g.dashboard(
        title=f"{cfg.dashboard_title_prefix}{title}",
        uid=f"{cfg.dashboard_uid_prefix}-{name}",
        description=description,
        tags=cfg.dashboard_tags,
        sections=with_rules_note(cfg, sections),
        variables=variables(cfg, per_engine=per_engine),
        refresh=cfg.dashboard_refresh,
        time_from=cfg.dashboard_time_from,
        links=links(cfg),
        annotations=[advice_changes(cfg)],
    )
