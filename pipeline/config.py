"""Deployment configuration: one YAML file describes a deployment; validated on load.

Errors name the offending key (``releases.1.window: ...``). Domains are public and declared here,
never derived from the data. The budget plan (:meth:`Deployment.budget_plan`: each release's share
of the budget, checked against it) is checked by :func:`load_config` before anything starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from pipeline.attributes import Attribute, BinaryAttribute, CategoricalAttribute, HashedAttribute
from pipeline.privacy.budget import BudgetPlan, PlannedRelease, PrivacyBudget
from pipeline.privacy.neighbours import Neighbours, check_neighbours
from pipeline.releases import ReleaseConfig, kind_of, kinds
from pipeline.security import Security, check_broker, check_redis_url
from pipeline.validation import StrictModel

__all__ = [
    "Deployment",
    "ConfigError",
    "load_config",
    "parse_config",
    "BinaryAttribute",
    "CategoricalAttribute",
    "HashedAttribute",
]


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the offending key."""


_Strict = StrictModel


# --- attributes (public domains): pipeline.attributes ------------------------------------------
# --- releases: one model per registered kind (pipeline.releases) ---------------------------------

# The union of the registered kinds' models is built at import; to a type checker each is a
# ReleaseConfig.
if TYPE_CHECKING:
    Release = ReleaseConfig
else:
    # Union over a tuple built at import: the X | Y form cannot take one
    _KIND_MODELS = tuple(kind.config for kind in kinds().values())
    Release = Annotated[Union[_KIND_MODELS], Field(discriminator="type")]  # noqa: UP007


# --- the rest ---------------------------------------------------------------------------------

# The largest total ε (ρ converted at report_delta, plus the monitors' ε) accepted without
# ``budget.allow_large: true``. At ε = 10 an adversary's odds about any one user may move by a factor
# e^10 ≈ 22,000: past that a release protects next to nothing, and a larger value is far more often a
# typo (rho: 500000 for 0.5) than a decision (docs/privacy.md, "Budget ceiling").
EPSILON_CEILING = 10.0


class Budget(_Strict):
    """The deployment's whole budget: ρ for zCDP releases, (ε, δ) for monitor releases."""

    rho: float | None = Field(default=None, gt=0)
    epsilon: float | None = Field(default=None, gt=0)
    delta: float | None = Field(default=None, gt=0, lt=1)
    report_delta: float = Field(
        default=1e-6, gt=0, lt=1, description="δ at which ρ is also reported as (ε, δ)"
    )
    allow_large: bool = Field(
        default=False, description=f"accept a total ε above {EPSILON_CEILING:g} (at report_delta)"
    )

    @model_validator(mode="after")
    def _pairs(self) -> Budget:
        if (self.epsilon is None) != (self.delta is None):
            raise ValueError("epsilon and delta are set together")
        if self.rho is None and self.epsilon is None:
            raise ValueError("set rho and/or epsilon+delta")
        total = self.total_epsilon()
        if total > EPSILON_CEILING and not self.allow_large:
            raise ValueError(
                f"total ε = {total:.6g} at report_delta = {self.report_delta:g} (ρ = {self.rho or 0:g} "
                f"converted, plus ε = {self.epsilon or 0:g}) is above the ceiling ε = {EPSILON_CEILING:g}: "
                "such a release protects next to nothing (docs/privacy.md, 'Budget ceiling'); fix the "
                "value, or set budget.allow_large: true to acknowledge it"
            )
        return self

    def total_epsilon(self) -> float:
        """The whole budget as one ε at ``report_delta``: ρ converted (CKS 2020) plus the monitors' ε."""
        from pipeline.privacy.conversions import zcdp_to_approx_dp

        return (zcdp_to_approx_dp(self.rho, self.report_delta) if self.rho else 0.0) + (
            self.epsilon or 0.0
        )


class Topics(_Strict):
    prefix: str = Field(default="dpstream", pattern=r"^[A-Za-z0-9_.-]+$")
    partitions: int = Field(
        default=4, ge=1, le=1024, description="partitions of reports and feedback"
    )


class Roster(_Strict):
    """Enrolled users, fixed before the first release; n is public."""

    source: Literal["range", "file"] = "range"
    size: int | None = Field(default=None, ge=1)
    path: str | None = None
    id_prefix: str = "u"

    @model_validator(mode="after")
    def _source(self) -> Roster:
        if self.source == "range" and self.size is None:
            raise ValueError("a 'range' roster needs size")
        if self.source == "file" and not self.path:
            raise ValueError("a 'file' roster needs path")
        return self


