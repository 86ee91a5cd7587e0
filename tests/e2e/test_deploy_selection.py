"""Every ServiceMonitor and PrometheusRule gpuscaler ships carries the `release` label a
default kube-prometheus-stack selects them by (issue 13): without it, the stack's
Prometheus ignores them (its serviceMonitorSelector and ruleSelector match the Helm
release, prometheus-community/helm-charts charts/kube-prometheus-stack values.yaml)."""

from __future__ import annotations

from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_every_service_monitor_and_rule_carries_the_release_label() -> None:
    found = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        if "templates" in path.parts or "files" in path.parts:
            continue  # the Helm chart's Go templates and linked files: tests/e2e/test_helm_chart.py
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") in ("ServiceMonitor", "PrometheusRule"):
                labels = doc["metadata"].get("labels") or {}
                found.append((path.relative_to(DEPLOY).as_posix(), labels.get("release")))
    assert len(found) >= 3, found  # controller, agent and extender monitors, and the rules
    assert all(release == "kube-prometheus-stack" for _, release in found), found
