"""Releaser-side logic, no I/O: sum the partitions' partials, run the mechanisms, build the records.

For each step the engine records every release's spend in the ledger (refusing a spend that would
exceed the plan), runs the mechanism on the summed partial aggregates (partials are additive, so
the result does not depend on the number of workers), and returns one record per release:
the public manifest, the new synthetic columns, alerts and feedback. The caller commits the records
and the engine state to Redis atomically before publishing (``pipeline.stream.state.store``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.plan import mechanism_setting
from pipeline.privacy.accountant import reported_approx_dp
from pipeline.privacy.events import ZCDP
from pipeline.privacy.ledger import PrivacyLedger
from pipeline.releases import StepInput, kind_of
from pipeline.releases.codecs import synthetic_columns, synthetic_entry
from pipeline.serialization import dumps_state, loads_state
from pipeline.stream.releaser.closing import public_close_time

if TYPE_CHECKING:
    from pipeline.config import Deployment
    from pipeline.releases import ReleaseConfig

__all__ = [
    "ReleaseEngine",
    "ReleaseOutput",
    "batch_reference",
    "stored_state",
    "needs_records",
    "restore_records",
]


def batch_reference(deployment: Deployment, panels: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What the stream must publish for each synthetic-data release of ``deployment``: the library
    synthesizer run in batch over ``panels[attribute]`` (n × steps codes, imputation already applied)
    with the release's planned budget and the stream's derived seed. An uninterrupted, crashed or
    scaled-out stream run with the same seed must equal it bit for bit."""
    allot = deployment.budget_plan().allotments()
    out = {}
    for rel in deployment.releases:
        kind = kind_of(rel)
        if not kind.synthetic:
            continue
        mech = kind.build(rel, mechanism_setting(deployment, rel, allot[rel.name]))
        panel = np.asarray(panels[rel.attribute])
        for t in range(panel.shape[1]):
            mech.update(panel[:, t])
        out[rel.name] = np.asarray(mech.synthetic)
    return out


@dataclass
class ReleaseOutput:
    release: str
    step: int
    manifest: dict[str, Any]
    column_steps: list[int]
    columns: (
        np.ndarray | None
    )  # (m, len(column_steps)) in the alphabet's type (synthetic_columns), or None
    alerts: dict[str, Any] | None = None
    feedback: dict[str, Any] | None = None

    def to_bytes(self) -> bytes:
        return dumps_state(
            {
                "release": self.release,
                "step": self.step,
                "manifest": self.manifest,
                "column_steps": list(self.column_steps),
                "columns": self.columns,
                "alerts": self.alerts,
                "feedback": self.feedback,
            }
        )

    @classmethod
    def from_bytes(cls, blob: bytes, what: str = "release record") -> ReleaseOutput:
        s = loads_state(blob, what)
        return cls(
            release=s["release"],
            step=int(s["step"]),
            manifest=s["manifest"],
            column_steps=[int(c) for c in s["column_steps"]],
            columns=s["columns"],
            alerts=s["alerts"],
            feedback=s["feedback"],
        )


def _cost_json(cost) -> dict[str, float] | None:
    if cost is None:
        return None
    if isinstance(cost, ZCDP):
        return {"rho": cost.rho}
    return {"epsilon": cost.epsilon, "delta": cost.delta}


