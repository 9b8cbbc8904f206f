"""PREM: synthetic histograms with relative error (Ghazi, Guzmán, Kamath, Knop, Kumar, Manurangsi,
Sachdeva, "PREM: Privately Answering Statistical Queries with Relative Error", arXiv 2502.14809).

* :func:`find_margin_example` — Algorithm 2 (FindMarginExample) over the interval monitor
  (Algorithm 1, approximate DP, or Algorithm 4, pure DP; :mod:`pipeline.monitors.interval`).
* :class:`PREM` — Algorithm 3: rounds i = 1..I with a noisy mass ñ_i, a multiplicative-weights
  estimate on the uncertified part X^i, certified pieces ĥ^i|_S added to the output.

Privacy plans (noise, margins, α) live in :mod:`pipeline.synth.prem_privacy`; proofs in docs/prem.md.

Cost. A monitor query is f(h|S_active) + noise. The vectors f(h|S_active) and f(ĥ|S_active) over all
f are kept incrementally: one sparse mat-vec per call, then each removed element's column is
subtracted once (CSC), so a call costs O(nnz(F)) plus O(|F|) numpy work per non-Inside answer.
Within a pass, noise for the not-yet-asked queries is drawn up front: the draws are i.i.d. and
independent of everything else, so drawing them early does not change the monitor's law.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import sparse

from pipeline.privacy.events import ApproxDP
from pipeline.privacy.noise import discrete_gaussian, discrete_laplace, used_scale
from pipeline.privacy.rng import RandomSource, as_random_source
from pipeline.validation import check_int

from .prem_privacy import ACCOUNTINGS, MONITORS, PremPlan, charged_plan, paper_plan, plan_privacy

__all__ = [
    "PREM",
    "find_margin_example",
    "MarginExample",
    "IntervalNoise",
    "as_query_matrix",
    "APPROX",
    "PLUS",
    "MINUS",
]

APPROX, PLUS, MINUS = 0, 1, -1


def as_query_matrix(queries: Any, domain_size: int) -> sparse.csr_matrix:
    """The family F as a 0/1 CSR matrix (|F|, domain_size): a scipy.sparse matrix or a list of
    arrays of element ids. Duplicate ids within a query count once (f is a 0/1 function)."""
    if sparse.issparse(queries):
        mat = sparse.csr_matrix(queries)
        if mat.shape[1] != domain_size:
            raise ValueError(f"queries must have {domain_size} columns, got shape {mat.shape}")
        mat.eliminate_zeros()
        if mat.nnz and not np.all(mat.data == 1):
            raise ValueError("queries must be a 0/1 matrix")
    else:
        try:
            rows = [np.unique(np.asarray(q, dtype=np.int64).ravel()) for q in queries]
        except (TypeError, ValueError) as exc:
            raise TypeError(
                "queries must be a scipy.sparse 0/1 matrix or a list of integer id arrays"
            ) from exc
        if not rows:
            raise ValueError("queries must hold at least one query")
        for j, r in enumerate(rows):
            if r.size and (r[0] < 0 or r[-1] >= domain_size):
                raise ValueError(f"queries[{j}] has ids outside [0, {domain_size})")
        indptr = np.concatenate([[0], np.cumsum([r.size for r in rows])])
        indices = np.concatenate(rows) if indptr[-1] else np.zeros(0, np.int64)
        mat = sparse.csr_matrix(
            (np.ones(indices.size), indices, indptr), shape=(len(rows), domain_size)
        )
    if mat.shape[0] == 0:
        raise ValueError("queries must hold at least one query")
    return mat.astype(np.float64)


class IntervalNoise:
    """The monitor's noise and answer rule, applied to a vector of counts at once.

    approx (Algorithm 1): v + DLap(a) (pmf ∝ e^{−a|x|}); Inside iff lo < v̂ < hi, else Above iff v̂ ≥ hi.
    pure (Algorithm 4): η ~ DLap(scale 2/a), drawn afresh at the start of every FindMarginExample call
    (:meth:`start_call`: one monitor per call, as in the paper, so each call is one (a·Γ)-DP run of
    Algorithm 4) and redrawn after every Above/Below; Above iff v + ν₁ ≥ hi + η, else Below iff
    v + ν₂ ≤ lo − η, ν₁, ν₂ ~ DLap(scale 4/a) independent.
    The same rules as :class:`~pipeline.monitors.interval.OutsideIntervalMonitor` (and ``...Pure``).

    ``eta_draws`` / ``eta_max_abs`` / ``calls`` record how many η were drawn, the largest |η| and the
    calls started (curator-side diagnostics: the utility margin's union bound is over ≤ Γ + 1 draws
    per call).
    """

    def __init__(self, kind: str, a: float, source: RandomSource):
        self.kind, self.a, self.source = kind, a, source
        self.eta_draws, self.eta_max_abs, self.calls = 0, 0, 0
        if kind == "approx":
            self.scale = used_scale(1.0 / a)
        else:
            self.scale = used_scale(4.0 / a)
            self.scale_eta = used_scale(2.0 / a)
            self.eta: int | None = None
        self.queries = 0

    def _draw_eta(self) -> int:
        eta = int(discrete_laplace(self.scale_eta, 1, self.source)[0])
        self.eta_draws += 1
        self.eta_max_abs = max(self.eta_max_abs, abs(eta))
        return eta

    def start_call(self) -> None:
        """A new monitor: the pure rule's threshold noise η is drawn afresh (Algorithm 4's start)."""
        self.calls += 1
        if self.kind == "pure":
            self.eta = self._draw_eta()

    def draw(self, size: int) -> np.ndarray:
        """Noise for ``size`` queries: shape (size,) (approx) or (2, size) (pure)."""
        if self.kind == "approx":
            return discrete_laplace(self.scale, size, self.source)
        return discrete_laplace(self.scale, 2 * size, self.source).reshape(2, size)

    def answers(
        self, values: np.ndarray, noise: np.ndarray, lo: np.ndarray, hi: np.ndarray
    ) -> np.ndarray:
        """PLUS (Above), MINUS (Below) or APPROX (Inside) per query, without side effects."""
        if self.kind == "approx":
            noisy = values + noise
            above, below = noisy >= hi, noisy <= lo
        else:
            if self.eta is None:
                raise RuntimeError(
                    "IntervalNoise: call start_call() before the pure monitor's first answer"
                )
            above = values + noise[0] >= hi + self.eta
            below = ~above & (values + noise[1] <= lo - self.eta)
        return np.where(above, PLUS, np.where(below, MINUS, APPROX))

    def after_outside(self) -> None:
        if self.kind == "pure":
            self.eta = self._draw_eta()


@dataclass
class MarginExample:
    """FindMarginExample's output (θ, S) and the partition it was chosen from."""

    theta: int
    support: np.ndarray  # S (bool mask over the domain)
    plus: np.ndarray  # S^{+1}
    minus: np.ndarray  # S^{-1}
    active: np.ndarray  # S_active at the end
    certified: bool  # the last pass was all Inside (S_active is (ζ, α₀)-accurate)
    queries: int
    passes: int


