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
- `dynamo_sla`: in the style of NVIDIA Dynamo's throughput-based SLA planner
  (ai-dynamo/dynamo components/src/dynamo/planner/core/throughput_scaling.py): every
  adjustment interval (its default 180 s) the next interval's request count is predicted
  by its Kalman predictor (core/load/predictors.py: local linear trend, q_level 1,
  q_trend 0.1, r 10, its defaults) and replicas = ceil(predicted rate / a replica's rate
  at the SLO), the profile's rate being the swept target's share of a replica's capacity.
  Without the profile-correction factor of its earlier versions: the simulated replica's
  capacity is exactly what the profile says.

Each shares the HPA's machinery: tolerance 10 %, bounds, scale-up at most max(2x, +4)
per step, and scale-down only to the highest recommendation of the last 300 s.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

from gpuscaler.core.model import FloatArray

IntArray = npt.NDArray[np.int64]
ScalerKind = Literal["hpa_util", "keda_rate", "predictive_floor", "dynamo_sla"]
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
STABILIZATION = 300.0
"""The HPA's scale-down stabilization window: the highest recommendation of the last 300 s."""
DYNAMO_INTERVAL = 180.0
KALMAN_Q = np.diag([1.0, 0.1])
KALMAN_R = 10.0


def predicted_load(demand: FloatArray, slot: float, horizon: float) -> float:
    """The predictive floor's load from the last hour of demand (percent of one GPU):
    max(peak of the FFT forecast over the horizon, max of the last 5 minutes), both on
    10 s means (one slot when slots are coarser)."""
    width = max(1, round(FFT_BUCKET / slot))
    bucket = width * slot
    usable = len(demand) // width * width
    if usable < 6 * width:
        return float(demand.mean()) if demand.size else 0.0
    buckets = demand[len(demand) - usable :].reshape(-1, width).mean(axis=1)
    # Max of the last 5 minutes of 10 s means, as a metrics pipeline scrapes them.
    recent = float(buckets[-max(1, round(RECENT_MAX / bucket)) :].max())
    peak = fft_peaks(buckets[None, :], max(1, round(horizon / bucket)))[0]
    return max(float(peak), recent)


def _windows(values: FloatArray, ends: IntArray, length: int) -> FloatArray:
    """values[e - length : e] for each end `e` (all at least `length`), as rows."""
    return np.asarray(values[ends[:, None] - length + np.arange(length)], dtype=np.float64)


def rate_loads(
    requests: FloatArray, cursors: IntArray, slot: float, gpu_seconds_per_request: float
) -> FloatArray:
    """KEDA's rate(requests[1m]) as GPU load in percent of one GPU, from the requests of
    the last minute's slots before each cursor (whole counts: their sums are exact)."""
    length = round(RATE_WINDOW / slot)
    total = np.concatenate(([0.0], np.cumsum(requests)))
    begin = np.maximum(0, cursors - length)
    seconds = np.maximum(cursors - begin, 1) * slot
    return np.asarray(100.0 * (total[cursors] - total[begin]) / seconds * gpu_seconds_per_request)


def kalman_predictions(counts: FloatArray) -> FloatArray:
    """After each interval's request count, the local-linear-trend Kalman filter's
    prediction of the next one (first count: itself, no trend), at least 0."""
    f = np.array([[1.0, 1.0], [0.0, 1.0]])
    x, cov = np.array([counts[0], 0.0]) if counts.size else np.zeros(2), np.eye(2) * 1000.0
    out = np.empty(len(counts))
    for i, z in enumerate(counts):
        if i:
            x, cov = f @ x, f @ cov @ f.T + KALMAN_Q
            gain = cov[:, 0] / (cov[0, 0] + KALMAN_R)
            x = x + gain * (z - x[0])
            cov = cov - np.outer(gain, cov[0])
        out[i] = (f @ x)[0]
    return np.maximum(out, 0.0)


