"""Release kind ``relative_error``: at every step, a synthetic histogram with relative error (PREM).

Ghazi, Guzmán, Kamath, Knop, Kumar, Manurangsi, Sachdeva, "PREM: Privately Answering Statistical
Queries with Relative Error" (arXiv 2502.14809). The mechanism is :class:`pipeline.synth.prem.PREM`;
this module makes it a stream release kind (:class:`RelativeErrorKind`, registered with the other
kinds). Everything specific to the kind is here:

* configuration — :class:`RelativeErrorRelease` (the YAML model), the kind's ``check``/``check_budget``;
* query family — :func:`resolve_groups`, :func:`query_family`, :func:`family_size`;
* aggregator — the kind's ``aggregator`` (the step's histogram of current values);
* mechanism — :func:`step_plan` (calibrated once), :class:`RelativeErrorMechanism` (one PREM per step);
* privacy event per step — the kind's ``events``, derived from the mechanism's noise parameters;
* per-step release and manifest — the kind's ``release_step``;
* reading side — ``output = "histogram"`` (the consumer assembles and checks it), :func:`group_interval`,
  :func:`answer_query`, the kind's ``answer``/``questions``/``explain``.

**Input.** At step t the release sees h_t, the histogram over the attribute's codes of every roster
member's step-t value, reported or imputed (carry-forward or the default). The roster is fixed and
public, so ||h_t||₁ = n, public.

**Privacy** (docs/prem.md §6). Under the deployment's relation (``replace``: one user's whole
sequence replaced by any other, including the all-missing one), h_t and h'_t differ by moving at
most one unit between two bins, h' = h − e_x + e_y: the other users' values, imputation included,
are functions of their own reports only, and an absent user is imputed into some bin, so n never
changes. That is exactly PREM's replace-one relation with public n, under which PREM with target
(ε_s, δ_s) is (ε_s, δ_s)-DP (docs/prem.md §3.2 for the charged accounting, Theorem 3.1 of Ghazi et
al. for the paper's). The T per-step runs use independent randomness; basic composition of
(ε, δ)-DP mechanisms (Dwork & Roth 2014, Theorem 3.16 — the project's accounting of (ε, δ) costs,
:mod:`pipeline.privacy.accountant`) gives (Σ ε_s, Σ δ_s) for the release. Calibration: the release's
allotment (ε_r, δ_r) is split evenly, target (ε_r/T, δ_r/T) per step; the ledger charges at each
step t the event ``RelativeErrorMechanism.step_cost()`` = ``plan_privacy(plan)``, recomputed from the plan's noise
parameters (a, σ², σ_n², K) alone, which is at most the target (up to float rounding, within the
ledger's tolerance), so T charges fit the allotment.

**Utility.** For each step, with probability ≥ 1 − β, for every f ∈ F:
(1 − ζ)·f(h_t) − α_t ≤ f(ĥ_t) ≤ (1 + ζ)·f(h_t) + α_t, α_t the run's α (public, in the manifest); for
all T steps at once with probability ≥ 1 − Tβ (union bound). Solving for f(h_t) gives the interval
:func:`group_interval` answers with.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import numpy as np
from pydantic import Field

from pipeline.attributes import Attribute, public_hash
from pipeline.privacy.events import ApproxDP
from pipeline.privacy.rng import derive_seed

from .aggregators import Aggregator, FixedWindowAggregator
from .base import (
    BudgetKeys,
    CountsKind,
    PrivacyEvent,
    ReleaseConfig,
    Setting,
    StepInput,
    StepOutput,
    register,
)
from .bounds import ReleaseBounds
from .reading import Answer, Context, Panel

__all__ = [
    "RelativeErrorRelease",
    "RelativeErrorKind",
    "resolve_groups",
    "query_family",
    "family_size",
    "dyadic_blocks",
    "dyadic_pieces",
    "step_plan",
    "plan_of",
    "step_seed",
    "RelativeErrorMechanism",
    "mechanism_params",
    "group_interval",
    "answer_query",
    "MAX_DOMAIN",
    "MAX_NNZ",
]

KIND = "relative_error"
QUERY_FAMILIES = ("groups", "dyadic", "singletons")
MAX_DOMAIN = (
    1 << 20
)  # PREM keeps dense float vectors over the domain, and partials are dense counts
MAX_NNZ = 1 << 22  # F is held as a sparse 0/1 matrix in two layouts; a call costs O(nnz(F))
_STATE_VERSION = 1


# --- configuration ---------------------------------------------------------------------------


class RelativeErrorRelease(ReleaseConfig):
    """``type: relative_error``: a relative-error synthetic histogram of the attribute's current values
    at every step, over the query family ``queries`` (docs/prem.md §6)."""

    type: Literal["relative_error"]
    queries: Literal["groups", "dyadic", "singletons"] = Field(
        description="groups: the declared groups of codes; dyadic: every dyadic range of the codes; "
        "singletons: every single code"
    )
    groups: dict[str, list[str | int]] = Field(
        default_factory=dict,
        description="queries: groups — name -> the attribute values (labels or codes) it counts",
    )
    zeta: float = Field(default=0.1, gt=0, lt=0.5, description="multiplicative error ζ")
    beta: float = Field(default=0.05, gt=0, lt=1, description="failure probability per step")
    accounting: Literal["charged", "paper"] = Field(
        default="charged",
        description="PREM's accounting (docs/prem.md): charged, or the paper's constants",
    )
    max_calls: int = Field(
        default=20, ge=1, description="charged: FindMarginExample calls per step"
    )
    max_rounds: int = Field(default=3, ge=1, description="charged: certified rounds per step")


def _resolve_code(value: str | int, attribute: Attribute) -> int:
    """A declared value's code: a label of a categorical attribute (or its code), a code of a hashed
    attribute, or any string through the public hash. ValueError when outside the domain."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a value of the attribute")
    if isinstance(value, int):
        if not 0 <= value < attribute.size:
            raise ValueError(f"code {value} is outside [0, {attribute.size})")
        return value
    if attribute.type == "hashed":
        return public_hash(value, attribute.size)
    labels = attribute.labels()
    if value not in labels:
        raise ValueError(
            f"{value!r} is not a value of the attribute (values: {labels[:8]}"
            f"{' ...' if len(labels) > 8 else ''})"
        )
    return labels.index(value)


