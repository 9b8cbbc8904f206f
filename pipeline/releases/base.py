"""The release-kind interface and the registry keyed by the kind's name.

Each kind of release (fixed-window synthetic data, cumulative synthetic data, heavy hitters, band
monitor, ...) is one subclass of :class:`ReleaseKind`, registered with :func:`register`. Nothing else
in the system branches on a release's ``type``: the configuration, the budget plan, the ledger, the
workers and the releaser ask the kind (``kind_of(release)``).

A kind must provide exactly this:

``name``
    The configuration's ``type`` tag; the registry key.
``config``
    Its configuration model: a subclass of :class:`ReleaseConfig` (which brings ``name``,
    ``attribute``, ``share``) declaring ``type: Literal[<name>]`` and the kind's own keys.
``budget``
    ``"zcdp"`` or ``"approx_dp"``: which part of the deployment budget its ``share`` is a share of.
``check(release, attribute, horizon)``
    Checks of the release against its (public) attribute and the horizon. Raise ``ValueError``
    whose message starts with the offending key of the release (``"window: 9 exceeds horizon 6"``);
    the configuration prefixes the release's position.
``aggregator(release, attribute, rows, horizon)``
    The worker-side aggregator of one reports partition: ``partial(step, codes) -> dict`` (additive
    across partitions), ``apply_feedback(step, codes, feedback)``, ``get_state()``/``set_state()``
    (see :mod:`pipeline.releases.aggregators`).
``check_budget(release, budget, horizon)`` (optional)
    Checks against the deployment's budget (e.g. a per-step share a calibration does not cover), with
    messages starting with the offending key as for ``check``.
``needs_feedback(release)``
    Whether the releaser's output of step t charges users, so workers must apply it before they
    close step t + 1 (default False).
``build(release, setting)``
    The mechanism, from a :class:`Setting` (horizon, neighbouring relation, domain size, allotment,
    seed, n). It must offer ``get_state()`` and a class method ``from_state(state)``.
``events(release, mechanism, setting)``
    The privacy events of each step 1..horizon (a tuple of length horizon; None where nothing is
    spent): immutable :class:`~pipeline.privacy.events.ZCDP` or
    :class:`~pipeline.privacy.events.ApproxDP` values, in the spirit of the ``DpEvent`` of
    Google's dp_accounting library. They are derived from the built mechanism's noise parameters
    (e.g. ρ = Δ²/(2σ²) of the σ² it samples with), never computed beside it; a monitor whose
    (ε, δ) covers the whole horizon declares its calibrated (ε, δ) at step 1 after checking the
    guarantee of its noise against it (:func:`charged_at_step_one`). The budget plan
    (``pipeline.plan``) and the releaser's ledger charge exactly these, and they must add up to the
    release's allotment.
``bounds(release, mechanism, horizon)``
    The error bound the kind's theorem gives at its β, read off the built mechanism, for ``dpstream
    plan`` (a :class:`pipeline.releases.bounds.ReleaseBounds`).
``release_step(step)``
    One step's release from a :class:`StepInput`: run the mechanism on the summed partials, add the
    kind's entries to ``step.manifest`` (at least ``"parameters"``), return a :class:`StepOutput`.

The reading side (post-processing of the public records; :mod:`pipeline.releases.reading`):

``output``
    What its steps publish: ``"records"`` (synthetic records on ``synthetic``), ``"histogram"`` (one
    float64 column over the codes on ``synthetic``) or ``"alerts"`` (records on ``alerts`` only).
    The consumer assembles a step by this shape, never by the release type.
``questions(release, unit)``
    (what it answers, what it does not), in words, for the exports' dictionary and the page.
``answer(release, panel, step, ctx, raw, group)``
    One released step (``ctx``: a :class:`~pipeline.releases.reading.Context`) as a
    :class:`~pipeline.releases.reading.Answer` (labelled rows, intervals from
    the mechanism's bound at its β, shares of n); ValueError (one line) for a question it does not
    answer. Kinds with ``output = "alerts"`` answer through ``alert_text`` instead.
``bound_source``, ``explain(bounds, n)``
    What the compared bound guarantees, with its theorem; the bound of ``bounds`` (what
    ``bounds(...)`` returned) in one sentence, also as a share of n.
``alert_text(release, alert, ctx)``, ``flag_limit(release)``
    Alerts kinds: one alert record in words (labels, what a flag means); when and why a flagged
    value stops being reported (its users' flags run out).
``dictionary(release, panel, ctx)``, ``padding_flags(release, panel, step)`` (optional)
    The kind's entries of an export's data dictionary; which exported records are padding at a step.
``observe(manifest, alerts)``
    The step's public numbers worth a metric: the name of a metric of
    :data:`pipeline.stream.kafka.metrics.METRICS` (labelled by release) -> value; the releaser's
    coordinator increases a counter by it and sets a gauge to it.

Optional: ``synthetic`` (True when ``mechanism.update(codes)`` and ``mechanism.synthetic`` run the
kind in batch, for ``pipeline.stream.release.engine.batch_reference``); ``check`` and ``needs_feedback`` have
defaults.

To add a kind: a module in this package with the config model and the registered class, imported
in ``pipeline/releases/__init__.py``; and a case with an independent recomputation of its cost from
the built mechanism's noise in ``tests/test_release_kinds.py`` (that test fails for a registered
kind without one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from pipeline.privacy.budget import BUDGET_RTOL
from pipeline.privacy.events import ApproxDP, ZCDP
from pipeline.privacy.neighbours import Neighbours
from pipeline.validation import StrictModel

__all__ = ["ReleaseConfig", "ReleaseKind", "Setting", "StepInput", "StepOutput", "PrivacyEvent", "register",
           "kinds", "kind_of", "get_kind", "charged_at_step_one"]

PrivacyEvent = ZCDP | ApproxDP


class ReleaseConfig(StrictModel):
    """The keys every release has; a kind's model adds ``type: Literal[<name>]`` and its own keys."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    attribute: str
    share: float = Field(gt=0, le=1, description="fraction of the deployment budget of this release's kind")