class Steps(_Strict):
    """When a step closes: by control command, or ``deadline_seconds`` after the previous close (or
    the releaser's start). Both are public events; closing on an exact count of who reported is
    refused (docs/privacy.md, "Closing rules and timing")."""

    close: Literal["control", "deadline"] = "control"
    deadline_seconds: float | None = Field(default=None, gt=0)
    publish_delay_seconds: float = Field(
        default=0.0,
        ge=0,
        description="hold each step's public records until this long after its close, so "
        "when they appear does not depend on how long the release took",
    )
    max_ahead: int = Field(
        default=2, ge=0, description="reports at most this many steps past the open step"
    )
    unit: str = Field(
        default="step",
        min_length=1,
        max_length=40,
        description='what a step is called in analysts\' labels ("month"); labels only',
    )

    @field_validator("close", mode="before")
    @classmethod
    def _no_coverage(cls, v: Any) -> Any:
        if v == "coverage":
            raise ValueError(
                "'coverage' is no longer supported: closing when every user has reported makes "
                "whether and when a step is published an un-noised function of who reported "
                "(one missing user stalls every release); use 'control' or 'deadline'"
            )
        return v

    @model_validator(mode="after")
    def _deadline(self) -> Steps:
        if self.close == "deadline" and self.deadline_seconds is None:
            raise ValueError("close: deadline needs deadline_seconds")
        return self


class Imputation(_Strict):
    rule: Literal["carry_forward", "default"] = "carry_forward"
    default: dict[str, str | int] = Field(
        default_factory=dict, description="per attribute, used when nothing to carry"
    )


class CloseGuard(_Strict):
    """``dpstream close`` compares each step it is about to close with the steps already closed: the
    share of users imputed (no accepted report) and the share of reports rejected while the step was
    open, and warns above the closed steps' median by more than ``warn_above``. Advisory only: it
    prints the counts and never refuses, because a refusal (or an operator waiting until the counts
    look better) makes whether a step closes now a threshold on an un-noised count of who reported
    (docs/privacy.md, "Closing rules and timing"). Curator-side counts only."""

    warn_above: float = Field(default=0.05, ge=0, le=1)
    refuse_above: float | None = Field(
        default=None, description="refused unless null: the guard never refuses"
    )

    @field_validator("refuse_above")
    @classmethod
    def _advisory(cls, v: float | None) -> None:
        if v is not None:
            raise ValueError(
                "a close guard that refuses is no longer supported: whether a step closes would be a "
                "hard threshold on an un-noised count of who reported (docs/privacy.md, 'Closing rules "
                "and timing'); the guard only warns (warn_above). Remove the key; close on the "
                "deadline schedule (steps.close: deadline)"
            )
        return None


class RandomSourceConfig(_Strict):
    """``secure`` (the OS CSPRNG) or a seed (simulation/tests only; refused when production)."""

    kind: Literal["secure", "seeded"] = "secure"
    seed: int | None = None

    @model_validator(mode="after")
    def _seed(self) -> RandomSourceConfig:
        if self.kind == "seeded" and self.seed is None:
            raise ValueError("a seeded random source needs seed")
        if self.kind == "secure" and self.seed is not None:
            raise ValueError("seed is only for kind: seeded")
        return self