def resolve_groups(
    release: RelativeErrorRelease, attribute: Attribute, where: str = ""
) -> dict[str, list[int]]:
    """The declared groups as sorted code lists; a bad member names ``<where>.groups.<name>``."""
    out = {}
    for name, members in release.groups.items():
        key = f"{where}.groups.{name}" if where else f"groups.{name}"
        if not members:
            raise ValueError(f"{key}: a group needs at least one value")
        codes = []
        for value in members:
            try:
                codes.append(_resolve_code(value, attribute))
            except ValueError as err:
                raise ValueError(f"{key}: {err}") from None
        if len(set(codes)) != len(codes):
            raise ValueError(f"{key}: a value appears twice (a group counts each code once)")
        out[name] = sorted(codes)
    return out


# --- query family ----------------------------------------------------------------------------


def dyadic_blocks(domain_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) of every distinct range [k·2^j, min((k+1)·2^j, |X|)), j = 0..⌈log₂|X|⌉, level by level.
    A level's last block is dropped when it equals the previous level's last one (lo + 2^(j−1) ≥ |X|:
    both are [lo, |X|)); every other block is longer than any block of the levels below."""
    los, his, width = [], [], 1
    while True:
        lo = np.arange(0, domain_size, width, dtype=np.int64)
        hi = np.minimum(lo + width, domain_size)
        if width > 1 and lo[-1] + width // 2 >= domain_size:
            lo, hi = lo[:-1], hi[:-1]
        los.append(lo)
        his.append(hi)
        if width >= domain_size:
            return np.concatenate(los), np.concatenate(his)
        width *= 2


def query_family(queries: str, domain_size: int, groups: list | None = None):
    """The family F as a 0/1 CSR matrix (|F| × |X|), in PREM's query order: the declared groups in
    order (``groups``: (name, codes) pairs); the dyadic ranges level by level (:func:`dyadic_blocks`);
    the singletons by code."""
    from scipy import sparse

    if queries == "groups":
        from pipeline.synth.prem import as_query_matrix

        if not groups:
            raise ValueError("groups: queries: groups needs at least one declared group")
        return as_query_matrix([np.asarray(c, dtype=np.int64) for _, c in groups], domain_size)
    if queries == "singletons":
        return sparse.identity(domain_size, dtype=np.float64, format="csr")
    if queries == "dyadic":
        lo, hi = dyadic_blocks(domain_size)
        lengths = hi - lo
        indptr = np.concatenate([[0], np.cumsum(lengths)])
        indices = np.arange(indptr[-1], dtype=np.int64) - np.repeat(indptr[:-1] - lo, lengths)
        return sparse.csr_matrix(
            (np.ones(indices.size), indices, indptr), shape=(lo.size, domain_size)
        )
    raise ValueError(f"queries must be one of {QUERY_FAMILIES}, got {queries!r}")


def family_size(release: RelativeErrorRelease, attribute: Attribute) -> tuple[int, int]:
    """(|F|, nnz(F)) without building F."""
    if release.queries == "groups":
        return len(release.groups), sum(len(g) for g in release.groups.values())
    if release.queries == "singletons":
        return attribute.size, attribute.size
    lo, hi = dyadic_blocks(attribute.size)
    return int(lo.size), int((hi - lo).sum())


def dyadic_pieces(lo: int, hi: int, domain_size: int) -> list[tuple[int, int]]:
    """[lo, hi) as consecutive dyadic blocks of the family (greedy: at each lo the largest aligned block
    that fits; ≤ 2⌈log₂|X|⌉ pieces)."""
    if not 0 <= lo < hi <= domain_size:
        raise ValueError(f"range {lo}:{hi} must satisfy 0 <= lo < hi <= {domain_size}")
    pieces = []
    while lo < hi:
        width = 1
        while (
            lo % (2 * width) == 0 and min(lo + 2 * width, domain_size) <= hi and width < domain_size
        ):
            width *= 2
        stop = min(lo + width, domain_size)
        pieces.append((lo, stop))
        lo = stop
    return pieces


# --- the kind ------------------------------------------------------------------------------------


@register
class RelativeErrorKind(CountsKind[RelativeErrorRelease]):
    name = KIND
    config = RelativeErrorRelease
    budget = "approx_dp"

    def check(self, release: RelativeErrorRelease, attribute: Attribute, horizon: int) -> None:
        if attribute.type not in ("categorical", "hashed"):
            raise ValueError(
                "attribute: relative_error releases need a categorical or hashed attribute"
            )
        if attribute.size > MAX_DOMAIN:
            raise ValueError(
                f"attribute: {attribute.size} codes is more than the {MAX_DOMAIN} a "
                "relative_error release supports (dense histograms)"
            )
        if release.queries == "groups":
            if not release.groups:
                raise ValueError("groups: queries: groups needs at least one declared group")
            resolve_groups(release, attribute)
        elif release.groups:
            raise ValueError(
                f"groups: only for queries: groups (this release asks for {release.queries})"
            )
        _, nnz = family_size(release, attribute)
        if nnz > MAX_NNZ:
            raise ValueError(
                f"queries: {release.queries} over {attribute.size} codes has {nnz} (query, code) "
                f"pairs, more than the {MAX_NNZ} supported"
            )

    def check_budget(self, release: RelativeErrorRelease, budget: BudgetKeys, horizon: int) -> None:
        if budget.epsilon is None:  # the configuration refuses an approx_dp kind without it first
            raise ValueError("share: a relative_error release needs budget.epsilon")
        eps_step = release.share * budget.epsilon / horizon
        if eps_step > 1.0:
            raise ValueError(
                f"share: the per-step epsilon share·epsilon/horizon = {eps_step:.4g} exceeds 1, "
                "the range PREM's calibration covers"
            )

    def aggregator(
        self, release: RelativeErrorRelease, attribute: Attribute, rows: int, horizon: int
    ) -> Aggregator:
        """The step's histogram of current values: the fixed-window aggregator with a one-step window
        (pattern = the current code; counts from step 1 on, dense over the domain, additive across
        partitions). No per-user state is carried between steps."""
        return FixedWindowAggregator(rows, 1, attribute.size)

    def build(self, release: RelativeErrorRelease, setting: Setting) -> RelativeErrorMechanism:
        return RelativeErrorMechanism(mechanism_params(release, setting))

    def events(
        self, release: RelativeErrorRelease, mechanism: Any, setting: Setting
    ) -> tuple[PrivacyEvent | None, ...]:
        """The same ``ApproxDP`` at every step 1..T: the cost the plan's noise parameters imply
        (:func:`pipeline.synth.prem_privacy.plan_privacy`), at most the per-step target (ε_r/T, δ_r/T)."""
        cost = mechanism.step_cost()
        if not isinstance(cost, ApproxDP):
            raise TypeError(
                f"release {release.name!r}: a PREM step costs an ApproxDP, got {cost!r}"
            )
        return (cost,) * setting.horizon

    def bounds(self, release: RelativeErrorRelease, mechanism: Any, horizon: int) -> ReleaseBounds:
        plan = mechanism.plan
        return ReleaseBounds(
            release.name,
            release.type,
            plan.beta,
            {"alpha": plan.alpha, "zeta": plan.zeta},
            "alpha",
            meaning="relative-error intervals",
            notes=[
                f"per step: (1 − ζ)f(h) − α ≤ f(ĥ) ≤ (1 + ζ)f(h) + α for each of its "
                f"{mechanism.queries.shape[0]} queries, ζ = {plan.zeta:g}, α = {plan.alpha:,.0f} "
                "(a priori; manifests carry each run's)"
            ],
        )

    # -- reading side ---------------------------------------------------------------------------
    bound_source = (
        "per step, (1 − ζ)f(h) − α ≤ f(ĥ) ≤ (1 + ζ)f(h) + α for every query of the family "
        "(Ghazi et al., PREM, arXiv 2502.14809, Thm 3.1; docs/prem.md)"
    )

    output = "histogram"

    def questions(
        self, release: RelativeErrorRelease, unit: str = "step"
    ) -> tuple[list[str], list[str]]:
        what = {
            "groups": f"each declared group ({', '.join(release.groups)})",
            "dyadic": "any range of codes lo:hi",
            "singletons": "each single value",
        }[release.queries]
        return (
            [
                f"how many users hold {what} at step t, within (1 ± ζ) of the truth plus α, at each step"
            ],
            [
                "questions across steps (each step's histogram is released on its own)",
                "other sets of values than the query family the release was calibrated for",
            ],
        )

    def answer(
        self,
        release: RelativeErrorRelease,
        panel: Panel,
        step: int,
        ctx: Context,
        raw: bool = False,
        group: str | None = None,
    ) -> Answer:
        """Each declared group's count (or ``group``'s) with its (ζ, α) interval (:func:`answer_query`)."""
        from .reading import Answer, Row

        params = panel.manifests[step]["parameters"]
        if group is None and params["queries"] != "groups":
            raise ValueError(
                f"name a code, value or range (lo:hi) of a release with queries: {params['queries']}"
            )
        groups = list(params["groups"]) if group is None else [group]
        answers = [
            answer_query(panel.manifests[step], panel.histograms[step], g, ctx.attribute)
            for g in groups
        ]
        rows = [
            Row(
                a["group"], a["estimate"], a["interval"][0], a["interval"][1], ctx.n, key=a["group"]
            )
            for a in answers
        ]
        return Answer(
            release.name,
            release.type,
            step,
            f"users by {release.attribute} at {ctx.unit} {step}",
            rows,
            bound=f"(1 − ζ)·truth − α ≤ estimate ≤ (1 + ζ)·truth + α with ζ = {params['zeta']:g}, α = "
            f"{params['alpha']:,.1f} (this step's run), probability ≥ {1 - params['beta']:g} per step "
            "(Ghazi et al., PREM, arXiv 2502.14809, Thm 3.1), solved for the truth",
            notes=["a synthetic histogram, not records: no padding"],
            legacy={"answers": answers},
        )

    def dictionary(
        self, release: RelativeErrorRelease, panel: Panel, ctx: Context
    ) -> dict[str, Any]:
        return {
            "columns": {
                "record": f"the {release.attribute} code (a histogram, not records of users)",
                **{
                    f"step_{t}": f"the released (synthetic) count of users holding the code at {ctx.unit} {t}"
                    for t in range(1, panel.released_through + 1)
                },
            }
        }

    def explain(self, bounds: ReleaseBounds, n: int) -> str:
        from .reading import confidence, points

        alpha, zeta = bounds.bounds["alpha"], bounds.bounds["zeta"]
        return (
            f"with probability {confidence(bounds.beta)} at each step, every query's published count is within "
            f"{zeta:.0%} of the truth plus α = {alpha:,.0f} users ({points(alpha, n)} of n = {n:,})"
        )

    def release_step(self, s: StepInput) -> StepOutput:
        """Sum the partitions' histograms, run PREM, and describe ĥ_t in the manifest (ζ, α, β, |F|,
        noise); ĥ_t goes out as one float64 column on ``synthetic`` in the other kinds' chunk format
        (records = codes 0..|X|−1, column = the step; :func:`pipeline.releases.codecs.synthetic_entry`)."""
        counts = np.sum([p["counts"] for p in s.parts], axis=0)
        hist, prem = s.mechanism.fit(s.step, counts)
        s.manifest["parameters"] = s.mechanism.parameters(prem)
        return StepOutput(histogram=hist)


# --- mechanism ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=32)
def step_plan(
    accounting: str,
    domain_size: int,
    n_queries: int,
    zeta: float,
    epsilon: float,
    delta: float,
    beta: float,
    n: int,
    max_calls: int,
    max_rounds: int,
):
    """The per-step PREM plan (noise parameters, margins, α) — the calibration takes seconds, and every
    step of a release has the same arguments, so it is made once per process."""
    from pipeline.synth.prem_privacy import charged_plan, paper_plan

    if accounting == "charged":
        return charged_plan(
            domain_size,
            n_queries,
            zeta,
            epsilon,
            delta,
            beta,
            max_calls=max_calls,
            max_rounds=max_rounds,
        )
    return paper_plan(max(n, 2), domain_size, n_queries, zeta, epsilon, delta, beta)


def step_seed(seed: int | None, step: int) -> int | None:
    """Seed of step ``step``'s PREM from the release's seed (None = secure randomness): each step's
    draws are independent of how many draws earlier steps made, so a step can be recomputed alone."""
    return None if seed is None else derive_seed(seed, KIND, step)


class RelativeErrorMechanism:
    """One PREM per step on the step's histogram, each with the per-step target (ε_s, δ_s).

    ``params`` (all public): domain_size, queries, groups ((name, codes) pairs in declared order — a list,
    since the state format does not keep a mapping's order, and F's order is the monitor's), zeta,
    epsilon, delta (per step), beta, accounting, n, max_calls, max_rounds, seed (None = secure).
    """

    def __init__(self, params: dict[str, Any]):
        self.params = dict(params)
        self.queries = query_family(
            self.params["queries"], int(self.params["domain_size"]), self.params.get("groups")
        )
        self.step = 0

    @property
    def plan(self):
        return plan_of(self.params, self.queries.shape[0])

    def step_cost(self):
        """The privacy event of one step, an immutable ``ApproxDP`` recomputed from the plan's noise
        parameters alone (:func:`pipeline.synth.prem_privacy.plan_privacy`)."""
        from pipeline.synth.prem_privacy import plan_privacy

        return plan_privacy(self.plan)

    def fit(self, step: int, histogram: np.ndarray):
        """Release step ``step``: (ĥ_t as float64, the fitted PREM). Steps come in order, each once."""
        from pipeline.synth.prem import PREM

        if step != self.step + 1:
            raise ValueError(
                f"relative_error release of step {step}, but the next step is {self.step + 1}"
            )
        p = self.params
        prem = PREM(
            int(p["domain_size"]),
            self.queries,
            float(p["zeta"]),
            float(p["epsilon"]),
            float(p["delta"]),
            beta=float(p["beta"]),
            seed=step_seed(p["seed"], step),
            accounting=p["accounting"],
            n=int(p["n"]),
            plan=self.plan,
        )
        out = prem.fit(np.asarray(histogram, dtype=np.int64))
        self.step = step
        return np.asarray(out, dtype=np.float64), prem

    def parameters(self, prem=None) -> dict[str, Any]:
        """The manifest's public parameters: ζ, α (the run's, and the a-priori one), β, |F|, the noise."""
        p, plan = self.params, self.plan
        out = {
            "mechanism": "prem",
            "accounting": p["accounting"],
            "monitor": plan.monitor,
            "queries": p["queries"],
            "n_queries": self.queries.shape[0],
            "domain_size": int(p["domain_size"]),
            "n": int(p["n"]),
            "zeta": plan.zeta,
            "alpha_planned": plan.alpha,
            "beta": plan.beta,
            "epsilon_target": plan.epsilon,
            "delta_target": plan.delta,
            "noise": {
                "monitor_a": plan.a,
                "mass_noise": plan.mass_noise,
                "mass_param": plan.mass_param,
                "init_sigma2": plan.init_sigma2,
                "max_calls": plan.max_calls,
                "rounds": plan.rounds,
                "max_passes": plan.max_passes,
            },
        }
        if p["queries"] == "groups":
            out["groups"] = {name: [int(c) for c in codes] for name, codes in p["groups"]}
        if prem is not None:
            out.update(
                alpha=prem.alpha,
                calls=prem.calls,
                rounds_certified=prem.rounds_used,
                exhausted=prem.exhausted,
            )
        return out

    def get_state(self) -> dict[str, Any]:
        return {
            "kind": KIND,
            "version": _STATE_VERSION,
            "params": dict(self.params),
            "step": self.step,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> RelativeErrorMechanism:
        if state.get("kind") != KIND:
            raise ValueError(f"not a {KIND} state (kind={state.get('kind')!r})")
        obj = cls(state["params"])
        obj.step = int(state["step"])
        return obj


def mechanism_params(release: RelativeErrorRelease, setting: Setting) -> dict[str, Any]:
    """The mechanism's parameters: the allotment (ε_r, δ_r) split evenly over the horizon."""
    if setting.n is None or setting.attribute is None:
        raise ValueError(
            f"release {release.name!r}: a relative_error mechanism needs the roster size and the attribute"
        )
    T, allotment, attribute = setting.horizon, setting.approx_dp, setting.attribute
    return {
        "domain_size": setting.domain_size,
        "queries": release.queries,
        "groups": list(resolve_groups(release, attribute).items())
        if release.queries == "groups"
        else None,
        "zeta": release.zeta,
        "epsilon": allotment.epsilon / T,
        "delta": allotment.delta / T,
        "beta": release.beta,
        "accounting": release.accounting,
        "n": int(setting.n),
        "max_calls": release.max_calls,
        "max_rounds": release.max_rounds,
        "seed": setting.seed,
    }


