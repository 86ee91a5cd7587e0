"""gpuscaler against the baselines at equal GPU-hours and at equal SLO, on every shared
trace window, in three cold-start regimes.

Windows: 24 h at hours 0, 48, 96 and 144 of both shared 2024 traces; the shared 2023
per-request logs binned to 10 s (about 1 h each, their GPU-seconds per request scaled so
mean demand is 2 GPUs: at 0.06 they would need a sixth of one GPU); and 6 h of each
synthetic family (gpuscaler.sim.synthetic, 30 requests/s mean). Regimes: a new replica
is ready after a cold start drawn uniformly from 60-120 s (the shipped simulator
default), 2-4 min or 5-8 min (vLLM pods loading a large model). Default config otherwise,
seed 1 (`--seed`, `--replicas` change them).

Each window runs `simulate` (gpuscaler, reactive HPA at 70 %, and every baseline swept
over targets 40..90 %), all in the same run. Where gpuscaler holds more GPU-hours than a
curve's dearest swept point, or violates less than it, that curve is extended below 40 %
(35, 30, ... down to 10 %; `gpuscaler.sim.simulate.extend_below`); the output lists every
extension. Two readings of each curve:
- at equal cost: its SLO-violation share at gpuscaler's GPU-hours; ratio = gpuscaler /
  reactive@equal, where either is at least 0.1 % (ties below that carry no ratio);
- at equal SLO: the GPU-hours reactive needs to violate no more than gpuscaler
  (`hours_at_share`, as `whatif` reads it); saved = 1 - gpuscaler's GPU-hours / those.
  Negative is overspend. Read at the curve's cheapest point (marked) when even that
  violates no more: reactive might need fewer still.
A window's verdict (a win passes every check, any failure is a loss):
- never worse than any baseline at equal GPU-hours: share <= baseline@equal x 1.05, or
  both below 0.1 % (where gpuscaler's GPU-hours fall outside a curve there is no
  equal-cost point: the table shows its nearest end, marked, and it is not judged);
- where reactive@equal violates for more than 0.5 % of requests: at most 0.3x its
  violations, and in the 2-4 and 5-8 minute regimes at least 25 % GPU-hours saved;
- at most 5 % more GPU-hours than reactive needs for gpuscaler's SLO share;
- no more scaling actions than reactive at 70 %.

`--baselines-from rows.json` reuses the baseline curves of an earlier `--json` run (they do
not depend on gpuscaler's policy: same trace, seed, regime and config) and runs only
gpuscaler and the reactive HPA: a policy change is judged on every window in a fraction of
the time. The baselines' own code must not have changed since that run.

`--frontier` also sweeps gpuscaler's own utilization target (50..90 %) and says, per
baseline, on how many windows gpuscaler's curve lies below it (violates no more at equal
GPU-hours, x 1.05 or both under 0.1 %) over the range both cover.

`--only LABEL,...` runs those windows alone; `--regime NAME` (repeatable) those regimes;
`--before rows.json` prints every window before (that earlier run) and after (this one).

    python bench/equal_cost.py [--jobs 2] [--quick]

Per regime: RESULT regime= windows= wins= losses= ties= worst_ratio= mean_ratio=
gpu_hours_saved_mean= gpu_hours_saved_worst=. Last line: the same over every regime, with
gate=pass|fail.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from gpuscaler.config import Config
from gpuscaler.sim.equal_cost import equal_cost, hours_at_share
from gpuscaler.sim.simulate import extend_below, simulate
from gpuscaler.sim.synthetic import FAMILIES, synthetic_trace
from gpuscaler.sim.trace import Trace, load_trace

DATA = Path("/work/shared/data")
TIE = 0.001
"""Both below 0.1 % of requests violating: a tie."""
HIGH = 0.005
GATE_RATIO = 0.30
MEAN_DEMAND_GPUS = 2.0
OVERSPEND = 0.05
"""At most 5 % more GPU-hours than reactive needs for gpuscaler's SLO share."""
SAVED_WHERE_IT_HURTS = 0.25
REGIMES = {"60-120s": (60.0, 120.0), "2-4min": (120.0, 240.0), "5-8min": (300.0, 480.0)}
"""Cold-start regimes: (shortest, longest) seconds until a new replica serves."""
LONG_REGIMES = ("2-4min", "5-8min")
FRONTIER_TARGETS = (50.0, 60.0, 70.0, 80.0, 90.0)
"""gpuscaler's own utilization targets swept with --frontier."""


