"""Shifting heavy hitters (Kaplan–Mansour–Stemmer §4, Definition 4.1, Theorem 4.7) with four interchangeable methods
calibrated to the same target (ε, δ):

* ``"tme"``: ThresholdMonitorEvolving (Alg. 5) with internal (ε̃, δ̃) from Theorem 3.2's explicit ξ,
  through Theorem 4.4's reduction (group privacy for ``replace``) —
  :func:`calibration.calibrate_threshold_monitor`.
* ``"tct"``: SVT with individual charging (Cohen–Lyu Alg. 5), per-user Theorem B.4 —
  :func:`calibration.calibrate_individual_charging`. Publishes the noisy counts of flagged elements.
* ``"svt_restart"``: AboveThreshold (Kaplan–Mansour–Stemmer Alg. 2) restarted after each ⊤, halting after
  ``max_tops`` ⊤s, composed — :func:`calibration.calibrate_svt_restart`.
* ``"naive"``: a discrete-Gaussian histogram every step, zCDP over the horizon, tight conversion —
  :func:`calibration.calibrate_naive`.

Thresholds and τ (Definition 4.1 with a union bound over horizon × |X| queries). Write N for a
query's noise and p₀ = β/(2·horizon·|X|). Let U be the smallest integer with P(N ≥ U) ≤ p₀ and L the
smallest with P(N ≤ −L) ≤ p₀. With probability ≥ 1 − β every query's noise lies in (−L, U). Then with
threshold t = U + charge_weight − 1:
  1. a weight-0 element (active count 0) is never flagged (N < U ≤ t);
  2. a flag needs active count ≥ t − N > charge_weight − 1, so users are charged only on elements of
     weight ≥ charge_weight;
  3. an element whose active count is ≥ τ = t + L − 1 is always flagged.
For tme/tct the active count equals the weight as long as no holder was retired; a user is retired
after k charges, so if every user holds an element of weight ≥ charge_weight in at most k steps (the
k* premise of Notation 4.6), every element of weight ≥ τ is flagged at every step. For svt_restart,
N = ν − η (per-query ν ~ Lap(4/ε₁), shared threshold noise η ~ Lap(2/ε₁) redrawn per run): η gets β/4
over max_tops + 1 runs, ν gets 3β/4 over the queries, t = U_ν + L_η + charge_weight − 2 and
τ = t + U_η + L_ν − 2; the premise is that at most max_tops (step, element) pairs have weight ≥
charge_weight. Naive has no premise.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pipeline.privacy.events import ApproxDP
from pipeline.privacy.laws import (
    CappedSumLaw,
    DiscreteGaussianLaw,
    DiscreteLaplaceLaw,
    geometric_draw,
    lower_quantile,
    upper_quantile,
)
from pipeline.privacy.neighbours import check_neighbours
from pipeline.privacy.noise import discrete_gaussian, discrete_laplace, used_scale
from pipeline.validation import check_int, check_real, check_values

from . import calibration as cal
from .sparse import active_histogram, sparse_flags
from .state import StatefulMixin
from .tct import IndividualChargingSVT
from .threshold import ThresholdMonitorEvolving

__all__ = ["ShiftingHeavyHitters", "METHODS", "heavy_hitter_plan"]

METHODS = ("tme", "tct", "svt_restart", "naive")
MAX_DOMAIN = 1 << 40


def heavy_hitter_plan(
    method: str,
    domain_size: int,
    epsilon: float,
    delta: float,
    k: int,
    horizon: int,
    beta: float = 0.05,
    neighbours: str = "replace",
    charge_weight: int = 1,
    max_tops: int | None = None,
) -> dict[str, Any]:
    """Calibration, threshold and τ of a method without building the mechanism (used by the
    evaluation to plot τ against the horizon). Returns a dict with ``threshold``, ``tau``,
    ``privacy`` (ApproxDP) and the internal parameters."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    domain_size = check_int(domain_size, "domain_size", low=1, high=MAX_DOMAIN)
    epsilon = check_real(epsilon, "epsilon", low=0.0, low_open=True)
    delta = check_real(delta, "delta", low=0.0, high=1.0, low_open=True, high_open=True)
    k = check_int(k, "k", low=1)
    horizon = check_int(horizon, "horizon", low=1)
    beta = check_real(beta, "beta", low=0.0, high=1.0, low_open=True, high_open=True)
    neighbours = check_neighbours(neighbours)
    charge_weight = check_int(charge_weight, "charge_weight", low=1)
    queries = float(horizon) * float(domain_size)
    plan: dict[str, Any] = {
        "method": method,
        "neighbours": neighbours,
        "charge_weight": charge_weight,
    }
    if method == "svt_restart":
        max_tops = horizon if max_tops is None else check_int(max_tops, "max_tops", low=1)
        eps1 = cal.calibrate_svt_restart(epsilon, delta, max_tops)
        s_eta, s_nu = used_scale(2.0 / eps1), used_scale(4.0 / eps1)
        eta_law, nu_law = DiscreteLaplaceLaw(s_eta), DiscreteLaplaceLaw(s_nu)
        log_eta = math.log(beta / (8.0 * (max_tops + 1)))
        log_nu = math.log(3.0 * beta / (8.0 * queries))
        u_eta, l_eta = upper_quantile(eta_law, log_eta), lower_quantile(eta_law, log_eta)
        u_nu, l_nu = upper_quantile(nu_law, log_nu), lower_quantile(nu_law, log_nu)
        t = u_nu + l_eta + charge_weight - 2
        plan.update(
            epsilon1=eps1,
            scale_eta=s_eta,
            scale_nu=s_nu,
            max_tops=max_tops,
            threshold=t,
            tau=t + u_eta + l_nu - 2,
            privacy=cal.svt_restart_privacy(eps1, max_tops, delta),
        )
        return plan
    log_p = math.log(beta / (2.0 * queries))
    law: CappedSumLaw | DiscreteLaplaceLaw | DiscreteGaussianLaw
    if method == "tme":
        eps_t, delta_t = cal.calibrate_threshold_monitor(epsilon, delta, k, neighbours)
        big_delta, s_w, s_v = cal.threshold_monitor_noise(eps_t, delta_t)
        law = CappedSumLaw(used_scale(s_w), used_scale(s_v), big_delta)
        plan.update(
            epsilon_tilde=eps_t,
            delta_tilde=delta_t,
            Delta=big_delta,
            scale_w=s_w,
            scale_v=s_v,
            privacy=cal.threshold_monitor_privacy(eps_t, delta_t, k, neighbours),
        )
    elif method == "tct":
        eps0 = cal.calibrate_individual_charging(epsilon, delta, k, neighbours)
        law = DiscreteLaplaceLaw(used_scale(1.0 / eps0))
        bound = cal.individual_charging_privacy(eps0, k, delta, neighbours)
        plan.update(
            epsilon0=eps0,
            scale=1.0 / eps0,
            tct_alpha=bound.alpha,
            tct_form=bound.form,
            privacy=bound.as_approx_dp(),
        )
    else:
        sigma2 = cal.calibrate_naive(epsilon, delta, horizon, neighbours)
        law = DiscreteGaussianLaw(sigma2)
        plan.update(sigma2=sigma2, privacy=cal.naive_privacy(sigma2, horizon, delta, neighbours))
    u, low = upper_quantile(law, log_p), lower_quantile(law, log_p)
    t = u + charge_weight - 1
    plan.update(threshold=t, tau=t + low - 1, upper=u, lower=low)
    return plan