class Deployment(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    production: bool = False
    broker: str | None = Field(
        default=None, description="bootstrap servers; absent = embedded broker"
    )
    redis: str | None = Field(default=None, description="redis:// URL; absent = embedded Redis")
    security: Security = Field(
        default_factory=Security, description="TLS/SASL/ACL of the connections (pipeline.security)"
    )
    topics: Topics = Topics()
    roster: Roster
    horizon: int = Field(ge=1, le=100_000)
    attributes: dict[str, Attribute] = Field(min_length=1)
    neighbours: Neighbours = Neighbours.REPLACE
    budget: Budget
    random: RandomSourceConfig = RandomSourceConfig()
    steps: Steps = Steps()
    imputation: Imputation = Imputation()
    close_guard: CloseGuard = CloseGuard()
    releases: list[Release] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _not_a_path_step(cls, value: str) -> str:
        """The name is a directory under ``$DPSTREAM_HOME`` and part of every Redis key and topic
        name:
        ``.`` or ``..`` would put the deployment's state in ``$DPSTREAM_HOME`` itself or its
        parent."""
        if set(value) == {"."}:
            raise ValueError(
                f"{value!r} names the current or parent directory, where the "
                "deployment's Redis data and broker log would land; choose a name "
                "with a letter or digit"
            )
        return value

    @field_validator("neighbours", mode="before")
    @classmethod
    def _replace_only(cls, value: Any) -> Neighbours:
        """A stream deployment has a fixed public roster and imputes missing reports, so removing a
        user is not a possible neighbour: only ``replace`` describes what changes (docs/privacy.md)."""
        relation = check_neighbours(value)
        if relation is not Neighbours.REPLACE:
            raise ValueError(
                f"{relation.value} is refused for a stream deployment: the roster is fixed and public and a "
                "user without reports is imputed (carry-forward or the default), so an absent user does not "
                "disappear — its count moves from its real bin to the imputed bin (L2 sensitivity √2) and n is "
                "published; the neighbouring relation is replace (one user's whole sequence replaced by any "
                "other, including the all-missing one). Remove the key or set it to replace; see docs/privacy.md"
            )
        return relation

    @model_validator(mode="after")
    def _cross_checks(self) -> Deployment:
        check_broker(self.broker, self.security)
        check_redis_url(self.redis, self.security)
        names = [r.name for r in self.releases]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"release names must be unique: {dup}")
        if self.production and self.random.kind != "secure":
            raise ValueError(
                "random: a seeded (non-secure) random source is refused when production is true"
            )
        for i, rel in enumerate(self.releases):
            where = f"releases.{i} ({rel.name})"
            attr = self.attributes.get(rel.attribute)
            if attr is None:
                raise ValueError(f"{where}.attribute: unknown attribute {rel.attribute!r}")
            kind = kind_of(rel)
            try:
                kind.check(rel, attr, self.horizon)
            except ValueError as err:  # the kind's message starts with the offending key
                raise ValueError(f"{where}.{err}") from None
            if kind.budget == "zcdp" and self.budget.rho is None:
                raise ValueError(f"{where}: a {rel.type} release needs budget.rho")
            if kind.budget == "approx_dp" and self.budget.epsilon is None:
                raise ValueError(
                    f"{where}: a {rel.type} release needs budget.epsilon and budget.delta"
                )
            try:
                kind.check_budget(rel, self.budget, self.horizon)
            except ValueError as err:
                raise ValueError(f"{where}.{err}") from None
        for attr_name, value in self.imputation.default.items():
            attr = self.attributes.get(attr_name)
            if attr is None:
                raise ValueError(f"imputation.default.{attr_name}: unknown attribute")
            if not attr.in_domain(value):
                raise ValueError(
                    f"imputation.default.{attr_name}: {value!r} is outside the attribute's domain"
                )
        return self

    @property
    def n(self) -> int:
        """Roster size (public)."""
        roster = self.roster
        if roster.source == "range":
            assert roster.size is not None  # Roster's validator: a range roster has a size
            return int(roster.size)
        assert roster.path is not None  # Roster's validator: a file roster has a path
        return sum(1 for line in Path(roster.path).read_text().splitlines() if line.strip())

    def release(self, name: str):
        for rel in self.releases:
            if rel.name == name:
                return rel
        raise KeyError(f"no release named {name!r}")

    def privacy_budget(self) -> PrivacyBudget:
        """The whole budget the ledger charges against."""
        return PrivacyBudget(
            rho=self.budget.rho, epsilon=self.budget.epsilon, delta=self.budget.delta
        )

    def budget_plan(self) -> BudgetPlan:
        """Each release's share of its kind's part of the budget (ρ or (ε, δ)), checked: raises
        ``BudgetExceededError`` naming the releases over budget. The horizon is known up front, so
        the whole spend is planned here; when each release spends it is :mod:`pipeline.plan`."""
        releases = [
            PlannedRelease(rel.name, share=rel.share, kind=kind_of(rel).budget)
            for rel in self.releases
        ]
        return BudgetPlan(self.privacy_budget(), releases).check()


_UNION_TAGS = {"attributes": {"binary", "categorical", "hashed"}, "releases": set(kinds())}


def _key_path(loc: tuple) -> str:
    """``releases.0.window`` from pydantic's loc, without the discriminator tag pydantic inserts
    after ``attributes.<name>`` / ``releases.<i>`` (only there: an attribute may be named like a tag)."""
    parts = []
    for i, p in enumerate(loc):
        if i >= 2 and isinstance(p, str) and p in _UNION_TAGS.get(loc[i - 2], ()):
            continue
        parts.append(str(p))
    return ".".join(parts)


def _format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = _key_path(tuple(e["loc"]))
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"{loc or '<root>'}: {msg}")
    return "; ".join(lines)


def parse_config(data: dict[str, Any], *, source: str = "<config>") -> Deployment:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping")
    try:
        return Deployment.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{source}: {_format_validation_error(err)}") from None


def load_config(path: str | Path) -> Deployment:
    """Read and validate a deployment YAML file, budget plan included (:meth:`Deployment.budget_plan`):
    an over-budget plan raises ``BudgetExceededError`` naming the releases, before anything starts."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    deployment = parse_config(data, source=str(path))
    deployment.budget_plan()
    return deployment
