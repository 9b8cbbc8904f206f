"""A release's values as a table file: CSV or Parquet (record, step_1.., and named boolean columns such
as each window's padding flags when given), for ``dpstream export`` (:mod:`pipeline.analyst.export`,
which adds the data dictionary) and the consumer's panels (:meth:`pipeline.consumer.SyntheticPanel.export_csv`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

__all__ = ["METADATA_KEY", "write_csv", "write_parquet"]

METADATA_KEY = b"dpstream"  # Parquet schema metadata key of the data dictionary


def write_csv(path: Path, arr: np.ndarray, flags: dict[str, np.ndarray] | None) -> None:
    header = "record," + ",".join(f"step_{t}" for t in range(1, arr.shape[1] + 1))
    cols = [np.arange(arr.shape[0])[:, None], arr]
    for name, f in (flags or {}).items():
        header += f",{name}"
        cols.append(f.astype(np.int64)[:, None])
    with path.open("w") as fh:
        fh.write(header + "\n")
        np.savetxt(
            fh, np.hstack(cols), fmt="%d" if arr.dtype.kind in "iu" else "%.17g", delimiter=","
        )


def write_parquet(
    path: Path, arr: np.ndarray, flags: dict[str, np.ndarray] | None, dictionary: dict
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {
        "record": np.arange(arr.shape[0], dtype=np.int64),
        **{f"step_{t}": arr[:, t - 1] for t in range(1, arr.shape[1] + 1)},
    }
    columns.update(flags or {})
    table = pa.table(columns)
    table = table.replace_schema_metadata(
        {METADATA_KEY: json.dumps(dictionary, default=str).encode()}
    )
    pq.write_table(table, str(path))
