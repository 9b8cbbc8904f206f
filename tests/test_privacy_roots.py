"""The (ε, δ) conversions find their optimal order by bisection (pipeline.privacy.roots) and give
what they gave with scipy.optimize.brentq, while a process that loads a configuration no longer
imports scipy.optimize (about 0.4 s of CPU in every worker, releaser and `dpstream` command)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import brentq

from pipeline.privacy import conversions
from pipeline.privacy.roots import increasing_root

REPO = Path(__file__).resolve().parents[1]
RHOS = np.geomspace(1e-6, 50.0, 25)


def _with_brentq(f, lo, hi, *, xtol, rtol, maxiter=500):
    return brentq(f, lo, hi, xtol=xtol, rtol=rtol, maxiter=maxiter)


def test_conversions_equal_the_brentq_ones(monkeypatch):
    """ε(ρ, δ) and δ(ρ, ε) are evaluated at the root of their optimality condition, where they are
    flat, so the two root finders (both to 4 ulps) agree far below BUDGET_RTOL."""
    grid = [(rho, 10.0**-k) for rho in RHOS for k in (3, 6, 9, 12)]
    eps_grid = [(rho, eps) for rho in RHOS for eps in (0.01, 0.5, 1.0, 8.0)]
    ours_eps = [conversions.zcdp_to_approx_dp(rho, delta) for rho, delta in grid]
    ours_delta = [conversions.approx_dp_delta(rho, eps) for rho, eps in eps_grid]
    monkeypatch.setattr(conversions, "increasing_root", _with_brentq)
    ref_eps = [conversions.zcdp_to_approx_dp(rho, delta) for rho, delta in grid]
    ref_delta = [conversions.approx_dp_delta(rho, eps) for rho, eps in eps_grid]
    np.testing.assert_allclose(ours_eps, ref_eps, rtol=1e-13, atol=0.0)
    np.testing.assert_allclose(ours_delta, ref_delta, rtol=1e-12, atol=1e-300)
    assert any(e > 0 for e in ours_eps) and any(0 < d < 1 for d in ours_delta)


def test_the_root_is_within_the_tolerance_and_a_bad_bracket_is_refused():
    root = increasing_root(lambda u: u**3 - 2.0, 0.0, 5.0, xtol=1e-15, rtol=4 * 2.0**-52)
    assert abs(root - 2.0 ** (1 / 3)) <= 1e-15 + 4 * 2.0**-52 * root
    assert increasing_root(lambda u: u, 0.0, 1.0, xtol=1e-15, rtol=0.0) == 0.0
    with pytest.raises(ValueError, match="do not bracket"):
        increasing_root(lambda u: u - 10.0, 0.0, 5.0, xtol=1e-15, rtol=0.0)
    with pytest.raises(ValueError, match="within 3 halvings"):
        increasing_root(lambda u: math.atan(u - 0.3), 0.0, 1.0, xtol=1e-15, rtol=0.0, maxiter=3)


def test_loading_a_configuration_does_not_import_scipy_optimize():
    code = ("import sys; from pipeline.config import load_config; "
            "load_config('deploy/config/dpstream.yaml').budget_plan(); "
            "print('scipy.optimize' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=REPO, check=True).stdout.split()
    assert out == ["False"], out