def windows(quick: bool) -> list[tuple[str, str, float, float]]:
    """(label, source, start hour, hours): source is a path, or synthetic:<family>."""
    out: list[tuple[str, str, float, float]] = []
    starts = (0, 48) if quick else (0, 48, 96, 144)
    for name in ("azure_llm_2024_conversation_10s.csv", "azure_llm_2024_coding_10s.csv"):
        for s in starts:
            out.append((f"{name.split('_10s')[0][10:]}@{s}h", str(DATA / name), s, 24.0))
    for name in ("azure_llm_2023_code.csv", "azure_llm_2023_conv.csv"):
        out.append((name[:-4][10:], str(DATA / name), 0.0, math.nan))
    for family in FAMILIES:
        out.append((f"synthetic-{family}", f"synthetic:{family}", 0.0, 6.0))
    return out


def _trace(source: str) -> Trace:
    if source.startswith("synthetic:"):
        return synthetic_trace(source.split(":", 1)[1], hours=6.0, seed=7)
    if "2023" in source:
        return load_trace(source, resample=10.0)
    return load_trace(source)


def _config(trace: Trace, source: str, regime: str) -> Config:
    config = Config()
    shortest, longest = REGIMES[regime]
    update: dict[str, float] = {"cold_start": shortest, "cold_start_max": longest}
    if "2023" in source:
        rate = float(np.nansum(trace.counts)) / trace.duration
        update["gpu_seconds_per_request"] = MEAN_DEMAND_GPUS / rate
    return config.model_copy(update={"simulator": config.simulator.model_copy(update=update)})


