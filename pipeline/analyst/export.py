"""``dpstream export``: a release's synthetic records (or histogram) with their data dictionary.

Parquet files carry the dictionary (:meth:`pipeline.analyst.reader.PublicReader.dictionary`) as JSON
in the schema metadata under the key ``dpstream``; a CSV file gets it as a JSON sidecar
``<file>.dictionary.json``. Releases with padding add a boolean ``padding`` column (the kind's
``padding_flags``). Only ``.csv`` and ``.parquet`` are written: any other suffix, or a directory that
does not exist or cannot be written, is refused before anything is read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from pipeline.releases import kind_of

from .reader import AnalystError

__all__ = ["FORMATS", "METADATA_KEY", "check_destination", "export_release", "sidecar"]

FORMATS = (".csv", ".parquet")
METADATA_KEY = b"dpstream"  # Parquet schema metadata key of the data dictionary


def sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".dictionary.json")


def check_destination(out: str | Path) -> Path:
    """The export's path, or AnalystError in one line (unknown format, missing or unwritable directory)."""
    path = Path(out)
    if path.suffix.lower() not in FORMATS:
        raise AnalystError(f"--out {out}: unknown export format {path.suffix or '(none)'!r}; "
                           f"write {' or '.join(FORMATS)}")
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
    flags = kind_of(rel).padding_flags(rel, panel)
    if flags is not None:
        dictionary["columns"]["padding"] = "true for the records the padding stands for (see padding)"
        dictionary["padding_records"] = int(flags.sum())
    arr = panel.as_array()
    try:
        if path.suffix.lower() == ".parquet":
            _parquet(path, arr, flags, dictionary)
        else:
            _csv(path, arr, flags)
            sidecar(path).write_text(json.dumps(dictionary, indent=2, default=str) + "\n")
    except OSError as err:
        raise AnalystError(f"--out {out}: {err.strerror or err}") from None
    return path, dictionary


def _csv(path: Path, arr: np.ndarray, flags: np.ndarray | None) -> None:
    header = "record," + ",".join(f"step_{t}" for t in range(1, arr.shape[1] + 1))
    cols = [np.arange(arr.shape[0])[:, None], arr]
    if flags is not None:
        header += ",padding"
        cols.append(flags.astype(np.int64)[:, None])
    with path.open("w") as fh:
        fh.write(header + "\n")
        np.savetxt(fh, np.hstack(cols), fmt="%d" if arr.dtype.kind in "iu" else "%.17g", delimiter=",")


def _parquet(path: Path, arr: np.ndarray, flags: np.ndarray | None, dictionary: dict) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {"record": np.arange(arr.shape[0], dtype=np.int64),
               **{f"step_{t}": arr[:, t - 1] for t in range(1, arr.shape[1] + 1)}}
    if flags is not None:
        columns["padding"] = flags
    table = pa.table(columns)
    table = table.replace_schema_metadata({METADATA_KEY: json.dumps(dictionary, default=str).encode()})
    pq.write_table(table, str(path))
