"""The release-kind interface and the registry keyed by the kind's name.

Each kind of release (fixed-window synthetic data, cumulative synthetic data, heavy hitters, band
monitor, ...) is one subclass of :class:`ReleaseKind`, registered with :func:`register`. Nothing else
in the system branches on a release's ``type``: the configuration, the budget plan, the ledger, the
workers and the releaser ask the kind (``kind_of(release)``).

The contract is code: :class:`ReleaseWriter` (what the configuration, the budget plan, the workers
and the releaser call to check, budget, aggregate and build a release) and :class:`ReleaseReader`
(what the analyst commands call to read a released step back) are abstract base classes, each
member with its Args/Returns. A kind subclasses :class:`CountsKind` (it publishes synthetic records
or a histogram, and answers questions about them) or :class:`AlertsKind` (it publishes alerts), sets
the class attributes ``name``, ``config``, ``budget`` and ``bound_source``, and implements every
abstract method. :func:`register` instantiates the kind when its module is imported, so a kind
missing a member fails at import with a TypeError naming what it lacks.

The privacy events a kind declares (:meth:`ReleaseWriter.events`) are immutable
:class:`~pipeline.privacy.events.ZCDP` or :class:`~pipeline.privacy.events.ApproxDP` values, in the
spirit of the ``DpEvent`` of Google's dp_accounting library. They are derived from the built
mechanism's noise parameters (e.g. ρ = Δ²/(2σ²) of the σ² it samples with), never computed beside
it; a monitor whose (ε, δ) covers the whole horizon declares its calibrated (ε, δ) at step 1 after
checking the guarantee of its noise against it (:func:`charged_at_step_one`). The budget plan
(``pipeline.plan``) and the releaser's ledger charge exactly these, and they must add up to the
release's allotment.

To add a kind: a module in this package with the config model and the registered class, imported
in ``pipeline/releases/__init__.py``; and a case with an independent recomputation of its cost from
the built mechanism's noise in ``tests/test_release_kinds.py`` (that test fails for a registered
kind without one).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, Protocol, TypeVar

import numpy as np
from pydantic import Field

from pipeline.attributes import Attribute
from pipeline.privacy.budget import BUDGET_RTOL
from pipeline.privacy.events import ZCDP, ApproxDP
from pipeline.privacy.neighbours import Neighbours
from pipeline.validation import StrictModel

from .aggregators import Aggregator
from .bounds import ReleaseBounds
from .reading import Answer, Context, Panel

__all__ = [
    "ReleaseConfig",
    "ReleaseWriter",
    "ReleaseReader",
    "ReleaseKind",
    "CountsKind",
    "AlertsKind",
    "BudgetKeys",
    "Setting",
    "StepInput",
    "StepOutput",
    "PrivacyEvent",
    "register",
    "kinds",
    "kind_of",
    "get_kind",
    "charged_at_step_one",
]

PrivacyEvent = ZCDP | ApproxDP


class ReleaseConfig(StrictModel):
    """The keys every release has; a kind's model adds ``type: Literal[<name>]`` and its own keys."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    attribute: str
    share: float = Field(
        gt=0, le=1, description="fraction of the deployment budget of this release's kind"
    )
    if TYPE_CHECKING:  # each kind's model declares it as Literal[<name>]; not a field here
        type: str


R = TypeVar("R", bound=ReleaseConfig)
K = TypeVar("K", bound="ReleaseKind[Any]")


class BudgetKeys(Protocol):
    """The deployment's ``budget`` keys a kind checks a release against
    (``pipeline.config.Budget``)."""

    @property
    def rho(self) -> float | None: ...
    @property
    def epsilon(self) -> float | None: ...
    @property
    def delta(self) -> float | None: ...


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

    @property
    def zcdp(self) -> ZCDP:
        """The allotment of a zCDP kind (``budget = "zcdp"``)."""
        if not isinstance(self.allotment, ZCDP):
            raise TypeError(f"this release's allotment is {self.allotment!r}, not a ZCDP")
        return self.allotment

    @property
    def approx_dp(self) -> ApproxDP:
        """The allotment of an (ε, δ) kind (``budget = "approx_dp"``)."""
        if not isinstance(self.allotment, ApproxDP):
            raise TypeError(f"this release's allotment is {self.allotment!r}, not an ApproxDP")
        return self.allotment

    @classmethod
    def of(cls, deployment, release, allotment: PrivacyEvent, n: int | None, seed) -> Setting:
        """The setting of ``release`` (a configured release of ``deployment``) with ``allotment``, for
        ``n`` users and randomness ``seed``: the one place a setting is made, for the releaser
        (``pipeline.plan.mechanism_setting``, seeded per release) and for ``dpstream plan``
        (``pipeline.error_bounds``), so the bounds the plan shows are the ones the releases run with."""
        attribute = deployment.attributes[release.attribute]
        return cls(
            horizon=deployment.horizon,
            neighbours=deployment.neighbours,
            domain_size=attribute.size,
            allotment=allotment,
            seed=seed,
            n=n,
            attribute=attribute,
        )


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


