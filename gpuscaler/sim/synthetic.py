"""Synthetic request traces for judging a policy beyond the shared real ones: diurnal,
steps, bursts, slow ramps, a random walk and a flat line. Seeded, 10 s bins, requests
per bin; `rate` sets the mean request rate (requests per second)."""

from __future__ import annotations

import numpy as np

from gpuscaler.core.model import FloatArray
from gpuscaler.sim.trace import Trace

BIN = 10.0
FAMILIES = ("diurnal", "steps", "bursts", "ramps", "random_walk", "flat")
START = 1_700_000_000.0


def _shape(family: str, n: int, rng: np.random.Generator) -> FloatArray:
    """A positive load shape of mean about 1 over `n` bins."""
    t = np.arange(n) * BIN
    if family == "diurnal":  # a 6 h "day" so a few cycles fit in one window
        return np.asarray(1.0 + 0.6 * np.sin(2 * np.pi * t / (6 * 3600.0)), dtype=np.float64)
    if family == "steps":  # a new level every 20-60 minutes
        out = np.empty(n)
        i = 0
        while i < n:
            length = int(rng.integers(120, 360))
            out[i : i + length] = rng.uniform(0.4, 1.6)
            i += length
        return out
    if family == "bursts":  # a calm base with bursts of 1-5 minutes at 2-4x
        out = np.full(n, 0.8)
        for start in rng.integers(0, n, size=max(1, n // 200)):
            length = int(rng.integers(6, 30))
            out[start : start + length] *= rng.uniform(2.0, 4.0)
        return out
    if family == "ramps":  # slow ramps up and down, each over 1-3 hours
        # Knots 1-3 h apart (360-1080 bins), not a fixed 3 h: with a fixed spacing a 6 h
        # window held two ramps, and a draw could hardly move (2.1 -> 2.8 -> 2.5 GPUs).
        knots = np.cumsum(np.concatenate(([0], rng.integers(360, 1081, n // 360 + 2))))
        levels = rng.uniform(0.3, 1.7, len(knots))
        return np.asarray(np.interp(np.arange(n), knots, levels), dtype=np.float64)
    if family == "random_walk":
        steps = rng.normal(0.0, 0.02, n)
        walk = np.exp(np.cumsum(steps))
        return np.asarray(walk / walk.mean(), dtype=np.float64)
    if family == "flat":
        return np.ones(n)
    raise ValueError(f"unknown family {family!r}; one of {', '.join(FAMILIES)}")


def synthetic_trace(family: str, hours: float = 6.0, rate: float = 30.0, seed: int = 0) -> Trace:
    """`hours` of the family's shape at a mean of about `rate` requests per second."""
    rng = np.random.default_rng(seed)
    n = int(hours * 3600 / BIN)
    shape = np.maximum(_shape(family, n, rng), 0.02)
    return Trace(f"synthetic-{family}", START, BIN, shape * rate * BIN, f"synthetic {family}")
