"""What the pool recording rules cost Prometheus, and a check that the series bench/tick.py
plants for them are what the rules compute (issue 18).

- `check_planted`: for each pool rule of deploy/prometheus/prometheusrule.yaml (group
  `gpuscaler-pools`), Prometheus evaluates the rule's own expression over the raw
  series and compares it with the planted recorded series, in one range query: the
  largest absolute difference over every pool and point.
- `evaluation_cost`: each rule group's expressions evaluated as instant queries at
  several times within the planted data, Prometheus' own evaluation time read from the
  answer's `stats` (`stats=all`, web/api/v1/api.go in prometheus/prometheus); a group
  evaluated every `interval` then keeps this share of one core busy (the rule manager
  evaluates a group's rules one after the other at each interval, rules/group.go).
"""

from __future__ import annotations

import json
import statistics
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

RULES = Path(__file__).resolve().parents[1] / "deploy" / "prometheus" / "prometheusrule.yaml"
GROUPS = ("gpuscaler-pools", "gpuscaler-workloads")


def _get(url: str, path: str, **params: str) -> Any:
    query = urllib.parse.urlencode(params)
    with urllib.request.urlopen(f"{url}/api/v1/{path}?{query}", timeout=600) as answer:
        return json.loads(answer.read())["data"]


def shipped_groups() -> dict[str, tuple[float, list[tuple[str, str]]]]:
    """Group name -> (interval in seconds, [(record, expr)]) of the groups a tick reads."""
    spec = yaml.safe_load(RULES.read_text())["spec"]
    out = {}
    for group in spec["groups"]:
        if group["name"] in GROUPS:
            interval = group["interval"]
            seconds = (
                float(interval[:-2]) / 1000 if interval.endswith("ms") else float(interval[:-1])
            )
            rules = [(r["record"], " ".join(r["expr"].split())) for r in group["rules"]]
            out[group["name"]] = (seconds, rules)
    return out


def check_planted(url: str, start: float, end: float, step: float) -> float:
    """The largest |planted - Prometheus' evaluation of the rule| over the pool rules."""
    worst = 0.0
    _, rules = shipped_groups()["gpuscaler-pools"]
    for record, expr in rules:
        diff = f"max(abs({record} - on (modelName) ({expr})))"
        count = f"count({record} - on (modelName) ({expr}))"
        for query, check in ((diff, None), (count, "count")):
            result = _get(
                url, "query_range", query=query, start=f"{start}", end=f"{end}", step=f"{step}"
            )["result"]
            assert result, f"no answer to {query}"
            values = [float(v) for _, v in result[0]["values"]]
            if check == "count":
                assert min(values) > 0, f"{record}: the planted and evaluated series do not join"
            else:
                worst = max(worst, max(values))
    return worst


def _cpu_seconds(url: str) -> float:
    """Prometheus' own `process_cpu_seconds_total` (user + system, all its threads)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=60) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith("process_cpu_seconds_total "):
                return float(line.split()[1])
    raise RuntimeError("Prometheus exports no process_cpu_seconds_total")


def evaluation_cost(url: str, times: list[float]) -> dict[str, tuple[float, float, float]]:
    """Group name -> (median wall seconds of Prometheus' evaluation of the group's rules
    once, from the answers' stats; CPU seconds per evaluation, from Prometheus' own CPU
    counter over all of them, which other jobs on the machine do not inflate; the share
    of one core that CPU is when the group is evaluated every interval)."""
    out = {}
    for name, (interval, rules) in shipped_groups().items():
        per_time = []
        cpu = _cpu_seconds(url)
        for t in times:
            total = 0.0
            for _, expr in rules:
                data = _get(url, "query", query=expr, time=f"{t:.3f}", stats="all")
                total += float(data["stats"]["timings"]["evalTotalTime"])
            per_time.append(total)
        per_eval = (_cpu_seconds(url) - cpu) / len(times)
        out[name] = (statistics.median(per_time), per_eval, per_eval / interval)
    return out