def find_margin_example(
    queries: sparse.csr_matrix,
    histogram: np.ndarray,
    estimate: np.ndarray,
    active: np.ndarray,
    zeta: float,
    alpha0: float,
    noise: IntervalNoise,
    max_passes: int | None = None,
    columns: sparse.csc_matrix | None = None,
) -> MarginExample:
    """Algorithm 2 of Ghazi et al. on the active set Y = ``active``.

    Pass over F_active in order: τ_u = (f(ĥ|S) + α₀/2)/(1−ζ), τ_ℓ = (f(ĥ|S) − α₀/2)/(1+ζ); a
    non-Inside answer moves S ∩ f^{-1}(1) to S^{+1} (Above) or S^{-1} (Below), drops f, and makes
    the pass inaccurate. Repeat until a pass is all Inside (or ``max_passes``: then S_active is not
    certified and only S^{±1} may be returned). Return the part of largest ĥ-mass (ties: +1, −1,
    Approx, as printed). Lemma 3.2: w.p. ≥ 1 − β (C the monitor margin, α₀ = 2(1+ζ)C) Approx ⇒
    (1−ζ)f(h|S) − α₀ ≤ f(ĥ|S) ≤ (1+ζ)f(h|S) + α₀ ∀f; +1 ⇒ 1_S(h) ≥ (1+ζ)1_S(ĥ);
    −1 ⇒ 1_S(h) ≤ (1−ζ/2)1_S(ĥ); always 1_S(ĥ) ≥ 1_Y(ĥ)/3 (when certified).

    Privacy bookkeeping (docs/prem.md §3.2, the monitor mechanism M_mon): a call starts the monitor
    (``noise.start_call``) with S_active = Y, and f^{-1}(1) leaves S_active right after a non-Inside
    answer, inside this function — so a record is charged at most once per call whatever the caller
    does; :class:`PREM` caps the calls at K.
    """
    cols = queries.tocsc() if columns is None else columns
    noise.start_call()
    active = active.copy()
    h = histogram.astype(np.float64)
    est = np.asarray(estimate, dtype=np.float64)
    true_sums = queries @ (h * active)
    est_sums = queries @ (est * active)
    f_active = np.ones(queries.shape[0], dtype=bool)
    plus = np.zeros_like(active)
    minus = np.zeros_like(active)
    passes = asked = 0
    certified = False
    indptr, indices = queries.indptr, queries.indices
    while True:
        passes += 1
        order = np.flatnonzero(f_active)
        draws = noise.draw(order.size)
        asked += order.size
        pos, accurate = 0, True
        while pos < order.size:
            rest = order[pos:]
            hi = (est_sums[rest] + alpha0 / 2.0) / (1.0 - zeta)
            lo = (est_sums[rest] - alpha0 / 2.0) / (1.0 + zeta)
            ans = noise.answers(true_sums[rest], draws[..., pos:], lo, hi)
            outside = np.flatnonzero(ans)
            if outside.size == 0:
                break
            k = int(outside[0])
            j = int(rest[k])
            elems = indices[indptr[j] : indptr[j + 1]]
            elems = elems[active[elems]]
            (plus if ans[k] == PLUS else minus)[elems] = True
            if elems.size:
                active[elems] = False
                sub = cols[:, elems]
                true_sums -= sub @ h[elems]
                est_sums -= sub @ est[elems]
            f_active[j] = False
            noise.after_outside()
            accurate = False
            pos += k + 1
        if accurate:
            certified = True
            break
        if max_passes is not None and passes >= max_passes:
            break
    noise.queries += asked
    m_plus, m_minus, m_act = est[plus].sum(), est[minus].sum(), est[active].sum()
    if not certified:
        m_act = -math.inf
    if m_plus >= max(m_minus, m_act):
        theta, support = PLUS, plus
    elif m_minus >= max(m_plus, m_act):
        theta, support = MINUS, minus
    else:
        theta, support = APPROX, active
    return MarginExample(theta, support, plus, minus, active, certified, asked, passes)