class ReleaseEngine:
    def __init__(self, deployment: Deployment, n: int):
        self.deployment = deployment
        self.n = int(n)
        self.plan = deployment.budget_plan()
        self.allotments = self.plan.allotments()
        self.ledger = PrivacyLedger(deployment.privacy_budget(), self.plan)
        self.step = 0
        self.settings = {
            rel.name: mechanism_setting(deployment, rel, self.allotments[rel.name], self.n)
            for rel in deployment.releases
        }
        self.mechanisms = {
            rel.name: kind_of(rel).build(rel, self.settings[rel.name])
            for rel in deployment.releases
        }
        self._events_of_mechanisms()
        self.instance: str | None = (
            None  # the deployment instance id stamped into manifests (identity module)
        )

    # -- mechanisms ----------------------------------------------------------------------------
    def _events_of_mechanisms(self) -> None:
        """Per release, the privacy events of steps 1..T its kind declares for the mechanism that
        draws the noise (``pipeline.releases``): what the ledger charges."""
        self.events = {
            rel.name: kind_of(rel).events(rel, self.mechanisms[rel.name], self.settings[rel.name])
            for rel in self.deployment.releases
        }

    # -- one step ------------------------------------------------------------------------------
    def release(self, step: int, partials: list[dict[str, Any]]) -> list[ReleaseOutput]:
        """Release ``step`` from the partitions' partials (one per partition)."""
        if step != self.step + 1:
            raise ValueError(f"release({step}) but the next step to release is {self.step + 1}")
        users = sum(int(p["users"]) for p in partials)
        if users != self.n:
            raise ValueError(
                f"partials of step {step} cover {users} users, the roster has {self.n}"
            )
        costs = {rel.name: self.events[rel.name][step - 1] for rel in self.deployment.releases}
        # All or nothing: try every spend on a copy of the ledger first, so a refusal
        # (BudgetExhaustedError) leaves no release half-done and no mechanism has drawn noise.
        trial = PrivacyLedger.from_state(self.ledger.get_state())
        for name, cost in costs.items():
            if cost is not None:
                trial.record(name, step, cost)
        for name, cost in costs.items():
            if cost is not None:
                self.ledger.record(name, step, cost)
        # The step's public close time, never the time of this computation (which grows with the
        # private support size): docs/privacy.md, "Closing rules and timing".
        closed_at = public_close_time(partials)
        released_at = None if closed_at is None else closed_at / 1000
        outputs = []
        for rel in self.deployment.releases:
            parts = [p["releases"][rel.name] for p in partials]
            outputs.append(self._release_one(rel, step, parts, costs[rel.name], released_at))
        self.step = step
        return outputs

    def _release_one(
        self, rel: ReleaseConfig, step: int, parts: list[dict], cost, released_at: float | None
    ) -> ReleaseOutput:
        mech = self.mechanisms[rel.name]
        manifest: dict[str, Any] = {
            "deployment": self.deployment.name,
            "instance": self.instance,
            "release": rel.name,
            "type": rel.type,
            "attribute": rel.attribute,
            "step": step,
            "horizon": self.deployment.horizon,
            "neighbours": self.deployment.neighbours,
            "released_at": released_at,
        }
        attribute = self.deployment.attributes[rel.attribute]
        out = kind_of(rel).release_step(
            StepInput(rel, mech, step, parts, attribute, self.deployment.neighbours, manifest)
        )
        columns, column_steps = out.columns, out.column_steps
        if out.histogram is not None:  # float64 over the codes, as it is
            columns, column_steps = (
                np.asarray(out.histogram, dtype=np.float64).reshape(-1, 1),
                [step],
            )
        elif columns is not None:
            columns = synthetic_columns(columns, attribute.size)
        if columns is not None:
            manifest["synthetic"] = synthetic_entry(columns, column_steps)
        manifest["privacy"] = self._privacy(rel.name, cost)
        return ReleaseOutput(
            rel.name, step, manifest, column_steps, columns, out.alerts, out.feedback
        )

    def _privacy(self, release: str, cost) -> dict[str, Any]:
        delta = self.deployment.budget.report_delta
        rho_total = self.ledger.spent_rho()
        approx = self.ledger.spent_approx_dp()
        out: dict[str, Any] = {
            "step_cost": _cost_json(cost),
            "release_spent": _cost_json(
                ZCDP(self.ledger.spent_rho(release))
                if isinstance(self.allotments[release], ZCDP)
                else self.ledger.spent_approx_dp(release)
            ),
            "release_allotment": _cost_json(self.allotments[release]),
            "deployment_spent": {
                "rho": rho_total,
                "epsilon": approx.epsilon,
                "delta": approx.delta,
            },
        }
        if rho_total > 0:
            out["deployment_spent_as_approx_dp"] = _cost_json(
                reported_approx_dp(rho_total, approx, delta)
            )
        return out

    # -- state ---------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "n": self.n,
            "instance": self.instance,
            "ledger": self.ledger.get_state(),
            "mechanisms": {name: mech.get_state() for name, mech in self.mechanisms.items()},
        }

    @classmethod
    def from_state(cls, deployment: Deployment, state: dict[str, Any]) -> ReleaseEngine:
        engine = cls(deployment, int(state["n"]))
        engine.step = int(state["step"])
        engine.instance = state.get("instance")
        engine.ledger = PrivacyLedger.from_state(state["ledger"])
        for rel in deployment.releases:
            cls_ = type(engine.mechanisms[rel.name])
            engine.mechanisms[rel.name] = cls_.from_state(state["mechanisms"][rel.name])
        engine._events_of_mechanisms()
        return engine


# -- the engine state as a step record stores it ---------------------------------------------------
def stored_state(state: dict[str, Any]) -> dict[str, Any]:
    """The engine state (:meth:`ReleaseEngine.get_state`) as step t's record keeps it: a synthesizer's
    released records (``synthetic``, m × t) are left out — they are the columns of the records of steps
    1..t, and storing them again with every step made each commit grow by m bytes per release and
    step (24 MB more at step 12 with n = 10⁶). :func:`restore_records` puts them back from those records."""
    mechanisms = {}
    for name, mech in state["mechanisms"].items():
        syn = mech.get("synthetic") if isinstance(mech, dict) else None
        if isinstance(syn, np.ndarray):
            mech = {
                **mech,
                "synthetic": None,
                "synthetic_in_records": {"shape": list(syn.shape), "dtype": syn.dtype.str},
            }
        mechanisms[name] = mech
    return {**state, "mechanisms": mechanisms}


def needs_records(state: dict[str, Any]) -> list[str]:
    """The releases whose released records :func:`restore_records` must put back into ``state``."""
    return [
        name
        for name, mech in state["mechanisms"].items()
        if isinstance(mech, dict) and "synthetic_in_records" in mech
    ]


def restore_records(
    state: dict[str, Any], outputs: dict[int, dict[str, ReleaseOutput]]
) -> dict[str, Any]:
    """``state`` (a :func:`stored_state`) with each synthesizer's released records rebuilt from
    ``outputs`` (step -> release -> its output, steps 1..state's step): exactly what it left out."""
    for name in needs_records(state):
        mech = state["mechanisms"][name]
        spec = mech.pop("synthetic_in_records")
        syn = np.zeros(spec["shape"], dtype=np.dtype(spec["dtype"]))
        filled = np.zeros(syn.shape[1], dtype=bool)
        for t in range(1, int(state["step"]) + 1):
            out = outputs[t][name]
            if out.columns is None or not out.column_steps:
                continue
            cols = [c - 1 for c in out.column_steps]
            syn[:, cols] = out.columns
            filled[cols] = True
        if not filled.all():
            raise ValueError(
                f"release {name!r}: the step records hold columns {np.flatnonzero(filled) + 1} of the "
                f"{syn.shape[1]} its state says were released"
            )
        mech["synthetic"] = syn
    return state
