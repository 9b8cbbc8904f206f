"""The errors of the privacy budget: over-budget plans, exhausted ledgers, unbudgeted kinds."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "PrivacyBudgetError",
    "BudgetExceededError",
    "BudgetExhaustedError",
    "BudgetKindError",
    "DuplicateLedgerEntryError",
]


class PrivacyBudgetError(ValueError):
    """Base class of budget errors (a ValueError, so configuration validation catches it)."""


class BudgetExceededError(PrivacyBudgetError):
    """A plan asks for more than the deployment's budget. ``releases`` names the releases involved."""

    def __init__(self, message: str, releases: Sequence[str] = ()):
        super().__init__(message)
        self.releases = tuple(releases)


class BudgetExhaustedError(PrivacyBudgetError):
    """A ledger entry would take the spend beyond the budget (or the release's allotment)."""

    def __init__(self, message: str, release: str, step: int):
        super().__init__(message)
        self.release = release
        self.step = step


class BudgetKindError(PrivacyBudgetError):
    """A release asks for a kind of budget (ρ or (ε, δ)) the deployment did not set."""


class DuplicateLedgerEntryError(PrivacyBudgetError):
    """A (release, step) pair is already in the ledger: the spend happened once, it is never re-recorded."""
