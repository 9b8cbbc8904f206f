"""A deployment's public outputs as an analyst reads them: the public topics (``releases``,
``synthetic``, ``alerts``, and the ``deployment`` descriptor that gives the public configuration),
nothing else — no Redis, no curator state.

Every answer goes through the release's kind (``pipeline.releases``: ``answer``, ``questions``,
``explain``, ``dictionary``); nothing here branches on a release's type. The error bounds are the
plan's (:func:`pipeline.error_bounds.release_bounds`): read off the mechanism the releaser builds
from the same public configuration, at the release's β.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

from pipeline.releases import kind_of
from pipeline.releases.reading import Answer, Context

if TYPE_CHECKING:
    from pipeline.config import Deployment
    from pipeline.releases import ReleaseConfig

__all__ = ["AnalystError", "NotReleased", "PublicReader"]


class AnalystError(ValueError):
    """A question the deployment cannot answer as asked (a usage error: exit code 2)."""


class NotReleased(RuntimeError):
    """What was asked for has not been published yet (exit code 1)."""


class PublicReader:
    """Answers from a :class:`pipeline.consumer.PanelStore` filled from the public topics."""

    def __init__(self, deployment: Deployment, store):
        self.deployment = deployment
        self.store = store

    @classmethod
    def from_broker(
        cls, deployment: Deployment, broker: str, timeout: float = 30.0
    ) -> PublicReader:
        from pipeline.consumer import read_topics
        from pipeline.stream.kafka.topics import topic_names

        return cls(deployment, read_topics(broker, topic_names(deployment), timeout=timeout))

    # -- what there is -------------------------------------------------------------------------
    @functools.cached_property
    def bounds(self) -> dict:
        from pipeline.error_bounds import release_bounds

        return release_bounds(
            self.deployment, self.deployment.budget_plan().allotments(), self.deployment.n
        )

    def release(self, name: str, output: str | None = None):
        """The configured release ``name`` (``output``: "counts" for kinds that answer counts, "alerts")."""
        releases = {r.name: r for r in self.deployment.releases}
        if output == "counts":
            releases = {k: r for k, r in releases.items() if kind_of(r).output != "alerts"}
        elif output == "alerts":
            releases = {k: r for k, r in releases.items() if kind_of(r).output == "alerts"}
        if name not in releases:
            hint = ""
            if name in {r.name for r in self.deployment.releases}:
                hint = (
                    " (it publishes alerts: `dpstream alerts` reads them)"
                    if output == "counts"
                    else " (it publishes counts: `dpstream query` reads them)"
                )
            what = {"counts": "releases with counts", "alerts": "releases with alerts"}.get(
                output or "", "releases"
            )
            raise AnalystError(
                f"no such release {name!r}{hint}; {what} are {', '.join(releases) or 'none'}"
            )
        return releases[name]

    def context(self, release: ReleaseConfig) -> Context:
        return Context(
            self.deployment.attributes[release.attribute],
            self.deployment.n,
            self.bounds[release.name],
            self.deployment.steps.unit,
        )

    def released_through(self, release: ReleaseConfig) -> int:
        panel = self.store.panels.get(release.name)
        if kind_of(release).output == "alerts":
            steps = sorted(s for (r, s) in self.store.alerts if r == release.name)
            return next((t - 1 for t in range(1, len(steps) + 2) if t not in steps), 0)
        return panel.released_through if panel is not None else 0

    def panel(self, release: ReleaseConfig, step: int | None = None):
        """The release's panel, released through ``step`` (default: at least one step)."""
        if step is not None and not 1 <= step <= self.deployment.horizon:
            raise AnalystError(f"--step must be in 1..{self.deployment.horizon}, got {step}")
        through = self.released_through(release)
        if through < (step or 1):
            raise NotReleased(
                f"release {release.name!r} has not released step {step or 1} yet "
                f"({f'released through step {through}' if through else 'nothing released'})"
            )
        return self.store.panels[release.name]

    # -- answers -------------------------------------------------------------------------------
    def answer(self, name: str, step: int, raw: bool = False, group: str | None = None) -> Answer:
        rel = self.release(name, "counts")
        kind = kind_of(rel)
        if step is not None and 1 <= step < kind.first_step(rel):
            raise AnalystError(
                f"release {rel.name!r} answers from step {kind.first_step(rel)} on "
                f"({kind.questions(rel, self.deployment.steps.unit)[0][0]}), got --step {step}"
            )
        panel = self.panel(rel, step)
        try:
            answer = kind.answer(rel, panel, step, self.context(rel), raw=raw, group=group)
        except ValueError as err:
            raise AnalystError(str(err)) from None
        not_answered = kind.questions(rel, self.deployment.steps.unit)[1]
        return dataclasses.replace(
            answer, notes=answer.notes + [f"this release does not answer {'; '.join(not_answered)}"]
        )

    def series(self, name: str) -> list[Answer]:
        """The release's answer at every released step it answers at (debiased)."""
        rel = self.release(name, "counts")
        first, through = kind_of(rel).first_step(rel), self.released_through(rel)
        return [self.answer(name, t) for t in range(first, through + 1)]

    def alerts(self, name: str | None = None, step: int | None = None) -> list[dict[str, Any]]:
        """The alert records (of ``name``, at ``step``), by step then release, each with ``text`` in words."""
        rels = (
            [self.release(name, "alerts")]
            if name
            else [r for r in self.deployment.releases if kind_of(r).output == "alerts"]
        )
        out = []
        for rel in rels:
            kind, ctx = kind_of(rel), self.context(rel)
            times: dict[int, int] = {}  # how often each value was flagged up to the step (public)
            for s in sorted(s for (r, s) in self.store.alerts if r == rel.name):
                alert = dict(self.store.alerts[(rel.name, s)])
                flagged = [int(x) for x in alert.get("flagged", [])]
                for x in flagged:
                    times[x] = times.get(x, 0) + 1
                alert["times_flagged"] = [times[x] for x in flagged]
                if step is None or s == step:
                    out.append(dict(alert, text=kind.alert_text(rel, alert, ctx)))
        return sorted(out, key=lambda a: (a["step"], a["release"]))

    def spend(self) -> list[dict[str, Any]]:
        """The deployment's spend after each released step, as the manifests report it (ε at report δ)."""
        by_step: dict[int, dict] = {}
        for panel in self.store.panels.values():
            for t, m in panel.manifests.items():
                priv = m.get("privacy", {})
                spent = priv.get("deployment_spent_as_approx_dp") or {
                    k: priv.get("deployment_spent", {}).get(k) for k in ("epsilon", "delta")
                }
                if spent.get("epsilon") is not None:
                    by_step[t] = max(by_step.get(t, spent), spent, key=lambda s: s["epsilon"])
        return [dict(step=t, **by_step[t]) for t in sorted(by_step)]

    def explain(self, release: ReleaseConfig) -> str:
        return kind_of(release).explain(self.bounds[release.name], self.deployment.n)

    def dictionary(self, name: str) -> dict[str, Any]:
        """The data dictionary of a release's export (docs/topics.md, "Exports")."""
        from pipeline.releases.reading import CLIPPING, code_labels

        rel = self.release(name, "counts")
        kind, panel = kind_of(rel), self.panel(rel)
        ctx, b = self.context(rel), self.bounds[rel.name]
        last = panel.manifests[max(panel.manifests)]
        attribute = ctx.attribute
        answers, not_answered = kind.questions(rel, self.deployment.steps.unit)
        values = (
            {}
            if attribute.type == "hashed"
            else dict(enumerate(code_labels(attribute, range(attribute.size))))
        )
        through = panel.released_through
        return {
            "deployment": self.deployment.name,
            "release": rel.name,
            "type": rel.type,
            "attribute": rel.attribute,
            "attribute_description": attribute.description,
            "unit": ctx.unit,
            "horizon": self.deployment.horizon,
            "released_through": through,
            "n": self.deployment.n,
            "records": int(panel.as_array().shape[0]),
            "privacy": {
                k: last.get("privacy", {}).get(k)
                for k in (
                    "release_spent",
                    "release_allotment",
                    "deployment_spent",
                    "deployment_spent_as_approx_dp",
                )
            },
            "report_delta": self.deployment.budget.report_delta,
            "answers": answers,
            "does_not_answer": not_answered,
            "error_bound": {
                "name": b.largest,
                "value": b.bounds[b.largest],
                "beta": b.beta,
                "share_of_n": b.bounds[b.largest] / self.deployment.n,
                "all_bounds": dict(b.bounds),
                "in_words": kind.explain(b, self.deployment.n),
            },
            "values": values,
            "clipping": CLIPPING,
            "columns": {
                "record": "synthetic record id (not a user)",
                **{
                    f"step_{t}": f"the record's {rel.attribute} code at {ctx.unit} {t} (see values)"
                    for t in range(1, through + 1)
                },
            },
            **kind.dictionary(rel, panel, ctx),
        }
