"""Per-partition user state on an ingest worker: open steps, stateful checks, close and partials.

A reports partition owns a fixed set of roster rows. Its state holds, per attribute, the values
reported for the open steps (the next one to close and up to ``max_ahead`` beyond), the last value
of every user (for carry-forward imputation), and one aggregator per release. Applying a report is
idempotent per (user, step): the first accepted report wins, a second one is a ``duplicate``.

Closing step t (triggered by a close marker in this partition's log, so the cut is defined by the
log and a replay after a crash reproduces it exactly) imputes missing values, computes every
release's partial aggregate, and advances. Feedback for step t (heavy-hitter flags) must be
applied before step t+1 closes; :meth:`close` refuses otherwise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.releases import kind_of
from pipeline.releases.aggregators import narrow_int
from pipeline.stream.ingest.corrections import Corrections
from pipeline.stream.ingest.reports import ParsedReports

if TYPE_CHECKING:
    from pipeline.config import Deployment

__all__ = ["PartitionState", "FeedbackPending", "Intake", "OwnedRows", "stable_argsort"]


class FeedbackPending(RuntimeError):
    """Step t+1 cannot close before the feedback of step t has been applied."""


class PartitionState:
    """Per-user state in the narrowest integer types that hold it (:func:`narrow_int`): 32 bytes
    per user in memory with the benchmark's releases, 37 in the checkpoint (docs/streaming.md,
    "Worker memory")."""

    def __init__(
        self,
        deployment: Deployment,
        partition: int,
        rows: np.ndarray,
        n_total: int,
        owned: OwnedRows | None = None,
    ):
        """``owned``: the roster-wide row -> (owner, position) map shared by a worker's partitions
        (:class:`OwnedRows`); built from ``rows`` alone when not given."""
        self.deployment = deployment
        self.partition = int(partition)
        self.rows = np.asarray(rows, dtype=np.int64)  # global roster rows owned, ascending
        self.local = _LocalRows(
            owned
            if owned is not None
            else OwnedRows.of_partition(self.rows, n_total, self.partition),
            self.partition,
        )
        self.max_ahead = deployment.steps.max_ahead
        self.horizon = deployment.horizon
        size = self.rows.size
        slots = self.max_ahead + 1
        self.attributes = list(deployment.attributes)
        self._codes = {a: narrow_int(deployment.attributes[a].size - 1) for a in self.attributes}
        # pending[a][j, i] = code reported by local user i for step closed+1+j, or -1
        self.pending = {
            a: np.full((slots, size), -1, dtype=self._codes[a]) for a in self.attributes
        }
        # precedence of the accepted report of each (user, open step), -1 for none; see apply
        self.origins = deployment.topics.partitions + 1
        self._rank_type = narrow_int((self.horizon + 1) * self.origins)  # rank < (T + 1)(P + 1)
        self.rank = np.full((slots, size), -1, dtype=self._rank_type)
        self.corrections: Corrections | None = None  # only while a correction is held (replace)
        # every user's value at the last closed step (carry-forward imputation, heavy-hitter feedback)
        self.last = {a: np.full(size, -1, dtype=self._codes[a]) for a in self.attributes}
        self.closed = 0  # last closed step
        self.feedback_needed: set[str] = (
            set()
        )  # releases whose feedback for `closed` is outstanding
        self.aggregators = {
            rel.name: kind_of(rel).aggregator(
                rel, deployment.attributes[rel.attribute], size, self.horizon
            )
            for rel in deployment.releases
        }
        self._feedback_releases = {
            rel.name for rel in deployment.releases if kind_of(rel).needs_feedback(rel)
        }
        self.offset = -1  # offset of the last consumed message of this partition (checkpointing)
        self.intake = Intake(slots)

    @property
    def last_x(self) -> dict[str, np.ndarray]:
        """Attribute values of the last closed step (for feedback): ``last``, once a step closed."""
        return self.last if self.closed else {}

    # -- reports -----------------------------------------------------------------------------
    def apply(
        self, parsed: ParsedReports, origin: int = 0, displaced: list | None = None
    ) -> ParsedReports:
        """Apply accepted reports of this partition; stateful rejections are added to ``parsed``.

        ``origin`` says where the reports came from: 0 for this partition's own reports log, 1 + q
        for reports forwarded from reports partition q (:mod:`pipeline.stream.ingest.repartition`). Of the
        reports for one (user, step), the accepted one has the smallest rank
        ``(steps closed when applied) * (P + 1) + origin``, ties going to the first in log order:
        the first accepted report wins, as for a single log, and between reports that reached this
        partition by different logs while the same step was open, the direct one, then the lower
        source partition. That makes the outcome independent of how the logs interleave, so a replay
        after a crash reproduces it. A report that loses its place to a later one of smaller rank
        is appended to ``displaced`` as (local row, step, {attribute: code}, rank) for the caller to
        dead-letter as a duplicate (with one log, origin 0, nothing is ever displaced).

        Returns the reports that were applied (for counting).
        """
        if len(parsed) == 0:
            return parsed
        slots = self.max_ahead + 1
        local = self.local[parsed.rows]
        foreign = local < 0
        if foreign.any():
            raise ValueError(
                f"partition {self.partition}: {int(foreign.sum())} reports of rows it does not own"
            )
        slot = parsed.steps - (self.closed + 1)
        late = slot < 0
        future = slot > self.max_ahead
        parsed.reject(late, "late", f"step already closed (last closed step {self.closed})")
        parsed.reject(
            future,
            "future_step",
            f"more than {self.max_ahead} steps ahead of open step {self.closed + 1}",
        )
        ok = ~(late | future)
        # Duplicates: a report of smaller rank already accepted for (user, step), or one of smaller
        # (rank, position) for the same (user, step) in this batch.
        # one origin per call, so one rank: the first report of a (user, step) in the run is its best
        rank = np.full(ok.shape, self.closed * self.origins + int(origin), dtype=np.int64)
        # (open step, user) -> its place in the (slots, users) arrays: one 1-D index for them all
        flat = np.where(ok, slot, 0) * self.rows.size + local
        pending, ranks = {a: _flat(v) for a, v in self.pending.items()}, _flat(self.rank)
        best = np.zeros(ok.size, dtype=bool)
        idx = np.flatnonzero(ok)
        if idx.size:
            order = stable_argsort(flat[idx])  # by (step, user), then position
            sorted_keys = flat[idx][order]
            best[idx[order[np.r_[True, sorted_keys[1:] != sorted_keys[:-1]]]]] = True
        held = np.full(ok.size, -1, dtype=np.int64)
        held[idx] = ranks[flat[idx]]
        wins = best & ((held < 0) | (rank < held))
        dup = ok & ~wins
        parsed.reject(dup, "duplicate", "a report for this user and step was already accepted")
        ok &= ~dup
        # where a correction is held, a first report takes its rank (which first report wins is
        # decided as without corrections) but not the values (pipeline.stream.ingest.corrections)
        write = ok if self.corrections is None else ok & ~self.corrections.held(flat)
        evict = np.flatnonzero(ok & (held >= 0))
        if evict.size:
            if displaced is not None:
                for i in evict:
                    s_, l_ = slot[i], local[i]
                    displaced.append(
                        (
                            int(l_),
                            int(self.closed + 1 + s_),
                            {
                                a: int(self.pending[a][s_, l_]) if write[i] else -1
                                for a in self.attributes
                            },
                            int(held[i]),
                        )
                    )
            for a in self.attributes:
                pending[a][flat[evict[write[evict]]]] = -1
        for a in self.attributes:
            code = parsed.codes[a]
            sel = write & (code >= 0)
            pending[a][flat[sel]] = code[sel]
        ranks[flat[ok]] = rank[ok]
        new = write & (held < 0)
        self.intake.reported += np.bincount(slot[new], minlength=slots).astype(
            np.int64
        )  # one per new (user, step)
        return parsed.take(ok)

    def replace(
        self,
        parsed: ParsedReports,
        origin: int,
        positions: np.ndarray,
        displaced: list | None = None,
    ) -> ParsedReports:
        """Apply replacements (:mod:`pipeline.stream.ingest.corrections`): each replaces the
        report held for its (user, open step). ``positions[i]``: report i's position in its log
        (offset and row, :func:`~pipeline.stream.ingest.repartition.source_positions`), increasing
        in ``parsed``'s order. A held replacement from a log of lower precedence (a larger
        ``origin``) that loses is appended to ``displaced`` (as :meth:`apply`); an arriving one
        that loses is a duplicate.

        Returns the replacements applied (each counts as accepted; one superseded by a later one
        of the same log, in this call or after it, stays counted: the state holds the last)."""
        if len(parsed) == 0:
            return parsed
        local = self.local[parsed.rows]
        if (local < 0).any():
            foreign = int((local < 0).sum())
            raise ValueError(
                f"partition {self.partition}: {foreign} reports of rows it does not own"
            )
        slot = parsed.steps - (self.closed + 1)
        late, future = slot < 0, slot > self.max_ahead
        parsed.reject(late, "late", f"step already closed (last closed step {self.closed})")
        parsed.reject(
            future,
            "future_step",
            f"more than {self.max_ahead} steps ahead of open step {self.closed + 1}",
        )
        ok = ~(late | future)
        if self.corrections is None:
            self.corrections = Corrections(self.max_ahead + 1, self.rows.size)
        flat = np.where(ok, slot, 0) * self.rows.size + local
        held_origin = _flat(self.corrections.origin)[flat]
        held_pos = _flat(self.corrections.position)[flat]
        # one origin per call: a held correction of another log decides by precedence, of this
        # log by position
        beats = (
            (held_origin < 0)
            | (origin < held_origin)
            | ((origin == held_origin) & (positions > held_pos))
        )
        lost = ok & ~beats
        parsed.reject(
            lost,
            "duplicate",
            "a correction for this user and step from a log that "
            "takes precedence (direct, then the lower source partition) was applied",
        )
        ok &= ~lost
        idx = np.flatnonzero(ok)
        order = stable_argsort(flat[idx])
        keys = flat[idx][order]
        # per (user, step): the last
        last = idx[order[np.r_[keys[1:] != keys[:-1], True]]] if idx.size else idx
        at = flat[last]
        pending, ranks = {a: _flat(v) for a, v in self.pending.items()}, _flat(self.rank)
        other = last[(held_origin[last] >= 0) & (held_origin[last] != origin)]
        if displaced is not None:
            for i in other:
                s_, l_ = slot[i], local[i]
                displaced.append(
                    (
                        int(l_),
                        int(self.closed + 1 + s_),
                        {a: int(self.pending[a][s_, l_]) for a in self.attributes},
                        -1 - int(held_pos[i]),
                    )
                )  # negative: never a first report's rank
        new = (ranks[at] < 0) & (held_origin[last] < 0)  # no report held before: a new user
        for a in self.attributes:
            pending[a][at] = parsed.codes[a][last]
        _flat(self.corrections.origin)[at] = origin
        _flat(self.corrections.position)[at] = positions[last]
        self.intake.reported += np.bincount(slot[last[new]], minlength=self.max_ahead + 1).astype(
            np.int64
        )
        return parsed.take(ok)

    # -- close ---------------------------------------------------------------------------------
    def coverage(self) -> int:
        """Users of this partition with a report for the next step to close."""
        got = np.zeros(self.rows.size, dtype=bool)
        for a in self.attributes:
            got |= self.pending[a][0] >= 0
        return int(got.sum())

    def close(self, step: int, marker: int | None = None) -> dict[str, Any]:
        """Close ``step`` (must be the next one): impute, aggregate, advance. Returns the partial.
        ``marker``: the offset of its close marker in this partition's log (kept in the intake
        history)."""
        if step != self.closed + 1:
            raise ValueError(
                f"partition {self.partition}: close({step}) but the next step to close is {self.closed + 1}"
            )
        if self.feedback_needed:
            raise FeedbackPending(
                f"feedback of step {self.closed} not yet applied for {sorted(self.feedback_needed)}"
            )
        reported = self.coverage()
        x = {}
        for a in self.attributes:
            cur = self.pending[a][0].astype(np.int64)
            missing = cur < 0
            x[a] = self._impute(a, cur, missing)
            self.last[a] = x[a].astype(self._codes[a])
        partials = {}
        for rel in self.deployment.releases:
            partials[rel.name] = self.aggregators[rel.name].partial(step, x[rel.attribute])
        for buf in (*self.pending.values(), self.rank):  # shift the open-step window
            buf[:-1] = buf[1:]
            buf[-1] = -1
        if self.corrections is not None and not self.corrections.shift():
            self.corrections = None
        self.closed = step
        self.intake.close(step, int(self.rows.size), reported, marker)
        self.feedback_needed = set(self._feedback_releases)
        return {
            "step": step,
            "partition": self.partition,
            "users": int(self.rows.size),
            "reported": reported,
            "releases": partials,
        }

    def _impute(self, attribute: str, cur: np.ndarray, missing: np.ndarray) -> np.ndarray:
        """Deterministic per user (carry forward, else the configured default), so it adds no privacy cost."""
        imp = self.deployment.imputation
        default = self.deployment.attributes[attribute].code(imp.default.get(attribute, 0))
        out = cur.copy()
        if imp.rule == "carry_forward":
            prev = self.last[attribute]
            out[missing] = np.where(prev[missing] >= 0, prev[missing].astype(np.int64), default)
        else:
            out[missing] = default
        return out

    def apply_feedback(self, step: int, release: str, feedback: dict[str, Any]) -> None:
        if step != self.closed or release not in self.feedback_needed:
            return  # a replayed or duplicate feedback message: applying it twice would double-charge
        x = self.last[self.deployment.release(release).attribute].astype(np.int64)
        self.aggregators[release].apply_feedback(step, x, feedback)
        self.feedback_needed.discard(release)

    # -- checkpoint ----------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "closed": self.closed,
            "offset": self.offset,
            "pending": {a: v.copy() for a, v in self.pending.items()},
            "rank": self.rank.copy(),
            "last": {a: v.copy() for a, v in self.last.items()},
            # the previous version's readers need it (a rollback); ``last_x`` is ``last`` now, and
            # set_state ignores it: drop it with the next state format version
            "last_x": {a: v.copy() for a, v in self.last_x.items()},
            "feedback_needed": sorted(self.feedback_needed),
            "aggregators": {name: agg.get_state() for name, agg in self.aggregators.items()},
            "intake": self.intake.get_state(),
            **(
                {"corrections": self.corrections.get_state()}
                if self.corrections is not None
                else {}
            ),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        if int(state["partition"]) != self.partition:
            raise ValueError(
                f"checkpoint of partition {state['partition']} restored into partition {self.partition}"
            )
        self.closed = int(state["closed"])
        self.offset = int(state["offset"])
        # Checkpoints written before the narrow types hold int64: the values fit the narrow types,
        # so they restore exactly (``last_x`` is a copy of ``last``, ignored).
        self.pending = {a: np.array(v, dtype=self._codes[a]) for a, v in state["pending"].items()}
        if "rank" in state:
            self.rank = np.array(state["rank"], dtype=self._rank_type)
        else:  # a checkpoint from before ranks: what it holds was accepted first and stays
            held = np.any([v >= 0 for v in self.pending.values()], axis=0)
            self.rank = np.where(held, 0, -1).astype(self._rank_type)
        self.last = {a: np.array(v, dtype=self._codes[a]) for a, v in state["last"].items()}
        self.feedback_needed = set(state["feedback_needed"])
        self.corrections = (
            Corrections.from_state(state["corrections"]) if "corrections" in state else None
        )
        for name, agg_state in state["aggregators"].items():
            self.aggregators[name].set_state(agg_state)
        self.intake = Intake(self.max_ahead + 1)
        if (
            "intake" in state
        ):  # checkpoints written before intake counting have none: count from here
            self.intake.set_state(state["intake"])

    def intake_summary(self) -> dict[str, Any]:
        """Curator-side counts of this partition (``dpstream status`` / ``close``; never published)."""
        summary = self.intake.summary(self.partition, self.closed, self.offset, int(self.rows.size))
        summary["open"] = {t: r for t, r in summary["open"].items() if int(t) <= self.horizon}
        return summary


def _flat(arr: np.ndarray) -> np.ndarray:
    """A 1-D view of a C-contiguous array (writes through it reach ``arr``)."""
    if not arr.flags.c_contiguous:
        raise ValueError("per-user state arrays are C-contiguous")
    return arr.reshape(-1)


def stable_argsort(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")``, for keys in [0, 2^32) as two stable 16-bit passes (least
    significant first): numpy sorts 16-bit types stably by radix, wider ones by timsort (~5x slower
    on a run of 10^4 keys)."""
    if keys.size == 0 or keys.min() < 0 or keys.max() >= 2**32:
        return np.argsort(keys, kind="stable")
    order = np.argsort((keys & 0xFFFF).astype(np.uint16), kind="stable")
    return order[np.argsort((keys[order] >> 16).astype(np.uint16), kind="stable")]


