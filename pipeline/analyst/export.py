"""``dpstream export``: a release's synthetic records (or histogram) with their data dictionary.

Parquet files carry the dictionary (:meth:`pipeline.analyst.reader.PublicReader.dictionary`) as JSON
in the schema metadata under the key ``dpstream``; a CSV file gets it as a JSON sidecar
``<file>.dictionary.json``. Releases with padding add a boolean column ``padding_step_<t>`` per
released window (the kind's ``padding_flags`` at t): no one set of the exchangeable records is every
window's padding. Only ``.csv`` and ``.parquet`` are written: any other suffix, or a directory that
does not exist or cannot be written, is refused before anything is read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.releases import kind_of

from .reader import AnalystError
from .tables import METADATA_KEY, write_csv, write_parquet

if TYPE_CHECKING:
    from pipeline.releases import ReleaseConfig

__all__ = [
    "FORMATS",
    "METADATA_KEY",
    "check_destination",
    "export_release",
    "padding_columns",
    "sidecar",
]

FORMATS = (".csv", ".parquet")


def sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".dictionary.json")


def check_destination(out: str | Path) -> Path:
    """The export's path, or AnalystError in one line (unknown format, missing or unwritable directory)."""
    path = Path(out)
    if path.suffix.lower() not in FORMATS:
        raise AnalystError(
            f"--out {out}: unknown export format {path.suffix or '(none)'!r}; "
            f"write {' or '.join(FORMATS)}"
        )
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise AnalystError(f"--out {out}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise AnalystError(f"--out {out}: not writable")
    return path


def export_release(reader, name: str, out: str | Path) -> tuple[Path, dict]:
    """Write release ``name``'s panel to ``out`` with its dictionary; returns (path, dictionary)."""
    path = check_destination(out)
    rel = reader.release(name, "counts")
    panel = reader.panel(rel)
    dictionary = reader.dictionary(name)
    flags = padding_columns(rel, panel)
    for column, _f in flags.items():
        step = column.rsplit("_", 1)[1]
        dictionary["columns"][column] = (
            "true for a choice of the records the padding stands for "
            f"in the window ending at step {step} (see padding)"
        )
    if flags:
        dictionary["padding_records"] = {column: int(f.sum()) for column, f in flags.items()}
    arr = panel.as_array()
    try:
        if path.suffix.lower() == ".parquet":
            write_parquet(path, arr, flags, dictionary)
        else:
            write_csv(path, arr, flags)
            sidecar(path).write_text(json.dumps(dictionary, indent=2, default=str) + "\n")
    except OSError as err:
        raise AnalystError(f"--out {out}: {err.strerror or err}") from None
    return path, dictionary


def padding_columns(rel: ReleaseConfig, panel) -> dict[str, np.ndarray]:
    """``padding_step_<t>`` -> flags, for every released window (none without padding)."""
    kind = kind_of(rel)
    flags = {}
    for t in range(kind.first_step(rel), panel.released_through + 1):
        f = kind.padding_flags(rel, panel, t)
        if f is not None:
            flags[f"padding_step_{t}"] = f
    return flags
