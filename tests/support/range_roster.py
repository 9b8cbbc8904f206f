"""A range roster's canonical-id rule written out, and a small configuration using one: the
references the upload's vectorised roster rows are checked against."""

from __future__ import annotations


def canonical_row(user: str, prefix: str, size: int) -> int:
    """The rule of a range roster (ids prefix0 .. prefix<size-1>), written out."""
    if not user.startswith(prefix):
        return -1
    digits = user[len(prefix) :]
    if not digits or not all("0" <= c <= "9" for c in digits):
        return -1
    if digits != "0" and digits.startswith("0"):
        return -1
    return int(digits) if int(digits) < size else -1


def range_config(size: int, prefix: str = "u", partitions: int = 3) -> dict:
    return {
        "name": "fast-paths",
        "roster": {"size": size, "id_prefix": prefix},
        "horizon": 4,
        "topics": {"partitions": partitions},
        "attributes": {"poverty": {"type": "binary"}},
        "budget": {"rho": 1.0},
        "releases": [{"name": "cu", "type": "cumulative", "attribute": "poverty", "share": 1.0}],
    }