@dataclass(frozen=True)
class Setting:
    """What a mechanism is built from besides its release's own keys (all public)."""

    horizon: int
    neighbours: Neighbours
    domain_size: int  # the attribute's number of codes
    allotment: PrivacyEvent  # the release's whole budget (pipeline.config.Deployment.budget_plan)
    seed: int | None  # None: secure randomness
    n: int | None = None  # roster size, when known
    # the release's attribute model (pipeline.attributes), for kinds that resolve labels; outside equality
    # and hashing (lists inside), which the cost of a setting never depends on beyond ``domain_size``
    attribute: Any = field(default=None, compare=False)

    @classmethod
    def of(cls, deployment, release, allotment: PrivacyEvent, n: int | None, seed) -> "Setting":
        """The setting of ``release`` (a configured release of ``deployment``) with ``allotment``, for
        ``n`` users and randomness ``seed``: the one place a setting is made, for the releaser
        (``pipeline.plan.mechanism_setting``, seeded per release) and for ``dpstream plan``
        (``pipeline.error_bounds``), so the bounds the plan shows are the ones the releases run with."""
        attribute = deployment.attributes[release.attribute]
        return cls(horizon=deployment.horizon, neighbours=deployment.neighbours, domain_size=attribute.size,
                   allotment=allotment, seed=seed, n=n, attribute=attribute)


@dataclass
class StepInput:
    release: Any  # the release's configuration model
    mechanism: Any
    step: int
    parts: list[dict]  # the partitions' partials of this release
    attribute: Any  # the release's attribute model (pipeline.attributes)
    neighbours: Neighbours
    manifest: dict[str, Any]  # the step's public manifest so far; the kind adds its entries


@dataclass
class StepOutput:
    columns: np.ndarray | None = None  # new synthetic columns (m × len(column_steps)) or None
    column_steps: list[int] = field(default_factory=list)
    alerts: dict[str, Any] | None = None
    feedback: dict[str, Any] | None = None  # sent to every worker partition (charges users)
    # a float histogram over the codes instead of synthetic records: published on ``synthetic`` as one
    # float64 column (records = codes 0..|X|−1), described by the manifest's ``synthetic`` entry as
    # synthetic columns are (pipeline.releases.codecs.synthetic_entry)
    histogram: np.ndarray | None = None


