"""PromQL: label values escaped into matchers; `Hostname` also tried as `hostname`."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

HOSTNAME_LABELS = ("Hostname", "hostname")
"""dcgm-exporter is renaming Hostname to hostname; a matcher on either tries both."""


def escape_label_value(value: str) -> str:
    """A PromQL double-quoted string literal holding exactly `value`."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def matcher_sets(labels: Mapping[str, str]) -> list[str]:
    """Matcher lists (comma-joined) for the labels; two when a Hostname label is involved."""
    for name in labels:
        if not _LABEL_NAME.match(name):
            raise ValueError(f"invalid Prometheus label name {name!r}")
    variants: list[dict[str, str]] = [dict(labels)]
    host = next((h for h in HOSTNAME_LABELS if h in labels), None)
    if host is not None:
        other = HOSTNAME_LABELS[1] if host == HOSTNAME_LABELS[0] else HOSTNAME_LABELS[0]
        variants.append({(other if k == host else k): v for k, v in labels.items()})
    return [
        ",".join(f"{k}={escape_label_value(v)}" for k, v in sorted(v.items())) for v in variants
    ]


def build_query(template: str, labels: Mapping[str, str], lookback: str) -> str:
    """The template over the labels, `(A) or (B)` when there are two matcher sets."""
    parts = [template.format(matchers=m, lookback=lookback) for m in matcher_sets(labels)]
    return parts[0] if len(parts) == 1 else " or ".join(f"({p})" for p in parts)


POD_LABELS = (("namespace", "pod"), ("exported_namespace", "exported_pod"))
"""dcgm-exporter's pod labels as scraped: plain with `honorLabels: true`, `exported_` under
the stock `honorLabels: false` (Prometheus renames a label clashing with a target's)."""


def workload_matchers(
    namespace: str, name: str, labels: tuple[str, str] = POD_LABELS[0]
) -> list[str]:
    """Matchers for a workload's pods: its namespace and pods named `<name>-...`."""
    ns_label, pod_label = labels
    return [
        f"{ns_label}={escape_label_value(namespace)}",
        f"{pod_label}=~{escape_label_value(re.escape(name) + '-.+')}",
    ]


def build_workload_query(template: str, namespace: str, name: str, lookback: str) -> str:
    """The template over the workload's pods under either label convention, `(A) or (B)`;
    a template without `{matchers}` is taken as it is."""
    if "{matchers}" not in template:
        return template.format(lookback=lookback)
    parts = [
        template.format(
            matchers=",".join(workload_matchers(namespace, name, labels)), lookback=lookback
        )
        for labels in POD_LABELS
    ]
    return " or ".join(f"({p})" for p in parts)


def format_step(seconds: float) -> str:
    """A query_range step Prometheus accepts: float seconds ('0.5'), never '0.5s'."""
    return f"{seconds:g}"


_AGGREGATE = re.compile(r"^\s*(avg|sum|max|min)\s*\((.*)\)\s*$", re.S)


def grouped_template(template: str, by: Iterable[str]) -> str | None:
    """`avg(X)` -> `avg by (L) (X)`; None when the template is not one aggregation."""
    m = _AGGREGATE.match(template)
    if m is None or "{matchers}" not in m.group(2) or not _balanced(m.group(2)):
        return None
    return f"{m.group(1)} by ({', '.join(by)}) ({m.group(2)})"


def _balanced(inner: str) -> bool:
    """The aggregation's own parentheses enclose all of `inner` (not `avg(a) / avg(b)`)."""
    depth = 0
    for ch in inner:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0