def run_window(
    job: tuple[str, tuple[str, str, float, float]],
    reuse: dict[str, Any] | None = None,
    seed: int = 1,
    replicas: dict[str, Any] | None = None,
    frontier: tuple[float, ...] = (),
) -> dict[str, Any]:
    """One (regime, window)'s row; `reuse`: the baseline curves of an earlier run of it
    (they do not depend on gpuscaler's policy: same trace, seed, regime and config), not
    re-run; `replicas`: fields of the replicas config set for this run; `frontier`:
    gpuscaler's own utilization targets to sweep."""
    regime, (label, source, start, hours) = job
    t0 = time.perf_counter()
    trace = _trace(source)
    span = None if math.isnan(hours) else hours
    config = _config(trace, source, regime)
    if replicas:
        config = config.model_copy(update={"replicas": config.replicas.model_copy(update=replicas)})
    result = simulate(trace, span, seed, config, start, baselines=reuse is None)
    if reuse is not None:
        result.baselines = {name: list(curve) for name, curve in reuse.items()}
    extended = extend_below(result)
    s = result.summary()
    g = s["gpuscaler"]
    curve = s["baselines"]["reactive"]
    reactive70 = next(p for p in curve if p["target_pct"] == 70)
    needed = hours_at_share(curve, g["slo_violation_share"])
    return {
        "regime": regime,
        "window": label,
        "hours": s["hours"],
        "scored_hours": s["scored_hours"],
        "gpuscaler": g,
        "reactive70": reactive70,
        "equal": _equal(curve, g["gpu_hours"]),
        "at_equal": {name: _equal(c, g["gpu_hours"]) for name, c in s["baselines"].items()},
        "slo_equal": None
        if needed is None
        else {"gpu_hours": needed[0], "where": "cheapest point" if needed[1] else "equal"},
        "baselines": s["baselines"],
        "extended": extended,
        "frontier": _frontier(trace, span, seed, config, start, frontier, s["baselines"]),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def _frontier(
    trace: Trace,
    span: float | None,
    seed: int,
    config: Config,
    start: float,
    targets: tuple[float, ...],
    baselines: dict[str, list[dict[str, Any]]],
) -> dict[str, Any] | None:
    """gpuscaler swept over its own utilization target like the baselines, and per
    baseline whether every point of that curve inside the baseline's GPU-hours violates
    no more than the baseline there (x 1.05, or both under 0.1 %); None: not swept."""
    if not targets:
        return None
    points = []
    for t in targets:
        knob = config.replicas.model_copy(update={"target_utilization_pct": t})
        run = simulate(
            trace, span, seed, config.model_copy(update={"replicas": knob}), start, baselines=False
        )
        g = run.gpuscaler.metrics
        points.append(
            {
                "target_pct": t,
                "gpu_hours": g["gpu_hours"],
                "slo_violation_share": g["slo_violation_share"],
            }
        )
    below: dict[str, bool | None] = {}
    for name, curve in baselines.items():
        verdicts = []
        for p in points:
            at = equal_cost(curve, p["gpu_hours"])
            if at is not None:
                b, share = at["slo_violation_share"], p["slo_violation_share"]
                verdicts.append(share <= b * 1.05 or (share < TIE and b < TIE))
        below[name] = all(verdicts) if verdicts else None
    return {"curve": points, "below": below}


def _equal(curve: list[dict[str, Any]], gpu_hours: float) -> dict[str, Any]:
    """The curve at gpuscaler's GPU-hours; outside it, its nearest end (marked)."""
    at = equal_cost(curve, gpu_hours)
    if at is not None:
        return {**at, "where": "equal"}
    end = min(curve, key=lambda p: abs(p["gpu_hours"] - gpu_hours))
    where = "cheapest point" if gpu_hours < end["gpu_hours"] else "dearest point"
    return {
        "gpu_hours": end["gpu_hours"],
        "slo_violation_share": end["slo_violation_share"],
        "p99_wait_s": end["p99_wait_s"],
        "where": where,
    }


def _at_equal(row: dict[str, Any]) -> dict[str, Any]:
    """Each baseline read at gpuscaler's GPU-hours (rows written before the Dynamo-style
    baseline name the other three by key)."""
    if "at_equal" in row:
        return dict(row["at_equal"])
    old = {"reactive": "equal", "predictive_floor": "floor_equal", "keda_rate": "keda_equal"}
    return {name: row[key] for name, key in old.items()}


def saved(row: dict[str, Any]) -> float | None:
    """GPU-hours saved against reactive at gpuscaler's SLO share (negative: overspend);
    None when the reactive curve never violates so little."""
    need = row.get("slo_equal")
    if need is None or need["gpu_hours"] <= 0:
        return None
    return float(1.0 - row["gpuscaler"]["gpu_hours"] / need["gpu_hours"])


def judge(row: dict[str, Any]) -> dict[str, Any]:
    g = row["gpuscaler"]["slo_violation_share"]
    r = row["equal"]["slo_violation_share"]
    failed = []
    if row["equal"]["where"] == "dearest point" and g > r:
        failed.append("dearer than the whole reactive curve")
    for name, at in _at_equal(row).items():
        b = at["slo_violation_share"]
        if at["where"] == "equal" and not (g <= b * 1.05 or (g < TIE and b < TIE)):
            failed.append(f"worse than {name}@equal")
    won = saved(row)
    if r > HIGH and g > GATE_RATIO * r:
        failed.append(f"not {GATE_RATIO:g}x reactive's violations")
    if (
        r > HIGH
        and row.get("regime") in LONG_REGIMES
        and (won is None or won < SAVED_WHERE_IT_HURTS)
    ):
        failed.append(f"under {100 * SAVED_WHERE_IT_HURTS:.0f} % saved at equal SLO")
    if won is not None and won < -OVERSPEND:
        failed.append(f"overspends {-100 * won:.0f} % at equal SLO")
    if row["gpuscaler"]["scaling_actions"] > row["reactive70"]["scaling_actions"]:
        failed.append("more scaling actions than reactive@70")
    tie = g < TIE and r < TIE
    ratio = None if tie or r == 0 else g / r
    if ratio is None and not tie:
        ratio = math.inf if g > 0 else 1.0
    return {**row, "failed": failed, "tie": tie, "ratio": ratio, "saved": won}


def _fmt(x: float | None, pct: bool = True) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.3f}" if pct else f"{x:.3g}"