class ReleaseWriter(ABC, Generic[R]):
    """The write side of a kind: what the configuration, the budget plan, the workers and the
    releaser call. ``R`` is the kind's configuration model (:attr:`config`).

    Class attributes: ``name`` (the configuration's ``type`` tag; the registry key), ``config`` (a
    subclass of :class:`ReleaseConfig` declaring ``type: Literal[<name>]`` and the kind's own keys),
    ``budget`` (``"zcdp"`` or ``"approx_dp"``: which part of the deployment budget its ``share`` is
    a share of) and ``synthetic`` (True when ``mechanism.update(codes)`` and ``mechanism.synthetic``
    run the kind in batch, for the releaser's ``batch_reference``).
    """

    name: ClassVar[str]
    config: ClassVar[type[ReleaseConfig]]
    budget: ClassVar[Literal["zcdp", "approx_dp"]]
    synthetic: ClassVar[bool] = False

    def check(self, release: R, attribute: Attribute, horizon: int) -> None:
        """Checks of the release against its (public) attribute and the horizon; none by default.

        Args:
            release: the configured release.
            attribute: its attribute model.
            horizon: the deployment's number of steps.
        Raises:
            ValueError: whose message starts with the offending key of the release (``"window: 9
                exceeds horizon 6"``); the configuration prefixes the release's position.
        """

    def check_budget(self, release: R, budget: BudgetKeys, horizon: int) -> None:
        """Checks against the deployment's budget (e.g. a per-step share a calibration does not
        cover); none by default.

        Args:
            release: the configured release.
            budget: the deployment's ``budget`` keys.
            horizon: the deployment's number of steps.
        Raises:
            ValueError: whose message starts with the offending key, as for :meth:`check`.
        """

    @abstractmethod
    def aggregator(self, release: R, attribute: Attribute, rows: int, horizon: int) -> Aggregator:
        """The worker-side aggregator of one reports partition
        (:mod:`pipeline.releases.aggregators`).

        Args:
            release: the configured release.
            attribute: its attribute model.
            rows: the partition's number of users.
            horizon: the deployment's number of steps.
        Returns:
            An :class:`~pipeline.releases.aggregators.Aggregator` whose partials add across
            partitions.
        """

    def needs_feedback(self, release: R) -> bool:
        """Whether the releaser's output of step t charges users, so workers must apply it before
        they close step t + 1 (False by default).

        Args:
            release: the configured release.
        Returns:
            True when :meth:`release_step` returns ``feedback``.
        """
        return False

    @abstractmethod
    def build(self, release: R, setting: Setting) -> Any:
        """The release's mechanism.

        Args:
            release: the configured release.
            setting: horizon, neighbouring relation, domain size, allotment, seed, n.
        Returns:
            The mechanism: it offers ``get_state()`` and a class method ``from_state(state)``.
        """

    @abstractmethod
    def events(
        self, release: R, mechanism: Any, setting: Setting
    ) -> tuple[PrivacyEvent | None, ...]:
        """The privacy events of each step, read off the built mechanism's noise (module docstring).

        Args:
            release: the configured release.
            mechanism: what :meth:`build` returned for ``setting``.
            setting: the setting it was built from.
        Returns:
            One event per step 1..horizon (None where nothing is spent), adding up to the allotment.
        """

    @abstractmethod
    def bounds(self, release: R, mechanism: Any, horizon: int) -> ReleaseBounds:
        """The error bound the kind's theorem gives at its β, read off the built mechanism, for
        ``dpstream plan``.

        Args:
            release: the configured release.
            mechanism: what :meth:`build` returned.
            horizon: the deployment's number of steps.
        Returns:
            The release's :class:`~pipeline.releases.bounds.ReleaseBounds`.
        """

    @abstractmethod
    def release_step(self, step: StepInput) -> StepOutput:
        """One step's release: run the mechanism on the summed partials.

        Args:
            step: the step's mechanism, partials and manifest so far; the kind adds its entries to
                ``step.manifest`` (at least ``"parameters"``).
        Returns:
            The step's public output (synthetic columns, a histogram or alerts) and feedback.
        """


