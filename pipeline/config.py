"""Deployment configuration: one YAML file describes a deployment; validated on load.

Errors name the offending key (``releases.1.window: ...``). Domains are public and declared here,
never derived from the data. The budget plan is checked by :func:`load_config` (via
:func:`pipeline.plan.budget_plan`) before anything starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from pipeline.plan import APPROX_DP_RELEASES, ZCDP_RELEASES, budget_plan
from pipeline.privacy.accounting import Neighbours, check_neighbours
from pipeline.stream.relative_error import RelativeErrorRelease, check_release as check_relative_error
from pipeline.security import Security, check_broker, check_redis_url

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


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- attributes (public domains) -----------------------------------------------------------

class BinaryAttribute(_Strict):
    type: Literal["binary"]
    description: str = ""

    @property
    def size(self) -> int:
        return 2

    def labels(self) -> list[str]:
        return ["0", "1"]


class CategoricalAttribute(_Strict):
    type: Literal["categorical"]
    values: list[str] = Field(min_length=2)
    description: str = ""

    @field_validator("values")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("values must be distinct")
        return v

    @property
    def size(self) -> int:
        return len(self.values)

    def labels(self) -> list[str]:
        return list(self.values)


class HashedAttribute(_Strict):
    """An open domain (e.g. free text) mapped through a public hash to ids in [0, size).

    An alert names a value only through the public ``dictionary`` (id -> label), never by
    looking the id up in the private reports.
    """

    type: Literal["hashed"]
    size: int = Field(ge=2, le=2**32)
    dictionary: dict[int, str] = Field(default_factory=dict)
    description: str = ""

    @field_validator("dictionary")
    @classmethod
    def _dictionary_ids(cls, v: dict[int, str], info: ValidationInfo) -> dict[int, str]:
        size = info.data.get("size")
        bad = sorted(i for i in v if size is not None and not 0 <= i < size)
        if bad:
            raise ValueError(f"ids {bad[:5]} are outside [0, size={size}): no report can map to them")
        return v


Attribute = Annotated[Union[BinaryAttribute, CategoricalAttribute, HashedAttribute], Field(discriminator="type")]


# --- releases --------------------------------------------------------------------------------

class _Release(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    attribute: str
    share: float = Field(gt=0, le=1, description="fraction of the deployment budget of this release's kind")


class FixedWindowRelease(_Release):
    type: Literal["fixed_window"]
    window: int = Field(ge=1)
    beta: float = Field(default=0.05, gt=0, lt=1)


class CumulativeRelease(_Release):
    type: Literal["cumulative"]
    beta: float = Field(default=0.05, gt=0, lt=1)
    counter: Literal["tree", "factorization"] = Field(
        default="factorization",
        description="continual counter behind each cumulative count: the square-root factorization "
                    "(lower error, docs/synthesizers.md) or the binary tree of the paper")


class HeavyHittersRelease(_Release):
    type: Literal["heavy_hitters"]
    method: Literal["tme", "tct", "svt_restart", "naive"] = "tct"
    k: int = Field(default=3, ge=1, description="times one user may contribute to a flagged element")
    beta: float = Field(default=0.05, gt=0, lt=1)


class BandMonitorRelease(_Release):
    """Alert when the number of (active) users holding ``value`` leaves [low, high] (counts of users).

    A user leaves the active set after contributing to one Above/Below answer (Ghazi et al., PREM, Alg. 1);
    that single charge per user is what the calibration assumes.
    """

    type: Literal["band_monitor"]
    value: str = Field(description="the attribute value whose count is watched")
    low: float
    high: float

    @model_validator(mode="after")
    def _band(self) -> "BandMonitorRelease":
        if not self.low < self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        return self


Release = Annotated[
    Union[FixedWindowRelease, CumulativeRelease, HeavyHittersRelease, BandMonitorRelease, RelativeErrorRelease],
    Field(discriminator="type"),
]



# --- the rest ---------------------------------------------------------------------------------

class Budget(_Strict):
    """The deployment's whole budget: ρ for zCDP releases, (ε, δ) for monitor releases."""

    rho: float | None = Field(default=None, gt=0)
    epsilon: float | None = Field(default=None, gt=0)
    delta: float | None = Field(default=None, gt=0, lt=1)
    report_delta: float = Field(default=1e-6, gt=0, lt=1, description="δ at which ρ is also reported as (ε, δ)")

    @model_validator(mode="after")
    def _pairs(self) -> "Budget":
        if (self.epsilon is None) != (self.delta is None):
            raise ValueError("epsilon and delta are set together")
        if self.rho is None and self.epsilon is None:
            raise ValueError("set rho and/or epsilon+delta")
        return self


class Topics(_Strict):
    prefix: str = Field(default="dpstream", pattern=r"^[A-Za-z0-9_.-]+$")
    partitions: int = Field(default=4, ge=1, le=1024, description="partitions of reports and feedback")


class Roster(_Strict):
    """Enrolled users, fixed before the first release; n is public."""

    source: Literal["range", "file"] = "range"
    size: int | None = Field(default=None, ge=1)
    path: str | None = None
    id_prefix: str = "u"

    @model_validator(mode="after")
    def _source(self) -> "Roster":
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
        default=0.0, ge=0, description="hold each step's public records until this long after its close, so "
                                       "when they appear does not depend on how long the release took")
    max_ahead: int = Field(default=2, ge=0, description="reports at most this many steps past the open step")

    @field_validator("close", mode="before")
    @classmethod
    def _no_coverage(cls, v: Any) -> Any:
        if v == "coverage":
            raise ValueError("'coverage' is no longer supported: closing when every user has reported makes "
                             "whether and when a step is published an un-noised function of who reported "
                             "(one missing user stalls every release); use 'control' or 'deadline'")
        return v

    @model_validator(mode="after")
    def _deadline(self) -> "Steps":
        if self.close == "deadline" and self.deadline_seconds is None:
            raise ValueError("close: deadline needs deadline_seconds")
        return self