class ShiftingHeavyHitters(StatefulMixin):
    """Per step, the set of elements held by many users, under user-level (ε, δ)-DP over the whole
    stream (docs/privacy.md). ``update(values)`` takes the length-n array of users' current elements
    (< ``domain_size``, up to 2^40) and returns the sorted int64 ids flagged heavy this step.

    ``threshold`` (count units) and ``tau`` (weight at which Definition 4.1's guarantee holds w.p.
    ≥ 1 − β, see the module docstring for the premise); ``privacy`` is the (ε, δ) the named theorem
    gives for the derived parameters; ``plan`` holds every derived number. ``noisy_counts`` (tct only)
    holds the published noisy counts of the last step's flagged elements.
    """

    _state_fields = (
        "domain_size",
        "epsilon",
        "delta",
        "k",
        "horizon",
        "beta",
        "method",
        "neighbours",
        "charge_weight",
        "max_tops_arg",
        "step",
        "n",
        "engine_state",
        "eta",
        "tops",
        "halted",
        "noisy_counts",
        "mode",
    )

    def __init__(
        self,
        domain_size: int,
        epsilon: float,
        delta: float,
        k: int,
        horizon: int,
        beta: float = 0.05,
        method: str = "tme",
        seed: Any = None,
        *,
        neighbours: str = "replace",
        charge_weight: int = 1,
        max_tops: int | None = None,
    ):
        self.plan = heavy_hitter_plan(
            method,
            domain_size,
            epsilon,
            delta,
            k,
            horizon,
            beta,
            neighbours,
            charge_weight,
            max_tops,
        )
        self.domain_size, self.epsilon, self.delta = int(domain_size), float(epsilon), float(delta)
        self.k, self.horizon, self.beta, self.method = int(k), int(horizon), float(beta), method
        self.neighbours, self.charge_weight, self.max_tops_arg = (
            self.plan["neighbours"],
            int(charge_weight),
            max_tops,
        )
        self._rng_init(seed)
        self.step = 0
        self.n = -1  # fixed at the first update (the roster size)
        self.engine_state: dict[str, Any] | None = None
        self.eta = 0
        self.tops = 0
        self.halted = False
        self.noisy_counts = np.zeros(0, dtype=np.int64)
        self.mode = ""  # "values" (update) or "counts" (release_histogram); never mixed
        self._engine: ThresholdMonitorEvolving | IndividualChargingSVT | None = None
        if method == "svt_restart":
            self.eta = self._draw_eta()

    # -- derived numbers ----------------------------------------------------------------------------
    @property
    def threshold(self) -> int:
        return int(self.plan["threshold"])

    @property
    def tau(self) -> int:
        return int(self.plan["tau"])

    @property
    def privacy(self) -> ApproxDP:
        return self.plan["privacy"]

    def _draw_eta(self) -> int:
        return int(discrete_laplace(self.plan["scale_eta"], 1, self._source)[0])

    # -- state ----------------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        if self._engine is not None:
            self.engine_state = self._engine.get_state()
            self.engine_state.pop("rng")  # one shared source, saved once
        return super().get_state()

    def _after_restore(self) -> None:
        self.plan = heavy_hitter_plan(
            self.method,
            self.domain_size,
            self.epsilon,
            self.delta,
            self.k,
            self.horizon,
            self.beta,
            self.neighbours,
            self.charge_weight,
            self.max_tops_arg,
        )
        self._engine = None
        if self.engine_state is not None:
            cls = ThresholdMonitorEvolving if self.method == "tme" else IndividualChargingSVT
            st = dict(self.engine_state)
            st["rng"] = {"kind": "secure"}
            self._engine = cls.from_state(st)
            self._engine._source = self._source

    def _make_engine(self, n: int) -> None:
        if self.method == "tme":
            self._engine = ThresholdMonitorEvolving(
                n,
                self.plan["epsilon_tilde"],
                self.plan["delta_tilde"],
                self.threshold,
                self.k,
                seed=self._source,
            )
        elif self.method == "tct":
            self._engine = IndividualChargingSVT(
                n, self.plan["epsilon0"], self.k, seed=self._source
            )

    # -- the step -------------------------------------------------------------------------------------
    def _set_mode(self, mode: str) -> None:
        if self.mode and self.mode != mode:
            raise RuntimeError(
                f"this monitor is driven by {self.mode}; do not mix update() and release_histogram()"
            )
        self.mode = mode

    @property
    def needs_feedback(self) -> bool:
        """Whether users are charged for flags (tme, tct): the stream's workers must be told them."""
        return self.method in ("tme", "tct")

    def release_histogram(self, support: Any, counts: Any) -> np.ndarray:
        """One step from the histogram of the *active* users' elements: sorted distinct ``support``
        ids (< ``domain_size``) and their ``counts`` (≥ 1). The stream's releaser calls this with the
        sum of the workers' partial histograms; the workers keep the per-user charges (a user is
        active while charged fewer than k times; charged when it holds a flagged element). Returns
        the flagged ids; for tct, :attr:`noisy_counts` holds their published noisy counts.

        Same draws in the same order as :meth:`update`, so with the workers charging exactly as
        the engines do, the stream reproduces the library run bit for bit.
        """
        if self.step >= self.horizon:
            raise RuntimeError(
                f"horizon={self.horizon} steps reached: the calibration covers no more"
            )
        sup = np.asarray(support)
        cnt = np.asarray(counts)
        if sup.ndim != 1 or cnt.shape != sup.shape:
            raise ValueError(
                f"support and counts must be 1-d arrays of one length, got {sup.shape} and {cnt.shape}"
            )
        if sup.size and (
            not np.issubdtype(sup.dtype, np.integer) or not np.issubdtype(cnt.dtype, np.integer)
        ):
            raise ValueError("support and counts must be integer arrays")
        sup, cnt = sup.astype(np.int64), cnt.astype(np.int64)
        if sup.size and (sup[0] < 0 or sup[-1] >= self.domain_size or np.any(np.diff(sup) <= 0)):
            raise ValueError(
                f"support must be sorted distinct ids in [0, domain_size={self.domain_size})"
            )
        if np.any(cnt < 1):
            raise ValueError("counts must be >= 1 (elements absent from the support have count 0)")
        self._set_mode("counts")
        if self._engine is None and self.needs_feedback:
            self._make_engine(0)  # no per-user state on this side: only the noise and the threshold
        self.step += 1
        return self._flags(sup, cnt)

    def _flags(self, support: np.ndarray, counts: np.ndarray) -> np.ndarray:
        engine = self._engine
        if self.method == "tme":
            assert isinstance(engine, ThresholdMonitorEvolving)  # made by _make_engine for tme
            return engine.flag_histogram(support, counts, self.domain_size)
        if self.method == "tct":
            assert isinstance(engine, IndividualChargingSVT)  # made by _make_engine for tct
            flagged, self.noisy_counts = engine.flag_histogram(
                support, counts, self.domain_size, self.threshold
            )
            return flagged
        if self.method == "naive":
            return self._naive_flags(support, counts)
        return self._svt_flags(support, counts)

    def update(self, values: Any) -> np.ndarray:
        if self.step >= self.horizon:
            raise RuntimeError(
                f"horizon={self.horizon} steps reached: the calibration covers no more"
            )
        self._set_mode("values")
        arr = np.asarray(values)
        if self.n < 0:
            if arr.ndim != 1:
                raise ValueError(f"values must be a 1-d array, got shape {arr.shape}")
            self.n = int(arr.shape[0])
            self._make_engine(self.n)
        vals = check_values(arr, self.n, self.domain_size)
        self.step += 1
        engine = self._engine
        if self.method == "tme":
            assert isinstance(engine, ThresholdMonitorEvolving)  # made by _make_engine for tme
            flagged = engine.query_all_elements(vals, self.domain_size)
        elif self.method == "tct":
            assert isinstance(engine, IndividualChargingSVT)  # made by _make_engine for tct
            flagged, self.noisy_counts = engine.query_all_elements(
                vals, self.domain_size, self.threshold
            )
        elif self.method == "naive":
            flagged = self._naive_step(vals)
        else:
            flagged = self._svt_step(vals)
        return flagged

    def _naive_step(self, vals: np.ndarray) -> np.ndarray:
        return self._naive_flags(*active_histogram(vals, self.domain_size))

    def _naive_flags(self, support: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Every element's count + DG(σ²) compared with the threshold; zero-count elements sparsely."""
        noisy = counts + discrete_gaussian(self.plan["sigma2"], support.size, self._source)
        law = self._naive_law()
        flagged, _ = sparse_flags(
            self._source,
            self.domain_size,
            support,
            noisy >= self.threshold,
            lambda digits: law.sf_interval(self.threshold, digits),
        )
        return flagged

    def _naive_law(self) -> DiscreteGaussianLaw:
        """The naive method's noise law, kept so its tail intervals are computed once per process."""
        law = getattr(self, "_dg_law", None)
        if law is None:
            law = self._dg_law = DiscreteGaussianLaw(self.plan["sigma2"])
        return law

    def _svt_step(self, vals: np.ndarray) -> np.ndarray:
        return self._svt_flags(*active_histogram(vals, self.domain_size))

    def _svt_flags(self, support: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """The |X| queries of the step in id order through restarted AboveThreshold.

        Given the current threshold noise η, the ⊤ events of the queries are independent; the next ⊤
        is the earlier of (a) the first support element (in id order) with count + ν ≥ t + η — exact,
        from explicit ν draws — and (b) the first zero-count id with ν ≥ t + η, whose position among
        the zero-count ids after the current position is Geometric(p(η)) (independent Bernoulli
        trials in order). After a ⊤ at id x, η is redrawn and the search restarts at x + 1: the
        queries after x use noise not yet involved in any output (the discarded geometric draw only
        told that no zero-count id before x crossed, which is what the sequential process does).
        """
        if self.halted:
            return np.zeros(0, dtype=np.int64)
        noisy = counts + discrete_laplace(self.plan["scale_nu"], support.size, self._source)
        nu_law = DiscreteLaplaceLaw(self.plan["scale_nu"])
        # zero-count ids before support[i]: support[i] − i; zero-rank r ↦ id = r + #{i : support[i] − i ≤ r}
        zeros_before = support - np.arange(support.size, dtype=np.int64)
        n_zero = self.domain_size - support.size
        flagged: list[int] = []
        pos, s_idx = 0, 0
        while True:
            level = self.threshold + self.eta
            j = _first_at_least(noisy, s_idx, level)
            cand_support = int(support[j]) if j >= 0 else None
            rank0 = pos - int(np.searchsorted(support, pos))  # zero ids below pos
            g = geometric_draw(
                self._source,
                lambda digits: nu_law.sf_interval(level, digits),  # noqa: B023  (drawn now)
                limit=n_zero - rank0,
            )
            cand_zero = None
            if rank0 + g < n_zero:
                r = int(rank0 + g)
                cand_zero = r + int(np.searchsorted(zeros_before, r, side="right"))
            if cand_support is None and cand_zero is None:
                break
            x = (
                cand_support
                if cand_zero is None or (cand_support is not None and cand_support < cand_zero)
                else cand_zero
            )
            assert x is not None  # one of the candidates (the loop ended above otherwise)
            flagged.append(x)
            self.tops += 1
            self.eta = self._draw_eta()
            if self.tops >= self.plan["max_tops"]:
                self.halted = True
                break
            pos = x + 1
            s_idx = int(np.searchsorted(support, pos))
        return np.asarray(flagged, dtype=np.int64)


def _first_at_least(arr: np.ndarray, start: int, level: float) -> int:
    """Index of the first arr[i] ≥ level with i ≥ start, or −1; galloping blocks so the cost is
    proportional to the distance scanned."""
    block = 64
    n = arr.size
    while start < n:
        seg = arr[start : start + block]
        hit = np.flatnonzero(seg >= level)
        if hit.size:
            return start + int(hit[0])
        start += block
        block *= 2
    return -1
