"""`gpuscaler whatif`'s report: the verdict table first, then each workload's figures,
decisions and limits; `summary.json` and `decisions.jsonl` with `--report`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuscaler.adapters.kube.objects import rfc3339
from gpuscaler.whatif.history import Skipped


@dataclass
class Outcome:
    since: float
    until: float
    step: float
    summaries: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "since": rfc3339(self.since),
            "until": rfc3339(self.until),
            "step_s": self.step,
            "slot_s": self.step,
            "table": [_row(s["workload"], s["comparison"]) for s in self.summaries]
            + [
                {"workload": s.key, "verdict": "not enough data", "reason": s.reason}
                for s in self.skipped
            ],
            "workloads": self.summaries,
            "skipped": [{"workload": s.key, "reason": s.reason} for s in self.skipped],
        }


def _row(workload: str, c: dict[str, Any]) -> dict[str, Any]:
    saved, avoided = c["gpu_hours_saved"], c["violations_avoided"]
    return {
        "workload": workload,
        "gpu_hours_saved_at_equal_slo": None if saved is None else saved["gpu_hours"],
        "slo_violations_avoided_at_equal_gpu_hours": None if avoided is None else avoided["share"],
        "verdict": c["verdict"],
    }


def write(report: Path, outcome: Outcome, records: list[dict[str, Any]]) -> None:
    path = report / "decisions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    outcome.files.insert(0, path)
    path = report / "summary.json"
    path.write_text(json.dumps(outcome.summary(), indent=2) + "\n", encoding="utf-8")
    outcome.files.append(path)


def table_lines(outcome: Outcome) -> list[str]:
    """The verdict table: one row per workload, skipped ones included."""
    saved_at, avoided_at = "GPU-hours saved at equal SLO", "SLO violations avoided at equal GPU-h"
    rows: list[tuple[str, ...]] = [("workload", saved_at, avoided_at, "verdict")]
    for s in outcome.summaries:
        c = s["comparison"]
        saved, avoided = c["gpu_hours_saved"], c["violations_avoided"]
        edge = " (sweep edge)" if saved is not None and saved["at_sweep_edge"] else ""
        rows.append(
            (
                s["workload"],
                "-" if saved is None else f"{saved['gpu_hours']:+.2f} vs {saved['against']}{edge}",
                "-"
                if avoided is None
                else f"{100 * avoided['share']:+.3f} pts vs {avoided['against']}",
                c["verdict"],
            )
        )
    rows.extend((s.key, "-", "-", "not enough data") for s in outcome.skipped)
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return [" | ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]


def text(outcome: Outcome) -> str:
    from gpuscaler.sim.report import table

    lines = [
        f"What-if from {rfc3339(outcome.since)} to {rfc3339(outcome.until)} (history read "
        f"every {outcome.step:g}s and replayed in {outcome.step:g}s slots); each baseline "
        "swept over targets 40..90 %, compared with the best one",
        *table_lines(outcome),
    ]
    for s in outcome.summaries:
        lines += ["", f"== {s['workload']} ==", f"load model: {s['load_model']}", table(s)]
        a = s["actual"]
        if a is not None:
            lines.append(
                f"replicas that ran ({a['source']}): SLO violations "
                f"{100 * a['slo_violation_share']:.3f} %, p99 wait {a['p99_wait_s']:g}s, "
                f"{a['gpu_hours']:g} GPU-hours, {a['scaling_actions']} scaling actions, "
                f"mean replicas {a['mean_replicas']:g}"
            )
        kinds = s["decision_counts"]
        lines.append(
            "decisions gpuscaler would have taken: "
            + (", ".join(f"{n} {k}" for k, n in kinds.items()) or "none")
        )
        lines += [
            f"  {d['kind']} {d['from']} -> {d['to']}: {d['reason']}" for d in s["decision_examples"]
        ]
        lines += [f"limit: {x}" for x in s["limits"]]
    for skip in outcome.skipped:
        lines.append(f"skipped {skip.key}: {skip.reason}")
    return "\n".join(lines)
