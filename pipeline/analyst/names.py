"""Naming hashed values: the codes of candidate names under the deployment's public hash.

A hashed attribute maps an open-domain string to ``public_hash(value, size)`` (BLAKE2b-64 read
little-endian, modulo ``size``: :func:`pipeline.attributes.public_hash`). The alerts publish codes;
an analyst who has a list of candidate names (a product catalogue, a public word list) hashes it
the same way to read the codes back (``dpstream alerts --names FILE``, ``dpstream hash``). The
names come from the analyst's file, never from the reports; two names with one code are both shown.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.attributes import public_hash

from .reader import AnalystError

if TYPE_CHECKING:
    from pipeline.config import Deployment

__all__ = ["read_names", "codes_of", "dictionary_of", "hashed_attribute", "with_names"]


def read_names(path: str | Path) -> list[str]:
    """One candidate name per line (blank lines skipped); AnalystError naming the file otherwise."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except OSError as err:
        raise AnalystError(f"--names {path}: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise AnalystError(
            f"--names {path}: not UTF-8 text ({err.reason} at byte {err.start})"
        ) from None
    return [line.strip() for line in text.splitlines() if line.strip()]


def codes_of(names: list[str], size: int) -> dict[str, int]:
    """Each name's code under the public hash of a domain of ``size``."""
    return {name: public_hash(name, size) for name in names}


def dictionary_of(names: list[str], size: int) -> dict[int, str]:
    """code -> name; colliding names joined with " | " (the hash cannot tell them apart)."""
    found: dict[int, list[str]] = {}
    for name, code in codes_of(names, size).items():
        found.setdefault(code, []).append(name)
    return {code: " | ".join(names) for code, names in found.items()}


def hashed_attribute(deployment: Deployment, attribute: str | None):
    """(name, attribute) of the hashed attribute asked for (without one: the only one)."""
    hashed = {name: a for name, a in deployment.attributes.items() if a.type == "hashed"}
    if attribute is None:
        if len(hashed) != 1:
            which = ", ".join(hashed) or "there is none"
            raise AnalystError(f"--attribute: say which hashed attribute ({which})")
        attribute = next(iter(hashed))
    if attribute not in hashed:
        raise AnalystError(
            f"--attribute {attribute}: not a hashed attribute of deployment "
            f"{deployment.name!r} (hashed: {', '.join(hashed) or 'none'})"
        )
    return attribute, hashed[attribute]


def with_names(deployment: Deployment, names: list[str]):
    """The deployment with every hashed attribute's dictionary completed from ``names`` (the
    published dictionary wins where both name a code)."""
    attributes = dict(deployment.attributes)
    for name, attr in deployment.attributes.items():
        if attr.type == "hashed":
            extra = dictionary_of(names, int(attr.size))
            attributes[name] = attr.model_copy(update={"dictionary": {**extra, **attr.dictionary}})
    return deployment.model_copy(update={"attributes": attributes})