def dynamo_loads(
    requests: FloatArray, cursors: IntArray, slot: float, gpu_seconds_per_request: float
) -> FloatArray:
    """`dynamo_sla`'s load at each cursor (percent of one GPU): the rate its Kalman
    predictor gave at the last adjustment before the cursor; NaN before the first."""
    width = max(1, round(DYNAMO_INTERVAL / slot))
    whole = len(requests) // width
    counts = requests[: whole * width].reshape(whole, width).sum(axis=1)
    predicted = kalman_predictions(counts) / (width * slot)
    done = np.minimum(cursors // width, whole)  # intervals complete at each cursor
    known = done > 0
    rate = np.where(known, predicted[np.maximum(done - 1, 0)] if whole else 0.0, np.nan)
    return np.asarray(100.0 * rate * gpu_seconds_per_request)


CHUNK = 2048
"""Cursors batched per array operation (bounds the memory of a week's windows)."""


def predicted_loads(
    demand: FloatArray, cursors: IntArray, slot: float, horizon: float
) -> FloatArray:
    """`predicted_load` of the last hour of demand before each cursor, for many cursors
    at once: the full hours as one FFT per chunk of cursors."""
    length = round(FFT_HISTORY / slot)
    width = max(1, round(FFT_BUCKET / slot))
    usable = length // width * width
    out = np.empty(len(cursors))
    full = (cursors >= length) & (usable >= 6 * width)
    for i in np.flatnonzero(~full):
        window = demand[max(0, cursors[i] - length) : cursors[i]]
        out[i] = predicted_load(window, slot, horizon)
    bucket = width * slot
    ahead = max(1, round(horizon / bucket))
    recent = max(1, round(RECENT_MAX / bucket))
    for residue in np.unique(cursors[full] % width):
        # The 10 s means of the blocks ending at cursors of this residue, once for all.
        blocks = (len(demand) - residue) // width
        means = demand[residue : residue + blocks * width].reshape(-1, width).mean(axis=1)
        rows = np.flatnonzero(full & (cursors % width == residue))
        for chunk in np.array_split(rows, max(1, len(rows) // CHUNK)):
            buckets = _windows(means, (cursors[chunk] - residue) // width, usable // width)
            peaks = fft_peaks(buckets, ahead)
            out[chunk] = np.maximum(peaks, buckets[:, -recent:].max(axis=1))
    return out


def fft_peaks(histories: FloatArray, ahead: int, top: int = FFT_TOP) -> FloatArray:
    """Peak of a periodic extension of the `top` strongest frequencies of each row of
    `histories` over the next `ahead` points (NaN-free rows)."""
    n = histories.shape[1]
    mean = histories.mean(axis=1)
    spec = np.fft.rfft(histories - mean[:, None], axis=1)
    spec[:, 0] = 0.0
    if spec.shape[1] > top + 1:
        weakest = np.argsort(np.abs(spec), axis=1)[:, : spec.shape[1] - top]
        np.put_along_axis(spec, weakest, 0.0, axis=1)
    fit = np.fft.irfft(spec, n, axis=1)
    return np.asarray((mean[:, None] + fit[:, np.arange(ahead) % n]).max(axis=1))


def desired_replicas(
    load: FloatArray | float,
    share: FloatArray | float,
    current: IntArray | int,
    ready: IntArray | int | None,
    target: FloatArray | float,
    tolerance: FloatArray | float,
) -> IntArray:
    """The HPA's answer for `load` (percent of one GPU): `current` while the ratio to the
    `ready` replicas' use at `target` is within the tolerance (and all are ready; `ready`
    None: all `current` are), else the HPA formula. Elementwise over arrays of runs."""
    ratio = load / (share * np.maximum(current if ready is None else ready, 1) * target)
    hold = np.abs(ratio - 1) <= tolerance
    if ready is not None:
        hold = hold & (ready == current)
    formula = np.ceil(load / (share * np.asarray(target)) - 1e-9)
    return np.where(hold, current, formula).astype(np.int64)


def bounds(
    desired: IntArray | int, current: IntArray | int, lo: IntArray | int, hi: IntArray | int
) -> IntArray:
    """`desired` within the replica bounds `lo`..`hi` (per run, as arrays, or one for all)
    and the HPA's scale-up limit (max(2x, +4))."""
    desired = np.maximum(lo, np.minimum(hi, desired))
    limit = np.maximum(2 * np.asarray(current), np.asarray(current) + HPA_SCALE_UP_PODS)
    return np.asarray(np.minimum(desired, limit), dtype=np.int64)