def plan_of(params: dict[str, Any], n_queries: int):
    """The plan of a mechanism with ``params`` and |F| = ``n_queries`` (:func:`step_plan`)."""
    return step_plan(
        params["accounting"],
        int(params["domain_size"]),
        int(n_queries),
        float(params["zeta"]),
        float(params["epsilon"]),
        float(params["delta"]),
        float(params["beta"]),
        int(params["n"]),
        int(params["max_calls"]),
        int(params["max_rounds"]),
    )


# --- consumer ----------------------------------------------------------------------------------


def group_interval(
    estimate: float, zeta: float, alpha: float, n: int, pieces: int = 1
) -> tuple[float, float]:
    """The interval for f(h) given f(ĥ) = ``estimate``: the guarantee (1 − ζ)f(h) − kα ≤ f(ĥ) ≤
    (1 + ζ)f(h) + kα (k = ``pieces`` disjoint family queries summed, k = 1 for one query) solved for
    f(h): [(f(ĥ) − kα)/(1 + ζ), (f(ĥ) + kα)/(1 − ζ)], clipped to [0, n] (a count of users)."""
    slack = pieces * alpha
    return max(0.0, (estimate - slack) / (1.0 + zeta)), min(
        float(n), (estimate + slack) / (1.0 - zeta)
    )