class PREM:
    """Algorithm 3 of Ghazi et al.: a non-negative synthetic histogram ĥ with, w.p. ≥ 1 − β,
    (1 − ζ)·f(h) − α ≤ f(ĥ) ≤ (1 + ζ)·f(h) + α for every f ∈ F (replace-one neighbours).

    ``accounting="charged"`` (the default; docs/prem.md §3): target charging over the calls actually made (≤
    ``max_calls``), a noisy starting histogram, ≤ ``max_rounds`` certified rounds, and a MWU step on
    both S^{+1} and S^{-1}. An uncertified remainder is kept, scaled to its noisy mass; after ``fit``,
    ``alpha`` is the bound of the run (certified rounds·α₀ + ñ_remainder + B). If the call or round
    cap was hit with a remainder so large that this exceeds the a-priori α, ``exhausted`` is set
    and a RuntimeWarning is issued.
    ``accounting="paper"``: the printed constants (I, T, η = ζ/4, uniform start, worst-case I·T calls);
    α exceeds n unless n is astronomically large, so the output is then the zero histogram — kept
    selectable for comparison, never the default.

    ``alpha``/``zeta`` give the guarantee; ``plan`` all noise parameters; ``privacy()`` the (ε, δ).
    ``plan=`` takes a plan made earlier (``charged_plan``/``paper_plan``) for the same arguments, checked
    field by field, so that repeated releases with one budget calibrate once.
    """

    def __init__(
        self,
        domain_size: int,
        queries: Any,
        zeta: float,
        epsilon: float,
        delta: float,
        beta: float = 0.05,
        seed: Any = None,
        accounting: str = "charged",
        monitor: str = "approx",
        n: int | None = None,
        plan: PremPlan | None = None,
        **charged_options: Any,
    ):
        self.domain_size = check_int(domain_size, "domain_size", low=2)
        self.queries = as_query_matrix(queries, self.domain_size)
        if accounting not in ACCOUNTINGS:
            raise ValueError(f"accounting must be one of {ACCOUNTINGS}, got {accounting!r}")
        if monitor not in MONITORS:
            raise ValueError(f"monitor must be one of {MONITORS}, got {monitor!r}")
        if accounting == "paper" and charged_options:
            raise TypeError(f"options {sorted(charged_options)} apply to accounting='charged' only")
        self.accounting, self.monitor = accounting, monitor
        self._args = (zeta, epsilon, delta, beta)
        self._source = as_random_source(seed)
        # F plus the all-ones query (paper footnote 2), in both layouts.
        ones = sparse.csr_matrix(np.ones((1, self.domain_size)))
        self._family = sparse.vstack([self.queries, ones]).tocsr()
        self._columns = self._family.tocsc()
        self.plan: PremPlan | None = None
        if plan is not None:  # a plan made earlier for the same arguments: skips the calibration
            if charged_options:
                raise TypeError(
                    "pass either plan or the charged options it was made with, not both"
                )
            self.plan = self._check_plan(plan, n)
        elif accounting == "charged":
            self.plan = charged_plan(
                self.domain_size,
                self.queries.shape[0],
                zeta,
                epsilon,
                delta,
                beta,
                monitor=monitor,
                **charged_options,
            )
        elif n is not None:
            self.plan = self._paper(n)
        self._n = n
        self.exhausted = False
        self.fitted = False
        self._alpha: float | None = None
        self.calls = self.rounds_used = 0
        self.masses: list[int] = []
        self.monitor_noise: IntervalNoise | None = None  # the calls' noise, kept for diagnostics

    def _check_plan(self, plan: PremPlan, n: int | None) -> PremPlan:
        """``plan`` if it was made for these arguments (the calibration takes seconds; a stream with one
        PREM per step makes it once): a mismatch would run with noise calibrated for another budget."""
        if not isinstance(plan, PremPlan):
            raise TypeError(f"plan must be a PremPlan, got {type(plan).__name__}")
        zeta, epsilon, delta, beta = self._args
        made_for = {
            "accounting": plan.accounting,
            "monitor": plan.monitor,
            "zeta": plan.zeta,
            "epsilon": plan.epsilon,
            "delta": plan.delta,
            "beta": plan.beta,
            "n_queries": plan.n_queries,
        }
        asked = {
            "accounting": self.accounting,
            "monitor": self.monitor,
            "zeta": zeta,
            "epsilon": epsilon,
            "delta": delta,
            "beta": beta,
            "n_queries": self.queries.shape[0] + 1,
        }
        wrong = sorted(k for k in asked if made_for[k] != asked[k])
        if wrong:
            raise ValueError(
                f"plan was made for other arguments: {', '.join(f'{k}={made_for[k]!r} (here {asked[k]!r})' for k in wrong)}"
            )
        if plan.accounting == "paper" and n is None:
            raise ValueError("a paper plan depends on n: pass the n it was made for")
        return plan

    def _paper(self, n: int) -> PremPlan:
        zeta, epsilon, delta, beta = self._args
        return paper_plan(
            n, self.domain_size, self.queries.shape[0], zeta, epsilon, delta, beta, self.monitor
        )

    @property
    def zeta(self) -> float:
        return self._args[0]

    @property
    def alpha(self) -> float:
        if self.plan is None:
            raise AttributeError(
                "alpha of accounting='paper' depends on n: pass n= or call fit first"
            )
        return self.plan.alpha if self._alpha is None else self._alpha

    @property
    def _fitted_plan(self) -> PremPlan:
        """The plan of a fit under way (set before the fit draws any noise)."""
        if self.plan is None:
            raise RuntimeError("PREM: no plan during a fit")
        return self.plan

    def privacy(self) -> ApproxDP:
        """(ε, δ) recomputed from the noise parameters in use (:func:`plan_privacy`)."""
        if self.plan is None:
            raise AttributeError("the paper plan depends on n: pass n= or call fit first")
        return plan_privacy(self.plan)

    # --------------------------------------------------------------------------------------------

    def _check_histogram(self, histogram: Any) -> np.ndarray:
        h = np.asarray(histogram)
        if h.ndim != 1 or h.shape[0] != self.domain_size:
            raise ValueError(
                f"histogram must be a 1-d array of length {self.domain_size}, got shape {h.shape}"
            )
        if h.dtype.kind not in "iu":
            raise TypeError(f"histogram must hold integers, got dtype {h.dtype}")
        if h.size and h.min() < 0:
            raise ValueError("histogram must be non-negative")
        return h.astype(np.int64)

    def _noisy_mass(self, count: int) -> int:
        p = self._fitted_plan
        if p.mass_noise == "laplace":
            noise = discrete_laplace(used_scale(1.0 / p.mass_param), 1, self._source)[0]
        else:
            noise = discrete_gaussian(p.mass_param, 1, self._source)[0]
        value = int(count + noise)
        self.masses.append(value)
        return value

    def _start(self, h: np.ndarray) -> np.ndarray:
        """Shape of ĥ^i before scaling. Paper: uniform. Charged: the noisy histogram h + DG(σ²),
        entries below 3σ set to 0 (clipping alone would add ≈ 0.4σ of mass to every empty element
        and distort all shares), plus the missing mass n − kept spread uniformly (at least 1% of n)
        so that every element keeps weight the MWU can grow. Post-processing of one DG release and
        the public n."""
        if self._fitted_plan.init_sigma2 <= 0:
            return np.ones(self.domain_size)
        sigma = math.sqrt(self._fitted_plan.init_sigma2)
        noisy = h + discrete_gaussian(self._fitted_plan.init_sigma2, self.domain_size, self._source)
        kept = np.where(noisy >= 3.0 * sigma, noisy, 0).astype(np.float64)
        n = float(h.sum())
        return kept + max(n - kept.sum(), 0.01 * n, 1.0) / self.domain_size

    def fit(self, histogram: Any) -> np.ndarray:
        """One release: ĥ for ``histogram``. A second call would spend the budget again: refused."""
        if self.fitted:
            raise RuntimeError(
                "PREM.fit was already called: a second release would spend the privacy budget "
                "again; build a new PREM (with its own budget) instead"
            )
        h = self._check_histogram(histogram)
        self.fitted = True
        n = int(h.sum())
        if self.plan is None:
            self.plan = self._paper(max(n, 2))
        elif self.plan.accounting == "paper" and n != self._n:
            raise ValueError(f"histogram sums to {n}, but the plan was made for n={self._n}")
        p = self.plan
        zeta = p.zeta
        noise = self.monitor_noise = IntervalNoise(p.monitor, p.a, self._source)
        start = self._start(h)
        out = np.zeros(self.domain_size)
        remaining = np.ones(self.domain_size, dtype=bool)
        rounds_certified = 0
        fresh_mass = False  # is masses[-1] the noisy mass of the current remaining set?
        shape = start  # the remainder's shape if it is kept (charged)
        budget_calls = p.max_calls
        for _ in range(p.rounds):
            n_tilde = self._noisy_mass(int(h[remaining].sum()))
            fresh_mass = True
            if n_tilde <= p.stop or budget_calls == 0:
                break
            est = self._scaled(start, remaining, n_tilde)
            certified = False
            for _t in range(p.steps if p.steps else budget_calls):
                ex = find_margin_example(
                    self._family,
                    h,
                    est,
                    remaining,
                    zeta,
                    p.alpha0,
                    noise,
                    max_passes=p.max_passes,
                    columns=self._columns,
                )
                budget_calls -= 1
                self.calls += 1
                if self._certifies(ex, est, remaining):
                    out[ex.active] += est[ex.active]
                    remaining &= ~ex.active
                    rounds_certified += 1
                    certified, fresh_mass = True, False
                    break
                est = self._mwu(est, ex, n_tilde)
            if not certified:
                if p.accounting == "paper":
                    raise RuntimeError(
                        "PREM failed: T multiplicative-weights steps without a certified "
                        "round (Claim 3.3 bounds this by beta)"
                    )
                shape = est  # charged: call budget spent inside this round
                break
        self.rounds_used = rounds_certified
        if p.accounting == "charged":
            self._finish_charged(h, out, remaining, shape, fresh_mass, rounds_certified)
        return out

    def _certifies(self, ex: MarginExample, est: np.ndarray, remaining: np.ndarray) -> bool:
        """Paper: θ = Approx (S_active certified and of largest ĥ-mass). Charged: S_active certified and
        holding ≥ ``certify_share`` of ĥ's mass on X^i — otherwise take another MWU step first, since
        every certified round adds α₀ to α while another call only adds a hit per record."""
        if self._fitted_plan.accounting == "paper":
            return ex.theta == APPROX
        share = self._fitted_plan.extra["certify_share"]
        return ex.certified and est[ex.active].sum() >= share * est[remaining].sum()

    def _finish_charged(self, h, out, remaining, shape, fresh_mass, rounds_certified) -> None:
        """Keep the uncertified remainder scaled to its noisy mass: on the good event its error on any
        query is ≤ max(ñ, n_rem) ≤ ñ + B, the same as dropping it, and usually far smaller."""
        p = self._fitted_plan
        if not remaining.any():
            self._alpha = rounds_certified * p.alpha0
            return
        if fresh_mass:
            n_rem = self.masses[-1]
        else:
            n_rem = self._noisy_mass(int(h[remaining].sum()))
        out += self._scaled(shape, remaining, max(n_rem, 0))
        self._alpha = rounds_certified * p.alpha0 + max(n_rem, 0) + p.mass_margin
        if self._alpha > p.alpha:
            self.exhausted = True
            warnings.warn(
                f"PREM: call/round cap reached with noisy remainder {n_rem}; the guarantee holds "
                f"with alpha = {self._alpha:.0f} instead of {p.alpha:.0f}",
                RuntimeWarning,
                stacklevel=3,
            )

    @staticmethod
    def _scaled(shape: np.ndarray, mask: np.ndarray, mass: float) -> np.ndarray:
        est = np.where(mask, shape, 0.0)
        total = est.sum()
        return est * (mass / total) if total > 0 else est

    def _mwu(self, est: np.ndarray, ex: MarginExample, n_tilde: int) -> np.ndarray:
        """ĥ ← ñ·(ĥ ⊙ e^{θη1_S})/||·||₁. Paper: on S only, η = ζ/4. Charged: S^{+1} up and S^{-1} down
        in the same step (η = 2ζ by default; larger steps oscillate). Post-processing of the call's
        output: privacy is unchanged, only the number of calls needed changes."""
        factor = np.ones(self.domain_size)
        if self._fitted_plan.accounting == "paper":
            factor[ex.support] = math.exp(ex.theta * self._fitted_plan.eta)
        else:
            factor[ex.plus] = math.exp(self._fitted_plan.eta)
            factor[ex.minus] = math.exp(-self._fitted_plan.eta)
        new = est * factor
        total = new.sum()
        return new * (n_tilde / total) if total > 0 else new