class Imputation(_Strict):
    rule: Literal["carry_forward", "default"] = "carry_forward"
    default: dict[str, str | int] = Field(default_factory=dict, description="per attribute, used when nothing to carry")


class CloseGuard(_Strict):
    """``dpstream close`` compares each step it is about to close with the steps already closed: the
    share of users imputed (no accepted report) and the share of reports rejected while the step was
    open. Above the closed steps' median by more than ``warn_above`` it warns; by more than
    ``refuse_above`` it refuses unless ``--force`` (null: never refuses). Curator-side counts only."""

    warn_above: float = Field(default=0.05, ge=0, le=1)
    refuse_above: float | None = Field(default=0.25, ge=0, le=1)


class RandomSourceConfig(_Strict):
    """``secure`` (the OS CSPRNG) or a seed (simulation/tests only; refused when production)."""

    kind: Literal["secure", "seeded"] = "secure"
    seed: int | None = None

    @model_validator(mode="after")
    def _seed(self) -> "RandomSourceConfig":
        if self.kind == "seeded" and self.seed is None:
            raise ValueError("a seeded random source needs seed")
        if self.kind == "secure" and self.seed is not None:
            raise ValueError("seed is only for kind: seeded")
        return self


class Deployment(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    production: bool = False
    broker: str | None = Field(default=None, description="bootstrap servers; absent = embedded broker")
    redis: str | None = Field(default=None, description="redis:// URL; absent = embedded Redis")
    security: Security = Field(default_factory=Security, description="TLS/SASL/ACL of the connections (pipeline.security)")
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
                "other, including the all-missing one). Remove the key or set it to replace; see docs/privacy.md")
        return relation

    @model_validator(mode="after")
    def _cross_checks(self) -> "Deployment":
        check_broker(self.broker, self.security)
        check_redis_url(self.redis, self.security)
        names = [r.name for r in self.releases]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"release names must be unique: {dup}")
        if self.production and self.random.kind != "secure":
            raise ValueError("random: a seeded (non-secure) random source is refused when production is true")
        for i, rel in enumerate(self.releases):
            where = f"releases.{i} ({rel.name})"
            attr = self.attributes.get(rel.attribute)
            if attr is None:
                raise ValueError(f"{where}.attribute: unknown attribute {rel.attribute!r}")
            if rel.type == "cumulative" and attr.type != "binary":
                raise ValueError(f"{where}.attribute: cumulative releases need a binary attribute")
            if rel.type == "fixed_window":
                if rel.window > self.horizon:
                    raise ValueError(f"{where}.window: {rel.window} exceeds horizon {self.horizon}")
                if attr.type == "hashed":
                    raise ValueError(f"{where}.attribute: fixed-window releases need a binary or categorical attribute")
                if attr.size ** rel.window > 2**22:
                    raise ValueError(f"{where}.window: {attr.size}^{rel.window} histogram bins is too many")
            if rel.type == "band_monitor" and attr.type != "hashed" and rel.value not in attr.labels():
                raise ValueError(f"{where}.value: {rel.value!r} is not in the domain of {rel.attribute!r}")
            if rel.type in ZCDP_RELEASES and self.budget.rho is None:
                raise ValueError(f"{where}: a {rel.type} release needs budget.rho")
            if rel.type in APPROX_DP_RELEASES and self.budget.epsilon is None:
                raise ValueError(f"{where}: a {rel.type} release needs budget.epsilon and budget.delta")
            if rel.type == "relative_error":
                check_relative_error(rel, attr, self, where)
        for attr_name, value in self.imputation.default.items():
            attr = self.attributes.get(attr_name)
            if attr is None:
                raise ValueError(f"imputation.default.{attr_name}: unknown attribute")
            if not _in_domain(attr, value):
                raise ValueError(f"imputation.default.{attr_name}: {value!r} is outside the attribute's domain")
        return self

    @property
    def n(self) -> int:
        """Roster size (public)."""
        if self.roster.source == "range":
            return int(self.roster.size)
        return sum(1 for line in Path(self.roster.path).read_text().splitlines() if line.strip())

    def release(self, name: str):
        for rel in self.releases:
            if rel.name == name:
                return rel
        raise KeyError(f"no release named {name!r}")


_UNION_TAGS = {"attributes": {"binary", "categorical", "hashed"},
               "releases": {"fixed_window", "cumulative", "heavy_hitters", "band_monitor", "relative_error"}}


def _key_path(loc: tuple) -> str:
    """``releases.0.window`` from pydantic's loc, without the discriminator tag pydantic inserts
    after ``attributes.<name>`` / ``releases.<i>`` (only there: an attribute may be named like a tag)."""
    parts = []
    for i, p in enumerate(loc):
        if i >= 2 and isinstance(p, str) and p in _UNION_TAGS.get(loc[i - 2], ()):
            continue
        parts.append(str(p))
    return ".".join(parts)


def _in_domain(attr, value) -> bool:
    if isinstance(value, bool):
        return False
    if attr.type == "categorical":
        return value in attr.values or (isinstance(value, int) and 0 <= value < attr.size)
    if attr.type == "hashed":
        return isinstance(value, str) or (isinstance(value, int) and 0 <= value < attr.size)
    return isinstance(value, int) and 0 <= value < attr.size


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
    """Read and validate a deployment YAML file, budget plan included (``pipeline.plan``): an
    over-budget plan raises ``BudgetExceededError`` naming the releases, before anything starts."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    deployment = parse_config(data, source=str(path))
    budget_plan(deployment)
    return deployment