class ReleaseReader(ABC, Generic[R]):
    """The reading side of a kind: post-processing of its public records for the analyst commands
    (:mod:`pipeline.releases.reading`).

    Class attributes: ``output`` (what its steps publish: ``"records"``, synthetic records on
    ``synthetic``; ``"histogram"``, one float64 column over the codes on ``synthetic``;
    ``"alerts"``, records on ``alerts`` only — the consumer assembles a step by this shape, never by
    the release type) and ``bound_source`` (what the compared bound guarantees, with the theorem it
    comes from).
    """

    output: ClassVar[Literal["records", "histogram", "alerts"]] = "records"
    bound_source: ClassVar[str] = ""

    def first_step(self, release: R) -> int:
        """The first step whose output answers questions (a window release: its first full window).

        Args:
            release: the configured release.
        Returns:
            A step in 1..horizon (1 by default).
        """
        return 1

    @abstractmethod
    def questions(self, release: R, unit: str = "step") -> tuple[list[str], list[str]]:
        """What the release answers and what it does not, in words, for the exports' dictionary and
        the page.

        Args:
            release: the configured release.
            unit: what a step is called (``"month"``).
        Returns:
            (questions answered, questions not answered).
        """

    @abstractmethod
    def explain(self, bounds: ReleaseBounds, n: int) -> str:
        """The bound of ``bounds`` in one sentence, also as a share of n.

        Args:
            bounds: what :meth:`ReleaseWriter.bounds` returned.
            n: the roster size.
        Returns:
            The sentence (no final full stop).
        """

    def answer(
        self,
        release: R,
        panel: Panel,
        step: int,
        ctx: Context,
        raw: bool = False,
        group: str | None = None,
    ) -> Answer:
        """One released step as labelled rows with intervals from the mechanism's bound at its β,
        and shares of n. Counts kinds implement it; alerts kinds answer through :meth:`alert_text`.

        Args:
            release: the configured release.
            panel: its released records.
            step: the step asked about.
            ctx: the public context (attribute, n, bounds, unit).
            raw: the synthetic counts as they are (padding included).
            group: one declared group only, for kinds that have groups.
        Returns:
            The :class:`~pipeline.releases.reading.Answer`.
        Raises:
            ValueError: (one line) for a question the kind does not answer.
        """
        raise ValueError(
            f"release {release.name!r} ({release.type}) publishes alerts, not counts: "
            "`dpstream alerts` reads them"
        )

    def alert_text(self, release: R, alert: dict[str, Any], ctx: Context) -> str:
        """One alert record in words (labels, what a flag means). Alerts kinds implement it.

        Args:
            release: the configured release.
            alert: one record of the ``alerts`` topic.
            ctx: the public context.
        Returns:
            The alert in one line.
        """
        raise ValueError(f"release {release.name!r} ({release.type}) publishes no alerts")

    def flag_limit(self, release: R) -> str:
        """Alerts kinds: when and why a flagged value stops being reported, in words.

        Args:
            release: the configured release.
        Returns:
            The sentence; empty for kinds without flags.
        """
        return ""

    def dictionary(self, release: R, panel: Panel, ctx: Context) -> dict[str, Any]:
        """The kind's entries of an export's data dictionary (labels, padding); none by default.

        Args:
            release: the configured release.
            panel: its released records.
            ctx: the public context.
        Returns:
            Entries by key.
        """
        return {}

    def padding_flags(self, release: R, panel: Panel, step: int | None = None) -> np.ndarray | None:
        """Per synthetic record, whether it is padding for the window ending at ``step`` (an
        export's ``padding_step_<t>`` columns).

        Args:
            release: the configured release.
            panel: its released records.
            step: the window's last step (default: the last released).
        Returns:
            A boolean array over the records, or None: no padding (the default).
        """
        return None

    def observe(self, manifest: dict[str, Any], alerts: dict[str, Any] | None) -> dict[str, float]:
        """The step's public numbers worth a metric; the releaser's coordinator increases a counter
        by each and sets a gauge to it (none by default).

        Args:
            manifest: the step's public manifest.
            alerts: the step's alert record, if any.
        Returns:
            The name of a release metric of the stream's ``METRICS`` (labelled by release) -> value.
        """
        return {}


