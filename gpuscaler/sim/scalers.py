"""The autoscalers a simulated workload runs under, all on the same cluster model.

- `hpa_util`: the Kubernetes HPA on GPU utilization (the reactive autoscaler that is
  always there; gpuscaler's floor sits under it).
- `keda_rate`: a KEDA ScaledObject on request rate, `rate(requests[1m])` polled every
  control interval (30 s), feeding the HPA as an AverageValue target: desired =
  ceil(rate x GPU-seconds per request / (replica GPU share x target)).
- `predictive_floor`: the Crane EHPA / Alibaba AHPA style: the HPA takes the larger of
  the reactive utilization recommendation and one on max(peak of an FFT forecast of the
  last hour over the horizon, max of the last 5 minutes) of the request-rate signal.
  Crane's DSP predictor (gocrane/crane, pkg/prediction/dsp) keeps the strongest
  frequencies of the history's FFT and extends them periodically; this does the same.

Each shares the HPA's machinery: tolerance 10 %, bounds, scale-up at most max(2x, +4)
per step, and scale-down only to the highest recommendation of the last 300 s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from gpuscaler.config import ReplicasConfig, SimulatorConfig
from gpuscaler.core.model import FloatArray
from gpuscaler.core.replicas import hpa_desired


class RecordedLoad(Protocol):
    load: FloatArray
    requests: FloatArray
    demand_pct: FloatArray


class SimulatedCluster(Protocol):
    """What an autoscaler reads of the simulated cluster (`gpuscaler.sim.cluster`)."""

    @property
    def slot(self) -> float: ...
    @property
    def cursor(self) -> int: ...
    @property
    def sim(self) -> SimulatorConfig: ...
    @property
    def rec(self) -> RecordedLoad: ...
    def recent(self, values: FloatArray, seconds: float) -> FloatArray: ...
    def share(self) -> float: ...
    def spec_count(self) -> int: ...
    def ready_count(self, now: float) -> int: ...


ScalerKind = Literal["hpa_util", "keda_rate", "predictive_floor"]
HPA_SCALE_UP_PODS = 4
"""The HPA's default scale-up policy: at most double, or add 4 pods, per period."""
RATE_WINDOW = 60.0
"""KEDA's rate(requests[1m])."""
FFT_BUCKET = 10.0
FFT_HISTORY = 3600.0
FFT_TOP = 8
"""Frequencies kept from the last hour's spectrum."""
RECENT_MAX = 300.0
"""The predictive floor never forecasts below the max of the last 5 minutes."""


def fft_peak(history: FloatArray, ahead: int, top: int = FFT_TOP) -> float:
    """Peak of a periodic extension of the `top` strongest frequencies of `history`
    over the next `ahead` points (NaN-free history)."""
    n = len(history)
    mean = float(history.mean())
    spec = np.fft.rfft(history - mean)
    spec[0] = 0.0
    if len(spec) > top + 1:
        weakest = np.argsort(np.abs(spec))[: len(spec) - top]
        spec[weakest] = 0.0
    fit = np.fft.irfft(spec, n)
    path = mean + fit[np.arange(ahead) % n]  # the fit repeats with period n
    return float(path.max())


@dataclass
class Scaler:
    kind: ScalerKind
    target_pct: float
    cfg: ReplicasConfig
    interval: float
    horizon: float = 300.0
    recs: list[tuple[float, int]] = field(default_factory=list)
    predicted: dict[int, float] | None = None
    """Predicted loads by slot, shared by the runs of one sweep: they read the same
    demand (the arrivals do not depend on the scaler), so each tick's FFT runs once."""

    def _util_load(self, cluster: SimulatedCluster) -> float | None:
        window = cluster.recent(cluster.rec.load, self.interval)
        finite = window[np.isfinite(window)]
        return float(finite.mean()) if finite.size else None

    def _rate_load(self, cluster: SimulatedCluster) -> float:
        counts = cluster.recent(cluster.rec.requests, RATE_WINDOW)
        seconds = max(len(counts), 1) * cluster.slot
        return 100.0 * float(counts.sum()) / seconds * cluster.sim.gpu_seconds_per_request

    def _predicted_load(self, cluster: SimulatedCluster) -> float:
        if self.predicted is None:
            return self._predict(cluster)
        at = cluster.cursor
        if at not in self.predicted:
            self.predicted[at] = self._predict(cluster)
        return self.predicted[at]

    def _predict(self, cluster: SimulatedCluster) -> float:
        demand = cluster.recent(cluster.rec.demand_pct, FFT_HISTORY)
        width = max(1, round(FFT_BUCKET / cluster.slot))
        bucket = width * cluster.slot  # 10 s, or one slot when slots are coarser
        usable = len(demand) // width * width
        if usable < 6 * width:
            return float(demand.mean()) if demand.size else 0.0
        buckets = demand[len(demand) - usable :].reshape(-1, width).mean(axis=1)
        # Max of the last 5 minutes of 10 s means, as a metrics pipeline scrapes them.
        recent = float(buckets[-max(1, round(RECENT_MAX / bucket)) :].max())
        peak = fft_peak(buckets, max(1, round(self.horizon / bucket)))
        return max(peak, recent)

    def _desired(self, load: float, share: float, current: int, ready: int) -> int:
        ratio = load / (share * max(ready, 1) * self.target_pct)
        if abs(ratio - 1) <= self.cfg.tolerance and ready == current:
            return current
        return hpa_desired(load, share, self.target_pct)

    def step(self, cluster: SimulatedCluster, now: float) -> int:
        """Replicas this scaler asks for now (before any floor)."""
        cfg = self.cfg
        share = cluster.share()
        current = cluster.spec_count()
        ready = cluster.ready_count(now)
        wants: list[int] = []
        if self.kind in ("hpa_util", "predictive_floor"):
            load = self._util_load(cluster)
            if load is not None and ready > 0:
                wants.append(self._desired(load, share, current, ready))
        if self.kind == "keda_rate":
            wants.append(self._desired(self._rate_load(cluster), share, current, current))
        if self.kind == "predictive_floor":
            predicted = self._predicted_load(cluster)
            wants.append(self._desired(predicted, share, current, current))
        desired = max(wants) if wants else current  # no data: hold, as the HPA does
        desired = max(cfg.min_replicas, min(cfg.max_replicas, desired))
        desired = min(desired, max(2 * current, current + HPA_SCALE_UP_PODS))
        self.recs = [(t, v) for t, v in self.recs if t > now - 300.0] + [(now, desired)]
        if desired < current:
            desired = min(current, max(v for _, v in self.recs))
        return desired
