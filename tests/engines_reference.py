"""`engines.refit_or_reuse` as it was at 3ecdbd8 (issue 20, fb8: the oracle of its
one-pass rewrite, tests/test_forecast_rows.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from gpuscaler.core.forecast.engines import Fitted, LeastSquaresArima, inverse_root_modulus
from gpuscaler.core.model import FitState, FloatArray


def refit_or_reuse(
    engine: LeastSquaresArima,
    hist: FloatArray,
    keys: Sequence[str | None],
    prior: Mapping[str, FitState],
    now: float,
    refit_every: float,
) -> tuple[Fitted, dict[str, FitState], int]:
    """Coefficients for every row: reused where the series' fit is younger than
    `refit_every` (its state, the newest observations, still moves the forecast), refitted
    in one batch otherwise. Returns them, the fit states to keep, and how many were refit."""
    n = hist.shape[0]
    stale = [
        r
        for r, key in enumerate(keys)
        if key is None
        or key not in prior
        or now - prior[key].fitted_at >= refit_every
        or len(prior[key].phi) != engine.p
    ]
    intercept, phi, sigma2 = np.empty(n), np.empty((n, engine.p)), np.empty(n)
    modulus = np.empty(n)
    if stale:
        fresh = engine.fit(hist[stale])
        intercept[stale], phi[stale], sigma2[stale] = fresh.intercept, fresh.phi, fresh.sigma2
    stale_set = set(stale)
    unknown = stale + [
        r
        for r, k in enumerate(keys)
        if r not in stale_set and k is not None and prior[k].modulus is None
    ]
    reuse = [r for r in range(n) if r not in stale_set]
    if reuse:  # the kept floats written into their rows at once (the same values)
        olds = [prior[key] for r in reuse if (key := keys[r]) is not None]
        intercept[reuse] = [old.intercept for old in olds]
        phi[reuse] = np.array([old.phi for old in olds], dtype=np.float64).reshape(-1, engine.p)
        sigma2[reuse] = [old.sigma2 for old in olds]
        modulus[reuse] = [np.nan if old.modulus is None else old.modulus for old in olds]
    if unknown:  # per row, the same whichever rows are found together
        modulus[unknown] = inverse_root_modulus(phi[unknown])
    states: dict[str, FitState] = {}
    for r, key in enumerate(keys):
        if key is not None:
            states[key] = (
                FitState(
                    now,
                    float(intercept[r]),
                    tuple(phi[r].tolist()),
                    float(sigma2[r]),
                    prior[key].interval if key in prior else None,
                    modulus=float(modulus[r]),
                )
                if r in stale_set
                else prior[key]
            )
    return Fitted(intercept, phi, sigma2, modulus), states, len(stale)