class ReleaseKind:
    """One kind of release; see the module docstring for what a subclass must provide."""

    name: ClassVar[str]
    config: ClassVar[type[ReleaseConfig]]
    budget: ClassVar[Literal["zcdp", "approx_dp"]]
    synthetic: ClassVar[bool] = False

    def check(self, release, attribute, horizon: int) -> None:
        """Nothing beyond the model's own validation."""

    def check_budget(self, release, budget, horizon: int) -> None:
        """Checks of the release against the deployment's budget (``budget`` keys); nothing by default."""

    def aggregator(self, release, attribute, rows: int, horizon: int):
        raise NotImplementedError

    def needs_feedback(self, release) -> bool:
        return False

    def build(self, release, setting: Setting):
        raise NotImplementedError

    def events(self, release, mechanism, setting: Setting) -> tuple[PrivacyEvent | None, ...]:
        raise NotImplementedError

    def release_step(self, step: StepInput) -> StepOutput:
        raise NotImplementedError

    def bounds(self, release, mechanism, horizon: int):
        """What an analyst gets, read off the built mechanism: a
        :class:`pipeline.releases.bounds.ReleaseBounds` (the error bound its theorem gives at its β)."""
        raise NotImplementedError

    # -- reading side ---------------------------------------------------------------------------
    output: ClassVar[Literal["records", "histogram", "alerts"]] = "records"
    bound_source: ClassVar[str] = ""  # what the compared bound guarantees, with the theorem it comes from

    def first_step(self, release) -> int:
        """The first step whose output answers questions (a window release: its first full window)."""
        return 1

    def questions(self, release, unit: str = "step") -> tuple[list[str], list[str]]:
        raise NotImplementedError

    def answer(self, release, panel, step: int, ctx, raw: bool = False, group: str | None = None):
        raise ValueError(f"release {release.name!r} ({release.type}) publishes alerts, not counts: "
                         "`dpstream alerts` reads them")

    def explain(self, bounds, n: int) -> str:
        raise NotImplementedError

    def dictionary(self, release, panel, ctx) -> dict[str, Any]:
        """The kind's entries of an export's data dictionary (labels, padding); none by default."""
        return {}

    def padding_flags(self, release, panel, step: int | None = None):
        """Per synthetic record, whether it is padding for the window ending at ``step`` (default: the last
        released; an export's ``padding_step_<t>`` columns); None: no padding."""
        return None

    def alert_text(self, release, alert: dict, ctx) -> str:
        raise ValueError(f"release {release.name!r} ({release.type}) publishes no alerts")

    def flag_limit(self, release) -> str:
        """Alerts kinds: when and why a flagged value stops being reported, in words."""
        return ""

    def observe(self, manifest: dict, alerts: dict | None) -> dict[str, float]:
        return {}


def charged_at_step_one(target: ApproxDP, guarantee: ApproxDP, horizon: int, who: str) -> tuple:
    """The events of a monitor whose (ε, δ) guarantee covers the whole horizon and does not decompose
    per step: ``target`` at step 1, nothing after. ``guarantee`` is what the theorem gives for the
    noise the mechanism was built with; it must not exceed the target the noise was calibrated to
    (else the charge would understate the cost, and this raises)."""
    if (guarantee.epsilon > target.epsilon * (1 + BUDGET_RTOL)
            or guarantee.delta > target.delta * (1 + BUDGET_RTOL)):
        raise ValueError(f"{who}: the noise's guarantee ({guarantee.epsilon!r}, {guarantee.delta!r}) exceeds "
                         f"the charged ({target.epsilon!r}, {target.delta!r})")
    return (target,) + (None,) * (horizon - 1)


_REGISTRY: dict[str, ReleaseKind] = {}


def register(cls: type[ReleaseKind]) -> type[ReleaseKind]:
    """Class decorator: add a kind to the registry under its ``name`` (once)."""
    if cls.name in _REGISTRY:
        raise ValueError(f"release kind {cls.name!r} is registered twice")
    if cls.budget not in ("zcdp", "approx_dp"):
        raise ValueError(f"release kind {cls.name!r}: budget must be 'zcdp' or 'approx_dp', got {cls.budget!r}")
    _REGISTRY[cls.name] = cls()
    return cls


def kinds() -> dict[str, ReleaseKind]:
    """Every registered kind by name, in registration order."""
    return dict(_REGISTRY)


def get_kind(name: str) -> ReleaseKind:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown release type {name!r}; known: {sorted(_REGISTRY)}") from None


def kind_of(release) -> ReleaseKind:
    """The kind of a configured release (its ``type``)."""
    return get_kind(release.type)
