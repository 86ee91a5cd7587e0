"""An engine keeps the last batches' prediction half widths by their coefficients
(issue 20: they change only at a refit); what it hands back is what `half_width` finds."""

from __future__ import annotations

import numpy as np
import pytest

from gpuscaler.core.forecast.engines import _KEPT_HALVES, Fitted, LeastSquaresArima


def _fitted(seed: int, n: int = 6, p: int = 3) -> Fitted:
    rng = np.random.default_rng(seed)
    phi = rng.uniform(-0.4, 0.4, (n, p))
    phi[1] = np.nan  # a row that could not be fitted
    return Fitted(rng.normal(0, 1, n), phi, rng.uniform(0.5, 3.0, n))


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("d", [0, 1])
def test_kept_half_widths_are_the_ones_found_afresh_for_each_batch_and_level(d: int) -> None:
    engine = LeastSquaresArima(3, d)
    batches = [_fitted(s) for s in range(3)]
    for _ in range(2):  # the second round is answered from what was kept
        for f in batches:
            for steps, level in ((12, 0.9), (12, 0.8), (30, 0.9)):
                fresh = LeastSquaresArima(3, d).half_width(f, steps, level)
                assert _same(engine.kept_half_width(f, steps, level), fresh)


def test_a_batch_whose_coefficients_changed_in_one_row_is_found_again() -> None:
    engine = LeastSquaresArima(3, 1)
    f = _fitted(4)
    engine.kept_half_width(f, 12, 0.9)
    for field in ("phi", "sigma2"):
        changed = {"phi": f.phi.copy(), "sigma2": f.sigma2.copy()}
        changed[field].reshape(-1)[-1] *= 1.5
        g = Fitted(f.intercept, changed["phi"], changed["sigma2"])
        assert _same(engine.kept_half_width(g, 12, 0.9), engine.half_width(g, 12, 0.9))
    rows = Fitted(f.intercept[[2, 0]], f.phi[[2, 0]], f.sigma2[[2, 0]])  # other rows
    assert _same(engine.kept_half_width(rows, 12, 0.9), engine.half_width(rows, 12, 0.9))


def test_kept_half_widths_are_read_only_and_bounded_in_number() -> None:
    engine = LeastSquaresArima(3, 1)
    kept = engine.kept_half_width(_fitted(0), 12, 0.9)
    with pytest.raises(ValueError):
        kept[0, 0] = 1.0
    for seed in range(3 * _KEPT_HALVES):
        engine.kept_half_width(_fitted(seed), 12, 0.9)
    assert len(engine._halves) == _KEPT_HALVES