class OwnedRows:
    """Roster row -> (owning reports partition, position among that partition's rows), one map shared
    by all the partitions a worker holds (8 bytes per roster user, not 8 per user per partition)."""

    def __init__(self, owners: np.ndarray, positions: np.ndarray):
        self.owners = owners
        self.positions = positions

    @classmethod
    def of_roster(cls, owners: np.ndarray) -> OwnedRows:
        """From every row's owner (``Roster.owners``): positions count up within each partition."""
        owners = np.asarray(owners)
        positions = np.zeros(owners.size, dtype=np.int32)
        for p in np.unique(owners):
            sel = np.flatnonzero(owners == p)
            positions[sel] = np.arange(sel.size, dtype=np.int32)
        return cls(owners, positions)

    @classmethod
    def of_partition(cls, rows: np.ndarray, n_total: int, partition: int) -> OwnedRows:
        """Only ``rows`` known, as owned by ``partition`` (every other row as owned by none, -1)."""
        owners = np.full(n_total, -1, dtype=np.int32)
        positions = np.zeros(n_total, dtype=np.int32)
        owners[rows] = partition
        positions[rows] = np.arange(rows.size, dtype=np.int32)
        return cls(owners, positions)


class _LocalRows:
    """``local[rows]``: each row's position in one partition's state, -1 where another partition owns it."""

    __slots__ = ("owned", "partition")

    def __init__(self, owned: OwnedRows, partition: int):
        self.owned = owned
        self.partition = partition

    def __getitem__(self, rows) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        mine = self.owned.owners[rows] == self.partition
        return np.where(mine, self.owned.positions[rows], -1).astype(np.int64)

    def foreign(self, rows: np.ndarray) -> np.ndarray:
        """Rows another partition owns (one gather: what a matched producer's run pays to be checked)."""
        return self.owned.owners[rows] != self.partition