def _where(point: dict[str, Any]) -> str:
    return "" if point["where"] == "equal" else f" ({point['where']})"


def _cell(at: dict[str, Any], name: str) -> str:
    point = at.get(name)
    return "-" if point is None else f"{_fmt(point['slo_violation_share'])}{_where(point)}"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| regime | window | GPU-h | SLO viol. % gpuscaler | reactive@equal | predictive "
        "floor@equal | KEDA rate@equal | Dynamo-style@equal | p99 wait s (g / r@equal) "
        "| actions (g / r@70) | ratio | saved at equal SLO % | verdict |"
    )
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        g, at = r["gpuscaler"], _at_equal(r)
        where = _where(r["equal"])
        verdict = "win" if not r["failed"] else "LOSS: " + "; ".join(r["failed"])
        won = "-" if r["saved"] is None else f"{100 * r['saved']:.1f}"
        if r["saved"] is not None and r["slo_equal"]["where"] != "equal":
            won += f" ({r['slo_equal']['where']})"
        lines.append(
            f"| {r['regime']} | {r['window']} | {g['gpu_hours']:.1f} | "
            f"{_fmt(g['slo_violation_share'])} | "
            f"{_fmt(r['equal']['slo_violation_share'])}{where} | "
            f"{_cell(at, 'predictive_floor')} | {_cell(at, 'keda_rate')} | "
            f"{_cell(at, 'dynamo_sla')} | "
            f"{g['p99_wait_s']:.3f} / {r['equal']['p99_wait_s']:.3f} | "
            f"{g['scaling_actions']} / {r['reactive70']['scaling_actions']} | "
            f"{'tie' if r['tie'] else _fmt(r['ratio'], pct=False)} | {won} | {verdict} |"
        )
    return "\n".join(lines)


def _key(row: dict[str, Any]) -> tuple[str, str]:
    return row.get("regime", "60-120s"), row["window"]


def summary(rows: list[dict[str, Any]]) -> str:
    """The RESULT fields of `rows`: verdicts, ratios at equal cost, saved at equal SLO."""
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    won = [r["saved"] for r in rows if r["saved"] is not None]
    wins = sum(1 for r in rows if not r["failed"])
    swept = [r["frontier"]["below"] for r in rows if r.get("frontier")]
    below = "".join(
        f" frontier_below_{name}={sum(1 for b in swept if b.get(name))}/{len(swept)}"
        for name in dict.fromkeys(n for b in swept for n in b)
    )
    return (
        f"windows={len(rows)} wins={wins} losses={len(rows) - wins} "
        f"ties={sum(1 for r in rows if r['tie'])} "
        f"worst_ratio={max(ratios) if ratios else 1.0:.3f} "
        f"mean_ratio={float(np.mean(ratios)) if ratios else 1.0:.3f} "
        f"gpu_hours_saved_mean={float(np.mean(won)) if won else 0.0:.3f} "
        f"gpu_hours_saved_worst={min(won) if won else 0.0:.3f}{below}"
    )