def _query_codes(params: dict, group: str, attribute=None) -> tuple[np.ndarray, int]:
    """(codes, number of family queries summed) of ``group``: a declared group's name; a code or label
    (singletons, dyadic); ``lo:hi`` (dyadic: its dyadic pieces)."""
    queries, size = params["queries"], int(params["domain_size"])
    if queries == "groups":
        groups = params["groups"]
        if group not in groups:
            raise ValueError(f"no group {group!r}; the groups are {', '.join(groups)}")
        return np.asarray(groups[group], dtype=np.int64), 1
    if queries == "dyadic" and ":" in group:
        try:
            lo, hi = (int(v) for v in group.split(":"))
        except ValueError:
            raise ValueError(f"a range is lo:hi with integer codes, got {group!r}") from None
        pieces = dyadic_pieces(lo, hi, size)
        return np.arange(lo, hi, dtype=np.int64), len(pieces)
    if group.isdigit():  # a code (a hashed value that looks like a number is named by its code)
        code = int(group)
        if code >= size:
            raise ValueError(f"code {code} is outside [0, {size})")
    elif attribute is not None:
        code = _resolve_code(group, attribute)
    else:
        raise ValueError(f"{group!r} is not a code of [0, {size})")
    return np.array([code], dtype=np.int64), 1


def answer_query(
    manifest: dict, histogram: np.ndarray, group: str, attribute=None
) -> dict[str, Any]:
    """A group's count from a released histogram with its (ζ, α) interval (post-processing only)."""
    params = manifest["parameters"]
    codes, pieces = _query_codes(params, group, attribute)
    estimate = float(histogram[codes].sum())
    lo, hi = group_interval(estimate, params["zeta"], params["alpha"], params["n"], pieces)
    return {
        "group": group,
        "estimate": estimate,
        "interval": [lo, hi],
        "zeta": params["zeta"],
        "alpha": params["alpha"],
        "pieces": pieces,
        "beta": params["beta"],
    }