class Intake:
    """How many reports a partition accepted and rejected (by reason), per step — curator-side only.

    ``reported[j]``: users with an accepted report for open step closed+1+j (each accepted report is
    a new (user, step): duplicates are rejected). ``accepted``/``rejected``: reports handled while the
    current step was open (the interval since the last close), whatever step they were for;
    ``forwarded``: reports that arrived here for users of other partitions and were passed on to
    their owners (which count them as accepted or rejected); a close
    files them, with the step's reported and imputed users, under ``history[step]``. Part of the
    checkpoint, so a replay after a crash restores and recounts them exactly once. Only the last
    ``HISTORY`` closed steps are kept (the close guard compares with their median).
    """

    HISTORY = 64

    def __init__(self, slots: int):
        self.reported = np.zeros(slots, dtype=np.int64)
        self.accepted = 0
        self.rejected: dict[str, int] = {}
        self.forwarded = 0
        self.history: dict[int, dict[str, Any]] = {}

    def count(self, accepted: int, reasons: dict[str, int], forwarded: int = 0) -> None:
        self.accepted += int(accepted)
        self.forwarded += int(forwarded)
        for reason, n in reasons.items():
            self.rejected[reason] = self.rejected.get(reason, 0) + int(n)

    def close(self, step: int, users: int, reported: int, marker: int | None = None) -> None:
        """``marker``: the offset of the step's close marker, where ``produce --dry-run`` starts
        reading the log (:mod:`pipeline.held_reports`)."""
        self.history[step] = {
            "users": users,
            "reported": reported,
            "imputed": users - reported,
            "accepted": self.accepted,
            "rejected": dict(self.rejected),
            "forwarded": self.forwarded,
            **({} if marker is None else {"marker": int(marker)}),
        }
        self.history.pop(step - self.HISTORY, None)
        self.reported[:-1] = self.reported[1:]
        self.reported[-1] = 0
        self.accepted, self.rejected, self.forwarded = 0, {}, 0

    def summary(self, partition: int, closed: int, offset: int, users: int) -> dict[str, Any]:
        return {
            "partition": partition,
            "closed": closed,
            "offset": offset,
            "users": users,
            "open": {str(closed + 1 + j): int(r) for j, r in enumerate(self.reported)},
            "accepted": self.accepted,
            "rejected": dict(self.rejected),
            "forwarded": self.forwarded,
            "history": {str(t): h for t, h in self.history.items()},
        }

    def get_state(self) -> dict[str, Any]:
        return {
            "reported": self.reported.copy(),
            "accepted": self.accepted,
            "rejected": dict(self.rejected),
            "forwarded": self.forwarded,
            "history": {str(t): h for t, h in self.history.items()},
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self.reported = np.array(state["reported"], dtype=np.int64)
        self.accepted = int(state["accepted"])
        self.rejected = {str(k): int(v) for k, v in state["rejected"].items()}
        self.forwarded = int(state.get("forwarded", 0))
        self.history = {int(t): dict(h) for t, h in state["history"].items()}