def compared(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> str:
    """Each window before and after a change: GPU-hours, SLO violations, ratio, verdict."""

    def cell(r: dict[str, Any] | None) -> str:
        if r is None:
            return "- | - | - | -"
        g = r["gpuscaler"]
        ratio = "tie" if r["tie"] else _fmt(r["ratio"], pct=False)
        return (
            f"{g['gpu_hours']:.1f} | {_fmt(g['slo_violation_share'])} | {ratio} | "
            f"{'win' if not r['failed'] else 'LOSS'}"
        )

    old = {_key(r): r for r in before}
    lines = [
        "| regime | window | GPU-h before | viol. % before | ratio before | verdict before "
        "| GPU-h after | viol. % after | ratio after | verdict after |",
        "|" + "---|" * 10,
    ]
    for r in after:
        lines.append(f"| {r['regime']} | {r['window']} | {cell(old.get(_key(r)))} | {cell(r)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two windows per 2024 trace")
    parser.add_argument(
        "--only",
        metavar="LABELS",
        action="append",
        help="run only these windows (comma-separated labels; repeatable)",
    )
    parser.add_argument(
        "--before", metavar="PATH", help="an earlier --json: print each window before and after"
    )
    parser.add_argument(
        "--regime", choices=list(REGIMES), action="append", help="cold-start regimes (default all)"
    )
    parser.add_argument("--seed", type=int, default=1, help="arrivals seed (default 1)")
    parser.add_argument(
        "--replicas",
        metavar="JSON",
        help="replicas config fields to set, e.g. '{\"reserve_window\": 3600}' (a "
        "policy's before and after in one tree)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="windows run in parallel")
    parser.add_argument(
        "--frontier",
        action="store_true",
        help="sweep gpuscaler's own utilization target too and compare the frontiers",
    )
    parser.add_argument("--json", metavar="PATH", help="write every row as JSON")
    parser.add_argument(
        "--rejudge", metavar="PATH", help="judge the rows of an earlier --json, run nothing"
    )
    parser.add_argument(
        "--baselines-from",
        metavar="PATH",
        help="reuse the baseline curves of an earlier --json (same code for the baselines, "
        "trace, seed and config): only gpuscaler and the reactive HPA run",
    )
    args = parser.parse_args()
    if args.rejudge:
        rows = [judge(r) for r in json.loads(Path(args.rejudge).read_text())]
    else:
        todo = windows(args.quick)
        if args.only:
            wanted = {label for only in args.only for label in only.split(",")}
            unknown = wanted - {w[0] for w in todo}
            if unknown:
                parser.error(f"unknown window(s) {', '.join(sorted(unknown))}")
            todo = [w for w in todo if w[0] in wanted]
        regimes = args.regime or list(REGIMES)
        jobs = [(regime, w) for regime in regimes for w in todo]
        curves: dict[tuple[str, str], Any] = {}
        if args.baselines_from:
            rows = json.loads(Path(args.baselines_from).read_text())
            curves = {_key(r): r["baselines"] for r in rows}
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            run = partial(
                run_window,
                seed=args.seed,
                replicas=json.loads(args.replicas or "{}"),
                frontier=FRONTIER_TARGETS if args.frontier else (),
            )
            reuse = [curves.get((regime, w[0])) for regime, w in jobs]
            rows = [judge(r) for r in pool.map(run, jobs, reuse)]
    print(table(rows))
    for r in rows:
        for name, targets in r.get("extended", {}).items():
            print(
                f"{r['regime']} {r['window']}: {name} curve extended below 40 % to {targets[-1]} %"
            )
    if args.before:
        before = [judge(r) for r in json.loads(Path(args.before).read_text())]
        print(compared(before, rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str) + "\n")
    for regime in dict.fromkeys(r["regime"] for r in rows):
        print(f"RESULT regime={regime} {summary([r for r in rows if r['regime'] == regime])}")
    ok = all(not r["failed"] for r in rows)
    print(f"RESULT regime=all {summary(rows)} gate={'pass' if ok else 'fail'}")


if __name__ == "__main__":
    main()