class ReleaseKind(ReleaseWriter[R], ReleaseReader[R]):
    """One kind of release: both sides. Subclass :class:`CountsKind` or :class:`AlertsKind`."""


class CountsKind(ReleaseKind[R]):
    """A kind publishing synthetic records or a histogram (``output`` ``"records"`` or
    ``"histogram"``), read back through :meth:`answer`."""

    @abstractmethod
    def answer(
        self,
        release: R,
        panel: Panel,
        step: int,
        ctx: Context,
        raw: bool = False,
        group: str | None = None,
    ) -> Answer:
        """See :meth:`ReleaseReader.answer`."""


class AlertsKind(ReleaseKind[R]):
    """A kind publishing alerts only (``output`` ``"alerts"``), read back through :meth:`alert_text`
    and :meth:`flag_limit`."""

    output: ClassVar[Literal["records", "histogram", "alerts"]] = "alerts"

    @abstractmethod
    def alert_text(self, release: R, alert: dict[str, Any], ctx: Context) -> str:
        """See :meth:`ReleaseReader.alert_text`."""

    @abstractmethod
    def flag_limit(self, release: R) -> str:
        """See :meth:`ReleaseReader.flag_limit`."""


def charged_at_step_one(target: ApproxDP, guarantee: ApproxDP, horizon: int, who: str) -> tuple:
    """The events of a monitor whose (ε, δ) guarantee covers the whole horizon and does not decompose
    per step: ``target`` at step 1, nothing after. ``guarantee`` is what the theorem gives for the
    noise the mechanism was built with; it must not exceed the target the noise was calibrated to
    (else the charge would understate the cost, and this raises)."""
    if guarantee.epsilon > target.epsilon * (1 + BUDGET_RTOL) or guarantee.delta > target.delta * (
        1 + BUDGET_RTOL
    ):
        raise ValueError(
            f"{who}: the noise's guarantee ({guarantee.epsilon!r}, {guarantee.delta!r}) exceeds "
            f"the charged ({target.epsilon!r}, {target.delta!r})"
        )
    return (target,) + (None,) * (horizon - 1)


_REGISTRY: dict[str, ReleaseKind[Any]] = {}

_CLASS_ATTRIBUTES = ("name", "config", "budget", "bound_source")


def register(cls: type[K]) -> type[K]:
    """Class decorator: add a kind to the registry under its ``name`` (once). The kind is
    instantiated here, when its module is imported, so a kind missing a member of the contract fails
    at import."""
    if not isinstance(cls, type) or not issubclass(cls, (CountsKind, AlertsKind)):
        raise TypeError(f"release kind {cls!r} must subclass CountsKind or AlertsKind")
    missing = sorted(
        set(getattr(cls, "__abstractmethods__", ()))
        | {a for a in _CLASS_ATTRIBUTES if not getattr(cls, a, None)}
    )
    if missing:
        raise TypeError(
            f"release kind {cls.__name__} lacks {', '.join(missing)} "
            "(the contract: pipeline.releases.base)"
        )
    if cls.name in _REGISTRY:
        raise ValueError(f"release kind {cls.name!r} is registered twice")
    if cls.budget not in ("zcdp", "approx_dp"):
        raise ValueError(
            f"release kind {cls.name!r}: budget must be 'zcdp' or 'approx_dp', got {cls.budget!r}"
        )
    if cls.output not in ("records", "histogram", "alerts"):
        raise ValueError(
            f"release kind {cls.name!r}: output must be 'records', 'histogram' or "
            f"'alerts', got {cls.output!r}"
        )
    _REGISTRY[cls.name] = cls()
    return cls


def kinds() -> dict[str, ReleaseKind[Any]]:
    """Every registered kind by name, in registration order."""
    return dict(_REGISTRY)


def get_kind(name: str) -> ReleaseKind[Any]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown release type {name!r}; known: {sorted(_REGISTRY)}") from None


def kind_of(release: ReleaseConfig) -> ReleaseKind[Any]:
    """The kind of a configured release (its ``type``)."""
    return get_kind(release.type)
